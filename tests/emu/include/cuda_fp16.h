// CUDA emulator: the half type and the conversions Switchyard's kernels use (IEEE binary16).
#pragma once

#include <bit>
#include <cstdint>

struct __half {
  unsigned short __x;
};
using half = __half;

inline __half __ushort_as_half(unsigned short bits) {
  return __half{bits};
}
inline unsigned short __half_as_ushort(__half h) {
  return h.__x;
}
/// binary16 to float, exactly (subnormals, infinities and NaN included).
inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.__x & 0x8000u) << 16;
  uint32_t exp = (h.__x >> 10) & 0x1fu, man = h.__x & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((man & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}
/// float to binary16, rounding to nearest even.
inline __half __float2half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u)
    return __half{static_cast<unsigned short>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u))};
  if (ax >= 0x477ff000u) return __half{static_cast<unsigned short>(sign | 0x7c00u)};  // overflow
  if (ax < 0x38800000u) {  // subnormal or zero in half
    float a = std::bit_cast<float>(ax);
    const float scaled = a * 16777216.0f;  // 2^24: units of the smallest subnormal
    const uint32_t q = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(q);
    uint32_t r = q + ((rem > 0.5f || (rem == 0.5f && (q & 1u))) ? 1u : 0u);
    return __half{static_cast<unsigned short>(sign | r)};
  }
  const uint32_t e = ((ax >> 23) - 112) << 10, m = (ax >> 13) & 0x3ffu;
  uint32_t h = e | m;
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return __half{static_cast<unsigned short>(sign | h)};
}
