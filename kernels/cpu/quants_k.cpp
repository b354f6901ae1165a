// The K-quants Q2_K..Q6_K and IQ4_XS (256-element super-blocks): dequantization, quantizers and
// dot products against Q8_K activations, in ggml's block layouts.
//
// Element e of a super-block (0..255) sits as follows (the layouts of ggml-common.h):
//   Q2_K  : 2-bit code in qs[(e/128)*32 + e%32] bits 2*((e%128)/32); scale/min nibbles in
//           scales[e/16]; x = d*(scales & 15)*q - dmin*(scales >> 4).
//   Q3_K  : low 2 bits as Q2_K, bit 2 in hmask[e%32] bit e/32; 6-bit scales (stored +32) packed
//           in 12 bytes; x = d*(sc - 32)*(q - 4).
//   Q4_K  : nibble of qs[(e/64)*32 + e%32] (low for even e/32); 6-bit scale and min per 32
//           packed in 12 bytes; x = d*sc*q - dmin*m.
//   Q5_K  : as Q4_K plus bit 4 in qh[e%32] bit e/32.
//   Q6_K  : low nibble in ql[(e/128)*64 + ((e%128)/32 & 1)*32 + e%32] (high nibble for
//           (e%128) >= 64), 2 high bits in qh[(e/128)*32 + e%32] bits 2*((e%128)/32); int8
//           scale per 16; x = d*sc*(q - 32).
//   IQ4_XS: nibble of qs[(e/32)*16 + e%16] (high for e%32 >= 16) indexes the IQ4_NL codebook;
//           6-bit scale per 32 (stored +32, low 4 bits in scales_l, high 2 in scales_h).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/matmul_parts.hpp"
#include "kernels/cpu/quants.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::kernels::quant {
namespace {

constexpr int kSuper = 256;  // elements per super-block

struct BlockQ2K {
  uint8_t scales[16];  // low nibble: scale, high nibble: min, per 16 elements
  uint8_t qs[64];
  uint16_t d, dmin;  // f16
};
struct BlockQ3K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockIQ4XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};
/// Q8_K: the activations of every type here. x = d * qs; bsums[j] = sum of qs[16j..16j+15].
struct BlockQ8K {
  float d;
  int8_t qs[kSuper];
  int16_t bsums[16];
};
static_assert(sizeof(BlockQ2K) == dtype_block_bytes(DType::Q2_K) &&
              sizeof(BlockQ3K) == dtype_block_bytes(DType::Q3_K) &&
              sizeof(BlockQ4K) == dtype_block_bytes(DType::Q4_K) &&
              sizeof(BlockQ5K) == dtype_block_bytes(DType::Q5_K) &&
              sizeof(BlockQ6K) == dtype_block_bytes(DType::Q6_K) &&
              sizeof(BlockIQ4XS) == dtype_block_bytes(DType::IQ4_XS) &&
              sizeof(BlockQ8K) == dtype_block_bytes(DType::Q8_K));

/// IQ4_NL's non-linear codebook (ggml's kvalues_iq4nl), shared by IQ4_XS.
alignas(16) constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                               1,    13,   25,  38,  53,  69,  89,  113};

inline float h2f(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}

// ---- 6-bit scale packing ----

/// Q4_K/Q5_K: 8 scales and 8 mins of 6 bits in 12 bytes.
inline void unpack_k4(const uint8_t* p, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = p[j] & 63;
    m[j] = p[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((p[j + 8] & 15) | ((p[j] >> 6) << 4));
    m[j + 4] = static_cast<uint8_t>((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4));
  }
}
inline void pack_k4(const uint8_t* sc, const uint8_t* m, uint8_t* p) {
  for (int j = 0; j < 4; ++j) {
    p[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    p[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    p[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
  }
}
/// Q3_K: 16 scales of 6 bits (stored +32): low nibbles in bytes 0..7, high pairs in 8..11.
inline void unpack_k3(const uint8_t* p, int* sc) {
  for (int s = 0; s < 16; ++s) {
    const int lo = s < 8 ? (p[s] & 15) : (p[s - 8] >> 4);
    const int hi = (p[8 + s % 4] >> (2 * (s / 4))) & 3;
    sc[s] = (lo | (hi << 4)) - 32;
  }
}
inline void pack_k3(const int* sc, uint8_t* p) {
  std::memset(p, 0, 12);
  for (int s = 0; s < 16; ++s) {
    const int v = sc[s] + 32;
    p[s % 8] = static_cast<uint8_t>(p[s % 8] | ((v & 15) << (s < 8 ? 0 : 4)));
    p[8 + s % 4] = static_cast<uint8_t>(p[8 + s % 4] | (((v >> 4) & 3) << (2 * (s / 4))));
  }
}
inline int iq4xs_scale(const BlockIQ4XS& b, int ib) {
  const int lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15;
  const int hi = (b.scales_h >> (2 * ib)) & 3;
  return (lo | (hi << 4)) - 32;
}

// ---- per-element code access (the layouts in the header comment) ----

inline int q2k_code(const BlockQ2K& b, int e) {
  return (b.qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}
inline int q3k_code(const BlockQ3K& b, int e) {  // 0..7; the value is code - 4
  const int lo = (b.qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
  return lo | (((b.hmask[e % 32] >> (e / 32)) & 1) << 2);
}
inline int q4k_code(const BlockQ4K& b, int e) {
  return (b.qs[(e / 64) * 32 + e % 32] >> (4 * ((e / 32) & 1))) & 15;
}
inline int q5k_code(const BlockQ5K& b, int e) {
  const int lo = (b.qs[(e / 64) * 32 + e % 32] >> (4 * ((e / 32) & 1))) & 15;
  return lo | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
}
inline int q6k_code(const BlockQ6K& b, int e) {  // 0..63; the value is code - 32
  const int c = e / 128, r = e % 128, l = e % 32;
  const int lo = (b.ql[c * 64 + ((r / 32) & 1) * 32 + l] >> (4 * (r / 64))) & 15;
  const int hi = (b.qh[c * 32 + l] >> (2 * (r / 32))) & 3;
  return lo | (hi << 4);
}
inline int iq4xs_code(const BlockIQ4XS& b, int e) {
  return (b.qs[(e / 32) * 16 + e % 16] >> (4 * ((e % 32) / 16))) & 15;
}

// ---- reference dequantization ----

void deq_q2k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ2K*>(src);
  for (int64_t i = 0; i < n / kSuper; ++i, dst += kSuper) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    for (int e = 0; e < kSuper; ++e) {
      const int s = b[i].scales[e / 16];
      dst[e] = d * static_cast<float>(s & 15) * static_cast<float>(q2k_code(b[i], e)) -
               dmin * static_cast<float>(s >> 4);
    }
  }
}

void deq_q3k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ3K*>(src);
  for (int64_t i = 0; i < n / kSuper; ++i, dst += kSuper) {
    const float d = h2f(b[i].d);
    int sc[16];
    unpack_k3(b[i].scales, sc);
    for (int e = 0; e < kSuper; ++e)
      dst[e] = d * static_cast<float>(sc[e / 16]) * static_cast<float>(q3k_code(b[i], e) - 4);
  }
}

// Q4_K and Q5_K share their scales and mins; only the code of an element differs.
template <class Block, int (*Code)(const Block&, int)>
void deq_k4(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const Block*>(src);
  for (int64_t i = 0; i < n / kSuper; ++i, dst += kSuper) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    uint8_t sc[8], m[8];
    unpack_k4(b[i].scales, sc, m);
    for (int e = 0; e < kSuper; ++e) {
      dst[e] = d * static_cast<float>(sc[e / 32]) * static_cast<float>(Code(b[i], e)) -
               dmin * static_cast<float>(m[e / 32]);
    }
  }
}

void deq_q6k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6K*>(src);
  for (int64_t i = 0; i < n / kSuper; ++i, dst += kSuper) {
    const float d = h2f(b[i].d);
    for (int e = 0; e < kSuper; ++e) {
      dst[e] =
          d * static_cast<float>(b[i].scales[e / 16]) * static_cast<float>(q6k_code(b[i], e) - 32);
    }
  }
}

void deq_iq4xs(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockIQ4XS*>(src);
  for (int64_t i = 0; i < n / kSuper; ++i, dst += kSuper) {
    const float d = h2f(b[i].d);
    for (int e = 0; e < kSuper; ++e) {
      dst[e] = d * static_cast<float>(iq4xs_scale(b[i], e / 32)) *
               static_cast<float>(kIQ4Values[iq4xs_code(b[i], e)]);
    }
  }
}

