/* Launching on device memory: a ring collective as one kernel of the
 * datatype x op matrix, a group's sends and receives on a comm as one send/recv
 * kernel (device_sendrecv.c). Every launch holds the comm active (an abort on
 * another thread waits for it) and is recorded, so that destroy and abort
 * wait for this comm's work only. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../../transport/base/status.h"
#include "device.h"
#include "device_priv.h"
#include "../../algo/deterministic.h"
#include "../../algo/ring_steps.h"
#include "../../core/channel.h"
#include "../../core/redop.h"
#include "../../core/signature.h"

/* Written by gen_kernels.py (device_refuse.c says what is missing): the
 * ring kernels, and the tree all-reduce's. */
extern const void *const (*const weft_dev_kernels[weftNumTypes])[DEV_NPROTOS];
extern const void *const (*const weft_dev_tree_kernels[weftNumTypes])[DEV_NPROTOS];

/* A launch uses one channel (block) per this many bytes, up to the comm's:
 * SIMPLE blocks copy 16-byte vectors, LL blocks move a line of 8 payload
 * bytes per thread and wait on each line's flags, so an LL channel takes a
 * smaller share. */
#define DEV_CHANNEL_NBYTES (64u << 10)
#define DEV_LL_CHANNEL_NBYTES (16u << 10)

/* Two ranks' LL all-reduces up to this size run as one exchange
 * (RING_ALLREDUCE_PAIR, ring_steps.h) instead of the ring's two dependent
 * ones: the same bytes, half the waits, where a small call is all waits. */
#define DEV_PAIR_MAX_NBYTES (64u << 10)

/* Launches of at most this many channels may use programmatic dependent
 * launch (WEFT_DEVICE_PDL): a kernel so launched is resident while it waits
 * for the previous one, and a ring's blocks must all be resident at once on
 * every rank. One channel keeps that to two blocks a rank, which only ranks
 * sharing a GPU beyond half its resident blocks could run short of. */
#define DEV_PDL_MAX_CHANNELS 1

/* Threads per block: enough for a channel's share of nbytes in one pass of
 * the copy loop (SIMPLE: DEV_UNROLL vectors a thread; LL: one line). */
static unsigned launch_nthreads(size_t nbytes, int nch, int proto) {
  size_t per_thread = proto == DEV_PROTO_LL ? DEV_LL_LINE_DATA_NBYTES : 16u * DEV_UNROLL;
  return device_block_threads((nbytes + (size_t)nch - 1) / (size_t)nch, per_thread);
}

/* Holds comm, as the host executor's operations do (comm_op_begin); fails
 * when it was revoked, suspended, finalized, aborted or broken. The hold
 * stays either way: device_op_end ends it. */
static weftResult_t device_op_begin(struct weftComm *comm) {
  WEFT_TRY(comm_op_begin(comm, COMM_OP_HOLD, NULL));
  return device_comm_error(comm);
}
static void device_op_end(struct weftComm *comm) { comm_op_end(comm); }

/* Whether plan runs as WEFT_DETERMINISTIC's exchanges (device_det.c). */
static int plan_det(const struct weftComm *comm, const struct weft_plan *plan) {
  return !plan_is_sendrecv(plan) && plan->count > 0 && comm->nranks > 1 && det_applies(plan);
}

/* Records plans[0..n) in comm's trace with their launches (NULL: none),
 * unless a graph captured them (its replays are its owner's). A plan that
 * decides nothing (no elements, WEFT_DETERMINISTIC's exchanges) is recorded
 * with algorithm and protocol -1: the watch compares the others' between
 * ranks (hang.c). */
