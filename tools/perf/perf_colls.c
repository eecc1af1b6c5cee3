/* The eleven perf tools (all_reduce_perf ... alltoallv_perf): one descriptor
 * per collective in one table, and a main that picks the collective by the
 * program's name, so that each tool is this one source under its own name.
 *
 * Each descriptor's counts are nccl-tests' GetCollByteCount for its test, a
 * per-rank block rounded down to 16 bytes included, so that the size and
 * count columns read as nccl-tests' rows. -r picks the root of broadcast,
 * reduce, gather and scatter. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_common.h"

/* Bus bandwidth factors (nccl-tests' formulas). */
static double busbw_all_reduce(int nranks) { return nranks > 1 ? 2.0 * (nranks - 1) / nranks : 0; }
static double busbw_ring(int nranks) { return nranks > 1 ? (double)(nranks - 1) / nranks : 0; }
static double busbw_one(int nranks) { (void)nranks; return 1; }
/* hypercube: each rank receives the n - 1 blocks of the others, of the size
 * column's n */
static double algbw_hypercube(int nranks) { return nranks > 0 ? (nranks - 1.0) / nranks : 0; }

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

/* Element counts for a sweep size of nbytes. */

/* one rank's block: the size's elements over the ranks, rounded down to 16
 * bytes (nccl-tests' "& ~(16/eltSize - 1)") */
static size_t block_count(size_t nbytes, size_t elem_nbytes, int nranks) {
  return nbytes / elem_nbytes / (size_t)nranks & ~(16 / elem_nbytes - 1);
}

/* every rank sends and receives the whole size */
static void counts_whole(size_t nbytes, size_t elem_nbytes, int nranks, struct perf_counts *out) {
  (void)nranks;
  out->count = out->send = out->recv = nbytes / elem_nbytes;
}

/* a block in, nranks blocks out (all-gather, gather, hypercube) */
static void counts_gathered(size_t nbytes, size_t elem_nbytes, int nranks,
                            struct perf_counts *out) {
  out->count = out->send = block_count(nbytes, elem_nbytes, nranks);
  out->recv = out->count * (size_t)nranks;
}

/* nranks blocks in, a block out (reduce-scatter, scatter) */
static void counts_scattered(size_t nbytes, size_t elem_nbytes, int nranks,
                             struct perf_counts *out) {
  out->count = out->recv = block_count(nbytes, elem_nbytes, nranks);
  out->send = out->count * (size_t)nranks;
}

/* nranks blocks in and out */
static void counts_alltoall(size_t nbytes, size_t elem_nbytes, int nranks,
                            struct perf_counts *out) {
  out->count = block_count(nbytes, elem_nbytes, nranks);
  out->send = out->recv = out->count * (size_t)nranks;
}

/* Two one-way transfers in one group: count elements to rank `to`, as many
 * from rank `from` (either may be the caller: a copy). */
static weftResult_t exchange(const void *sendbuf, void *recvbuf, size_t count,
                             weftDataType_t datatype, int to, int from, weftComm_t comm,
                             weftStream_t stream) {
  weftResult_t res = weftGroupStart();
  if (res != weftSuccess) return res;
  res = weftSend(sendbuf, count, datatype, to, comm, stream);
  if (res == weftSuccess) res = weftRecv(recvbuf, count, datatype, from, comm, stream);
  const weftResult_t end = weftGroupEnd();
  return res != weftSuccess ? res : end;
}

/* all_reduce */

static weftResult_t all_reduce_run(const void *sendbuf, void *recvbuf, size_t count,
                                   weftDataType_t datatype, weftRedOp_t op, int root,
                                   weftComm_t comm, weftStream_t stream) {
  (void)root;
  return weftAllReduce(sendbuf, recvbuf, count, datatype, op, comm, stream);
}

static void all_reduce_expect(size_t i, const struct perf_call *c, double *value_out,
                              double *magnitude_out) {
  perf_reduced(i, c->nranks, c->type, c->op, c->seed, value_out, magnitude_out);
}

/* all_gather: block r of the output is rank r's input */

static weftResult_t all_gather_run(const void *sendbuf, void *recvbuf, size_t count,
                                   weftDataType_t datatype, weftRedOp_t op, int root,
                                   weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  return weftAllGather(sendbuf, recvbuf, count, datatype, comm, stream);
}

static void all_gather_expect(size_t i, const struct perf_call *c, double *value_out,
                              double *magnitude_out) {
  *value_out = perf_input((int)(i / c->count), i % c->count, c->type, c->op, c->seed);
  *magnitude_out = 0;
}

/* reduce_scatter */

