// RoPE kernel: one thread per rotated pair, NORM (adjacent) or NEOX (half-split) pairs.
#include "kernels/cuda/rope.cuh"

namespace sy::cuda {
namespace {

__global__ void rope_kernel(float* x, int64_t row_stride, int n_heads, int head_dim, int rope_dim,
                            const int32_t* pos, float theta_scale, const float* freq_factors,
                            float freq_scale, bool neox) {
  const int t = blockIdx.y;
  const int pairs = rope_dim / 2;
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n_heads * pairs) return;
  const int h = k / pairs, i = k % pairs;
  // The same running product as the reference: bit-identical angles, so the only differences
  // left are those of sinf/cosf.
  float theta = static_cast<float>(pos[t]);
  for (int j = 0; j < i; ++j) theta *= theta_scale;
  // Factors and scaling in the reference's order: (theta / factor) * scale.
  if (freq_factors) theta /= freq_factors[i];
  theta = freq_scale * theta;
  float s, c;
  sincosf(theta, &s, &c);
  float* v = x + t * row_stride + static_cast<int64_t>(h) * head_dim;
  const int a = neox ? i : 2 * i;
  const int b = neox ? i + pairs : 2 * i + 1;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x0 * s + x1 * c;
}

}  // namespace

cudaError_t rope(float* x, int64_t row_stride, int n_rows, int n_heads, int head_dim, int rope_dim,
                 const int32_t* pos, float theta_scale, cudaStream_t stream,
                 const float* freq_factors, float freq_scale, bool neox) {
  if (n_rows <= 0) return cudaSuccess;
  if (rope_dim % 2 != 0 || rope_dim > head_dim) return cudaErrorInvalidValue;
  constexpr int kThreads = 128;
  const int n = n_heads * (rope_dim / 2);
  const dim3 grid((n + kThreads - 1) / kThreads, n_rows);
  rope_kernel<<<grid, kThreads, 0, stream>>>(x, row_stride, n_heads, head_dim, rope_dim, pos,
                                             theta_scale, freq_factors, freq_scale, neox);
  return cudaGetLastError();
}

}  // namespace sy::cuda