// ---- Q8_K activations ----

size_t act_bytes_q8k(int64_t n) {
  return static_cast<size_t>(n / kSuper) * sizeof(BlockQ8K);
}

/// As llama.cpp's Q8_K: the value of largest magnitude maps to -127, round half to even.
void quantize_act_q8k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8K*>(dst);
  for (int64_t i = 0; i < n / kSuper; ++i, x += kSuper) {
    // The first value of largest magnitude sets the scale.
    float amax = 0.0f, mx = 0.0f;
#if defined(SY_AVX512)
    __m512 am = _mm512_setzero_ps();
    for (int j = 0; j < kSuper; j += 16)
      am = _mm512_max_ps(am, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    amax = _mm512_reduce_max_ps(am);
    for (int j = 0; j < kSuper && amax > 0.0f; j += 16) {
      const __mmask16 m = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)),
                                             _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (m) {
        mx = x[j + __builtin_ctz(m)];
        break;
      }
    }
#else
    for (int j = 0; j < kSuper; ++j) {
      const float a = std::fabs(x[j]);
      if (a > amax) {
        amax = a;
        mx = x[j];
      }
    }
#endif
    if (amax == 0.0f) {
      std::memset(&b[i], 0, sizeof(BlockQ8K));
      continue;
    }
    const float iscale = -127.0f / mx;
#if defined(SY_AVX512)
    // cvtps rounds to nearest even in the default mode, as nearbyint; one vector is one bsum.
    const __m512 vs = _mm512_set1_ps(iscale);
    for (int g = 0; g < 16; ++g) {
      const __m512i q =
          _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * g))),
                           _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16 * g), _mm512_cvtsepi32_epi8(q));
      b[i].bsums[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
#else
    for (int j = 0; j < kSuper; ++j) {
      const int v = static_cast<int>(std::nearbyint(iscale * x[j]));
      b[i].qs[j] = static_cast<int8_t>(std::min(127, v));
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += b[i].qs[g * 16 + j];
      b[i].bsums[g] = static_cast<int16_t>(s);
    }
#endif
    b[i].d = 1.0f / iscale;
  }
}

// ---- portable dot products (integer sums per sub-block, one float scale per super-block) ----

float dot_q2k_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ2K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuper; ++i) {
    int32_t sumi = 0, summ = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t p = 0;
      for (int l = 0; l < 16; ++l) p += q2k_code(x[i], s * 16 + l) * y[i].qs[s * 16 + l];
      sumi += (x[i].scales[s] & 15) * p;
      summ += (x[i].scales[s] >> 4) * y[i].bsums[s];
    }
    sum += y[i].d *
           (h2f(x[i].d) * static_cast<float>(sumi) - h2f(x[i].dmin) * static_cast<float>(summ));
  }
  return sum;
}

float dot_q3k_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ3K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuper; ++i) {
    int sc[16];
    unpack_k3(x[i].scales, sc);
    int32_t sumi = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t p = 0;
      for (int l = 0; l < 16; ++l) p += (q3k_code(x[i], s * 16 + l) - 4) * y[i].qs[s * 16 + l];
      sumi += sc[s] * p;
    }
    sum += y[i].d * h2f(x[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

template <class B, int (*Code)(const B&, int)>
float dot_k4_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const B*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuper; ++i) {
    uint8_t sc[8], m[8];
    unpack_k4(x[i].scales, sc, m);
    int32_t sumi = 0, summ = 0;
    for (int s = 0; s < 8; ++s) {
      int32_t p = 0;
      for (int l = 0; l < 32; ++l) p += Code(x[i], s * 32 + l) * y[i].qs[s * 32 + l];
      sumi += sc[s] * p;
      summ += m[s] * (y[i].bsums[2 * s] + y[i].bsums[2 * s + 1]);
    }
    sum += y[i].d *
           (h2f(x[i].d) * static_cast<float>(sumi) - h2f(x[i].dmin) * static_cast<float>(summ));
  }
  return sum;
}

float dot_q6k_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuper; ++i) {
    int32_t sumi = 0;
    for (int s = 0; s < 16; ++s) {
      int32_t p = 0;
      for (int l = 0; l < 16; ++l) p += (q6k_code(x[i], s * 16 + l) - 32) * y[i].qs[s * 16 + l];
      sumi += x[i].scales[s] * p;
    }
    sum += y[i].d * h2f(x[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

float dot_iq4xs_scalar(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockIQ4XS*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  float sum = 0.0f;
  for (int64_t i = 0; i < n / kSuper; ++i) {
    int32_t sumi = 0;
    for (int ib = 0; ib < 8; ++ib) {
      int32_t p = 0;
      for (int l = 0; l < 32; ++l)
        p += kIQ4Values[iq4xs_code(x[i], ib * 32 + l)] * y[i].qs[ib * 32 + l];
      sumi += iq4xs_scale(x[i], ib) * p;
    }
    sum += y[i].d * h2f(x[i].d) * static_cast<float>(sumi);
  }
  return sum;
}

// ---- AVX2 dot products ----
//
// maddubs multiplies unsigned weight codes by signed activation bytes into int16 pairs; none can
// saturate: the largest pair is 2 * 63 * 127 = 16002 (Q6_K codes 0..63), and the signed IQ4_XS
// values go through the sign trick (|w| * sign(a, w), at most 2 * 127 * 127 = 32258). The pairs
// are then multiplied by each 16-element group's scale with madd into int32 lanes, so a
// super-block's integer sum is exact; the zero points (Q3_K: 4, Q6_K: 32) and the Q2_K/Q4_K/Q5_K
// mins are applied through the activation block sums (bsums), also with madd.
#if defined(SY_AVX2)

inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m256i bsums16(const BlockQ8K& y) {
  return load32(y.bsums);
}
/// 8 int32 lanes of sum(u * s * scale) over a 32-byte run (u unsigned codes, s signed).
inline __m256i scaled_dot(__m256i u, __m256i s, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}

/// Shuffle controls picking, from 8 int16 scales held in both 128-bit lanes, scale 2k for lanes
/// 0..7 (elements 0..15 of a 32-byte run) and scale 2k + 1 for lanes 8..15 (elements 16..31).
alignas(32) constexpr int8_t kPairSel[4][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
     2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,
     6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,
     10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
     14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15}};
inline __m256i pair_scale(__m256i scales8x2, int k) {
  return _mm256_shuffle_epi8(scales8x2, load32(kPairSel[k]));
}
/// Scales 8h..8h+7 of 16 int16 scales, broadcast to both 128-bit lanes.
inline __m256i half_scales(__m256i sc16, int h) {
  return h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                : _mm256_permute2x128_si256(sc16, sc16, 0x11);
}

/// Q3_K's 16 scales (minus 32) as int8, by whole 32-bit words of the 12 packed bytes.
inline __m128i unpack_k3_simd(const uint8_t* p) {
  uint32_t u[3];
  std::memcpy(u, p, 12);
  const uint32_t lo4 = 0x0f0f0f0fu, hi2 = 0x03030303u;
  const uint32_t w0 = (u[0] & lo4) | ((u[2] & hi2) << 4);
  const uint32_t w1 = (u[1] & lo4) | (((u[2] >> 2) & hi2) << 4);
  const uint32_t w2 = ((u[0] >> 4) & lo4) | (((u[2] >> 4) & hi2) << 4);
  const uint32_t w3 = ((u[1] >> 4) & lo4) | (((u[2] >> 6) & hi2) << 4);
  return _mm_sub_epi8(_mm_setr_epi32(static_cast<int>(w0), static_cast<int>(w1),
                                     static_cast<int>(w2), static_cast<int>(w3)),
                      _mm_set1_epi8(32));
}

float dot_q2k_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ2K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuper; ++i) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(15)));
    const __m256i m16 =
        _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(15)));
    const __m256i summ = _mm256_madd_epi16(bsums16(y[i]), m16);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 2; ++c) {
      const __m256i scb = half_scales(sc16, c);
      __m256i q = load32(x[i].qs + 32 * c);
      for (int j = 0; j < 4; ++j) {
        const __m256i u = _mm256_and_si256(q, m3);
        q = _mm256_srli_epi16(q, 2);
        sumi = _mm256_add_epi32(
            sumi, scaled_dot(u, load32(y[i].qs + 128 * c + 32 * j), pair_scale(scb, j)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    accm = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].dmin)), _mm256_cvtepi32_ps(summ), accm);
  }
  return hsum_ps(_mm256_sub_ps(acc, accm));
}

