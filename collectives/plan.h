/* A plan: how one collective runs. The tuner fills it from the comm's shape
 * and the message size; algorithms read it. */
#ifndef WEFT_PLAN_H
#define WEFT_PLAN_H

#include <stddef.h>

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
/* Algorithms (WEFT_ALGO names: ring, tree, rd, cma, bulk). */
enum coll_algo {
  ALGO_RING = 0, /* pipelined ring: bandwidth-optimal, every collective */
  ALGO_TREE,     /* double binary tree all-reduce, pipelined: log-depth latency */
  ALGO_RD,       /* recursive doubling all-reduce: fewest steps for small messages */
  ALGO_CMA,      /* single copy between ranks of one host (collectives/cma.c) */
  ALGO_BULK,     /* ring of whole chunks moved by the transport (collectives/bulk.c) */
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
};

const char *coll_kind_name(enum coll_kind coll);

/* User ops (collectives/redop.c): whether op may reduce datatype on comm, and
 * the input scaled by a pre-multiply op's scalar, in a buffer to free. */
weftResult_t redop_check(struct weftComm *comm, weftRedOp_t op, weftDataType_t datatype);
weftResult_t redop_premul(struct weftComm *comm, weftRedOp_t op, weftDataType_t datatype,
                          const void *src, size_t count, void **scaled_out);

/* Chooses algorithm, protocol and channels for plan (its call fields set),
 * within what WEFT_ALGO and WEFT_PROTO allow (collectives/tuner.c). */
void plan_tune(const struct weftComm *comm, struct weft_plan *plan);
/* The cost model's time for a tuned plan, in microseconds (weftGroupSimulateEnd). */
double plan_estimate_us(const struct weftComm *comm, const struct weft_plan *plan);
const char *tuner_algo_name(int algo);
const char *tuner_proto_name(int proto);
/* Parses a WEFT_ALGO/WEFT_PROTO list into allowed[collective][name index];
 * returns -1 when it met an unknown name (those are ignored). */
int tuner_parse(const char *spec, const char *const *names, int nnames,
                uint8_t allowed[COLL_NUM_RING][8]);

/* Runs plan on the calling thread (the host executor). */
weftResult_t plan_run_host(struct weftComm *comm, const struct weft_plan *plan);

/* WEFT_CHECK=1: allgathers plan's signature (collective, count, datatype, op,
 * root, sequence number) over the bootstrap and returns weftInvalidUsage on
 * every rank, with a message naming the ranks and what differs, when they do
 * not all match (collectives/check.c). Blocks until every rank has called it
 * or the timeout. Otherwise, and for sends and receives, returns weftSuccess
 * at once, with no traffic. */
weftResult_t check_signatures(struct weftComm *comm, const struct weft_plan *plan);

static inline int plan_is_p2p(const struct weft_plan *plan) {
  return plan->coll == COLL_SEND || plan->coll == COLL_RECV;
}

/* Algorithms: one channel's share of the buffers, elements [offset, offset +
 * count) of the buffer (all-reduce, broadcast, reduce) or of each rank's block
 * (all-gather, reduce-scatter). */
typedef weftResult_t (*algo_fn)(struct weftComm *comm, struct weft_channel *ch,
                                const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t ring_allreduce(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t tree_allreduce(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t rd_allreduce(struct weftComm *comm, struct weft_channel *ch,
                          const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t ring_allgather(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t ring_reducescatter(struct weftComm *comm, struct weft_channel *ch,
                                const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t ring_broadcast(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count);
weftResult_t ring_reduce(struct weftComm *comm, struct weft_channel *ch,
                         const struct weft_plan *plan, size_t offset, size_t count);

#endif