static weftResult_t reduce_scatter_run(const void *sendbuf, void *recvbuf, size_t count,
                                       weftDataType_t datatype, weftRedOp_t op, int root,
                                       weftComm_t comm, weftStream_t stream) {
  (void)root;
  return weftReduceScatter(sendbuf, recvbuf, count, datatype, op, comm, stream);
}

static void reduce_scatter_expect(size_t i, const struct perf_call *c, double *value_out,
                                  double *magnitude_out) {
  perf_reduced((size_t)c->rank * c->count + i, c->nranks, c->type, c->op, c->seed, value_out,
               magnitude_out);
}

/* broadcast */

static weftResult_t broadcast_run(const void *sendbuf, void *recvbuf, size_t count,
                                  weftDataType_t datatype, weftRedOp_t op, int root,
                                  weftComm_t comm, weftStream_t stream) {
  (void)op;
  return weftBroadcast(sendbuf, recvbuf, count, datatype, root, comm, stream);
}

static void broadcast_expect(size_t i, const struct perf_call *c, double *value_out,
                             double *magnitude_out) {
  *value_out = perf_input(c->root, i, c->type, c->op, c->seed);
  *magnitude_out = 0;
}

/* reduce */

static weftResult_t reduce_run(const void *sendbuf, void *recvbuf, size_t count,
                               weftDataType_t datatype, weftRedOp_t op, int root,
                               weftComm_t comm, weftStream_t stream) {
  return weftReduce(sendbuf, recvbuf, count, datatype, op, root, comm, stream);
}

static void reduce_expect(size_t i, const struct perf_call *c, double *value_out,
                          double *magnitude_out) {
  if (c->rank != c->root) { /* only the root's output is defined */
    *value_out = NAN;
    *magnitude_out = 0;
    return;
  }
  perf_reduced(i, c->nranks, c->type, c->op, c->seed, value_out, magnitude_out);
}

/* sendrecv: each rank sends to the next rank and receives from the previous
 * one, in one group; the op only names the row, as in nccl-tests */

static weftResult_t sendrecv_run(const void *sendbuf, void *recvbuf, size_t count,
                                 weftDataType_t datatype, weftRedOp_t op, int root,
                                 weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  int rank, nranks;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  return exchange(sendbuf, recvbuf, count, datatype, (rank + 1) % nranks,
                  (rank + nranks - 1) % nranks, comm, stream);
}

static void sendrecv_expect(size_t i, const struct perf_call *c, double *value_out,
                            double *magnitude_out) {
  *value_out = perf_input((c->rank + c->nranks - 1) % c->nranks, i, c->type, c->op, c->seed);
  *magnitude_out = 0;
}

/* alltoall: block p of a rank's input goes to rank p */

static weftResult_t alltoall_run(const void *sendbuf, void *recvbuf, size_t count,
                                 weftDataType_t datatype, weftRedOp_t op, int root,
                                 weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  if (sendbuf != recvbuf) return weftAlltoAll(sendbuf, recvbuf, count, datatype, comm, stream);
  /* in place, which weftAlltoAll refuses: the same group of sends and
   * receives on the one buffer, as nccl-tests times it (its result is not
   * defined, and not checked) */
  int nranks;
  weftCommCount(comm, &nranks);
  const size_t block = count * weftTypeSize(datatype);
  char *buf = recvbuf;
  weftResult_t res = weftGroupStart();
  for (int p = 0; p < nranks && res == weftSuccess; p++) {
    res = weftSend(buf + (size_t)p * block, count, datatype, p, comm, stream);
    if (res == weftSuccess) res = weftRecv(buf + (size_t)p * block, count, datatype, p, comm, stream);
  }
  const weftResult_t end = weftGroupEnd();
  return res != weftSuccess ? res : end;
}

static void alltoall_expect(size_t i, const struct perf_call *c, double *value_out,
                            double *magnitude_out) {
  const int from = (int)(i / c->count);
  *value_out = perf_input(from, (size_t)c->rank * c->count + i % c->count, c->type, c->op,
                          c->seed);
  *magnitude_out = 0;
}

/* gather */

static weftResult_t gather_run(const void *sendbuf, void *recvbuf, size_t count,
                               weftDataType_t datatype, weftRedOp_t op, int root,
                               weftComm_t comm, weftStream_t stream) {
  (void)op;
  return weftGather(sendbuf, recvbuf, count, datatype, root, comm, stream);
}

static void gather_expect(size_t i, const struct perf_call *c, double *value_out,
                          double *magnitude_out) {
  *magnitude_out = 0;
  *value_out = c->rank == c->root
                   ? perf_input((int)(i / c->count), i % c->count, c->type, c->op, c->seed)
                   : NAN;
}

/* scatter */

static weftResult_t scatter_run(const void *sendbuf, void *recvbuf, size_t count,
                                weftDataType_t datatype, weftRedOp_t op, int root,
                                weftComm_t comm, weftStream_t stream) {
  (void)op;
  return weftScatter(sendbuf, recvbuf, count, datatype, root, comm, stream);
}

