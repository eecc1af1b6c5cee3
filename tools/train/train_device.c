/* weft-train's CUDA side: see train_device.h. */
#include "train_device.h"

#include <stdio.h>

#ifdef TRAIN_CUDA
#include <cuda_runtime.h>

static weftResult_t dev_check(cudaError_t err, const char *what) {
  if (err == cudaSuccess) return weftSuccess;
  fprintf(stderr, "weft-train: %s: %s\n", what, cudaGetErrorString(err));
  return weftUnhandledCudaError;
}

weftResult_t train_dev_open(int local_rank, void **stream_out) {
  int ndev = 0;
  cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    fprintf(stderr, "weft-train: --device cuda: no CUDA device is visible (%s)\n",
            err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    return weftInvalidUsage;
  }
  weftResult_t res = dev_check(cudaSetDevice(local_rank % ndev), "selecting the GPU");
  cudaStream_t s = NULL;
  if (res == weftSuccess) res = dev_check(cudaStreamCreate(&s), "creating a stream");
  if (res == weftSuccess) *stream_out = s;
  return res;
}

void train_dev_close(void *stream) {
  if (stream != NULL) cudaStreamDestroy((cudaStream_t)stream);
}

weftResult_t train_dev_copy(void *dst, const void *src, size_t nbytes) {
  return dev_check(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault), "copying");
}

weftResult_t train_dev_sync(void *stream) {
  return dev_check(cudaStreamSynchronize((cudaStream_t)stream), "synchronizing the stream");
}

weftResult_t train_dev_alloc(void **ptr_out, size_t nbytes) {
  return dev_check(cudaMalloc(ptr_out, nbytes > 0 ? nbytes : 1), "allocating device memory");
}

void train_dev_free(void *ptr) {
  if (ptr != NULL) cudaFree(ptr);
}

weftResult_t train_dev_launched(int err, const char *what) {
  return dev_check((cudaError_t)err, what);
}

#else

static weftResult_t dev_none(void) {
  fprintf(stderr, "weft-train: --device cuda: weft-train was built without CUDA\n");
  return weftInvalidUsage;
}

weftResult_t train_dev_open(int local_rank, void **stream_out) {
  (void)local_rank;
  (void)stream_out;
  return dev_none();
}
void train_dev_close(void *stream) { (void)stream; }
weftResult_t train_dev_copy(void *dst, const void *src, size_t nbytes) {
  (void)dst, (void)src, (void)nbytes;
  return dev_none();
}
weftResult_t train_dev_sync(void *stream) {
  (void)stream;
  return dev_none();
}
weftResult_t train_dev_alloc(void **ptr_out, size_t nbytes) {
  (void)ptr_out, (void)nbytes;
  return dev_none();
}
void train_dev_free(void *ptr) { (void)ptr; }
weftResult_t train_dev_launched(int err, const char *what) {
  (void)err;
  (void)what;
  return dev_none();
}

#endif
