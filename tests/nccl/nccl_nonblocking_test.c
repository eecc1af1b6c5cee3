/* Nonblocking communicator creation through libnccl.so.2 (ncclConfig_t's
 * blocking = 0), in one process that drives every rank from one thread, as
 * NCCL allows in that mode:
 *   one_thread: each rank's ncclCommInitRankConfig returns ncclInProgress at
 *               once, one after another on one thread, without a group;
 *               ncclCommGetAsyncError reports ncclInProgress until all are
 *               connected, then ncclSuccess, and the comms all-reduce right
 *               (random floats, several sizes); a second round uses each rank
 *               on a thread of its own, destroyed while still in progress
 *   early_use:  a call on a comm still being created is refused with
 *               ncclInvalidArgument and a message saying so, and leaves it
 *               to finish
 *   abort:      ncclCommAbort of a comm whose peers never come returns at once
 *   failed:     a creation whose peer never comes fails at WEFT_TIMEOUT:
 *               ncclCommGetAsyncError reports the error and ncclGetLastError
 *               its text; ncclCommDestroy then frees it at once
 * Run with the part's name; exits 0 when every check passed. A watchdog ends
 * a part that hangs. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_check.h"

int g_rank, g_nranks, g_failures;

#define NMAX 4

static ncclConfig_t nonblocking(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

/* Starts rank r's nonblocking creation; it must return at once with
 * ncclInProgress (or ncclSuccess, which NCCL allows) and a comm. */
static ncclComm_t start(int n, ncclUniqueId id, int r) {
  ncclConfig_t cfg = nonblocking();
  ncclComm_t comm = NULL;
  const double t0 = nccl_now_s();
  ncclResult_t res = ncclCommInitRankConfig(&comm, n, id, r, &cfg);
  const double dt = nccl_now_s() - t0;
  EXPECT(res == ncclInProgress || res == ncclSuccess,
         "rank %d of %d: nonblocking init gave %d (%s)", r, n, (int)res, ncclGetLastError(NULL));
  EXPECT(comm != NULL, "rank %d of %d: nonblocking init left no comm", r, n);
  EXPECT(dt < 2, "rank %d of %d: nonblocking init took %.2f s", r, n, dt);
  if (comm == NULL) exit(1);
  return comm;
}

/* Polls until every comm's state is no longer ncclInProgress; returns how
 * many were ready (ncclSuccess). */
static int wait_ready(ncclComm_t *c, int n) {
  int ready = 0;
  for (int r = 0; r < n; r++) {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      NCCL_OK(ncclCommGetAsyncError(c[r], &state));
      if (state == ncclInProgress) usleep(1000);
    }
    EXPECT(state == ncclSuccess, "rank %d: creation ended with %d (%s)", r, (int)state,
           ncclGetLastError(c[r]));
    ready += state == ncclSuccess;
  }
  return ready;
}

/* All-reduces count random small integers held as floats (exact sums) over
 * the n comms of one clique, in a group from this thread, out of place. */
static void expect_sums(ncclComm_t *c, int n, size_t count, uint64_t seed) {
  float *in[NMAX], *out[NMAX];
  float *want = calloc(count, sizeof *want);
  if (want == NULL) exit(1);
  uint64_t s = seed;
  for (int r = 0; r < n; r++) {
    in[r] = malloc(count * sizeof(float));
    out[r] = malloc(count * sizeof(float));
    if (in[r] == NULL || out[r] == NULL) exit(1);
    for (size_t i = 0; i < count; i++) {
      in[r][i] = (float)((int)(nccl_rng_next(&s) % 2001) - 1000);
      out[r][i] = -12345.5f; /* poison */
      want[i] += in[r][i];
    }
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; r++)
    NCCL_OK(ncclAllReduce(in[r], out[r], count, ncclFloat, ncclSum, c[r], NULL));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < count; i++)
      if (out[r][i] != want[i]) {
        FAIL("%d ranks, %zu floats: rank %d sum[%zu] = %g, want %g", n, count, r, i,
             (double)out[r][i], (double)want[i]);
        break;
      }
    free(in[r]);
    free(out[r]);
  }
  free(want);
}

struct creator {
  int n, r;
  ncclUniqueId id;
  ncclComm_t comm;
};

static void *create_and_destroy(void *arg) {
  struct creator *a = arg;
  a->comm = start(a->n, a->id, a->r);
  /* destroyed while (perhaps) still in progress: it waits for the creation */
  NCCL_OK(ncclCommDestroy(a->comm));
  return NULL;
}