static void scatter_expect(size_t i, const struct perf_call *c, double *value_out,
                           double *magnitude_out) {
  *value_out = perf_input(c->root, (size_t)c->rank * c->count + i, c->type, c->op, c->seed);
  *magnitude_out = 0;
}

/* hypercube: an all-gather by recursive doubling, as nccl-tests' hypercube
 * test: the rank's own block into place, then across each dimension of the
 * cube the blocks gathered so far out and as many in. Power-of-2 ranks only.
 * On a host stream each step's sends wait for the receives before them that
 * wrote their blocks, as on a CUDA stream (weft.h, "Host streams"). */

static weftResult_t hypercube_run(const void *sendbuf, void *recvbuf, size_t count,
                                  weftDataType_t datatype, weftRedOp_t op, int root,
                                  weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  int rank, nranks;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  const size_t block = count * weftTypeSize(datatype);
  char *out = recvbuf;
  weftResult_t res = weftSuccess;
  /* out of place, a send to itself (in stream order with what follows) */
  if (out + (size_t)rank * block != (const char *)sendbuf) {
    res = exchange(sendbuf, out + (size_t)rank * block, count, datatype, rank, rank, comm, stream);
  }
  for (int mask = 1; mask < nranks && res == weftSuccess; mask <<= 1) {
    const int mine = rank & ~(mask - 1), theirs = mine ^ mask; /* first blocks of each half */
    res = exchange(out + (size_t)mine * block, out + (size_t)theirs * block, count * (size_t)mask,
                   datatype, rank ^ mask, rank ^ mask, comm, stream);
  }
  return res;
}

/* alltoallv: nccl-tests' generated pattern. Rank i sends rank j a share of
 * the total that grows with their distance (j - i) mod n, blended with an
 * even share by NCCL_TESTS_ALLTOALLV_SPREAD (1: by distance alone, the
 * default; 0: even), each share rounded down to 16 bytes. Every rank sends
 * and receives the same total; the count column is the even share. */

static double alltoallv_spread_value = 1.0;

/* NCCL_TESTS_ALLTOALLV_SPREAD, a number clamped to [0, 1], as nccl-tests
 * reads it; a value that is no number is refused here (nccl-tests would
 * run the default), and so is a traffic matrix file, which these tools do
 * not read. */
static int alltoallv_read_env(const char *prog) {
  const char *matrix = getenv("NCCL_TESTS_ALLTOALLV_MATRIX_FILE");
  if (matrix != NULL) {
    fprintf(stderr, "%s: NCCL_TESTS_ALLTOALLV_MATRIX_FILE=%s: traffic matrix files are not "
                    "supported; unset it for the generated pattern\n", prog, matrix);
    return -1;
  }
  const char *s = getenv("NCCL_TESTS_ALLTOALLV_SPREAD");
  if (s == NULL) return 0;
  char *end;
  errno = 0;
  const double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE || isnan(v)) {
    fprintf(stderr, "%s: bad value '%s' for NCCL_TESTS_ALLTOALLV_SPREAD (a number, 0 to 1)\n",
            prog, s);
    return -1;
  }
  alltoallv_spread_value = v < 0 ? 0 : v > 1 ? 1 : v;
  return 0;
}

/* the bytes rank `from` sends rank `to` when each rank sends total_nbytes */
static size_t alltoallv_peer_nbytes(int from, int to, int nranks, size_t total_nbytes) {
  if (nranks == 1) return total_nbytes & ~(size_t)15;
  const double spread = alltoallv_spread_value;
  const int distance = (to - from + nranks) % nranks;
  const double distances = (double)nranks * (nranks - 1) / 2; /* their sum */
  const double even = (double)total_nbytes / nranks;
  const double by_distance = distance * (double)total_nbytes / distances;
  return (size_t)((1 - spread) * even + spread * by_distance) & ~(size_t)15;
}

/* the count column is the even share; a rank's buffers hold the shares it
 * sends (or receives), which are fewer bytes than the total for the
 * rounding */
static void counts_alltoallv(size_t nbytes, size_t elem_nbytes, int nranks,
                             struct perf_counts *out) {
  out->count = block_count(nbytes, elem_nbytes, nranks);
  const size_t total = out->count * (size_t)nranks * elem_nbytes;
  out->send = 0;
  for (int to = 0; to < nranks; to++)
    out->send += alltoallv_peer_nbytes(0, to, nranks, total) / elem_nbytes;
  out->recv = out->send; /* the shares depend on the distance alone */
}

