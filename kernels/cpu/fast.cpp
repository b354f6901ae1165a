// Fast CPU kernels: threaded, SIMD versions of the ops in kernels.hpp, checked against ref.
// matmul tiles R weight rows x T tokens so each weight load feeds T tokens; quantized weights
// multiply Q8_0-quantized activations with integer dot products (AVX-512 VNNI or AVX2), for one
// token with a kernel built for few vector ops per block (VBMI and GFNI), and from 8 tokens on
// with a tokens-in-lanes VNNI kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/matmul_parts.hpp"
#include "kernels/cpu/quants.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::kernels {

namespace {

thread_local Scratch t_act;  // quantized activations, owned by the thread that calls matmul

inline float scalar_weight(DType t, const uint8_t* row, int64_t k) {
  switch (t) {
    case DType::F32: {
      float v;
      std::memcpy(&v, row + k * 4, 4);
      return v;
    }
    case DType::F16: {
      uint16_t h;
      std::memcpy(&h, row + k * 2, 2);
      return f16_to_f32(h);
    }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, row + k * 2, 2);
      return bf16_to_f32(h);
    }
    default:
      return 0.0f;
  }
}

// ---------------------------------------------------------------------------------------------
// Float weights (f32 / f16 / bf16) x f32 activations.

#if defined(SY_AVX2)
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

#if defined(SY_AVX512)

template <DType TY>
inline __m512 load16(const uint8_t* row, int64_t k) {
  if constexpr (TY == DType::F32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (TY == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k * 2)));
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k * 2));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

/// Reduces R*T accumulators (row-major [r][t]) and stores y[t * ys + r].
template <int R, int T>
inline void store_sums(const __m512 (&acc)[R][T], float* sums) {
  constexpr int n = R * T;
  alignas(64) float lanes[16];
  for (int base = 0; base < n; base += 16) {
    __m512 v[16];
    for (int i = 0; i < 16; ++i)
      v[i] = base + i < n ? acc[(base + i) / T][(base + i) % T] : _mm512_setzero_ps();
    _mm512_store_ps(lanes, hsum16(v));
    for (int j = 0; j < 16; ++j)
      if (base + kHsumSrc[j] < n) sums[base + kHsumSrc[j]] = lanes[j];
  }
}

/// y[t][r] = row r . x[t] for R rows starting at w, T tokens starting at x.
template <DType TY, int R, int T>
void tile_float(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ys) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const int64_t kv = cols & ~int64_t{15};
  for (int64_t k = 0; k < kv; k += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load16<TY>(w + r * rb, k);
    for (int t = 0; t < T; ++t) {
      __m512 xv = _mm512_loadu_ps(x + t * cols + k);
      // Keep xv in a register: folded into each FMA it would be loaded R times, and loads
      // rather than FMAs would bound the loop.
      __asm__("" : "+v"(xv));
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  float sums[R * T];
  store_sums<R, T>(acc, sums);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = sums[r * T + t];
      for (int64_t k = kv; k < cols; ++k) s += scalar_weight(TY, w + r * rb, k) * x[t * cols + k];
      y[t * ys + r] = s;
    }
  }
}

#elif defined(SY_AVX2)

template <DType TY>
inline __m256 load8(const uint8_t* row, int64_t k) {
  if constexpr (TY == DType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (TY == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k * 2)));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k * 2));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType TY, int R, int T>
void tile_float(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ys) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const int64_t kv = cols & ~int64_t{7};
  for (int64_t k = 0; k < kv; k += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load8<TY>(w + r * rb, k);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * cols + k);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = hsum256(acc[r][t]);
      for (int64_t k = kv; k < cols; ++k) s += scalar_weight(TY, w + r * rb, k) * x[t * cols + k];
      y[t * ys + r] = s;
    }
  }
}

#else

template <DType TY, int R, int T>
void tile_float(const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y, int64_t ys) {
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = 0.0f;
      for (int64_t k = 0; k < cols; ++k) s += scalar_weight(TY, w + r * rb, k) * x[t * cols + k];
      y[t * ys + r] = s;
    }
  }
}

#endif

#if defined(SY_AVX512)
/// y[r] = row r . x for rows [r0, r1), one token: each row is read start to end before the next.
/// A single forward stream is what the hardware prefetcher follows best: measured on one core
/// of an AVX-512 machine, reading 4 rows side by side (the tile above) streamed 9-11 GB/s and
/// this order 15-23 GB/s. Each row sums in one accumulator in the order tile_float uses, and 16
/// rows are reduced together by the same tree, so a token's outputs do not depend on whether it
/// is decoded alone or in a batch; the rows' chains are independent, so the CPU overlaps them.
template <DType TY>
void gemv_float_rows(const uint8_t* base, size_t rb, const float* x, int64_t cols, float* y,
                     int64_t r0, int64_t r1) {
  const int64_t kv = cols & ~int64_t{15};
  for (int64_t g = r0; g < r1; g += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, r1 - g));
    __m512 acc[16];
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int i = 0; i < n; ++i) {
      const uint8_t* row = base + (g + i) * rb;
      __m512 a = _mm512_setzero_ps();
      for (int64_t k = 0; k < kv; k += 16)
        a = _mm512_fmadd_ps(load16<TY>(row, k), _mm512_loadu_ps(x + k), a);
      acc[kHsumSrc[i]] = a;  // lane i of the tree's result is row g + i
    }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, hsum16(acc));
    for (int i = 0; i < n; ++i) {
      float s = sums[i];
      const uint8_t* row = base + (g + i) * rb;
      for (int64_t k = kv; k < cols; ++k) s += scalar_weight(TY, row, k) * x[k];
      y[g + i] = s;
    }
  }
}
#endif

// Rows and tokens per micro-tile: 4 x 6 accumulators, 4 weight vectors and one activation vector
// stay in registers (AVX2 has 16 of them, so it takes fewer tokens per tile).
constexpr int kRowsF = 4;
#if defined(SY_AVX512)
constexpr int kTokF = 6;
#else
constexpr int kTokF = 2;
#endif