static void record_calls(struct weftComm *comm, const struct weft_plan *const *plans,
                         const struct trace_launch *launches, size_t n, int captured,
                         weftResult_t res) {
  if (comm->trace == NULL || captured) return;
  for (size_t i = 0; i < n; i++) {
    const struct trace_launch *l = launches != NULL ? &launches[i] : NULL;
    if (plans[i]->count > 0 && !plan_det(comm, plans[i])) {
      device_trace_call(comm, plans[i], l, res);
    } else {
      struct weft_plan rec = *plans[i];
      rec.algo = (enum coll_algo)-1;
      rec.proto = (enum coll_proto)-1;
      device_trace_call(comm, &rec, l, res);
    }
  }
}

/* The pre-multiply sum's scalar, as the kernel reads it: as the call saw
 * the op (redop_capture), which may have been destroyed since. */
static void premul_scalar(const struct weft_plan *plan, struct dev_work *w) {
  if (device_op_index(plan->op) != DEV_OP_PREMULSUM) return;
  w->scalar_ptr = plan->premul_ptr;
  memcpy(&w->scalar_bits, plan->premul_scalar, sizeof plan->premul_scalar);
}

/* The call's signature, which the kernels carry in the first slot of every
 * link and compare (prims_device.cuh): plan's, with a pre-multiply op as
 * the sum it runs as (as on the host); where a block that finds a
 * difference records it, or whom it waited on when it timed out, and the
 * channels it then poisons. */
static void device_sign(const struct weft_plan *plan, const struct device_comm *d, int tree,
                        struct dev_work *w) {
  struct signature_packed sig;
  signature_pack(&sig, plan);
  if (device_op_index(plan->op) == DEV_OP_PREMULSUM) sig.op = (uint8_t)weftSum;
  memcpy(w->sig, &sig, sizeof w->sig);
  w->mismatch = device_mismatch_d(d);
  w->stall = device_stall_d(d);
  w->comm_nchannels = tree ? d->tree_nchannels : d->nchannels;
}

/* Whether a launch of nch channels on stream goes with programmatic
 * dependent launch: asked for, small, on a stream of its own (not the
 * legacy default one) that no graph is capturing (captured: what
 * device_stream_uncaptured said of it, once a call). */
static int launch_pdl(const struct device_comm *d, int nch, cudaStream_t stream, int captured) {
  return d->pdl && nch <= DEV_PDL_MAX_CHANNELS && stream != NULL && stream != cudaStreamLegacy &&
         !captured;
}

/* The kernels' handles for device_kernel_launch, as weft_dev_kernels and
 * weft_dev_tree_kernels. */
static cudaKernel_t ring_handles[weftNumTypes][DEV_NOPS][DEV_NPROTOS];
static cudaKernel_t tree_handles[weftNumTypes][DEV_NOPS][DEV_NPROTOS];

/* The ring kernel of w (the table's [type][op][proto]; the tree's where w
 * has tree channels) on grid x block;
 * with w->pdl, launched to overlap the stream's previous kernel, which the
 * kernel then waits for itself (griddepcontrol.wait, kernels.cuh) before it
 * reads anything. A launch so that the driver refuses goes out plainly
 * instead, and the comm stops asking (the peers have launched theirs:
 * failing here would leave them waiting out the timeout). */
static weftResult_t ring_kernel_launch(struct device_comm *d, struct dev_work *w, int type, int op,
                                       dim3 grid, dim3 block, cudaStream_t stream) {
  const void *fn = (w->trees ? weft_dev_tree_kernels : weft_dev_kernels)[type][op][w->proto];
  cudaKernel_t *handle = &(w->trees ? tree_handles : ring_handles)[type][op][w->proto];
  void *args[] = {w};
  if (w->pdl) {
    const char *why = device_kernel_launch(fn, handle, grid, block, args, stream, 1);
    if (why == NULL) {
      d->pdl_launches++;
      return weftSuccess;
    }
    WEFT_WARN(LOG_INIT, "programmatic dependent launch refused (%s): WEFT_DEVICE_PDL off for "
              "this communicator", why);
    d->pdl = 0;
    w->pdl = 0;
  }
  const char *why = device_kernel_launch(fn, handle, grid, block, args, stream, 0);
  if (why == NULL) return weftSuccess;
  return weft_error_set(weftSystemError, "cuda: launching a kernel: %s", why);
}

