// Bias add on f32 rows (qwen2's q|k|v biases, output biases), in place.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// y[t * row_stride + i] += b[i] for t < n_rows, i < n; b is (n) f32.
cudaError_t bias_add(float* y, int64_t row_stride, int n_rows, int64_t n, const float* b,
                     cudaStream_t stream);

}  // namespace sy::cuda
