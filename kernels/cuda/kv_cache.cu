// KV store kernel: one block per new token row.
#include "kernels/cuda/kv_cache.cuh"

namespace sy::cuda {
namespace {

template <class C>
__global__ void kv_store_kernel(const float* src, int64_t row_stride, int64_t k_off, int64_t v_off,
                                int kv_dim, const int32_t* slot, C* kc, C* vc) {
  const int64_t t = blockIdx.x;
  const float* row = src + t * row_stride;
  const int64_t dst = static_cast<int64_t>(slot[t]) * kv_dim;
  for (int d = threadIdx.x; d < kv_dim; d += blockDim.x) {
    kc[dst + d] = dev::from_f<C>(row[k_off + d]);
    vc[dst + d] = dev::from_f<C>(row[v_off + d]);
  }
}

}  // namespace

template <class C>
cudaError_t kv_store(const float* src, int64_t row_stride, int64_t k_off, int64_t v_off, int n_rows,
                     int kv_dim, const int32_t* slot, C* k_cache, C* v_cache, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  kv_store_kernel<C>
      <<<n_rows, 256, 0, stream>>>(src, row_stride, k_off, v_off, kv_dim, slot, k_cache, v_cache);
  return cudaGetLastError();
}

template cudaError_t kv_store<float>(const float*, int64_t, int64_t, int64_t, int, int,
                                     const int32_t*, float*, float*, cudaStream_t);
template cudaError_t kv_store<half>(const float*, int64_t, int64_t, int64_t, int, int,
                                    const int32_t*, half*, half*, cudaStream_t);

}  // namespace sy::cuda