template <DType TY, int R>
void tile_float_tokens(int nt, const uint8_t* w, size_t rb, const float* x, int64_t cols, float* y,
                       int64_t ys) {
  switch (nt) {
    case 1:
      tile_float<TY, R, 1>(w, rb, x, cols, y, ys);
      return;
#if defined(SY_AVX512)
    case 2:
      tile_float<TY, R, 2>(w, rb, x, cols, y, ys);
      return;
    case 3:
      tile_float<TY, R, 3>(w, rb, x, cols, y, ys);
      return;
    case 4:
      tile_float<TY, R, 4>(w, rb, x, cols, y, ys);
      return;
    case 5:
      tile_float<TY, R, 5>(w, rb, x, cols, y, ys);
      return;
    case 6:
      tile_float<TY, R, 6>(w, rb, x, cols, y, ys);
      return;
#else
    case 2:
      tile_float<TY, R, 2>(w, rb, x, cols, y, ys);
      return;
#endif
    default:
      return;
  }
}

template <DType TY>
void matmul_float_rows(const WeightView& w, const float* x, int64_t n_tokens, float* y, int64_t r0,
                       int64_t r1) {
  const size_t rb = row_bytes(TY, w.cols);
  const auto* base = static_cast<const uint8_t*>(w.data);
#if defined(SY_AVX512)
  if (n_tokens == 1) {
    gemv_float_rows<TY>(base, rb, x, w.cols, y, r0, r1);
    return;
  }
#endif
  // Tokens per block: their activations (cols floats each) stay within ~192 KiB of L2 while the
  // rows of this thread stream past them.
  const int64_t tb =
      std::max<int64_t>(kTokF, (192 * 1024 / 4 / std::max<int64_t>(w.cols, 1)) / kTokF * kTokF);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += tb) {
    const int64_t t1 = std::min(n_tokens, t0 + tb);
    int64_t r = r0;
    for (; r + kRowsF <= r1; r += kRowsF) {
      if (t0 == 0) prefetch_rows(base, rb, r + kRowsF, std::min(r1, r + 2 * kRowsF));
      // The block's tokens in as few tiles as kTokF allows, of sizes that differ by at most
      // one: 32 tokens as 6, 6, 5, 5, 5, 5 rather than five 6s and a 2, whose tile feeds each
      // weight load to two tokens only.
      for (int64_t t = t0, left = (t1 - t0 + kTokF - 1) / kTokF; t < t1; --left) {
        const int nt = static_cast<int>((t1 - t + left - 1) / left);
        tile_float_tokens<TY, kRowsF>(nt, base + r * rb, rb, x + t * w.cols, w.cols,
                                      y + t * w.rows + r, w.rows);
        t += nt;
      }
    }
    for (; r < r1; ++r) {
      for (int64_t t = t0; t < t1; t += kTokF) {
        const int nt = static_cast<int>(std::min<int64_t>(kTokF, t1 - t));
        tile_float_tokens<TY, 1>(nt, base + r * rb, rb, x + t * w.cols, w.cols, y + t * w.rows + r,
                                 w.rows);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Quantized weights (Q8_0 / Q4_0) x Q8_0-quantized activations.
//
// Activations are quantized once per matmul into a layout made for the integer kernel:
//  AVX-512 VNNI: per pair of blocks a record {qs[64], dxv[16] floats, negc[16] int32}:
//    dpbusd multiplies unsigned by signed bytes; the activations stay signed and the weights
//    are made the unsigned side. Q4_0 weight codes (0..15) are unsigned already and negc holds
//    the -8 * sum(q) of the code offset. Q8_0 weights are biased to w + 128 (one xor per weight
//    vector, shared by every token) and negc holds -128 * sum(q), which cancels the bias; the
//    sums are per int32 lane, formed once per token. For Q4_0 the 16-byte halves are ordered
//    [A0-15, B0-15, A16-31, B16-31] to match how two packed nibble blocks unpack. dxv is each
//    int32 lane's activation scale. An odd last block is kept at the end as {qs[32] natural,
//    float d} and done in scalar.
//  Otherwise: per block {qs[32] natural signed, float d} (the AVX2 and scalar paths).

#if defined(SY_VNNI512)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

struct TailBlock {
  int8_t qs[kQK];
  float d;
};

/// Bytes of one token's quantized activations.
size_t act_bytes(DType wt, int64_t cols) {
  const int64_t nb = cols / kQK;
  if (kVnni) {
    (void)wt;
    constexpr size_t rec = 192;
    return static_cast<size_t>(nb / 2) * rec + 64;  // + room for the odd tail block
  }
  return static_cast<size_t>(nb) * sizeof(TailBlock);
}

/// Quantizes one block of 32 floats like quantize_row_q8_0 (rounding ties to even); returns d.
inline float quant_block(const float* x, int8_t* q) {
#if defined(SY_AVX512)
  const __m512 a = _mm512_loadu_ps(x);
  const __m512 b = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid));
  const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(qb));
  // The scale as stored in f16 (round to nearest even, as f32_to_f16), without the calls.
  return _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
  return f16_to_f32(f32_to_f16(d));
#endif
}

void quantize_act(DType wt, const float* x, int64_t cols, uint8_t* dst) {
  const int64_t nb = cols / kQK;
#if defined(SY_VNNI512)
  const bool q4 = wt == DType::Q4_0;
  constexpr size_t rec = 192;
  for (int64_t p = 0; p < nb / 2; ++p) {
    uint8_t* o = dst + p * rec;
    alignas(64) int8_t qa[kQK], qb[kQK];
    const float da = quant_block(x + p * 64, qa);
    const float db = quant_block(x + p * 64 + 32, qb);
    __m512i xv;
    __m512 dxv;
    if (q4) {
      const __m128i a0 = _mm_load_si128(reinterpret_cast<const __m128i*>(qa));
      const __m128i a1 = _mm_load_si128(reinterpret_cast<const __m128i*>(qa + 16));
      const __m128i b0 = _mm_load_si128(reinterpret_cast<const __m128i*>(qb));
      const __m128i b1 = _mm_load_si128(reinterpret_cast<const __m128i*>(qb + 16));
      const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(a0), b0, 1);
      const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(a1), b1, 1);
      xv = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      // lanes 0-3 and 8-11 hold block A, 4-7 and 12-15 block B
      dxv = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(da), _mm512_set1_ps(db));
    } else {
      const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(qa));
      const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(qb));
      xv = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
      dxv = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(da), _mm512_set1_ps(db));
    }
    // -bias * sum(q) per int32 lane: the weights' offset (8 for Q4_0 codes, 128 for the biased
    // Q8_0 weights) times the lane's four activations, taken off by starting dpbusd there.
    const __m512i sb =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(q4 ? 8 : -128), xv);
    _mm512_store_si512(reinterpret_cast<__m512i*>(o + 128),
                       _mm512_sub_epi32(_mm512_setzero_si512(), sb));
    _mm512_store_si512(reinterpret_cast<__m512i*>(o), xv);
    _mm512_store_ps(reinterpret_cast<float*>(o + 64), dxv);
  }
  if (nb % 2) {
    auto* tail = reinterpret_cast<TailBlock*>(dst + (nb / 2) * rec);
    tail->d = quant_block(x + (nb - 1) * kQK, tail->qs);
  }