float dot_q3k_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ3K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuper; ++i) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(unpack_k3_simd(x[i].scales));
    // The codes' offset of 4: start from -4 * sum(sc * bsum).
    __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(),
                                    _mm256_slli_epi32(_mm256_madd_epi16(bsums16(y[i]), sc16), 2));
    __m256i hm = load32(x[i].hmask);
    for (int c = 0; c < 2; ++c) {
      const __m256i scb = half_scales(sc16, c);
      __m256i q = load32(x[i].qs + 32 * c);
      for (int j = 0; j < 4; ++j) {
        const __m256i u = _mm256_or_si256(_mm256_and_si256(q, m3),
                                          _mm256_slli_epi16(_mm256_and_si256(hm, one), 2));
        q = _mm256_srli_epi16(q, 2);
        hm = _mm256_srli_epi16(hm, 1);
        sumi = _mm256_add_epi32(
            sumi, scaled_dot(u, load32(y[i].qs + 128 * c + 32 * j), pair_scale(scb, j)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc);
}

/// Q4_K/Q5_K scales and mins (6 bits each), by whole 32-bit words: sc[0..7], m[0..7].
inline void unpack_k4_words(const uint8_t* p, uint8_t* sc, uint8_t* m) {
  uint32_t u[3];
  std::memcpy(u, p, 12);
  const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, hi2 = 0x03030303u;
  const uint32_t w[4] = {u[0] & lo6, (u[2] & lo4) | (((u[0] >> 6) & hi2) << 4), u[1] & lo6,
                         ((u[2] >> 4) & lo4) | (((u[1] >> 6) & hi2) << 4)};
  std::memcpy(sc, w, 8);
  std::memcpy(m, w + 2, 8);
}

/// Q4_K and Q5_K (HIGH: the fifth bit from qh).
template <class B, bool HIGH>
float dot_k4_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const B*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuper; ++i) {
    alignas(8) uint8_t sc[8], m[8];
    unpack_k4_words(x[i].scales, sc, m);
    // Each min covers 32 elements, two bsums: duplicate it per bsum.
    const __m128i m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(m));
    const __m256i summ =
        _mm256_madd_epi16(bsums16(y[i]), _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)));
    __m256i qh = _mm256_setzero_si256();
    if constexpr (HIGH) qh = load32(x[i].qh);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load32(x[i].qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (HIGH) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
        hi = _mm256_or_si256(hi,
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
        qh = _mm256_srli_epi16(qh, 2);
      }
      sumi = _mm256_add_epi32(
          sumi, scaled_dot(lo, load32(y[i].qs + 64 * c), _mm256_set1_epi16(sc[2 * c])));
      sumi = _mm256_add_epi32(
          sumi, scaled_dot(hi, load32(y[i].qs + 64 * c + 32), _mm256_set1_epi16(sc[2 * c + 1])));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    accm = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].dmin)), _mm256_cvtepi32_ps(summ), accm);
  }
  return hsum_ps(_mm256_sub_ps(acc, accm));
}

float dot_q6k_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockQ6K*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuper; ++i) {
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    // The codes' offset of 32: start from -32 * sum(sc * bsum).
    __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(),
                                    _mm256_slli_epi32(_mm256_madd_epi16(bsums16(y[i]), sc16), 5));
    for (int c = 0; c < 2; ++c) {
      const __m256i scb = half_scales(sc16, c);
      const __m256i ql0 = load32(x[i].ql + 64 * c);
      const __m256i ql1 = load32(x[i].ql + 64 * c + 32);
      const __m256i qh = load32(x[i].qh + 32 * c);
      __m256i u[4];
      u[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                             _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
      u[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
      u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
      u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
      for (int k = 0; k < 4; ++k) {
        sumi = _mm256_add_epi32(
            sumi, scaled_dot(u[k], load32(y[i].qs + 128 * c + 32 * k), pair_scale(scb, k)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc);
}

float dot_iq4xs_avx2(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const BlockIQ4XS*>(w);
  const auto* y = static_cast<const BlockQ8K*>(a);
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuper; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      // 32 bytes hold sub-blocks 2p (bytes 0..15) and 2p+1 (16..31); low nibbles are their
      // elements 0..15, high nibbles 16..31.
      const __m256i q = load32(x[i].qs + 32 * p);
      const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
      const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
      const int8_t* a0 = y[i].qs + 64 * p;
      const __m256i alo = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(a0 + 32),
                                              reinterpret_cast<const __m128i*>(a0));
      const __m256i ahi = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(a0 + 48),
                                              reinterpret_cast<const __m128i*>(a0 + 16));
      const __m256i sv =
          _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(iq4xs_scale(x[i], 2 * p + 1))),
                           _mm_set1_epi16(static_cast<int16_t>(iq4xs_scale(x[i], 2 * p))));
      const __m256i plo = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(alo, lo));
      const __m256i phi = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(ahi, hi));
      sumi = _mm256_add_epi32(
          sumi, _mm256_add_epi32(_mm256_madd_epi16(plo, sv), _mm256_madd_epi16(phi, sv)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_ps(acc);
}

#endif  // SY_AVX2

// ---- AVX-512 dot products: the AVX2 scheme on 64-byte runs ----
//
// One zmm holds two 32-byte runs. Their two halves usually come from sub-blocks a few apart, so
// the bit fields are pulled out with per-lane shift counts (srlv) and the scales are placed with
// a word permute; the int16/int32 bounds are those of the AVX2 path.
#if defined(SY_AVX512)

inline __m512i load64(const void* p) {
  return _mm512_loadu_si512(p);
}
/// 32 bytes at p in both 256-bit halves.
inline __m512i dup32(const void* p) {
  return _mm512_broadcast_i64x4(load32(p));
}
inline __m512i join32(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load32(lo)), load32(hi), 1);
}
inline __m512i scaled_dot512(__m512i u, __m512i s, __m512i scale16) {
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), scale16);
}

/// int16 lanes: v0 in the low 256 bits, v1 in the high (shift counts, word indices).
struct Halves {
  alignas(64) int16_t v[32];
  constexpr Halves(int v0, int v1) : v{} {
    for (int j = 0; j < 32; ++j) v[j] = static_cast<int16_t>(j < 16 ? v0 : v1);
  }
};
/// int16 lanes: base + j / 8 for lane j (four 16-element groups of consecutive scales).
struct Quads {
  alignas(64) int16_t v[32];
  constexpr Quads(int base) : v{} {
    for (int j = 0; j < 32; ++j) v[j] = static_cast<int16_t>(base + j / 8);
  }
};
constexpr Halves kH01{0, 1}, kH02{0, 2}, kH13{1, 3}, kH46{4, 6}, kH57{5, 7}, kH23{2, 3}, kH45{4, 5},
    kH67{6, 7};
constexpr Quads kQuad[4] = {Quads(0), Quads(4), Quads(8), Quads(12)};
inline __m512i lanes(const Halves& h) {
  return _mm512_load_si512(h.v);
}
inline __m512i lanes(const Quads& q) {
  return _mm512_load_si512(q.v);
}

// NT tokens at once: each weight super-block is unpacked once and multiplied with every token's
// activations. NT = 1 is vec_dot; NT = kDotTokens is vec_dot_4 (prefill), whose outputs are
// therefore the one-token ones bit for bit (the same operations in the same order per token).

