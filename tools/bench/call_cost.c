/* The library's own CPU time per small collective call: CALLS calls of one
 * collective of BYTES bytes (float; sum where there is an op) outside any
 * group, on a NULL stream, timed with the process's CPU clock. On a
 * single-rank communicator (the default, no launcher needed) there is no
 * peer to wait for, so the figure is the library's work alone and hardly
 * moves with the machine's load; under weftrun each rank prints its own,
 * which then includes the waits for the peers.
 *
 *   call_cost [all_reduce|all_gather|reduce_scatter|broadcast|reduce|sendrecv|
 *              alltoall|gather|scatter|all] [CALLS=5000000] [BYTES=8] [REPEATS=5]
 *
 * sendrecv is nccl-tests' step: a group of a send to the next rank and a
 * receive from the one before (on one rank, to and from itself); alltoall,
 * gather and scatter (root 0) are BYTES a block.
 *
 * Prints, per collective, the smallest and the median over REPEATS runs of
 * CPU ns per call, after 100000 unrecorded calls. */
#include <weft.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum which { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, SENDRECV, ALLTOALL,
             GATHER, SCATTER, NWHICH };
static const char *const names[NWHICH] = {"all_reduce", "all_gather", "reduce_scatter",
                                          "broadcast",  "reduce",     "sendrecv",
                                          "alltoall",   "gather",     "scatter"};

static double cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* A send to the next rank and a receive from the one before, in a group. */
static weftResult_t sendrecv(const float *in, float *out, size_t count, weftComm_t comm) {
  int rank, n;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &n);
  weftGroupStart();
  weftResult_t res = weftSend(in, count, weftFloat32, (rank + 1) % n, comm, NULL);
  weftResult_t res2 = weftRecv(out, count, weftFloat32, (rank + n - 1) % n, comm, NULL);
  weftResult_t end = weftGroupEnd();
  return res != weftSuccess ? res : res2 != weftSuccess ? res2 : end;
}

static weftResult_t call(enum which w, const float *in, float *out, size_t count,
                         weftComm_t comm) {
  switch (w) {
    case SENDRECV: return sendrecv(in, out, count, comm);
    case ALLTOALL: return weftAlltoAll(in, out, count, weftFloat32, comm, NULL);
    case GATHER: return weftGather(in, out, count, weftFloat32, 0, comm, NULL);
    case SCATTER: return weftScatter(in, out, count, weftFloat32, 0, comm, NULL);
    case ALL_REDUCE: return weftAllReduce(in, out, count, weftFloat32, weftSum, comm, NULL);
    case ALL_GATHER: return weftAllGather(in, out, count, weftFloat32, comm, NULL);
    case REDUCE_SCATTER:
      return weftReduceScatter(in, out, count, weftFloat32, weftSum, comm, NULL);
    case BROADCAST: return weftBroadcast(in, out, count, weftFloat32, 0, comm, NULL);
    case REDUCE: return weftReduce(in, out, count, weftFloat32, weftSum, 0, comm, NULL);
    default: return weftInvalidArgument;
  }
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Runs w REPEATS times CALLS calls; prints min and median ns per call. */
static int measure(enum which w, weftComm_t comm, int rank, int nranks, long calls,
                   size_t count, int repeats) {
  /* the largest buffer any of the collectives needs: nranks * count */
  float *in = calloc(count * (size_t)nranks, sizeof *in);
  float *out = calloc(count * (size_t)nranks, sizeof *out);
  double *ns = calloc((size_t)repeats, sizeof *ns);
  if (in == NULL || out == NULL || ns == NULL) return 1;
  for (long i = 0; i < 100000; i++)
    if (call(w, in, out, count, comm) != weftSuccess) goto failed;
  for (int r = 0; r < repeats; r++) {
    double t0 = cpu_ns();
    for (long i = 0; i < calls; i++)
      if (call(w, in, out, count, comm) != weftSuccess) goto failed;
    ns[r] = (cpu_ns() - t0) / (double)calls;
  }
  qsort(ns, (size_t)repeats, sizeof *ns, by_value);
  printf("rank %d/%d %-15s %zu B: %.1f ns CPU per call (min), %.1f (median), %d x %ld calls\n",
         rank, nranks, names[w], count * sizeof(float), ns[0], ns[repeats / 2], repeats, calls);
  free(in);
  free(out);
  free(ns);
  return 0;
failed:
  fprintf(stderr, "call_cost: rank %d: %s: %s\n", rank, names[w], weftGetLastError(comm));
  return 1;
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all_reduce";
  long calls = argc > 2 ? atol(argv[2]) : 5000000;
  size_t count = (argc > 3 ? (size_t)atol(argv[3]) : 8) / sizeof(float);
  int repeats = argc > 4 ? atoi(argv[4]) : 5;
  if (count == 0) count = 1;
  if (calls < 1) calls = 1;
  if (repeats < 1) repeats = 1;
  int first = -1;
  for (int w = 0; w < NWHICH; w++)
    if (strcmp(what, names[w]) == 0) first = w;
  if (first < 0 && strcmp(what, "all") != 0) {
    fprintf(stderr, "call_cost: unknown collective %s\n", what);
    return 2;
  }
  weftComm_t comm;
  weftResult_t res = getenv("WEFT_RANK") != NULL ? weftCommInitFromEnv(&comm, NULL)
                                                 : weftCommInitAll(&comm, 1, NULL);
  if (res != weftSuccess) {
    fprintf(stderr, "call_cost: %s\n", weftGetLastError(NULL));
    return 1;
  }
  int rank, nranks;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  int failed = 0;
  for (int w = first < 0 ? 0 : first; w < (first < 0 ? NWHICH : first + 1) && !failed; w++)
    failed = measure((enum which)w, comm, rank, nranks, calls, count, repeats);
  weftCommDestroy(comm);
  return failed;
}
