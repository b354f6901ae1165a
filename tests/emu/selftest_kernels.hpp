// Kernels that exercise the CUDA emulator itself (tests/emu/test_emu_runtime.cpp): each launcher
// takes device pointers and a stream and returns the launch status.
#pragma once

#include <cuda_runtime.h>

namespace sy::emutest {

/// Thread t writes cell t = t + 1 and thread t - 1 reads it into out[t - 1] (64 threads, 63
/// outputs); with_barrier false leaves out the __syncthreads between the write and the read.
cudaError_t neighbour_read(int* out, bool with_barrier, cudaStream_t s);
/// out[w] = sum of in[32 w .. 32 w + 31] by warp shuffles (n_warps warps in one block).
cudaError_t warp_sums(const float* in, float* out, int n_warps, cudaStream_t s);
/// Threads >= live return at once; the rest meet at a barrier and write out[t] = live.
cudaError_t early_exit(int* out, int live, cudaStream_t s);
/// out[0] = value (a kernel argument: what a captured graph keeps).
cudaError_t store_value(int* out, int value, cudaStream_t s);
/// A launch asking for smem bytes of dynamic shared memory; writes out[0] = 1.
cudaError_t big_smem(int* out, size_t smem, bool opt_in, cudaStream_t s);
/// Half of a warp shuffles while the other half waits at __syncthreads: a deadlock.
cudaError_t divergent_barrier(int* out, cudaStream_t s);
/// A wmma tile load from a pointer that is not 32-byte aligned.
cudaError_t misaligned_wmma(const void* tile, float* out, cudaStream_t s);

}  // namespace sy::emutest