static weftResult_t alltoallv_run(const void *sendbuf, void *recvbuf, size_t count,
                                  weftDataType_t datatype, weftRedOp_t op, int root,
                                  weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  int rank, nranks;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  const size_t elem_nbytes = weftTypeSize(datatype);
  const size_t total = count * (size_t)nranks * elem_nbytes;
  const char *send = sendbuf;
  char *recv = recvbuf;
  weftResult_t res = weftGroupStart();
  for (int p = 0; p < nranks && res == weftSuccess; p++) {
    const size_t send_count = alltoallv_peer_nbytes(rank, p, nranks, total) / elem_nbytes;
    const size_t recv_count = alltoallv_peer_nbytes(p, rank, nranks, total) / elem_nbytes;
    if (send_count > 0) res = weftSend(send, send_count, datatype, p, comm, stream);
    if (recv_count > 0 && res == weftSuccess)
      res = weftRecv(recv, recv_count, datatype, p, comm, stream);
    send += send_count * elem_nbytes;
    recv += recv_count * elem_nbytes;
  }
  const weftResult_t end = weftGroupEnd();
  return res != weftSuccess ? res : end;
}

/* the output is each rank's share for this rank, in rank order */
static void alltoallv_expect(size_t i, const struct perf_call *c, double *value_out,
                             double *magnitude_out) {
  const size_t elem_nbytes = weftTypeSize(c->type);
  const size_t total = c->count * (size_t)c->nranks * elem_nbytes;
  *magnitude_out = 0;
  *value_out = NAN;
  for (int from = 0; from < c->nranks; from++) {
    const size_t n = alltoallv_peer_nbytes(from, c->rank, c->nranks, total) / elem_nbytes;
    if (i >= n) {
      i -= n;
      continue;
    }
    size_t at = 0; /* where the share for this rank starts in from's input */
    for (int to = 0; to < c->rank; to++)
      at += alltoallv_peer_nbytes(from, to, c->nranks, total) / elem_nbytes;
    *value_out = perf_input(from, at + i, c->type, c->op, c->seed);
    return;
  }
}

static const struct perf_coll perf_colls[] = {
    {.name = "all_reduce", .uses_op = 1, .busbw_factor = busbw_all_reduce,
     .traffic = traffic_all_in_out, .counts = counts_whole,
     .run = all_reduce_run, .expect = all_reduce_expect},
    {.name = "all_gather", .op_column = "none", .busbw_factor = busbw_ring,
     .traffic = traffic_gathered, .counts = counts_gathered,
     .run = all_gather_run, .expect = all_gather_expect},
    {.name = "reduce_scatter", .uses_op = 1, .busbw_factor = busbw_ring,
     .traffic = traffic_reduced, .counts = counts_scattered,
     .run = reduce_scatter_run, .expect = reduce_scatter_expect},
    {.name = "broadcast", .op_column = "none", .uses_root = 1, .busbw_factor = busbw_one,
     .traffic = traffic_gathered, .counts = counts_whole,
     .run = broadcast_run, .expect = broadcast_expect},
    {.name = "reduce", .uses_op = 1, .uses_root = 1, .busbw_factor = busbw_one,
     .traffic = traffic_reduced, .counts = counts_whole,
     .run = reduce_run, .expect = reduce_expect},
    {.name = "sendrecv", .in_place_unchecked = 1, .busbw_factor = busbw_one,
     .traffic = traffic_all_in_out, .counts = counts_whole,
     .run = sendrecv_run, .expect = sendrecv_expect},
    {.name = "alltoall", .op_column = "none", .in_place_unchecked = 1,
     .busbw_factor = busbw_ring, .traffic = traffic_all_in_out, .counts = counts_alltoall,
     .run = alltoall_run, .expect = alltoall_expect},
    {.name = "gather", .op_column = "none", .uses_root = 1, .busbw_factor = busbw_ring,
     .traffic = traffic_rooted, .counts = counts_gathered,
     .run = gather_run, .expect = gather_expect},
    {.name = "scatter", .op_column = "none", .uses_root = 1, .busbw_factor = busbw_ring,
     .traffic = traffic_rooted, .counts = counts_scattered,
     .run = scatter_run, .expect = scatter_expect},
    {.name = "hypercube", .op_column = "", .pow2_ranks = 1, .algbw_factor = algbw_hypercube,
     .busbw_factor = busbw_one, .traffic = traffic_gathered, .counts = counts_gathered,
     .run = hypercube_run, .expect = all_gather_expect},
    {.name = "alltoallv", .op_column = "none", .in_place_unchecked = 1,
     .busbw_factor = busbw_ring, .traffic = traffic_all_in_out, .counts = counts_alltoallv,
     .run = alltoallv_run, .expect = alltoallv_expect, .read_env = alltoallv_read_env},
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
  if (coll->read_env != NULL && coll->read_env(prog) != 0) return 2;
  return perf_main(argc, argv, coll);
}
