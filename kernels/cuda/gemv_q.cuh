// Matrix-vector products straight from Q8_0 / Q4_0 weights (dequantized in registers), for
// decode steps of quantized models that keep their weights quantized on the device.
#pragma once

#include "kernels/cuda/convert.cuh"

namespace sy::cuda {

/// Most activation rows gemv_q takes in one launch: past a handful, dequantizing to bf16 and a
/// tensor-core product is faster.
constexpr int kGemvMaxTokens = 8;

/// y[t * rows + r] = sum_c W[r, c] * x[t * cols + c] for t < n_tokens (<= kGemvMaxTokens);
/// W (rows, cols) in `type` (Q8_0 or Q4_0) row-major blocks; x and y f32.
cudaError_t gemv_q(SrcType type, const void* w, int64_t rows, int64_t cols, const float* x,
                   int n_tokens, float* y, cudaStream_t stream);

}  // namespace sy::cuda
