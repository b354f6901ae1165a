// Logit soft-cap (gemma2's final_logit_softcapping), in place on f32 values.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// x[i] = cap * tanh(x[i] / cap) for i < n; cap > 0.
cudaError_t softcap(float* x, int64_t n, float cap, cudaStream_t stream);

}  // namespace sy::cuda
