// Rotary position embedding, llama.cpp's NORM layout (adjacent pairs), in place on f32 rows.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// For each row t (at x + t * row_stride) and head h (at + h * head_dim), rotates the pairs
/// (2i, 2i+1), 2i < rope_dim, by pos[t] * theta_scale^i. theta_scale = base^(-2 / rope_dim) is
/// passed in so that host and device build the angles from the same float (the CPU reference
/// forms them by the same running product).
cudaError_t rope(float* x, int64_t row_stride, int n_rows, int n_heads, int head_dim, int rope_dim,
                 const int32_t* pos, float theta_scale, cudaStream_t stream);

}  // namespace sy::cuda
