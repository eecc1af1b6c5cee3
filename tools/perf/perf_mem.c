/* Buffers of the perf tools: host memory always, CUDA memory when the tools
 * were built with the CUDA runtime (WEFT_PERF_CUDA). */
#include "perf_mem.h"

#include <weft.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WEFT_PERF_CUDA
#include <cuda_runtime.h>
#endif

int perf_mem_parse(const char *name, enum perf_mem_kind *kind_out) {
  if (strcmp(name, "host") == 0) *kind_out = PERF_MEM_HOST;
  else if (strcmp(name, "cuda") == 0) *kind_out = PERF_MEM_CUDA;
  else return -1;
  return 0;
}

const char *perf_mem_name(enum perf_mem_kind kind) {
  return kind == PERF_MEM_CUDA ? "cuda" : "host";
}

int perf_mem_available(enum perf_mem_kind kind, char *why, size_t len) {
  if (kind == PERF_MEM_HOST) return 0;
#ifdef WEFT_PERF_CUDA
  int ndev = 0;
  cudaError_t err = cudaGetDeviceCount(&ndev);
  if (err != cudaSuccess || ndev == 0) {
    snprintf(why, len, "no CUDA device (%s)",
             err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    return -1;
  }
  return 0;
#else
  snprintf(why, len, "these tools were built without CUDA (install the CUDA toolkit and "
                     "rebuild with meson configure -Dcuda=enabled)");
  return -1;
#endif
}

void *perf_mem_alloc(enum perf_mem_kind kind, size_t nbytes) {
  void *p = NULL;
  if (kind == PERF_MEM_HOST) {
    /* weft's allocator, as nccl-tests takes ncclMemAlloc's memory */
    return weftMemAllocHost(&p, nbytes ? nbytes : 1) == weftSuccess ? p : NULL;
  }
#ifdef WEFT_PERF_CUDA
  if (cudaMalloc(&p, nbytes ? nbytes : 1) != cudaSuccess) return NULL;
#endif
  return p;
}

void perf_mem_free(enum perf_mem_kind kind, void *ptr) {
  if (kind == PERF_MEM_HOST) weftMemFree(ptr);
#ifdef WEFT_PERF_CUDA
  else cudaFree(ptr);
#endif
}

int perf_mem_upload(enum perf_mem_kind kind, void *dst, const void *host_src, size_t nbytes) {
  if (kind == PERF_MEM_HOST) {
    if (dst != host_src) memmove(dst, host_src, nbytes);
    return 0;
  }
#ifdef WEFT_PERF_CUDA
  return cudaMemcpy(dst, host_src, nbytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
#else
  return -1;
#endif
}

int perf_mem_download(enum perf_mem_kind kind, void *host_dst, const void *src, size_t nbytes) {
  if (kind == PERF_MEM_HOST) {
    if (host_dst != src) memmove(host_dst, src, nbytes);
    return 0;
  }
#ifdef WEFT_PERF_CUDA
  return cudaMemcpy(host_dst, src, nbytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
#else
  return -1;
#endif
}

int perf_mem_fill(enum perf_mem_kind kind, void *dst, int byte, size_t nbytes) {
  if (kind == PERF_MEM_HOST) {
    memset(dst, byte, nbytes);
    return 0;
  }
#ifdef WEFT_PERF_CUDA
  return cudaMemset(dst, byte, nbytes) == cudaSuccess ? 0 : -1;
#else
  return -1;
#endif
}

int perf_mem_sync(enum perf_mem_kind kind) {
  if (kind == PERF_MEM_HOST) return 0;
#ifdef WEFT_PERF_CUDA
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : -1;
#else
  return -1;
#endif
}
