// KV-cache rows stored as F32, F16 or Q8_0: store, read back to f32, and the two products
// attention needs (q . k and y += a v), converting in registers so a step allocates nothing.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::kernels {

namespace {

[[noreturn]] void bad_kv(DType t) {
  const char* name = dtype_known(static_cast<uint32_t>(t)) ? dtype_name(t) : nullptr;
  throw std::invalid_argument(std::string("KV rows cannot be stored as ") +
                              (name ? name : "an unknown type") + " (expected F32, F16 or Q8_0)");
}

#if defined(SY_AVX512)
inline __m512 load_f16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif
// The 8-wide step runs on AVX-512 machines too: after the 16-wide loop it takes the rest of a
// head (and all of a head of 8, as in small models), which would otherwise go one by one.
#if defined(SY_AVX2)
inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline float hsum8(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
}
#endif

// One f16 value: the F16C instruction where the machine has it (the same IEEE conversion as
// f16_to_f32, without its call and branches).
inline float f16_one(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}

}  // namespace

bool kv_type_ok(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::Q8_0;
}

const char* kv_type_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::Q8_0:
      return "q8_0";
    default:
      return "?";
  }
}

std::optional<DType> parse_kv_type(std::string_view name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  if (name == "q8_0") return DType::Q8_0;
  return std::nullopt;
}

void kv_store_row(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#if defined(SY_AVX512)
      for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(SY_AVX2)
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
      for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::Q8_0: {
#if defined(SY_AVX512)
      // quantize_row_q8_0 in registers: the same scale, the same products, rounded half away
      // from zero as std::round does (truncate, then step out where the part cut off is >= 0.5).
      if (n % kQK == 0) {
        auto* b = static_cast<BlockQ8_0*>(dst);
        for (int64_t i = 0; i < n / kQK; ++i) {
          const __m512 x0 = _mm512_loadu_ps(src + i * kQK);
          const __m512 x1 = _mm512_loadu_ps(src + i * kQK + 16);
          const float amax =
              _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
          const float d = amax / 127.0f;
          const float id = d != 0.0f ? 1.0f / d : 0.0f;
          b[i].d = f32_to_f16(d);
          const __m512 vid = _mm512_set1_ps(id);
          for (int h = 0; h < 2; ++h) {
            const __m512 v = _mm512_mul_ps(h == 0 ? x0 : x1, vid);
            const __m512 tr = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, tr)),
                                                    _mm512_set1_ps(0.5f), _CMP_GE_OQ);
            const __m512 one = _mm512_castsi512_ps(
                _mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(1.0f)),
                                _mm512_and_si512(_mm512_castps_si512(v),
                                                 _mm512_set1_epi32(INT32_MIN))));  // ±1
            const __m512 r = _mm512_mask_add_ps(tr, up, tr, one);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(b[i].qs + 16 * h),
                             _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(r)));
          }
        }
        return;
      }
#endif
      quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    }
    default:
      bad_kv(t);
  }
}

void kv_load_row(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(SY_AVX512)
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_f16x16(s + i));
#endif
#if defined(SY_AVX2)
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_f16x8(s + i));
#endif
      for (; i < n; ++i) dst[i] = f16_one(s[i]);
      return;
    }
    case DType::Q8_0:
      dequantize_row(t, src, dst, n);
      return;
    default:
      bad_kv(t);
  }
}

float kv_dot(DType t, const float* q, const void* row, int64_t n) {
  switch (t) {
    case DType::F32:
      return dot(q, static_cast<const float*>(row), n);
    case DType::F16: {
      const auto* k = static_cast<const uint16_t*>(row);
      int64_t i = 0;
      float s = 0.0f;
#if defined(SY_AVX512)
      if (n >= 16) {
        __m512 acc = _mm512_setzero_ps();
        for (; i + 16 <= n; i += 16)
          acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load_f16x16(k + i), acc);
        s = _mm512_reduce_add_ps(acc);
      }
#endif
#if defined(SY_AVX2)
      if (i + 8 <= n) {
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load_f16x8(k + i), acc);
        s += hsum8(acc);
      }
#endif
      for (; i < n; ++i) s += q[i] * f16_one(k[i]);
      return s;
    }
    case DType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(row);
      float s = 0.0f;
      for (int64_t blk = 0; blk < n / kQK; ++blk) {
        const float* qb = q + blk * kQK;
        float p = 0.0f;
#if defined(SY_AVX512)
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[blk].qs));
        const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[blk].qs + 16));
        __m512 acc =
            _mm512_mul_ps(_mm512_loadu_ps(qb), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)));
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(qb + 16),
                              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), acc);
        p = _mm512_reduce_add_ps(acc);
