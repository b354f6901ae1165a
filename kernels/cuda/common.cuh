// Shared pieces of the CUDA kernels: the error-check macro, the bf16 and half types, and device
// helpers (guarded so that host-only C++ files can include the launcher headers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace sy::cuda {

/// Storage type of bf16 weights and activations. KV entries are float or `half` (IEEE binary16,
/// cuda_fp16.h: llama.cpp's default cache type), chosen by CudaEngineOptions::kv_type.
using bf16 = __nv_bfloat16;

/// The CUDA error `e` as an exception naming the call site.
inline std::runtime_error cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  return std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " +
                            cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

/// The sampling controls of one row (see sample.cuh).
struct SampleParams {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // <= 0: no top-k cut
  float top_p = 1.0f;        // >= 1: no nucleus cut
  uint32_t pad = 0;
  uint64_t seed = 0;
  uint64_t counter = 0;  // position of the draw in the sequence's random stream
};

}  // namespace sy::cuda

/// Throws std::runtime_error naming file and line when a CUDA runtime call fails.
#define CUDA_CHECK(expr)                                                     \
  do {                                                                       \
    const cudaError_t sy_cuda_err_ = (expr);                                 \
    if (sy_cuda_err_ != cudaSuccess) {                                       \
      throw ::sy::cuda::cuda_error(sy_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                        \
  } while (0)

#ifdef __CUDACC__
namespace sy::cuda::dev {

__device__ __forceinline__ float to_f(float x) {
  return x;
}
__device__ __forceinline__ float to_f(bf16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_f(half x) {
  return __half2float(x);
}
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ half from_f<half>(float x) {
  return __float2half(x);  // round to nearest even
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; `red` holds one float per warp. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // `red` may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < nw; ++w) s += red[w];
  return s;
}
__device__ __forceinline__ float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = -INFINITY;
  for (int w = 0; w < nw; ++w) s = fmaxf(s, red[w]);
  return s;
}

}  // namespace sy::cuda::dev
#endif
