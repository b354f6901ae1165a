// Matrix-vector products straight from quantized weights (every quantized type convert_rows
// reads, dequantized in registers), for decode steps of quantized models that keep their weights
// quantized on the device.
#pragma once

#include "kernels/cuda/convert.cuh"

namespace sy::cuda {

/// Most activation rows gemv_q takes in one launch: past a handful, dequantizing to bf16 and a
/// tensor-core product is faster.
constexpr int kGemvMaxTokens = 8;

/// Whether gemv_q reads `type`: every quantized type convert_rows reads (not F32, F16 or BF16).
constexpr bool gemv_q_supports(kernels::DType type) {
  return convert_supports(type) && kernels::dtype_block_elems(type) > 1;
}

/// y[t * ldy + r] = sum_c W[r, c] * x[t * cols + c] for t < n_tokens (<= kGemvMaxTokens) and
/// r < rows; W (rows, cols) in `type` (gemv_q_supports) row-major blocks, cols a multiple of
/// kernels::dtype_block_elems(type); x and y f32, x 16-byte aligned (else
/// cudaErrorInvalidValue). ldy 0 means rows; a larger ldy lets the parts of a fused matrix stored
/// in different types write their rows of one output.
cudaError_t gemv_q(kernels::DType type, const void* w, int64_t rows, int64_t cols, const float* x,
                   int n_tokens, float* y, cudaStream_t stream, int64_t ldy = 0);

}  // namespace sy::cuda
