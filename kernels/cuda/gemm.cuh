// Matrix products of the Llama step through cuBLASLt: y = x W^T with W a row-major weight,
// bf16 (or f32) inputs, f32 accumulation and f32 output.
#pragma once

#include <cublasLt.h>

#include <map>
#include <tuple>

#include "kernels/cuda/common.cuh"

namespace sy::cuda {
/// Name of a cuBLAS status (cublasGetStatusString lives in libcublas, which we do not link).
inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS status (unnamed)";
  }
}
}  // namespace sy::cuda

/// Throws std::runtime_error naming file and line when a cuBLAS(Lt) call fails.
#define CUBLAS_CHECK(expr)                                                                       \
  do {                                                                                           \
    const cublasStatus_t sy_cublas_st_ = (expr);                                                 \
    if (sy_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                                \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) +          \
                               ": " #expr ": " + ::sy::cuda::cublas_status_name(sy_cublas_st_)); \
    }                                                                                            \
  } while (0)

namespace sy::cuda {

/// A cuBLASLt handle, its workspace and the chosen algorithm per problem shape. One per stream.
class Gemm {
 public:
  /// workspace_bytes: scratch cuBLASLt may use; more lets it pick split-K kernels.
  explicit Gemm(size_t workspace_bytes = size_t{32} << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  /// y[t * rows + r] = beta * y[t * rows + r] + sum_c w[r * cols + c] * x[t * cols + c]
  /// for t < n_tokens. T is float (pure f32 arithmetic) or bf16 (f32 accumulation).
  template <class T>
  cublasStatus_t run(const T* w, const T* x, int64_t rows, int64_t cols, int64_t n_tokens, float* y,
                     cudaStream_t stream, float beta = 0.0f);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
  };
  cublasStatus_t plan(bool bf16_in, int64_t rows, int64_t cols, int64_t n_tokens, Plan*& out);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<bool, int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace sy::cuda
