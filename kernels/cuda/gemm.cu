// cuBLASLt wrapper: the row-major product y = x W^T is the column-major "TN" product
// D (rows x n) = op_T(A (cols x rows)) B (cols x n), so no data is transposed.
#include <type_traits>

#include "kernels/cuda/gemm.cuh"

namespace sy::cuda {

Gemm::Gemm(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  const cudaError_t e = cudaMalloc(&workspace_, workspace_bytes_);
  if (e != cudaSuccess) {
    cublasLtDestroy(handle_);
    throw cuda_error(e, "cudaMalloc(cuBLASLt workspace)", __FILE__, __LINE__);
  }
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

cublasStatus_t Gemm::plan(bool bf16_in, int64_t rows, int64_t cols, int64_t n, Plan*& out) {
  const auto key = std::make_tuple(bf16_in, rows, cols, n);
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    out = &it->second;
    return CUBLAS_STATUS_SUCCESS;
  }
  Plan p;
  const cudaDataType_t in = bf16_in ? CUDA_R_16BF : CUDA_R_32F;
  cublasStatus_t st = cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  }
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p.a, in, cols, rows, cols);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p.b, in, cols, n, cols);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, rows, n, rows);
  cublasLtMatmulPreference_t pref = nullptr;
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceCreate(&pref);
  if (st == CUBLAS_STATUS_SUCCESS) {
    const uint64_t ws = workspace_bytes_;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof(ws));
  }
  if (st == CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) {
      p.algo = res.algo;
      p.has_algo = true;
    }
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    return st;
  }
  out = &plans_.emplace(key, p).first->second;
  return CUBLAS_STATUS_SUCCESS;
}

template <class T>
cublasStatus_t Gemm::run(const T* w, const T* x, int64_t rows, int64_t cols, int64_t n_tokens,
                         float* y, cudaStream_t stream, float beta) {
  if (rows <= 0 || n_tokens <= 0) return CUBLAS_STATUS_SUCCESS;
  Plan* p = nullptr;
  const cublasStatus_t st = plan(std::is_same_v<T, bf16>, rows, cols, n_tokens, p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const float alpha = 1.0f;
  return cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c,
                        &p->algo, workspace_, workspace_bytes_, stream);
}

template cublasStatus_t Gemm::run<float>(const float*, const float*, int64_t, int64_t, int64_t,
                                         float*, cudaStream_t, float);
template cublasStatus_t Gemm::run<bf16>(const bf16*, const bf16*, int64_t, int64_t, int64_t, float*,
                                        cudaStream_t, float);

}  // namespace sy::cuda
