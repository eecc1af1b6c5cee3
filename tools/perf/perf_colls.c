/* The nine perf tools (all_reduce_perf ... scatter_perf): one descriptor per
 * collective in one table, and a main that picks the collective by the
 * program's name, so that each tool is this one source under its own name.
 *
 * Where the size column is not one rank's whole buffer, the descriptor says
 * what it is. -r picks the root of broadcast, reduce, gather and scatter. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "perf_common.h"

/* Bus bandwidth factors (nccl-tests' formulas). */
static double busbw_all_reduce(int nranks) { return nranks > 1 ? 2.0 * (nranks - 1) / nranks : 0; }
static double busbw_ring(int nranks) { return nranks > 1 ? (double)(nranks - 1) / nranks : 0; }
static double busbw_one(int nranks) { (void)nranks; return 1; }

/* Memory traffic per byte of the size column, all ranks together: every
 * input byte read once and every output byte written once, less what is
 * already where it belongs in place. S is the size column. */

/* every rank's S in, every rank's S out: 2nS */
static double traffic_all_in_out(int nranks, int in_place) {
  (void)in_place;
  return 2.0 * nranks;
}

/* all-gather: the n blocks (S in all) read, n outputs of S written, of which
 * each rank's own block is in place already: (n + 1)S, in place nS.
 * Broadcast the same: the root's S read, n outputs written (the root's own
 * only out of place). */
static double traffic_gathered(int nranks, int in_place) {
  return in_place ? nranks : nranks + 1.0;
}

/* reduce-scatter and reduce: n inputs of S read, S of results written: (n + 1)S */
static double traffic_reduced(int nranks, int in_place) {
  (void)in_place;
  return nranks + 1.0;
}

/* gather and scatter: the root's S, read from or written to the others' blocks */
static double traffic_rooted(int nranks, int in_place) {
  (void)nranks, (void)in_place;
  return 2.0;
}

/* Element counts for a size column of nbytes. */

/* every rank sends and receives the whole column */
static void counts_whole(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                         size_t *recv_count, size_t *count) {
  (void)nranks;
  *count = *send_count = *recv_count = nbytes / elem_nbytes;
}

/* the column is the gathered buffer: nranks blocks of count elements */
static void counts_gathered(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                            size_t *recv_count, size_t *count) {
  *count = *send_count = nbytes / elem_nbytes / (size_t)nranks;
  *recv_count = *count * (size_t)nranks;
}

/* the column is the input buffer: nranks blocks of count elements */
static void counts_scattered(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                             size_t *recv_count, size_t *count) {
  *count = *recv_count = nbytes / elem_nbytes / (size_t)nranks;
  *send_count = *count * (size_t)nranks;
}

/* the column is one rank's whole buffer: nranks blocks of count elements */
static void counts_alltoall(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                            size_t *recv_count, size_t *count) {
  *count = nbytes / elem_nbytes / (size_t)nranks;
  *send_count = *recv_count = *count * (size_t)nranks;
}

/* all_reduce */

static weftResult_t all_reduce_run(const void *sendbuf, void *recvbuf, size_t count,
                                   weftDataType_t datatype, weftRedOp_t op, int root,
                                   weftComm_t comm, weftStream_t stream) {
  (void)root;
  return weftAllReduce(sendbuf, recvbuf, count, datatype, op, comm, stream);
}

static void all_reduce_expect(size_t i, int rank, int nranks, size_t count,
                              weftDataType_t datatype, int op, int root,
                              double *value_out, double *magnitude_out) {
  (void)rank, (void)count, (void)root;
  perf_reduced(i, nranks, datatype, op, value_out, magnitude_out);
}

/* all_gather: the size column is the gathered buffer */

static weftResult_t all_gather_run(const void *sendbuf, void *recvbuf, size_t count,
                                   weftDataType_t datatype, weftRedOp_t op, int root,
                                   weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  return weftAllGather(sendbuf, recvbuf, count, datatype, comm, stream);
}

static void all_gather_expect(size_t i, int rank, int nranks, size_t count,
                              weftDataType_t datatype, int op, int root,
                              double *value_out, double *magnitude_out) {
  (void)rank, (void)nranks, (void)root;
  *value_out = perf_input((int)(i / count), i % count, datatype, op);
  *magnitude_out = 0;
}

