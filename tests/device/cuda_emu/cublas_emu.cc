// cublas_emu: the few cuBLAS calls weft-train makes (train_gpt_kernels.cu),
// as a library it loads in place of cuBLAS under -Ddevice_emulate=true,
// so that the call as written for cuBLAS (its column-major operands, its
// leading dimensions, its strides) is checked without a GPU. The product is
// cuBLAS's definition, computed plainly on the host as an operation of the
// caller's stream (cudaLaunchHostFunc on cuda_emu's runtime, which the
// program that loads this library holds).
//
// C[b] = alpha op(A[b]) op(B[b]) + beta C[b] for b < batch, column-major:
// X[i + j ld], op(X) = X or its transpose, A[b] = A + b strideA, ...; with
// beta 0, C is not read, with alpha 0 neither A nor B; CUBLAS_OP_C is the
// transpose (real data). Arguments cuBLAS refuses are refused here with
// CUBLAS_STATUS_INVALID_VALUE. WEFT_CUDA_EMU_CUBLAS=0 makes cublasCreate
// fail, as where the library cannot start.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <new>

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

struct Gemm {
  bool ta, tb, own; // own: freed after its run (not under a graph, which may replay it)
  int m, n, k;
  float alpha, beta;
  const float *a, *b;
  float *c;
  int lda, ldb, ldc;
  long long sa, sb, sc;
  int batch;
};

void run_gemm(void *arg) {
  const Gemm *g = static_cast<const Gemm *>(arg);
  for (int bt = 0; bt < g->batch; bt++) {
    const float *a = g->a + bt * g->sa, *b = g->b + bt * g->sb;
    float *c = g->c + bt * g->sc;
    for (int j = 0; j < g->n; j++)
      for (int i = 0; i < g->m; i++) {
        double acc = 0;
        for (int l = 0; g->alpha != 0.0f && l < g->k; l++) {
          const float x = g->ta ? a[l + (long long)i * g->lda] : a[i + (long long)l * g->lda];
          const float y = g->tb ? b[j + (long long)l * g->ldb] : b[l + (long long)j * g->ldb];
          acc += (double)x * y;
        }
        float &out = c[i + (long long)j * g->ldc];
        const float prod = g->alpha * (float)acc;
        out = g->beta == 0.0f ? prod : prod + g->beta * out;
      }
  }
  if (g->own) delete g;
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  const char *on = getenv("WEFT_CUDA_EMU_CUBLAS");
  if (on != nullptr && strcmp(on, "0") == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new (std::nothrow) cublasContext;
  return *handle != nullptr ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  // fp32 in fp32 only: what weft-train asks for
  return mode == CUBLAS_DEFAULT_MATH ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb,
                                         long long strideB, const float *beta, float *C, int ldc,
                                         long long strideC, int batchCount) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const auto known = [](cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!known(transa) || !known(transb) || m < 0 || n < 0 || k < 0 ||
      batchCount < 0 || alpha == nullptr || beta == nullptr ||
      lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(handle->stream, &capture) != cudaSuccess)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  Gemm *g = new (std::nothrow)
      Gemm{ta, tb, capture == cudaStreamCaptureStatusNone, m, n, k, *alpha, *beta, A, B, C, lda,
           ldb, ldc, strideA, strideB, strideC, batchCount};
  if (g == nullptr) return CUBLAS_STATUS_ALLOC_FAILED;
  if (cudaLaunchHostFunc(handle->stream, run_gemm, g) != cudaSuccess) {
    delete g;
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
  case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
  case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
  default: return "an unknown cuBLAS status";
  }
}

} // extern "C"
