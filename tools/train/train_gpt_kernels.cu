// The transformer's kernels on a GPU (--device cuda): each body of
// train_gpt_kern.h launched as one thread per index on the model's stream;
// matrix products through cuBLAS where the build found it (TRAIN_CUBLAS,
// fp32 without TF32), else gk_gemm as a kernel of its own. Built with
// -fmad=false, as the host's loops round.
#include <cuda_runtime.h>

#ifdef TRAIN_CUBLAS
#include <cublas_v2.h>
#endif

#include "train_device.h"
#include "train_gpt_kern.h"
#include "train_launch.cuh"

namespace {

#define CUDA_KERNEL(name, params, args)                                      \
  __global__ void name##_kernel(size_t total, GK_UNPAREN params) {          \
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                \
    if (k < total) gk_##name(k, GK_UNPAREN args);                            \
  }                                                                          \
  int cuda_##name(void *stream, size_t total, GK_UNPAREN params) {           \
    return train_launch(name##_kernel, total, stream, total, GK_UNPAREN args); \
  }
GK_KERNELS(CUDA_KERNEL)
#undef CUDA_KERNEL

// cuBLAS's statuses are told from the runtime's errors by this offset.
constexpr int kBlasError = 100000;

#ifdef TRAIN_CUBLAS
// One handle for the process (a rank drives one GPU), made at the first
// product; its stream is set at each.
cublasHandle_t blas_handle(int *err) {
  static cublasHandle_t handle = nullptr;
  if (handle == nullptr) {
    cublasStatus_t st = cublasCreate(&handle);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
    if (st != CUBLAS_STATUS_SUCCESS) {
      *err = kBlasError + (int)st;
      handle = nullptr;
    }
  }
  return handle;
}

// Row-major C = alpha op(A) op(B) + beta C is column-major C^T = alpha
// op(B)^T op(A)^T + beta C^T: the same arrays, the operands swapped.
int cuda_gemm_batched(void *stream, int ta, int tb, int m, int n, int kk, float alpha,
                      const float *a, int lda, long sa, const float *b, int ldb, long sb,
                      float beta, float *c, int ldc, long sc, int batch) {
  if (batch == 0 || m == 0 || n == 0) return 0;
  int err = 0;
  cublasHandle_t h = blas_handle(&err);
  if (h == nullptr) return err;
  cublasStatus_t st = cublasSetStream(h, (cudaStream_t)stream);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasSgemmStridedBatched(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   n, m, kk, &alpha, b, ldb, sb, a, lda, sa, &beta, c, ldc, sc,
                                   batch);
  return st == CUBLAS_STATUS_SUCCESS ? 0 : kBlasError + (int)st;
}
#else
int cuda_gemm_batched(void *stream, int ta, int tb, int m, int n, int kk, float alpha,
                      const float *a, int lda, long sa, const float *b, int ldb, long sb,
                      float beta, float *c, int ldc, long sc, int batch) {
  return cuda_gemm(stream, (size_t)batch * m * n, ta, tb, m, n, kk, alpha, a, lda, sa, b, ldb, sb,
                   beta, c, ldc, sc);
}
#endif

int dtype_kind(weftDataType_t t) { return t == weftBfloat16 ? 1 : t == weftFloat16 ? 2 : 0; }

int cuda_to_float(void *stream, const void *src, weftDataType_t dtype, float *dst, size_t count) {
  return train_kern_to_float(src, dtype_kind(dtype), dst, count, stream);
}

int cuda_accumulate(void *stream, void *dst, weftDataType_t dtype, const float *src, size_t count) {
  return train_kern_accumulate(dst, dtype_kind(dtype), src, count, stream);
}

// After the stream's earlier work, complete on return.
int cuda_copy(void *stream, void *dst, const void *src, size_t bytes) {
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream);
  return (int)(err == cudaSuccess ? cudaStreamSynchronize((cudaStream_t)stream) : err);
}

int cuda_alloc(void **out, size_t bytes) { return (int)cudaMalloc(out, bytes > 0 ? bytes : 1); }

void cuda_free(void *p) {
  if (p != nullptr) cudaFree(p);
}

const char *cuda_error_string(int err) {
  if (err >= kBlasError) {
#ifdef TRAIN_CUBLAS
    return cublasGetStatusString((cublasStatus_t)(err - kBlasError));
#else
    return "cuBLAS error";
#endif
  }
  return cudaGetErrorString((cudaError_t)err);
}

gk_table make_table() {
  gk_table t = {};
  t.name = "cuda";
#define CUDA_ENTRY(name, params, args) t.name = cuda_##name;
  GK_KERNELS(CUDA_ENTRY)
#undef CUDA_ENTRY
  t.gemm_batched = cuda_gemm_batched;
  t.to_float = cuda_to_float;
  t.accumulate = cuda_accumulate;
  t.copy = cuda_copy;
  t.alloc = cuda_alloc;
  t.free = cuda_free;
  t.error_string = cuda_error_string;
#ifdef TRAIN_CUBLAS
  t.gemm_name = "cuBLAS";
#else
  t.gemm_name = "weft's kernel";
#endif
  return t;
}

}  // namespace

extern "C" const struct gk_table *gk_cuda_table(void) {
  static const gk_table table = make_table();
  return &table;
}