static weftResult_t ring_launch(struct weftComm *comm, struct device_comm *d,
                                const struct weft_plan *plan, cudaStream_t stream, int captured,
                                int announce) {
  if (comm->nranks == 1) { /* every collective is a copy (avg divides by one) */
    size_t nbytes = plan->count * weftTypeSize(plan->datatype);
    if (device_op_index(plan->op) == DEV_OP_PREMULSUM) {
      /* the result is the input scaled, which a copy is not (nor, in place,
       * nothing at all); the ring kernel with one rank would not scale
       * either: refuse plainly */
      return weft_error_set(weftInvalidUsage,
                            "%s on device memory: a pre-multiply op needs 2 ranks or more",
                            coll_kind_name(plan->coll));
    }
    if (plan->recvbuf == plan->sendbuf) return weftSuccess;
    return device_cuda_check(cudaMemcpyAsync(plan->recvbuf, plan->sendbuf, nbytes,
                                             cudaMemcpyDeviceToDevice, stream), "copy");
  }
  /* LL lines carry their flags in the slot, which no network proxy sees whole */
  int proto = plan->proto == PROTO_LL && !d->crosses_hosts ? DEV_PROTO_LL : DEV_PROTO_SIMPLE;
  /* enough blocks to keep the GPU busy, each with a worthwhile share; every
   * rank computes the same number from the same call */
  size_t nbytes = plan->count * weftTypeSize(plan->datatype);
  size_t per_ch = proto == DEV_PROTO_LL ? DEV_LL_CHANNEL_NBYTES : DEV_CHANNEL_NBYTES;
  size_t want = (nbytes + per_ch - 1) / per_ch;
  int nch = want < (size_t)d->nchannels ? (int)(want ? want : 1) : d->nchannels;
  int coll = (int)plan->coll;
  const int tree = device_plan_tree(comm, d, plan); /* connected beforehand (comm_connect) */
  if (tree && nch > d->tree_nchannels) nch = d->tree_nchannels;
  /* the tree of small calls runs on channel 0, the one whose links reach it */
  const int tree_small = tree && comm_tree_small(comm, nbytes);
  if (tree_small) nch = 1;
  if (!tree && plan->coll == COLL_ALLREDUCE && comm->nranks == 2 && proto == DEV_PROTO_LL &&
      nbytes <= DEV_PAIR_MAX_NBYTES)
    coll = RING_ALLREDUCE_PAIR;
  struct dev_work w = {
      .channels = d->channels_d, .trees = tree ? d->trees_d : NULL,
      .tree_small = tree_small,
      .sendbuf = plan->sendbuf, .recvbuf = plan->recvbuf,
      .count = plan->count, .coll = coll, .root = plan->root,
      .nchannels = nch, .interleave = d->interleave, .pdl = launch_pdl(d, nch, stream, captured),
      .divisor = plan->op == weftAvg ? comm->nranks : 1, .proto = proto,
      .elem_nbytes = (uint32_t)weftTypeSize(plan->datatype),
      .abort_flag = d->flags_d, .error = d->flags_d + 1, .timeout_ns = comm_timeout_ns(comm)};
  premul_scalar(plan, &w);
  int op = device_op_index(plan->op);
  if (plan->op == weftAvg && redop_avg_prescales(plan->datatype)) {
    /* a sum of the input scaled by 1/n, as on the host (redop.h); its
     * signature stays avg's (device_sign reads the plan) */
    op = DEV_OP_PREMULSUM;
    w.divisor = 1;
    char scalar[8];
    redop_avg_scalar(plan->datatype, comm->nranks, scalar);
    memcpy(&w.scalar_bits, scalar, sizeof w.scalar_bits);
  }
  device_sign(plan, d, tree, &w);
  device_done_fill(d, captured, &w.done);
  dim3 grid = {(unsigned)nch, 1, 1}, block = {launch_nthreads(nbytes, nch, proto), 1, 1};
  WEFT_TRY(ring_kernel_launch(d, &w, (int)plan->datatype, op, grid, block, stream));
  device_done_commit(d, &w.done, nch);
  if (announce && !tree) device_net_expect_ring(comm, d, plan, nch); /* a tree crosses no host */
  return weftSuccess;
}

