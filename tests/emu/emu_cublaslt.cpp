// CUDA emulator: cuBLASLt matmul D = alpha op(A) op(B) + beta C over column-major layouts, with
// the shape checks cuBLASLt makes (a wrong layout or transpose fails here as it would there).
#include <cstdio>
#include <cstring>

#include "cublasLt.h"
#include "cuda_bf16.h"
#include "emu_internal.hpp"

namespace sy_emu {
struct LtHandle {
  int unused = 0;
};
struct LtDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
};
struct LtLayout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct LtPref {
  uint64_t workspace = 0;
};
}  // namespace sy_emu

using namespace sy_emu;

namespace {

size_t type_size(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : 2;
}
float load(const void* base, cudaDataType_t t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}
// Bytes a column-major matrix spans.
size_t span(const LtLayout& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return (static_cast<size_t>(l.ld) * (l.cols - 1) + l.rows) * type_size(l.type);
}

cublasStatus_t check_shapes(const LtDesc* d, const LtLayout* a, const LtLayout* b,
                            const LtLayout* c, const LtLayout* dl) {
  if (!d || !a || !b || !c || !dl) return CUBLAS_STATUS_INVALID_VALUE;
  const uint64_t m = dl->rows, n = dl->cols;
  const uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols;
  const uint64_t ak = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
  const uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols;
  const uint64_t bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
  for (const LtLayout* l : {a, b, c, dl}) {
    if (l->ld < static_cast<int64_t>(l->rows)) return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (am != m || bn != n || ak != bk || c->rows != m || c->cols != n) {
    std::fprintf(
        stderr,
        "cuBLASLt emulator: op(A) is %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu: "
        "shapes do not chain\n",
        static_cast<unsigned long long>(am), static_cast<unsigned long long>(ak),
        static_cast<unsigned long long>(bk), static_cast<unsigned long long>(bn),
        static_cast<unsigned long long>(c->rows), static_cast<unsigned long long>(c->cols),
        static_cast<unsigned long long>(m), static_cast<unsigned long long>(n));
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  // What Switchyard asks for: bf16 or f32 inputs of one type, f32 output, f32 compute.
  if (a->type != b->type || (a->type != CUDA_R_32F && a->type != CUDA_R_16BF) ||
      c->type != CUDA_R_32F || dl->type != CUDA_R_32F || d->compute != CUBLAS_COMPUTE_32F ||
      d->scale != CUDA_R_32F) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new LtHandle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  *d = new LtDesc{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t bytes) {
  if (!d || !buf || bytes != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
  cublasOperation_t op;
  std::memcpy(&op, buf, sizeof op);
  if (op == CUBLAS_OP_C) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA) {
    d->ta = op;
  } else if (attr == CUBLASLT_MATMUL_DESC_TRANSB) {
    d->tb = op;
  } else {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  *l = new LtLayout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new LtPref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
  if (!p || !buf || attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || bytes != sizeof(uint64_t)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::memcpy(&p->workspace, buf, sizeof(uint64_t));
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  if (!h || !pref || requested < 1 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t st = check_shapes(d, a, b, c, dl);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t*, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  std::lock_guard<std::recursive_mutex> lock(lock_api());
  if (!h || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  const cublasStatus_t st = check_shapes(d, a, b, c, dl);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  if (!is_device_range(A, span(*a)) || !is_device_range(B, span(*b)) ||
      !is_device_range(D, span(*dl)) || (be != 0.0f && !is_device_range(C, span(*c))) ||
      (workspace_bytes > 0 && !is_device_range(workspace, workspace_bytes))) {
    std::fprintf(stderr,
                 "cuBLASLt emulator: a matrix or the workspace is not inside device memory\n");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const LtDesc dd = *d;
  const LtLayout la = *a, lb = *b, lc = *c, ld = *dl;
  submit_fn(stream, [=] {
    const uint64_t m = ld.rows, n = ld.cols;
    const uint64_t k = dd.ta == CUBLAS_OP_N ? la.cols : la.rows;
    for (uint64_t j = 0; j < n; ++j) {
      for (uint64_t i = 0; i < m; ++i) {
        float s = 0.0f;
        for (uint64_t l = 0; l < k; ++l) {
          const size_t ia = dd.ta == CUBLAS_OP_N ? i + l * la.ld : l + i * la.ld;
          const size_t ib = dd.tb == CUBLAS_OP_N ? l + j * lb.ld : j + l * lb.ld;
          s += load(A, la.type, ia) * load(B, lb.type, ib);
        }
        float out = al * s;
        // With beta 0, C is not read (it may hold anything, NaN included), as in cuBLAS.
        if (be != 0.0f) out += be * static_cast<const float*>(C)[i + j * lc.ld];
        static_cast<float*>(D)[i + j * ld.ld] = out;
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