static void part_one_thread(void) {
  static const size_t sizes[] = {1, 7, 1000, 65537};
  for (int n = 2; n <= NMAX; n++) {
    ncclUniqueId id;
    NCCL_OK(ncclGetUniqueId(&id));
    ncclComm_t c[NMAX];
    for (int r = 0; r < n; r++) c[r] = start(n, id, r);
    if (wait_ready(c, n) != n) exit(1);
    for (int r = 0; r < n; r++) {
      int count = 0, rank = -1;
      NCCL_OK(ncclCommCount(c[r], &count));
      NCCL_OK(ncclCommUserRank(c[r], &rank));
      EXPECT(count == n && rank == r, "comm %d: count %d rank %d, want %d and %d", r, count,
             rank, n, r);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
      expect_sums(c, n, sizes[i], 77 + (uint64_t)n * 10 + i);
    for (int r = 0; r < n; r++) NCCL_OK(ncclCommDestroy(c[r]));
  }
  /* each rank on its own thread, destroyed without polling */
  struct creator a[3];
  pthread_t t[3];
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  for (int r = 0; r < 3; r++) {
    a[r] = (struct creator){.n = 3, .r = r, .id = id};
    if (pthread_create(&t[r], NULL, create_and_destroy, &a[r]) != 0) exit(1);
  }
  for (int r = 0; r < 3; r++) pthread_join(t[r], NULL);
}

static void part_early_use(void) {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t c[2];
  c[0] = start(2, id, 0);
  float x = 1;
  const double t0 = nccl_now_s();
  ncclResult_t res = ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, c[0], NULL);
  const char *text = ncclGetLastError(NULL);
  EXPECT(res == ncclInvalidArgument, "all-reduce on a comm being created gave %d (%s)", (int)res,
         text);
  EXPECT(strstr(text, "being created") != NULL, "its message '%s' does not say why", text);
  EXPECT(nccl_now_s() - t0 < 2, "the refusal took %.1f s", nccl_now_s() - t0);
  int count = 0;
  EXPECT(ncclCommCount(c[0], &count) == ncclInvalidArgument,
         "ncclCommCount on a comm being created was not refused");
  ncclResult_t state = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(c[0], &state));
  EXPECT(state == ncclInProgress, "a comm whose peer has not started is %d, not in progress",
         (int)state);
  c[1] = start(2, id, 1);
  if (wait_ready(c, 2) != 2) exit(1);
  expect_sums(c, 2, 513, 5);
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(c[r]));
}

static void part_abort(void) {
  for (int i = 0; i < 2; i++) {
    ncclUniqueId id;
    NCCL_OK(ncclGetUniqueId(&id));
    ncclComm_t c = start(3, id, i); /* rank 0 serves the id; rank 1 joins it */
    usleep(100000);
    const double t0 = nccl_now_s();
    NCCL_OK(ncclCommAbort(c));
    const double dt = nccl_now_s() - t0;
    EXPECT(dt < 1, "ncclCommAbort of rank %d still being created took %.2f s", i, dt);
  }
  /* the comms made next are not disturbed by the creations left behind */
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t c[2] = {start(2, id, 0), start(2, id, 1)};
  if (wait_ready(c, 2) != 2) exit(1);
  expect_sums(c, 2, 100, 9);
  for (int r = 0; r < 2; r++) NCCL_OK(ncclCommDestroy(c[r]));
}

static void part_failed(void) {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t c = start(2, id, 0);
  const double t0 = nccl_now_s();
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    NCCL_OK(ncclCommGetAsyncError(c, &state));
    if (state == ncclInProgress) usleep(10000);
  }
  const double dt = nccl_now_s() - t0;
  const char *text = ncclGetLastError(c);
  fprintf(stderr, "creation failed after %.1f s with %d: %s\n", dt, (int)state, text);
  EXPECT(state != ncclSuccess, "a creation whose peer never came succeeded");
  EXPECT(text != NULL && strstr(text, "rank 1") != NULL,
         "its text '%s' does not name the rank that never came", text ? text : "(null)");
  float x = 1;
  EXPECT(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, c, NULL) == ncclInvalidArgument,
         "an all-reduce on a failed creation was not refused");
  const double t1 = nccl_now_s();
  NCCL_OK(ncclCommDestroy(c));
  EXPECT(nccl_now_s() - t1 < 1, "destroying a failed creation took %.1f s", nccl_now_s() - t1);
}

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    void (*run)(void);
  } parts[] = {{"one_thread", part_one_thread},
               {"early_use", part_early_use},
               {"abort", part_abort},
               {"failed", part_failed}};
  signal(SIGALRM, nccl_watchdog_fired);
  int ran = 0;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    if (argc >= 2 && strcmp(argv[1], parts[i].name) == 0) {
      alarm(60);
      parts[i].run();
      alarm(0);
      ran++;
    }
  if (ran == 0) {
    fprintf(stderr, "usage: %s one_thread|early_use|abort|failed\n", argv[0]);
    return 2;
  }
  if (g_failures > 0) fprintf(stderr, "%d check(s) failed\n", g_failures);
  return g_failures > 0;
}