/* reduce_scatter: the size column is the input buffer */

static weftResult_t reduce_scatter_run(const void *sendbuf, void *recvbuf, size_t count,
                                       weftDataType_t datatype, weftRedOp_t op, int root,
                                       weftComm_t comm, weftStream_t stream) {
  (void)root;
  return weftReduceScatter(sendbuf, recvbuf, count, datatype, op, comm, stream);
}

static void reduce_scatter_expect(size_t i, int rank, int nranks, size_t count,
                                  weftDataType_t datatype, int op, int root,
                                  double *value_out, double *magnitude_out) {
  (void)root;
  perf_reduced((size_t)rank * count + i, nranks, datatype, op, value_out, magnitude_out);
}

/* broadcast */

static weftResult_t broadcast_run(const void *sendbuf, void *recvbuf, size_t count,
                                  weftDataType_t datatype, weftRedOp_t op, int root,
                                  weftComm_t comm, weftStream_t stream) {
  (void)op;
  return weftBroadcast(sendbuf, recvbuf, count, datatype, root, comm, stream);
}

static void broadcast_expect(size_t i, int rank, int nranks, size_t count,
                             weftDataType_t datatype, int op, int root,
                             double *value_out, double *magnitude_out) {
  (void)rank, (void)nranks, (void)count;
  *value_out = perf_input(root, i, datatype, op);
  *magnitude_out = 0;
}

/* reduce */

static weftResult_t reduce_run(const void *sendbuf, void *recvbuf, size_t count,
                               weftDataType_t datatype, weftRedOp_t op, int root,
                               weftComm_t comm, weftStream_t stream) {
  return weftReduce(sendbuf, recvbuf, count, datatype, op, root, comm, stream);
}

static void reduce_expect(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype,
                          int op, int root, double *value_out, double *magnitude_out) {
  (void)count;
  if (rank != root) { /* only the root's output is defined */
    *value_out = NAN;
    *magnitude_out = 0;
    return;
  }
  perf_reduced(i, nranks, datatype, op, value_out, magnitude_out);
}

/* sendrecv: each rank sends to the next rank and receives from the previous
 * one, in one group */

static weftResult_t sendrecv_run(const void *sendbuf, void *recvbuf, size_t count,
                                 weftDataType_t datatype, weftRedOp_t op, int root,
                                 weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  int rank, nranks;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  weftGroupStart();
  weftResult_t s = weftSend(sendbuf, count, datatype, (rank + 1) % nranks, comm, stream);
  weftResult_t r = weftRecv(recvbuf, count, datatype, (rank + nranks - 1) % nranks, comm, stream);
  weftResult_t e = weftGroupEnd();
  return s != weftSuccess ? s : r != weftSuccess ? r : e;
}

static void sendrecv_expect(size_t i, int rank, int nranks, size_t count,
                            weftDataType_t datatype, int op, int root,
                            double *value_out, double *magnitude_out) {
  (void)count, (void)root;
  *value_out = perf_input((rank + nranks - 1) % nranks, i, datatype, op);
  *magnitude_out = 0;
}

/* alltoall: the size column is one rank's whole buffer */

static weftResult_t alltoall_run(const void *sendbuf, void *recvbuf, size_t count,
                                 weftDataType_t datatype, weftRedOp_t op, int root,
                                 weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  return weftAlltoAll(sendbuf, recvbuf, count, datatype, comm, stream);
}

static void alltoall_expect(size_t i, int rank, int nranks, size_t count,
                            weftDataType_t datatype, int op, int root,
                            double *value_out, double *magnitude_out) {
  (void)nranks, (void)root;
  int from = (int)(i / count);
  *value_out = perf_input(from, (size_t)rank * count + i % count, datatype, op);
  *magnitude_out = 0;
}

/* gather: the size column is the root's buffer */

static weftResult_t gather_run(const void *sendbuf, void *recvbuf, size_t count,
                               weftDataType_t datatype, weftRedOp_t op, int root,
                               weftComm_t comm, weftStream_t stream) {
  (void)op;
  return weftGather(sendbuf, recvbuf, count, datatype, root, comm, stream);
}