/* Written by nvcc (kernels_gate.cu). */
void weft_done_gate(const uint64_t *ended, uint64_t seq, int nblocks);
static cudaKernel_t gate_handle;

void device_kernels_load(void) {
  device_ring_kernels_load();
  device_kernel_load((const void *)weft_done_gate);
  device_sendrecv_load();
  device_det_load();
}

/* Where the comm's last launch went to another stream than this call's and
 * has not ended, the gate that holds stream until it has (launch_done.h):
 * the comm's kernels carry on each other's FIFO steps, so they run one
 * after another whatever streams the caller uses (as NCCL orders a
 * communicator's operations). */
static weftResult_t comm_gate(struct device_comm *d, cudaStream_t stream, int captured) {
  /* a WEFT_DETERMINISTIC call's last kernel (a reduce-scatter's reduction)
   * is not counted: where no launch followed it, its event on another
   * stream is what this call goes behind too */
  if (!captured && d->det_done != NULL && d->det_done_seq == d->done.seq &&
      (d->det_done_stream != d->call_stream || d->det_done_thread != d->call_thread))
    CUDA_TRY(cudaStreamWaitEvent(stream, d->det_done, 0),
             "ordering after the comm's deterministic reduction on another stream");
  if (!launch_done_gated(&d->done, device_ended_h(d), (uintptr_t)d->call_stream, d->call_thread,
                         captured))
    return weftSuccess;
  const uint64_t *ended = device_ended_d(d);
  uint64_t seq = d->done.seq;
  int nblocks = d->done.nblocks;
  void *args[] = {&ended, &seq, &nblocks};
  dim3 grid = {1, 1, 1}, block = {32, 1, 1};
  const void *gate = (const void *)weft_done_gate;
  const char *why = device_kernel_launch(gate, &gate_handle, grid, block, args, stream, 0);
  if (why == NULL) return weftSuccess;
  return weft_error_set(weftSystemError, "cuda: ordering after the comm's launch on another "
                        "stream: %s", why);
}

/* The comm's launches so far (0 before its device state exists). */
static uint64_t launches_made(const struct weftComm *comm) {
  const struct device_comm *d = comm->device;
  return d != NULL ? d->done.seq : 0;
}

/* The launches the comm made after before, into *l (none: l->last 0). */
static void launch_range(const struct weftComm *comm, uint64_t before, struct trace_launch *l) {
  const struct device_comm *d = comm->device;
  if (d == NULL || d->done.seq <= before) return;
  *l = (struct trace_launch){.first = before + 1, .last = d->done.seq,
                             .nblocks = (uint64_t)d->done.nblocks};
}

/* WEFT_DETERMINISTIC's exchanges' launcher, handed to device_det.c (below). */
static weftResult_t det_p2p_launch(struct weftComm *comm, const struct weft_plan *const *plans,
                                   size_t n, cudaStream_t stream);

/* Runs plans[0..n) of one comm on stream: the collectives in call order,
 * then the sends and receives together as one kernel. Connected beforehand.
 * Each kernel is counted for destroy and abort as it goes out
 * (device_done_commit). Asks once whether a graph captures stream: a launch
 * recorded into a graph neither goes behind a gate nor is counted, and, on
 * a comm whose rings cross hosts, is not announced to the network proxies
 * (nobody announces its replays). */
