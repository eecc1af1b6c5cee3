// ring_steps.h compiled by nvcc: the host pass, and the device pass run by a
// one-thread kernel, as the ring kernels run it.
#include <cuda_runtime_api.h>

#include "ring_steps_dump.h"

extern "C" size_t ring_steps_dump_nvcc_host(const struct ring_geom *g, const int *ring,
                                            struct ring_step *out, size_t max, int interleave) {
  return ring_steps_collect(g, ring, out, max, interleave);
}

__global__ void dump_kernel(struct ring_geom g, const int *ring, struct ring_step *out,
                            size_t max, int interleave, size_t *n_out) {
  *n_out = ring_steps_collect(&g, ring, out, max, interleave);
}

extern "C" long ring_steps_dump_nvcc_device(const struct ring_geom *g, const int *ring,
                                           struct ring_step *out, size_t max, int interleave) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    cudaGetLastError();
    return -1;
  }
  int *ring_d = NULL;
  struct ring_step *out_d = NULL;
  size_t *n_d = NULL, n = 0;
  long res = -1;
  if (cudaMalloc(&ring_d, sizeof(int) * g->nranks) == cudaSuccess &&
      cudaMalloc(&out_d, sizeof(*out) * (max ? max : 1)) == cudaSuccess &&
      cudaMalloc(&n_d, sizeof(size_t)) == cudaSuccess &&
      cudaMemcpy(ring_d, ring, sizeof(int) * g->nranks, cudaMemcpyHostToDevice) == cudaSuccess) {
#ifdef WEFT_CUDA_EMU
    CUDA_EMU_LAUNCH(dump_kernel, 1, 1, *g, ring_d, out_d, max, interleave, n_d);
#else
    dump_kernel<<<1, 1>>>(*g, ring_d, out_d, max, interleave, n_d);
#endif
    if (cudaMemcpy(&n, n_d, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(out, out_d, sizeof(*out) * (n < max ? n : max), cudaMemcpyDeviceToHost) ==
            cudaSuccess)
      res = (long)n;
  }
  cudaFree(ring_d);
  cudaFree(out_d);
  cudaFree(n_d);
  cudaGetLastError();
  return res;
}
