// ggml's tensor element types, numbered as in GGUF files, and the facts that are pure numbering:
// names and block sizes. No dependencies, so the GGUF reader, the CPU kernels and the CUDA code
// (under nvcc and under the CPU emulator) share this one definition.
#pragma once

#include <cstdint>

namespace sy::kernels {

/// Every tensor element type of ggml (its numbering, as in GGUF files), whether or not a kernel
/// computes with it: the reader sizes all of them, so a loader can name the type it refuses.
/// Numbers ggml has retired (4, 5, 31-33, 36-38) are not members. Which types what can handle is
/// a function, not another enum: dtype_known (CPU kernels, kernels/cpu/kernels.hpp),
/// gguf::type_known (the reader sizes it), cuda::convert_supports (the CUDA converter).
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
};

namespace ggml_detail {

// One ggml type number: its name, elements and bytes per block (ggml-common.h's block structs).
// Retired numbers keep their name with zero sizes, so a file holding one is refused by name.
struct TypeRow {
  const char* name;
  int64_t elems;
  int64_t bytes;
};
inline constexpr TypeRow kTypes[] = {
    {"F32", 1, 4},         // 0
    {"F16", 1, 2},         // 1
    {"Q4_0", 32, 18},      // 2: f16 d, 16 bytes of nibbles
    {"Q4_1", 32, 20},      // 3: f16 d, f16 m, 16 bytes of nibbles
    {"Q4_2", 0, 0},        // 4: retired
    {"Q4_3", 0, 0},        // 5: retired
    {"Q5_0", 32, 22},      // 6: f16 d, 4 bytes of fifth bits, 16 bytes of nibbles
    {"Q5_1", 32, 24},      // 7: f16 d, f16 m, fifth bits, nibbles
    {"Q8_0", 32, 34},      // 8: f16 d, 32 int8
    {"Q8_1", 32, 36},      // 9: f16 d, f16 s, 32 int8
    {"Q2_K", 256, 84},     // 10: 16 scale bytes, 64 bytes of 2-bit codes, f16 d, f16 dmin
    {"Q3_K", 256, 110},    // 11: 32 bytes high bits, 64 bytes 2-bit codes, 12 scale bytes, f16 d
    {"Q4_K", 256, 144},    // 12: f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles
    {"Q5_K", 256, 176},    // 13: as Q4_K plus 32 bytes of fifth bits
    {"Q6_K", 256, 210},    // 14: 128 bytes low nibbles, 64 bytes high bits, 16 int8 scales, f16 d
    {"Q8_K", 256, 292},    // 15: f32 d, 256 int8, 16 int16 block sums
    {"IQ2_XXS", 256, 66},  // 16: f16 d, 32 uint16
    {"IQ2_XS", 256, 74},   // 17: f16 d, 32 uint16, 8 scale bytes
    {"IQ3_XXS", 256, 98},  // 18: f16 d, 96 bytes
    {"IQ1_S", 256, 50},    // 19: f16 d, 32 bytes, 8 uint16
    {"IQ4_NL", 32, 18},    // 20: f16 d, 16 bytes of codebook indices
    {"IQ3_S", 256, 110},   // 21: f16 d, 64 + 8 + 32 + 4 bytes
    {"IQ2_S", 256, 82},    // 22: f16 d, 64 + 8 + 8 bytes
    {"IQ4_XS", 256, 136},  // 23: f16 d, uint16 high scale bits, 4 low scale bytes, 128 bytes
    {"I8", 1, 1},          // 24
    {"I16", 1, 2},         // 25
    {"I32", 1, 4},         // 26
    {"I64", 1, 8},         // 27
    {"F64", 1, 8},         // 28
    {"IQ1_M", 256, 56},    // 29: 32 + 16 + 8 bytes
    {"BF16", 1, 2},        // 30
    {"Q4_0_4_4", 0, 0},    // 31: retired (repacked at load time by ggml now)
    {"Q4_0_4_8", 0, 0},    // 32: retired
    {"Q4_0_8_8", 0, 0},    // 33: retired
    {"TQ1_0", 256, 54},    // 34: 48 + 4 bytes of ternary codes, f16 d
    {"TQ2_0", 256, 66},    // 35: 64 bytes of 2-bit codes, f16 d
    {"IQ4_NL_4_4", 0, 0},  // 36: retired
    {"IQ4_NL_4_8", 0, 0},  // 37: retired
    {"IQ4_NL_8_8", 0, 0},  // 38: retired
    {"MXFP4", 32, 17},     // 39: e8m0 shared exponent, 16 bytes of fp4 codes
};
inline constexpr uint32_t kNumTypes = sizeof(kTypes) / sizeof(kTypes[0]);

constexpr const TypeRow* row(DType t) {
  const auto u = static_cast<uint32_t>(t);
  return u < kNumTypes ? &kTypes[u] : nullptr;
}

}  // namespace ggml_detail

/// ggml's name of a type as its enum spells it ("F32", "Q8_0", "Q6_K", "IQ4_XS"); retired
/// numbers give their old name ("Q4_2"); nullptr for a number ggml never had.
constexpr const char* dtype_name(DType t) {
  const ggml_detail::TypeRow* r = ggml_detail::row(t);
  return r ? r->name : nullptr;
}
/// Elements per block: 1 for float and integer types, 32 or 256 for block types; 1 for a number
/// that is not a member.
constexpr int64_t dtype_block_elems(DType t) {
  const ggml_detail::TypeRow* r = ggml_detail::row(t);
  return r && r->elems > 0 ? r->elems : 1;
}
/// Bytes per block as in ggml-common.h (F32 4, Q8_0 34, Q6_K 210, ...); 0 for a number that is
/// not a member.
constexpr int64_t dtype_block_bytes(DType t) {
  const ggml_detail::TypeRow* r = ggml_detail::row(t);
  return r ? r->bytes : 0;
}
/// Bytes of n elements of t (n a multiple of dtype_block_elems(t); not checked, see row_bytes in
/// kernels/cpu/kernels.hpp for the checked form); 0 for a number that is not a member.
constexpr int64_t dtype_row_bytes(DType t, int64_t n) {
  return n / dtype_block_elems(t) * dtype_block_bytes(t);
}

}  // namespace sy::kernels