static weftResult_t comm_launch(struct weftComm *comm, const struct weft_plan *const *plans,
                                size_t n, cudaStream_t stream, int *captured_out,
                                struct trace_launch *launches) {
  weftResult_t res = device_op_begin(comm);
  int prev = -1;
  if (res == weftSuccess) res = device_cuda_check(cudaGetDevice(&prev), "current device");
  if (res == weftSuccess && prev != comm->cuda_dev)
    res = device_cuda_check(cudaSetDevice(comm->cuda_dev), "setting the device");
  struct device_comm *d = comm->device;
  const int captured = res == weftSuccess && !device_stream_uncaptured(stream);
  if (captured_out != NULL) *captured_out = captured;
  /* what the launches are counted on, and compared with, below: a stream
   * a graph captures is neither asked nor counted */
  if (res == weftSuccess && d != NULL && !captured) {
    d->call_stream = device_stream_key(stream);
    d->call_thread = device_stream_thread(stream);
    res = device_comm_stream_check(d, stream, d->call_stream);
  }
  if (res == weftSuccess && d != NULL) res = comm_gate(d, stream, captured);
  if (res == weftSuccess && d != NULL && d->crosses_hosts) device_net_kick(comm, d);
  const int announce = res == weftSuccess && d != NULL && d->crosses_hosts && !captured;
  size_t nsendrecv = 0;
  if (launches != NULL) memset(launches, 0, n * sizeof *launches);
  /* the comm's launch before these, which a call that launches nothing
   * and comes first completes with */
  const struct trace_launch prior = {.first = launches_made(comm) + 1,
                                     .last = launches_made(comm),
                                     .nblocks = d != NULL ? (uint64_t)d->done.nblocks : 0};
  for (size_t i = 0; i < n && res == weftSuccess; i++) {
    const uint64_t before = launches_made(comm);
    if (plan_is_sendrecv(plans[i])) nsendrecv++;
    else if (plan_det(comm, plans[i]))
      res = device_det_launch(comm, plans[i], stream, captured, det_p2p_launch);
    else if (plans[i]->count > 0) res = ring_launch(comm, d, plans[i], stream, captured, announce);
    /* a call that failed on its way out reads failed, whatever went out */
    if (launches != NULL && res == weftSuccess) launch_range(comm, before, &launches[i]);
  }
  if (res == weftSuccess && nsendrecv > 0) {
    const uint64_t before = launches_made(comm);
    res = device_sendrecv_launch(comm, d, plans, n, stream, captured, announce);
    for (size_t i = 0; i < n && launches != NULL && res == weftSuccess; i++)
      if (plan_is_sendrecv(plans[i])) launch_range(comm, before, &launches[i]); /* one kernel */
  }
  /* a call that launched nothing (no elements, one rank) completes with
   * the launch of the call before it in call order, so that it never reads
   * completed ahead of a stuck one (first past last: none of its own) */
  for (size_t i = 0; i < n && launches != NULL && res == weftSuccess; i++) {
    if (launches[i].last != 0) continue;
    const struct trace_launch *b = &prior;
    for (size_t j = i; j-- > 0 && b == &prior;)
      if (launches[j].last != 0) b = &launches[j];
    launches[i] = (struct trace_launch){.first = b->last + 1, .last = b->last,
                                        .nblocks = b->nblocks};
  }
  if (prev >= 0 && prev != comm->cuda_dev) cudaSetDevice(prev);
  device_op_end(comm);
  return res;
}

/* WEFT_DETERMINISTIC's exchanges go to every peer and back: their lanes
 * connected here, with the rest of the call's set-up (connecting is
 * collective, and a group's comms connect on threads of their own), not
 * when the exchanges launch. */
