// The legacy block types Q4_1, Q5_0, Q5_1 and the non-linear IQ4_NL: dequantization, quantizers
// and dot products against 8-bit activations, in ggml's block layouts.
//
// Every type has 32-element blocks. Weight codes are expanded to 32 bytes per block and multiplied
// with the activations' int8 values (AVX-512 VNNI / AVX-512BW / AVX2 / scalar). Activation
// layout (ours, per token): n int8 values, then one float scale per block, then, for the types
// with a minimum (Q4_1, Q5_1, llama.cpp's Q8_1 pairing), one float d * sum(q) per block.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/quants.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::kernels::quant {
namespace {

constexpr int kB = 32;  // elements per block of every type in this file

// Block byte layouts of ggml-common.h (all fields little-endian, f16 scales):
//   Q4_1   d, m, qs[16]           x = d * q + m,          q = 4-bit code
//   Q5_0   d, qh[4], qs[16]       x = d * (q - 16),       q = 4-bit code | bit j of qh << 4
//   Q5_1   d, m, qh[4], qs[16]    x = d * q + m
//   IQ4_NL d, qs[16]              x = d * kIq4nl[code]
// Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.
constexpr int kBytesQ4_1 = 20;
constexpr int kBytesQ5_0 = 22;
constexpr int kBytesQ5_1 = 24;
constexpr int kBytesIq4nl = 18;
static_assert(kBytesQ4_1 == dtype_block_bytes(DType::Q4_1) &&
              kBytesQ5_0 == dtype_block_bytes(DType::Q5_0) &&
              kBytesQ5_1 == dtype_block_bytes(DType::Q5_1) &&
              kBytesIq4nl == dtype_block_bytes(DType::IQ4_NL));

// IQ4_NL's 16 levels (ggml's kvalues_iq4nl): denser near zero, where most weights lie.
constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);  // blocks of 22 bytes leave every other scale unaligned
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}
inline void put_half(uint8_t* p, float x) {
  const uint16_t h = f32_to_f16(x);
  std::memcpy(p, &h, 2);
}
inline float round_half(float x) {
  return f16_to_f32(f32_to_f16(x));
}
inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- per-type description: where the fields are and how codes become integers ----

struct Q4_1T {
  static constexpr int kBytes = kBytesQ4_1;
  static constexpr bool kSigned = false;  // codes 0..15; the minimum m carries the offset
  static constexpr bool kMin = true;
  static constexpr int kQs = 4;
  static constexpr int kQh = -1;
  static int code(const uint8_t* b, int j) {
    return j < 16 ? b[kQs + j] & 15 : b[kQs + j - 16] >> 4;
  }
};
struct Q5_0T {
  static constexpr int kBytes = kBytesQ5_0;
  static constexpr bool kSigned = true;  // q - 16 in [-16, 15]
  static constexpr bool kMin = false;
  static constexpr int kQs = 6;
  static constexpr int kQh = 2;
  static int code(const uint8_t* b, int j) {
    const int lo = j < 16 ? b[kQs + j] & 15 : b[kQs + j - 16] >> 4;
    return (lo | static_cast<int>((u32_at(b + kQh) >> j & 1u) << 4)) - 16;
  }
};
struct Q5_1T {
  static constexpr int kBytes = kBytesQ5_1;
  static constexpr bool kSigned = false;  // codes 0..31
  static constexpr bool kMin = true;
  static constexpr int kQs = 8;
  static constexpr int kQh = 4;
  static int code(const uint8_t* b, int j) {
    const int lo = j < 16 ? b[kQs + j] & 15 : b[kQs + j - 16] >> 4;
    return lo | static_cast<int>((u32_at(b + kQh) >> j & 1u) << 4);
  }
};
struct Iq4nlT {
  static constexpr int kBytes = kBytesIq4nl;
  static constexpr bool kSigned = true;  // the codebook's levels, -127..113
  static constexpr bool kMin = false;
  static constexpr int kQs = 2;
  static constexpr int kQh = -1;
  static int code(const uint8_t* b, int j) {
    return kIq4nl[j < 16 ? b[kQs + j] & 15 : b[kQs + j - 16] >> 4];
  }
};

// ---- reference dequantization ----

template <class T>
void dequantize(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / kB; ++b, p += T::kBytes) {
    const float d = half_at(p);
    const float m = T::kMin ? half_at(p + 2) : 0.0f;
    for (int j = 0; j < kB; ++j) dst[b * kB + j] = d * static_cast<float>(T::code(p, j)) + m;
  }
}

// ---- quantizers (llama.cpp's reference behaviour for each type) ----

/// Packs 32 codes (each < 32) into qs and, for 5-bit types, the fifth bits into qh.
void pack(const uint8_t* q, uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
    h |= static_cast<uint32_t>(q[j] >> 4 & 1) << j;
    h |= static_cast<uint32_t>(q[j + 16] >> 4 & 1) << (j + 16);
  }
  if (qh) std::memcpy(qh, &h, 4);
}

