/* The collective entry points: check arguments, then run now, queue on a host
 * stream, or record the operation in the open group. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/param.h"
#include "../../transport/base/status.h"
#include "../exec/device/device.h"
#include "comm_lifecycle.h"
#include "group.h"
#include "stream.h"
#include "../tune/tuner.h"
#include "../core/redop.h"
#include "../core/signature.h"
#include "../core/trace.h"

/* --- argument checks --------------------------------------------------- */

static int ranges_overlap(const void *a, size_t a_nbytes, const void *b, size_t b_nbytes) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + b_nbytes && y < x + a_nbytes;
}

static int coll_has_op(enum coll_kind c) {
  return c == COLL_ALLREDUCE || c == COLL_REDUCESCATTER || c == COLL_REDUCE;
}

/* Which of plan's buffers this rank touches: a non-root broadcast reads no
 * input, a non-root reduce writes no output, a send has no output and a
 * receive no input. */
static void plan_uses(const struct weftComm *comm, const struct weft_plan *plan, int *uses_send,
                      int *uses_recv) {
  *uses_send = 1;
  *uses_recv = 1;
  switch (plan->coll) {
    case COLL_SEND: *uses_recv = 0; break;
    case COLL_RECV: *uses_send = 0; break;
    case COLL_BROADCAST: *uses_send = comm->rank == plan->root; break;
    case COLL_REDUCE: *uses_recv = comm->rank == plan->root; break;
    default: break;
  }
}

/* Checks plan's arguments. The count, datatype, op and root are the same on
 * every rank of a correct program, so a bad one is bad everywhere (and
 * ranks that differ are WEFT_CHECK's to find); the buffers are this rank's
 * own, so a bad one may leave the peers waiting in the collective:
 * *alone_out says so. uses_out[0..1]: whether this rank touches the input
 * and the output (plan_uses; both for a call of no elements). */
static weftResult_t plan_check(struct weftComm *comm, const struct weft_plan *plan,
                               int *alone_out, int uses_out[2]) {
  *alone_out = 0;
  uses_out[0] = uses_out[1] = 1;
  WEFT_TRY(comm_check(comm));
  const char *name = coll_kind_name(plan->coll);
  /* the comm's state first: after weftCommFinalize or a revoke every call is
   * weftInvalidUsage, whatever its arguments. Asked only: the call may run
   * later (a group, a host stream), and begins again with a hold when it
   * runs */
  WEFT_TRY(comm_op_begin(comm, 0, name));
  const size_t esize = plan_type_size(plan->datatype);
  const size_t n = (size_t)comm->nranks;
  const enum coll_kind c = plan->coll;
  if (esize == 0)
    return weft_error_set(weftInvalidArgument, "%s: invalid datatype %d", name,
                          (int)plan->datatype);
  if (coll_has_op(c) && !redop_is_builtin(plan->op) &&
      redop_check(comm, plan->op, plan->datatype) != weftSuccess)
    return weft_error_set(weftInvalidArgument, "%s: %s", name, weft_error_text());
  if (plan->count > SIZE_MAX / 16 / n)
    return weft_error_set(weftInvalidArgument, "%s: count %zu is too large", name, plan->count);
  int rooted = c == COLL_BROADCAST || c == COLL_REDUCE;
  if (rooted && (plan->root < 0 || plan->root >= comm->nranks))
    return weft_error_set(weftInvalidArgument, "%s: root %d out of range [0, %d)", name,
                          plan->root, comm->nranks);
  if (plan_is_sendrecv(plan) && (plan->root < 0 || plan->root >= comm->nranks))
    return weft_error_set(weftInvalidArgument, "%s: peer %d out of range [0, %d)", name,
                          plan->root, comm->nranks);
  if (plan->count == 0) return weftSuccess;

  /* which buffers this rank touches, and how large they are */
  size_t send_nbytes = plan->count * esize, recv_nbytes = plan->count * esize;
  if (c == COLL_ALLGATHER) recv_nbytes *= n;
  if (c == COLL_REDUCESCATTER) send_nbytes *= n;
  plan_uses(comm, plan, &uses_out[0], &uses_out[1]);
  const int uses_send = uses_out[0], uses_recv = uses_out[1];
  *alone_out = 1;
  if (uses_send && plan->sendbuf == NULL)
    return weft_error_set(weftInvalidArgument, "%s: sendbuff is NULL with count %zu", name,
                          plan->count);
  if (uses_recv && plan->recvbuf == NULL)
    return weft_error_set(weftInvalidArgument, "%s: recvbuff is NULL with count %zu", name,
                          plan->count);
  if (!uses_send || !uses_recv) {
    *alone_out = 0;
    return weftSuccess;
  }

  /* in place: the input is where the collective would put it */
  const char *in_place = plan->recvbuf;
  if (c == COLL_ALLGATHER) in_place = (const char *)plan->recvbuf + (size_t)comm->rank * send_nbytes;
  if (c == COLL_REDUCESCATTER)
    in_place = (const char *)plan->sendbuf + (size_t)comm->rank * recv_nbytes;
  int is_in_place = c == COLL_REDUCESCATTER ? in_place == (const char *)plan->recvbuf
                                            : in_place == (const char *)plan->sendbuf;
  if (!is_in_place && ranges_overlap(plan->sendbuf, send_nbytes, plan->recvbuf, recv_nbytes))
    return weft_error_set(weftInvalidArgument,
                          "%s: sendbuff and recvbuff overlap without being in place", name);
  *alone_out = 0;
  return weftSuccess;
}

