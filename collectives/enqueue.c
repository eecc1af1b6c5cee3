/* The collective entry points: check arguments, then run now or record the
 * operation in the open group. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../transport/status.h"
#include "plan.h"

size_t weftTypeSize(weftDataType_t datatype) {
  switch (datatype) {
    case weftInt8: case weftUint8: case weftFloat8e4m3: case weftFloat8e5m2: return 1;
    case weftFloat16: case weftBfloat16: return 2;
    case weftInt32: case weftUint32: case weftFloat32: return 4;
    case weftInt64: case weftUint64: case weftFloat64: return 8;
    default: return 0;
  }
}

const char *coll_kind_name(enum coll_kind coll) {
  static const char *names[COLL_NUM] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                        "Reduce"};
  return coll < COLL_NUM ? names[coll] : "?";
}

/* --- groups --------------------------------------------------------------- */

struct group_op {
  struct weftComm *comm;
  struct weft_plan plan;
};

static _Thread_local int group_depth;
static _Thread_local struct group_op *group_ops;
static _Thread_local size_t group_nops, group_cap;
static _Thread_local weftResult_t group_error; /* first failure while recording */

weftResult_t weftGroupStart(void) {
  if (group_depth == 0) group_error = weftSuccess;
  group_depth++;
  return weftSuccess;
}

/* Runs one operation with the comm marked busy, so that an abort waits. */
static weftResult_t op_run(struct weftComm *comm, const struct weft_plan *plan) {
  __atomic_add_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
  weftResult_t res;
  if (__atomic_load_n(&comm->abort_flag, __ATOMIC_SEQ_CST)) {
    res = weft_error_set(weftRemoteError, "communicator was aborted");
  } else if (comm->async_error != weftSuccess) {
    res = weft_error_set(comm->async_error,
                         "communicator is broken by an earlier error: %s", comm->last_error);
  } else {
    res = plan_run_host(comm, plan);
  }
  if (res != weftSuccess) comm_fail(comm, res);
  __atomic_sub_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
  return res;
}

/* The operations of one communicator in a group, run by one thread. */
struct comm_batch {
  struct weftComm *comm;
  const struct group_op *all; /* every op of the group; this batch runs its comm's */
  size_t nall;
  weftResult_t res;
  char error[1024];
  pthread_t tid;
};

static void *batch_main(void *p) {
  struct comm_batch *b = p;
  b->res = weftSuccess;
  for (size_t i = 0; i < b->nall && b->res == weftSuccess; i++)
    if (b->all[i].comm == b->comm) b->res = op_run(b->comm, &b->all[i].plan);
  if (b->res != weftSuccess) snprintf(b->error, sizeof b->error, "%s", weft_error_text());
  return NULL;
}

weftResult_t weftGroupEnd(void) {
  if (group_depth == 0)
    return weft_error_set(weftInvalidUsage, "weftGroupEnd without weftGroupStart");
  if (--group_depth > 0) return weftSuccess;
  struct group_op *ops = group_ops;
  size_t nops = group_nops;
  group_ops = NULL;
  group_nops = group_cap = 0;
  weftResult_t res = group_error;
  if (res != weftSuccess) {
    free(ops);
    return res; /* the error text is the recording failure's */
  }
  /* one batch per communicator, run concurrently: one thread may drive several ranks */
  size_t nbatches = 0;
  struct comm_batch *batches = calloc(nops ? nops : 1, sizeof *batches);
  if (batches == NULL) {
    free(ops);
    return weft_error_set(weftSystemError, "out of memory");
  }
  for (size_t i = 0; i < nops; i++) {
    size_t b = 0;
    while (b < nbatches && batches[b].comm != ops[i].comm) b++;
    if (b == nbatches) batches[nbatches++] = (struct comm_batch){.comm = ops[i].comm, .all = ops, .nall = nops};
  }
  size_t started = 0;
  for (size_t b = 1; b < nbatches; b++, started++)
    if (pthread_create(&batches[b].tid, NULL, batch_main, &batches[b]) != 0) {
      res = weft_error_errno(weftSystemError, "starting a group thread");
      break;
    }
  if (nbatches > 0 && res == weftSuccess) batch_main(&batches[0]);
  for (size_t b = 1; b <= started; b++) pthread_join(batches[b].tid, NULL);
  for (size_t b = 0; b < nbatches && res == weftSuccess; b++)
    if (batches[b].res != weftSuccess)
      res = weft_error_set(batches[b].res, "rank %d: %s", batches[b].comm->rank, batches[b].error);
  free(batches);
  free(ops);
  return res;
}

static weftResult_t group_record(struct weftComm *comm, const struct weft_plan *plan) {
  if (group_nops == group_cap) {
    size_t cap = group_cap ? group_cap * 2 : 16;
    struct group_op *ops = realloc(group_ops, cap * sizeof *ops);
    if (ops == NULL) return weft_error_set(weftSystemError, "out of memory");
    group_ops = ops;
    group_cap = cap;
  }
  group_ops[group_nops++] = (struct group_op){.comm = comm, .plan = *plan};
  return weftSuccess;
}

/* --- argument checks --------------------------------------------------- */

static int ranges_overlap(const void *a, size_t a_nbytes, const void *b, size_t b_nbytes) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + b_nbytes && y < x + a_nbytes;
}

