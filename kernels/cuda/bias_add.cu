// Bias-add kernel: element-wise over (rows, n).
#include <algorithm>

#include "kernels/cuda/bias_add.cuh"

namespace sy::cuda {
namespace {

__global__ void bias_add_kernel(float* y, int64_t row_stride, int64_t total, int64_t n,
                                const float* b) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = k / n, i = k % n;
    y[t * row_stride + i] += b[i];
  }
}

}  // namespace

cudaError_t bias_add(float* y, int64_t row_stride, int n_rows, int64_t n, const float* b,
                     cudaStream_t stream) {
  const int64_t total = int64_t{n_rows} * n;
  if (total <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  // Grid-stride loop: 64k blocks is far more than enough to fill any GPU.
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 65536);
  bias_add_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(y, row_stride, total, n,
                                                                          b);
  return cudaGetLastError();
}

}  // namespace sy::cuda