#else
  (void)wt;
  auto* blocks = reinterpret_cast<TailBlock*>(dst);
  for (int64_t b = 0; b < nb; ++b) blocks[b].d = quant_block(x + b * kQK, blocks[b].qs);
#endif
}

/// One block's integer dot with a weight block of type TY, in scalar code.
template <DType TY>
inline int32_t block_dot_scalar(const uint8_t* wblock, const int8_t* q) {
  int32_t s = 0;
  if constexpr (TY == DType::Q8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(wblock);
    for (int j = 0; j < kQK; ++j) s += b->qs[j] * q[j];
  } else {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(wblock);
    for (int j = 0; j < kQK / 2; ++j) {
      s += ((b->qs[j] & 0x0f) - 8) * q[j];
      s += ((b->qs[j] >> 4) - 8) * q[j + kQK / 2];
    }
  }
  return s;
}

template <DType TY>
inline float block_scale(const uint8_t* wblock) {
  uint16_t h;
  std::memcpy(&h, wblock, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);  // exact, like f16_to_f32, without the call
#else
  return f16_to_f32(h);
#endif
}

template <DType TY>
constexpr size_t block_bytes() {
  return TY == DType::Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
}

#if defined(SY_VNNI512)

template <DType TY>
inline __m512i load_wpair(const uint8_t* b) {
  if constexpr (TY == DType::Q8_0) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    const __m256i c =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + sizeof(BlockQ8_0) + 2));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
  } else {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + sizeof(BlockQ4_0) + 2));
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(a), c, 1);
    const __m256i m = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(v, m);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
}

template <DType TY>
inline __m512 load_dwpair(const uint8_t* b) {
  uint16_t ha, hb;
  std::memcpy(&ha, b, 2);
  std::memcpy(&hb, b + block_bytes<TY>(), 2);
  const __m128i va = _mm_set1_epi16(static_cast<short>(ha));
  const __m128i vb = _mm_set1_epi16(static_cast<short>(hb));
  if constexpr (TY == DType::Q8_0) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(va), vb, 1));
  } else {
    const __m128i ab = _mm_unpacklo_epi64(va, vb);  // 4 x A then 4 x B
    return _mm512_cvtph_ps(_mm256_broadcastsi128_si256(ab));
  }
}

template <DType TY, int R, int T>
void tile_quant(const uint8_t* w, size_t rb, const uint8_t* xq, size_t xs, int64_t nb, float* y,
                int64_t ys) {
  constexpr size_t rec = 192;
  constexpr size_t bb = block_bytes<TY>();
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const int64_t np = nb / 2;
  for (int64_t p = 0; p < np; ++p) {
    __m512i wv[R];
    __m512 dw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = w + r * rb + p * 2 * bb;
      if constexpr (T == 1)
        _mm_prefetch(reinterpret_cast<const char*>(b + R * rb), _MM_HINT_T0);  // as tile_float
      wv[r] = load_wpair<TY>(b);
      dw[r] = load_dwpair<TY>(b);
      if constexpr (TY == DType::Q8_0) wv[r] = _mm512_xor_si512(wv[r], _mm512_set1_epi8(-128));
    }
    for (int t = 0; t < T; ++t) {
      const uint8_t* o = xq + t * xs + p * rec;
      const __m512i xv = _mm512_load_si512(reinterpret_cast<const __m512i*>(o));
      const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(o + 64));
      const __m512i nx = _mm512_load_si512(reinterpret_cast<const __m512i*>(o + 128));
      for (int r = 0; r < R; ++r) {
        const __m512i s = _mm512_dpbusd_epi32(nx, wv[r], xv);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], dx), acc[r][t]);
      }
    }
  }
  float sums[R * T];
  store_sums<R, T>(acc, sums);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = sums[r * T + t];
      if (nb % 2) {
        const auto* tail = reinterpret_cast<const TailBlock*>(xq + t * xs + np * rec);
        const uint8_t* b = w + r * rb + (nb - 1) * bb;
        s += static_cast<float>(block_dot_scalar<TY>(b, tail->qs)) * (block_scale<TY>(b) * tail->d);
      }
      y[t * ys + r] = s;
    }
  }
}

// 4 x 4 accumulators plus per-row weights, scales and offsets fill the 32 zmm registers.
constexpr int kRowsQ = 4;
constexpr int kTokQ = 4;

#if defined(SY_VBMI512)
// One token x Q4_0 / Q8_0 rows (batch-1 decode). The loop is bound by the vector ports, not by
// memory, so it is built to spend few ops per row and pair of blocks:
//  - Q4_0: ONE 64-byte load holds both blocks; vpermb places A.qs, B.qs, A.qs, B.qs in the four
//    16-byte quarters, and one gf2p8affineqb with a per-qword bit matrix keeps the low nibbles
//    in the lower half and moves the high nibbles down in the upper half (the activation
//    record's element order). Q8_0: the two qs runs, biased to unsigned with one xor.
//  - The scales of four rows are gathered into one vector (two word permutes of each pair's
//    first 64 bytes and an unpack), converted and multiplied by the activation scales once, and
//    each row's lanes then take theirs with one vpermps.
// About 8 vector ops per row and pair where tile_quant spends 11 (Q8_0) to 17 (Q4_0).

template <DType TY>
constexpr int kPairBytes = 2 * static_cast<int>(block_bytes<TY>());

/// The first 64 bytes of a pair of blocks (Q4_0: all 36 of it). A full load could read past the
/// matrix's last row, which may be past the mapping, so the last pair of a row is loaded masked
/// (masked-off bytes are never touched).
template <DType TY, bool kMasked>
inline __m512i load_pair_head(const uint8_t* b) {
  if constexpr (kMasked && TY == DType::Q4_0) {
    constexpr int n = kPairBytes<TY>;
    return _mm512_maskz_loadu_epi8((__mmask64{1} << n) - 1, b);
  } else {
    return _mm512_loadu_si512(b);  // Q8_0: 68-byte pairs, the 64 bytes are inside the pair
  }
}

