// Element-wise ops the architectures beyond llama need (NEOX RoPE and RoPE frequency factors,
// GELU(tanh)-gated FFN, soft-caps, biases, per-head RMSNorm): plain-loop `ref` variants, the
// oracle, and fast variants that hoist per-position work out of the per-head loops.
#include <cmath>

#include "kernels/cpu/kernels.hpp"

namespace sy::kernels {
namespace {

// GELU's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
constexpr double kGeluCoef = 0.044715;

// RoPE angle of pair i, given the running product theta = pos * theta_scale^i. The same float
// operations in both variants, so that they agree bit for bit; without factors and scaling the
// angle is theta itself, as kernels::rope computes it.
inline float rope_angle(const RopeSpec& r, float theta, int i) {
  if (r.freq_factors) theta /= r.freq_factors[i];
  return r.freq_scale * theta;
}

// Rotates pair (x0, x1) of head v for layout neox/norm.
inline void rotate(float* v, int i, int half, bool neox, float c, float s) {
  const int a = neox ? i : 2 * i;
  const int b = neox ? i + half : 2 * i + 1;
  const float x0 = v[a];
  const float x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x0 * s + x1 * c;
}

}  // namespace

namespace ref {

void rope_ext(float* x, int n_heads, const RopeSpec& r, int pos) {
  const float theta_scale = std::pow(r.theta_base, -2.0f / static_cast<float>(r.rope_dim));
  const int half = r.rope_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * r.head_dim;
    float theta = static_cast<float>(pos);
    for (int i = 0; i < half; ++i) {
      const float a = rope_angle(r, theta, i);
      rotate(v, i, half, r.neox, std::cos(a), std::sin(a));
      theta *= theta_scale;
    }
  }
}

void geglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double gelu = 0.5 * g * (1.0 + std::tanh(kSqrt2OverPi * g * (1.0 + kGeluCoef * g * g)));
    gate[i] = static_cast<float>(gelu * up[i]);
  }
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(cap * std::tanh(static_cast<double>(x[i]) / cap));
  }
}

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_bias(float* y, const float* b, int64_t n_rows, int64_t n) {
  for (int64_t t = 0; t < n_rows; ++t)
    for (int64_t i = 0; i < n; ++i) y[t * n + i] += b[i];
}

void rmsnorm_heads(float* x, int n_heads, int head_dim, const float* w, float eps) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    ref::rmsnorm(v, v, w, head_dim, eps);
  }
}

}  // namespace ref

void rope_ext(float* x, int n_heads, const RopeSpec& r, int pos) {
  // The angles of a position once, applied to every head.
  constexpr int kMaxPairs = 512;  // head dims up to 1024 use the stack table
  const int half = r.rope_dim / 2;
  if (half > kMaxPairs) {
    ref::rope_ext(x, n_heads, r, pos);
    return;
  }
  float cs[kMaxPairs], sn[kMaxPairs];
  const float theta_scale = std::pow(r.theta_base, -2.0f / static_cast<float>(r.rope_dim));
  float theta = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    const float a = rope_angle(r, theta, i);
    cs[i] = std::cos(a);
    sn[i] = std::sin(a);
    theta *= theta_scale;
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * r.head_dim;
    if (r.neox) {
      for (int i = 0; i < half; ++i) rotate(v, i, half, true, cs[i], sn[i]);
    } else {
      for (int i = 0; i < half; ++i) rotate(v, i, half, false, cs[i], sn[i]);
    }
  }
}

void geglu(float* gate, const float* up, int64_t n) {
  const float k0 = static_cast<float>(kSqrt2OverPi);
  const float k1 = static_cast<float>(kGeluCoef);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(k0 * g * (1.0f + k1 * g * g))) * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;  // vectorized by the compiler
}

void add_bias(float* y, const float* b, int64_t n_rows, int64_t n) {
  for (int64_t t = 0; t < n_rows; ++t) {
    float* row = y + t * n;
    for (int64_t i = 0; i < n; ++i) row[i] += b[i];  // vectorized by the compiler
  }
}

void rmsnorm_heads(float* x, int n_heads, int head_dim, const float* w, float eps) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    kernels::rmsnorm(v, v, w, head_dim, eps);
  }
}

}  // namespace sy::kernels
