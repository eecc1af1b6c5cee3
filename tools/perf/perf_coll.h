/* What a collective's tool tells the perf driver: its name, what it
 * honours, its bandwidth formulas, its call and its expected results. */
#ifndef WEFT_PERF_COLL_H
#define WEFT_PERF_COLL_H

#include <stddef.h>

#include "weft.h"

/* One call as the check sees it: its arguments, the rank that made it, and
 * the seed of every rank's inputs (perf_input). */
struct perf_call {
  size_t count;        /* what the call is given (the count column) */
  weftDataType_t type;
  int op;              /* a weftRedOp_t or PERF_OP_MULSUM */
  int root;            /* -1 where the collective has none */
  int rank, nranks;    /* in the communicator the call ran on */
  unsigned seed;
};

/* Element counts of one row (nccl-tests' GetCollByteCount). */
struct perf_counts {
  size_t send, recv; /* elements in one rank's send and receive buffers */
  size_t count;      /* what each call is given */
};

struct perf_coll {
  const char *name; /* "all_reduce" */
  int uses_op;      /* the op reaches the call and the check */
  /* the redop column where it does not print -o's op (and -o runs its first
   * op only): "none", or "" (hypercube); NULL: each of -o's ops in turn */
  const char *op_column;
  int uses_root;    /* honours -r */
  int pow2_ranks;   /* runs only on a power-of-2 number of ranks, else skips */
  int in_place_unchecked; /* in place is timed, #wrong N/A (nccl-tests' reportErrors 0) */
  /* algorithm bandwidth = the size column x factor / time; NULL for 1 */
  double (*algbw_factor)(int nranks);
  /* bus bandwidth = algorithm bandwidth x factor (nccl-tests' formulas) */
  double (*busbw_factor)(int nranks);
  /* the bytes all ranks together must read and write in memory, per byte of
   * the size column: the bound's memory traffic (docs/perf.md) */
  double (*traffic)(int nranks, int in_place);
  /* the counts for a sweep size of nbytes, with nccl-tests' rounding */
  void (*counts)(size_t nbytes, size_t elem_nbytes, int nranks, struct perf_counts *out);
  /* one operation; stream is NULL (each call done when it returns) or a host
   * stream (-z 0). In place when sendbuf is recvbuf, or inside it as the
   * driver places it (a gather's input in the rank's block of its output). */
  weftResult_t (*run)(const void *sendbuf, void *recvbuf, size_t count, weftDataType_t datatype,
                      weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream);
  /* the value call->rank should hold at recv index i, and a magnitude for
   * the tolerance (sum of |inputs| that went into it); NAN where nothing is
   * defined on that rank */
  void (*expect)(size_t i, const struct perf_call *call, double *value_out,
                 double *magnitude_out);
  /* reads the collective's own environment variables before anything runs;
   * nonzero refuses them (the reason on stderr, exit 2). NULL: none */
  int (*read_env)(const char *prog);
};

#endif