struct OneTokTables {
  uint8_t q[64];         // vpermb (Q4_0): quarters A.qs, B.qs, A.qs, B.qs of a pair
  uint64_t nib[8];       // gf2p8affine matrices: low nibble (qwords 0-3), high nibble (4-7)
  uint16_t w2[32];       // vpermt2w: A.d, B.d of the first source, then of the second
  uint32_t dx[8];        // vpermps: the record's dx lanes in compact (A, B, A, B, ...) order
  uint32_t lane[4][16];  // vpermps: row r's lanes take compact scale 2r (block A) or 2r + 1
  uint16_t d1[16];       // vpermw: one row's A.d / B.d in the record's lane order (low 16)
};

/// The record's lanes hold block A or B: Q4_0 in runs of 4 lanes (A, B, A, B), Q8_0 in halves.
template <DType TY>
constexpr int lane_block(int l) {
  return TY == DType::Q4_0 ? (l / 4) % 2 : l / 8;
}

template <DType TY>
constexpr OneTokTables make_one_tok_tables() {
  OneTokTables t{};
  for (int i = 0; i < 64; ++i) t.q[i] = static_cast<uint8_t>((i % 32 < 16 ? 2 : 20) + i % 16);
  // Result bit i of gf2p8affineqb is the parity of (matrix byte 7 - i) & x: bytes 7..4 select
  // x's bits 0..3 (low nibble) or 4..7 (high nibble) into result bits 0..3; bits 4..7 stay 0.
  for (int i = 0; i < 8; ++i) t.nib[i] = i < 4 ? 0x0102040800000000ull : 0x1020408000000000ull;
  const uint16_t bd = static_cast<uint16_t>(block_bytes<TY>() / 2);  // word of B.d
  t.w2[0] = 0;
  t.w2[1] = bd;
  t.w2[2] = 32;  // + 32 selects the second source
  t.w2[3] = static_cast<uint16_t>(32 + bd);
  for (int i = 0; i < 8; ++i) t.dx[i] = i % 2 == 0 ? 0 : (TY == DType::Q4_0 ? 4 : 8);
  for (int r = 0; r < 4; ++r)
    for (int l = 0; l < 16; ++l) t.lane[r][l] = static_cast<uint32_t>(2 * r + lane_block<TY>(l));
  for (int l = 0; l < 16; ++l) t.d1[l] = lane_block<TY>(l) == 0 ? 0 : bd;
  return t;
}
template <DType TY>
alignas(64) constexpr OneTokTables kOneTok = make_one_tok_tables<TY>();

// Rows one after the other (R = 1, matmul_quant_rows) are one forward stream, but the hardware
// prefetcher restarts at each 4 KiB page and the unpacking leaves it behind: asking for the line
// 3 KiB ahead at every pair (one or two lines) keeps the stream in flight across pages. 110M
// batch-1 decode, 2 threads, five alternating runs (tokens/s, median): Q4_0 368 -> 421 (1.5 KiB
// ahead 404, 8 KiB worse than none), Q8_0 260 -> 274. The f16 rows (gemv_float_rows) lost 20%
// with the same prefetch: their stream is memory-bound and the hardware keeps up with it.
constexpr size_t kOneAhead = 3072;

/// R rows (4, or 1 for a remainder row) x one token.
template <DType TY, int R>
void tile_one(const uint8_t* w, size_t rb, const uint8_t* xq, int64_t nb, float* y) {
  static_assert(R == 4 || R == 1);
  constexpr size_t rec = 192;
  constexpr int pb = kPairBytes<TY>;
  const OneTokTables& tb = kOneTok<TY>;
  __m512 acc[R][1];
  for (int r = 0; r < R; ++r) acc[r][0] = _mm512_setzero_ps();
  const int64_t np = nb / 2;
  const auto pair = [&](int64_t p, auto masked) {
    const uint8_t* o = xq + p * rec;
    const __m512i xv = _mm512_load_si512(reinterpret_cast<const __m512i*>(o));
    const __m512 dx = _mm512_load_ps(reinterpret_cast<const float*>(o + 64));
    const __m512i nx = _mm512_load_si512(reinterpret_cast<const __m512i*>(o + 128));
    __m512i head[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = w + r * rb + p * pb;
      if constexpr (R > 1) {
        _mm_prefetch(reinterpret_cast<const char*>(b + R * rb), _MM_HINT_T0);  // as tile_quant
        if constexpr (TY == DType::Q8_0)
          _mm_prefetch(reinterpret_cast<const char*>(b + R * rb + 64), _MM_HINT_T0);
      }
      if constexpr (R == 1) _mm_prefetch(reinterpret_cast<const char*>(b + kOneAhead), _MM_HINT_T0);
      head[r] = load_pair_head<TY, decltype(masked)::value>(b);
    }
    __m512 scale[R];
    if constexpr (R == 4) {
      const __m512i w2 = _mm512_load_si512(tb.w2);
      const __m512i t01 = _mm512_permutex2var_epi16(head[0], w2, head[1]);
      const __m512i t23 = _mm512_permutex2var_epi16(head[2], w2, head[3]);
      const __m128i d8 =
          _mm_unpacklo_epi64(_mm512_castsi512_si128(t01), _mm512_castsi512_si128(t23));
      // Full width: Q8_0's block B starts at lane 8.
      const __m256 dxc = _mm512_castps512_ps256(_mm512_permutexvar_ps(
          _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(tb.dx))), dx));
      const __m512 m = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_cvtph_ps(d8), dxc));
      for (int r = 0; r < 4; ++r)
        scale[r] = _mm512_permutexvar_ps(_mm512_load_si512(tb.lane[r]), m);
    } else {
      // Q8_0's B.d is word 17, past the lower 256 bits: a full-width word permute.
      const __m512i d1 =
          _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(tb.d1)));
      scale[0] = _mm512_mul_ps(
          _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(d1, head[0]))), dx);
    }
    for (int r = 0; r < R; ++r) {
      __m512i wv;
      if constexpr (TY == DType::Q4_0) {
        wv =
            _mm512_gf2p8affine_epi64_epi8(_mm512_permutexvar_epi8(_mm512_load_si512(tb.q), head[r]),
                                          _mm512_load_si512(tb.nib), 0);
      } else {
        wv = _mm512_xor_si512(load_wpair<TY>(w + r * rb + p * pb), _mm512_set1_epi8(-128));
      }
      const __m512i s = _mm512_dpbusd_epi32(nx, wv, xv);
      acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale[r], acc[r][0]);
    }
  };
  for (int64_t p = 0; p + 1 < np; ++p) pair(p, std::false_type{});
  if (np > 0) pair(np - 1, std::true_type{});
  float sums[R];
  store_sums<R, 1>(acc, sums);
  for (int r = 0; r < R; ++r) {
    float s = sums[r];
    if (nb % 2) {
      const auto* tail = reinterpret_cast<const TailBlock*>(xq + np * rec);
      const uint8_t* b = w + r * rb + (nb - 1) * block_bytes<TY>();
      s += static_cast<float>(block_dot_scalar<TY>(b, tail->qs)) * (block_scale<TY>(b) * tail->d);
    }
    y[r] = s;  // token 0 of y
  }
}
#endif

