// Embedding gather kernel: one block per token row.
#include "kernels/cuda/embedding.cuh"

namespace sy::cuda {
namespace {

template <class T>
__global__ void embedding_kernel(const T* table, const int32_t* tokens, int dim, float scale,
                                 float* out) {
  const int64_t t = blockIdx.x;
  const T* src = table + static_cast<int64_t>(tokens[t]) * dim;
  float* dst = out + t * dim;
  if (scale == 1.0f) {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = dev::to_f(src[i]);
  } else {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = dev::to_f(src[i]) * scale;
  }
}

}  // namespace

template <class T>
cudaError_t embedding(const T* table, const int32_t* tokens, int n_tokens, int dim, float* out,
                      cudaStream_t stream, float scale) {
  if (n_tokens <= 0) return cudaSuccess;
  embedding_kernel<T><<<n_tokens, 256, 0, stream>>>(table, tokens, dim, scale, out);
  return cudaGetLastError();
}

template cudaError_t embedding<float>(const float*, const int32_t*, int, int, float*, cudaStream_t,
                                      float);
template cudaError_t embedding<bf16>(const bf16*, const int32_t*, int, int, float*, cudaStream_t,
                                     float);

}  // namespace sy::cuda
