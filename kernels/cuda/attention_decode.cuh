// Paged attention for rows that add few tokens (decode): grouped-query aware, the keys of each
// row split over several blocks (split-K) and the partial softmaxes merged by a second kernel.
#pragma once

#include <cstddef>

#include "kernels/cuda/kv_cache.cuh"

namespace sy::cuda {

/// Largest head_dim the attention kernels accept (8 values per lane of a warp).
constexpr int kMaxHeadDim = 256;

/// Floats of workspace attention_decode needs.
size_t attention_decode_workspace(int n_rows, int n_heads, int head_dim, int n_splits);

/// For each listed row t = rows[i] (i < n_rows) and query head h: softmax(cap(q_t,h . K * scale)) V
/// over the row's visible slots (scale, soft-cap and layer window from kv; by default
/// 1 / sqrt(hd), no cap, no layer window), written to out + t * out_stride + h * head_dim. q is f32 at
/// q + t * q_stride + h * head_dim (already rotated); query head h reads KV head
/// h / (n_heads / n_kv_heads). Each row's keys are cut into n_splits ranges handled by separate
/// blocks; `workspace` holds their partial results (attention_decode_workspace floats). The cache
/// holds C (float or half), the output is T (float or bf16: the activations' type).
template <class C, class T>
cudaError_t attention_decode(const float* q, int64_t q_stride, const PagedKv<C>& kv,
                             const int32_t* rows, int n_rows, int n_heads, int n_kv_heads,
                             int head_dim, int n_splits, float* workspace, T* out,
                             int64_t out_stride, cudaStream_t stream);

}  // namespace sy::cuda
