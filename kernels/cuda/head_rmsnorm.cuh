// RMSNorm of each attention head on its own (qwen3's q/k norms before RoPE), in place.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// For each row t (at x + t * row_stride) and head h < n_heads (at + h * head_dim):
///   v = v / rms(v) * w, v the head's head_dim f32 values; w is (head_dim), shared by all heads.
cudaError_t head_rmsnorm(float* x, int64_t row_stride, int n_rows, int n_heads, int head_dim,
                         const float* w, float eps, cudaStream_t stream);

}  // namespace sy::cuda
