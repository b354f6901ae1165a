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
