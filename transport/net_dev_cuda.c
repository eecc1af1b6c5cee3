/* Pinned host memory mapped for the device: the FIFOs of device network
 * connections in a CUDA build (net_dev.h). */
#include <string.h>

#include <cuda_runtime_api.h>

#include "base/status.h"
#include "net_dev.h"

static weftResult_t net_dev_cuda_alloc(size_t nbytes, void **host_out, void **dev_out) {
  void *host = NULL, *dev = NULL;
  cudaError_t err = cudaHostAlloc(&host, nbytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (err == cudaSuccess) err = cudaHostGetDevicePointer(&dev, host, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (host != NULL) cudaFreeHost(host);
    return weft_error_set(weftSystemError, "pinning a %zu-byte device network FIFO: %s", nbytes,
                          cudaGetErrorString(err));
  }
  memset(host, 0, nbytes);
  *host_out = host;
  *dev_out = dev;
  return weftSuccess;
}

static void net_dev_cuda_free(void *host, size_t nbytes) {
  (void)nbytes;
  cudaFreeHost(host);
}

/* Memory another process shares (host_fifo): pinned in place and mapped. */
static weftResult_t net_dev_cuda_map(void *host, size_t nbytes, void **dev_out) {
  void *dev = NULL;
  cudaError_t err = cudaHostRegister(host, nbytes, cudaHostRegisterMapped |
                                                       cudaHostRegisterPortable);
  if (err == cudaSuccess) {
    err = cudaHostGetDevicePointer(&dev, host, 0);
    if (err != cudaSuccess) cudaHostUnregister(host);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return weft_error_set(weftSystemError, "pinning a %zu-byte shared device FIFO: %s", nbytes,
                          cudaGetErrorString(err));
  }
  *dev_out = dev;
  return weftSuccess;
}

static void net_dev_cuda_unmap(void *host) {
  cudaHostUnregister(host);
  cudaGetLastError();
}

const struct proxy_fifo_mem net_dev_mem_cuda = {
    .name = "pinned host memory (cudaHostAlloc)",
    .alloc = net_dev_cuda_alloc,
    .free = net_dev_cuda_free,
    .map = net_dev_cuda_map,
    .unmap = net_dev_cuda_unmap,
};
