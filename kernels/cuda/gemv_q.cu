// Quantized GEMV: one warp per output row. The row is read as chunks of 32 elements (a legacy
// block, or an eighth of a K-quant super-block); lane l takes chunks l, l + 32, ..., decodes
// them in registers (dequant_blocks.cuh), and for each group of 16 or 32 elements that share a
// multiplier and an offset forms mul * sum(code * x) + add * sum(x). The activation rows are read
// through L1.
#include "kernels/cuda/dequant_blocks.cuh"
#include "kernels/cuda/gemv_q.cuh"

namespace sy::cuda {
namespace {

constexpr int kChunk = 32;  // elements a lane decodes at a time
constexpr int kWarps = 8;   // rows per block of 256 threads

template <class Q>
__global__ void gemv_q_kernel(const uint8_t* w, int64_t rows, int64_t cols, const float* x,
                              int n_tokens, float* y, int64_t ldy) {
  constexpr int kChunks = Q::kElems / kChunk;  // chunks per block
  constexpr int kGroups = kChunk / Q::kGroup;  // groups per chunk
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps leave together: rows are per warp
  const int64_t nb = cols / Q::kElems, n_chunks = cols / kChunk;
  const uint8_t* row = w + r * nb * Q::kBytes;
  float acc[kGemvMaxTokens];
#pragma unroll
  for (int t = 0; t < kGemvMaxTokens; ++t) acc[t] = 0.0f;
  for (int64_t ch = lane; ch < n_chunks; ch += 32) {
    const uint8_t* blk = row + (ch / kChunks) * Q::kBytes;
    const int e0 = static_cast<int>(ch % kChunks) * kChunk;
    float code[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) code[j] = static_cast<float>(Q::code(blk, e0 + j));
    float mul[kGroups], add[kGroups];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) Q::group(blk, e0 / Q::kGroup + g, mul[g], add[g]);
#pragma unroll
    for (int t = 0; t < kGemvMaxTokens; ++t) {
      if (t < n_tokens) {
        // 16-byte loads: the chunk starts at a multiple of 32 floats of a 16-byte aligned row.
        const float4* xt = reinterpret_cast<const float4*>(x + t * cols + ch * kChunk);
        float s = 0.0f;
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          float sq = 0.0f, sx = 0.0f;
#pragma unroll
          for (int j = 0; j < Q::kGroup; j += 4) {
            const float4 v = xt[(g * Q::kGroup + j) / 4];
            const float* c = code + g * Q::kGroup + j;
            sq = fmaf(c[0], v.x, sq);
            sq = fmaf(c[1], v.y, sq);
            sq = fmaf(c[2], v.z, sq);
            sq = fmaf(c[3], v.w, sq);
            if constexpr (Q::kMin) sx += (v.x + v.y) + (v.z + v.w);
          }
          s = fmaf(mul[g], sq, s);
          if constexpr (Q::kMin) {
            s = fmaf(add[g], sx, s);
          } else {
            (void)sx;  // types without a minimum need no sum of x
          }
        }
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kGemvMaxTokens; ++t) {
    if (t < n_tokens) {
      const float s = dev::warp_sum(acc[t]);
      if (lane == 0) y[t * ldy + r] = s;
    }
  }
}

template <class Q>
cudaError_t launch(const void* w, int64_t rows, int64_t cols, const float* x, int n_tokens,
                   float* y, int64_t ldy, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  gemv_q_kernel<Q><<<blocks, kWarps * 32, 0, stream>>>(static_cast<const uint8_t*>(w), rows, cols,
                                                       x, n_tokens, y, ldy);
  return cudaGetLastError();
}

}  // namespace

cudaError_t gemv_q(kernels::DType type, const void* w, int64_t rows, int64_t cols, const float* x,
                   int n_tokens, float* y, cudaStream_t stream, int64_t ldy) {
  if (ldy == 0) ldy = rows;
  if (!gemv_q_supports(type) || cols % kernels::dtype_block_elems(type) != 0 || ldy < rows ||
      n_tokens > kGemvMaxTokens || reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (rows <= 0 || n_tokens <= 0) return cudaSuccess;
  switch (type) {
    case kernels::DType::Q8_0:
      return launch<dq::Q8_0>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q4_0:
      return launch<dq::Q4_0>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q4_1:
      return launch<dq::Q4_1>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q5_0:
      return launch<dq::Q5_0>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q5_1:
      return launch<dq::Q5_1>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::IQ4_NL:
      return launch<dq::IQ4_NL>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q2_K:
      return launch<dq::Q2_K>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q3_K:
      return launch<dq::Q3_K>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q4_K:
      return launch<dq::Q4_K>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q5_K:
      return launch<dq::Q5_K>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::Q6_K:
      return launch<dq::Q6_K>(w, rows, cols, x, n_tokens, y, ldy, stream);
    case kernels::DType::IQ4_XS:
      return launch<dq::IQ4_XS>(w, rows, cols, x, n_tokens, y, ldy, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace sy::cuda
