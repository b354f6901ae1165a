// The admission actor: the first actor a client request meets. It authenticates tenants, applies
// their quotas, deduplicates job keys, tokenizes and checks prompts, and hands jobs to the router.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/admission_config.hpp"
#include "actors/protocol.hpp"
#include "policies/qos.hpp"

namespace sy {

class Model;
using LlamaModel = Model;  // model/model.hpp

/// Compares two secrets in time that depends only on their lengths, not on where they differ.
bool tokens_equal(std::string_view a, std::string_view b);

/// Spawns the admission actor and tells `router` about it (connect_atom with the tenants'
/// weights), closing the admission <-> router cycle. `classes`/`default_class` must be the
/// router's (effective_classes of the same list; "" = the first class). `model` tokenizes text
/// prompts and gives the context length; null (null backend): a text prompt becomes one token per
/// byte and only cfg.max_prompt_tokens limits prompts.
///
/// Handles:
///   (submit_atom, SubmitRequest)  checks, in order: tenant and token (unauthorized, before any
///       queue is touched); an existing job key (a running job attaches the new client, which is
///       told "accepted" and gets the final done/error; an ended one answers its stored
///       DoneEvent, cancelled ones included, or the ErrorEvent it failed with, and never runs
///       again while remembered); the request (bad_request naming the numbers: class, prompt
///       length against the context; max_tokens is lowered to the room the context leaves
///       unless the KV policy may run past it); the tenant's quotas
///       (rate_limited with retry_after_ms); then (enqueue_atom, Job) to the router, whose "full"
///       answer becomes ErrorEvent overloaded with its retry_after_ms.
///   (cancel_atom, KeyRequest) / (status_atom, KeyRequest)  (the atom decides): authenticated like a
///       submit (except internal ones), looked up under the caller's own tenant only; unknown key
///       -> ErrorEvent not_found; status -> StatusEvent; cancel of a live job -> (cancel_atom,
///       uid) to the router; cancel of an ended job -> nothing (docs/protocol.md).
///   (finished_atom, JobOutcome)  from batchers and the router: frees the tenant's quota, stores
///       the result for resubmissions (up to cfg.result_cache keys and cfg.result_cache_bytes,
///       oldest forgotten first), answers attached clients.
///   (drain_atom)  later submits get ErrorEvent unavailable (shutdown).
///   (drain_atom, bool on)  the operator's drain (`ctl drain`) or its end (`ctl resume`).
///   (observe_atom, MetricsActor metrics)  every JobOutcome is copied there (without the completion
///       text, ids and logprobs) as (finished_atom, JobOutcome, std::string class_name).
///   (cancel_atom, drain_atom)  cancels every live job (shutdown after the grace period).
///   (stats_atom) -> AdmissionStats (actors/stats.hpp): submitted, admitted, unauthorized,
///       rate_limited, overloaded, bad_request, deduplicated, attached, finished, not_found,
///       unavailable, active, remembered, remembered_bytes (the result cache's estimated size),
///       tenants (entries of the tenant table), tenants_idle, tenants_forgotten.
/// Open-tenant mode: a tenant name that is not configured is kept only while it has jobs in
/// flight, then for cfg.tenant_idle_ms at most, and never more than cfg.max_idle_tenants idle
/// ones at once (the longest idle are forgotten first); it comes back as new on its next use.
/// Pipeline submits it answers itself return their PULL credit to the router (pull_atom, 1).
AdmissionActor spawn_admission(caf::actor_system& sys, AdmissionConfig cfg,
                               std::vector<policy::PriorityClass> classes,
                               std::string default_class, std::shared_ptr<const LlamaModel> model,
                               RouterActor router, EgressActor egress);

struct JournalReplay;

/// The same, with a journal (actors/journal.hpp; `egress` should be the journal actor too): every
/// admitted job is journaled ((journal_atom, Job) request) before it is enqueued, and so before
/// `accepted` is sent; every journaled job's end goes to the journal as (journal_atom,
/// JobOutcome) before any reply for it. `replay` restores what the journal held at start: its
/// done results answer resubmissions of their keys, its pending jobs are enqueued again (at the
/// pace the router's queues allow, not charged to quotas) under their old uids; new uids start
/// at replay.next_uid.
AdmissionActor spawn_admission(caf::actor_system& sys, AdmissionConfig cfg,
                               std::vector<policy::PriorityClass> classes,
                               std::string default_class, std::shared_ptr<const LlamaModel> model,
                               RouterActor router, EgressActor egress, JournalActor journal,
                               const JournalReplay& replay);

}  // namespace sy
