// RMSNorm + residual add kernel: one block per row, the sum of squares reduced in f32.
#include "kernels/cuda/rmsnorm.cuh"

namespace sy::cuda {
namespace {

constexpr int kThreads = 256;  // a Llama row (2k..8k floats) gives every thread several elements

template <class T>
__global__ void rmsnorm_add_kernel(float* x, const float* add, const float* w,
                                   const int32_t* row_map, T* out, int dim, float eps) {
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x;
  const int64_t i = row_map ? row_map[r] : r;
  float* xr = x + i * dim;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float v = xr[d];
    if (add) {
      v += add[i * dim + d];
      xr[d] = v;
    }
    ss += v * v;
  }
  ss = dev::block_sum(ss, red);
  const float scale = rsqrtf(ss / static_cast<float>(dim) + eps);
  T* o = out + r * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) o[d] = dev::from_f<T>(xr[d] * scale * w[d]);
}

}  // namespace

template <class T>
cudaError_t rmsnorm_add(float* x, const float* add, const float* w, const int32_t* row_map, T* out,
                        int n_rows, int dim, float eps, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  rmsnorm_add_kernel<T><<<n_rows, kThreads, 0, stream>>>(x, add, w, row_map, out, dim, eps);
  return cudaGetLastError();
}

template cudaError_t rmsnorm_add<float>(float*, const float*, const float*, const int32_t*, float*,
                                        int, int, float, cudaStream_t);
template cudaError_t rmsnorm_add<bf16>(float*, const float*, const float*, const int32_t*, bf16*,
                                       int, int, float, cudaStream_t);

}  // namespace sy::cuda
