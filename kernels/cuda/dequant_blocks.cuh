// Device-side decoding of ggml's quantized block layouts, shared by the conversion kernels
// (convert.cu) and the quantized GEMV (gemv_q.cu). Every type reads as groups of 16 or 32
// elements that share one multiplier and one offset: x = mul * code + add.
//
// The field offsets and bit packing follow ggml-common.h (the CPU reference in
// kernels/cpu/quants_legacy.cpp and kernels/cpu/quants_k.cpp documents them element by element):
//   Q8_0   (34 B / 32)   d, qs[32] int8                     x = d * qs
//   Q4_0   (18 B / 32)   d, qs[16]                          x = d * (nibble - 8)
//   Q4_1   (20 B / 32)   d, m, qs[16]                       x = d * nibble + m
//   Q5_0   (22 B / 32)   d, qh[4], qs[16]                   x = d * ((nibble | bit << 4) - 16)
//   Q5_1   (24 B / 32)   d, m, qh[4], qs[16]                x = d * (nibble | bit << 4) + m
//   IQ4_NL (18 B / 32)   d, qs[16]                          x = d * codebook[nibble]
//   (element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16]; bit j of qh)
//   Q2_K   (84 B / 256)  scales[16], qs[64], d, dmin        per 16: d * (s & 15) * q - dmin * (s >> 4)
//   Q3_K   (110 B / 256) hmask[32], qs[64], scales[12], d   per 16: d * (sc - 32) * (q - 4)
//   Q4_K   (144 B / 256) d, dmin, scales[12], qs[128]       per 32: d * sc * q - dmin * m
//   Q5_K   (176 B / 256) d, dmin, scales[12], qh[32], qs[128]
//   Q6_K   (210 B / 256) ql[128], qh[64], scales[16] int8, d  per 16: d * sc * (q - 32)
//   IQ4_XS (136 B / 256) d, scales_h, scales_l[4], qs[128]  per 32: d * (sc - 32) * codebook[q]
// Scales (d, dmin, m) are little-endian f16; every read here is a byte read, since blocks of
// 22, 110 or 210 bytes leave the fields unaligned.
#pragma once

#include "kernels/cuda/convert.cuh"

#ifdef __CUDACC__
namespace sy::cuda::dq {

__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}
__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
/// IQ4_NL / IQ4_XS's 16 levels (ggml's kvalues_iq4nl) as the bytes of two integers, so that a
/// lookup at a run-time index needs no memory: levels 0..7 in kIq4Lo, 8..15 in kIq4Hi.
constexpr uint64_t kIq4Lo = 0xf6eaddcfbfad9881ull;  // -127 -104 -83 -65 -49 -35 -22 -10
constexpr uint64_t kIq4Hi = 0x7159453526190d01ull;  //    1   13  25  38  53  69  89 113
__device__ __forceinline__ int iq4_level(int q) {
  return static_cast<int8_t>(static_cast<uint8_t>((q < 8 ? kIq4Lo : kIq4Hi) >> (8 * (q & 7))));
}
/// Element j of a 32-element legacy block: low nibble of qs[j] for j < 16, else high of qs[j-16].
__device__ __forceinline__ int nibble32(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
}
/// Q4_K / Q5_K: scale (sc) and minimum (m) of sub-block g (0..7), 6 bits each in 12 bytes.
__device__ __forceinline__ void k4_scale_min(const uint8_t* p, int g, int& sc, int& m) {
  if (g < 4) {
    sc = p[g] & 63;
    m = p[g + 4] & 63;
  } else {
    sc = (p[g + 4] & 15) | ((p[g - 4] >> 6) << 4);
    m = (p[g + 4] >> 4) | ((p[g] >> 6) << 4);
  }
}

