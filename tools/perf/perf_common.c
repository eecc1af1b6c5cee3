/* The perf tools' driver: sweep sizes for each datatype, op and root, time
 * out-of-place and in-place runs as nccl-tests does, check results, and
 * leave with nccl-tests' exit status. perf_opts.c reads the flags,
 * perf_report.c prints.
 *
 * Under NCCL_TESTS_SPLIT the collective runs on each group's communicator,
 * and everything of the tool's own (barriers, the time across ranks, the
 * counts of wrong values, the header's lines) on the whole job's, as
 * nccl-tests keeps these on MPI_COMM_WORLD. */
#include "perf_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf_bound.h"
#include "perf_opts.h"
#include "perf_report.h"

/* Exit statuses, nccl-tests' testResult_t. */
enum perf_status {
  PERF_OK = 0,
  PERF_INTERNAL = 1, /* the tool's own failure (writing -J's file) */
  PERF_CUDA = 2,     /* a CUDA call (also: a refused flag, perf_opts.h) */
  PERF_LIB = 3,      /* a weft call failed */
  PERF_TIMEOUT = 4,  /* a weft call timed out */
  PERF_WRONG = 7,    /* a wrong value, or busbw below NCCL_TESTS_MIN_BW */
};

/* One rank's sweep: the options and where its buffers live. */
struct perf_run {
  const struct perf_coll *coll;
  const struct perf_opts *o;
  weftComm_t world;    /* every rank of the job */
  weftComm_t comm;     /* the rank's group, which runs the collective (world unsplit) */
  weftStream_t stream; /* a host stream with -z 0 (not -y 1); NULL otherwise */
  int rank, nranks;    /* in comm */
  int world_rank, world_nranks;
  int color;           /* the group's (NCCL_TESTS_SPLIT), 0 unsplit */
  unsigned rounds;     /* check rounds so far: each round's inputs take the next seed */
  char host[64];
  char *sendbuf, *recvbuf; /* of o->mem_kind, alloc_nbytes each */
  char *staging;           /* host copy to fill and check cuda buffers; NULL for host */
  size_t alloc_nbytes;
  void *send_reg, *recv_reg; /* -R's handles */
  const struct perf_bound *bound; /* NULL without one */
  weftEvent_t *events;     /* -I on a stream: one per iteration */
  double *iter_s;          /* -I: this rank's iteration times */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* A weft call that failed: nccl-tests' line for it, a timeout or a library
 * failure, and its status. text is weftGetLastError's. */
static int lib_failed(const struct perf_run *p, weftResult_t res, const char *text,
                      const char *file, int line) {
  if (strstr(text, "timed out") != NULL) {
    /* -T's seconds, or the library's own as its message gives them */
    double s = p->o->timeout_s;
    const char *after = strstr(text, "after ");
    if (s == 0 && after != NULL) s = strtod(after + 6, NULL);
    printf("%s: Test timeout (%ds) %s:%d\n", p->host, (int)(s + 0.5), base_name(file), line);
    /* nccl-tests' line, then weft's verdict (which rank stopped, in which call) */
    printf("%s:   %s\n", p->host, text);
    fflush(stdout);
    return PERF_TIMEOUT;
  }
  printf("%s: Test NCCL failure %s:%d '%s / %s'\n", p->host, base_name(file), line,
         weftGetErrorString(res), text);
  fflush(stdout);
  return PERF_LIB;
}

/* Returns the status of a weft call that fails; text from the communicator
 * (the group's, or the one named), or from the thread (stream and group
 * calls). */
#define LIB_CHECK_ON(p, comm, call)                                                     \
  do {                                                                                  \
    const weftResult_t res_ = (call);                                                   \
    if (res_ != weftSuccess) return lib_failed(p, res_, weftGetLastError(comm),         \
                                               __FILE__, __LINE__);                     \
  } while (0)
#define LIB_CHECK(p, call) LIB_CHECK_ON(p, p->comm, call)
#define LIB_CHECK_THREAD(p, call)                                                       \
  do {                                                                                  \
    const weftResult_t res_ = (call);                                                   \
    if (res_ != weftSuccess) return lib_failed(p, res_, weftGetLastError(NULL),         \
                                               __FILE__, __LINE__);                     \
  } while (0)

/* A CUDA step of the tool's own (copies, fills, waits) that failed. */
static int cuda_failed(const struct perf_run *p, const char *what, const char *file, int line) {
  printf("%s: Test CUDA failure %s:%d '%s'\n", p->host, base_name(file), line, what);
  fflush(stdout);
  return PERF_CUDA;
}
#define MEM_CHECK(p, call, what) \
  do {                           \
    if ((call) != 0) return cuda_failed(p, what, __FILE__, __LINE__); \
  } while (0)

/* One call of the collective. Under mulsum, the rank's pre-multiply op is
 * made for the call and destroyed after it, as nccl-tests does. */
static weftResult_t call_once(const struct perf_run *p, const char *src, char *dst, size_t count,
                              weftDataType_t t, int op, int root) {
  if (op != PERF_OP_MULSUM) return p->coll->run(src, dst, count, t, op, root, p->comm, p->stream);
  if (!p->coll->uses_op) return p->coll->run(src, dst, count, t, weftSum, root, p->comm, p->stream);
  uint64_t scalar = 0; /* room for the widest datatype */
  perf_value_set(&scalar, 0, t, perf_premul_scalar(p->rank));
  weftRedOp_t premul;
  weftResult_t res = weftRedOpCreatePreMulSum(&premul, &scalar, t, weftScalarHostImmediate,
                                              p->comm);
  if (res != weftSuccess) return res;
  res = p->coll->run(src, dst, count, t, premul, root, p->comm, p->stream);
  const weftResult_t destroyed = weftRedOpDestroy(premul, p->comm);
  return res != weftSuccess ? res : destroyed;
}

/* All ranks of the job meet: a one-element all-reduce. */
static int barrier(const struct perf_run *p) {
  int32_t in = 0, out = 0;
  LIB_CHECK_ON(p, p->world, weftAllReduce(&in, &out, 1, weftInt32, weftSum, p->world, NULL));
  return PERF_OK;
}

/* Waits for what was issued: the stream's queue, then the device, whose
 * kernels run after the calls return. */
static int complete(const struct perf_run *p) {
  if (p->stream != NULL) LIB_CHECK_THREAD(p, weftStreamSynchronize(p->stream));
  MEM_CHECK(p, perf_mem_sync(p->o->mem_kind), "waiting for the device");
  return PERF_OK;
}

/* One iteration: agg_iters calls, in one group when more than one, each
 * waited for (-z 1, 2) and followed by a barrier (-z 1). */
static int iteration(const struct perf_run *p, const char *src, char *dst, size_t count,
                     weftDataType_t t, int op, int root) {
  const struct perf_opts *o = p->o;
  const int grouped = o->agg_iters > 1;
  /* a call on host memory returns done; the device is synchronized after
   * each call only before a barrier (-z 1): at the default (-z 2) device
   * calls go out back to back and the loop's end waits for them (complete),
   * so that the default measures the device's time per call, not a
   * synchronization's */
  const int wait_each = o->blocking == PERF_BLOCK_BARRIER;
  int st;
  if (grouped) LIB_CHECK_THREAD(p, weftGroupStart());
  for (int a = 0; a < o->agg_iters; a++) {
    const weftResult_t res = call_once(p, src, dst, count, t, op, root);
    if (res != weftSuccess) {
      if (grouped) weftGroupEnd();
      return lib_failed(p, res, weftGetLastError(p->comm), __FILE__, __LINE__);
    }
    if (grouped) continue; /* nothing runs before the group ends */
    if (wait_each && o->mem_kind != PERF_MEM_HOST) MEM_CHECK(p, perf_mem_sync(o->mem_kind), "sync");
    if (o->blocking == PERF_BLOCK_BARRIER && (st = barrier(p)) != PERF_OK) return st;
  }
  if (grouped) {
    LIB_CHECK_THREAD(p, weftGroupEnd());
    if (wait_each && o->mem_kind != PERF_MEM_HOST) MEM_CHECK(p, perf_mem_sync(o->mem_kind), "sync");
    if (o->blocking == PERF_BLOCK_BARRIER) return barrier(p);
  }
  return PERF_OK;
}

/* The timed loop, as nccl-tests' BenchTime: -n iterations, then a wait.
 * *elapsed_s: per operation, until all were done (-z 3: the iterations'
 * own time, without their barriers); *issue_s: per operation, until the last
 * was issued (-C 1). With -I, p->iter_s gets each iteration's time per
 * operation. */
static int timed_loop(const struct perf_run *p, const char *src, char *dst, size_t count,
                      weftDataType_t t, int op, int root, double *elapsed_s, double *issue_s) {
  const struct perf_opts *o = p->o;
  const int outer = o->blocking == PERF_BLOCK_OUTER;
  const int clock_each = outer || (o->per_iter && p->stream == NULL);
  const double ops = (double)o->iters * o->agg_iters;
  double own_s = 0; /* -z 3: the iterations without their barriers */
  int st;
  const double t0 = now_s();
  for (int it = 0; it < o->iters; it++) {
    const double ti = clock_each ? now_s() : 0;
    if ((st = iteration(p, src, dst, count, t, op, root)) != PERF_OK) return st;
    if (o->per_iter && p->stream != NULL)
      LIB_CHECK_THREAD(p, weftEventRecord(p->events[it], p->stream));
    if (outer) { /* each call was done when it returned; the device's are waited for */
      if ((st = complete(p)) != PERF_OK) return st;
      const double took = now_s() - ti;
      own_s += took;
      if (o->per_iter) p->iter_s[it] = took / o->agg_iters;
      if ((st = barrier(p)) != PERF_OK) return st;
    } else if (clock_each) {
      p->iter_s[it] = (now_s() - ti) / o->agg_iters;
    }
  }
  const double issued = now_s();
  /* -I on a stream: an iteration ends when its event is reached */
  if (o->per_iter && p->stream != NULL) {
    double prev = t0;
    for (int it = 0; it < o->iters; it++) {
      LIB_CHECK_THREAD(p, weftEventSynchronize(p->events[it]));
      const double reached = now_s();
      p->iter_s[it] = (reached - prev) / o->agg_iters;
      prev = reached;
    }
  }
  if ((st = complete(p)) != PERF_OK) return st;
  const double done = now_s();
  *issue_s = (outer ? own_s : issued - t0) / ops;
  *elapsed_s = (outer ? own_s : done - t0) / ops;
  return PERF_OK;
}

/* Combines a per-rank double across the job's ranks: 0 rank 0's own, 1
 * mean, 2 min, 3 max. */
static int across_ranks(const struct perf_run *p, double *v, int how) {
  double out = *v;
  const weftRedOp_t op = how == 2 ? weftMin : how == 3 ? weftMax : weftSum;
  LIB_CHECK_ON(p, p->world, weftAllReduce(v, &out, 1, weftFloat64, op, p->world, NULL));
  if (how != 0) *v = how == 1 ? out / p->world_nranks : out;
  return PERF_OK;
}

/* -I: every rank's iteration times to every rank; each iteration's largest
 * over the ranks, and its summary. */
static int gather_iters(const struct perf_run *p, struct perf_result *r) {
  const struct perf_opts *o = p->o;
  const size_t n = (size_t)o->iters;
  r->rank_iter_s = malloc(n * (size_t)p->world_nranks * sizeof(double));
  r->iter_s = malloc(n * sizeof(double));
  if (r->rank_iter_s == NULL || r->iter_s == NULL) {
    fprintf(stderr, "rank %d: out of memory for -I's times\n", p->rank);
    return PERF_INTERNAL;
  }
  LIB_CHECK_ON(p, p->world,
               weftAllGather(p->iter_s, r->rank_iter_s, n, weftFloat64, p->world, NULL));
  for (size_t i = 0; i < n; i++) {
    double most = r->rank_iter_s[i];
    for (int q = 1; q < p->world_nranks; q++)
      if (r->rank_iter_s[(size_t)q * n + i] > most) most = r->rank_iter_s[(size_t)q * n + i];
    r->iter_s[i] = most;
  }
  perf_iter_stats(r->iter_s + o->per_iter_skip, o->iters - o->per_iter_skip, &r->stats);
  return PERF_OK;
}

/* Writes this rank's inputs of seed into src (a buffer of the run's memory
 * kind). */
static int put_inputs(const struct perf_run *p, char *src, size_t send_count, weftDataType_t t,
                      int op, unsigned seed) {
  char *host = p->staging != NULL ? p->staging : src;
  for (size_t i = 0; i < send_count; i++)
    perf_value_set(host, i, t, perf_input(p->rank, i, t, op, seed));
  if (p->staging != NULL)
    MEM_CHECK(p, perf_mem_upload(p->o->mem_kind, src, p->staging, send_count * weftTypeSize(t)),
              "copying the inputs to the device");
  return PERF_OK;
}

static long long count_wrong(const void *recvbuf, size_t recv_count,
                             const struct perf_coll *coll, const struct perf_call *call) {
  long long wrong = 0;
  const double eps = perf_type_eps(call->type);
  for (size_t i = 0; i < recv_count; i++) {
    double want, magnitude;
    coll->expect(i, call, &want, &magnitude);
    if (isnan(want)) continue; /* nothing defined here on this rank */
    const double got = perf_value_get(recvbuf, i, call->type);
    if (!(fabs(got - want) <= eps * (call->nranks + 1) * magnitude)) wrong++;
  }
  return wrong;
}

/* -c N: N rounds, each on inputs of a seed of its own into a poisoned
 * output, stopping at the first with a wrong value; r->wrong counts that
 * round's, all ranks together, r->saw_wrong whether this rank saw one. */
static int check(struct perf_run *p, char *src, char *dst, const struct perf_counts *n,
                 weftDataType_t t, int op, int root, struct perf_result *r) {
  const struct perf_opts *o = p->o;
  const size_t esize = weftTypeSize(t);
  int st;
  r->wrong = 0;
  r->saw_wrong = 0;
  for (int c = 0; c < o->check && r->wrong == 0; c++) {
    const unsigned seed = ++p->rounds; /* every rank runs as many rounds */
    MEM_CHECK(p, perf_mem_fill(o->mem_kind, dst, 0xa5, n->recv * esize), "poisoning");
    if ((st = put_inputs(p, src, n->send, t, op, seed)) != PERF_OK) return st;
    LIB_CHECK(p, call_once(p, src, dst, n->count, t, op, root));
    if ((st = complete(p)) != PERF_OK) return st;
    const char *out = dst;
    if (p->staging != NULL) {
      MEM_CHECK(p, perf_mem_download(o->mem_kind, p->staging, dst, n->recv * esize),
                "copying the results from the device");
      out = p->staging;
    }
    const struct perf_call call = {.count = n->count, .type = t, .op = op, .root = root,
                                   .rank = p->rank, .nranks = p->nranks, .seed = seed};
    long long wrong = count_wrong(out, n->recv, p->coll, &call), total = wrong;
    LIB_CHECK_ON(p, p->world, weftAllReduce(&wrong, &total, 1, weftInt64, weftSum, p->world,
                                            NULL));
    r->wrong = total;
    r->saw_wrong = wrong != 0;
  }
  return PERF_OK;
}

/* One side of a row: warm-up, a barrier, the timed loop, the check. n: the
 * row's counts; nbytes: its size column. */
static int run_side(struct perf_run *p, const struct perf_counts *n, size_t nbytes,
                    weftDataType_t t, int op, int root, int in_place, struct perf_result *r) {
  const struct perf_coll *coll = p->coll;
  const struct perf_opts *o = p->o;
  const size_t esize = weftTypeSize(t);
  /* -u moves both buffers off their alignment; in place, input and output
   * share one buffer: a gather's input sits in its rank's block of the
   * output, a scatter's output in its rank's block of the input */
  const size_t shift = (size_t)o->unalign * esize;
  char *src = p->sendbuf + shift, *dst = p->recvbuf + shift;
  if (in_place) {
    src = dst;
    if (n->recv > n->send) src += (size_t)p->rank * n->send * esize;
    if (n->send > n->recv) dst += (size_t)p->rank * n->recv * esize;
  }
  int st;
  if ((st = put_inputs(p, src, n->send, t, op, 0)) != PERF_OK) return st;
  for (int w = 0; w < o->warmup; w++)
    LIB_CHECK(p, call_once(p, src, dst, n->count, t, op, root));
  if ((st = complete(p)) != PERF_OK) return st;
  /* the ranks start the timed loop together, as nccl-tests' Barrier has
   * them: a rank that left its warm-up early would otherwise time its wait
   * for the others in its first iteration */
  if ((st = barrier(p)) != PERF_OK) return st;
  double elapsed_s = 0, issue_s = 0;
  if ((st = timed_loop(p, src, dst, n->count, t, op, root, &elapsed_s, &issue_s)) != PERF_OK)
    return st;
  if ((st = across_ranks(p, &elapsed_s, o->average)) != PERF_OK) return st;
  /* -C 1 prints this rank's own issue time, as nccl-tests; bandwidth stays
   * that of the completed operations */
  r->time_us = (o->cputime ? issue_s : elapsed_s) * 1e6;
  const double moved = coll->algbw_factor ? coll->algbw_factor(p->nranks) * (double)nbytes
                                          : (double)nbytes;
  r->algbw = elapsed_s > 0 ? moved / elapsed_s / 1e9 : 0;
  r->busbw = r->algbw * coll->busbw_factor(p->nranks);
  r->bound_us = r->bound_pct = NAN;
  r->bound_by_copy = 0;
  if (p->bound != NULL) {
    const double traffic = coll->traffic(p->nranks, in_place) * (double)nbytes;
    r->bound_us = perf_bound_us(p->bound, traffic, &r->bound_by_copy);
    r->bound_pct = r->time_us > 0 ? 100.0 * r->bound_us / r->time_us : NAN;
  }
  if (o->per_iter && (st = gather_iters(p, r)) != PERF_OK) return st;
  /* in place, sendrecv and the all-to-alls are timed, not checked, as
   * nccl-tests (its reportErrors 0): #wrong reads N/A */
  r->checked = o->check > 0 && !(in_place && coll->in_place_unchecked);
  if (!r->checked) return PERF_OK;
  return check(p, src, dst, n, t, op, root, r);
}

static void result_free(struct perf_result *r) {
  free(r->iter_s);
  free(r->rank_iter_s);
  r->iter_s = r->rank_iter_s = NULL;
}

/* "# all_reduce_perf: 5/24 rows, 1048576 B, 3.2 s" on stderr: over itself on a
 * terminal, one line per row otherwise; total 0 for a sweep without end. */
static void print_progress(const struct perf_coll *coll, long long done, long long total,
                           size_t nbytes, double elapsed_s) {
  const int tty = isatty(STDERR_FILENO);
  char of[32] = "";
  if (total > 0) snprintf(of, sizeof of, "/%lld", total);
  fprintf(stderr, "%s# %s_perf: %lld%s rows, %zu B, %.1f s%s", tty ? "\r" : "", coll->name, done,
          of, nbytes, elapsed_s, tty ? (done == total ? "\n" : "") : "\n");
  fflush(stderr);
}

/* Every rank's line under "# Using devices", to every rank. */
static int gather_ranks(const struct perf_run *p, struct perf_rank_info *all) {
  struct perf_rank_info mine = {.pid = (int)getpid(), .group = p->color};
  snprintf(mine.host, sizeof mine.host, "%s", p->host);
  if (perf_mem_device(p->o->mem_kind, &mine.device, mine.where, sizeof mine.where, mine.name,
                      sizeof mine.name) != 0)
    return cuda_failed(p, "reading the device's properties", __FILE__, __LINE__);
  LIB_CHECK_ON(p, p->world, weftAllGather(&mine, all, sizeof mine, weftUint8, p->world, NULL));
  return PERF_OK;
}

/* -M 1: how much this rank's memory in use grew since *level (which it
 * moves on), the largest growth over the ranks. */
static int mem_growth(const struct perf_run *p, int64_t *level, int64_t *growth_out) {
  int64_t now = *level;
  if (perf_mem_used(p->o->mem_kind, &now) != 0) now = *level;
  int64_t mine = now - *level;
  *level = now;
  LIB_CHECK_ON(p, p->world,
               weftAllReduce(&mine, growth_out, 1, weftInt64, weftMax, p->world, NULL));
  return PERF_OK;
}

/* Buffers for the largest size (recv may be nranks x send: gathers), with
 * room for -u; -R's registration; -z 0's stream; -I's times and events. */
static int setup(struct perf_run *p) {
  const struct perf_opts *o = p->o;
  /* in bytes: no datatype's counts take more (their rounding is coarser) */
  struct perf_counts most;
  p->coll->counts(o->max_nbytes, 1, p->nranks, &most);
  p->alloc_nbytes = (most.send > most.recv ? most.send : most.recv) + 64 + 8 * (size_t)o->unalign;
  p->sendbuf = perf_mem_alloc(o->mem_kind, p->alloc_nbytes);
  p->recvbuf = perf_mem_alloc(o->mem_kind, p->alloc_nbytes);
  if (o->mem_kind != PERF_MEM_HOST) p->staging = perf_mem_alloc(PERF_MEM_HOST, p->alloc_nbytes);
  if (p->sendbuf == NULL || p->recvbuf == NULL ||
      (o->mem_kind != PERF_MEM_HOST && p->staging == NULL)) {
    fprintf(stderr, "rank %d: cannot allocate %zu bytes of %s memory\n", p->rank,
            p->alloc_nbytes, perf_mem_name(o->mem_kind));
    return o->mem_kind == PERF_MEM_HOST ? PERF_LIB : PERF_CUDA;
  }
  /* touched now, so that -M 1 counts them as buffers */
  MEM_CHECK(p, perf_mem_fill(o->mem_kind, p->sendbuf, 0, p->alloc_nbytes), "filling");
  MEM_CHECK(p, perf_mem_fill(o->mem_kind, p->recvbuf, 0, p->alloc_nbytes), "filling");
  if (o->local_register != PERF_REG_NONE) {
    LIB_CHECK(p, weftCommRegister(p->comm, p->sendbuf, p->alloc_nbytes, &p->send_reg));
    LIB_CHECK(p, weftCommRegister(p->comm, p->recvbuf, p->alloc_nbytes, &p->recv_reg));
  }
  /* a host stream queues host-memory calls; device calls on the NULL
   * stream go out back to back already, waited for after the loop */
  if (o->blocking == PERF_BLOCK_NONE && !o->stream_null && o->mem_kind == PERF_MEM_HOST)
    LIB_CHECK_THREAD(p, weftStreamCreate(&p->stream));
  if (o->per_iter) {
    p->iter_s = calloc((size_t)o->iters, sizeof *p->iter_s);
    if (p->iter_s == NULL) return PERF_INTERNAL;
    if (p->stream != NULL) {
      p->events = calloc((size_t)o->iters, sizeof *p->events);
      if (p->events == NULL) return PERF_INTERNAL;
      for (int i = 0; i < o->iters; i++) LIB_CHECK_THREAD(p, weftEventCreate(&p->events[i]));
    }
  }
  return PERF_OK;
}

static void teardown(struct perf_run *p) {
  if (p->events != NULL)
    for (int i = 0; i < p->o->iters; i++)
      if (p->events[i] != NULL) weftEventDestroy(p->events[i]);
  free(p->events);
  free(p->iter_s);
  if (p->stream != NULL) weftStreamDestroy(p->stream);
  if (p->send_reg != NULL) weftCommDeregister(p->comm, p->send_reg);
  if (p->recv_reg != NULL) weftCommDeregister(p->comm, p->recv_reg);
  perf_mem_free(p->o->mem_kind, p->sendbuf);
  perf_mem_free(p->o->mem_kind, p->recvbuf);
  perf_mem_free(PERF_MEM_HOST, p->staging);
}

/* Totals of the sweep, for the footer. */
struct perf_totals {
  long long error_sides; /* sides where this rank saw a wrong value */
  double busbw_sum;
  long long nsides;
};

/* Whether the collective runs on this many ranks (hypercube: a power of 2). */
static int coll_runs(const struct perf_coll *coll, int nranks) {
  return !coll->pow2_ranks || (nranks > 0 && (nranks & (nranks - 1)) == 0);
}

/* Every datatype, op, root and cycle, each a sweep of sizes (nccl-tests'
 * order); the job's rank 0 prints each row. */
static int sweep(struct perf_run *p, struct perf_report *rep, struct perf_totals *tot) {
  const struct perf_coll *coll = p->coll;
  const struct perf_opts *o = p->o;
  if (!coll_runs(coll, p->nranks)) { /* nccl-tests' words, from every rank */
    printf("nRanks %d is not a power of 2, skipping\n", p->nranks);
    fflush(stdout);
    return PERF_OK;
  }
  int root_lo = -1, root_hi = -1;
  if (coll->uses_root) {
    root_lo = o->root < 0 ? 0 : o->root;
    root_hi = o->root < 0 ? p->nranks - 1 : o->root;
  }
  const long long per_cycle = perf_sweep_rows(o) * (root_hi - root_lo + 1);
  const long long total_rows = o->cycles > 0 ? per_cycle * o->cycles : 0;
  long long nrows = 0;
  const double t_start = now_s();
  for (int ti = 0; ti < o->ntypes; ti++) {
    for (int oi = 0; oi < o->nops; oi++) {
      for (int root = root_lo; root <= root_hi; root++) {
        for (long long cycle = 0; o->cycles == 0 || cycle < o->cycles; cycle++) {
          const weftDataType_t t = o->types[ti];
          const int op = o->ops[oi];
          const size_t esize = weftTypeSize(t);
          for (size_t nbytes = o->min_nbytes; nbytes <= o->max_nbytes;) {
            struct perf_counts n;
            coll->counts(nbytes, esize, p->nranks, &n);
            const size_t larger = n.send > n.recv ? n.send : n.recv;
            /* size: one rank's larger buffer; count: what each call is given
             * (a gather's per-rank block), as nccl-tests prints them */
            struct perf_row row = {.nbytes = larger * esize, .count = n.count, .type = t,
                                   .op = op, .root = root};
            int st = run_side(p, &n, row.nbytes, t, op, root, 0, &row.oop);
            if (st == PERF_OK) st = run_side(p, &n, row.nbytes, t, op, root, 1, &row.ip);
            if (st == PERF_OK) {
              tot->error_sides += row.oop.saw_wrong + row.ip.saw_wrong;
              tot->busbw_sum += row.oop.busbw + row.ip.busbw;
              tot->nsides += 2;
              nrows++;
              if (p->world_rank == 0) {
                perf_report_row(rep, &row);
                if (o->progress)
                  print_progress(coll, nrows, total_rows, row.nbytes, now_s() - t_start);
              }
            }
            result_free(&row.oop);
            result_free(&row.ip);
            if (st != PERF_OK) return st;
            nbytes = perf_sweep_next(o, nbytes);
            if (nbytes == 0) break;
          }
        }
      }
    }
  }
  return PERF_OK;
}

/* NCCL_TESTS_MIN_BW, read as nccl-tests reads it (atof); -1 when unset. */
static double min_busbw(void) {
  const char *s = getenv("NCCL_TESTS_MIN_BW");
  return s != NULL ? atof(s) : -1;
}

/* NCCL_TESTS_SPLIT: the rank's group, a communicator of its own split from
 * the job's, the job's rank the key (MPI_Comm_split's in nccl-tests). A
 * rank whose color comes out negative joins none and fails after the split,
 * so that the others do not wait for it there. */
static int split_world(struct perf_run *p, const struct perf_split *split) {
  const int color = perf_split_color(split, p->world_rank);
  LIB_CHECK_ON(p, p->world, weftCommSplit(p->world, color < 0 ? WEFT_SPLIT_NOCOLOR : color,
                                          p->world_rank, &p->comm, NULL));
  if (color < 0) {
    fprintf(stderr, "rank %d: NCCL_TESTS_SPLIT gives it a negative color\n", p->world_rank);
    return PERF_CUDA;
  }
  p->color = color;
  weftCommUserRank(p->comm, &p->rank);
  weftCommCount(p->comm, &p->nranks);
  return PERF_OK;
}

/* The job's communicator and, split, the group's: each rank's rank and size
 * in both. */
static int join(struct perf_run *p, const struct perf_split *split, weftConfig_t *config) {
  const weftResult_t res = weftCommInitFromEnv(&p->world, config);
  if (res != weftSuccess) return lib_failed(p, res, weftGetLastError(NULL), __FILE__, __LINE__);
  weftCommUserRank(p->world, &p->world_rank);
  weftCommCount(p->world, &p->world_nranks);
  p->comm = p->world;
  p->rank = p->world_rank;
  p->nranks = p->world_nranks;
  return split->how != 0 ? split_world(p, split) : PERF_OK;
}

/* The untimed start-up warm-up: the first timed loop of a fresh job runs
 * slow (cold connections and caches), so the smallest size runs first. */
static int warm_start(const struct perf_run *p) {
  const struct perf_opts *o = p->o;
  const struct perf_coll *coll = p->coll;
  if (!coll_runs(coll, p->nranks)) return PERF_OK;
  struct perf_counts n;
  const size_t warm_nbytes = o->min_nbytes < 65536 ? o->min_nbytes : 65536;
  const int root = coll->uses_root && o->root > 0 ? o->root : coll->uses_root ? 0 : -1;
  coll->counts(warm_nbytes, weftTypeSize(o->types[0]), p->nranks, &n);
  for (int i = 0; i < 200; i++)
    LIB_CHECK(p, call_once(p, p->sendbuf, p->recvbuf, n.count, o->types[0], o->ops[0], root));
  return complete(p);
}

/* The footer's count, as nccl-tests sums it over its processes: each rank's
 * sides where it saw a wrong value. */
static int count_errors(const struct perf_run *p, const struct perf_totals *tot,
                        long long *errors_out) {
  long long mine = tot->error_sides;
  LIB_CHECK_ON(p, p->world,
               weftAllReduce(&mine, errors_out, 1, weftInt64, weftSum, p->world, NULL));
  return PERF_OK;
}

int perf_main(int argc, char **argv, const struct perf_coll *coll) {
  struct perf_opts o;
  struct perf_split split;
  int status;
  if (perf_opts_parse(argc, argv, coll, &o, &status) != 0) return status;
  if (perf_split_parse(&split) != 0) return PERF_CUDA; /* 2, as for a refused flag */
  char why[256];
  if (perf_mem_available(o.mem_kind, why, sizeof why) != 0) {
    fprintf(stderr, "%s: -M %s: %s\n", argv[0], perf_mem_name(o.mem_kind), why);
    return PERF_CUDA;
  }
  struct perf_run run = {.coll = coll, .o = &o};
  struct perf_run *p = &run;
  perf_hostname(run.host, sizeof run.host);
  int64_t mem_level = 0; /* -M 1: this rank's memory in use at the last look */
  struct perf_mem_usage usage = {0};
  if (o.memory_report) perf_mem_used(o.mem_kind, &mem_level);
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  if (o.timeout_s > 0) config.timeoutMs = o.timeout_s * 1000;
  if ((status = join(p, &split, &config)) != PERF_OK) {
    printf(" .. %s pid %d: Test failure %s:%d\n", run.host, (int)getpid(), base_name(__FILE__),
           __LINE__);
    fflush(stdout);
    if (run.world != NULL) weftCommAbort(run.world);
    return status;
  }
  struct perf_report rep = {.o = &o, .coll = coll, .prog = base_name(argv[0]),
                            .nranks = run.world_nranks};
  if (run.world_rank == 0) perf_report_open(&rep, argc, argv);
  struct perf_totals tot = {0};
  struct perf_rank_info *ranks = calloc((size_t)run.world_nranks, sizeof *ranks);
  struct perf_bound bound;
  if (ranks == NULL) {
    status = PERF_INTERNAL;
    goto out;
  }
  if (o.memory_report && (status = mem_growth(p, &mem_level, &usage.init_nbytes)) != PERF_OK)
    goto out;
  /* the bound, before anything else runs, over the whole job: host memory
   * only (a device collective's floor is the device's) */
  if (o.bound && o.mem_kind == PERF_MEM_HOST) {
    const weftResult_t res = perf_bound_measure(run.world, &bound);
    if (res != weftSuccess) {
      status = lib_failed(p, res, weftGetLastError(run.world), __FILE__, __LINE__);
      goto out;
    }
    run.bound = &bound;
  }
  if ((status = gather_ranks(p, ranks)) != PERF_OK) goto out;
  if (run.world_rank == 0) perf_report_header(&rep, ranks, run.bound);
  /* let the launcher forward the header now rather than in the first timed
   * loop, where it would take a core from a spinning rank */
  usleep(20000);
  if ((status = setup(p)) != PERF_OK) goto out;
  if (o.memory_report && (status = mem_growth(p, &mem_level, &usage.buffer_nbytes)) != PERF_OK)
    goto out;
  if ((status = warm_start(p)) != PERF_OK) goto out;
  if ((status = sweep(p, &rep, &tot)) != PERF_OK) goto out;
  if (o.memory_report && (status = mem_growth(p, &mem_level, &usage.coll_nbytes)) != PERF_OK)
    goto out;
  {
    long long errors = 0;
    if ((status = count_errors(p, &tot, &errors)) != PERF_OK) goto out;
    /* rank 0's own sides, as nccl-tests averages them; with no side (a
     * hypercube skipped) 0/0, which nccl-tests prints as -nan */
    const double avg_busbw = tot.busbw_sum / (double)tot.nsides;
    const double min_bw = min_busbw();
    if (run.world_rank == 0)
      perf_report_footer(&rep, errors, avg_busbw, min_bw, o.memory_report ? &usage : NULL);
    if (errors != 0 || avg_busbw < min_bw * 0.9) status = PERF_WRONG;
  }
out:
  if (status != PERF_OK) {
    printf(" .. %s pid %d: Test failure %s:%d\n", run.host, (int)getpid(), base_name(__FILE__),
           __LINE__);
    fflush(stdout);
  }
  const int complete_sweep = status == PERF_OK || status == PERF_WRONG;
  if (run.world_rank == 0 && perf_report_close(&rep, run.bound, complete_sweep) != 0) {
    fprintf(stderr, "%s: cannot write %s\n", argv[0], o.json_path);
    if (status == PERF_OK) status = PERF_INTERNAL;
  }
  free(ranks);
  teardown(p);
  const int failed = status != PERF_OK && status != PERF_WRONG;
  if (run.comm != NULL && run.comm != run.world) { /* the group's, split */
    if (failed) {
      weftCommAbort(run.comm);
    } else {
      weftCommFinalize(run.comm);
      weftCommDestroy(run.comm);
    }
  }
  if (failed) {
    weftCommAbort(run.world);
    return status;
  }
  weftCommFinalize(run.world);
  weftCommDestroy(run.world);
  return status;
}