static weftResult_t det_connect(struct weftComm *comm, struct device_comm *d) {
  const size_t n = (size_t)comm->nranks;
  struct weft_plan *ops = calloc(2 * n, sizeof *ops);
  const struct weft_plan **ptrs = calloc(2 * n, sizeof *ptrs);
  weftResult_t res = weftSystemError;
  if (ops == NULL || ptrs == NULL) {
    weft_error_set(res, "WEFT_DETERMINISTIC: out of memory");
  } else {
    size_t nops = 0;
    for (int r = 0; r < comm->nranks; r++) {
      if (r == comm->rank) continue;
      ops[nops++] = det_p2p(COLL_SEND, r, NULL, NULL, 1, 1);
      ops[nops++] = det_p2p(COLL_RECV, r, NULL, NULL, 1, 1);
    }
    for (size_t i = 0; i < nops; i++) ptrs[i] = &ops[i];
    res = device_sendrecv_connect(comm, d, ptrs, nops);
  }
  free(ptrs);
  free(ops);
  return res;
}

/* Whether every peer's lanes are up (det_connect). */
static int det_connected(const struct weftComm *comm, const struct device_comm *d) {
  if (d->sendrecv.send == NULL) return 0;
  for (int r = 0; r < comm->nranks; r++)
    if (r != comm->rank &&
        (d->sendrecv.send[r][0].transport == NULL || d->sendrecv.recv[r][0].transport == NULL))
      return 0;
  return 1;
}

/* Connects what plans[0..n) of one comm need: the ring (collective over the
 * comm) for a collective, the named peers' lanes for sends and receives,
 * every peer's for a WEFT_DETERMINISTIC reduction. */
static weftResult_t comm_connect(struct weftComm *comm, const struct weft_plan *const *plans,
                                 size_t n) {
  struct device_comm *d;
  WEFT_TRY(device_comm_get(comm, &d));
  if (!d->kernels_loaded) { /* before the comm launches anything */
    device_kernels_load();
    d->kernels_loaded = 1;
  }
  int ring = 0, sendrecv = 0, tree = 0, det = 0;
  for (size_t i = 0; i < n; i++) {
    if (plan_is_sendrecv(plans[i])) {
      sendrecv = 1;
    } else if (plan_det(comm, plans[i])) {
      det = 1;
    } else {
      ring |= plans[i]->count > 0 && comm->nranks > 1;
      tree |= device_plan_tree(comm, d, plans[i]);
    }
  }
  if (ring) WEFT_TRY(device_ring_get(comm, &d));
  if (tree) WEFT_TRY(device_tree_get(comm, d));
  if (sendrecv) WEFT_TRY(device_sendrecv_connect(comm, d, plans, n));
  if (det && !det_connected(comm, d)) WEFT_TRY(det_connect(comm, d));
  return weftSuccess;
}

/* Whether comm_connect has nothing left to do for plans[0..n): the ring is
 * up when a collective needs it, and every named peer's lanes are (read
 * without the comm's lock: only this rank's calling thread connects). */
static int comm_connected(const struct weftComm *comm, const struct weft_plan *const *plans,
                          size_t n) {
  const struct device_comm *d = comm->device;
  if (d == NULL) return 0;
  for (size_t i = 0; i < n; i++) {
    const struct weft_plan *pl = plans[i];
    if (plan_is_sendrecv(pl)) {
      if (d->sendrecv.send == NULL) return 0; /* the lanes' tables, self-copies too */
      if (pl->root == comm->rank) continue;
      const struct weft_conn *c =
          pl->coll == COLL_SEND ? &d->sendrecv.send[pl->root][0] : &d->sendrecv.recv[pl->root][0];
      if (c->transport == NULL) return 0;
    } else if (plan_det(comm, pl)) {
      if (!det_connected(comm, d)) return 0;
    } else if (pl->count > 0 && comm->nranks > 1 && !d->ring_ready) {
      return 0;
    } else if (device_plan_tree(comm, d, pl) && !d->tree_ready) {
      return 0;
    }
  }
  return 1;
}

/* comm_connect with a capturing stream of this thread let be: set-up
 * allocates and copies. */