// Q4_1 / Q5_1: d = (max - min) / levels, m = min, codes rounded to nearest.
template <int kLevels, int kBytes, bool kFive>
void quantize_min(const float* x, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / kB; ++b, x += kB, p += kBytes) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < kB; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / kLevels;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(p, d);
    put_half(p + 2, mn);
    uint8_t q[kB];
    for (int j = 0; j < kB; ++j) {
      const float v = (x[j] - mn) * id + 0.5f;  // >= 0.5: truncation rounds to nearest
      q[j] = static_cast<uint8_t>(std::min(static_cast<int>(v), kLevels));
    }
    pack(q, p + (kFive ? 8 : 4), kFive ? p + 4 : nullptr);
  }
}

// Q5_0: the element of largest magnitude maps to code 0 (d = that value / -16), keeping its sign
// exact; the opposite extreme clamps to code 31.
void quantize_q5_0(const float* x, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / kB; ++b, x += kB, p += kBytesQ5_0) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < kB; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        mx = x[j];
      }
    }
    const float d = mx / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(p, d);
    uint8_t q[kB];
    for (int j = 0; j < kB; ++j) {
      const float v = x[j] * id + 16.5f;  // in [0.5, 32.5]
      q[j] = static_cast<uint8_t>(std::min(static_cast<int>(v), 31));
    }
    pack(q, p + 6, p + 2);
  }
}

// The level nearest to each integer k in [-128, 127] (at k + 128), ties to the upper level.
struct LevelTable {
  uint8_t at[256] = {};
  constexpr LevelTable() {
    for (int k = -128; k < 128; ++k) {
      int best = 0;
      for (int l = 1; l < 16; ++l) {
        const int dl = k > kIq4nl[l] ? k - kIq4nl[l] : kIq4nl[l] - k;
        const int db = k > kIq4nl[best] ? k - kIq4nl[best] : kIq4nl[best] - k;
        if (dl <= db) best = l;
      }
      at[k + 128] = static_cast<uint8_t>(best);
    }
  }
};
constexpr LevelTable kLevelAt;

/// Index of the codebook level nearest to v, ties to the upper one. Levels are at least 11
/// apart, so over [k, k + 1) the nearest is the one nearest to k or the next one up: a table
/// look-up and one comparison instead of a search (the scale search calls this 15 times per
/// weight).
inline int nearest_level(float v) {
  const float c = v > -128.0f ? (v < 127.0f ? v : 127.0f) : -128.0f;  // NaN: -128
  int l = kLevelAt.at[static_cast<int>(std::floor(c)) + 128];
  if (l < 15 && c - static_cast<float>(kIq4nl[l]) >= static_cast<float>(kIq4nl[l + 1]) - c) ++l;
  return l;
}

// IQ4_NL: the non-uniform levels make the best scale a search. Candidate inverse scales put the
// block's extreme at levels near -127; for each, codes are the nearest levels and the scale is
// the weighted least-squares fit sum(w q x) / sum(w q^2), weights x^2 (large weights matter
// most, as in llama.cpp without an importance matrix). The candidate with the smallest weighted
// error wins; codes are then re-picked against the stored (f16) scale.
void quantize_iq4_nl(const float* x, void* dst, int64_t n) {
  // Candidates on each side of the extreme's level: 7 steps of one level unit, as llama.cpp.
  constexpr int kTries = 7;
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / kB; ++b, x += kB, p += kBytesIq4nl) {
    float amax = 0.0f, mx = 0.0f;
    for (int j = 0; j < kB; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        mx = x[j];
      }
    }
    uint8_t q[kB] = {};
    if (amax < 1e-30f) {  // an all-zero block: d = 0 decodes to zeros whatever the codes
      put_half(p, 0.0f);
      pack(q, p + 2, nullptr);
      continue;
    }
    float w[kB];
    for (int j = 0; j < kB; ++j) w[j] = x[j] * x[j];
    float best_d = 0.0f, best = -1.0f;
    for (int t = -kTries; t <= kTries; ++t) {
      const float id = (static_cast<float>(kIq4nl[0]) + static_cast<float>(t)) / mx;
      float sqx = 0.0f, sq2 = 0.0f;
      for (int j = 0; j < kB; ++j) {
        const auto l = static_cast<float>(kIq4nl[nearest_level(x[j] * id)]);
        sqx += w[j] * l * x[j];
        sq2 += w[j] * l * l;
      }
      // Error of the fitted scale: sum(w x^2) - sqx^2 / sq2, so maximize sqx^2 / sq2.
      if (sq2 > 0.0f && (best < 0.0f || sqx * sqx > best * sq2)) {
        best_d = sqx / sq2;
        best = best_d * sqx;
      }
    }
    put_half(p, best_d);
    const float d = round_half(best_d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kB; ++j) q[j] = static_cast<uint8_t>(nearest_level(x[j] * id));
    pack(q, p + 2, nullptr);
  }
}

