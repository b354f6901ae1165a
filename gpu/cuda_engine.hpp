// The CUDA backend of the engine interface: weights and the paged KV cache in device memory,
// one stream, matrix products through cuBLASLt, sampling on the device. No CUDA header here, so
// any part of the project may include it; it exists only in builds with SWITCHYARD_HAVE_CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/engine.hpp"

namespace sy {

/// Usable CUDA devices; 0 on any error (no driver, no device, a driver older than the runtime).
int cuda_device_count();

/// Settings of the CUDA backend.
struct CudaEngineOptions {
  int device = 0;
  int32_t block_size = 16;           // tokens per KV block
  int32_t n_blocks = 0;              // 0: as many as kv_memory_fraction of the free memory holds
  double kv_memory_fraction = 0.85;  // of the memory free after weights and scratch; the rest
                                     // stays for cuBLASLt, the CUDA context and fragmentation
  int32_t max_batch_tokens = 4096;   // most new tokens in one step (sizes the scratch buffers)
  int32_t max_logit_rows = 256;      // rows of logits preallocated; a step needing more grows it
  bool f32_weights = false;          // keep F32/F16 weights (and activations) in f32 instead of
                                     // bf16: slower, for exact parity with the CPU reference
  // Element type of the cached keys and values (batching.kv_dtype), whatever the weights' type:
  // F16 (IEEE half, llama.cpp's default: half the memory of F32) or F32. Q8_0 is refused (the
  // constructor throws std::runtime_error): no CUDA kernel reads it yet.
  kernels::DType kv_type = kernels::DType::F16;
  int32_t sliding_window = 0;         // > 0: each token attends to at most this many latest slots
  bool tensor_core_attention = true;  // f16-cache prefill attention on tensor cores (else f32)
  bool cuda_graphs = false;  // replay pure decode steps (one new token per sequence, at most 256
                             // sequences, padded up to 1, 2, 4, ..., 256) as captured CUDA graphs:
                             // fewer launch gaps for small batches; other steps run as usual.
                             // A mixture-of-experts model: at most 16 sequences (its larger
                             // steps group tokens by expert on the host, docs/cuda.md)
  bool quantized_decode = false;  // quantized files (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, the
                                  // K-quants, IQ4_XS; mixes like Q4_K_M): also keep the layer
                                  // matrices (and the output matrix) as the file's blocks, read
                                  // by a GEMV in steps of at most 8 new tokens; prefill keeps
                                  // the dequantized copies. Needs every layer matrix quantized,
                                  // else it has no effect. A synthetic engine then makes its
                                  // layer and output matrices random Q8_0, the bf16 copies
                                  // dequantized from them
};

/// Sampling controls of one sequence for CudaEngine::step_sample.
struct SampleControl {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;        // >= 1: off
  uint64_t seed = 0;
  uint64_t counter = 0;  // index of the draw in the sequence's stream (e.g. its position)
};

/// The engine interface plus what only the device backend offers.
class CudaEngine : public Engine {
 public:
  /// Like step(), but samples each sequence's next token on the device; only the token ids
  /// (one per sequence) come back. controls has one entry per sequence of the batch.
  virtual void step_sample(const std::vector<SeqStep>& batch,
                           const std::vector<SampleControl>& controls,
                           std::vector<int32_t>& tokens) = 0;
  /// Fills the whole KV cache with small random values (benchmarks that decode over a context
  /// without prefilling it first).
  virtual void randomize_kv(uint64_t seed) = 0;
  /// Bytes of device memory taken by the weights and by the KV cache.
  virtual size_t weight_bytes() const = 0;
  virtual size_t kv_bytes() const = 0;
};

/// The CUDA backend for a loaded model. Weights are uploaded once: F32/F16/BF16 become bf16
/// (f32 with f32_weights); quantized types (every one with CPU kernels, kernels::dtype_known,
/// each tensor by its own type) are dequantized to bf16 (f32) at load, and also kept as blocks
/// with quantized_decode. Throws std::runtime_error when there is no device, when the weights do
/// not fit in free device memory, when no room is left for a KV cache of one full step, or for
/// a kv_type other than F16 and F32.
std::unique_ptr<Engine> make_cuda_engine(std::shared_ptr<LlamaModel> model,
                                         const CudaEngineOptions& opts);

/// A CUDA engine with random bf16 weights of the given shape generated on the device (no file):
/// for benchmarks of model shapes we have no file for; with quantized_decode, as from a Q8_0
/// file (every row a multiple of 32 elements). Its model() throws std::logic_error.
std::unique_ptr<CudaEngine> make_cuda_engine_synthetic(const LlamaConfig& config,
                                                       const CudaEngineOptions& opts,
                                                       uint64_t seed);

}  // namespace sy
