// Rotary position embedding in llama.cpp's NORM (adjacent pairs) or NEOX (pairs i, i + rope_dim/2)
// layout, with optional frequency factors (rope_freqs) and linear scaling, in place on f32 rows.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// For each row t (at x + t * row_stride) and head h (at + h * head_dim), rotates pair i
/// (i < rope_dim / 2) by freq_scale * (pos[t] * theta_scale^i / freq_factors[i]) (no division
/// when freq_factors is nullptr). The pair is (2i, 2i+1) (NORM) or, with neox, (i, i + rope_dim
/// / 2). theta_scale = base^(-2 / rope_dim) is passed in so that host and device build the angles
/// from the same float (the CPU reference forms them by the same running product).
/// freq_factors is a device array of rope_dim / 2 floats.
cudaError_t rope(float* x, int64_t row_stride, int n_rows, int n_heads, int head_dim, int rope_dim,
                 const int32_t* pos, float theta_scale, cudaStream_t stream,
                 const float* freq_factors = nullptr, float freq_scale = 1.0f, bool neox = false);

}  // namespace sy::cuda
