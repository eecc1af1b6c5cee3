/* A plan: how one collective runs. The tuner fills it from the comm's shape
 * and the message size; executors and algorithms read it. Types only, and the
 * leaf helpers of collectives/core/plan.c. */
#ifndef WEFT_PLAN_H
#define WEFT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

enum coll_kind {
  COLL_ALLREDUCE = 0,
  COLL_ALLGATHER,
  COLL_REDUCESCATTER,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_NUM_RING, /* above: ring collectives; below: point-to-point */
  COLL_SEND = COLL_NUM_RING,
  COLL_RECV,
  COLL_NUM
};
/* Algorithms (WEFT_ALGO names: ring, tree, rd, direct, cma, bulk). */
enum coll_algo {
  ALGO_RING = 0, /* pipelined ring: bandwidth-optimal, every collective */
  ALGO_TREE,     /* double binary tree all-reduce, pipelined: log-depth latency */
  ALGO_RD,       /* recursive doubling all-reduce: fewest steps for small messages */
  ALGO_DIRECT,   /* every rank's input to every rank, one step: small all-reduce, few ranks */
  ALGO_CMA,      /* single copy between ranks of one host (collectives/algo/cma.c) */
  ALGO_BULK,     /* ring of whole chunks moved by the transport (collectives/algo/bulk.c) */
  ALGO_NUM
};
/* Protocols (WEFT_PROTO names: simple, ll). */
enum coll_proto {
  PROTO_SIMPLE = 0, /* data in slots, a tail counter says which are full */
  PROTO_LL,         /* data and flag share each 8-byte word: one load sees both */
  PROTO_NUM
};

struct weft_plan {
  enum coll_kind coll;
  const void *sendbuf;
  void *recvbuf;
  size_t count; /* elements per rank for all-gather and reduce-scatter, else in total */
  weftDataType_t datatype;
  weftRedOp_t op;
  int root; /* the root of broadcast and reduce; the peer of send and recv */
  enum coll_algo algo;
  enum coll_proto proto;
  int nchannels;
  int on_device; /* buffers in CUDA device memory: the device executor runs it */
  /* a pre-multiply op's scalar as the call saw it (redop_capture): the op
   * may be destroyed once the call returns, as NCCL allows */
  char premul_scalar[8];     /* the value, for weftScalarHostImmediate */
  const void *premul_ptr;    /* read when the op runs, for weftScalarDevice */
  int premul_device_only;    /* premul_ptr is device memory, which the host cannot read */
  uint64_t trace_id;         /* the call in its comm's trace (trace.h), 0: none */
};

const char *coll_kind_name(enum coll_kind coll);

static inline int plan_is_sendrecv(const struct weft_plan *plan) {
  return plan->coll == COLL_SEND || plan->coll == COLL_RECV;
}

#endif
