// sendrecv_steps.h compiled by nvcc: the host pass, and the device pass run by a
// one-thread kernel, as the send/recv kernel's thread 0 runs it.
#include <cuda_runtime_api.h>

#include "sendrecv_steps_dump.h"

#define SENDRECV_DUMP_FN __host__ __device__ dump
#include "sendrecv_steps_dump_body.h"

extern "C" size_t sendrecv_steps_dump_nvcc_host(const struct sendrecv_op *ops, int nops,
                                                uint64_t chunk_nbytes, int nlanes, int nblocks,
                                                int b, struct sendrecv_move *out, size_t max) {
  static struct sendrecv_block blk; /* large for a stack */
  return dump(ops, nops, chunk_nbytes, nlanes, nblocks, b, &blk, out, max);
}

__global__ void sendrecv_dump_kernel(const struct sendrecv_op *ops, int nops, uint64_t chunk_nbytes,
                                     int nlanes, int nblocks, int b, struct sendrecv_move *out,
                                     size_t max, size_t *n_out) {
#ifdef WEFT_CUDA_EMU
  struct sendrecv_block blk; // one thread
#else
  __shared__ struct sendrecv_block blk;
#endif
  *n_out = dump(ops, nops, chunk_nbytes, nlanes, nblocks, b, &blk, out, max);
}

extern "C" long sendrecv_steps_dump_nvcc_device(const struct sendrecv_op *ops, int nops,
                                                uint64_t chunk_nbytes, int nlanes, int nblocks,
                                                int b, struct sendrecv_move *out, size_t max) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    cudaGetLastError();
    return -1;
  }
  struct sendrecv_op *ops_d = NULL;
  struct sendrecv_move *out_d = NULL;
  size_t *n_d = NULL, n = 0;
  long res = -1;
  if (cudaMalloc(&ops_d, sizeof(*ops) * (nops ? nops : 1)) == cudaSuccess &&
      cudaMalloc(&out_d, sizeof(*out) * (max ? max : 1)) == cudaSuccess &&
      cudaMalloc(&n_d, sizeof(size_t)) == cudaSuccess &&
      cudaMemcpy(ops_d, ops, sizeof(*ops) * nops, cudaMemcpyHostToDevice) == cudaSuccess) {
#ifdef WEFT_CUDA_EMU
    CUDA_EMU_LAUNCH(sendrecv_dump_kernel, 1, 1, ops_d, nops, chunk_nbytes, nlanes, nblocks, b, out_d, max, n_d);
#else
    sendrecv_dump_kernel<<<1, 1>>>(ops_d, nops, chunk_nbytes, nlanes, nblocks, b, out_d, max, n_d);
#endif
    if (cudaMemcpy(&n, n_d, sizeof n, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(out, out_d, sizeof(*out) * (n < max ? n : max), cudaMemcpyDeviceToHost) ==
            cudaSuccess)
      res = (long)n;
  }
  cudaFree(ops_d);
  cudaFree(out_d);
  cudaFree(n_d);
  cudaGetLastError();
  return res;
}
