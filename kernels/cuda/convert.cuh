// Weight conversion on the device: rows of any GGUF element type we read (F32, F16, BF16 and
// every quantized type of SrcType) to f32 or bf16, and random fills (plain or Q8_0 blocks) for
// synthetic weights.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// GGUF element type codes, as in kernels::DType.
enum class SrcType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
};

/// Elements per block of a quantized type (32, or 256 for the K-quants and IQ4_XS); 1 for the
/// float types; 0 for a value that is not a SrcType above.
constexpr int64_t block_elems(SrcType t) {
  switch (t) {
    case SrcType::F32:
    case SrcType::F16:
    case SrcType::BF16:
      return 1;
    case SrcType::Q4_0:
    case SrcType::Q4_1:
    case SrcType::Q5_0:
    case SrcType::Q5_1:
    case SrcType::Q8_0:
    case SrcType::IQ4_NL:
      return 32;
    case SrcType::Q2_K:
    case SrcType::Q3_K:
    case SrcType::Q4_K:
    case SrcType::Q5_K:
    case SrcType::Q6_K:
    case SrcType::IQ4_XS:
      return 256;
  }
  return 0;
}

/// Converts n_rows rows of `cols` elements stored as `type` (rows back to back, ggml's block
/// layouts for the quantized types; cols a multiple of block_elems(type), else
/// cudaErrorInvalidValue, as for a type that is not a SrcType) to dst (n_rows, cols) of T.
template <class T>
cudaError_t convert_rows(SrcType type, const void* src, int64_t n_rows, int64_t cols, T* dst,
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
