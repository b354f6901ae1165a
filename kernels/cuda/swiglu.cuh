// SwiGLU of the fused gate/up projection.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// gu is f32 (n_rows, 2 * ffn): gate in columns [0, ffn), up in [ffn, 2 * ffn).
/// out[r, i] = silu(gate[r, i]) * up[r, i], out is (n_rows, ffn) of T.
template <class T>
cudaError_t swiglu(const float* gu, int n_rows, int ffn, T* out, cudaStream_t stream);

}  // namespace sy::cuda
