/* Buffers of the perf tools: host memory always, CUDA memory when the tools
 * were built with the CUDA runtime (WEFT_PERF_CUDA). */
#include "perf_mem.h"

#include <weft.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef WEFT_PERF_CUDA
#include <cuda_runtime.h>
/* weak: the emulated runtime of device-emulated builds (docs/cuda.md) has no
 * memory query, and -M 1 then says nothing of the device */
#pragma weak cudaMemGetInfo
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

/* "cpus 0-3,8": the CPUs this process may run on, as ranges; "..." where
 * they do not fit */
static void cpu_list(char *buf, size_t len) {
  cpu_set_t set;
  size_t used = (size_t)snprintf(buf, len, "cpus ");
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    snprintf(buf, len, "cpus ?");
    return;
  }
  const char *sep = "";
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, &set)) continue;
    int last = c;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) last++;
    char range[32];
    if (last > c) snprintf(range, sizeof range, "%s%d-%d", sep, c, last);
    else snprintf(range, sizeof range, "%s%d", sep, c);
    if (used + strlen(range) + 4 > len) {
      snprintf(buf + used, len - used, "...");
      return;
    }
    used += (size_t)snprintf(buf + used, len - used, "%s", range);
    sep = ",";
    c = last;
  }
}

int perf_mem_device(enum perf_mem_kind kind, int *device_out, char *where, size_t where_len,
                    char *name, size_t name_len) {
  if (kind == PERF_MEM_HOST) {
    *device_out = -1;
    cpu_list(where, where_len);
    snprintf(name, name_len, "host memory");
    return 0;
  }
#ifdef WEFT_PERF_CUDA
  int dev = 0;
  struct cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return -1;
  *device_out = dev;
  snprintf(where, where_len, "%04x:%02x:%02x", prop.pciDomainID, prop.pciBusID,
           prop.pciDeviceID);
  snprintf(name, name_len, "%s", prop.name);
  return 0;
#else
  (void)where_len, (void)name_len;
  return -1;
#endif
}

int perf_mem_used(enum perf_mem_kind kind, int64_t *nbytes_out) {
  if (kind == PERF_MEM_HOST) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, resident = 0;
    const int got = f != NULL ? fscanf(f, "%lld %lld", &size, &resident) : 0;
    if (f != NULL) fclose(f);
    if (got != 2) return -1;
    *nbytes_out = (int64_t)resident * sysconf(_SC_PAGESIZE);
    return 0;
  }
#ifdef WEFT_PERF_CUDA
  size_t free_nbytes = 0, total_nbytes = 0;
  if (cudaMemGetInfo == NULL || cudaMemGetInfo(&free_nbytes, &total_nbytes) != cudaSuccess)
    return -1;
  *nbytes_out = (int64_t)(total_nbytes - free_nbytes);
  return 0;
#else
  return -1;
#endif
}
