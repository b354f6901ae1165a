// The CPU kernel API: weight views over quantized rows, matrix products, the element-wise ops of
// a Llama step, quantization, and a small thread pool. No model knowledge lives here.
//
// Two implementations of every op: `sy::kernels::ref` (kernels/cpu/ref.cpp) is plain loops, the
// test oracle; `sy::kernels` (kernels/cpu/fast.cpp) is threaded and SIMD, checked against ref.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "kernels/ggml_type.hpp"

namespace sy::kernels {

/// Whether t is a type the CPU kernels compute with: F32, F16, BF16, Q8_0, Q4_0 and the types of
/// kernels/cpu/quants.hpp (a value read from a file may be anything). Other DTypes have names and
/// sizes (ggml_type.hpp) but no kernels: row_bytes and friends throw for them.
bool dtype_known(uint32_t t);

constexpr int kQK = 32;  ///< elements per Q8_0 / Q4_0 block

/// Q8_0 block: 32 int8 values and one f16 scale: x = d * q.
struct BlockQ8_0 {
  uint16_t d;  // f16 bits
  int8_t qs[kQK];
};
/// Q4_0 block: 32 4-bit values and one f16 scale: x = d * (q - 8); element j < 16 is the low
/// nibble of qs[j], element j + 16 the high nibble.
struct BlockQ4_0 {
  uint16_t d;  // f16 bits
  uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ8_0) == dtype_block_bytes(DType::Q8_0) &&
              sizeof(BlockQ4_0) == dtype_block_bytes(DType::Q4_0));

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  ///< round to nearest even
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  ///< round to nearest even

/// Bytes taken by a row of n elements: dtype_row_bytes, checked. Throws std::invalid_argument
/// naming the type when n is not a multiple of the block size or t has no kernels (dtype_known).
size_t row_bytes(DType t, int64_t n);

/// A row-major weight matrix of `rows` output features by `cols` input features, as stored in a
/// GGUF tensor with dims {cols, rows}. Row r starts at data + r * row_bytes(type, cols).
struct WeightView {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

/// Converts one row (n elements) of any dtype_known type to f32.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
/// Quantizes n floats (n a multiple of kQK) as llama.cpp's reference quantizers do.
void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n);
void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t n);
/// Converts n floats to `t` (any dtype_known type) into dst (row_bytes(t, n) bytes).
void quantize_row(DType t, const float* src, void* dst, int64_t n);

/// KV-cache rows (kv_rows.cpp): n values stored as F32, F16 or Q8_0 (n a multiple of kQK for
/// Q8_0), row_bytes(t, n) bytes each. Other types throw std::invalid_argument naming the type.
bool kv_type_ok(DType t);
/// The configuration's name of a KV type ("f32", "f16", "q8_0") and back; nullopt for any other.
const char* kv_type_name(DType t);
std::optional<DType> parse_kv_type(std::string_view name);
void kv_store_row(DType t, const float* src, void* dst, int64_t n);
void kv_load_row(DType t, const void* src, float* dst, int64_t n);
/// q . row, with row converted in registers.
float kv_dot(DType t, const float* q, const void* row, int64_t n);
/// y += a * row.
void kv_axpy(DType t, float a, const void* row, float* y, int64_t n);
/// Decode attention over `rows` cached rows that follow each other `stride` bytes apart (one run
/// of a block table), for a group of nq queries that share them (the query heads of one KV
/// head): s[h * s_stride + j] = scale * (q + h * q_stride) . row_j. Each row is read once for
/// the group, converted in registers.
void kv_scores(DType t, const float* q, int64_t q_stride, int nq, const void* k, int64_t stride,
               int64_t rows, int64_t n, float scale, float* s, int64_t s_stride);
/// The other half: (y + h * y_stride) += sum_j p[h * p_stride + j] * row_j for h < nq.
void kv_mix(DType t, const float* p, int64_t p_stride, int nq, const void* v, int64_t stride,
            int64_t rows, int64_t n, float* y, int64_t y_stride);