/* Whether plan, checked, is a send or receive of no elements on a stream this
 * build can take: it moves nothing, so it does nothing, whatever its buffer
 * (NULL, or one past the end of a device tensor) and its stream (a CUDA
 * stream, NULL or a host stream). Decided by the count alone, which both
 * ends of a pair share, and before any CUDA call: a peer whose empty buffer
 * is NULL and one whose empty buffer is device memory agree, and the pair's
 * other messages keep their order. A build without CUDA takes no stream
 * but its own. */
static int sendrecv_is_empty(const struct weft_plan *plan, weftStream_t stream) {
  if (!plan_is_sendrecv(plan) || plan->count != 0) return 0;
  struct host_stream *hs;
  if (stream == NULL || device_built() || stream_lookup(stream, &hs) == weftSuccess) return 1;
  weft_error_clear();
  return 0;
}

/* --- a call made again ------------------------------------------------- */

/* The last collective this thread ran at once (outside a group, on no
 * stream, a built-in op, host memory), with the checks it passed and the
 * tuner's pick where that pick depends on the call's arguments alone
 * (plan_tune's 1). A call of the same arguments on the same comm, as a
 * training step's or a benchmark's loop of small calls makes, would pass
 * the same checks and get the same pick: it takes both from here, which
 * saves about a third of such a call's instructions. Asked again every
 * time: the comm's check and state, whether the buffers are device memory
 * now, the group depth, and weft_memo_epoch (settings reset, a comm freed).
 * Per thread, as the tuner's own memo: no lock, no pick half written. */
struct call_memo {
  const struct weftComm *comm; /* NULL: none */
  uint64_t epoch;
  enum coll_kind coll;
  const void *sendbuf;
  void *recvbuf;
  size_t count;
  weftDataType_t datatype;
  weftRedOp_t op;
  int root;
  int uses[2]; /* plan_uses' */
  enum coll_algo algo;
  enum coll_proto proto;
  int nchannels;
};
static __thread struct call_memo call_memo;

static inline int call_memo_hit(const struct weftComm *comm, const struct weft_plan *plan,
                                weftStream_t stream) {
  const struct call_memo *m = &call_memo;
  return m->comm == comm && comm != NULL && stream == NULL && plan->alg_select == 0 &&
         m->coll == plan->coll &&
         m->count == plan->count && m->sendbuf == plan->sendbuf &&
         m->recvbuf == plan->recvbuf && m->datatype == plan->datatype && m->op == plan->op &&
         m->root == plan->root && m->epoch == weft_memo_epoch_get() &&
         group_depth_get() == 0 && comm_check(comm) == weftSuccess &&
         comm_life(comm) == COMM_READY;
}