#elif defined(SY_AVX2)

/// 8 int32 partial sums of 32 signed-byte products (the sign trick keeps maddubs unsaturated).
inline __m256i dot_s8(__m256i a, __m256i b) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

template <DType TY>
inline __m256i load_wblock(const uint8_t* b) {
  if constexpr (TY == DType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
  } else {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(v, m)),
                                              _mm_and_si128(_mm_srli_epi16(v, 4), m), 1);
    return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
  }
}

template <DType TY, int R, int T>
void tile_quant(const uint8_t* w, size_t rb, const uint8_t* xq, size_t xs, int64_t nb, float* y,
                int64_t ys) {
  constexpr size_t bb = block_bytes<TY>();
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wv[R];
    float dw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + r * rb + b * bb;
      wv[r] = load_wblock<TY>(blk);
      dw[r] = block_scale<TY>(blk);
    }
    for (int t = 0; t < T; ++t) {
      const auto* xb = reinterpret_cast<const TailBlock*>(xq + t * xs) + b;
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
      for (int r = 0; r < R; ++r) {
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8(wv[r], xv)),
                                    _mm256_set1_ps(dw[r] * xb->d), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ys + r] = hsum256(acc[r][t]);
}

constexpr int kRowsQ = 2;
constexpr int kTokQ = 2;

#else

template <DType TY, int R, int T>
void tile_quant(const uint8_t* w, size_t rb, const uint8_t* xq, size_t xs, int64_t nb, float* y,
                int64_t ys) {
  constexpr size_t bb = block_bytes<TY>();
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      const auto* xb = reinterpret_cast<const TailBlock*>(xq + t * xs);
      float s = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w + r * rb + b * bb;
        s += static_cast<float>(block_dot_scalar<TY>(blk, xb[b].qs)) *
             (block_scale<TY>(blk) * xb[b].d);
      }
      y[t * ys + r] = s;
    }
  }
}

constexpr int kRowsQ = 1;
constexpr int kTokQ = 1;

#endif

template <DType TY, int R>
void tile_quant_tokens(int nt, const uint8_t* w, size_t rb, const uint8_t* xq, size_t xs,
                       int64_t nb, float* y, int64_t ys) {
  switch (nt) {
    case 1:
#if defined(SY_VBMI512)
      if constexpr (R == 4 || R == 1) {
        tile_one<TY, R>(w, rb, xq, nb, y);
        return;
      }
#endif
      tile_quant<TY, R, 1>(w, rb, xq, xs, nb, y, ys);
      return;
#if defined(SY_VNNI512)
    case 2:
      tile_quant<TY, R, 2>(w, rb, xq, xs, nb, y, ys);
      return;
    case 3:
      tile_quant<TY, R, 3>(w, rb, xq, xs, nb, y, ys);
      return;
    case 4:
      tile_quant<TY, R, 4>(w, rb, xq, xs, nb, y, ys);
      return;
#elif defined(SY_AVX2)
    case 2:
      tile_quant<TY, R, 2>(w, rb, xq, xs, nb, y, ys);
      return;
#endif
    default:
      return;
  }
}

template <DType TY>
void matmul_quant_rows(const WeightView& w, const uint8_t* xq, size_t xs, int64_t n_tokens,
                       float* y, int64_t r0, int64_t r1) {
  const size_t rb = row_bytes(TY, w.cols);
  const int64_t nb = w.cols / kQK;
  const auto* base = static_cast<const uint8_t*>(w.data);
#if defined(SY_VBMI512)
  if (n_tokens == 1) {
    // One token: row after row, one forward stream (see gemv_float_rows); on one core this
    // read Q8_0 at 15-16 GB/s where four rows side by side with prefetches read 9-10.
    for (int64_t r = r0; r < r1; ++r) tile_one<TY, 1>(base + r * rb, rb, xq, nb, y + r);
    return;
  }
#endif
  // Tokens per block: their quantized activations stay within ~192 KiB of L2.
  const int64_t tb =
      std::max<int64_t>(kTokQ, static_cast<int64_t>(192 * 1024 / xs) / kTokQ * kTokQ);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += tb) {
    const int64_t t1 = std::min(n_tokens, t0 + tb);
    int64_t r = r0;
    for (; r + kRowsQ <= r1; r += kRowsQ) {
      if (t0 == 0) prefetch_rows(base, rb, r + kRowsQ, std::min(r1, r + 2 * kRowsQ));
      for (int64_t t = t0; t < t1; t += kTokQ) {
        const int nt = static_cast<int>(std::min<int64_t>(kTokQ, t1 - t));
        tile_quant_tokens<TY, kRowsQ>(nt, base + r * rb, rb, xq + t * xs, xs, nb,
                                      y + t * w.rows + r, w.rows);
      }
    }
    for (; r < r1; ++r) {
      for (int64_t t = t0; t < t1; t += kTokQ) {
        const int nt = static_cast<int>(std::min<int64_t>(kTokQ, t1 - t));
        tile_quant_tokens<TY, 1>(nt, base + r * rb, rb, xq + t * xs, xs, nb, y + t * w.rows + r,
                                 w.rows);
      }
    }
  }
}

#if defined(SY_VNNI512)
// ---------------------------------------------------------------------------------------------
// Many tokens x quantized weights: tokens in lanes. The dot-product kernel above spends 4 vector
// ops per 64 multiply-adds (the dpbusd, then int->float, scale, accumulate per 8-lane block
// piece). Here each int32 lane is one token and accumulates a whole block (8 dpbusd with one
// broadcast weight dword each), so the float work is 3 ops per 16 tokens x 32 elements.
//
// Panel layout, per group of 16 tokens and per block b (640 bytes):
//   8 x 64 bytes: for k4 = 0..7, token lane i holds elements 4*k4..4*k4+3 of token i
//   16 floats: each token's activation scale for the block (0 for padding lanes)
//   16 int32: Q4_0 only, -8 * the sum of the token's block (the codes' offset of 8).
// dpbusd multiplies unsigned by signed bytes. Q4_0 codes (0..15) are the unsigned side and the
// activations stay signed. Q8_0 weights are signed, so the activations are stored biased
// (+128, unsigned) and each block starts from -128 * sum(w) to cancel the bias.