/// Q4_K and Q5_K (HIGH: the fifth bit from qh) against NT tokens whose activations are `as`
/// bytes apart.
template <class B, bool HIGH, int NT>
void dotn_k4_avx512(const void* w, const void* a, size_t as, float* out, int64_t n) {
  const auto* x = static_cast<const B*>(w);
  const BlockQ8K* y[NT];
  for (int t = 0; t < NT; ++t)
    y[t] = reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(a) + t * as);
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i one = _mm512_set1_epi8(1);
  // Sub-blocks of each 64-byte run: low nibbles of qs[64h..] are sub-blocks 4h and 4h + 2, high
  // nibbles 4h + 1 and 4h + 3; their fifth bits are those bit numbers of qh.
  const __m512i sel[4] = {lanes(kH02), lanes(kH13), lanes(kH46), lanes(kH57)};
  __m512 acc[NT];
  __m256 accm[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_setzero_ps();
    accm[t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < n / kSuper; ++i) {
    alignas(8) uint8_t sc[8], m[8];
    unpack_k4_words(x[i].scales, sc, m);
    const __m128i m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(m));
    const __m256i mw = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    const __m512i scw = _mm512_zextsi128_si512(
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))));
    __m512i qh = _mm512_setzero_si512();
    if constexpr (HIGH) qh = dup32(x[i].qh);
    __m512i sumi[NT];
    for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i q = load64(x[i].qs + 64 * h);
      __m512i lo = _mm512_and_si512(q, m4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      if constexpr (HIGH) {
        lo = _mm512_or_si512(
            lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sel[2 * h]), one), 4));
        hi = _mm512_or_si512(
            hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sel[2 * h + 1]), one), 4));
      }
      const __m512i slo = _mm512_permutexvar_epi16(sel[2 * h], scw);
      const __m512i shi = _mm512_permutexvar_epi16(sel[2 * h + 1], scw);
      for (int t = 0; t < NT; ++t) {
        const int8_t* a0 = y[t][i].qs + 128 * h;
        sumi[t] = _mm512_add_epi32(sumi[t], scaled_dot512(lo, join32(a0, a0 + 64), slo));
        sumi[t] = _mm512_add_epi32(sumi[t], scaled_dot512(hi, join32(a0 + 32, a0 + 96), shi));
      }
    }
    const float d = h2f(x[i].d), dmin = h2f(x[i].dmin);
    for (int t = 0; t < NT; ++t) {
      const __m256i summ = _mm256_madd_epi16(bsums16(y[t][i]), mw);
      acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y[t][i].d * d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
      accm[t] =
          _mm256_fmadd_ps(_mm256_set1_ps(y[t][i].d * dmin), _mm256_cvtepi32_ps(summ), accm[t]);
    }
  }
  for (int t = 0; t < NT; ++t)
    out[t] = _mm512_reduce_add_ps(_mm512_sub_ps(acc[t], _mm512_zextps256_ps512(accm[t])));
}

/// Q6_K against NT tokens.
template <int NT>
void dotn_q6k_avx512(const void* w, const void* a, size_t as, float* out, int64_t n) {
  const auto* x = static_cast<const BlockQ6K*>(w);
  const BlockQ8K* y[NT];
  for (int t = 0; t < NT; ++t)
    y[t] = reinterpret_cast<const BlockQ8K*>(static_cast<const uint8_t*>(a) + t * as);
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i m3 = _mm512_set1_epi8(3);
  // Per 128 elements: ql[0..63] low nibbles are quarters 0, 1 (qh bits 0-1, 2-3), high nibbles
  // quarters 2, 3 (qh bits 4-5, 6-7).
  const __m512i sh01 = lanes(kH02), sh23 = lanes(kH46);
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n / kSuper; ++i) {
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    const __m512i scw = _mm512_zextsi256_si512(sc16);
    __m512i sumi[NT];
    for (int t = 0; t < NT; ++t) {
      const __m256i zp = _mm256_slli_epi32(_mm256_madd_epi16(bsums16(y[t][i]), sc16), 5);
      sumi[t] = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), zp));
    }
    for (int c = 0; c < 2; ++c) {
      const __m512i ql = load64(x[i].ql + 64 * c);
      const __m512i qh = dup32(x[i].qh + 32 * c);
      const __m512i u01 =
          _mm512_or_si512(_mm512_and_si512(ql, m4),
                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh01), m3), 4));
      const __m512i u23 =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh23), m3), 4));
      const __m512i s01 = _mm512_permutexvar_epi16(lanes(kQuad[2 * c]), scw);
      const __m512i s23 = _mm512_permutexvar_epi16(lanes(kQuad[2 * c + 1]), scw);
      for (int t = 0; t < NT; ++t) {
        const int8_t* a0 = y[t][i].qs + 128 * c;
        sumi[t] = _mm512_add_epi32(sumi[t], scaled_dot512(u01, load64(a0), s01));
        sumi[t] = _mm512_add_epi32(sumi[t], scaled_dot512(u23, load64(a0 + 64), s23));
      }
    }
    const float d = h2f(x[i].d);
    for (int t = 0; t < NT; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(y[t][i].d * d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}

template <class B, bool HIGH>
float dot_k4_avx512(const void* w, const void* a, int64_t n) {
  float out;
  dotn_k4_avx512<B, HIGH, 1>(w, a, 0, &out, n);
  return out;
}

float dot_q6k_avx512(const void* w, const void* a, int64_t n) {
  float out;
  dotn_q6k_avx512<1>(w, a, 0, &out, n);
  return out;
}

/// Q2_K and Q3_K (the 2-bit fields of qs; Q3_K adds bit 2 from hmask and signed scales).
template <bool Q3>
float dot_k23_avx512(const void* w, const void* a, int64_t n) {
  const auto* y = static_cast<const BlockQ8K*>(a);
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i one = _mm512_set1_epi8(1);
  // Quarters j of a 128-element half use bits 2j of qs (and, for Q3_K, bit 4c + j of hmask).
  const __m512i sh01 = lanes(kH02), sh23 = lanes(kH46);
  const __m512i hb[4] = {lanes(kH01), lanes(kH23), lanes(kH45), lanes(kH67)};
  __m512 acc = _mm512_setzero_ps();
  __m256 accm = _mm256_setzero_ps();
  const size_t bb = Q3 ? sizeof(BlockQ3K) : sizeof(BlockQ2K);
  for (int64_t i = 0; i < n / kSuper; ++i) {
    const uint8_t* blk = static_cast<const uint8_t*>(w) + i * bb;
    __m256i sc16;
    const uint8_t* qs;
    __m512i sumi = _mm512_setzero_si512();
    __m512i hm = _mm512_setzero_si512();
    if constexpr (Q3) {
      const auto& b = *reinterpret_cast<const BlockQ3K*>(blk);
      sc16 = _mm256_cvtepi8_epi16(unpack_k3_simd(b.scales));
      const __m256i zp = _mm256_slli_epi32(_mm256_madd_epi16(bsums16(y[i]), sc16), 2);
      sumi = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), zp));
      hm = dup32(b.hmask);
      qs = b.qs;
    } else {
      const auto& b = *reinterpret_cast<const BlockQ2K*>(blk);
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
      sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(15)));
      const __m256i m16 =
          _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(15)));
      accm = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(b.dmin)),
                             _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums16(y[i]), m16)), accm);
      qs = b.qs;
    }
    const __m512i scw = _mm512_zextsi256_si512(sc16);
    for (int c = 0; c < 2; ++c) {
      const __m512i q = dup32(qs + 32 * c);
      __m512i u01 = _mm512_and_si512(_mm512_srlv_epi16(q, sh01), m3);
      __m512i u23 = _mm512_and_si512(_mm512_srlv_epi16(q, sh23), m3);
      if constexpr (Q3) {
        u01 = _mm512_or_si512(
            u01, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hm, hb[2 * c]), one), 2));
        u23 = _mm512_or_si512(
            u23, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hm, hb[2 * c + 1]), one), 2));
      }
      const int8_t* a0 = y[i].qs + 128 * c;
      sumi = _mm512_add_epi32(
          sumi, scaled_dot512(u01, load64(a0), _mm512_permutexvar_epi16(lanes(kQuad[2 * c]), scw)));
      sumi = _mm512_add_epi32(
          sumi, scaled_dot512(u23, load64(a0 + 64),
                              _mm512_permutexvar_epi16(lanes(kQuad[2 * c + 1]), scw)));
    }
    uint16_t dbits;
    std::memcpy(&dbits, blk + (Q3 ? offsetof(BlockQ3K, d) : offsetof(BlockQ2K, d)), 2);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(y[i].d * h2f(dbits)), _mm512_cvtepi32_ps(sumi), acc);
  }
  return _mm512_reduce_add_ps(_mm512_sub_ps(acc, _mm512_zextps256_ps512(accm)));
}

#endif  // SY_AVX512

