// CUDA emulator: nvcuda::wmma with 16x16x16 tiles. Every lane holds the whole tile (the device
// spreads it over the warp; our kernels never index fragments), loads and stores are warp-wide
// steps bracketed by warp barriers, and the device's pointer and stride rules are checked.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace nvcuda::wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int kRows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int kCols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = kRows * kCols;
  float v[kRows * kCols];  // row-major, widened to f32 (exact for bf16 and half)
};

namespace detail {
inline float widen(float x) {
  return x;
}
inline float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
inline float widen(__half x) {
  return __half2float(x);
}
template <class T>
void check(const T* p, unsigned ldm, const char* what) {
  // The device needs 256-bit aligned tile pointers and ldm a multiple of 16 bytes.
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(T)) % 16 != 0) {
    std::fprintf(stderr,
                 "CUDA emulator: wmma::%s with pointer %p (needs 32-byte alignment) and ldm %u "
                 "(needs a multiple of %zu elements)\n",
                 what, static_cast<const void*>(p), ldm, 16 / sizeof(T));
    std::abort();
  }
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class L, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const P* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, L>;
  static_assert(!std::is_same_v<Use, accumulator>, "accumulator loads take a layout");
  detail::check(p, ldm, "load_matrix_sync");
  sy_emu::sync_warp();
  for (int r = 0; r < F::kRows; ++r) {
    for (int c = 0; c < F::kCols; ++c) {
      const P& e = std::is_same_v<L, row_major> ? p[r * ldm + c] : p[c * ldm + r];
      f.v[r * F::kCols + c] = detail::widen(e);
    }
  }
  sy_emu::sync_warp();
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                      layout_t layout) {
  detail::check(p, ldm, "load_matrix_sync");
  sy_emu::sync_warp();
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c)
      f.v[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
  sy_emu::sync_warp();
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm,
                       layout_t layout) {
  detail::check(p, ldm, "store_matrix_sync");
  sy_emu::sync_warp();
  // Only lane 0 writes: the lanes hold the same tile.
  if (sy_emu::lane_id() == 0) {
    for (int r = 0; r < M; ++r) {
      for (int c = 0; c < N; ++c) {
        (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.v[r * N + c];
      }
    }
  }
  sy_emu::sync_warp();
}

template <class Use, int M, int N, int K, class T, class L>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, float value) {
  for (float& x : f.v) x = value;
}

template <int M, int N, int K, class TA, class LA, class TB, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d,
              const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  sy_emu::sync_warp();
  float out[M * N];
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      float s = c.v[i * N + j];
      for (int k = 0; k < K; ++k) s += a.v[i * K + k] * b.v[k * N + j];
      out[i * N + j] = s;
    }
  }
  for (int e = 0; e < M * N; ++e) d.v[e] = out[e];
  sy_emu::sync_warp();
}

}  // namespace nvcuda::wmma