#else
        for (int j = 0; j < kQK; ++j) p += qb[j] * static_cast<float>(b[blk].qs[j]);
#endif
        s += f16_one(b[blk].d) * p;
      }
      return s;
    }
    default:
      bad_kv(t);
  }
}

void kv_axpy(DType t, float a, const void* row, float* y, int64_t n) {
  switch (t) {
    case DType::F32:
      axpy(a, static_cast<const float*>(row), y, n);
      return;
    case DType::F16: {
      const auto* v = static_cast<const uint16_t*>(row);
      int64_t i = 0;
#if defined(SY_AVX512)
      const __m512 va = _mm512_set1_ps(a);
      for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, load_f16x16(v + i), _mm512_loadu_ps(y + i)));
#endif
#if defined(SY_AVX2)
      const __m256 va8 = _mm256_set1_ps(a);
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va8, load_f16x8(v + i), _mm256_loadu_ps(y + i)));
#endif
      for (; i < n; ++i) y[i] += a * f16_one(v[i]);
      return;
    }
    case DType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(row);
      for (int64_t blk = 0; blk < n / kQK; ++blk) {
        const float ad = a * f16_one(b[blk].d);
        float* yb = y + blk * kQK;
#if defined(SY_AVX512)
        const __m512 va = _mm512_set1_ps(ad);
        for (int h = 0; h < 2; ++h) {
          const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[blk].qs + 16 * h));
          const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
          _mm512_storeu_ps(yb + 16 * h, _mm512_fmadd_ps(va, x, _mm512_loadu_ps(yb + 16 * h)));
        }
#else
        for (int j = 0; j < kQK; ++j) yb[j] += ad * static_cast<float>(b[blk].qs[j]);
#endif
      }
      return;
    }
    default:
      bad_kv(t);
  }
}

// ---- many cached rows at once (decode attention) ----

namespace {

#if defined(SY_AVX512)
/// 16 values from position d of a cached F32 or F16 row; masked (zeros past the row) at a tail.
template <DType T, bool kTail>
inline __m512 kv16(const uint8_t* row, int64_t d, __mmask16 m) {
  if constexpr (T == DType::F32) {
    const float* p = reinterpret_cast<const float*>(row) + d;
    return kTail ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p);
  } else {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + d;
    return _mm512_cvtph_ps(kTail ? _mm256_maskz_loadu_epi16(m, p)
                                 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

/// Element 16 * part .. + 15 of a Q8_0 block's codes, as floats.
inline __m512 q8_16(const BlockQ8_0& b, int part) {
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * part));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
}

/// Scores of one query against rows [j0, j0 + 16) (rows past `rows` repeat the last one; the
/// caller stores only the valid lanes). Each row's sum is fed to hsum16 at the input whose sum
/// lands in lane i, so lane i is row j0 + i.
template <DType T>
inline __m512 scores16(const float* q, const uint8_t* k, int64_t stride, int64_t j0, int64_t rows,
                       int64_t n) {
  const uint8_t* r[16];
  for (int i = 0; i < 16; ++i) r[i] = k + std::min<int64_t>(j0 + i, rows - 1) * stride;
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  if constexpr (T == DType::Q8_0) {
    for (int64_t blk = 0; blk < n / kQK; ++blk) {
      const __m512 q0 = _mm512_loadu_ps(q + blk * kQK);
      const __m512 q1 = _mm512_loadu_ps(q + blk * kQK + 16);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(r[i])[blk];
        const __m512 p = _mm512_fmadd_ps(q8_16(b, 1), q1, _mm512_mul_ps(q8_16(b, 0), q0));
        acc[kHsumSrc[i]] = _mm512_fmadd_ps(p, _mm512_set1_ps(f16_one(b.d)), acc[kHsumSrc[i]]);
      }
    }
  } else {
    const int64_t nf = n & ~int64_t{15};
    if (nf == n && n <= 128) {
      // Heads of up to 128 in whole vectors: each row read start to end, into its own sum (the
      // same per-row order as the loop below), which the prefetcher follows as one stream.
      __m512 qv[8];
      const int nc = static_cast<int>(n / 16);
      for (int c = 0; c < nc; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
      for (int i = 0; i < 16; ++i) {
        __m512 a = _mm512_setzero_ps();
        for (int c = 0; c < nc; ++c) a = _mm512_fmadd_ps(kv16<T, false>(r[i], 16 * c, 0), qv[c], a);
        acc[kHsumSrc[i]] = a;
      }
      return hsum16(acc);
    }
    for (int64_t d = 0; d < nf; d += 16) {
      const __m512 qv = _mm512_loadu_ps(q + d);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        acc[kHsumSrc[i]] = _mm512_fmadd_ps(kv16<T, false>(r[i], d, 0), qv, acc[kHsumSrc[i]]);
    }
    if (nf < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - nf)) - 1);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + nf);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        acc[kHsumSrc[i]] = _mm512_fmadd_ps(kv16<T, true>(r[i], nf, m), qv, acc[kHsumSrc[i]]);
    }
  }
  return hsum16(acc);
}

