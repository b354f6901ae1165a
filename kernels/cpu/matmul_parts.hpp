// Pieces the CPU matmuls share (kernels/cpu/fast.cpp, quants.cpp, quants_k.cpp): scratch
// buffers, the split of work over the pool, rows of stacked matrices, and the write-out of the
// tokens-in-lanes panel kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.hpp"

namespace sy::kernels {

/// Grows to the largest size asked for and is then reused, so steady state allocates nothing.
struct Scratch {
  std::vector<uint8_t> bytes;
  /// n bytes starting on a 64-byte boundary (a cache line, a zmm register).
  uint8_t* get(size_t n) {
    if (bytes.size() < n + 64) bytes.resize(n + 64);
    auto p = reinterpret_cast<uintptr_t>(bytes.data());
    return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t{63});
  }
};

/// Runs fn(begin, end) over [0, n) on the pool, or inline without one (or with one item).
template <class F>
void run(ThreadPool* pool, int64_t n, const F& fn) {
  if (n <= 0) return;
  if (pool == nullptr || pool->size() == 1 || n == 1) {
    fn(int64_t{0}, n);
    return;
  }
  pool->parallel_for(n, fn);
}

/// Calls fn(i, r0, r1) for the part of rows [a, b) of n matrices stacked one after the other
/// (ws[0]'s rows first) that falls in matrix i, r0 and r1 local to it.
template <class F>
void stacked_pieces(const WeightView* const* ws, int n, int64_t a, int64_t b, const F& fn) {
  int64_t base = 0;
  for (int i = 0; i < n && base < b; ++i) {
    const int64_t rows = ws[i]->rows;
    const int64_t lo = std::max(a, base), hi = std::min(b, base + rows);
    if (lo < hi) fn(i, lo - base, hi - base);
    base += rows;
  }
}

// ---- the panel kernels' output ----
// A panel kernel computes a tile of rows x (np panels of kPanelTokens tokens) into
// out[(row * np + panel) * kPanelTokens + lane]. The tiles of a chunk of rows are gathered in
// ybuf[token][row of chunk] and written to y as one run per token: y's token stride (rows * 4
// bytes) is often a multiple of 4 KiB, and scattered stores at that stride keep evicting each
// other from L1.

/// Tokens per panel: one per int32 lane of a zmm register.
constexpr int kPanelTokens = 16;

/// Puts a tile's sums (rows rows, np panels) into ybuf, chunk rows wide, from row row0 of the
/// chunk.
inline void gather_tile(const float* out, int rows, int np, int row0, int chunk, float* ybuf) {
  for (int i = 0; i < rows; ++i)
    for (int g = 0; g < np; ++g)
      for (int l = 0; l < kPanelTokens; ++l)
        ybuf[(g * kPanelTokens + l) * chunk + row0 + i] = out[(i * np + g) * kPanelTokens + l];
}

/// Writes the first nrc rows of ybuf's first nt tokens to y + token * ys.
inline void store_chunk(const float* ybuf, int chunk, int64_t nt, int nrc, float* y, int64_t ys) {
  for (int64_t l = 0; l < nt; ++l)
    std::memcpy(y + l * ys, ybuf + l * chunk, sizeof(float) * static_cast<size_t>(nrc));
}

}  // namespace sy::kernels
