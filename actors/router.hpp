// The router actor: orders admitted jobs by priority class and tenant (policy::FairQueue), expires
// jobs whose deadline passes while queued, and dispatches jobs to batchers only against credit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/admission_config.hpp"
#include "actors/protocol.hpp"
#include "actors/router_config.hpp"
#include "policies/qos.hpp"
#include "policies/retry.hpp"

namespace sy {

/// Router settings that are not part of the user's configuration.
struct RouterOptions {
  /// PULL credit window: pipeline submits the gateway may have read that the router has not yet
  /// fitted into a class queue (credit outstanding + pipeline jobs waiting in the overflow).
  /// 64 keeps the gateway reading in bursts without building a deep hidden queue.
  uint32_t pull_window = 64;
  /// Hard cap of the pipeline overflow. A gateway that respects its credit never fills more than
  /// pull_window of it; beyond the cap pipeline jobs are refused like ROUTER jobs (a safety net
  /// for a gateway that reads without credit, so memory stays bounded anyway).
  std::size_t pipeline_overflow_cap = 4096;
  /// Constants of the retry_after_ms estimate for `overloaded` replies.
  policy::RetryConfig retry;
  /// Block hashes remembered per batcher for prefix-aware dispatch (policy::PrefixIndex). The
  /// index stands in for the batcher's prefix cache, so it should cover at least what that cache
  /// can hold: 65536 blocks of 16 tokens are 1M tokens, more KV than one device keeps for any
  /// model worth serving, at about 5 MB of router memory per batcher.
  std::size_t prefix_index_capacity = 65536;
  /// Where a job's `accepted` goes straight when `egress` is the journal standing in front of
  /// the egress actor: the batchers send the job's chunks straight there too
  /// (BatcherExtras::direct_egress), and `accepted` must reach egress ahead of them. Invalid:
  /// `egress`.
  EgressActor direct_egress;
};

/// The priority classes the router and admission use: `classes`, or interactive (rank 0, 256
/// queued) and batch (rank 1, 4096 queued) when empty — the defaults of finalize_config.
std::vector<policy::PriorityClass> effective_classes(std::vector<policy::PriorityClass> classes);

/// Spawns the router (an event-based actor). `egress` receives events and PULL credit (it may be
/// invalid in tests: nothing is sent then); `admission` receives JobOutcomes for jobs that end in
/// the queue — pass it here or later with (connect_atom, admission, TenantWeights), which
/// spawn_admission sends itself (the router keeps only a weak reference to it, so the pair forms
/// no ownership cycle). Batchers are monitored: one that goes down loses its credit. `tenants` gives fair-share weights (later replaced by the
/// connect message's). Throws std::invalid_argument for a bad class list.
///
/// Handles:
///   (enqueue_atom, Job) -> EnqueueReply {result, position, retry_after_ms}
///       result accepted (an AcceptedEvent goes to egress for ROUTER clients), full (class queue
///       full; retry_after_ms = jobs ahead / measured dispatch rate, clamped), unknown_class.
///       Pipeline jobs are never refused while the queue is full: they wait in a small overflow.
///   (credit_atom, BatcherActor batcher, uint32 n)  the batcher takes n more jobs; the router
///       dispatches (run_atom, Job) to the batcher with the most credit, highest priority first.
///       With cfg.prefix_affinity, to the batcher it earlier sent the job's longest leading
///       prompt blocks instead, unless that one has more than cfg.prefix_affinity_slack credits
///       fewer than the freest (policies/prefix_route.hpp; docs/elasticity.md).
///   (cancel_atom, uint64 uid)  a queued job is removed (DoneEvent finish=cancelled to the client,
///       JobOutcome outcome=cancelled to admission); otherwise forwarded to every batcher.
///   (status_atom, uint64 uid) -> JobStatus {state, position, completion_tokens}
///       queued (jobs ahead of it were no more to arrive) or running/unknown (tokens generated
///       so far as its batcher reports them; 0 when no batcher holds it).
///   (pull_atom, uint32 n)  n PULL credits came back unused (admission answered those submits).
///   (connect_atom, AdmissionActor admission, TenantWeights)   wiring.
///   (drain_atom)  stop granting PULL credit (shutdown).
///   (drain_atom, bool on)  the same for the operator's drain; false grants credit again.
///   (requeue_atom, std::vector<Job>)  jobs of a failed executor: they go before every queued
///       job of their class (and of less important ranks), are not counted against the class's
///       queue limit and never expire (they started before); FIFO among themselves.
///   (finished_atom, std::vector<uint64_t> uids)  a batcher ended these jobs. Until then the
///       router keeps a copy of every dispatched job: should its batcher go down (crash) with
///       jobs it neither ended nor sent back, they are re-queued like an executor failure's, except
///       streamed ones (their text cannot be resumed) and jobs past max_job_retries, which end
///       with engine_dead. A retiring batcher stays watched until it has ended its jobs.
///   (retire_atom, BatcherActor batcher) -> uint32  the batcher leaves (scale down or failure):
///       its credit is revoked (the number is the reply) and nothing more is dispatched to it.
///   (stats_atom) -> RouterStats (actors/stats.hpp): enqueued, dispatched, expired,
///       cancelled, rejected_full, overflowed, queued, overflow, credit, pull_outstanding,
///       pull_granted, batchers, requeued, retry_queued, retired, lost_requeued and
///       lost_failed (jobs of batchers that went down), running_tracked (dispatched, not ended),
///       waiting_total (queued + overflow + re-queued), oldest_wait_ms, queued_by_class (by class name), affinity_hits
///       (dispatched for a cached prefix), affinity_overruled (a batcher held a prefix of the job
///       but was too busy or had no credit) and affinity_indexed (block hashes held, all batchers).
/// Sends (pull_atom, uint32 n) to egress: n more pipeline submits may be read (additive).
/// Expired jobs get ErrorEvent deadline_exceeded and are never dispatched: the queue is swept
/// before every dispatch and by a timer set to the earliest expiry.
RouterActor spawn_router(caf::actor_system& sys, RouterConfig cfg, EgressActor egress,
                         AdmissionActor admission = {}, std::vector<TenantConfig> tenants = {},
                         RouterOptions opts = {});

}  // namespace sy
