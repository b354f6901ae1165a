// Reference CPU kernels: element conversions, quantizers, and plain-loop versions of every op.
// These are the oracle for the fast path's tests, so clarity wins over speed here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/quants.hpp"

namespace sy::kernels {

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

void check_blocked(DType t, int64_t n) {
  if (n % kQK != 0) {
    throw std::invalid_argument("kernels: row of " + std::to_string(n) + " elements of type " +
                                dtype_name(t) + " is not a multiple of the block size");
  }
}

[[noreturn]] void unsupported(DType t) {
  const char* name = dtype_known(static_cast<uint32_t>(t)) ? dtype_name(t) : nullptr;
  throw std::invalid_argument(std::string("kernels: unsupported dtype ") +
                              (name ? name : "unknown") + " (" +
                              std::to_string(static_cast<uint32_t>(t)) + ")");
}

}  // namespace

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return bits_float(sign | float_bits(v));
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {
    if (ax == 0x7f800000u) return sign | 0x7c00u;
    // NaN: keep the top payload bits and force the quiet bit so it stays a NaN.
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  // 65520 is the midpoint between 65504 (odd mantissa) and 2^16; ties to even round it up to inf.
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  if (ax >= 0x38800000u) {  // normal half (>= 2^-14): rebias exponent 127 -> 15 and round
    const uint32_t r = ax - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  // Half subnormal: units of 2^-24. 2^-25 is the tie between 0 and the smallest subnormal.
  if (ax <= 0x33000000u) return sign;
  const uint32_t e = ax >> 23;
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t s = 126u - e;  // 14..24 here
  uint32_t h = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_f32(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

uint16_t f32_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

size_t row_bytes(DType t, int64_t n) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      break;
    case DType::Q8_0:
    case DType::Q4_0:
      check_blocked(t, n);
      break;
    default: {
      if (quant::ops(t) == nullptr) unsupported(t);
      const int64_t be = dtype_block_elems(t);
      if (n % be != 0) {
        throw std::invalid_argument("kernels: row of " + std::to_string(n) + " elements of type " +
                                    dtype_name(t) + " is not a multiple of the block size " +
                                    std::to_string(be));
      }
    }
  }
  return static_cast<size_t>(dtype_row_bytes(t, n));
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::Q8_0: {
      check_blocked(t, n);
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / kQK; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQK; ++j) dst[i * kQK + j] = d * static_cast<float>(b[i].qs[j]);
      }
      return;
    }
    case DType::Q4_0: {
      check_blocked(t, n);
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / kQK; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQK / 2; ++j) {
          dst[i * kQK + j] = d * static_cast<float>((b[i].qs[j] & 0x0f) - 8);
          dst[i * kQK + j + kQK / 2] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    default:
      break;
  }
  if (const quant::TypeOps* o = quant::ops(t)) {
    (void)row_bytes(t, n);  // rejects a count that is not whole blocks
    o->dequantize(src, dst, n);
    return;
  }
  unsupported(t);
}

void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n) {
  check_blocked(DType::Q8_0, n);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    // 127, not 128: the scale maps the largest magnitude onto the symmetric int8 range.
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) dst[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t n) {
  check_blocked(DType::Q4_0, n);
  for (int64_t i = 0; i < n / kQK; ++i) {
    const float* x = src + i * kQK;
    float amax = 0.0f;
    float max = 0.0f;  // the signed value of largest magnitude
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    // -8 maps the extreme value onto code 0 exactly; the other side then spans up to +7.
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      // +8.5 then truncation rounds to the nearest code; 15 caps the one value that reaches 16.
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int hi =
          std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQK / 2] * id + 8.5f)));
      dst[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q8_0:
      quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      return;
    case DType::Q4_0:
      quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), n);
      return;
    default:
      break;
  }
  const quant::TypeOps* o = quant::ops(t);
  if (o && o->quantize) {
    (void)row_bytes(t, n);
    o->quantize(src, dst, n);
    return;
  }
  unsupported(t);
}

namespace ref {

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  const size_t rb = row_bytes(w.type, w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, static_cast<const char*>(w.data) + r * rb, row.data(), w.cols);
    for (int64_t t = 0; t < n_tokens; ++t) {
      double s = 0.0;
      for (int64_t k = 0; k < w.cols; ++k) s += static_cast<double>(row[k]) * x[t * w.cols + k];
      y[t * w.rows + r] = static_cast<float>(s);
    }
  }
}

float dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(s);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void rope(float* x, int n_heads, int head_dim, int rope_dim, int pos, float theta_base) {
  // Angles as llama.cpp builds them: theta_i = pos * base^(-2i/rope_dim), by running product.
  const float theta_scale = std::pow(theta_base, -2.0f / static_cast<float>(rope_dim));
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    float theta = static_cast<float>(pos);
    for (int i = 0; i < rope_dim; i += 2) {
      const float c = std::cos(theta);
      const float s = std::sin(theta);
      const float x0 = v[i];
      const float x1 = v[i + 1];
      v[i] = x0 * c - x1 * s;
      v[i + 1] = x0 * s + x1 * c;
      theta *= theta_scale;
    }
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace ref
}  // namespace sy::kernels
