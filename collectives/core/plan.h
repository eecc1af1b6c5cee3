/* A plan: how one collective runs. The tuner fills it from the comm's shape
 * and the message size; executors and algorithms read it. Types only, and the
 * leaf helpers of collectives/core/plan.c. */
#ifndef WEFT_PLAN_H
#define WEFT_PLAN_H

#include <assert.h>
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
  /* all-to-all, gather and scatter run as groups of sends and receives; each
   * call's group holds a mark of this kind (enqueue_coll_mark), which runs
   * nothing but takes a collective's number and place in the trace, so that
   * ranks that disagree on the call are named as for a collective */
  COLL_GATHER,
  COLL_SCATTER,
  COLL_ALLTOALL,
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

/* A call's allowed (algorithm, protocol) pair, as a bit of weft_plan's
 * alg_select (the ring and the tree, each with either protocol). */
#define PLAN_SELECT(algo, proto) (1u << ((algo) * PROTO_NUM + (proto)))

struct weft_plan {
  enum coll_kind coll;
  /* 0: the tuner chooses; else the (algorithm, protocol) pairs the call
   * allows (PLAN_SELECT bits; NCCL's per-call algSelection) */
  unsigned alg_select;
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
  /* the call's number among its comm's compared collectives (signature.h),
   * from 1, taken where it is issued (a group's at its end), modulo 2^32;
   * 0: none */
  uint32_t sig_seq;
  const void *premul_ptr;    /* read when the op runs, for weftScalarDevice */
  int premul_device_only;    /* premul_ptr is device memory, which the host cannot read */
  int avg_prescaled;         /* a sum of input that avg scaled: signed as avg (redop.h) */
  uint64_t trace_id;         /* the call in its comm's trace (trace.h), 0: none */
};

/* "AllReduce", "Send", ...: "?" for a value that is no collective. */
static inline const char *coll_kind_name(enum coll_kind coll) {
  static const char *const names[COLL_NUM] = {"AllReduce", "AllGather", "ReduceScatter",
                                              "Broadcast", "Reduce",    "Send",
                                              "Recv",      "Gather",    "Scatter",
                                              "AlltoAll"};
  return (unsigned)coll < COLL_NUM ? names[coll] : "?";
}

/* The collectives with a root (a send's and a receive's peer is not one). */
static inline int coll_has_root(int32_t coll) {
  return coll == COLL_BROADCAST || coll == COLL_REDUCE || coll == COLL_GATHER ||
         coll == COLL_SCATTER;
}

/* A plan of one call's arguments, the fields the tuner and the call fill
 * later zero. Every field is stored on its own: a compound literal zeroes
 * the whole struct first, which compiles to a string store (rep stos)
 * whose start-up costs more than the rest of the stores together, on every
 * call. A field added to struct weft_plan is added here too (the assertion
 * is there to say so). */
static_assert(sizeof(struct weft_plan) == 96, "plan_init sets every field of weft_plan");
static inline void plan_init(struct weft_plan *plan, enum coll_kind coll, const void *sendbuf,
                             void *recvbuf, size_t count, weftDataType_t datatype,
                             weftRedOp_t op, int root) {
  plan->coll = coll;
  plan->alg_select = 0;
  plan->sendbuf = sendbuf;
  plan->recvbuf = recvbuf;
  plan->count = count;
  plan->datatype = datatype;
  plan->op = op;
  plan->root = root;
  plan->algo = ALGO_RING;
  plan->proto = PROTO_SIMPLE;
  plan->nchannels = 0;
  plan->on_device = 0;
  __builtin_memset(plan->premul_scalar, 0, sizeof plan->premul_scalar);
  plan->sig_seq = 0;
  plan->premul_ptr = NULL;
  plan->premul_device_only = 0;
  plan->avg_prescaled = 0;
  plan->trace_id = 0;
}

/* weftTypeSize, inline for the paths every call takes: bytes per element,
 * 0 for a value that is no datatype. */
static inline size_t plan_type_size(weftDataType_t datatype) {
  switch (datatype) {
    case weftInt8: case weftUint8: case weftFloat8e4m3: case weftFloat8e5m2: return 1;
    case weftFloat16: case weftBfloat16: return 2;
    case weftInt32: case weftUint32: case weftFloat32: return 4;
    case weftInt64: case weftUint64: case weftFloat64: return 8;
    default: return 0;
  }
}

static inline int plan_is_sendrecv(const struct weft_plan *plan) {
  return plan->coll == COLL_SEND || plan->coll == COLL_RECV;
}

/* The mark of an all-to-all, gather or scatter (see enum coll_kind). */
static inline int plan_is_mark(const struct weft_plan *plan) {
  return plan->coll == COLL_GATHER || plan->coll == COLL_SCATTER || plan->coll == COLL_ALLTOALL;
}

#endif