// ---- activations: Q8_0-style (scale) or Q8_1-style (scale and d * sum) per block ----

template <bool kSums>
size_t act_bytes(int64_t n) {
  return static_cast<size_t>(n) + static_cast<size_t>(n / kB) * (kSums ? 8 : 4);
}

template <bool kSums>
void quantize_act(const float* x, void* dst, int64_t n) {
  const int64_t nb = n / kB;
  auto* qs = static_cast<int8_t*>(dst);
  auto* ds = reinterpret_cast<float*>(qs + n);
  float* ss = ds + nb;
  for (int64_t b = 0; b < nb; ++b, x += kB, qs += kB) {
    float amax = 0.0f;
    for (int j = 0; j < kB; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < kB; ++j) {
      qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      sum += qs[j];
    }
    ds[b] = round_half(d);  // f16 scales, as llama.cpp's activation blocks hold them
    if constexpr (kSums) ss[b] = round_half(d * static_cast<float>(sum));
  }
}

// ---- dot products ----

template <class T>
float vec_dot_scalar(const uint8_t* w, const int8_t* qs, const float* ds, const float* ss,
                     int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += T::kBytes, qs += kB) {
    int32_t s = 0;
    for (int j = 0; j < kB; ++j) s += T::code(w, j) * qs[j];
    acc += static_cast<float>(s) * (half_at(w) * ds[b]);
    if constexpr (T::kMin) acc += half_at(w + 2) * ss[b];
  }
  return acc;
}

#if defined(SY_AVX2)

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// 0x10 in byte j where bit j of the block's 32 fifth bits is set.
inline __m256i fifth_bits(const uint8_t* qh) {
  const uint32_t h = u32_at(qh);
#if defined(SY_AVX512)
  return _mm256_maskz_mov_epi8(static_cast<__mmask32>(h), _mm256_set1_epi8(0x10));
#else
  // Byte j takes byte j / 8 of h (the shuffle works within 128-bit lanes, each holding h), then
  // tests bit j % 8.
  const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                       2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), sel);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_and_si256(on, _mm256_set1_epi8(0x10));
#endif
}

/// The block's 32 codes as bytes, element order (unsigned for Q4_1/Q5_1, signed otherwise).
template <class T>
inline __m256i expand(const uint8_t* b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + T::kQs));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(v, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  if constexpr (std::is_same_v<T, Iq4nlT>) {
    const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nl));
    return _mm256_set_m128i(_mm_shuffle_epi8(lut, hi), _mm_shuffle_epi8(lut, lo));
  } else {
    __m256i q = _mm256_set_m128i(hi, lo);
    if constexpr (T::kQh >= 0) q = _mm256_or_si256(q, fifth_bits(b + T::kQh));
    if constexpr (std::is_same_v<T, Q5_0T>) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    return q;
  }
}

/// 8 int32 sums of 4 products each: unsigned bytes u times signed bytes s (u <= 127, so the
/// 16-bit pair sums of maddubs cannot saturate).
inline __m256i dot_us(__m256i u, __m256i s) {
#if defined(SY_VNNI512)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

template <class T>
inline __m256i block_dot256(__m256i wq, __m256i xq) {
  if constexpr (T::kSigned) {
    return dot_us(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));  // |w| * (x * sign w)
  } else {
    return dot_us(wq, xq);
  }
}

#if defined(SY_AVX512)
inline __m512i dot_us512(__m512i u, __m512i s) {
#if defined(SY_VNNI512)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

/// The codes of two consecutive blocks (w0 and w0 + kBytes), element order, in one vector.
template <class T>
inline __m512i expand2(const uint8_t* w0) {
  const uint8_t* w1 = w0 + T::kBytes;
  const __m256i v = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w0 + T::kQs))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w1 + T::kQs)), 1);
  const __m256i m = _mm256_set1_epi8(0x0f);
  const __m512i lo = _mm512_castsi256_si512(_mm256_and_si256(v, m));  // lo0 lo1
  const __m512i hi = _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(v, 4), m));
  // 64-bit lanes: lo0 (0, 1), hi0 (8, 9), lo1 (2, 3), hi1 (10, 11)
  __m512i q = _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi);
  if constexpr (std::is_same_v<T, Iq4nlT>) {
    const __m512i lut =
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nl)));
    return _mm512_shuffle_epi8(lut, q);
  } else {
    if constexpr (T::kQh >= 0) {
      const uint64_t h = u32_at(w0 + T::kQh) | static_cast<uint64_t>(u32_at(w1 + T::kQh)) << 32;
      q = _mm512_or_si512(q, _mm512_maskz_mov_epi8(h, _mm512_set1_epi8(0x10)));
    }
    if constexpr (std::is_same_v<T, Q5_0T>) q = _mm512_sub_epi8(q, _mm512_set1_epi8(16));
    return q;
  }
}

