// Helpers of the GPU tests: skip (exit 77, which CTest reports as skipped) where no device is
// present, device arrays poisoned with NaN, and error measures that never let a NaN pass.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/cuda_engine.hpp"
#include "kernels/cpu/kernels.hpp"

namespace sy::gputest {

/// Exit code CTest reads as "skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).
constexpr int kSkipExit = 77;

/// Global fixture: ends the process as skipped when there is no CUDA device.
struct RequireGpu {
  RequireGpu() {
    if (cuda_device_count() == 0) {
      std::printf("no usable CUDA device: GPU tests skipped\n");
      std::fflush(stdout);
      std::exit(kSkipExit);
    }
  }
};

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// A device array of n elements of U; all bytes 0xff at birth (NaN as f32, bf16 and half), so an
/// element a kernel forgets to write fails the comparison.
template <class U>
class DevArray {
 public:
  explicit DevArray(size_t n) : n_(n) {
    check(cudaMalloc(&p_, sizeof(U) * std::max<size_t>(n, 1)), "cudaMalloc");
    poison();
  }
  explicit DevArray(const std::vector<U>& h) : DevArray(h.size()) { upload(h); }
  ~DevArray() { cudaFree(p_); }
  DevArray(const DevArray&) = delete;
  DevArray& operator=(const DevArray&) = delete;
  void poison() { check(cudaMemset(p_, 0xff, sizeof(U) * n_), "cudaMemset"); }
  void upload(const std::vector<U>& h) {
    check(cudaMemcpy(p_, h.data(), sizeof(U) * h.size(), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<U> download() const {
    check(cudaDeviceSynchronize(), "kernel");
    std::vector<U> h(n_);
    check(cudaMemcpy(h.data(), p_, sizeof(U) * n_, cudaMemcpyDeviceToHost), "download");
    return h;
  }
  U* get() const { return p_; }
  /// The same memory seen as another element type of the same size (bf16 as uint16_t).
  template <class V>
  V* as() const {
    static_assert(sizeof(V) == sizeof(U));
    return reinterpret_cast<V*>(p_);
  }

 private:
  U* p_ = nullptr;
  size_t n_;
};

/// Normwise relative error max|a - b| / max|b|; infinity when a holds a NaN or an infinity.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::fabs(double{a[i]} - double{b[i]}));
    den = std::max(den, std::fabs(double{b[i]}));
  }
  return den > 0.0 ? num / den : num;
}

/// Error bounds by output type: f32 results differ from the reference only by summation order
/// and libm; bf16 results carry one rounding of 2^-9 relative, plus that of bf16 inputs.
constexpr double kTolF32 = 1e-4;
constexpr double kTolBf16 = 1e-2;
/// f32 results of products whose inputs were rounded to half (11 significant bits: 2^-11 =
/// 4.9e-4 relative each, an eighth of bf16's 2^-8), such as the tensor-core prefill's queries
/// and probabilities: two such roundings (1.3e-4 to 3.8e-4 seen); queries rounded to bf16 instead
/// showed 1e-3 to 3e-3.
constexpr double kTolF16 = 1e-3;

/// A fresh generator each run (seed printed, so that a failure can be replayed by hand).
inline std::mt19937& rng() {
  static std::mt19937 g([] {
    const unsigned s = std::random_device{}();
    std::printf("random seed %u\n", s);
    return s;
  }());
  return g;
}
inline std::vector<float> randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng());
  return v;
}
/// A 16-bit float format's conversions on the host (round to nearest even): bf16 for weights and
/// activations, IEEE half for KV caches.
struct Bits16 {
  uint16_t (*encode)(float);
  float (*decode)(uint16_t);
};
inline constexpr Bits16 kBf16Bits{kernels::f32_to_bf16, kernels::bf16_to_f32};
inline constexpr Bits16 kF16Bits{kernels::f32_to_f16, kernels::f16_to_f32};
inline std::vector<uint16_t> to_bits(const std::vector<float>& v, Bits16 f) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f.encode(v[i]);
  return o;
}
inline std::vector<float> from_bits(const std::vector<uint16_t>& v, Bits16 f) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f.decode(v[i]);
  return o;
}
/// Rounds to bf16 and back (the values a bf16 buffer can hold exactly).
inline std::vector<float> round_bf16(const std::vector<float>& v) {
  return from_bits(to_bits(v, kBf16Bits), kBf16Bits);
}
inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  return to_bits(v, kBf16Bits);
}
inline std::vector<float> from_bf16_bits(const std::vector<uint16_t>& v) {
  return from_bits(v, kBf16Bits);
}

}  // namespace sy::gputest