static void gather_expect(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype,
                          int op, int root, double *value_out, double *magnitude_out) {
  (void)nranks;
  *magnitude_out = 0;
  *value_out = rank == root ? perf_input((int)(i / count), i % count, datatype, op) : NAN;
}

/* scatter: the size column is the root's buffer */

static weftResult_t scatter_run(const void *sendbuf, void *recvbuf, size_t count,
                                weftDataType_t datatype, weftRedOp_t op, int root,
                                weftComm_t comm, weftStream_t stream) {
  (void)op;
  return weftScatter(sendbuf, recvbuf, count, datatype, root, comm, stream);
}

static void scatter_expect(size_t i, int rank, int nranks, size_t count,
                           weftDataType_t datatype, int op, int root,
                           double *value_out, double *magnitude_out) {
  (void)nranks;
  *value_out = perf_input(root, (size_t)rank * count + i, datatype, op);
  *magnitude_out = 0;
}

static const struct perf_coll perf_colls[] = {
    {.name = "all_reduce", .uses_op = 1, .busbw_factor = busbw_all_reduce,
     .traffic = traffic_all_in_out, .counts = counts_whole,
     .run = all_reduce_run, .expect = all_reduce_expect},
    {.name = "all_gather", .busbw_factor = busbw_ring,
     .traffic = traffic_gathered, .counts = counts_gathered,
     .run = all_gather_run, .expect = all_gather_expect},
    {.name = "reduce_scatter", .uses_op = 1, .busbw_factor = busbw_ring,
     .traffic = traffic_reduced, .counts = counts_scattered,
     .run = reduce_scatter_run, .expect = reduce_scatter_expect},
    {.name = "broadcast", .uses_root = 1, .busbw_factor = busbw_one,
     .traffic = traffic_gathered, .counts = counts_whole,
     .run = broadcast_run, .expect = broadcast_expect},
    {.name = "reduce", .uses_op = 1, .uses_root = 1, .busbw_factor = busbw_one,
     .traffic = traffic_reduced, .counts = counts_whole,
     .run = reduce_run, .expect = reduce_expect},
    {.name = "sendrecv", .no_in_place = 1, .busbw_factor = busbw_one,
     .traffic = traffic_all_in_out, .counts = counts_whole,
     .run = sendrecv_run, .expect = sendrecv_expect},
    {.name = "alltoall", .no_in_place = 1, .busbw_factor = busbw_ring,
     .traffic = traffic_all_in_out, .counts = counts_alltoall,
     .run = alltoall_run, .expect = alltoall_expect},
    {.name = "gather", .uses_root = 1, .busbw_factor = busbw_ring,
     .traffic = traffic_rooted, .counts = counts_gathered,
     .run = gather_run, .expect = gather_expect},
    {.name = "scatter", .uses_root = 1, .busbw_factor = busbw_ring,
     .traffic = traffic_rooted, .counts = counts_scattered,
     .run = scatter_run, .expect = scatter_expect},
};
enum { PERF_NCOLLS = sizeof perf_colls / sizeof perf_colls[0] };

/* The collective whose tool is named `prog` (all_reduce_perf, or a path to
 * it), or NULL. */
static const struct perf_coll *perf_coll_by_prog(const char *prog) {
  const char *base = strrchr(prog, '/');
  base = base ? base + 1 : prog;
  static const char suffix[] = "_perf";
  size_t len = strlen(base), suffix_len = sizeof suffix - 1;
  if (len <= suffix_len || strcmp(base + len - suffix_len, suffix) != 0) return NULL;
  for (int c = 0; c < PERF_NCOLLS; c++) {
    if (strlen(perf_colls[c].name) == len - suffix_len &&
        strncmp(base, perf_colls[c].name, len - suffix_len) == 0)
      return &perf_colls[c];
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *prog = argc > 0 && argv[0] ? argv[0] : "";
  const struct perf_coll *coll = perf_coll_by_prog(prog);
  if (!coll) {
    fprintf(stderr, "%s: no collective by this name; the perf tools are", prog);
    for (int c = 0; c < PERF_NCOLLS; c++) fprintf(stderr, " %s_perf", perf_colls[c].name);
    fprintf(stderr, "\n");
    return 2;
  }
  return perf_main(argc, argv, coll);
}
