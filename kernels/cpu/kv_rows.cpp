// KV-cache rows stored as F32, F16 or Q8_0: store, read back to f32, and the two products
// attention needs (q . k and y += a v), converting in registers so a step allocates nothing.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/simd.hpp"

namespace sy::kernels {

namespace {

[[noreturn]] void bad_kv(DType t) {
  const char* name = dtype_name(t);
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
    case DType::Q8_0:
      quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
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

}  // namespace sy::kernels
