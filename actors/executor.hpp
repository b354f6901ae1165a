// The executor actor: runs one model step per request on its own thread (detached) and samples the
// sequences that ask for a token. One executor per device; its batcher owns the KV block tables.
#pragma once

#include <atomic>
#include <caf/fwd.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/protocol.hpp"
#include "core/thread_class.hpp"
#include "gpu/backend_kind.hpp"
#include "kernels/cpu/kernels.hpp"

namespace sy {

class Model;
struct ConstraintSupport;
using LlamaModel = Model;  // model/model.hpp

/// How to build an executor.
struct ExecutorSpec {
  /// cpu: the CPU engine over `model`; cuda: the CUDA engine over `model` on `device` (a
  /// resolved backend: see gpu/backend.hpp); null: no model, every sampled token is
  /// `null_token` (measures the runtime's own overhead; its output is meaningless by design).
  Backend backend = Backend::cpu;
  std::shared_ptr<LlamaModel> model;  ///< required for "cpu" and "cuda", ignored for "null"
  int threads = 0;                    ///< engine threads; 0: hardware concurrency
  int32_t n_blocks = 0;               ///< KV blocks; must equal the batcher's pool size
  /// Window-group KV blocks (EngineOptions::n_window_blocks; the cpu backend); 0: one group.
  /// Must equal the batcher's window pool (BatcherExtras::window_blocks).
  int32_t n_window_blocks = 0;
  int32_t block_size = 16;        ///< tokens per KV block; must equal the batcher's
  int32_t max_batch_tokens = 0;   ///< most new tokens in one step; 0: the engine default
  double kv_gpu_fraction = 0.85;  ///< cuda with n_blocks 0: share of free memory for KV
  kernels::DType kv_type = kernels::DType::F16;  ///< cached K/V element type (cuda: F16, F32)
  int32_t step_delay_ms = 0;                     ///< TEST ONLY: sleep this long before every step
  int32_t null_token = 0;                        ///< the "null" backend's fixed token id
  int device = -1;                               ///< device index for a device backend; -1: CPU
  /// TEST ONLY: after this many steps the next step throws out of the handler, so the actor
  /// dies with an error (a crashed executor); 0: never.
  int32_t test_fault_throw_after = 0;
  /// TEST ONLY: after this many steps the executor stops answering step requests (a hung
  /// executor; it still takes exit messages, so it can be stopped); 0: never.
  int32_t test_fault_hang_after = 0;
  /// TEST ONLY: a sequence whose first planned chunk (reset set) feeds this token id gets NaN
  /// logits at every sampled step, so that its job fails alone; -1: never.
  int32_t test_nan_logits_token = -1;
  /// A draft model for speculative decoding (docs/speculation.md), on the same backend and
  /// device, with its own KV pool of n_blocks blocks (the target's pool size where n_blocks is
  /// 0); its vocabulary must be the target's (check_draft_vocabulary). Null: none.
  std::shared_ptr<LlamaModel> draft_model;
  /// The vocabulary index and compiled constraints shared with admission; null: the executor
  /// makes its own at the first constrained job.
  std::shared_ptr<ConstraintSupport> constraints;
  /// Raised by the batcher of the pair (BatcherExtras::interrupt) to stop the step in flight:
  /// the engine stops it inside its layers (Engine::interrupt_on; the CPU engine) and the step
  /// answers StepResult::interrupted. The batcher clears it. Null: every step runs to its end.
  std::shared_ptr<std::atomic<bool>> interrupt;
  /// The executor's thread and its engine's workers (name.w1, ...) take this name and CPU
  /// priority (config executors.cpu_priority; core/thread_class.hpp).
  std::string thread_name = "sy.exec";
  CpuPriority cpu_priority = CpuPriority::normal;
};

/// Spawns a detached executor. It handles
///   (step_atom, StepPlan) -> StepResult  (a failed step replies StepResult with `error` set;
///       a sequence that fails alone, for bad sampling parameters (bad_request), non-finite
///       logits or a plan the engine refuses for that sequence only (internal), gets a SeqResult
///       with `error` and `code` set while the others of the step get their tokens),
///   (release_atom, std::vector<uint64_t> uids)  forgets those sequences' samplers,
///   (stats_atom) -> ExecutorStats {steps, tokens, samplers, seq_failures, interrupted}
///       (actors/stats.hpp).
/// A step the engine stopped on spec.interrupt answers StepResult::interrupted with no seqs; it
/// changed no sampler's random stream (nothing was sampled) and records no token twice when its
/// tokens are fed again.
/// A sequence's sampler is made on its first plan with sample or reset set and kept until
/// released, so a recomputed (preempted) sequence continues its random stream.
/// The test-only fault flags of the spec make it crash or hang after N steps (crash recovery tests).
/// Throws std::invalid_argument for an unresolved (auto) backend or a cpu/cuda spec without a
/// model, std::runtime_error when the engine cannot be built (no device, the model does not fit).
/// `n_blocks` (optional) receives the engine's KV pool size: spec.n_blocks, or with 0 for the
/// cuda backend what the device holds; the batcher of the pair must use the same.
ExecutorActor spawn_executor(caf::actor_system& sys, ExecutorSpec spec,
                             int32_t* n_blocks = nullptr);

}  // namespace sy
