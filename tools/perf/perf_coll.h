/* What a collective's tool tells the perf driver: its name, what it
 * honours, its bandwidth formulas, its call and its expected results. */
#ifndef WEFT_PERF_COLL_H
#define WEFT_PERF_COLL_H

#include <stddef.h>

#include "weft.h"

struct perf_coll {
  const char *name; /* "all_reduce" */
  int uses_op;      /* prints the op column and honours -o */
  int uses_root;    /* honours -r */
  int no_in_place;  /* in-place columns print N/A */
  /* bus bandwidth = algorithm bandwidth x factor (nccl-tests' formulas) */
  double (*busbw_factor)(int nranks);
  /* the bytes all ranks together must read and write in memory, per byte of
   * the size column: the bound's memory traffic (docs/perf.md) */
  double (*traffic)(int nranks, int in_place);
  /* elements sent and received per rank for a size column of nbytes */
  void (*counts)(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                 size_t *recv_count, size_t *count);
  /* one operation; stream is NULL (each call done when it returns) or a host
   * stream (-z 0) */
  weftResult_t (*run)(const void *sendbuf, void *recvbuf, size_t count, weftDataType_t datatype,
                      weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream);
  /* the value rank `rank` should hold at recv index i under op (a weftRedOp_t
   * or PERF_OP_MULSUM), and a magnitude for the tolerance (sum of |inputs|
   * that went into it) */
  void (*expect)(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype, int op,
                 int root, double *value_out, double *magnitude_out);
};

#endif
