/* WEFT_DETERMINISTIC on device memory: a reduction (all-reduce,
 * reduce-scatter, reduce) in collectives/algo/deterministic.c's order and
 * blocks, queued on the caller's stream:
 *   scale:   a pre-multiply sum's input times this rank's scalar, in its
 *            type, into the scratch (as the host scales its input first);
 *   scatter: rank r receives block r of every other rank's input into the
 *            scratch's n + 1 blocks, its own block copied beside them;
 *   reduce:  kernels_det.cu reduces the n contributions in rank order into
 *            the output (reduce-scatter), its place in the output
 *            (all-reduce, the root of a reduce), or the scratch's last block;
 *   gather:  all-reduce: each rank sends its block to every other; reduce:
 *            to the root.
 * The exchanges are this comm's sends and receives (device_sendrecv.c), in
 * groups of DET_PEERS_PER_GROUP peers each way, each group one kernel. The
 * result has the host executor's bits. Unlike the host's, the call sends no
 * signature first: the point-to-point kernels compare each message's size
 * only (WEFT_CHECK=1 compares the call over the bootstrap before it
 * launches).
 *
 * The scratch is the comm's, kept and grown (struct device_comm's
 * det_scratch): outgrown buffers are kept until the comm is freed, since a
 * call on another stream may still read them and a device-wide wait could
 * wait on a peer rank's kernel that waits on this one. Inside a graph
 * capture, where no allocation may be made, a call larger than the scratch
 * takes a graph allocation (cudaMallocAsync, freed behind it). A call
 * waits for the comm's last one (an event), whose reduction may still read
 * the scratch on another stream. */
#include <stdlib.h>
#include <string.h>

#include "../../../transport/base/status.h"
#include "../../algo/deterministic.h"
#include "../../algo/sendrecv_steps.h"
#include "../../core/comm.h"
#include "dev_det.h"
#include "device_priv.h"

/* A send/recv kernel takes SENDRECV_MAX_OPS operations: peers a group
 * sends to (and receives from). */
#define DET_PEERS_PER_GROUP (SENDRECV_MAX_OPS / 2)

/* Written by nvcc (kernels_det.cu). */
void weft_det_reduce_kernel(struct dev_det_work w);
static cudaKernel_t det_handle;

void device_det_load(void) { device_kernel_load((const void *)weft_det_reduce_kernel); }

static weftResult_t det_kernel(struct dev_det_work w, cudaStream_t stream, const char *what) {
  if (w.count == 0) return weftSuccess;
  size_t blocks = (w.count + 255) / 256;
  dim3 grid = {(unsigned)(blocks < 1024 ? blocks : 1024), 1, 1}, block = {256, 1, 1};
  void *args[] = {&w};
  const char *why = device_kernel_launch((const void *)weft_det_reduce_kernel, &det_handle, grid,
                                         block, args, stream, 0);
  if (why == NULL) return weftSuccess;
  return weft_error_set(weftSystemError, "cuda: WEFT_DETERMINISTIC's %s: %s", what, why);
}

/* The exchanges of one direction, DET_PEERS_PER_GROUP peers a kernel: every
 * rank cuts the offsets 1 .. n-1 alike, so each group pairs with its peers'. */
static weftResult_t det_exchange(struct weftComm *comm, const struct weft_plan *plan,
                                 const struct det_blocks *b, int gather, char *buf,
                                 struct weft_plan *ops, const struct weft_plan **ptrs,
                                 cudaStream_t stream, device_p2p_fn p2p) {
  const int n = comm->nranks, rank = comm->rank;
  weftResult_t res = weftSuccess;
  for (int j0 = 1; j0 < n && res == weftSuccess; j0 += DET_PEERS_PER_GROUP) {
    const int j1 = j0 + DET_PEERS_PER_GROUP < n ? j0 + DET_PEERS_PER_GROUP : n;
    const size_t nops = gather ? det_gather_ops(plan, n, rank, b, j0, j1, buf, ops, 1)
                               : det_scatter_ops(plan, n, rank, b, j0, j1, buf, ops, 1);
    for (size_t i = 0; i < nops; i++) ptrs[i] = &ops[i];
    res = p2p(comm, ptrs, nops, stream);
  }
  return res;
}

/* nbytes of scratch for this call: the comm's, grown where it is short; in
 * a capture, a graph allocation (*pooled set: free it behind the call). */
static weftResult_t det_scratch(struct device_comm *d, size_t nbytes, int captured,
                                cudaStream_t stream, char **out, int *pooled) {
  *pooled = 0;
  if (d->det_nbytes >= nbytes) {
    *out = d->det_scratch;
    return weftSuccess;
  }
  if (captured) {
    *pooled = 1;
    return device_cuda_check(cudaMallocAsync((void **)out, nbytes, stream),
                             "WEFT_DETERMINISTIC's scratch in a captured graph");
  }
  if (d->det_nretired == DET_RETIRED_MAX)
    return weft_error_set(weftSystemError, "WEFT_DETERMINISTIC: the scratch grew %d times",
                          DET_RETIRED_MAX);
  size_t want = d->det_nbytes * 2 > nbytes ? d->det_nbytes * 2 : nbytes;
  void *p = NULL;
  CUDA_TRY(cudaMalloc(&p, want), "WEFT_DETERMINISTIC's scratch");
  if (d->det_scratch != NULL) d->det_retired[d->det_nretired++] = d->det_scratch;
  d->det_scratch = p;
  d->det_nbytes = want;
  *out = p;
  return weftSuccess;
}