static void call_memo_keep(const struct weftComm *comm, const struct weft_plan *plan,
                           const int uses[2], uint64_t epoch) {
  call_memo = (struct call_memo){.comm = comm, .epoch = epoch, .coll = plan->coll,
                                 .sendbuf = plan->sendbuf, .recvbuf = plan->recvbuf,
                                 .count = plan->count, .datatype = plan->datatype,
                                 .op = plan->op, .root = plan->root,
                                 .uses = {uses[0], uses[1]}, .algo = plan->algo,
                                 .proto = plan->proto, .nchannels = plan->nchannels};
}

/* compat_select_next's: the pairs the thread's next collective allows. */
static __thread unsigned select_next;

void compat_select_next(unsigned alg_select) { select_next = alg_select; }

void compat_coll_refused(weftComm_t comm, int coll, size_t count, weftDataType_t datatype,
                         weftRedOp_t op, int root, weftResult_t res) {
  if (comm != NULL && comm_check(comm) == weftSuccess && (unsigned)coll < COLL_NUM) {
    struct weft_plan plan;
    plan_init(&plan, (enum coll_kind)coll, NULL, NULL, count, datatype, op, root);
    comm->seq++; /* as every call of the comm counts */
    group_call_done(comm, &plan, res);
  }
  group_fail(res);
}

static weftResult_t coll_enqueue(struct weftComm *comm, struct weft_plan *plan,
                                 weftStream_t stream) {
  if (__builtin_expect(select_next != 0, 0)) {
    plan->alg_select = select_next;
    select_next = 0;
  }
  weft_error_clear();
  if (call_memo_hit(comm, plan, stream) &&
      device_plan_on_device(plan, call_memo.uses[0], call_memo.uses[1]) == 0) {
    plan->algo = call_memo.algo;
    plan->proto = call_memo.proto;
    plan->nchannels = call_memo.nchannels;
    comm->seq++;
    signature_number(&comm->signature_seq, plan);
    return launch_collective(comm, plan, 1);
  }
  /* read before the checks: a reset meanwhile leaves the memo stale, never wrong */
  const uint64_t epoch = weft_memo_epoch_get();
  int alone = 0, uses[2];
  weftResult_t res = plan_check(comm, plan, &alone, uses);
  if (res == weftSuccess && coll_has_op(plan->coll) && !redop_is_builtin(plan->op))
    redop_capture(comm, plan);
  if (res == weftSuccess && sendrecv_is_empty(plan, stream)) {
    comm->seq++; /* as every call of the comm counts */
    trace_set_state(comm->trace, trace_record(comm->trace, plan, 0), TRACE_COMPLETED, -1, res);
    return weftSuccess;
  }
  struct host_stream *hs = NULL;
  /* device memory: stream is the caller's CUDA stream. The buffers this
   * rank touches are all device memory or all host memory: either executor
   * would fault on the other kind. */
  const int where = res == weftSuccess ? device_plan_on_device(plan, uses[0], uses[1]) : 0;
  if (where < 0) {
    res = weft_error_set(weftInvalidArgument,
                         "%s: sendbuff and recvbuff are in different memories (one is CUDA "
                         "device memory, the other pageable host memory): use device, "
                         "managed or pinned memory for both, or host memory for both",
                         coll_kind_name(plan->coll));
    alone = 1;
  }
  plan->on_device = where > 0;
  if (res == weftSuccess && !plan->on_device && plan->count > 0 && plan->premul_device_only) {
    /* the host executor would read it; the peers may not refuse alike (their
     * buffers or ops may differ), so the comm breaks for them below */
    res = weft_error_set(weftInvalidUsage,
                         "%s: pre-multiply op %d keeps its scalar in device memory "
                         "(weftScalarDevice), which host-memory buffers cannot use: make "
                         "the op with weftScalarHostImmediate, or use device buffers",
                         coll_kind_name(plan->coll), (int)plan->op);
    alone = 1;
  }
  if (res == weftSuccess && plan->on_device && stream != NULL && stream_is_host(stream)) {
    /* a CUDA call would take the host stream for a cudaStream_t */
    res = weft_error_set(weftInvalidArgument,
                         "%s: device buffers on a weft host stream (weftStreamCreate): pass a "
                         "CUDA stream, or NULL",
                         coll_kind_name(plan->coll));
    alone = 1;
  }
  if (res == weftSuccess && stream != NULL && !plan->on_device) {
    res = stream_lookup(stream, &hs);
    alone = res != weftSuccess;
    if (res != weftSuccess && plan->count == 0 && device_built()) {
      /* a collective of no elements moves nothing and launches nothing (as
       * on device memory): on a stream that is not weft's, which in a CUDA
       * build may be a CUDA stream with NULL buffers (empty tensors), it is
       * done, not a broken communicator */
      weft_error_clear();
      comm->seq++; /* as every call of the comm counts */
      group_call_done(comm, plan, weftSuccess);
      return weftSuccess;
    }
  }
  if (res != weftSuccess) {
    /* the peers would wait for this rank until the timeout: break the comm,
     * so that they fail now */
    if (comm != NULL && comm_check(comm) == weftSuccess) {
      /* the call counts, refused, so that the numbers stay the peers' */
      group_call_done(comm, plan, res);
      if (alone && comm->nranks > 1) comm_fail_alone(comm, res);
      else comm_error_keep(comm, res);
    }
    group_fail(res);
    return res;
  }
  const int tuned_by_call = plan_tune(comm, plan);
  comm->seq++;
  /* a group's calls are numbered and recorded in the trace at its end
   * (group.c): a simulated group (weftGroupSimulateEnd) runs nothing, and
   * takes no numbers that its peers, which may not simulate it, would not */
  if (group_depth_get() > 0) return group_record(comm, plan, stream);
  signature_number(&comm->signature_seq, plan);
  /* host calls that run later (device ones are recorded with their
   * launches, device_launch.c) */
  if (hs != NULL && !plan->on_device) plan->trace_id = trace_record(comm->trace, plan, 0);
  if (plan->on_device) return device_enqueue(comm, plan, stream);
  if (hs != NULL || plan_is_sendrecv(plan)) {
    struct group_op op = {.comm = comm, .plan = *plan, .stream = stream};
    if (hs != NULL) return stream_enqueue(hs, &op, 1);
    /* the id set after the copy: set before, the copy would load it back at once */
    op.plan.trace_id = trace_record(comm->trace, plan, 1);
    return group_launch(&op, 1, 0);
  }
  /* a collective runs here from the plan as it is: copied into a group_op,
   * its fields just stored one by one would be loaded back at once in wider
   * words, which the store buffer cannot forward (stalls worth a tenth of
   * an 8-byte all-reduce); it is recorded in the trace as it runs */
  if (tuned_by_call && plan->count > 0 && redop_is_builtin(plan->op))
    call_memo_keep(comm, plan, uses, epoch);
  return launch_collective(comm, plan, 1);
}