static weftResult_t comm_connect_relaxed(struct weftComm *comm,
                                         const struct weft_plan *const *plans, size_t n) {
  int dev = -1;
  CUDA_TRY(cudaGetDevice(&dev), "current device");
  if (comm->cuda_dev < 0) comm->cuda_dev = dev; /* the caller's device, as NCCL */
  if (dev != comm->cuda_dev) CUDA_TRY(cudaSetDevice(comm->cuda_dev), "setting the device");
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  weftResult_t res = comm_connect(comm, plans, n);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (dev != comm->cuda_dev) cudaSetDevice(dev); /* the caller's device stays current */
  return res;
}

/* WEFT_DETERMINISTIC's exchanges (device_det.c): connected with the call's
 * set-up (det_connect), launched here. */
static weftResult_t det_p2p_launch(struct weftComm *comm, const struct weft_plan *const *plans,
                                   size_t n, cudaStream_t stream) {
  if (n == 0) return weftSuccess;
  weftResult_t res = weftSuccess;
  if (!comm_connected(comm, plans, n)) res = comm_connect_relaxed(comm, plans, n);
  return res == weftSuccess ? comm_launch(comm, plans, n, stream, NULL, NULL) : res;
}

weftResult_t device_enqueue(struct weftComm *comm, const struct weft_plan *plan, void *stream) {
  const struct weft_plan *const plans[1] = {plan};
  struct trace_launch launch = {0};
  weftResult_t res = device_plan_refusal(plan);
  if (res == weftSuccess) {
    /* held from connection to launch: an abort on another thread waits for
     * both (and a refusal above began nothing, so it ends nothing) */
    res = device_op_begin(comm);
    if (res == weftSuccess && !comm_connected(comm, plans, 1))
      res = comm_connect_relaxed(comm, plans, 1); /* three CUDA calls saved once connected */
    if (res == weftSuccess) res = signature_agree(comm, plan); /* WEFT_CHECK=1 */
    int captured = 0;
    if (res == weftSuccess)
      res = comm_launch(comm, plans, 1, (cudaStream_t)stream, &captured, &launch);
    /* while still held: an abort waiting for it frees the comm after */
    if (res != weftSuccess)
      comm_error_text_set(comm, weft_error_text());
    record_calls(comm, plans, &launch, 1, captured, res);
    device_op_end(comm);
  } else {
    comm_error_text_set(comm, weft_error_text());
    record_calls(comm, plans, NULL, 1, 0, res); /* numbered where issued (enqueue.c) */
  }
  return res;
}

/* One comm's share of a group. */
struct comm_part {
  struct weftComm *comm;
  const struct weft_plan **plans;
  size_t n;
  cudaStream_t stream;
  weftResult_t res;
  char error[512];
  int recorded; /* in the trace */
};

static void *connect_main(void *p) {
  struct comm_part *a = p;
  a->res = device_cuda_check(cudaSetDevice(a->comm->cuda_dev >= 0 ? a->comm->cuda_dev : 0),
                             "device");
  if (a->res == weftSuccess) {
    a->res = device_op_begin(a->comm);
    if (a->res == weftSuccess) a->res = comm_connect_relaxed(a->comm, a->plans, a->n);
    /* WEFT_CHECK=1: each collective compared, in call order (blocking, so
     * on this comm's own thread) */
    for (size_t i = 0; i < a->n && a->res == weftSuccess; i++)
      a->res = signature_agree(a->comm, a->plans[i]);
    device_op_end(a->comm); /* ends only what it began */
  }
  if (a->res != weftSuccess) snprintf(a->error, sizeof a->error, "%s", weft_error_text());
  return NULL;
}

/* Connects the group's comms (and, with WEFT_CHECK=1, compares their
 * calls), each on a thread of its own: connecting and comparing are
 * collective, and one caller may drive several ranks. */
