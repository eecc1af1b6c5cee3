// The transformer's kernels on a GPU (--device cuda): each body of
// train_gpt_kern.h launched as one thread per index on the model's stream;
// matrix products through cuBLAS where the build found its header
// (TRAIN_CUBLAS) and the library loads (fp32 without TF32), else gk_gemm as
// a kernel of its own. Built with
// -fmad=false, as the host's loops round.
#include <cuda_runtime.h>

#ifdef TRAIN_CUBLAS
#include <cublas_v2.h>
#include <dlfcn.h>
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
  TRAIN_KERNEL_APART(name##_kernel);                                         \
  int cuda_##name(void *stream, size_t total, GK_UNPAREN params) {           \
    return train_launch(name##_kernel, total, stream, total, GK_UNPAREN args); \
  }
GK_KERNELS(CUDA_KERNEL)
#undef CUDA_KERNEL

// cuBLAS's statuses are told from the runtime's errors by this offset.
constexpr int kBlasError = 100000;

#ifdef TRAIN_CUBLAS
// cuBLAS, loaded at the first product (dlopen), so that weft-train starts
// where the library is not on the loader's path: the products then run as
// gk_gemm's kernel, and the header line says which did them.
struct blas_lib {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetMathMode) set_math;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemmStridedBatched) gemm;
  decltype(&cublasGetStatusString) status_string;
  cublasHandle_t handle;
};

#define TRAIN_STR2(x) #x
#define TRAIN_STR(x) TRAIN_STR2(x)

// The loaded library with a handle (a rank drives one GPU), or NULL where
// it cannot be loaded or set up; tried once.
const blas_lib *blas() {
  static blas_lib lib;
  static int state = 0; // 0: not tried, 1: loaded, -1: none
  if (state != 0) return state > 0 ? &lib : nullptr;
  state = -1;
#ifdef TRAIN_CUBLAS_PATH // the host build's stand-in (tests/device/cuda_emu/cublas_emu.cc)
  void *h = dlopen(TRAIN_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
#else
  const char *soname = "libcublas.so." TRAIN_STR(CUBLAS_VER_MAJOR);
  void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
#ifdef TRAIN_CUBLAS_DIR
  if (h == nullptr) h = dlopen(TRAIN_CUBLAS_DIR "/libcublas.so." TRAIN_STR(CUBLAS_VER_MAJOR),
                               RTLD_NOW | RTLD_LOCAL);
#endif
#endif
  if (h == nullptr) return nullptr;
  lib.create = (decltype(lib.create))dlsym(h, "cublasCreate_v2");
  lib.set_math = (decltype(lib.set_math))dlsym(h, "cublasSetMathMode");
  lib.set_stream = (decltype(lib.set_stream))dlsym(h, "cublasSetStream_v2");
  lib.gemm = (decltype(lib.gemm))dlsym(h, "cublasSgemmStridedBatched");
  lib.status_string = (decltype(lib.status_string))dlsym(h, "cublasGetStatusString");
  if (lib.create == nullptr || lib.set_math == nullptr || lib.set_stream == nullptr ||
      lib.gemm == nullptr || lib.status_string == nullptr)
    return nullptr;
  // fp32 products in fp32: no TF32
  if (lib.create(&lib.handle) != CUBLAS_STATUS_SUCCESS ||
      lib.set_math(lib.handle, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)
    return nullptr;
  state = 1;
  return &lib;
}
#endif

// Row-major C = alpha op(A) op(B) + beta C is column-major C^T = alpha
// op(B)^T op(A)^T + beta C^T: the same arrays, the operands swapped.
int cuda_gemm_batched(void *stream, int ta, int tb, int m, int n, int kk, float alpha,
                      const float *a, int lda, long sa, const float *b, int ldb, long sb,
                      float beta, float *c, int ldc, long sc, int batch) {
  if (batch == 0 || m == 0 || n == 0) return 0;
#ifdef TRAIN_CUBLAS
  if (const blas_lib *lib = blas()) {
    cublasStatus_t st = lib->set_stream(lib->handle, (cudaStream_t)stream);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = lib->gemm(lib->handle, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n,
                     m, kk, &alpha, b, ldb, sb, a, lda, sa, &beta, c, ldc, sc, batch);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : kBlasError + (int)st;
  }
#endif
  return cuda_gemm(stream, (size_t)batch * m * n, ta, tb, m, n, kk, alpha, a, lda, sa, b, ldb, sb,
                   beta, c, ldc, sc);
}

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
    if (const blas_lib *lib = blas()) return lib->status_string((cublasStatus_t)(err - kBlasError));
#endif
    return "a cuBLAS error";
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
  t.gemm_name = "weft's kernel";
#ifdef TRAIN_CUBLAS
  if (blas() != nullptr) t.gemm_name = "cuBLAS";
#endif
  return t;
}

}  // namespace

extern "C" const struct gk_table *gk_cuda_table(void) {
  static const gk_table table = make_table();
  return &table;
}