// ---- many tokens: tokens in lanes (AVX-512 VNNI) ----
//
// From kPanelMinTokens tokens on, Q4_K, Q5_K and Q6_K rows multiply packed panels of 16 tokens'
// Q8_K activations, one token per int32 lane, as fast.cpp's Q4_0/Q8_0 panels do: each dword of
// weight codes is broadcast and dpbusd adds its four products into all 16 tokens at once.
// Integer sums per sub-block are scaled by the sub-block's integer scale and summed over the
// super-block, as the dot products above do; the mins (Q4_K, Q5_K) or the code offset of 32
// (Q6_K) come from the activations' block sums through dpwssd. One float step per super-block.
//
// Panel, per super-block (kPanelSuper bytes):
//   64 x 64 bytes: for k4 = 0..63, token lane i holds elements 4*k4..4*k4+3 of token i
//   16 floats: each token's Q8_K scale d (0 for padding lanes)
//   8 x 64 bytes: for j = 0..7, lane i holds bsums[2j], bsums[2j+1] of token i as two int16
// Weight rows are unpacked per chunk of rows (KRow): codes 0..15/31/63 one byte per element in
// element order, the sub-block scales as int32, the min (or scale) pairs as int16 pairs, d and
// dmin as floats.
#if defined(SY_VNNI512)

constexpr size_t kPanelSuper = 64 * 64 + 64 + 8 * 64;

/// Packs tokens [t0, t0 + 16) (fewer at the end: zero lanes) of x into one panel.
void pack_kpanel(const float* x, int64_t cols, int64_t t0, int64_t n_tokens, uint8_t* panel) {
  const int64_t nsb = cols / kSuper;
  const __m512i k4idx =
      _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
  alignas(64) BlockQ8K q;
  for (int i = 0; i < kPanelTokens; ++i) {
    const int64_t t = t0 + i;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      uint8_t* p = panel + sb * kPanelSuper;
      if (t < n_tokens) {
        quantize_act_q8k(x + t * cols + sb * kSuper, &q, kSuper);
      } else {
        std::memset(&q, 0, sizeof q);
      }
      // Dword k4 of the token goes to lane i of row k4 (64 bytes apart), 16 rows per scatter.
      for (int c = 0; c < 4; ++c)
        _mm512_i32scatter_epi32(p + 1024 * c + 4 * i, k4idx, load64(q.qs + 64 * c), 4);
      reinterpret_cast<float*>(p + 64 * 64)[i] = q.d;
      for (int j = 0; j < 8; ++j) {
        int32_t pair;
        std::memcpy(&pair, q.bsums + 2 * j, 4);
        reinterpret_cast<int32_t*>(p + 64 * 64 + 64 + 64 * j)[i] = pair;
      }
    }
  }
}

/// One weight row unpacked for the panel kernel; its arrays live in the caller's scratch.
struct KRow {
  const uint8_t* codes;  // (nsb * 256) codes
  const int32_t* sc;     // (nsb * subs) sub-block scales
  const int32_t* mins;   // (nsb * 8) int16 pairs: (m_j, m_j) for Q4_K/Q5_K, (sc_2j, sc_2j+1) Q6_K
  const float* d;        // (nsb)
  const float* dmin;     // (nsb); Q6_K: unused
};

/// Bytes of one unpacked row of nsb super-blocks.
constexpr size_t krow_bytes(int64_t nsb) {
  return static_cast<size_t>(nsb) * (256 + 16 * 4 + 8 * 4 + 8);
}

template <DType TY>
KRow prep_krow(const uint8_t* row, int64_t nsb, uint8_t* s) {
  auto* codes = s;
  auto* sc = reinterpret_cast<int32_t*>(s + nsb * 256);
  auto* mins = sc + nsb * 16;
  auto* d = reinterpret_cast<float*>(mins + nsb * 8);
  float* dmin = d + nsb;
  const __m512i m4 = _mm512_set1_epi8(15);
  for (int64_t i = 0; i < nsb; ++i) {
    uint8_t* c = codes + i * 256;
    if constexpr (TY == DType::Q6_K) {
      const auto& b = reinterpret_cast<const BlockQ6K*>(row)[i];
      const __m512i m3 = _mm512_set1_epi8(3);
      for (int h = 0; h < 2; ++h) {  // elements 128h + 32q, q = 0..3 (see dotn_q6k_avx512)
        const __m512i ql = load64(b.ql + 64 * h);
        const __m512i qh = dup32(b.qh + 32 * h);
        const __m512i u01 = _mm512_or_si512(
            _mm512_and_si512(ql, m4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, lanes(kH02)), m3), 4));
        const __m512i u23 = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, lanes(kH46)), m3), 4));
        _mm512_storeu_si512(c + 128 * h, u01);
        _mm512_storeu_si512(c + 128 * h + 64, u23);
      }
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
      _mm512_storeu_si512(sc + i * 16, _mm512_cvtepi8_epi32(s8));
      // (sc_2j, sc_2j+1) as int16 pairs: the scales widened to int16 in order.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(mins + i * 8), _mm256_cvtepi8_epi16(s8));
      d[i] = h2f(b.d);
      dmin[i] = 0.0f;
    } else {
      using B = std::conditional_t<TY == DType::Q4_K, BlockQ4K, BlockQ5K>;
      const auto& b = reinterpret_cast<const B*>(row)[i];
      __m512i qh = _mm512_setzero_si512();
      if constexpr (TY == DType::Q5_K) qh = dup32(b.qh);
      for (int h = 0; h < 2; ++h) {  // qs[64h..]: elements 128h + {0, 64} (low), + {32, 96} (high)
        const __m512i q = load64(b.qs + 64 * h);
        __m512i lo = _mm512_and_si512(q, m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        if constexpr (TY == DType::Q5_K) {
          const __m512i one = _mm512_set1_epi8(1);
          const __m512i sel_lo = lanes(h == 0 ? kH02 : kH46);
          const __m512i sel_hi = lanes(h == 0 ? kH13 : kH57);
          lo = _mm512_or_si512(
              lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sel_lo), one), 4));
          hi = _mm512_or_si512(
              hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sel_hi), one), 4));
        }
        uint8_t* o = c + 128 * h;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_castsi512_si256(lo));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 32), _mm512_castsi512_si256(hi));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 64), _mm512_extracti64x4_epi64(lo, 1));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 96), _mm512_extracti64x4_epi64(hi, 1));
      }
      alignas(8) uint8_t s8[8], m8[8];
      unpack_k4_words(b.scales, s8, m8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(sc + i * 16),
                          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<__m128i*>(s8))));
      const __m256i m32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<__m128i*>(m8)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(mins + i * 8),
                          _mm256_or_si256(m32, _mm256_slli_epi32(m32, 16)));  // (m_j, m_j)
      d[i] = h2f(b.d);
      dmin[i] = h2f(b.dmin);
    }
  }
  return KRow{codes, sc, mins, d, dmin};
}

/// Sub-blocks of a super-block (32 elements each; Q6_K: 16), the steps of tile_kpanel's loop.
template <DType TY>
constexpr int kSubsK = TY == DType::Q6_K ? 16 : 8;

