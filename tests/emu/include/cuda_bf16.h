// CUDA emulator: the bf16 type and its conversions (round to nearest even, NaN kept quiet).
#pragma once

#include <bit>
#include <cstdint>

struct __nv_bfloat16 {
  unsigned short __x;
};

inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t bits = static_cast<uint32_t>(b.__x) << 16;
  return std::bit_cast<float>(bits);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return __nv_bfloat16{static_cast<unsigned short>((x >> 16) | 0x40u)};
  x += 0x7fffu + ((x >> 16) & 1u);
  return __nv_bfloat16{static_cast<unsigned short>(x >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) {
  return __float2bfloat16_rn(f);
}