constexpr size_t kPanelBlock = 8 * 64 + 64 + 64;

/// Packs tokens [t0, t0 + 16) (fewer at the end) of quantized activations into one panel.
template <DType TY>
void pack_panel(const float* x, int64_t cols, int64_t t0, int64_t n_tokens, uint8_t* panel) {
  const int64_t nb = cols / kQK;
  alignas(64) int8_t q[kQK];
  for (int i = 0; i < kPanelTokens; ++i) {
    const int64_t t = t0 + i;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = panel + b * kPanelBlock;
      float d = 0.0f;
      if (t < n_tokens) {
        d = quant_block(x + t * cols + b * kQK, q);
      } else {
        std::memset(q, 0, sizeof q);
      }
      int32_t sum = 0;
      __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(q));
      if constexpr (TY == DType::Q8_0) {
        v = _mm256_xor_si256(v, _mm256_set1_epi8(-128));  // signed -> biased unsigned
      } else {
        // Sum of the 32 signed bytes: sad of the biased bytes against 0, less 32 * 128.
        const __m256i sad =
            _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8(-128)), _mm256_setzero_si256());
        const __m128i s2 =
            _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
        sum = static_cast<int32_t>(
            _mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 32 * 128);
      }
      // Dword k4 of the block goes to lane i of row k4 (64 bytes apart).
      _mm256_i32scatter_epi32(blk + i * 4, _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112), v, 4);
      reinterpret_cast<float*>(blk + 8 * 64)[i] = d;
      reinterpret_cast<int32_t*>(blk + 9 * 64)[i] = -8 * sum;
    }
  }
}

/// Per-row data for one tile of rows: the weight bytes of block b at q + b * stride (signed for
/// Q8_0, codes 0..15 for Q4_0), the f32 block scales, and for Q8_0 the bias correction.
struct RowPrep {
  const int8_t* q;
  size_t stride;
  const int32_t* corr;
  const float* d;
};

#if defined(SY_VBMI512)
/// prep_row's Q4_0 unpack of a pair of blocks: vpermb places A.qs, A.qs, B.qs, B.qs in the four
/// 16-byte quarters; the gf2p8affine matrices keep the low nibble (quarters 0 and 2) or move the
/// high nibble down (1 and 3), as make_one_tok_tables explains.
struct PrepQ4Tables {
  uint8_t q[64];
  uint64_t nib[8];
};
constexpr PrepQ4Tables make_prep_q4_tables() {
  PrepQ4Tables t{};
  for (int i = 0; i < 64; ++i) t.q[i] = static_cast<uint8_t>((i < 32 ? 2 : 20) + i % 16);
  for (int i = 0; i < 8; ++i)
    t.nib[i] = (i / 2) % 2 == 0 ? 0x0102040800000000ull : 0x1020408000000000ull;
  return t;
}
alignas(64) constexpr PrepQ4Tables kPrepQ4 = make_prep_q4_tables();
#endif

template <DType TY>
RowPrep prep_row(const uint8_t* row, int64_t nb, uint8_t* scratch) {
  constexpr size_t bb = block_bytes<TY>();
  auto* d = reinterpret_cast<float*>(scratch);
  auto* corr = reinterpret_cast<int32_t*>(scratch + nb * 4);
  auto* q = reinterpret_cast<int8_t*>(scratch + nb * 8);
  int64_t b = 0;
#if defined(SY_VBMI512)
  if constexpr (TY == DType::Q4_0) {
    // Two blocks per step, as tile_one unpacks them: one (masked) load of the pair's 36 bytes,
    // a byte permute to A.qs, A.qs, B.qs, B.qs, and one GF(2) affine transform that keeps the
    // low nibbles in the first copy of each and the high nibbles in the second: the 64 codes in
    // element order. 4 vector ops per pair where the loop below spends about 14.
    const __m512i perm = _mm512_load_si512(kPrepQ4.q);
    const __m512i nib = _mm512_load_si512(kPrepQ4.nib);
    for (; b + 2 <= nb; b += 2) {
      const uint8_t* blk = row + b * bb;
      d[b] = block_scale<TY>(blk);
      d[b + 1] = block_scale<TY>(blk + bb);
      const __m512i h = _mm512_maskz_loadu_epi8((__mmask64{1} << (2 * bb)) - 1, blk);
      _mm512_storeu_si512(q + b * kQK,
                          _mm512_gf2p8affine_epi64_epi8(_mm512_permutexvar_epi8(perm, h), nib, 0));
    }
  }
#endif
  for (; b < nb; ++b) {
    const uint8_t* blk = row + b * bb;
    d[b] = block_scale<TY>(blk);
    if constexpr (TY == DType::Q8_0) {
      // Sum of the 32 signed bytes: bias to unsigned, sad against 0 gives 4 partial sums,
      // then take off the 32 * 128 of bias.
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      const __m256i sad =
          _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8(-128)), _mm256_setzero_si256());
      const __m128i s2 =
          _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
      const int64_t sum =
          _mm_cvtsi128_si64(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 32 * 128;
      corr[b] = static_cast<int32_t>(-128 * sum);
    } else {
      const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      const __m128i m = _mm_set1_epi8(0x0f);
      const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(p, m)),
                                                _mm_and_si128(_mm_srli_epi16(p, 4), m), 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQK), v);
    }
  }
  if constexpr (TY == DType::Q8_0) {
    return RowPrep{reinterpret_cast<const int8_t*>(row + 2), bb, corr, d};
  } else {
    return RowPrep{q, kQK, corr, d};
  }
}

