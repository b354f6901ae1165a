// The CPU kernels' one SIMD preamble: intrinsics and the SY_AVX2 / SY_AVX512 / SY_VNNI512 /
// SY_VBMI512 switches that say which instruction sets this translation unit was compiled for
// (-march decides).
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands, which -Wuninitialized
// reports at every inlined use (GCC bug 105593); those operands are don't-cares.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define SY_AVX512 1
#if defined(__AVX512VNNI__)
#define SY_VNNI512 1
#if defined(__AVX512VBMI__) && defined(__GFNI__)
#define SY_VBMI512 1  // and GFNI: the batch-1 Q4_0 / Q8_0 kernel
#endif
#endif
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SY_AVX2 1
#endif

#if defined(SY_AVX512)
namespace sy::kernels {
/// Horizontal sums of 16 vectors at once: lane j of the result is the sum of v[perm(j)], with
/// perm as below. A shuffle tree costs ~3 ops per vector where 16 separate reductions cost ~9
/// each with long dependency chains, which for a 768-column tile is a third of the time.
inline __m512 hsum16(const __m512* v) {
  __m512 u[8], w[4], x[2];
  for (int i = 0; i < 8; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44),
                         _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
  for (int i = 0; i < 4; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[i], u[i + 4], 0x88),
                         _mm512_shuffle_f32x4(u[i], u[i + 4], 0xdd));
  for (int i = 0; i < 2; ++i)
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[i], w[i + 2], 0x44),
                         _mm512_shuffle_ps(w[i], w[i + 2], 0xee));
  return _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xdd));
}

/// Which input vector's sum lands in lane j of hsum16 (worked out from the shuffle tree).
constexpr int kHsumSrc[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

}  // namespace sy::kernels
#endif