/// A fixed set of worker threads; parallel_for splits [0, n) into contiguous chunks (a few per
/// thread, so fn may run several times on one thread) that whichever thread is free claims, and
/// returns when all are done. The calling thread takes part. Not reentrant. `on_start`, where
/// given, runs first on each worker thread with its index (1 to n_threads - 1; the caller is 0).
class ThreadPool {
 public:
  explicit ThreadPool(int n_threads, std::function<void(int)> on_start = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int size() const { return n_threads_; }
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  struct Impl;
  Impl* impl_;
  int n_threads_;
};

// ---- fast path (threaded when pool != nullptr, SIMD) ----

/// y[t * w.rows + r] = dot(row r of w, x + t * w.cols) for t in [0, n_tokens).
/// For Q8_0/Q4_0 weights the activations are quantized to Q8_0 first (as llama.cpp does).
void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);
/// matmul of n matrices by the same x: ys[i] = x . ws[i]^T. Where they share a type and a width
/// (Q, K and V; gate and up), the activations are prepared (quantized) once and one pool
/// hand-off splits the rows of all of them; otherwise one matmul each.
void matmul_many(const WeightView* const* ws, float* const* ys, int n, const float* x,
                 int64_t n_tokens, ThreadPool* pool);
float dot(const float* a, const float* b, int64_t n);
/// y += a * x
void axpy(float a, const float* x, float* y, int64_t n);
/// out = x / rms(x) * w   (out may alias x)
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps);
/// In-place RoPE, llama.cpp's NORM layout (adjacent pairs (2i, 2i+1)) for every head of x
/// (n_heads * head_dim floats); only the first rope_dim dims of each head rotate.
void rope(float* x, int n_heads, int head_dim, int rope_dim, int pos, float theta_base);
/// In-place numerically stable softmax.
void softmax(float* x, int64_t n);
/// gate[i] = silu(gate[i]) * up[i]
void swiglu(float* gate, const float* up, int64_t n);

// ---- reference implementations (plain loops; the oracle for tests) ----
namespace ref {
void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y);
float dot(const float* a, const float* b, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);
void rmsnorm(float* out, const float* x, const float* w, int64_t n, float eps);
void rope(float* x, int n_heads, int head_dim, int rope_dim, int pos, float theta_base);
void softmax(float* x, int64_t n);
void swiglu(float* gate, const float* up, int64_t n);
}  // namespace ref

// ---- element-wise ops of the architectures beyond llama (kernels/cpu/ops.cpp) ----
// Each has a fast variant here and a plain-loop one in `ref`, as above.

/// How RoPE rotates one head: angle of dim pair i at position p is
/// freq_scale * p * theta_base^(-2i / rope_dim) / (freq_factors ? freq_factors[i] : 1).
/// neox = false: pairs (2i, 2i + 1) (llama.cpp's NORM); true: pairs (i, i + rope_dim / 2) (NEOX).
struct RopeSpec {
  int head_dim = 0;
  int rope_dim = 0;
  float theta_base = 10000.0f;
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // (rope_dim / 2) or nullptr
  bool neox = false;
};
/// In-place RoPE of every head of x (n_heads * head_dim floats) at position pos.
void rope_ext(float* x, int n_heads, const RopeSpec& r, int pos);
/// gate[i] = gelu_tanh(gate[i]) * up[i]   (GELU's tanh approximation)
void geglu(float* gate, const float* up, int64_t n);
/// x[i] = cap * tanh(x[i] / cap)
void softcap(float* x, int64_t n, float cap);
/// x[i] *= s
void scale(float* x, int64_t n, float s);
/// y[t * n + i] += b[i] for every row t < n_rows
void add_bias(float* y, const float* b, int64_t n_rows, int64_t n);
/// RMSNorm of each of the n_heads rows of head_dim floats of x, in place, with weight w (head_dim)
void rmsnorm_heads(float* x, int n_heads, int head_dim, const float* w, float eps);

namespace ref {
void rope_ext(float* x, int n_heads, const RopeSpec& r, int pos);
void geglu(float* gate, const float* up, int64_t n);
void softcap(float* x, int64_t n, float cap);
void scale(float* x, int64_t n, float s);
void add_bias(float* y, const float* b, int64_t n_rows, int64_t n);
void rmsnorm_heads(float* x, int n_heads, int head_dim, const float* w, float eps);
}  // namespace ref

}  // namespace sy::kernels
