// Embedding gather: rows of the token table into the f32 residual stream.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// out[t, :] = table[tokens[t], :] as f32 times `scale` (gemma2: sqrt(dim)), for t in
/// [0, n_tokens); table is (n_vocab, dim).
template <class T>
cudaError_t embedding(const T* table, const int32_t* tokens, int n_tokens, int dim, float* out,
                      cudaStream_t stream, float scale = 1.0f);

}  // namespace sy::cuda