/// d_w * d_x of blocks b and b + 1 in lanes 0-7 and 8-15.
template <class T>
inline __m512 scale2(const uint8_t* w0, const float* ds) {
  uint16_t h0, h1;
  std::memcpy(&h0, w0, 2);
  std::memcpy(&h1, w0 + T::kBytes, 2);
  const __m256i hh =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(h0))),
                              _mm_set1_epi16(static_cast<short>(h1)), 1);
  const __m512 dx = _mm512_permutexvar_ps(
      _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
      _mm512_castps128_ps512(
          _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ds)))));
  return _mm512_mul_ps(_mm512_cvtph_ps(hh), dx);
}

template <class T>
inline __m512i block_dot512(__m512i wq, __m512i xq) {
  if constexpr (T::kSigned) {
    // AVX-512 has no sign_epi8: negate x where w is negative, multiply by |w|.
    const __mmask64 neg = _mm512_movepi8_mask(wq);
    const __m512i xs = _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq);
    return dot_us512(_mm512_abs_epi8(wq), xs);
  } else {
    return dot_us512(wq, xq);
  }
}
#endif

template <class T>
float vec_dot_simd(const uint8_t* w, const int8_t* qs, const float* ds, const float* ss,
                   int64_t nb) {
  float mins = 0.0f;
  int64_t b = 0;
#if defined(SY_AVX512)
  // Two blocks per 512-bit vector: lanes 0-7 hold block b's partial sums, 8-15 block b + 1's.
  __m512 acc = _mm512_setzero_ps();
  for (; b + 2 <= nb; b += 2) {
    const uint8_t* w0 = w + b * T::kBytes;
    const __m512i xq = _mm512_loadu_si512(qs + b * kB);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_dot512<T>(expand2<T>(w0), xq)),
                          scale2<T>(w0, ds + b), acc);
    if constexpr (T::kMin)
      mins += half_at(w0 + 2) * ss[b] + half_at(w0 + T::kBytes + 2) * ss[b + 1];
  }
  float total = _mm512_reduce_add_ps(acc);
#else
  float total = 0.0f;
#endif
  __m256 acc8 = _mm256_setzero_ps();
  for (; b < nb; ++b) {
    const uint8_t* wb = w + b * T::kBytes;
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * kB));
    const __m256i s = block_dot256<T>(expand<T>(wb), xq);
    acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(half_at(wb) * ds[b]), acc8);
    if constexpr (T::kMin) mins += half_at(wb + 2) * ss[b];
  }
  return total + hsum256(acc8) + mins;
}

#endif  // SY_AVX2

template <class T>
float vec_dot(const void* w_row, const void* act, int64_t n) {
  const int64_t nb = n / kB;
  const auto* w = static_cast<const uint8_t*>(w_row);
  const auto* qs = static_cast<const int8_t*>(act);
  const auto* ds = reinterpret_cast<const float*>(qs + n);
  const float* ss = ds + nb;
#if defined(SY_AVX2)
  return vec_dot_simd<T>(w, qs, ds, ss, nb);
#else
  return vec_dot_scalar<T>(w, qs, ds, ss, nb);
#endif
}

const TypeOps kQ4_1 = {DType::Q4_1,     dequantize<Q4_1T>,  quantize_min<15, kBytesQ4_1, false>,
                       act_bytes<true>, quantize_act<true>, vec_dot<Q4_1T>,
                       nullptr};
const TypeOps kQ5_0 = {DType::Q5_0,         dequantize<Q5_0T>, quantize_q5_0, act_bytes<false>,
                       quantize_act<false>, vec_dot<Q5_0T>,    nullptr};
const TypeOps kQ5_1 = {DType::Q5_1,     dequantize<Q5_1T>,  quantize_min<31, kBytesQ5_1, true>,
                       act_bytes<true>, quantize_act<true>, vec_dot<Q5_1T>,
                       nullptr};
const TypeOps kOpsIq4nl = {DType::IQ4_NL,    dequantize<Iq4nlT>,  quantize_iq4_nl,
                           act_bytes<false>, quantize_act<false>, vec_dot<Iq4nlT>,
                           nullptr};

}  // namespace

const TypeOps* legacy_ops(DType t) {
  switch (t) {
    case DType::Q4_1:
      return &kQ4_1;
    case DType::Q5_0:
      return &kQ5_0;
    case DType::Q5_1:
      return &kQ5_1;
    case DType::IQ4_NL:
      return &kOpsIq4nl;
    default:
      return nullptr;
  }
}

}  // namespace sy::kernels::quant