// Each type: kElems elements in kBytes bytes per block; kGroup elements share (mul, add);
// kMin: whether add can be non-zero. group(b, g, mul, add) for group g of block b; code(b, e)
// the integer that multiplies mul for element e of the block. mul is formed as the CPU
// reference forms it (d * sc, one rounding), so that x = mul * code + add is the same value.
struct Q8_0 {
  static constexpr int kElems = 32, kBytes = 34, kGroup = 32;
  static constexpr bool kMin = false;
  __device__ static void group(const uint8_t* b, int, float& mul, float& add) {
    mul = f16_at(b);
    add = 0.0f;
  }
  __device__ static int code(const uint8_t* b, int e) { return static_cast<int8_t>(b[2 + e]); }
};
struct Q4_0 {
  static constexpr int kElems = 32, kBytes = 18, kGroup = 32;
  static constexpr bool kMin = false;
  __device__ static void group(const uint8_t* b, int, float& mul, float& add) {
    mul = f16_at(b);
    add = 0.0f;
  }
  __device__ static int code(const uint8_t* b, int e) { return nibble32(b + 2, e) - 8; }
};
struct Q4_1 {
  static constexpr int kElems = 32, kBytes = 20, kGroup = 32;
  static constexpr bool kMin = true;
  __device__ static void group(const uint8_t* b, int, float& mul, float& add) {
    mul = f16_at(b);
    add = f16_at(b + 2);
  }
  __device__ static int code(const uint8_t* b, int e) { return nibble32(b + 4, e); }
};
struct Q5_0 {
  static constexpr int kElems = 32, kBytes = 22, kGroup = 32;
  static constexpr bool kMin = false;
  __device__ static void group(const uint8_t* b, int, float& mul, float& add) {
    mul = f16_at(b);
    add = 0.0f;
  }
  __device__ static int code(const uint8_t* b, int e) {
    return (nibble32(b + 6, e) | static_cast<int>(((u32_at(b + 2) >> e) & 1u) << 4)) - 16;
  }
};
struct Q5_1 {
  static constexpr int kElems = 32, kBytes = 24, kGroup = 32;
  static constexpr bool kMin = true;
  __device__ static void group(const uint8_t* b, int, float& mul, float& add) {
    mul = f16_at(b);
    add = f16_at(b + 2);
  }
  __device__ static int code(const uint8_t* b, int e) {
    return nibble32(b + 8, e) | static_cast<int>(((u32_at(b + 4) >> e) & 1u) << 4);
  }
};
struct IQ4_NL {
  static constexpr int kElems = 32, kBytes = 18, kGroup = 32;
  static constexpr bool kMin = false;
  __device__ static void group(const uint8_t* b, int, float& mul, float& add) {
    mul = f16_at(b);
    add = 0.0f;
  }
  __device__ static int code(const uint8_t* b, int e) { return iq4_level(nibble32(b + 2, e)); }
};
struct Q2_K {
  static constexpr int kElems = 256, kBytes = 84, kGroup = 16;
  static constexpr bool kMin = true;
  __device__ static void group(const uint8_t* b, int g, float& mul, float& add) {
    const int s = b[g];
    mul = f16_at(b + 80) * static_cast<float>(s & 15);
    add = -(f16_at(b + 82) * static_cast<float>(s >> 4));
  }
  __device__ static int code(const uint8_t* b, int e) {
    return (b[16 + (e >> 7) * 32 + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3;
  }
};
struct Q3_K {
  static constexpr int kElems = 256, kBytes = 110, kGroup = 16;
  static constexpr bool kMin = false;
  __device__ static void group(const uint8_t* b, int g, float& mul, float& add) {
    const uint8_t* p = b + 96;
    const int lo = g < 8 ? (p[g] & 15) : (p[g - 8] >> 4);
    const int hi = (p[8 + (g & 3)] >> (2 * (g >> 2))) & 3;
    mul = f16_at(b + 108) * static_cast<float>((lo | (hi << 4)) - 32);
    add = 0.0f;
  }
  __device__ static int code(const uint8_t* b, int e) {
    const int lo = (b[32 + (e >> 7) * 32 + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3;
    return (lo | (((b[e & 31] >> (e >> 5)) & 1) << 2)) - 4;
  }
};
struct Q4_K {
  static constexpr int kElems = 256, kBytes = 144, kGroup = 32;
  static constexpr bool kMin = true;
  __device__ static void group(const uint8_t* b, int g, float& mul, float& add) {
    int sc, m;
    k4_scale_min(b + 4, g, sc, m);
    mul = f16_at(b) * static_cast<float>(sc);
    add = -(f16_at(b + 2) * static_cast<float>(m));
  }
  __device__ static int code(const uint8_t* b, int e) {
    return (b[16 + (e >> 6) * 32 + (e & 31)] >> (4 * ((e >> 5) & 1))) & 15;
  }
};
struct Q5_K {
  static constexpr int kElems = 256, kBytes = 176, kGroup = 32;
  static constexpr bool kMin = true;
  __device__ static void group(const uint8_t* b, int g, float& mul, float& add) {
    Q4_K::group(b, g, mul, add);  // the same header: d, dmin, 12 bytes of scales
  }
  __device__ static int code(const uint8_t* b, int e) {
    const int lo = (b[48 + (e >> 6) * 32 + (e & 31)] >> (4 * ((e >> 5) & 1))) & 15;
    return lo | (((b[16 + (e & 31)] >> (e >> 5)) & 1) << 4);
  }
};
struct Q6_K {
  static constexpr int kElems = 256, kBytes = 210, kGroup = 16;
  static constexpr bool kMin = false;
  __device__ static void group(const uint8_t* b, int g, float& mul, float& add) {
    mul = f16_at(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + g]));
    add = 0.0f;
  }
  __device__ static int code(const uint8_t* b, int e) {
    const int c = e >> 7, r = e & 127, l = e & 31;
    const int lo = (b[c * 64 + ((r >> 5) & 1) * 32 + l] >> (4 * (r >> 6))) & 15;
    const int hi = (b[128 + c * 32 + l] >> (2 * (r >> 5))) & 3;
    return (lo | (hi << 4)) - 32;
  }
};
struct IQ4_XS {
  static constexpr int kElems = 256, kBytes = 136, kGroup = 32;
  static constexpr bool kMin = false;
  __device__ static void group(const uint8_t* b, int g, float& mul, float& add) {
    const int lo = (b[4 + (g >> 1)] >> (4 * (g & 1))) & 15;
    const int hi = ((b[2] | (b[3] << 8)) >> (2 * g)) & 3;
    mul = f16_at(b) * static_cast<float>((lo | (hi << 4)) - 32);
    add = 0.0f;
  }
  __device__ static int code(const uint8_t* b, int e) {
    return iq4_level((b[8 + (e >> 5) * 16 + (e & 15)] >> (4 * ((e & 31) >> 4))) & 15);
  }
};

/// x = mul * code + add as one fused operation, so that the value does not depend on which
/// product a compiler chooses to fuse. The CPU reference's `d * sc * q - dmin * m`, contracted
/// by the host compiler where the CPU has FMA, is the same value; unfused, it differs by at most
/// one rounding of the product (2^-24 relative).
__device__ __forceinline__ float value(float mul, int code, float add) {
  return fmaf(mul, static_cast<float>(code), add);
}

}  // namespace sy::cuda::dq
#endif
