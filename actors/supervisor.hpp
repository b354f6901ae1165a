// The supervisor actor: runs between min and max batcher+executor pairs (elastic, driven by
// policy::decide_autoscale), replaces a pair whose executor crashed or hung, and measures recovery.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "actors/batcher_config.hpp"
#include "actors/executor.hpp"
#include "actors/protocol.hpp"
#include "policies/autoscale.hpp"

namespace sy {

class Model;
using LlamaModel = Model;  // model/model.hpp

/// How the supervisor builds and sizes its pairs.
struct SupervisorConfig {
  BatchingConfig batching;
  /// The template of every executor (backend, model, threads, KV sizing). Its test fault flags
  /// apply to the first executor only; replacements and later pairs run clean.
  ExecutorSpec executor;
  int32_t n_blocks = 1;  ///< KV blocks per pair (batcher pool = executor pool); 0: each cuda
                         ///< engine sizes its pool from device memory, its batcher follows
  policy::AutoscaleKnobs knobs;             ///< max_executors is clipped to slots.size()
  std::vector<policy::ExecutorSlot> slots;  ///< where pairs may run (policy::executor_slots)
  /// How often the load is looked at. 100 ms reacts well within Ray Serve-like delays (seconds)
  /// while costing one stats round trip per pair per tick.
  int64_t interval_ms = 100;
  /// How long a pair may take to answer a stats request before the tick goes on without it.
  int64_t ask_timeout_ms = 1000;
  /// TEST ONLY: the first batcher throws after this many steps (0: never).
  int32_t test_fault_batcher_throw_after = 0;
  /// Builds each pair's executor, as spawn_executor (the default, when empty) with the same
  /// arguments: the spec, and the KV block count in and out. Tests give a stand-in executor.
  std::function<ExecutorActor(caf::actor_system&, const ExecutorSpec&, int32_t* n_blocks)>
      make_executor;
};

/// The actors the pairs talk to (any may be invalid in tests).
struct SupervisorWiring {
  RouterActor router;
  EgressActor egress;
  /// The egress actor itself where `egress` is the journal in front of it
  /// (BatcherExtras::direct_egress); invalid: `egress`.
  EgressActor direct_egress;
  AdmissionActor admission;
  /// gets (observe_atom, batcher, executor, int32 slot) for every new pair and
  /// (recovered_atom, fault_us, at_us) for every recovery
  MetricsActor metrics;
  std::shared_ptr<const LlamaModel> model;  ///< shared by every batcher (already loaded)
};

/// Spawns the supervisor; it starts min_executors pairs at once. Handles:
///   (connect_atom, ControlActor control)  the control actor gets (connect_atom,
///       std::vector<BatcherActor> batchers) now and whenever the set of pairs changes; answers a
///       string once the list is sent (a caller that waits for it knows control has the list):
///       empty, or, when no pair runs, why the last executor could not be built;
///   (observe_atom, MetricsActor metrics)  the metrics actor gets (observe_atom, batcher,
///       executor, int32 slot) for every pair now and later, and (recovered_atom, fault_us,
///       at_us) for every recovery from then on;
///   (failed_atom, PairFailure)  a batcher's executor failed (the batcher re-queued its jobs and
///       exits; a replacement pair is spawned when it is down);
///   (recovered_atom, int64 fault_us, int64 now_us)  the first re-queued job of a fault runs
///       again: recovery time = now - fault, logged and kept;
///   (kvpolicy_atom, policy::KvPolicy)  an operator swap: pairs spawned later start with it;
///   (scale_atom)  its own timer: asks the router and every batcher for stats, decides, scales;
///   (stats_atom) -> SupervisorStats (actors/stats.hpp): the live batchers' BatcherStats summed
///       field by field (`batchers`; a batcher that does not answer in time adds nothing), plus
///       executors (active pairs), executors_retiring, scale_ups, scale_downs,
///       executor_failures (= failures_crash + failures_hang), replacements, requeued, failed_jobs, recoveries, recovery_ms_last,
///       recovery_ms_max, detect_ms_last (fault -> detection).
/// Scale events and failures are logged on stdout ("switchyard: supervisor: ...").
/// An exit message stops every pair, then the supervisor.
SupervisorActor spawn_supervisor(caf::actor_system& sys, SupervisorConfig cfg,
                                 SupervisorWiring wiring);

}  // namespace sy
