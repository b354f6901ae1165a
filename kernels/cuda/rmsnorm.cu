// RMSNorm + residual add kernel: one block per row, the sum of squares reduced in f32. Rows whose
// width is a multiple of 4 (every model's) take 16-byte loads, each thread holding its values in
// registers between the two passes, with up to 1024 threads per row: one round of loads for a
// 4096-wide row, which keeps a decode step's single-row norms from waiting on memory latency.
#include <algorithm>
#include <cstring>

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

constexpr int kMaxVecThreads = 1024;

/// Four values of T at o (8-byte aligned for bf16, 16 for float).
__device__ __forceinline__ void store4(float* o, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(o) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(bf16* o, float a, float b, float c, float d) {
  bf16 v[4] = {dev::from_f<bf16>(a), dev::from_f<bf16>(b), dev::from_f<bf16>(c),
               dev::from_f<bf16>(d)};
  uint2 packed;
  memcpy(&packed, v, sizeof(packed));
  *reinterpret_cast<uint2*>(o) = packed;
}

// dim % 4 == 0; each thread takes float4 number threadIdx.x + u * blockDim.x, u < kPer.
template <class T, int kPer>
__global__ void rmsnorm_add_vec_kernel(float* x, const float* add, const float* w,
                                       const int32_t* row_map, T* out, int dim, float eps) {
  __shared__ float red[kMaxVecThreads / 32];
  const int64_t r = blockIdx.x;
  const int64_t i = row_map ? row_map[r] : r;
  const int n4 = dim / 4;
  float4* xr = reinterpret_cast<float4*>(x + i * dim);
  const float4* ar = add ? reinterpret_cast<const float4*>(add + i * dim) : nullptr;
  float4 v[kPer];
  float ss = 0.0f;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int e = threadIdx.x + u * blockDim.x;
    if (e < n4) {
      v[u] = xr[e];
      if (ar) {
        const float4 b = ar[e];
        v[u].x += b.x;
        v[u].y += b.y;
        v[u].z += b.z;
        v[u].w += b.w;
        xr[e] = v[u];
      }
      ss += (v[u].x * v[u].x + v[u].y * v[u].y) + (v[u].z * v[u].z + v[u].w * v[u].w);
    }
  }
  ss = dev::block_sum(ss, red);
  const float scale = rsqrtf(ss / static_cast<float>(dim) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  T* o = out + r * dim;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const int e = threadIdx.x + u * blockDim.x;
    if (e < n4) {
      const float4 g = w4[e];
      store4(o + 4 * e, v[u].x * scale * g.x, v[u].y * scale * g.y, v[u].z * scale * g.z,
             v[u].w * scale * g.w);
    }
  }
}

template <class T, int kPer>
cudaError_t launch_vec(float* x, const float* add, const float* w, const int32_t* row_map, T* out,
                       int n_rows, int dim, float eps, cudaStream_t stream) {
  const int n4 = dim / 4;
  const int per = (n4 + kPer - 1) / kPer;                              // threads the row needs
  const int threads = std::min(kMaxVecThreads, (per + 31) / 32 * 32);  // whole warps
  rmsnorm_add_vec_kernel<T, kPer>
      <<<n_rows, threads, 0, stream>>>(x, add, w, row_map, out, dim, eps);
  return cudaGetLastError();
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

template <class T>
cudaError_t rmsnorm_add(float* x, const float* add, const float* w, const int32_t* row_map, T* out,
                        int n_rows, int dim, float eps, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  if (dim % 4 == 0 && aligned16(x) && (!add || aligned16(add)) && aligned16(w) &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    const int n4 = dim / 4;
    if (n4 <= kMaxVecThreads)
      return launch_vec<T, 1>(x, add, w, row_map, out, n_rows, dim, eps, stream);
    if (n4 <= 2 * kMaxVecThreads)
      return launch_vec<T, 2>(x, add, w, row_map, out, n_rows, dim, eps, stream);
    if (n4 <= 4 * kMaxVecThreads)
      return launch_vec<T, 4>(x, add, w, row_map, out, n_rows, dim, eps, stream);
  }
  rmsnorm_add_kernel<T><<<n_rows, kThreads, 0, stream>>>(x, add, w, row_map, out, dim, eps);
  return cudaGetLastError();
}

template cudaError_t rmsnorm_add<float>(float*, const float*, const float*, const int32_t*, float*,
                                        int, int, float, cudaStream_t);
template cudaError_t rmsnorm_add<bf16>(float*, const float*, const float*, const int32_t*, bf16*,
                                       int, int, float, cudaStream_t);

}  // namespace sy::cuda