/// R rows x TT panels of 16 tokens.
template <DType TY, int R, int TT>
void tile_panel(const RowPrep* rows, const uint8_t* panels, size_t panel_bytes, int64_t nb,
                float* out, const SpreadPrefetch& pf) {
  __m512 acc[R][TT];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < TT; ++g) acc[r][g] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.at(b);
    __m512i ai[R][TT];
    for (int r = 0; r < R; ++r) {
      for (int g = 0; g < TT; ++g) {
        if constexpr (TY == DType::Q8_0) {
          ai[r][g] = _mm512_set1_epi32(rows[r].corr[b]);
        } else {
          ai[r][g] = _mm512_load_si512(reinterpret_cast<const __m512i*>(panels + g * panel_bytes +
                                                                        b * kPanelBlock + 9 * 64));
        }
      }
    }
    for (int k4 = 0; k4 < 8; ++k4) {
      __m512i xv[TT];
      for (int g = 0; g < TT; ++g)
        xv[g] = _mm512_load_si512(
            reinterpret_cast<const __m512i*>(panels + g * panel_bytes + b * kPanelBlock + k4 * 64));
      for (int r = 0; r < R; ++r) {
        int32_t wd;
        std::memcpy(&wd, rows[r].q + b * rows[r].stride + 4 * k4, 4);
        const __m512i wb = _mm512_set1_epi32(wd);
        for (int g = 0; g < TT; ++g) {
          if constexpr (TY == DType::Q8_0) {
            ai[r][g] = _mm512_dpbusd_epi32(ai[r][g], xv[g], wb);
          } else {
            ai[r][g] = _mm512_dpbusd_epi32(ai[r][g], wb, xv[g]);
          }
        }
      }
    }
    for (int g = 0; g < TT; ++g) {
      const __m512 dx = _mm512_load_ps(
          reinterpret_cast<const float*>(panels + g * panel_bytes + b * kPanelBlock + 8 * 64));
      for (int r = 0; r < R; ++r)
        acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[r][g]),
                                    _mm512_mul_ps(dx, _mm512_set1_ps(rows[r].d[b])), acc[r][g]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < TT; ++g) _mm512_storeu_ps(out + (r * TT + g) * kPanelTokens, acc[r][g]);
}

/// tile_panel for np (1..N) panels.
template <DType TY, int R, int N>
void tile_panels(int np, const RowPrep* rows, const uint8_t* panels, size_t panel_bytes, int64_t nb,
                 float* out, const SpreadPrefetch& pf) {
  if constexpr (N > 1) {
    if (np < N) return tile_panels<TY, R, N - 1>(np, rows, panels, panel_bytes, nb, out, pf);
  }
  tile_panel<TY, R, N>(rows, panels, panel_bytes, nb, out, pf);
}

constexpr int kRowsP = 6;
constexpr int kPanelsP = 2;

template <DType TY>
void matmul_panel_rows(const WeightView& w, const uint8_t* panels, size_t panel_bytes,
                       int64_t n_tokens, float* y, int64_t r0, int64_t r1) {
  const int64_t nb = w.cols / kQK;
  const size_t per_row = static_cast<size_t>(nb) * (kQK + 8);
  thread_local Scratch t_prep;
  uint8_t* scratch = t_prep.get(panel_rows_scratch<kRowsP, kPanelsP>(per_row));
  // Panels per pass: their bytes stay within ~256 KiB of L2 while the rows stream by.
  const int64_t pb = std::max<int64_t>(
      kPanelsP, static_cast<int64_t>(256 * 1024 / panel_bytes) / kPanelsP * kPanelsP);
  panel_rows<kRowsP, kPanelsP, RowPrep>(
      static_cast<const uint8_t*>(w.data), row_bytes(TY, w.cols), w.rows, r0, r1, panels,
      panel_bytes, n_tokens, pb, nb, per_row, scratch, y,
      [&](const uint8_t* row, uint8_t* to) { return prep_row<TY>(row, nb, to); },
      [&](int np, const RowPrep* rows, const uint8_t* pp, float* out, const SpreadPrefetch& pf) {
        tile_panels<TY, kRowsP, kPanelsP>(np, rows, pp, panel_bytes, nb, out, pf);
      });
}

/// Token count from which the panel kernel takes over. A half-full panel (8 tokens, half the
/// lanes idle) still beats the 4 x 4 tiles: 110M decode at batch 8, two alternating runs, Q8_0
/// 356-381 -> 417-427 tokens/s and Q4_0 422-461 -> 477-550, at batch 12 Q8_0 403-485 -> 651-710
/// and Q4_0 287-491 -> 688-779; at 4 and 6 tokens the tiles stay ahead.
constexpr int64_t kPanelMinTokens = 8;
#endif

/// Splits rows over the pool in contiguous chunks that are whole multiples of `align` rows.
template <class F>
void for_rows(ThreadPool* pool, int64_t rows, int64_t align, const F& fn) {
  const int64_t groups = (rows + align - 1) / align;
  run(pool, groups, [&](int64_t g0, int64_t g1) { fn(g0 * align, std::min(rows, g1 * align)); });
}

// ---------------------------------------------------------------------------------------------
// exp for the element-wise ops.

#if defined(SY_AVX512)
/// e^x for 16 lanes, about 1 ulp: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, scaled by 2^n.
inline __m512 exp512(__m512 x) {
  // Below -104 the result is 0 in f32, above 89 it is inf; clamping keeps n finite (NaN passes).
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln2 split in a part exact in few bits and a remainder, so n * ln2_hi is exact.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
#endif

}  // namespace

// ---------------------------------------------------------------------------------------------

namespace {

/// Splits the rows of n matrices stacked one after the other (`total` rows in all) over the
/// pool as for_rows does, and runs fn(i, r0, r1) for each piece, r0 and r1 local to matrix i.
template <class F>
void for_stacked_rows(ThreadPool* pool, const WeightView* const* ws, int n, int64_t total,
                      int64_t align, const F& fn) {
  for_rows(pool, total, align, [&](int64_t g0, int64_t g1) { stacked_pieces(ws, n, g0, g1, fn); });
}

/// The weight types with a kernel in this file (the others go through quants.hpp or ref).
bool fast_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0 ||
         t == DType::Q4_0;
}

/// One matrix of a type without a kernel in this file.
void matmul_other(const WeightView& w, const float* x, int64_t n_tokens, float* y,
                  ThreadPool* pool) {
  if (const quant::TypeOps* o = quant::ops(w.type)) {
    quant::matmul(*o, w, x, n_tokens, y, pool);
    return;
  }
  ref::matmul(w, x, n_tokens, y);  // throws, naming the type
}

}  // namespace

