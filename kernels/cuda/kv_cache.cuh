// The paged KV cache as the attention kernels see it, and the kernel that writes new entries.
#pragma once

#include "kernels/cuda/common.cuh"

namespace sy::cuda {

/// One layer's paged cache of C entries (float or half) plus the step's per-row metadata (all
/// device pointers). Slot s of the sequence of row t lives at block
/// block_tables[seq_bt_off[row_seq[t]] + s / bs] offset s % bs; an entry is
/// kv_dim = n_kv_heads * head_dim values.
template <class C>
struct PagedKv {
  const C* k = nullptr;                   // (n_slots, kv_dim)
  const C* v = nullptr;                   // (n_slots, kv_dim)
  const int32_t* block_tables = nullptr;  // all sequences' tables, back to back
  const int32_t* seq_bt_off = nullptr;    // (n_seq) where each sequence's table starts
  const int32_t* row_seq = nullptr;       // (T) sequence of each query row
  const int32_t* row_nkeys = nullptr;     // (T) row t attends to slots [start, row_nkeys[t])
  int32_t block_size = 16;
  int32_t window = 0;  // > 0: start = max(0, row_nkeys - window) (sliding window); 0: start = 0
  const int32_t* row_window = nullptr;  // (T) per-row window, as `window`; nullptr: `window`
  // StreamingLLM sinks (docs/kv_policies.md): a row with a window > 0 also sees slots
  // [0, min(row_sinks[t], start)), scored with its second query q_sink + t * q_sink_stride (the
  // query rotated at min(p, sinks + window - 1)); the window slots keep the first query.
  const int32_t* row_sinks = nullptr;  // (T) sink slots of each row's policy; nullptr: no sinks
  const float* q_sink = nullptr;       // f32 sink queries, laid out as q; needed with row_sinks
  int64_t q_sink_stride = 0;
  // The layer's own window (gemma2's even layers, phi3), 0: none. Where it is narrower than a
  // row's window (or the row has none) it replaces that window, and the row sees no sinks.
  int32_t layer_window = 0;
  // The layer's score arithmetic: scores are (q . k) * scale (0: 1 / sqrt(head_dim)), then
  // softcap * tanh(s / softcap) before the softmax when softcap > 0 (gemma2).
  float scale = 0.0f;
  float softcap = 0.0f;
};

#ifdef __CUDACC__
/// Whether the layer's window replaces row t's own (policy) window.
template <class T>
__device__ __forceinline__ bool layer_window_rules(const PagedKv<T>& kv, int64_t t) {
  const int w = kv.row_window ? kv.row_window[t] : kv.window;
  return kv.layer_window > 0 && (w <= 0 || kv.layer_window < w);
}
/// First slot row t (attending up to slot nk, exclusive) sees: its window's start, or 0.
template <class T>
__device__ __forceinline__ int window_start(const PagedKv<T>& kv, int64_t t, int nk) {
  const int w =
      layer_window_rules(kv, t) ? kv.layer_window : (kv.row_window ? kv.row_window[t] : kv.window);
  return w > 0 ? max(0, nk - w) : 0;
}
/// Sink slots row t sees below its window start `start`: [0, result), scored with q_sink.
template <class T>
__device__ __forceinline__ int sink_count(const PagedKv<T>& kv, int64_t t, int start) {
  return kv.row_sinks && !layer_window_rules(kv, t) ? min(kv.row_sinks[t], start) : 0;
}
/// A score after the layer's soft-cap (none when softcap is 0).
template <class T>
__device__ __forceinline__ float capped(const PagedKv<T>& kv, float s) {
  return kv.softcap > 0.0f ? kv.softcap * tanhf(s / kv.softcap) : s;
}
/// The factor that scales the scores of a layer with heads of head_dim values.
template <class T>
__host__ __device__ inline float score_scale(const PagedKv<T>& kv, int head_dim) {
  return kv.scale > 0.0f ? kv.scale : 1.0f / sqrtf(static_cast<float>(head_dim));
}
#endif

/// Writes the new keys and values: for row t, k_cache[slot[t]] = src[t * row_stride + k_off + :]
/// and v_cache[slot[t]] = src[t * row_stride + v_off + :], kv_dim values each, rounded once to C
/// (float or half).
template <class C>
cudaError_t kv_store(const float* src, int64_t row_stride, int64_t k_off, int64_t v_off, int n_rows,
                     int kv_dim, const int32_t* slot, C* k_cache, C* v_cache, cudaStream_t stream);

}  // namespace sy::cuda