template <DType T>
void scores_avx512(const float* q, int64_t q_stride, int nq, const uint8_t* k, int64_t stride,
                   int64_t rows, int64_t n, float scale, float* s, int64_t s_stride) {
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < rows; j0 += 16) {
    const int64_t nr = std::min<int64_t>(16, rows - j0);
    const __mmask16 m = static_cast<__mmask16>((1u << nr) - 1);
    for (int h = 0; h < nq; ++h) {
      const __m512 v = scores16<T>(q + h * q_stride, k, stride, j0, rows, n);
      _mm512_mask_storeu_ps(s + h * s_stride + j0, m, _mm512_mul_ps(v, sc));
    }
  }
}

/// y += sum_j p[j] * row_j over d in [d, d + 16): four accumulators take turns so the adds of
/// consecutive rows do not wait for each other.
template <DType T, bool kTail>
inline void mix16(const float* p, const uint8_t* v, int64_t stride, int64_t rows, int64_t d,
                  __mmask16 m, float* y) {
  __m512 a[4] = {kTail ? _mm512_maskz_loadu_ps(m, y + d) : _mm512_loadu_ps(y + d),
                 _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t j = 0;
  for (; j + 4 <= rows; j += 4)
    for (int u = 0; u < 4; ++u)
      a[u] = _mm512_fmadd_ps(_mm512_set1_ps(p[j + u]), kv16<T, kTail>(v + (j + u) * stride, d, m),
                             a[u]);
  for (; j < rows; ++j)
    a[0] = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), kv16<T, kTail>(v + j * stride, d, m), a[0]);
  const __m512 sum = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
  if (kTail) {
    _mm512_mask_storeu_ps(y + d, m, sum);
  } else {
    _mm512_storeu_ps(y + d, sum);
  }
}