/* Behind the comm's last call of this kind, on whatever stream it went:
 * its reduction kernel, which no launch of the comm's counts, may still
 * read the scratch this call writes before its first exchange. A graph's
 * calls follow each other on their stream. (Calls of other kinds wait for
 * a reduction that is a call's last kernel in comm_gate.) */
static weftResult_t det_after_last(struct device_comm *d, cudaStream_t stream, int captured) {
  if (captured) return weftSuccess;
  if (d->det_done == NULL) {
    return device_cuda_check(cudaEventCreateWithFlags(&d->det_done, cudaEventDisableTiming),
                             "WEFT_DETERMINISTIC's event");
  }
  return device_cuda_check(cudaStreamWaitEvent(stream, d->det_done, 0),
                           "WEFT_DETERMINISTIC: waiting for the last call");
}

static weftResult_t det_with(struct weftComm *comm, const struct weft_plan *plan,
                             cudaStream_t stream, int captured, device_p2p_fn p2p,
                             struct weft_plan *ops, const struct weft_plan **ptrs) {
  struct device_comm *d = comm->device;
  const int n = comm->nranks, rank = comm->rank;
  const size_t esize = weftTypeSize(plan->datatype);
  const struct det_blocks b = det_blocks_of(plan, n);
  const size_t mine = det_len(&b, rank), blocks = (size_t)(n + 1) * (mine > 0 ? mine : 1) * esize;
  const int premul = (int)plan->op >= weftNumOps; /* a pre-multiply sum's op */
  /* blocks, then a pre-multiply sum's scaled input */
  char *scratch;
  int pooled;
  WEFT_TRY(det_scratch(d, blocks + (premul ? b.total * esize : 0), captured, stream,
                       &scratch, &pooled));
  struct weft_plan call = *plan; /* a pre-multiply sum: a sum of the scaled input */
  weftResult_t res = det_after_last(d, stream, captured);
  if (res == weftSuccess && premul) {
    struct dev_det_work scale = {.in = plan->sendbuf, .out = scratch + blocks, .count = b.total,
                                 .n = 1, .datatype = (int32_t)plan->datatype, .op = weftSum,
                                 .divisor = 1, .premul = 1, .scalar_ptr = plan->premul_ptr};
    memcpy(&scale.scalar_bits, plan->premul_scalar, sizeof plan->premul_scalar);
    res = det_kernel(scale, stream, "scaling");
    call.sendbuf = scratch + blocks;
    call.op = weftSum;
  }
  if (res == weftSuccess && mine > 0)
    res = device_cuda_check(
        cudaMemcpyAsync(scratch + (size_t)rank * mine * esize,
                        (const char *)call.sendbuf + det_off(&b, rank) * esize, mine * esize,
                        cudaMemcpyDeviceToDevice, stream),
        "WEFT_DETERMINISTIC's own block");
  if (res == weftSuccess) res = det_exchange(comm, &call, &b, 0, scratch, ops, ptrs, stream, p2p);
  char *out = det_out(&call, n, rank, &b, scratch);
  struct dev_det_work w = {.in = scratch, .stride = mine * esize, .out = out, .count = mine,
                           .n = n, .datatype = (int32_t)call.datatype, .op = (int32_t)call.op,
                           .divisor = call.op == weftAvg ? n : 1};
  if (res == weftSuccess) res = det_kernel(w, stream, "reduction");
  if (res == weftSuccess && call.coll != COLL_REDUCESCATTER)
    res = det_exchange(comm, &call, &b, 1, out, ops, ptrs, stream, p2p);
  if (res == weftSuccess && !captured)
    res = device_cuda_check(cudaEventRecord(d->det_done, stream),
                            "WEFT_DETERMINISTIC's end");
  if (res == weftSuccess && !captured) { /* what the comm's next call on another stream waits for */
    d->det_done_seq = d->done.seq;
    d->det_done_stream = d->call_stream;
    d->det_done_thread = d->call_thread;
  }
  if (pooled) { /* behind everything queued above, whatever failed */
    weftResult_t freed = device_cuda_check(cudaFreeAsync(scratch, stream),
                                           "WEFT_DETERMINISTIC's scratch in a captured graph");
    if (res == weftSuccess) res = freed;
  }
  return res;
}

weftResult_t device_det_launch(struct weftComm *comm, const struct weft_plan *plan,
                               cudaStream_t stream, int captured, device_p2p_fn p2p) {
  struct weft_plan *ops = calloc(2 * DET_PEERS_PER_GROUP, sizeof *ops);
  const struct weft_plan **ptrs = calloc(2 * DET_PEERS_PER_GROUP, sizeof *ptrs);
  weftResult_t res = weftSystemError;
  if (ops != NULL && ptrs != NULL) res = det_with(comm, plan, stream, captured, p2p, ops, ptrs);
  else weft_error_set(res, "WEFT_DETERMINISTIC: out of memory");
  free(ptrs);
  free(ops);
  return res;
}