/// R rows x TT panels of 16 tokens; out[(r * TT + g) * 16 + lane]. The f32 sums stay in out
/// (one update per super-block), so the registers hold the integer sums of more rows.
template <DType TY, int R, int TT>
void tile_kpanel(const KRow* rows, const uint8_t* panels, size_t panel_bytes, int64_t nsb,
                 float* out, const SpreadPrefetch& pf) {
  constexpr int kSubs = kSubsK<TY>;
  constexpr int kSub = kSuper / kSubs;  // elements per sub-block
  for (int i = 0; i < R * TT; ++i) _mm512_storeu_ps(out + i * kPanelTokens, _mm512_setzero_ps());
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* ps = panels + sb * kPanelSuper;
    __m512i si[R][TT], ai[R][TT];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < TT; ++g) si[r][g] = _mm512_setzero_si512();
    for (int s = 0; s < kSubs; ++s) {
      pf.at(sb * kSubs + s);
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < TT; ++g) ai[r][g] = _mm512_setzero_si512();
      for (int k = 0; k < kSub / 4; ++k) {
        const int k4 = s * (kSub / 4) + k;
        __m512i xv[TT];
        for (int g = 0; g < TT; ++g) xv[g] = _mm512_load_si512(ps + g * panel_bytes + 64 * k4);
        for (int r = 0; r < R; ++r) {
          int32_t wd;
          std::memcpy(&wd, rows[r].codes + sb * kSuper + 4 * k4, 4);
          const __m512i wb = _mm512_set1_epi32(wd);
          for (int g = 0; g < TT; ++g) ai[r][g] = _mm512_dpbusd_epi32(ai[r][g], wb, xv[g]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m512i scv = _mm512_set1_epi32(rows[r].sc[sb * 16 + s]);
        for (int g = 0; g < TT; ++g)
          si[r][g] = _mm512_add_epi32(si[r][g], _mm512_mullo_epi32(ai[r][g], scv));
      }
    }
    // The mins (Q4_K, Q5_K) or the scaled block sums (Q6_K): sum over j of pair j . bsum pair j.
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < TT; ++g) ai[r][g] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      __m512i bv[TT];
      for (int g = 0; g < TT; ++g)
        bv[g] = _mm512_load_si512(ps + g * panel_bytes + 64 * 64 + 64 + 64 * j);
      for (int r = 0; r < R; ++r) {
        const __m512i mw = _mm512_set1_epi32(rows[r].mins[sb * 8 + j]);
        for (int g = 0; g < TT; ++g) ai[r][g] = _mm512_dpwssd_epi32(ai[r][g], bv[g], mw);
      }
    }
    for (int g = 0; g < TT; ++g) {
      const __m512 dx = _mm512_load_ps(ps + g * panel_bytes + 64 * 64);
      for (int r = 0; r < R; ++r) {
        float* o = out + (r * TT + g) * kPanelTokens;
        __m512 acc = _mm512_loadu_ps(o);
        if constexpr (TY == DType::Q6_K) {
          const __m512i v = _mm512_sub_epi32(si[r][g], _mm512_slli_epi32(ai[r][g], 5));
          acc = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(rows[r].d[sb])),
                                _mm512_cvtepi32_ps(v), acc);
        } else {
          acc = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(rows[r].d[sb])),
                                _mm512_cvtepi32_ps(si[r][g]), acc);
          acc = _mm512_fnmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(rows[r].dmin[sb])),
                                 _mm512_cvtepi32_ps(ai[r][g]), acc);
        }
        _mm512_storeu_ps(o, acc);
      }
    }
  }
}

constexpr int kRowsK = 6;
constexpr int kPanelsK = 2;

/// Rows [r0, r1) of w against every panel; y[t * w.rows + r].
template <DType TY>
void kpanel_rows(const WeightView& w, const uint8_t* panels, size_t panel_bytes, int64_t n_tokens,
                 float* y, int64_t r0, int64_t r1, uint8_t* scratch) {
  const int64_t nsb = w.cols / kSuper;
  const int64_t n_panels = (n_tokens + kPanelTokens - 1) / kPanelTokens;
  panel_rows<kRowsK, kPanelsK, KRow>(
      static_cast<const uint8_t*>(w.data), row_bytes(w.type, w.cols), w.rows, r0, r1, panels,
      panel_bytes, n_tokens, n_panels, nsb * kSubsK<TY>, krow_bytes(nsb), scratch, y,
      [&](const uint8_t* row, uint8_t* to) { return prep_krow<TY>(row, nsb, to); },
      [&](int np, const KRow* rows, const uint8_t* pp, float* out, const SpreadPrefetch& pf) {
        if (np == kPanelsK) {
          tile_kpanel<TY, kRowsK, kPanelsK>(rows, pp, panel_bytes, nsb, out, pf);
        } else {
          tile_kpanel<TY, kRowsK, 1>(rows, pp, panel_bytes, nsb, out, pf);
        }
      });
}

/// Scratch bytes kpanel_rows needs for rows of nsb super-blocks.
size_t kpanel_scratch(int64_t nsb) {
  return panel_rows_scratch<kRowsK, kPanelsK>(krow_bytes(nsb));
}

#endif  // SY_VNNI512

// ---- quantizers ----
//
// Two steps per super-block. First each sub-block gets a float step (and, asymmetric types, an
// offset) by a small search: a few candidate ranges, from the one covering every value down to
// 60% of it (clipping outliers), each refined by up to three rounds of least squares on its code
// assignment; the lowest squared error wins, so it is never worse than the covering fit. Then
// the steps and offsets are coded as ggml stores them (f16 super-block scales, 4/6/8-bit
// sub-block codes, rounded to nearest), and every value gets the nearest level of its
// sub-block's decoded grid, clamped at the grid's ends:
//   |x - dequant(x)| <= step / 2,  step = d * sc,  unless x lies beyond the grid's end level.

float sse_asym(const float* v, int n, float step, float off, int qmax) {
  const float inv = 1.0f / step;
  float e = 0.0f;
  for (int l = 0; l < n; ++l) {
    const int q = std::clamp(static_cast<int>(std::nearbyint((v[l] + off) * inv)), 0, qmax);
    const float r = step * static_cast<float>(q) - off - v[l];
    e += r * r;
  }
  return e;
}

/// Float step and offset (>= 0) of one sub-block: x ~= step * q - off, q in 0..qmax.
void search_asym(const float* v, int n, int qmax, float* step_out, float* off_out) {
  float lo = 0.0f, hi = v[0];
  for (int l = 0; l < n; ++l) {
    lo = std::min(lo, v[l]);
    hi = std::max(hi, v[l]);
  }
  if (hi <= lo) {  // all values equal and <= 0: the offset alone is exact
    *step_out = 0.0f;
    *off_out = -lo;
    return;
  }
  float best_step = (hi - lo) / static_cast<float>(qmax), best_off = -lo;
  float best = sse_asym(v, n, best_step, best_off, qmax);
  for (const float f : {1.0f, 0.9f, 0.8f, 0.7f, 0.6f}) {
    const float mid = 0.5f * (hi + lo), half = 0.5f * (hi - lo) * f;
    float step = 2.0f * half / static_cast<float>(qmax);
    float off = std::max(0.0f, half - mid);
    for (int it = 0; it < 4; ++it) {
      const float e = sse_asym(v, n, step, off, qmax);
      if (e < best) {
        best = e;
        best_step = step;
        best_off = off;
      }
      if (it == 3) break;
      // Least squares of x on the codes: x ~= step * q + b, off = -b (kept >= 0).
      double sq = 0, sqq = 0, sx = 0, sqx = 0;
      const float inv = 1.0f / step;
      for (int l = 0; l < n; ++l) {
        const int q = std::clamp(static_cast<int>(std::nearbyint((v[l] + off) * inv)), 0, qmax);
        sq += q;
        sqq += static_cast<double>(q) * q;
        sx += v[l];
        sqx += static_cast<double>(q) * v[l];
      }
      const double den = n * sqq - sq * sq;
      if (den <= 0.0) break;
      double s = (n * sqx - sq * sx) / den;
      double b = (sx - s * sq) / n;
      if (b > 0.0) {  // the offset must be a subtraction: refit through the origin
        b = 0.0;
        s = sqq > 0.0 ? sqx / sqq : 0.0;
      }
      if (s <= 0.0) break;
      step = static_cast<float>(s);
      off = static_cast<float>(-b);
    }
  }
  *step_out = best_step;
  *off_out = best_off;
}

/// Asymmetric: x ~= (d * sc) * q - (dmin * m), q in 0..qmax, sc and m in 0..code_max.
void fit_asym(const float* x, int sub, int qmax, int code_max, uint16_t* d_bits,
              uint16_t* dmin_bits, uint8_t* sc, uint8_t* m, uint8_t* q) {
  const int nsub = kSuper / sub;
  float step[16], off[16], step_max = 0.0f, off_max = 0.0f;
  for (int s = 0; s < nsub; ++s) {
    search_asym(x + s * sub, sub, qmax, &step[s], &off[s]);
    step_max = std::max(step_max, step[s]);
    off_max = std::max(off_max, off[s]);
  }
  *d_bits = f32_to_f16(step_max / static_cast<float>(code_max));
  *dmin_bits = f32_to_f16(off_max / static_cast<float>(code_max));
  const float d = h2f(*d_bits), dmin = h2f(*dmin_bits);
  for (int s = 0; s < nsub; ++s) {
    const int c = d > 0.0f ? static_cast<int>(std::nearbyint(step[s] / d)) : 0;
    const int mc = dmin > 0.0f ? static_cast<int>(std::nearbyint(off[s] / dmin)) : 0;
    sc[s] = static_cast<uint8_t>(std::clamp(c, 0, code_max));
    m[s] = static_cast<uint8_t>(std::clamp(mc, 0, code_max));
    const float st = d * static_cast<float>(sc[s]);
    const float o = dmin * static_cast<float>(m[s]);
    for (int l = 0; l < sub; ++l) {
      int v = 0;
      if (st > 0.0f) v = static_cast<int>(std::nearbyint((x[s * sub + l] + o) / st));
      q[s * sub + l] = static_cast<uint8_t>(std::clamp(v, 0, qmax));
    }
  }
}

