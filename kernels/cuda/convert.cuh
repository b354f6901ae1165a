// Weight conversion on the device: rows of any GGUF element type we read (F32, F16, BF16 and
// every quantized type of convert_supports) to f32 or bf16, and random fills (plain or Q8_0
// blocks) for synthetic weights.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/ggml_type.hpp"

namespace sy::cuda {

/// Whether convert_rows reads `type`: F32, F16, BF16 and the quantized types of the CPU kernels
/// (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, the K-quants Q2_K..Q6_K and IQ4_XS).
constexpr bool convert_supports(kernels::DType type) {
  switch (type) {
    case kernels::DType::F32:
    case kernels::DType::F16:
    case kernels::DType::BF16:
    case kernels::DType::Q4_0:
    case kernels::DType::Q4_1:
    case kernels::DType::Q5_0:
    case kernels::DType::Q5_1:
    case kernels::DType::Q8_0:
    case kernels::DType::IQ4_NL:
    case kernels::DType::Q2_K:
    case kernels::DType::Q3_K:
    case kernels::DType::Q4_K:
    case kernels::DType::Q5_K:
    case kernels::DType::Q6_K:
    case kernels::DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

/// Converts n_rows rows of `cols` elements stored as `type` (rows back to back, ggml's block
/// layouts for the quantized types; cols a multiple of kernels::dtype_block_elems(type), else
/// cudaErrorInvalidValue, as for a type convert_supports refuses) to dst (n_rows, cols) of T.
template <class T>
cudaError_t convert_rows(kernels::DType type, const void* src, int64_t n_rows, int64_t cols, T* dst,
                         cudaStream_t stream);

/// dst[i] = offset + scale * u_i, u_i uniform in [-1, 1) from (seed, i): synthetic weights (float,
/// bf16) and KV caches (float, half).
template <class T>
cudaError_t fill_uniform(T* dst, int64_t n, float offset, float scale, uint64_t seed,
                         cudaStream_t stream);

/// Random Q8_0 blocks for a (rows, cols) matrix at dst (rows * cols / 32 blocks of an f16 scale
/// and 32 int8): dequantized values spread uniformly over +-scale, drawn from (seed, element
/// index) as fill_uniform does. cols must be a multiple of 32 (else cudaErrorInvalidValue).
cudaError_t fill_q8_0(void* dst, int64_t rows, int64_t cols, float scale, uint64_t seed,
                      cudaStream_t stream);

}  // namespace sy::cuda
