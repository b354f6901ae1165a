// RMSNorm fused with the residual add that precedes it.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// For each output row r (input row i = row_map ? row_map[r] : r):
///   x[i, :] += add[i, :]  (when add != nullptr; the sum is written back to x)
///   out[r, :] = x[i, :] / rms(x[i, :]) * w
/// x and add are f32 (rows, dim); out is (n_rows, dim) of T. With T = float and no row_map, out
/// may be x itself (an in-place norm: each value is read before it is written, by one thread).
template <class T>
cudaError_t rmsnorm_add(float* x, const float* add, const float* w, const int32_t* row_map, T* out,
                        int n_rows, int dim, float eps, cudaStream_t stream);

}  // namespace sy::cuda
