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
#include "kernels/cpu/simd.hpp"

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

/// Asks for rows [r, r1) of a matrix (row stride rb) to be brought into L2 while the current
/// tile computes. A tile reads its rows side by side, several streams at once, which the hardware
/// prefetcher follows poorly (see gemv_float_rows); asked for ahead, they arrive in parallel.
/// With f16 weights on the 110M shape this took 8 tokens from 61-78 to 87-103 GFLOP/s and 32
/// tokens from 121-129 to 109-142 (median 122 -> 134), five alternating runs on two cores.
inline void prefetch_rows(const uint8_t* base, size_t rb, int64_t r, int64_t r1) {
#if defined(SY_AVX2) || defined(SY_AVX512)
  if (r >= r1) return;
  const char* p = reinterpret_cast<const char*>(base + r * rb);
  const size_t n = static_cast<size_t>(r1 - r) * rb;
  for (size_t o = 0; o < n; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
#else
  (void)base, (void)rb, (void)r, (void)r1;
#endif
}

/// Software prefetches (into L1) of bytes [0, bytes) from p, spread over the n steps of a
/// kernel's loop: step i asks for its share of the lines. A few lines a step keep the requests
/// within what the core has in flight, where asking for them all at once loses many.
class SpreadPrefetch {
 public:
  SpreadPrefetch() = default;
  SpreadPrefetch(const uint8_t* p, int64_t bytes, int64_t n)
      : p_(reinterpret_cast<const char*>(p)),
        bytes_(bytes),
        step_(n > 0 ? (bytes / 64 + n) / n * 64 : 0) {}
  void at(int64_t i) const {
#if defined(SY_AVX2) || defined(SY_AVX512)
    const int64_t end = std::min(bytes_, (i + 1) * step_);
    for (int64_t o = i * step_; o < end; o += 64) _mm_prefetch(p_ + o, _MM_HINT_T0);
#else
    (void)i;
#endif
  }

 private:
  const char* p_ = nullptr;
  int64_t bytes_ = 0;
  int64_t step_ = 0;
};

// ---- the panel kernels' output ----
// A panel kernel computes a tile of rows x (np panels of kPanelTokens tokens) into
// out[(row * np + panel) * kPanelTokens + lane]. The tiles of a chunk of rows are put in
// ybuf[row of chunk][token of the pass] as they come, and the chunk goes to y (token-major) in
// 16 x 16 blocks transposed in registers: one run of up to 16 rows per token. y's token stride
// (rows * 4 bytes) is often a multiple of 4 KiB, and scattered stores at that stride keep
// evicting each other from L1; one value at a time, the transpose took ~7% of a 32-token matmul.

/// Tokens per panel: one per int32 lane of a zmm register.
constexpr int kPanelTokens = 16;

/// Puts a tile's sums (rows rows, np panels) into ybuf (width floats a row) from row row0.
inline void put_tile(const float* out, int rows, int np, int row0, int width, float* ybuf) {
  for (int i = 0; i < rows; ++i)
    std::memcpy(ybuf + static_cast<size_t>(row0 + i) * width, out + i * np * kPanelTokens,
                sizeof(float) * static_cast<size_t>(np) * kPanelTokens);
}

#if defined(SY_AVX512)
/// Transposes the 16 x 16 floats in v (v[i] row i) in place.
inline void transpose16(__m512* v) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int k = 0; k < 4; ++k) {
    u[4 * k] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
    u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(u[i], u[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(u[i], u[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    v[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    v[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    v[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
  }
}
#endif

/// Writes rows [0, nrc) x tokens [0, nt) of ybuf (width floats a row, rows a multiple of 16 of
/// them readable) to y[token * ys + row].
inline void store_chunk(const float* ybuf, int width, int64_t nt, int nrc, float* y, int64_t ys) {
#if defined(SY_AVX512)
  for (int r0 = 0; r0 < nrc; r0 += 16) {
    const auto m = static_cast<__mmask16>((1u << std::min(16, nrc - r0)) - 1);
    for (int64_t t0 = 0; t0 < nt; t0 += 16) {
      __m512 v[16];
      for (int i = 0; i < 16; ++i) v[i] = _mm512_loadu_ps(ybuf + (r0 + i) * width + t0);
      transpose16(v);
      const int n = static_cast<int>(std::min<int64_t>(16, nt - t0));
      for (int j = 0; j < n; ++j) _mm512_mask_storeu_ps(y + (t0 + j) * ys + r0, m, v[j]);
    }
  }
#else
  for (int64_t t = 0; t < nt; ++t)
    for (int r = 0; r < nrc; ++r) y[t * ys + r] = ybuf[static_cast<size_t>(r) * width + t];
#endif
}

// ---- the panel kernels' row loop ----
// Rows are done in chunks of kPanelChunkTiles tiles; each chunk's outputs are put in ybuf and
// written out transposed, a run of rows per token (see above).

constexpr int kPanelChunkTiles = 8;

/// Scratch bytes panel_rows needs: a chunk of prepared rows (per_row bytes each), one tile's
/// sums and ybuf.
template <int R, int TT>
constexpr size_t panel_rows_scratch(size_t per_row) {
  return per_row * R * kPanelChunkTiles +
         sizeof(float) * static_cast<size_t>(R + R * kPanelChunkTiles) * TT * kPanelTokens;
}

/// Rows [r0, r1) of a matrix (rows_total rows of rb bytes at base) against n_panels panels of
/// panel_bytes, pb panels per pass, into y[token * rows_total + row]. prep(row bytes, scratch)
/// unpacks a row into per_row bytes of scratch and returns its Row; tile(np, rows, panels, out,
/// pf) computes R rows against np (1..TT) panels into out, calling pf.at(i) at each of its
/// loop's tile_steps steps.
template <int R, int TT, class Row, class Prep, class Tile>
void panel_rows(const uint8_t* base, size_t rb, int64_t rows_total, int64_t r0, int64_t r1,
                const uint8_t* panels, size_t panel_bytes, int64_t n_tokens, int64_t pb,
                int64_t tile_steps, size_t per_row, uint8_t* scratch, float* y, const Prep& prep,
                const Tile& tile) {
  constexpr int kChunk = R * kPanelChunkTiles;
  static_assert(kChunk % 16 == 0, "store_chunk transposes blocks of 16 rows");
  constexpr int kWidth = TT * kPanelTokens;
  const int64_t n_panels = (n_tokens + kPanelTokens - 1) / kPanelTokens;
  auto* out = reinterpret_cast<float*>(scratch + per_row * kChunk);
  float* ybuf = out + R * TT * kPanelTokens;  // [row of chunk][token of the pass]
  for (int64_t p0 = 0; p0 < n_panels; p0 += pb) {
    const int64_t p1 = std::min(n_panels, p0 + pb);
    for (int64_t rc = r0; rc < r1; rc += kChunk) {
      const int nrc = static_cast<int>(std::min<int64_t>(kChunk, r1 - rc));
      const int ntiles = (nrc + R - 1) / R;
      if (p0 == 0) prefetch_rows(base, rb, rc + kChunk, std::min(r1, rc + 2 * kChunk));
      Row rows[kChunk];
      // Rows past the end repeat the last real row; their results are not stored.
      const auto prep_tile = [&](int j, uint8_t* to) {
        for (int i = 0; i < R; ++i)
          rows[j * R + i] =
              prep(base + std::min<int64_t>(rc + j * R + i, r1 - 1) * rb, to + per_row * i);
      };
      // One pass over the panels (up to TT * 16 tokens: decode): each tile's rows are unpacked
      // just before it into the same few KiB, which stay in L1, and the next tile's rows are
      // asked for during this one. Unpacked a chunk at a time, the codes outgrow L1 and go out
      // to L2 and back. 110M matrices at 32 tokens, one thread: Q4_0 205-220 -> 235-260
      // GFLOP/s, Q8_0 193-201 -> 211-219. With more passes (prefill) the chunk is unpacked once
      // for all of them.
      const bool one_pass = p1 - p0 <= TT;
      if (!one_pass)
        for (int j = 0; j < ntiles; ++j) prep_tile(j, scratch + per_row * R * j);
      for (int64_t p = p0; p < p1; p += TT) {
        const int np = static_cast<int>(std::min<int64_t>(TT, p1 - p));
        const uint8_t* pp = panels + p * panel_bytes;
        for (int j = 0; j < ntiles; ++j) {
          SpreadPrefetch pf;
          if (one_pass) {
            prep_tile(j, scratch);
            const int64_t next = rc + (j + 1) * R;
            if (next < r1)
              pf = SpreadPrefetch(base + next * rb,
                                  std::min<int64_t>(R, r1 - next) * static_cast<int64_t>(rb),
                                  tile_steps);
          }
          tile(np, rows + j * R, pp, out, pf);
          put_tile(out, R, np, j * R, kWidth, ybuf);
        }
        const int64_t t0 = p * kPanelTokens;
        store_chunk(ybuf, kWidth, std::min<int64_t>(np * kPanelTokens, n_tokens - t0), nrc,
                    y + t0 * rows_total + rc, rows_total);
      }
    }
  }
}

}  // namespace sy::kernels
