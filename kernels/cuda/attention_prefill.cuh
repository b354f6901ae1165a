// Paged causal attention for chunks of new tokens (prefill): query tiles against key tiles with
// the online softmax of FlashAttention, so no score matrix larger than a tile is ever stored.
#pragma once

#include "kernels/cuda/kv_cache.cuh"

namespace sy::cuda {

/// Query rows per tile: the host cuts each sequence's new rows into tiles of at most this many.
constexpr int kPrefillTileRows = 64;

/// Tile b covers rows [tile_row0[b], tile_row0[b] + tile_len[b]) (tile_len <= kPrefillTileRows),
/// consecutive rows of one sequence. Same per-row semantics and layout as attention_decode: a
/// cache of C (float or half), output T (float or bf16). tensor_cores: for a half cache with
/// head_dim a multiple of 16, the score and output products run on tensor cores (queries and
/// probabilities rounded to half, f32 accumulation); otherwise, and for an f32 cache, plain f32
/// arithmetic.
template <class C, class T>
cudaError_t attention_prefill(const float* q, int64_t q_stride, const PagedKv<C>& kv,
                              const int32_t* tile_row0, const int32_t* tile_len, int n_tiles,
                              int n_heads, int n_kv_heads, int head_dim, T* out, int64_t out_stride,
                              cudaStream_t stream, bool tensor_cores = true);

}  // namespace sy::cuda
