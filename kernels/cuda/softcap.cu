// Soft-cap kernel: element-wise over n values.
#include <algorithm>

#include "kernels/cuda/softcap.cuh"

namespace sy::cuda {
namespace {

__global__ void softcap_kernel(float* x, int64_t n, float cap, float inv) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    x[k] = cap * tanhf(x[k] * inv);
  }
}

}  // namespace

cudaError_t softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (!(cap > 0.0f)) return cudaErrorInvalidValue;
  constexpr int kThreads = 256;
  // Grid-stride loop: 64k blocks is far more than enough to fill any GPU.
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  softcap_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, cap, 1.0f / cap);
  return cudaGetLastError();
}

}  // namespace sy::cuda