template <DType T>
void mix_avx512(const float* p, int64_t p_stride, int nq, const uint8_t* v, int64_t stride,
                int64_t rows, int64_t n, float* y, int64_t y_stride) {
  for (int h = 0; h < nq; ++h) {
    const float* ph = p + h * p_stride;
    float* yh = y + h * y_stride;
    if constexpr (T == DType::Q8_0) {
      for (int64_t blk = 0; blk < n / kQK; ++blk) {
        __m512 a0 = _mm512_loadu_ps(yh + blk * kQK), a1 = _mm512_loadu_ps(yh + blk * kQK + 16);
        for (int64_t j = 0; j < rows; ++j) {
          const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(v + j * stride)[blk];
          const __m512 w = _mm512_set1_ps(ph[j] * f16_one(b.d));
          a0 = _mm512_fmadd_ps(w, q8_16(b, 0), a0);
          a1 = _mm512_fmadd_ps(w, q8_16(b, 1), a1);
        }
        _mm512_storeu_ps(yh + blk * kQK, a0);
        _mm512_storeu_ps(yh + blk * kQK + 16, a1);
      }
    } else {
      const int64_t nf = n & ~int64_t{15};
      if (nf == n && n <= 128) {
        // Heads of up to 128 in whole vectors: row after row, each read start to end (one
        // forward stream), even and odd rows into two sets of sums.
        const int nc = static_cast<int>(n / 16);
        __m512 a[8], b[8];
        for (int c = 0; c < nc; ++c)
          a[c] = _mm512_loadu_ps(yh + 16 * c), b[c] = _mm512_setzero_ps();
        int64_t j = 0;
        for (; j + 2 <= rows; j += 2) {
          const __m512 p0 = _mm512_set1_ps(ph[j]), p1 = _mm512_set1_ps(ph[j + 1]);
          const uint8_t* r0 = v + j * stride;
          for (int c = 0; c < nc; ++c)
            a[c] = _mm512_fmadd_ps(p0, kv16<T, false>(r0, 16 * c, 0), a[c]);
          for (int c = 0; c < nc; ++c)
            b[c] = _mm512_fmadd_ps(p1, kv16<T, false>(r0 + stride, 16 * c, 0), b[c]);
        }
        if (j < rows) {
          const __m512 p0 = _mm512_set1_ps(ph[j]);
          for (int c = 0; c < nc; ++c)
            a[c] = _mm512_fmadd_ps(p0, kv16<T, false>(v + j * stride, 16 * c, 0), a[c]);
        }
        for (int c = 0; c < nc; ++c) _mm512_storeu_ps(yh + 16 * c, _mm512_add_ps(a[c], b[c]));
        continue;
      }
      for (int64_t d = 0; d < nf; d += 16) mix16<T, false>(ph, v, stride, rows, d, 0, yh);
      if (nf < n)
        mix16<T, true>(ph, v, stride, rows, nf, static_cast<__mmask16>((1u << (n - nf)) - 1), yh);
    }
  }
}
/// Calls f with the KV type t as a compile-time constant (t is one kv_type_ok accepts).
template <class F>
void with_kv_type(DType t, const F& f) {
  switch (t) {
    case DType::F32:
      return f(std::integral_constant<DType, DType::F32>{});
    case DType::F16:
      return f(std::integral_constant<DType, DType::F16>{});
    default:
      return f(std::integral_constant<DType, DType::Q8_0>{});
  }
}
#endif

}  // namespace

void kv_scores(DType t, const float* q, int64_t q_stride, int nq, const void* k, int64_t stride,
               int64_t rows, int64_t n, float scale, float* s, int64_t s_stride) {
  if (!kv_type_ok(t)) bad_kv(t);
  if (rows <= 0 || nq <= 0) return;
  const auto* kb = static_cast<const uint8_t*>(k);
#if defined(SY_AVX512)
  with_kv_type(t, [&](auto ty) {
    scores_avx512<decltype(ty)::value>(q, q_stride, nq, kb, stride, rows, n, scale, s, s_stride);
  });
#else
  for (int h = 0; h < nq; ++h)
    for (int64_t j = 0; j < rows; ++j)
      s[h * s_stride + j] = kv_dot(t, q + h * q_stride, kb + j * stride, n) * scale;
#endif
}

void kv_mix(DType t, const float* p, int64_t p_stride, int nq, const void* v, int64_t stride,
            int64_t rows, int64_t n, float* y, int64_t y_stride) {
  if (!kv_type_ok(t)) bad_kv(t);
  if (rows <= 0 || nq <= 0) return;
  const auto* vb = static_cast<const uint8_t*>(v);
#if defined(SY_AVX512)
  with_kv_type(t, [&](auto ty) {
    mix_avx512<decltype(ty)::value>(p, p_stride, nq, vb, stride, rows, n, y, y_stride);
  });
#else
  for (int h = 0; h < nq; ++h)
    for (int64_t j = 0; j < rows; ++j)
      kv_axpy(t, p[h * p_stride + j], vb + j * stride, y + h * y_stride, n);
#endif
}

}  // namespace sy::kernels