static int coll_has_op(enum coll_kind c) {
  return c == COLL_ALLREDUCE || c == COLL_REDUCESCATTER || c == COLL_REDUCE;
}

static weftResult_t plan_check(struct weftComm *comm, const struct weft_plan *plan) {
  WEFT_TRY(comm_check(comm));
  const char *name = coll_kind_name(plan->coll);
  const size_t esize = weftTypeSize(plan->datatype);
  const size_t n = (size_t)comm->nranks;
  const enum coll_kind c = plan->coll;
  if (esize == 0)
    return weft_error_set(weftInvalidArgument, "%s: invalid datatype %d", name,
                          (int)plan->datatype);
  if (coll_has_op(c) && ((int)plan->op < 0 || plan->op >= weftNumOps))
    return weft_error_set(weftInvalidArgument, "%s: invalid reduction op %d", name,
                          (int)plan->op);
  if (plan->count > SIZE_MAX / 16 / n)
    return weft_error_set(weftInvalidArgument, "%s: count %zu is too large", name, plan->count);
  int rooted = c == COLL_BROADCAST || c == COLL_REDUCE;
  if (rooted && (plan->root < 0 || plan->root >= comm->nranks))
    return weft_error_set(weftInvalidArgument, "%s: root %d out of range [0, %d)", name,
                          plan->root, comm->nranks);
  if (comm->finalized) return weft_error_set(weftInvalidUsage, "%s: comm was finalized", name);
  if (plan->count == 0) return weftSuccess;

  /* which buffers this rank touches, and how large they are */
  size_t send_nbytes = plan->count * esize, recv_nbytes = plan->count * esize;
  if (c == COLL_ALLGATHER) recv_nbytes *= n;
  if (c == COLL_REDUCESCATTER) send_nbytes *= n;
  int uses_send = c != COLL_BROADCAST || comm->rank == plan->root;
  int uses_recv = c != COLL_REDUCE || comm->rank == plan->root;
  if (uses_send && plan->sendbuf == NULL)
    return weft_error_set(weftInvalidArgument, "%s: sendbuff is NULL with count %zu", name,
                          plan->count);
  if (uses_recv && plan->recvbuf == NULL)
    return weft_error_set(weftInvalidArgument, "%s: recvbuff is NULL with count %zu", name,
                          plan->count);
  if (!uses_send || !uses_recv) return weftSuccess;

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
  return weftSuccess;
}

static weftResult_t coll_enqueue(struct weftComm *comm, struct weft_plan *plan,
                                 weftStream_t stream) {
  weft_error_clear();
  weftResult_t res = plan_check(comm, plan);
  if (res != weftSuccess) {
    if (comm != NULL && comm_check(comm) == weftSuccess)
      snprintf(comm->last_error, sizeof comm->last_error, "%s", weft_error_text());
    if (group_depth > 0 && group_error == weftSuccess) group_error = res;
    return res;
  }
  if (stream != NULL) {
    res = weft_error_set(weftInvalidArgument,
                         "%s: streams are not supported for host buffers; pass NULL",
                         coll_kind_name(plan->coll));
    snprintf(comm->last_error, sizeof comm->last_error, "%s", weft_error_text());
    return res;
  }
  plan_tune(comm, plan);
  comm->seq++;
  if (group_depth > 0) return group_record(comm, plan);
  return op_run(comm, plan);
}

weftResult_t weftAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                           weftStream_t stream) {
  struct weft_plan plan = {.coll = COLL_ALLREDUCE, .sendbuf = sendbuff, .recvbuf = recvbuff,
                           .count = count, .datatype = datatype, .op = op, .root = -1};
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  struct weft_plan plan = {.coll = COLL_ALLGATHER, .sendbuf = sendbuff, .recvbuf = recvbuff,
                           .count = sendcount, .datatype = datatype, .op = weftSum, .root = -1};
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                               weftStream_t stream) {
  struct weft_plan plan = {.coll = COLL_REDUCESCATTER, .sendbuf = sendbuff, .recvbuf = recvbuff,
                           .count = recvcount, .datatype = datatype, .op = op, .root = -1};
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           weftDataType_t datatype, int root, weftComm_t comm,
                           weftStream_t stream) {
  struct weft_plan plan = {.coll = COLL_BROADCAST, .sendbuf = sendbuff, .recvbuf = recvbuff,
                           .count = count, .datatype = datatype, .op = weftSum, .root = root};
  return coll_enqueue(comm, &plan, stream);
}

weftResult_t weftBcast(void *buff, size_t count, weftDataType_t datatype, int root,
                       weftComm_t comm, weftStream_t stream) {
  return weftBroadcast(buff, buff, count, datatype, root, comm, stream);
}

weftResult_t weftReduce(const void *sendbuff, void *recvbuff, size_t count,
                        weftDataType_t datatype, weftRedOp_t op, int root, weftComm_t comm,
                        weftStream_t stream) {
  struct weft_plan plan = {.coll = COLL_REDUCE, .sendbuf = sendbuff, .recvbuf = recvbuff,
                           .count = count, .datatype = datatype, .op = op, .root = root};
  return coll_enqueue(comm, &plan, stream);
}
