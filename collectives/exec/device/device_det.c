/* WEFT_DETERMINISTIC on device memory: a reduction (all-reduce,
 * reduce-scatter, reduce) in collectives/algo/deterministic.c's order and
 * blocks, queued on the caller's stream as three steps:
 *   scatter: rank r receives block r of every other rank's input into a
 *            scratch of n + 1 blocks (stream-ordered: cudaMallocAsync, freed
 *            behind the call), its own block copied beside them;
 *   reduce:  kernels_det.cu reduces the n contributions in rank order into
 *            the output (reduce-scatter), its place in the output
 *            (all-reduce, the root of a reduce), or the scratch's last block;
 *   gather:  all-reduce: each rank sends its block to every other; reduce:
 *            to the root.
 * The exchanges are this comm's sends and receives (device_sendrecv.c),
 * each group one kernel. The result has the host executor's bits. Unlike
 * the host's, the call sends no signature first: the device executor
 * compares none yet. */
#include <stdlib.h>
#include <string.h>

#include "../../../transport/base/status.h"
#include "../../algo/deterministic.h"
#include "../../core/comm.h"
#include "dev_det.h"
#include "device_priv.h"

/* Written by nvcc (kernels_det.cu). */
void weft_det_reduce_kernel(struct dev_det_work w);
static cudaKernel_t det_handle;

static weftResult_t det_reduce_launch(const struct weftComm *comm,
                                      const struct weft_plan *plan, const char *scratch,
                                      size_t mine, size_t esize, void *out, cudaStream_t stream) {
  const int premul = device_op_index(plan->op) == DEV_OP_PREMULSUM;
  struct dev_det_work w = {.in = scratch, .stride = mine * esize, .out = out, .count = mine,
                           .n = comm->nranks, .datatype = (int32_t)plan->datatype,
                           .op = premul ? weftSum : (int32_t)plan->op,
                           .divisor = plan->op == weftAvg ? comm->nranks : 1, .premul = premul};
  if (premul) {
    w.scalar_ptr = plan->premul_ptr;
    memcpy(&w.scalar_bits, plan->premul_scalar, sizeof plan->premul_scalar);
  }
  size_t blocks = (mine + 255) / 256;
  dim3 grid = {(unsigned)(blocks < 1024 ? blocks : 1024), 1, 1}, block = {256, 1, 1};
  void *args[] = {&w};
  const char *why = device_kernel_launch((const void *)weft_det_reduce_kernel, &det_handle, grid,
                                         block, args, stream, 0);
  if (why == NULL) return weftSuccess;
  return weft_error_set(weftSystemError, "cuda: WEFT_DETERMINISTIC's reduction: %s", why);
}

static weftResult_t det_group(struct weftComm *comm, struct weft_plan *ops,
                              const struct weft_plan **ptrs, size_t nops, cudaStream_t stream) {
  for (size_t i = 0; i < nops; i++) ptrs[i] = &ops[i];
  return device_launch_p2p(comm, ptrs, nops, stream);
}

static weftResult_t det_with(struct weftComm *comm, const struct weft_plan *plan,
                             cudaStream_t stream, struct weft_plan *ops,
                             const struct weft_plan **ptrs) {
  const int n = comm->nranks, rank = comm->rank;
  const size_t esize = weftTypeSize(plan->datatype);
  const struct det_blocks b = det_blocks_of(plan, n);
  const size_t mine = det_len(&b, rank);
  char *scratch = NULL;
  CUDA_TRY(cudaMallocAsync((void **)&scratch, (size_t)(n + 1) * (mine > 0 ? mine : 1) * esize,
                           stream),
           "WEFT_DETERMINISTIC's scratch");
  weftResult_t res = weftSuccess;
  if (mine > 0)
    res = device_cuda_check(
        cudaMemcpyAsync(scratch + (size_t)rank * mine * esize,
                        (const char *)plan->sendbuf + det_off(&b, rank) * esize, mine * esize,
                        cudaMemcpyDeviceToDevice, stream),
        "WEFT_DETERMINISTIC's own block");
  if (res == weftSuccess)
    res = det_group(comm, ops, ptrs, det_scatter_ops(plan, n, rank, &b, scratch, ops, 1), stream);
  char *out = det_out(plan, n, rank, &b, scratch);
  if (res == weftSuccess && mine > 0)
    res = det_reduce_launch(comm, plan, scratch, mine, esize, out, stream);
  if (res == weftSuccess && plan->coll != COLL_REDUCESCATTER)
    res = det_group(comm, ops, ptrs, det_gather_ops(plan, n, rank, &b, out, ops, 1), stream);
  /* behind everything queued above, whatever failed */
  weftResult_t freed = device_cuda_check(cudaFreeAsync(scratch, stream),
                                         "WEFT_DETERMINISTIC's scratch");
  return res != weftSuccess ? res : freed;
}

weftResult_t device_det_launch(struct weftComm *comm, const struct weft_plan *plan,
                               cudaStream_t stream) {
  const size_t n = (size_t)comm->nranks;
  struct weft_plan *ops = calloc(2 * n, sizeof *ops);
  const struct weft_plan **ptrs = calloc(2 * n, sizeof *ptrs);
  weftResult_t res = weftSystemError;
  if (ops != NULL && ptrs != NULL) res = det_with(comm, plan, stream, ops, ptrs);
  else weft_error_set(res, "WEFT_DETERMINISTIC: out of memory");
  free(ptrs);
  free(ops);
  return res;
}
