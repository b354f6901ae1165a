// Kernels that exercise the CUDA emulator itself, written as any kernel of ours would be.
#include <cuda_bf16.h>
#include <mma.h>

#include "selftest_kernels.hpp"

namespace sy::emutest {
namespace {

__global__ void neighbour_kernel(int* out, bool with_barrier) {
  extern __shared__ int cells[];
  const int t = threadIdx.x;
  cells[t] = t + 1;
  if (with_barrier) __syncthreads();
  if (t < 63) out[t] = cells[t + 1];
}

__global__ void warp_sum_kernel(const float* in, float* out) {
  float v = in[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) out[threadIdx.x >> 5] = v;
}

__global__ void early_exit_kernel(int* out, int live) {
  if (static_cast<int>(threadIdx.x) >= live) return;
  __shared__ int count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  for (int i = 0; i < live; ++i) {
    if (static_cast<int>(threadIdx.x) == i) ++count;
    __syncthreads();
  }
  out[threadIdx.x] = count;
}

__global__ void store_kernel(int* out, int value) {
  out[0] = value;
}

__global__ void big_smem_kernel(int* out) {
  extern __shared__ float big[];
  big[0] = 1.0f;
  out[0] = static_cast<int>(big[0]);
}

__global__ void divergent_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x < 16) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = v;
}

__global__ void wmma_kernel(const __nv_bfloat16* tile, float* out) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
  wmma::load_matrix_sync(a, tile, 16);
  out[threadIdx.x] = 0.0f;
}

}  // namespace

cudaError_t neighbour_read(int* out, bool with_barrier, cudaStream_t s) {
  neighbour_kernel<<<1, 64, 64 * sizeof(int), s>>>(out, with_barrier);
  return cudaGetLastError();
}
cudaError_t warp_sums(const float* in, float* out, int n_warps, cudaStream_t s) {
  warp_sum_kernel<<<1, 32 * n_warps, 0, s>>>(in, out);
  return cudaGetLastError();
}
cudaError_t early_exit(int* out, int live, cudaStream_t s) {
  early_exit_kernel<<<1, 64, 0, s>>>(out, live);
  return cudaGetLastError();
}
cudaError_t store_value(int* out, int value, cudaStream_t s) {
  store_kernel<<<1, 1, 0, s>>>(out, value);
  return cudaGetLastError();
}
cudaError_t big_smem(int* out, size_t smem, bool opt_in, cudaStream_t s) {
  if (opt_in) {
    const cudaError_t e = cudaFuncSetAttribute(
        big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  big_smem_kernel<<<1, 32, smem, s>>>(out);
  return cudaGetLastError();
}
cudaError_t divergent_barrier(int* out, cudaStream_t s) {
  divergent_kernel<<<1, 32, 0, s>>>(out);
  return cudaGetLastError();
}
cudaError_t misaligned_wmma(const void* tile, float* out, cudaStream_t s) {
  wmma_kernel<<<1, 32, 0, s>>>(static_cast<const __nv_bfloat16*>(tile), out);
  return cudaGetLastError();
}

}  // namespace sy::emutest