static weftResult_t connect_parts(struct comm_part *parts, size_t nparts) {
  size_t todo = 0; /* a thread costs tens of microseconds: none once connected */
  for (size_t i = 0; i < nparts; i++)
    todo += !comm_connected(parts[i].comm, parts[i].plans, parts[i].n) || signature_checking();
  if (todo == 0) return weftSuccess;
  pthread_t *tids = calloc(nparts ? nparts : 1, sizeof *tids);
  if (tids == NULL) return weft_error_set(weftSystemError, "out of memory");
  weftResult_t res = weftSuccess;
  size_t started = 0;
  for (; started < nparts; started++)
    if (pthread_create(&tids[started], NULL, connect_main, &parts[started]) != 0) {
      res = weft_error_errno(weftSystemError, "starting a connect thread");
      break;
    }
  for (size_t i = 0; i < started; i++) pthread_join(tids[i], NULL);
  for (size_t i = 0; i < started && res == weftSuccess; i++)
    if (parts[i].res != weftSuccess) res = weft_error_set(parts[i].res, "%s", parts[i].error);
  free(tids);
  return res;
}

weftResult_t device_enqueue_group(struct weftComm *const *comms,
                                  const struct weft_plan *const *plans, void *const *streams,
                                  size_t nops) {
  struct comm_part *parts = calloc(nops ? nops : 1, sizeof *parts);
  const struct weft_plan **sorted = calloc(nops ? nops : 1, sizeof *sorted);
  weftResult_t res = parts && sorted ? weftSuccess
                                     : weft_error_set(weftSystemError, "out of memory");
  size_t nparts = 0, used = 0;
  int cur = -1;
  cudaGetDevice(&cur);
  /* each comm's plans, in call order */
  for (size_t i = 0; i < nops && res == weftSuccess; i++) {
    size_t k = 0;
    while (k < nparts && parts[k].comm != comms[i]) k++;
    if (k < nparts) continue;
    parts[nparts] = (struct comm_part){.comm = comms[i], .plans = sorted + used,
                                       .stream = (cudaStream_t)streams[i]};
    if (comms[i]->cuda_dev < 0) comms[i]->cuda_dev = cur;
    for (size_t j = i; j < nops; j++)
      if (comms[j] == comms[i]) parts[nparts].plans[parts[nparts].n++] = plans[j];
    used += parts[nparts++].n;
  }
  for (size_t k = 0; k < nparts && res == weftSuccess; k++)
    for (size_t i = 0; i < parts[k].n && res == weftSuccess; i++)
      res = device_plan_refusal(parts[k].plans[i]);
  /* every comm of the group held from connection to launch, as above (each
   * one, so that each records its calls, refused or not) */
  size_t held = 0;
  for (; held < nparts; held++) {
    const weftResult_t r = comm_op_begin(parts[held].comm, COMM_OP_HOLD, NULL);
    if (res == weftSuccess) res = r;
  }
  if (res == weftSuccess) res = connect_parts(parts, nparts);
  struct trace_launch *launches = calloc(nops ? nops : 1, sizeof *launches);
  if (res == weftSuccess && launches == NULL) res = weft_error_set(weftSystemError, "out of memory");
  for (size_t k = 0; k < nparts && res == weftSuccess; k++) {
    int captured = 0;
    res = comm_launch(parts[k].comm, parts[k].plans, parts[k].n, parts[k].stream, &captured,
                      launches);
    record_calls(parts[k].comm, parts[k].plans, launches, parts[k].n, captured, res);
    parts[k].recorded = 1;
  }
  free(launches);
  /* the calls that did not go out count too, refused, so that the
   * numbers stay the peers' */
  for (size_t k = 0; k < held && res != weftSuccess; k++)
    if (!parts[k].recorded) record_calls(parts[k].comm, parts[k].plans, NULL, parts[k].n, 0, res);
  /* weftGetLastError(comm), written while the comms are held (an abort
   * waiting for them frees them after) */
  for (size_t k = 0; k < nparts && res != weftSuccess; k++)
    comm_error_text_set(parts[k].comm, weft_error_text());
  for (size_t k = 0; k < held; k++) device_op_end(parts[k].comm);
  if (cur >= 0) cudaSetDevice(cur);
  free(parts);
  free(sorted);
  return res;
}
