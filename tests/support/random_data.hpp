// Random inputs and the error measure of the kernel tests: normal samples from a fixed seed, and
// the relative L2 error against a reference.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace sy::test {

/// `n` samples of N(0, scale^2) from `seed`.
inline std::vector<float> randn(std::size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

/// ||a - b|| / ||b||, or +inf when anything is not finite (so NaN never passes a bound).
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i]))
      return std::numeric_limits<double>::infinity();
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0.0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace sy::test
