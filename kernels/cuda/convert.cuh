// Weight conversion on the device: rows of any GGUF element type we read (F32, F16, BF16, Q8_0,
// Q4_0) to f32 or bf16, and random fills (plain or Q8_0 blocks) for synthetic weights.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// GGUF element type codes, as in kernels::DType.
enum class SrcType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, BF16 = 30 };

/// Converts n_rows rows of `cols` elements stored as `type` (rows back to back, ggml block
/// layout for Q8_0 / Q4_0; cols a multiple of 32 for those) to dst (n_rows, cols) of T.
template <class T>
cudaError_t convert_rows(SrcType type, const void* src, int64_t n_rows, int64_t cols, T* dst,
                         cudaStream_t stream);

/// dst[i] = offset + scale * u_i, u_i uniform in [-1, 1) from (seed, i): synthetic weights.
template <class T>
cudaError_t fill_uniform(T* dst, int64_t n, float offset, float scale, uint64_t seed,
                         cudaStream_t stream);

/// Random Q8_0 blocks for a (rows, cols) matrix at dst (rows * cols / 32 blocks of an f16 scale
/// and 32 int8): dequantized values spread uniformly over +-scale, drawn from (seed, element
/// index) as fill_uniform does. cols must be a multiple of 32 (else cudaErrorInvalidValue).
cudaError_t fill_q8_0(void* dst, int64_t rows, int64_t cols, float scale, uint64_t seed,
                      cudaStream_t stream);

}  // namespace sy::cuda
