// Tests of the element conversions (f16, bf16) and the Q8_0 / Q4_0 quantizers in kernels.hpp.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kernels/cpu/kernels.hpp"

BOOST_AUTO_TEST_SUITE(test_kernels_convert)

using namespace sy::kernels;

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

BOOST_AUTO_TEST_CASE(f16_exact_cases) {
  BOOST_TEST(f32_to_f16(0.0f) == 0x0000);
  BOOST_TEST(f32_to_f16(-0.0f) == 0x8000);
  BOOST_TEST(f32_to_f16(1.0f) == 0x3c00);
  BOOST_TEST(f32_to_f16(-2.0f) == 0xc000);
  BOOST_TEST(f32_to_f16(65504.0f) == 0x7bff);
  BOOST_TEST(f32_to_f16(65519.0f) == 0x7bff);  // below the midpoint to 2^16
  BOOST_TEST(f32_to_f16(65520.0f) == 0x7c00);  // the tie rounds to even: infinity
  BOOST_TEST(f32_to_f16(std::numeric_limits<float>::infinity()) == 0x7c00);
  BOOST_TEST(f32_to_f16(-std::numeric_limits<float>::infinity()) == 0xfc00);
  BOOST_TEST((f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7fff) > 0x7c00);
  BOOST_TEST(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  // Subnormals: 2^-24 is the smallest; 2^-25 ties to 0; a hair above rounds up.
  BOOST_TEST(f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);
  BOOST_TEST(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);
  BOOST_TEST(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  BOOST_TEST(f32_to_f16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 units: tie to even 2
  BOOST_TEST(f32_to_f16(std::ldexp(5.0f, -25)) == 0x0002);  // 2.5 units: tie to even 2
  BOOST_TEST(f32_to_f16(std::ldexp(1023.0f, -24)) == 0x03ff);
  BOOST_TEST(f32_to_f16(std::ldexp(1.0f, -14)) == 0x0400);
  // Normal ties: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> even (1).
  BOOST_TEST(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  BOOST_TEST(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  BOOST_TEST(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  BOOST_TEST(f16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));
  BOOST_TEST(f16_to_f32(0x7bff) == 65504.0f);
  BOOST_TEST(std::isinf(f16_to_f32(0xfc00)));
  BOOST_TEST(f16_to_f32(0xfc00) < 0.0f);
  BOOST_TEST(std::isnan(f16_to_f32(0x7e00)));
}

BOOST_AUTO_TEST_CASE(f16_round_trip_all_values) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    BOOST_TEST_REQUIRE(f32_to_f16(f) == h);
  }
}

#if defined(__F16C__)
BOOST_AUTO_TEST_CASE(f16_matches_hardware) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float a = f16_to_f32(static_cast<uint16_t>(h));
    const float b = _cvtsh_ss(static_cast<unsigned short>(h));
    BOOST_TEST_REQUIRE((bits(a) == bits(b) || (std::isnan(a) && std::isnan(b))));
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    const float f = from_bits(static_cast<uint32_t>(rng()));
    const uint16_t hw = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    const uint16_t sw = f32_to_f16(f);
    if (std::isnan(f)) {
      BOOST_TEST_REQUIRE((sw & 0x7fff) > 0x7c00);
    } else {
      BOOST_TEST_REQUIRE(sw == hw);
    }
  }
}
#endif

BOOST_AUTO_TEST_CASE(bf16_cases) {
  BOOST_TEST(f32_to_bf16(1.0f) == 0x3f80);
  BOOST_TEST(bf16_to_f32(0x3f80) == 1.0f);
  // 1 + 2^-8 is the tie between 1 and 1 + 2^-7 -> even (1); 1 + 3*2^-8 -> 1 + 2^-6.
  BOOST_TEST(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  BOOST_TEST(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  BOOST_TEST(f32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  BOOST_TEST(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  // A NaN whose payload sits only in the low 16 bits must stay a NaN.
  BOOST_TEST(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  BOOST_TEST(f32_to_bf16(from_bits(0x00010000u)) == 0x0001);             // subnormal kept
  BOOST_TEST(f32_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // overflows to inf
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    BOOST_TEST_REQUIRE(f32_to_bf16(f) == h);
  }
}

BOOST_AUTO_TEST_CASE(row_bytes_values) {
  BOOST_TEST(row_bytes(DType::F32, 10) == 40u);
  BOOST_TEST(row_bytes(DType::F16, 10) == 20u);
  BOOST_TEST(row_bytes(DType::BF16, 10) == 20u);
  BOOST_TEST(row_bytes(DType::Q8_0, 64) == 68u);
  BOOST_TEST(row_bytes(DType::Q4_0, 64) == 36u);
  BOOST_CHECK_THROW(row_bytes(DType::Q8_0, 33), std::invalid_argument);
  // a ggml type the reader sizes but no kernel computes with
  BOOST_TEST(dtype_known(30));  // BF16
  BOOST_TEST(!dtype_known(9));  // Q8_1
  BOOST_TEST(dtype_row_bytes(DType::Q8_1, 64) == 72);
  BOOST_CHECK_EXCEPTION(row_bytes(DType::Q8_1, 64), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()) == "kernels: unsupported dtype unknown (9)";
                        });
}

BOOST_AUTO_TEST_CASE(q8_0_known_block) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.5f;  // amax 8 at i=0
  BlockQ8_0 b;
  quantize_row_q8_0(x.data(), &b, 32);
  BOOST_TEST(b.d == f32_to_f16(8.0f / 127.0f));
  BOOST_TEST(b.qs[0] == -127);
  BOOST_TEST(b.qs[16] == 0);
  BOOST_TEST(b.qs[17] == static_cast<int8_t>(std::round(0.5f * (127.0f / 8.0f))));
  std::vector<float> zero(32, 0.0f);
  quantize_row_q8_0(zero.data(), &b, 32);
  BOOST_TEST(b.d == 0);
  for (int i = 0; i < 32; ++i) BOOST_TEST(b.qs[i] == 0);
}

BOOST_AUTO_TEST_CASE(q4_0_known_block) {
  std::vector<float> x(32, 0.0f);
  x[3] = -4.0f;  // largest magnitude, negative: d = 0.5, code 0
  x[20] = 3.5f;  // +7 steps: code 15
  x[5] = 1.0f;   // +2 steps: code 10
  BlockQ4_0 b;
  quantize_row_q4_0(x.data(), &b, 32);
  BOOST_TEST(f16_to_f32(b.d) == 0.5f);
  BOOST_TEST((b.qs[3] & 0x0f) == 0);
  BOOST_TEST((b.qs[4] >> 4) == 15);
  BOOST_TEST((b.qs[5] & 0x0f) == 10);
  BOOST_TEST((b.qs[0] & 0x0f) == 8);
  // Largest magnitude positive: d < 0, the max maps to code 0 and -max would reach 16 -> 15.
  std::vector<float> y(32, 0.0f);
  y[0] = 8.0f;
  y[1] = -8.0f;
  quantize_row_q4_0(y.data(), &b, 32);
  BOOST_TEST(f16_to_f32(b.d) == -1.0f);
  BOOST_TEST((b.qs[0] & 0x0f) == 0);
  BOOST_TEST((b.qs[1] & 0x0f) == 15);
}

BOOST_AUTO_TEST_CASE(quantize_round_trip_bounds) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n = 32 * 40;
  std::vector<float> x(n), back(n);
  for (auto& v : x) v = nd(rng);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    std::vector<uint8_t> buf(row_bytes(t, n));
    quantize_row(t, x.data(), buf.data(), n);
    dequantize_row(t, buf.data(), back.data(), n);
    for (int blk = 0; blk < n / 32; ++blk) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk * 32 + j]));
      // Per-element bound: half a quantization step (plus the f16 rounding of the scale), or
      // the relative rounding error of the float formats.
      for (int j = 0; j < 32; ++j) {
        const int i = blk * 32 + j;
        const float err = std::fabs(back[i] - x[i]);
        float bound = 0.0f;
        switch (t) {
          case DType::F32:
            bound = 0.0f;
            break;
          case DType::F16:
            bound = std::fabs(x[i]) * 0x1p-11f + 0x1p-25f;
            break;
          case DType::BF16:
            bound = std::fabs(x[i]) * 0x1p-8f;
            break;
          case DType::Q8_0:
            bound = amax / 127.0f * 0.5f + amax * 0x1p-10f;
            break;
          case DType::Q4_0: {
            // Codes reach -8 steps but only +7: the far side beyond 7.5 steps clips by a step.
            const float step = amax / 8.0f;
            bound = (std::fabs(x[i]) > 7.5f * step ? step : 0.5f * step) + amax * 0x1p-9f;
            break;
          }
          default:  // the types of kernels/cpu/quants.hpp have their own tests
            break;
        }
        BOOST_TEST_REQUIRE(err <= bound, "dtype " << static_cast<int>(t) << " i " << i);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()  // test_kernels_convert
