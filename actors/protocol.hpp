// The typed interface of every actor: which messages it takes and what it answers. A handle of
// one of these types only sends what the actor handles (the compiler refuses anything else), and
// an actor's behavior must handle every message of its interface and no other. The message types
// themselves are in actors/messages.hpp; what each message means is documented at the actor's
// spawn function.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/stats.hpp"

namespace sy {

using caf::reacts_to;
using caf::replies_to;

// One message per line, its meaning beside it.
// clang-format off

/// The egress actor (ingress/egress.hpp): every outbound event of a job or a command, and PULL
/// credit for the gateway. Whoever sends to a client holds this interface.
using EgressActor = caf::typed_actor<
    reacts_to<out_atom, AcceptedEvent>,
    reacts_to<out_atom, TokensEvent>,
    reacts_to<out_atom, DoneEvent>,
    reacts_to<out_atom, ErrorEvent>,
    reacts_to<out_atom, StatusEvent>,
    reacts_to<out_atom, ControlEvent>,
    reacts_to<out_atom, StepEvent>,
    reacts_to<out_atom, ToolCallEvent>,
    reacts_to<pull_atom, uint32_t>>;

/// The journal actor (actors/journal.hpp) stands in front of egress, so its interface extends
/// egress's: an event added to egress must be forwarded (or held) by the journal too, or the
/// journal's behavior no longer compiles.
using JournalActor = EgressActor::extend<
    replies_to<journal_atom, Job>::with<uint8_t>,  // the accept record is durable
    reacts_to<journal_atom, JobOutcome>,           // a journaled job's end
    reacts_to<journal_atom, ProgramStep>,           // a journaled program's finished step
    reacts_to<tick_atom>,                          // self: group commit
    reacts_to<tick_atom, uint8_t>,                 // self: retry and delivery marks
    replies_to<stats_atom>::with<JournalStats>>;

/// One model step at a time (actors/executor.hpp).
using ExecutorActor = caf::typed_actor<
    replies_to<step_atom, StepPlan>::with<StepResult>,
    reacts_to<release_atom, std::vector<uint64_t>>,     // forget these sequences
    replies_to<stats_atom>::with<ExecutorStats>>;

/// Continuous batching for one executor (actors/batcher.hpp).
using BatcherActor = caf::typed_actor<
    reacts_to<run_atom, Job>,                                        // from the router
    reacts_to<cancel_atom, uint64_t>,
    reacts_to<release_atom, uint64_t>,                               // a program ended: unpin
    replies_to<status_atom, uint64_t>::with<uint32_t>,               // tokens so far
    replies_to<stats_atom>::with<BatcherStats>,
    replies_to<kvpolicy_atom, policy::KvPolicy>::with<std::string>,  // "" swapped, else why
    reacts_to<retire_atom>,                                          // scale down
    reacts_to<watchdog_atom>>;                                       // self: step watchdog

/// Prometheus metrics and readiness (actors/metrics.hpp).
using MetricsActor = caf::typed_actor<
    reacts_to<finished_atom, JobOutcome, std::string>,              // one ended job, its class
    reacts_to<observe_atom, BatcherActor, ExecutorActor>,           // a pair to scrape
    reacts_to<observe_atom, BatcherActor, ExecutorActor, int32_t>,  // ... in an executor slot
    reacts_to<recovered_atom, int64_t, int64_t>,                    // fault and recovery times
    replies_to<metrics_atom>::with<std::string>,                    // the exposition text
    replies_to<ready_atom>::with<bool>>;

/// Tenants, quotas, job keys and prompts (actors/admission.hpp).
using AdmissionActor = caf::typed_actor<
    reacts_to<submit_atom, SubmitRequest>,  // from the gateway
    reacts_to<cancel_atom, KeyRequest>,
    reacts_to<status_atom, KeyRequest>,
    reacts_to<tool_atom, ToolResultRequest>,  // a program's tool result, from the gateway
    reacts_to<tool_atom, uint64_t>,         // self: a program's timer (tool wait, retry)
    reacts_to<finished_atom, JobOutcome>,   // from batchers and the router
    reacts_to<drain_atom>,                  // shutdown
    reacts_to<drain_atom, bool>,            // the operator's drain / resume
    reacts_to<observe_atom, MetricsActor>,
    reacts_to<cancel_atom, drain_atom>,     // cancel every live job
    reacts_to<tick_atom>,                   // self: the journal's replay
    replies_to<stats_atom>::with<AdmissionStats>>;

/// Priority classes, fair queuing, deadlines and dispatch against credit (actors/router.hpp).
using RouterActor = caf::typed_actor<
    replies_to<enqueue_atom, Job>::with<EnqueueReply>,       // from admission
    reacts_to<credit_atom, BatcherActor, uint32_t>,          // a batcher takes n more
    reacts_to<cancel_atom, uint64_t>,
    reacts_to<release_atom, uint64_t>,                       // a program ended: to every batcher
    reacts_to<finished_atom, std::vector<uint64_t>>,         // a batcher ended these jobs
    reacts_to<requeue_atom, std::vector<Job>>,               // a failed executor's jobs
    replies_to<retire_atom, BatcherActor>::with<uint32_t>,   // credit revoked
    replies_to<status_atom, uint64_t>::with<JobStatus>,
    reacts_to<pull_atom, uint32_t>,                          // unused PULL credit back
    reacts_to<connect_atom, AdmissionActor, TenantWeights>,  // wiring
    reacts_to<drain_atom>,                                   // shutdown
    reacts_to<drain_atom, bool>,                             // the operator's drain / resume
    reacts_to<tick_atom>,                                    // self: the deadline sweep
    replies_to<stats_atom>::with<RouterStats>>;

/// Operator commands (actors/control.hpp).
using ControlActor = caf::typed_actor<
    reacts_to<connect_atom, std::vector<BatcherActor>>,  // the current batchers
    reacts_to<control_atom, ControlRequest>>;            // from the gateway

/// The batcher+executor pairs: elasticity and crash recovery (actors/supervisor.hpp).
using SupervisorActor = caf::typed_actor<
    reacts_to<observe_atom, MetricsActor>,
    replies_to<connect_atom, ControlActor>::with<std::string>,
    reacts_to<failed_atom, PairFailure>,                        // from a batcher
    reacts_to<recovered_atom, int64_t, int64_t>,                // from a batcher
    reacts_to<kvpolicy_atom, policy::KvPolicy>,                 // an operator swap
    reacts_to<scale_atom>,                                      // self: the scaling tick
    replies_to<stats_atom>::with<SupervisorStats>>;
// clang-format on

}  // namespace sy