void matmul_many(const WeightView* const* ws, float* const* ys, int n, const float* x,
                 int64_t n_tokens, ThreadPool* pool) {
  if (n <= 0 || n_tokens <= 0) return;
  const WeightView& w0 = *ws[0];
  bool shared = true;  // one activation preparation and one split of rows serve them all
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    shared = shared && ws[i]->type == w0.type && ws[i]->cols == w0.cols;
    total += ws[i]->rows;
  }
  if (shared && !fast_type(w0.type)) {
    if (const quant::TypeOps* o = quant::ops(w0.type)) {
      quant::matmul_many(*o, ws, ys, n, x, n_tokens, pool);  // one quantization, one hand-off
      return;
    }
  }
  if (!shared || !fast_type(w0.type)) {
    for (int i = 0; i < n; ++i) {
      if (ws[i]->rows <= 0) continue;
      if (fast_type(ws[i]->type)) {
        matmul_many(ws + i, ys + i, 1, x, n_tokens, pool);  // alone, so shared
      } else {
        matmul_other(*ws[i], x, n_tokens, ys[i], pool);
      }
    }
    return;
  }
  if (total <= 0) return;
  switch (w0.type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: {
      auto piece = [&](int i, int64_t r0, int64_t r1) {
        switch (w0.type) {
          case DType::F32:
            matmul_float_rows<DType::F32>(*ws[i], x, n_tokens, ys[i], r0, r1);
            break;
          case DType::F16:
            matmul_float_rows<DType::F16>(*ws[i], x, n_tokens, ys[i], r0, r1);
            break;
          default:
            matmul_float_rows<DType::BF16>(*ws[i], x, n_tokens, ys[i], r0, r1);
            break;
        }
      };
      for_stacked_rows(pool, ws, n, total, kRowsF, piece);
      return;
    }
    default: {  // Q8_0, Q4_0
      for (int i = 0; i < n; ++i)
        (void)row_bytes(ws[i]->type, ws[i]->cols);  // rejects a column count of partial blocks
#if defined(SY_VNNI512)
      if (n_tokens >= kPanelMinTokens) {
        const int64_t nb = w0.cols / kQK;
        const size_t panel_bytes = static_cast<size_t>(nb) * kPanelBlock;
        const int64_t n_panels = (n_tokens + kPanelTokens - 1) / kPanelTokens;
        uint8_t* panels = t_act.get(panel_bytes * static_cast<size_t>(n_panels));
        run(pool, n_panels, [&](int64_t g0, int64_t g1) {
          for (int64_t g = g0; g < g1; ++g) {
            if (w0.type == DType::Q8_0) {
              pack_panel<DType::Q8_0>(x, w0.cols, g * kPanelTokens, n_tokens,
                                      panels + g * panel_bytes);
            } else {
              pack_panel<DType::Q4_0>(x, w0.cols, g * kPanelTokens, n_tokens,
                                      panels + g * panel_bytes);
            }
          }
        });
        auto piece = [&](int i, int64_t r0, int64_t r1) {
          if (w0.type == DType::Q8_0) {
            matmul_panel_rows<DType::Q8_0>(*ws[i], panels, panel_bytes, n_tokens, ys[i], r0, r1);
          } else {
            matmul_panel_rows<DType::Q4_0>(*ws[i], panels, panel_bytes, n_tokens, ys[i], r0, r1);
          }
        };
        for_stacked_rows(pool, ws, n, total, kRowsP, piece);
        return;
      }
#endif
      // Records are 64-byte aligned: round the per-token stride up to a cache line.
      const size_t xs = (act_bytes(w0.type, w0.cols) + 63) & ~size_t{63};
      uint8_t* xq = t_act.get(xs * static_cast<size_t>(n_tokens));
      // Quantizing one token costs about as much as a pool hand-off; share only bigger batches.
      auto quant = [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          quantize_act(w0.type, x + t * w0.cols, w0.cols, xq + t * xs);
      };
      if (n_tokens >= 8) {
        run(pool, n_tokens, quant);
      } else {
        quant(0, n_tokens);
      }
      auto piece = [&](int i, int64_t r0, int64_t r1) {
        if (w0.type == DType::Q8_0) {
          matmul_quant_rows<DType::Q8_0>(*ws[i], xq, xs, n_tokens, ys[i], r0, r1);
        } else {
          matmul_quant_rows<DType::Q4_0>(*ws[i], xq, xs, n_tokens, ys[i], r0, r1);
        }
      };
      for_stacked_rows(pool, ws, n, total, kRowsQ, piece);
      return;
    }
  }
}

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool) {
  if (n_tokens <= 0 || w.rows <= 0) return;
  const WeightView* ws[1] = {&w};
  float* ys[1] = {y};
  matmul_many(ws, ys, 1, x, n_tokens, pool);
}

float dot(const float* a, const float* b, int64_t n) {
#if defined(SY_AVX512)
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m =
        n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#else
  float s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float t = 0.0f;
  for (; i < n; ++i) t += a[i] * b[i];
  for (float v : s) t += v;
  return t;
#endif
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];  // vectorized by the compiler
}

void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  // Sum of squares in double, as llama.cpp does, so long rows lose no precision.
  double ss = 0.0;
#if defined(SY_AVX512)
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
  for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
#else
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
#endif
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void rope(float* x, int n_heads, int head_dim, int rope_dim, int pos, float theta_base) {
  // The same angles as ref (running product), computed once and applied to every head.
  constexpr int kMaxPairs = 512;  // head dims up to 1024 use the stack table
  float cs[kMaxPairs], sn[kMaxPairs];
  const int pairs = rope_dim / 2;
  if (pairs > kMaxPairs) {
    ref::rope(x, n_heads, head_dim, rope_dim, pos, theta_base);
    return;
  }
  const float theta_scale = std::pow(theta_base, -2.0f / static_cast<float>(rope_dim));
  float theta = static_cast<float>(pos);
  for (int i = 0; i < pairs; ++i) {
    cs[i] = std::cos(theta);
    sn[i] = std::sin(theta);
    theta *= theta_scale;
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < pairs; ++i) {
      const float x0 = v[2 * i];
      const float x1 = v[2 * i + 1];
      v[2 * i] = x0 * cs[i] - x1 * sn[i];
      v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
    }
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
#if defined(SY_AVX512)
  __m512 mv = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
  float mx = _mm512_reduce_max_ps(mv);
  for (; i < n; ++i) mx = std::max(mx, x[i]);
  const __m512 vm = _mm512_set1_ps(mx);
  double sum = 0.0;
  __m512 acc = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
    _mm512_storeu_ps(x + i, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm));
    _mm512_mask_storeu_ps(x + i, m, e);
    acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
  }
  sum = _mm512_reduce_add_ps(acc);
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / sum));
  for (i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  const float invs = static_cast<float>(1.0 / sum);
  for (; i < n; ++i) x[i] *= invs;
#else
  ref::softmax(x, n);
#endif
}

void swiglu(float* gate, const float* up, int64_t n) {
#if defined(SY_AVX512)
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i < n; i += 16) {
    const __mmask16 m =
        n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
  }
#else
  ref::swiglu(gate, up, n);
#endif
}

}  // namespace sy::kernels
