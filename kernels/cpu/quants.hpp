// The block-quantized weight types beyond Q8_0 and Q4_0 (ggml's block layouts): one table of
// per-type operations that row_bytes, dequantize_row, quantize_row and both matmuls dispatch to.
//
// Legacy types (Q4_1, Q5_0, Q5_1, IQ4_NL) live in kernels/cpu/quants_legacy.cpp, the K-quants
// (Q2_K..Q6_K, IQ4_XS) in kernels/cpu/quants_k.cpp; each file fills in its own TypeOps.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/kernels.hpp"

namespace sy::kernels::quant {

/// Tokens TypeOps::vec_dot_4 takes at once.
constexpr int kDotTokens = 4;

/// How a type's fast dot product wants the activations quantized (llama.cpp's vec_dot_type):
/// once per token per matmul into act_bytes(n) bytes, then reused by every weight row.
struct TypeOps {
  DType type;  // its block size: dtype_block_elems and dtype_block_bytes (ggml_type.hpp)
  /// Plain-loop conversion of n elements (n a multiple of the block size) to f32; the reference.
  void (*dequantize)(const void* src, float* dst, int64_t n);
  /// Own quantizer writing ggml's layout (files load in llama.cpp); nullptr where there is none.
  void (*quantize)(const float* src, void* dst, int64_t n);
  /// Bytes of one token's quantized activations for rows of n elements.
  size_t (*act_bytes)(int64_t n);
  /// Quantizes one token's n activations into dst (act_bytes(n) bytes, 64-byte aligned).
  void (*quantize_act)(const float* x, void* dst, int64_t n);
  /// Dot product of one weight row (n elements) with one token's quantized activations; SIMD
  /// where the CPU has it (AVX2, AVX-512), no allocation.
  float (*vec_dot)(const void* w_row, const void* act, int64_t n);
  /// The same for kDotTokens tokens whose activations lie `act_stride` bytes apart, unpacking the
  /// weight row once (prefill); each out[t] equals vec_dot's for token t. nullptr: none.
  void (*vec_dot_4)(const void* w_row, const void* act, size_t act_stride, float* out, int64_t n);
};

/// The operations of t, or nullptr when t is not one of the types this header covers.
const TypeOps* ops(DType t);

/// Filled in by quants_legacy.cpp and quants_k.cpp: nullptr for a type the file does not hold.
const TypeOps* legacy_ops(DType t);
const TypeOps* k_ops(DType t);
/// k_ops with a chosen dot-product implementation, so tests can hold every compiled SIMD path
/// to the portable one: isa 0 portable, 1 AVX2, 2 AVX-512; nullptr where this build lacks it.
const TypeOps* k_ops_isa(DType t, int isa);

/// Token count from which matmul_panel takes Q4_K, Q5_K and Q6_K weights (half a panel: Q4_K_M
/// decode at batch 8, 315-435 -> 399-430 tokens/s, at batch 12 437-467 -> 633-743).
constexpr int64_t kPanelMinTokens = 8;
/// Many tokens by a Q4_K, Q5_K or Q6_K weight with the tokens-in-lanes VNNI kernel; false, and
/// nothing done, for another type, fewer than kPanelMinTokens tokens or a build without VNNI.
bool matmul_panel(const WeightView& w, const float* x, int64_t n_tokens, float* y,
                  ThreadPool* pool);
/// matmul_panel of n matrices of one type and width by the same x (ys[i] = x . ws[i]^T): the
/// panels are packed once and one hand-off splits the rows of all of them.
bool matmul_panel_many(const WeightView* const* ws, float* const* ys, int n, const float* x,
                       int64_t n_tokens, ThreadPool* pool);

/// y[t * w.rows + r] = dot(row r, x + t * w.cols) for a weight of a type with ops(): activations
/// quantized once per token, rows split over the pool.
void matmul(const TypeOps& o, const WeightView& w, const float* x, int64_t n_tokens, float* y,
            ThreadPool* pool);
/// matmul of n matrices of type o.type and one width by the same x: the activations are
/// quantized once and one hand-off splits the rows of all of them (Q, K and V; gate and up).
void matmul_many(const TypeOps& o, const WeightView* const* ws, float* const* ys, int n,
                 const float* x, int64_t n_tokens, ThreadPool* pool);

}  // namespace sy::kernels::quant
