// Dispatch for the block-quantized types of quants.hpp: which types have kernels, the per-type
// table, and the generic matmul (activations quantized once per token, weight rows split over
// the pool).
#include "kernels/cpu/quants.hpp"

#include <algorithm>

#include "kernels/cpu/matmul_parts.hpp"

namespace sy::kernels {

bool dtype_known(uint32_t t) {
  const auto d = static_cast<DType>(t);
  switch (d) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q8_0:
      return true;
    default:
      return quant::ops(d) != nullptr;
  }
}

namespace quant {
namespace {

// Rows per task: enough work per hand-off that waking a worker pays, few enough that two
// threads share a small matrix evenly.
constexpr int64_t kRowsPerTask = 16;

thread_local Scratch t_act;  // quantized activations of the calling thread's matmul

}  // namespace

const TypeOps* ops(DType t) {
  if (const TypeOps* o = legacy_ops(t)) return o;
  return k_ops(t);
}

void matmul_many(const TypeOps& o, const WeightView* const* ws, float* const* ys, int n,
                 const float* x, int64_t n_tokens, ThreadPool* pool) {
  if (n <= 0 || n_tokens <= 0) return;
  const int64_t cols = ws[0]->cols;
  int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    (void)row_bytes(ws[i]->type, ws[i]->cols);  // rejects a column count that is not whole blocks
    total += ws[i]->rows;
  }
  if (total <= 0) return;
  if (matmul_panel_many(ws, ys, n, x, n_tokens, pool)) return;
  const size_t rb = row_bytes(ws[0]->type, cols);
  const size_t xs = (o.act_bytes(cols) + 63) & ~size_t{63};
  uint8_t* xq = t_act.get(xs * static_cast<size_t>(n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t) o.quantize_act(x + t * cols, xq + t * xs, cols);
  auto body = [&](int64_t g0, int64_t g1) {
    stacked_pieces(ws, n, g0 * kRowsPerTask, std::min(total, g1 * kRowsPerTask),
                   [&](int i, int64_t r0, int64_t r1) {
                     const WeightView& w = *ws[i];
                     const auto* base = static_cast<const uint8_t*>(w.data);
                     float* y = ys[i];
                     float four[kDotTokens];
                     for (int64_t r = r0; r < r1; ++r) {
                       const uint8_t* row = base + static_cast<size_t>(r) * rb;
                       int64_t t = 0;
                       if (o.vec_dot_4) {
                         for (; t + kDotTokens <= n_tokens; t += kDotTokens) {
                           o.vec_dot_4(row, xq + t * xs, xs, four, cols);
                           for (int k = 0; k < kDotTokens; ++k) y[(t + k) * w.rows + r] = four[k];
                         }
                       }
                       for (; t < n_tokens; ++t)
                         y[t * w.rows + r] = o.vec_dot(row, xq + t * xs, cols);
                     }
                   });
  };
  run(pool, (total + kRowsPerTask - 1) / kRowsPerTask, body);
}

void matmul(const TypeOps& o, const WeightView& w, const float* x, int64_t n_tokens, float* y,
            ThreadPool* pool) {
  const WeightView* ws[1] = {&w};
  float* ys[1] = {y};
  matmul_many(o, ws, ys, 1, x, n_tokens, pool);
}

}  // namespace quant
}  // namespace sy::kernels
