// Gated-activation kernel (SwiGLU or GELU(tanh)-GLU): element-wise over (rows, ffn).
#include <algorithm>

#include "kernels/cuda/swiglu.cuh"

namespace sy::cuda {
namespace {

// GELU's tanh approximation: 0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2))).
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoef = 0.044715f;

template <class T>
__global__ void swiglu_kernel(const float* gu, int64_t n, int ffn, T* out, bool gelu) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = k / ffn, i = k % ffn;
    const float g = gu[r * 2 * ffn + i];
    const float u = gu[r * 2 * ffn + ffn + i];
    const float a = gelu ? 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * g * (1.0f + kGeluCoef * g * g)))
                         : g / (1.0f + expf(-g));
    out[k] = dev::from_f<T>(a * u);
  }
}

}  // namespace

template <class T>
cudaError_t swiglu(const float* gu, int n_rows, int ffn, T* out, cudaStream_t stream, GateAct act) {
  const int64_t n = int64_t{n_rows} * ffn;
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  // Grid-stride loop: 64k blocks is far more than enough to fill any GPU.
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  swiglu_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      gu, n, ffn, out, act == GateAct::GeluTanh);
  return cudaGetLastError();
}

template cudaError_t swiglu<float>(const float*, int, int, float*, cudaStream_t, GateAct);
template cudaError_t swiglu<bf16>(const float*, int, int, bf16*, cudaStream_t, GateAct);

}  // namespace sy::cuda
