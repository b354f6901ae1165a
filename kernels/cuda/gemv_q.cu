// Quantized GEMV: one warp per output row; lane l takes blocks l, l + 32, ... of the row and
// dequantizes them in registers; the activation rows are read through L1.
#include "kernels/cuda/gemv_q.cuh"

namespace sy::cuda {
namespace {

constexpr int kQK = 32;
constexpr int kWarps = 8;  // rows per block of 256 threads

__device__ float half_bits(const uint8_t* p) {
  const unsigned short h = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(h));
}

template <bool kQ8>
__global__ void gemv_q_kernel(const uint8_t* w, int64_t rows, int64_t cols, const float* x,
                              int n_tokens, float* y) {
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int64_t nb = cols / kQK;
  constexpr int kBytes = kQ8 ? 34 : 18;
  const uint8_t* row = w + r * nb * kBytes;
  float acc[kGemvMaxTokens];
#pragma unroll
  for (int t = 0; t < kGemvMaxTokens; ++t) acc[t] = 0.0f;
  for (int64_t b = lane; b < nb; b += 32) {
    const uint8_t* blk = row + b * kBytes;
    const float d = half_bits(blk);
    float v[kQK];
#pragma unroll
    for (int j = 0; j < kQK; ++j) {
      if constexpr (kQ8) {
        v[j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
      } else {
        const int q = j < kQK / 2 ? (blk[2 + j] & 0x0f) : (blk[2 + j - kQK / 2] >> 4);
        v[j] = d * static_cast<float>(q - 8);
      }
    }
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < n_tokens) {
        const float* xt = x + t * cols + b * kQK;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kQK; ++j) s += v[j] * xt[j];
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kGemvMaxTokens; ++t) {
    if (t < n_tokens) {
      const float s = dev::warp_sum(acc[t]);
      if (lane == 0) y[t * rows + r] = s;
    }
  }
}

}  // namespace

cudaError_t gemv_q(SrcType type, const void* w, int64_t rows, int64_t cols, const float* x,
                   int n_tokens, float* y, cudaStream_t stream) {
  if (rows <= 0 || n_tokens <= 0) return cudaSuccess;
  if (n_tokens > kGemvMaxTokens || cols % kQK != 0) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  const auto* wp = static_cast<const uint8_t*>(w);
  if (type == SrcType::Q8_0) {
    gemv_q_kernel<true><<<blocks, kWarps * 32, 0, stream>>>(wp, rows, cols, x, n_tokens, y);
  } else if (type == SrcType::Q4_0) {
    gemv_q_kernel<false><<<blocks, kWarps * 32, 0, stream>>>(wp, rows, cols, x, n_tokens, y);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace sy::cuda