weftResult_t weftAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                           weftStream_t stream) {
  struct weft_plan plan;
  plan_init(&plan, COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, -1);
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  struct weft_plan plan;
  plan_init(&plan, COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, weftSum, -1);
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                               weftStream_t stream) {
  struct weft_plan plan;
  plan_init(&plan, COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1);
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           weftDataType_t datatype, int root, weftComm_t comm,
                           weftStream_t stream) {
  struct weft_plan plan;
  plan_init(&plan, COLL_BROADCAST, sendbuff, recvbuff, count, datatype, weftSum, root);
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftBcast(void *buff, size_t count, weftDataType_t datatype, int root,
                       weftComm_t comm, weftStream_t stream) {
  return weftBroadcast(buff, buff, count, datatype, root, comm, stream);
}

weftResult_t weftReduce(const void *sendbuff, void *recvbuff, size_t count,
                        weftDataType_t datatype, weftRedOp_t op, int root, weftComm_t comm,
                        weftStream_t stream) {
  struct weft_plan plan;
  plan_init(&plan, COLL_REDUCE, sendbuff, recvbuff, count, datatype, op, root);
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftSend(const void *sendbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, weftStream_t stream) {
  struct weft_plan plan;
  plan_init(&plan, COLL_SEND, sendbuff, NULL, count, datatype, weftSum, peer);
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftRecv(void *recvbuff, size_t count, weftDataType_t datatype, int peer,
                      weftComm_t comm, weftStream_t stream) {
  struct weft_plan plan;
  plan_init(&plan, COLL_RECV, NULL, recvbuff, count, datatype, weftSum, peer);
  return coll_enqueue(comm, &plan, stream);
}
