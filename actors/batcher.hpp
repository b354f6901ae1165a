// The batcher actor: continuous batching for one executor. A thin shell over three pieces: the
// step planner (policies/step_planner.hpp: admit, plan decodes plus chunked prefill under a token
// budget, preempt), the KV block manager (gpu/kv_manager.hpp: block tables mirroring the
// executor's pools, prefix cache) and the stop matcher (model/stop_matcher.hpp: detokenizing and
// stop strings). Time is the actor clock's, so tests run it on the test scheduler.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "actors/batcher_config.hpp"
#include "actors/protocol.hpp"

namespace sy {

class Model;
using LlamaModel = Model;  // model/model.hpp
struct ModelLimits;

/// KV blocks that fit in `cfg.kv_memory_mb` (0: kDefaultKvMemoryMb) when one token's KV entry
/// takes `kv_bytes_per_token` (Model::limits()), at least 1. Without a model (null backend, 0)
/// a token is taken to cost 4 KiB, the size of a small real model's KV entry, so that the pool
/// stays a plausible size.
int32_t kv_blocks_for(const BatchingConfig& cfg, int64_t kv_bytes_per_token);

/// The KV pools of one executor: the full-attention group's (every layer's with one group) and
/// the window group's.
struct KvPools {
  int32_t n_blocks = 1;
  int32_t n_window_blocks = 0;  ///< 0: one group
};
/// The pools for a model with limits `lim` in `cfg.kv_memory_mb` (0: kDefaultKvMemoryMb), K/V in
/// `cfg.kv_dtype`. With `split` (the backend keeps the windowed layers' K/V apart: the cpu
/// backend, batching.layer_window_kv release) and a model whose layers are of two kinds
/// (ModelLimits::split_window() W > 0), the window group gets what max_sequences sequences can
/// hold at once under sliding_window:W (policy::max_blocks_held over the context in
/// prefill_chunk chunks), at most half of the memory, and the full-attention group the rest,
/// each at its own bytes per block. Otherwise one group, as kv_blocks_for.
KvPools kv_pools_for(const BatchingConfig& cfg, const ModelLimits& lim, bool split);
/// KV memory of a CPU executor when the configuration leaves it to us: a few dozen full-context
/// sequences of a small model, without crowding a laptop.
constexpr int64_t kDefaultKvMemoryMb = 256;

/// Spawns a batcher driving `executor` (which must have `n_blocks` blocks of
/// `cfg.kv_block_size` tokens). `model` may be null (null backend): then text is always empty and
/// no token ends a job but max_tokens.
///
/// Handles:
///   (run_atom, Job)          a job from the router (against credit); beyond max_sequences it
///                            waits in a local queue;
///   (cancel_atom, uint64 uid) the job ends within one step: DoneEvent finish=cancelled;
///   (status_atom, uint64 uid) -> uint32 completion tokens generated so far (0: not here);
///   (stats_atom) -> BatcherStats (actors/stats.hpp): running, waiting, blocks_used,
///                   blocks_free, blocks_total, window_blocks_used, window_blocks_free,
///                   window_blocks_total (the window group; 0 with one group), preemptions,
///                   steps, tokens, finished.
/// Sends: (credit_atom, self, n) to `router` (max_sequences at start, then one per ended job);
/// (out_atom, TokensEvent|DoneEvent|ErrorEvent) to `egress`; (finished_atom, JobOutcome) to
/// `admission`; (step_atom, StepPlan) requests and (release_atom, uids) to `executor`.
/// Priority: a lower Job::class_index is a more important class. Under KV pressure the running
/// sequence with the highest class_index, latest arrival among those, is preempted (blocks freed,
/// recomputed later from prompt + generated tokens, nothing re-sent); a waiting job likewise
/// preempts less important running ones to start. Preempted jobs resume before later arrivals
/// of their class, without a sampler reset (a seeded job's tokens do not change). A job that
/// cannot fit in the whole pool even alone fails at once with bad_request. A failed step fails
/// its jobs with engine_dead; a sequence the executor failed alone (SeqResult::error) ends that
/// job with the executor's code and message, and the rest of the step goes on. Streamed jobs of
/// ROUTER clients end with a DoneEvent whose text and ids are empty (the chunks carried them, as
/// docs/protocol.md says); the JobOutcome keeps the full result.
/// Any of router, egress, admission may be an invalid handle (nothing is sent there).
BatcherActor spawn_batcher(caf::actor_system& sys, BatchingConfig cfg,
                           std::shared_ptr<const LlamaModel> model, ExecutorActor executor,
                           RouterActor router, EgressActor egress, AdmissionActor admission,
                           int32_t n_blocks);

/// What a supervised batcher knows beyond the plain wiring.
struct BatcherExtras {
  SupervisorActor supervisor;  ///< gets failed_atom, recovered_atom and kvpolicy_atom notices
  uint64_t pair = 0;           ///< the supervisor's id of this batcher+executor pair (logs)
  int32_t test_fault_throw_after = 0;  ///< TEST ONLY: throw after this many steps (0: never)
  /// The executor's window-group KV blocks (ExecutorSpec::n_window_blocks): > 0 for a model
  /// whose layers are of two kinds on an engine that splits its cache; 0: one group.
  int32_t window_blocks = 0;
  /// The executor has a draft model (ExecutorSpec::draft_model): it writes the drafts.
  bool draft_model = false;
  /// Where the events that need no journal record go straight (the egress actor itself, where
  /// `egress` is the journal standing in front of it): streamed chunks, and the done or error of
  /// a job that is not journaled (Job::journaled false). Invalid: everything goes to `egress`.
  EgressActor direct_egress;
  /// Shared with the executor of the pair (ExecutorSpec::interrupt): raised to stop the step in
  /// flight for a more important job (BatchingConfig::urgent_interrupt). Null: never.
  std::shared_ptr<std::atomic<bool>> interrupt;
};

/// spawn_batcher for a supervised pair. Beyond the above it monitors `executor`; an executor
/// that goes down, fails a request, or gives no StepResult within cfg.step_timeout_ms (the
/// watchdog; 0: none) is given up: every job here goes back to the router with
/// (requeue_atom, std::vector<Job>) — attempt counted for jobs that reached the executor,
/// streamed progress recorded so that the client gets no chunk twice — except jobs past
/// cfg.max_job_retries (engine_dead) and jobs being cancelled; the supervisor gets
/// (failed_atom, PairFailure); the batcher asks the router to stop dispatching to it
/// ((retire_atom, self) request), sends back any job that still arrives, and exits.
/// (retire_atom) makes it stop granting credit, finish its jobs and exit (scale down).
/// A job with fault_us set sends (recovered_atom, fault_us, now_us) to the supervisor when its
/// first step here is planned.
BatcherActor spawn_batcher(caf::actor_system& sys, BatchingConfig cfg,
                           std::shared_ptr<const LlamaModel> model, ExecutorActor executor,
                           RouterActor router, EgressActor egress, AdmissionActor admission,
                           int32_t n_blocks, BatcherExtras extras);

}  // namespace sy