float sse_sym(const float* v, float step, int z) {
  const float inv = 1.0f / step;
  float e = 0.0f;
  for (int l = 0; l < 16; ++l) {
    const int q = std::clamp(static_cast<int>(std::nearbyint(v[l] * inv)), -z, z - 1);
    const float r = step * static_cast<float>(q) - v[l];
    e += r * r;
  }
  return e;
}

/// Signed float step of one 16-value sub-block: x ~= step * q, q in -z..z-1.
float search_sym(const float* v, int z) {
  float amax = 0.0f, mx = 0.0f;
  for (int l = 0; l < 16; ++l) {
    if (std::fabs(v[l]) > amax) {
      amax = std::fabs(v[l]);
      mx = v[l];
    }
  }
  if (amax == 0.0f) return 0.0f;
  // The extreme value on the negative code side (which has one more code); z - 1 covers all.
  float best_step = -mx / static_cast<float>(z - 1);
  float best = sse_sym(v, best_step, z);
  for (const float t : {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f}) {
    float step = -mx / (static_cast<float>(z) + t);
    for (int it = 0; it < 3; ++it) {
      const float e = sse_sym(v, step, z);
      if (e < best) {
        best = e;
        best_step = step;
      }
      if (it == 2) break;
      double sqq = 0, sqx = 0;  // least squares through the origin on the codes
      const float inv = 1.0f / step;
      for (int l = 0; l < 16; ++l) {
        const int q = std::clamp(static_cast<int>(std::nearbyint(v[l] * inv)), -z, z - 1);
        sqq += static_cast<double>(q) * q;
        sqx += static_cast<double>(q) * v[l];
      }
      if (sqq <= 0.0 || sqx == 0.0) break;
      step = static_cast<float>(sqx / sqq);
    }
  }
  return best_step;
}

/// Symmetric, 16-element sub-blocks: x ~= (d * sc) * v, v in -z..z-1, sc in -code_max..code_max.
/// q receives v + z.
void fit_sym(const float* x, int z, int code_max, uint16_t* d_bits, int* sc, uint8_t* q) {
  float step[16], step_max = 0.0f;
  for (int s = 0; s < 16; ++s) {
    step[s] = search_sym(x + s * 16, z);
    step_max = std::max(step_max, std::fabs(step[s]));
  }
  *d_bits = f32_to_f16(step_max / static_cast<float>(code_max));
  const float d = h2f(*d_bits);
  for (int s = 0; s < 16; ++s) {
    const int c = d > 0.0f ? static_cast<int>(std::nearbyint(step[s] / d)) : 0;
    sc[s] = std::clamp(c, -code_max, code_max);
    const float st = d * static_cast<float>(sc[s]);
    for (int l = 0; l < 16; ++l) {
      int v = 0;
      if (st != 0.0f) v = static_cast<int>(std::nearbyint(x[s * 16 + l] / st));
      q[s * 16 + l] = static_cast<uint8_t>(std::clamp(v, -z, z - 1) + z);
    }
  }
}

void quant_q2k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ2K*>(dst);
  for (int64_t i = 0; i < n / kSuper; ++i, src += kSuper) {
    uint8_t sc[16], m[16], q[kSuper];
    fit_asym(src, 16, 3, 15, &b[i].d, &b[i].dmin, sc, m, q);
    for (int s = 0; s < 16; ++s) b[i].scales[s] = static_cast<uint8_t>(sc[s] | (m[s] << 4));
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int e = 0; e < kSuper; ++e)
      b[i].qs[(e / 128) * 32 + e % 32] |= static_cast<uint8_t>(q[e] << (2 * ((e % 128) / 32)));
  }
}

void quant_q3k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ3K*>(dst);
  for (int64_t i = 0; i < n / kSuper; ++i, src += kSuper) {
    int sc[16];
    uint8_t q[kSuper];
    // 6-bit scales stored +32 hold -32..31; +-31 keeps both signs symmetric.
    fit_sym(src, 4, 31, &b[i].d, sc, q);
    pack_k3(sc, b[i].scales);
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    for (int e = 0; e < kSuper; ++e) {
      b[i].qs[(e / 128) * 32 + e % 32] |=
          static_cast<uint8_t>((q[e] & 3) << (2 * ((e % 128) / 32)));
      b[i].hmask[e % 32] |= static_cast<uint8_t>(((q[e] >> 2) & 1) << (e / 32));
    }
  }
}

void quant_q4k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4K*>(dst);
  for (int64_t i = 0; i < n / kSuper; ++i, src += kSuper) {
    uint8_t sc[8], m[8], q[kSuper];
    fit_asym(src, 32, 15, 63, &b[i].d, &b[i].dmin, sc, m, q);
    pack_k4(sc, m, b[i].scales);
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int e = 0; e < kSuper; ++e)
      b[i].qs[(e / 64) * 32 + e % 32] |= static_cast<uint8_t>(q[e] << (4 * ((e / 32) & 1)));
  }
}

void quant_q5k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5K*>(dst);
  for (int64_t i = 0; i < n / kSuper; ++i, src += kSuper) {
    uint8_t sc[8], m[8], q[kSuper];
    fit_asym(src, 32, 31, 63, &b[i].d, &b[i].dmin, sc, m, q);
    pack_k4(sc, m, b[i].scales);
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int e = 0; e < kSuper; ++e) {
      b[i].qs[(e / 64) * 32 + e % 32] |= static_cast<uint8_t>((q[e] & 15) << (4 * ((e / 32) & 1)));
      b[i].qh[e % 32] |= static_cast<uint8_t>((q[e] >> 4) << (e / 32));
    }
  }
}

void quant_q6k(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6K*>(dst);
  for (int64_t i = 0; i < n / kSuper; ++i, src += kSuper) {
    int sc[16];
    uint8_t q[kSuper];
    fit_sym(src, 32, 127, &b[i].d, sc, q);
    for (int s = 0; s < 16; ++s) b[i].scales[s] = static_cast<int8_t>(sc[s]);
    std::memset(b[i].ql, 0, sizeof(b[i].ql));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int e = 0; e < kSuper; ++e) {
      const int c = e / 128, r = e % 128, l = e % 32;
      b[i].ql[c * 64 + ((r / 32) & 1) * 32 + l] |=
          static_cast<uint8_t>((q[e] & 15) << (4 * (r / 64)));
      b[i].qh[c * 32 + l] |= static_cast<uint8_t>((q[e] >> 4) << (2 * (r / 32)));
    }
  }
}

/// Index of the IQ4_NL codebook entry nearest to v (v in codebook units).
inline int nearest_iq4(float v) {
  int lo = 0, hi = 15;  // binary search on the sorted codebook, then the closer neighbour
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v < static_cast<float>(kIQ4Values[mid])) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return std::fabs(v - static_cast<float>(kIQ4Values[lo])) <=
                 std::fabs(v - static_cast<float>(kIQ4Values[hi]))
             ? lo
             : hi;
}

float sse_iq4(const float* v, float step) {
  const float inv = 1.0f / step;
  float e = 0.0f;
  for (int l = 0; l < 32; ++l) {
    const float r = step * static_cast<float>(kIQ4Values[nearest_iq4(v[l] * inv)]) - v[l];
    e += r * r;
  }
  return e;
}

