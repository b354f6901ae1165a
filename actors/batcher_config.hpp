// Configuration of the batchers: the step budget, the KV cache and its policies, crash recovery.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/job.hpp"
#include "kernels/cpu/kernels.hpp"

namespace sy {

/// Each batcher (config `batching`).
struct BatchingConfig {
  uint32_t step_token_budget = 512;  // new tokens per step (decode + prefill chunks)
  uint32_t max_sequences = 64;       // running sequences per batcher
  uint32_t prefill_chunk = 256;      // longest prefill chunk of one sequence per step
  // A prompt of a more important class runs in a step of its own when the less important
  // classes' tokens would outweigh it (policies/step_planner.hpp, plan_step 3.)
  bool urgent_prefill = true;
  // Such a prompt does not wait for the step in flight either, where that step holds only less
  // important classes: the batcher asks the executor to stop it inside its layers (an engine
  // that can: the CPU engine) and plans the prompt's short step at once; the stopped step's
  // tokens are fed again after it. Never two short steps in a row, as above.
  bool urgent_interrupt = true;
  // Priority pacing (policies/step_planner.hpp, plan_step 4.): for priority_pacing_ms after a job
  // of a class reaches the batcher, the less important classes' prompt chunks add at most
  // priority_pacing times the measured cost of a decode step of the running batch to a step (and
  // at least kPaceMinTokens tokens), so that the next job of that class waits about one decode
  // step for the step in flight. 0 ms or 0: off.
  int32_t priority_pacing_ms = 1000;
  double priority_pacing = 0.5;
  int32_t kv_block_size = 16;
  int64_t kv_memory_mb = 0;  // KV memory per executor; 0: auto (256 MiB on the CPU; on a GPU
                             // kv_gpu_fraction of what is left after the weights)
  // With kv_memory_mb 0 on a GPU: the share of the device memory left after the weights and the
  // step buffers that the KV cache takes; the rest is for cuBLASLt, the CUDA context and
  // fragmentation (vLLM's gpu_memory_utilization, counted after the weights).
  double kv_gpu_fraction = 0.85;
  // Element type of the cached keys and values (kernels::parse_kv_type): f16, as llama.cpp's
  // default (half of f32's memory, logits within the golden tests' bounds), f32, or q8_0 (about
  // a quarter of f32; head_dim a multiple of 32; the CPU engine only, the CUDA engine refuses it).
  kernels::DType kv_dtype = kernels::DType::F16;
  int32_t step_delay_ms = 0;  // TEST ONLY: sleep before each step (slow executor)
  // KV-cache policy (policies/kv_policy.hpp format: full | sliding_window:W | sinks:S:W);
  // "" = the model's declared sliding window if it has one, else full.
  std::string kv_policy;
  std::string kv_pressure_policy;   // swapped in above kv_high_watermark; "" = never
  double kv_high_watermark = 0.90;  // fraction of KV blocks held by sequences
  double kv_low_watermark = 0.70;   // back to the normal policy at or below this
  bool prefix_cache = true;         // reuse cached KV blocks of shared prompt prefixes
  // layer_window_kv: for a model whose layers are of two kinds (full attention and a window of
  // their own, gemma2): true ("release") keeps the windowed layers' K/V in a pool of its own and
  // gives back their blocks behind the window (no prefix reuse then); false ("keep"): one pool
  // for all layers, every block held for the full-attention layers, prefix reuse on. The CPU
  // backend only (docs/kv_policies.md).
  bool release_layer_windows = true;
  // Crash recovery: a step that takes longer than this means a hung executor. Generous, since a
  // long prefill on a slow CPU can take seconds; tests set it low.
  int64_t step_timeout_ms = 30000;
  uint32_t max_job_retries = 2;  // executor failures a job survives; then engine_dead
  // Speculative decoding (docs/speculation.md): `auto` drafts tokens by prompt lookup where the
  // measured step cost and acceptance say they pay; `always` wherever lookup finds any; `off`
  // never. A job's own choice wins.
  SpecMode speculative = SpecMode::auto_;
  int32_t spec_max_draft = 6;  // most drafted tokens a sequence feeds in one step
  int32_t spec_ngram_min = 2;  // prompt lookup: shortest and longest suffix n-gram matched
  int32_t spec_ngram_max = 4;
  // Wiring, not configuration: where traced jobs' prefill, queue and decode spans go
  // (core/trace.hpp, docs/tracing.md); nullptr: tracing is off.
  std::shared_ptr<TraceBuffer> traces;
};

}  // namespace sy
