// tree_steps.h compiled by nvcc: the host pass, and the device pass run by a
// one-thread kernel, as the tree kernels run it.
#include <cuda_runtime_api.h>

#include "tree_steps_dump.h"

extern "C" size_t tree_steps_dump_nvcc_host(const struct tree_geom *g, struct tree_step *out,
                                            size_t max) {
  return tree_steps_collect(g, out, max);
}

__global__ void tree_dump_kernel(struct tree_geom g, struct tree_step *out, size_t max,
                                 size_t *n_out) {
  *n_out = tree_steps_collect(&g, out, max);
}

extern "C" long tree_steps_dump_nvcc_device(const struct tree_geom *g, struct tree_step *out,
                                            size_t max) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    cudaGetLastError();
    return -1;
  }
  struct tree_step *out_d = NULL;
  size_t *n_d = NULL, n = 0;
  long res = -1;
  if (cudaMalloc(&out_d, sizeof(*out) * (max ? max : 1)) == cudaSuccess &&
      cudaMalloc(&n_d, sizeof(size_t)) == cudaSuccess) {
#ifdef WEFT_CUDA_EMU
    CUDA_EMU_LAUNCH(tree_dump_kernel, 1, 1, *g, out_d, max, n_d);
#else
    tree_dump_kernel<<<1, 1>>>(*g, out_d, max, n_d);
#endif
    if (cudaMemcpy(&n, n_d, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(out, out_d, sizeof(*out) * (n < max ? n : max), cudaMemcpyDeviceToHost) ==
            cudaSuccess)
      res = (long)n;
  }
  cudaFree(out_d);
  cudaFree(n_d);
  cudaGetLastError();
  return res;
}
