// Per-head RMSNorm kernel: one warp per (row, head), the sum of squares reduced in f32.
#include "kernels/cuda/head_rmsnorm.cuh"

namespace sy::cuda {
namespace {

constexpr int kWarps = 4;  // heads per block: a head is at most 256 values, a warp's worth of work

__global__ void head_rmsnorm_kernel(float* x, int64_t row_stride, int n_heads, int head_dim,
                                    const float* w, float eps) {
  const int h = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (h >= n_heads) return;  // the whole warp leaves together: no shuffle is left half-attended
  const int lane = threadIdx.x & 31;
  float* v = x + int64_t{blockIdx.y} * row_stride + int64_t{h} * head_dim;
  float ss = 0.0f;
  for (int d = lane; d < head_dim; d += 32) ss += v[d] * v[d];
  ss = dev::warp_sum(ss);
  const float scale = rsqrtf(ss / static_cast<float>(head_dim) + eps);
  for (int d = lane; d < head_dim; d += 32) v[d] = v[d] * scale * w[d];
}

}  // namespace

cudaError_t head_rmsnorm(float* x, int64_t row_stride, int n_rows, int n_heads, int head_dim,
                         const float* w, float eps, cudaStream_t stream) {
  if (n_rows <= 0 || n_heads <= 0) return cudaSuccess;
  if (head_dim <= 0) return cudaErrorInvalidValue;
  const dim3 grid((n_heads + kWarps - 1) / kWarps, n_rows);
  head_rmsnorm_kernel<<<grid, kWarps * 32, 0, stream>>>(x, row_stride, n_heads, head_dim, w, eps);
  return cudaGetLastError();
}

}  // namespace sy::cuda