/// Signed float step of one 32-value IQ4_XS sub-block: x ~= step * kIQ4Values[q]. The search
/// is that of the symmetric K-quants: the extreme value on the -127 end, a few slightly smaller
/// steps, each refined by least squares on its code assignment.
float search_iq4(const float* v) {
  float amax = 0.0f, mx = 0.0f;
  for (int l = 0; l < 32; ++l) {
    if (std::fabs(v[l]) > amax) {
      amax = std::fabs(v[l]);
      mx = v[l];
    }
  }
  if (amax == 0.0f) return 0.0f;
  float best_step = mx / -127.0f;
  float best = sse_iq4(v, best_step);
  for (const float f : {1.0f, 0.97f, 0.94f, 0.91f, 0.88f, 1.03f}) {
    float step = f * mx / -127.0f;
    for (int it = 0; it < 3; ++it) {
      const float e = sse_iq4(v, step);
      if (e < best) {
        best = e;
        best_step = step;
      }
      if (it == 2) break;
      double skk = 0, skx = 0;
      const float inv = 1.0f / step;
      for (int l = 0; l < 32; ++l) {
        const double k = kIQ4Values[nearest_iq4(v[l] * inv)];
        skk += k * k;
        skx += k * v[l];
      }
      if (skk <= 0.0 || skx == 0.0) break;
      step = static_cast<float>(skx / skk);
    }
  }
  return best_step;
}

void quant_iq4xs(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockIQ4XS*>(dst);
  for (int64_t i = 0; i < n / kSuper; ++i, src += kSuper) {
    float step[8], step_max = 0.0f;
    for (int ib = 0; ib < 8; ++ib) {
      step[ib] = search_iq4(src + ib * 32);
      step_max = std::max(step_max, std::fabs(step[ib]));
    }
    // 6-bit scales stored +32 hold -32..31; +-31 keeps both signs symmetric.
    b[i].d = f32_to_f16(step_max / 31.0f);
    const float d = h2f(b[i].d);
    b[i].scales_h = 0;
    std::memset(b[i].scales_l, 0, sizeof(b[i].scales_l));
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int ib = 0; ib < 8; ++ib) {
      const int c =
          d > 0.0f ? std::clamp(static_cast<int>(std::nearbyint(step[ib] / d)), -31, 31) : 0;
      const int stored = c + 32;
      b[i].scales_l[ib / 2] =
          static_cast<uint8_t>(b[i].scales_l[ib / 2] | ((stored & 15) << (4 * (ib % 2))));
      b[i].scales_h = static_cast<uint16_t>(b[i].scales_h | ((stored >> 4) << (2 * ib)));
      const float st = d * static_cast<float>(c);
      for (int l = 0; l < 32; ++l) {
        // A zero step codes every value as the entry nearest 0; they all decode to 0 anyway.
        const int q = st != 0.0f ? nearest_iq4(src[ib * 32 + l] / st) : 8;
        b[i].qs[ib * 16 + l % 16] |= static_cast<uint8_t>(q << (4 * (l / 16)));
      }
    }
  }
}

/// One table per dot-product implementation; the dequantizers and quantizers are shared.
template <auto Q2, auto Q3, auto Q4, auto Q5, auto Q6, auto IQ4, auto Q4x4 = nullptr,
          auto Q5x4 = nullptr, auto Q6x4 = nullptr>
struct Table {
  static constexpr TypeOps ops[] = {
      {DType::Q2_K, deq_q2k, quant_q2k, act_bytes_q8k, quantize_act_q8k, Q2, nullptr},
      {DType::Q3_K, deq_q3k, quant_q3k, act_bytes_q8k, quantize_act_q8k, Q3, nullptr},
      {DType::Q4_K, deq_k4<BlockQ4K, q4k_code>, quant_q4k, act_bytes_q8k, quantize_act_q8k, Q4,
       Q4x4},
      {DType::Q5_K, deq_k4<BlockQ5K, q5k_code>, quant_q5k, act_bytes_q8k, quantize_act_q8k, Q5,
       Q5x4},
      {DType::Q6_K, deq_q6k, quant_q6k, act_bytes_q8k, quantize_act_q8k, Q6, Q6x4},
      {DType::IQ4_XS, deq_iq4xs, quant_iq4xs, act_bytes_q8k, quantize_act_q8k, IQ4, nullptr},
  };
};

using ScalarTable = Table<dot_q2k_scalar, dot_q3k_scalar, dot_k4_scalar<BlockQ4K, q4k_code>,
                          dot_k4_scalar<BlockQ5K, q5k_code>, dot_q6k_scalar, dot_iq4xs_scalar>;
#if defined(SY_AVX2)
using Avx2Table = Table<dot_q2k_avx2, dot_q3k_avx2, dot_k4_avx2<BlockQ4K, false>,
                        dot_k4_avx2<BlockQ5K, true>, dot_q6k_avx2, dot_iq4xs_avx2>;
#endif
#if defined(SY_AVX512)
// IQ4_XS keeps the AVX2 kernel: its codebook lookup works per 16-byte lane either way.
using Avx512Table =
    Table<dot_k23_avx512<false>, dot_k23_avx512<true>, dot_k4_avx512<BlockQ4K, false>,
          dot_k4_avx512<BlockQ5K, true>, dot_q6k_avx512, dot_iq4xs_avx2,
          dotn_k4_avx512<BlockQ4K, false, kDotTokens>, dotn_k4_avx512<BlockQ5K, true, kDotTokens>,
          dotn_q6k_avx512<kDotTokens>>;
#endif

const TypeOps* find(const TypeOps* table, DType t) {
  for (size_t i = 0; i < 6; ++i)
    if (table[i].type == t) return &table[i];
  return nullptr;
}

}  // namespace

const TypeOps* k_ops(DType t) {
#if defined(SY_AVX512)
  return find(Avx512Table::ops, t);
#elif defined(SY_AVX2)
  return find(Avx2Table::ops, t);
#else
  return find(ScalarTable::ops, t);
#endif
}

const TypeOps* k_ops_isa(DType t, int isa) {
  switch (isa) {
    case 0:
      return find(ScalarTable::ops, t);
#if defined(SY_AVX2)
    case 1:
      return find(Avx2Table::ops, t);
#endif
#if defined(SY_AVX512)
    case 2:
      return find(Avx512Table::ops, t);
#endif
    default:
      return nullptr;
  }
}

bool matmul_panel_many(const WeightView* const* ws, float* const* ys, int n, const float* x,
                       int64_t n_tokens, ThreadPool* pool) {
#if defined(SY_VNNI512)
  const WeightView& w0 = *ws[0];
  if (n <= 0 || n_tokens < kPanelMinTokens || w0.cols % kSuper != 0) return false;
  void (*rows_fn)(const WeightView&, const uint8_t*, size_t, int64_t, float*, int64_t, int64_t,
                  uint8_t*) = nullptr;
  switch (w0.type) {
    case DType::Q4_K:
      rows_fn = kpanel_rows<DType::Q4_K>;
      break;
    case DType::Q5_K:
      rows_fn = kpanel_rows<DType::Q5_K>;
      break;
    case DType::Q6_K:
      rows_fn = kpanel_rows<DType::Q6_K>;
      break;
    default:
      return false;
  }
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    if (ws[i]->type != w0.type || ws[i]->cols != w0.cols) return false;
    total += ws[i]->rows;
  }
  const int64_t nsb = w0.cols / kSuper;
  const size_t panel_bytes = static_cast<size_t>(nsb) * kPanelSuper;
  const int64_t n_panels = (n_tokens + kPanelTokens - 1) / kPanelTokens;
  thread_local Scratch t_panels;  // the calling thread's panels
  uint8_t* panels = t_panels.get(panel_bytes * static_cast<size_t>(n_panels));
  run(pool, n_panels, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      pack_kpanel(x, w0.cols, g * kPanelTokens, n_tokens, panels + g * panel_bytes);
  });
  const int64_t groups = (total + kRowsK - 1) / kRowsK;
  run(pool, groups, [&](int64_t g0, int64_t g1) {
    thread_local Scratch t_rows;  // each worker's unpacked rows and outputs
    uint8_t* scratch = t_rows.get(kpanel_scratch(nsb));
    stacked_pieces(ws, n, g0 * kRowsK, std::min(total, g1 * kRowsK),
                   [&](int i, int64_t r0, int64_t r1) {
                     rows_fn(*ws[i], panels, panel_bytes, n_tokens, ys[i], r0, r1, scratch);
                   });
  });
  return true;
#else
  (void)ws, (void)ys, (void)n, (void)x, (void)n_tokens, (void)pool;
  return false;
#endif
}

bool matmul_panel(const WeightView& w, const float* x, int64_t n_tokens, float* y,
                  ThreadPool* pool) {
  const WeightView* ws[1] = {&w};
  float* ys[1] = {y};
  return matmul_panel_many(ws, ys, 1, x, n_tokens, pool);
}

}  // namespace sy::kernels::quant
