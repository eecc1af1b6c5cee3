/* NCCL 2.30's additions through libnccl.so.2, written against nccl.h alone
 * and run under weftrun (like nccl_test.c): revoking a communicator with an
 * operation in flight, suspend and resume, memory statistics, growing a
 * communicator by a rank, a rank that dies and is shrunk out after a
 * revoke, windows, parameters, teams, and the calls weft
 * refuses (device API, symmetric memory, signals), which must leave the
 * communicator working. Exits 0 when every check passed. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_check.h"

int g_rank, g_nranks, g_failures;

/* The call returns want and the last error (comm's, or the thread's when
 * comm is NULL) contains text. */
#define EXPECT_ERR(call, want, comm, text)                                     \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    const char *e_ = ncclGetLastError(comm);                                   \
    EXPECT(r_ == (want), "%s gave %d (%s), want %d", #call, (int)r_, e_, (int)(want)); \
    EXPECT(e_ != NULL && strstr(e_, text) != NULL, "%s: last error '%s' lacks '%s'", #call, \
           e_ ? e_ : "(null)", text);                                          \
  } while (0)

/* All-reduces count random int64 values (each rank's from its own seed) on
 * comm, whose ranks are world ranks world_of[r], and checks the sums. */
static void expect_sum(ncclComm_t comm, const int *world_of, size_t count, const char *what) {
  int n = 0, r = -1;
  NCCL_OK(ncclCommCount(comm, &n));
  NCCL_OK(ncclCommUserRank(comm, &r));
  int64_t *buf = malloc(count * sizeof *buf), *want = calloc(count, sizeof *want);
  if (buf == NULL || want == NULL) exit(1);
  for (int p = 0; p < n; p++) {
    uint64_t s = 1000 + (uint64_t)world_of[p];
    for (size_t i = 0; i < count; i++) {
      int64_t v = (int64_t)(nccl_rng_next(&s) % 2000001) - 1000000;
      want[i] += v;
      if (p == r) buf[i] = v;
    }
  }
  NCCL_OK(ncclAllReduce(buf, buf, count, ncclInt64, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; i++)
    if (buf[i] != want[i]) {
      FAIL("%s: sum[%zu] = %lld, want %lld", what, i, (long long)buf[i], (long long)want[i]);
      break;
    }
  free(buf);
  free(want);
}

static int identity[64];

/* --- Revoke -------------------------------------------------------------------- */

struct inflight {
  ncclComm_t comm;
  ncclResult_t res;
  double seconds;
};

/* An all-reduce only rank 0 calls: it waits for peers that never come. */
static void *lonely_allreduce(void *arg) {
  struct inflight *f = arg;
  static float x[1024];
  double t0 = nccl_now_s();
  f->res = ncclAllReduce(x, x, 1024, ncclFloat32, ncclSum, f->comm, NULL);
  f->seconds = nccl_now_s() - t0;
  return NULL;
}

static void test_revoke(ncclComm_t world) {
  ncclComm_t victim = NULL;
  NCCL_OK(ncclCommSplit(world, 0, g_rank, &victim, NULL));
  EXPECT_ERR(ncclCommRevoke(victim, 1), ncclInvalidArgument, NULL, "NCCL_REVOKE_DEFAULT");

  /* rank 0 blocks in an operation; everyone revokes; rank 0's returns */
  struct inflight f = {victim, ncclSuccess, 0};
  pthread_t t;
  if (g_rank == 0) {
    pthread_create(&t, NULL, lonely_allreduce, &f);
    struct timespec wait = {0, 200 * 1000 * 1000};
    nanosleep(&wait, NULL);
  }
  double t0 = nccl_now_s();
  NCCL_OK(ncclCommRevoke(victim, NCCL_REVOKE_DEFAULT));
  double revoke_s = nccl_now_s() - t0;
  if (g_rank == 0) {
    pthread_join(t, NULL);
    EXPECT(f.res != ncclSuccess, "an all-reduce without peers succeeded across a revoke");
    /* WEFT_TIMEOUT is 60 s here: a revoke answers in well under it */
    EXPECT(f.seconds < 20 && revoke_s < 20, "revoke took %.1f s, the operation %.1f s", revoke_s,
           f.seconds);
  }
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(victim, &async));
  EXPECT(async == ncclSuccess, "async error %d after a completed revoke", (int)async);
  float y = 1;
  EXPECT_ERR(ncclAllReduce(&y, &y, 1, ncclFloat32, ncclSum, victim, NULL), ncclInvalidUsage, victim,
             "revoked");
  EXPECT_ERR(ncclSend(&y, 1, ncclFloat32, 0, victim, NULL), ncclInvalidUsage, victim, "revoked");
  NCCL_OK(ncclCommRevoke(victim, NCCL_REVOKE_DEFAULT)); /* again: nothing more to stop */

  /* the revoked communicator still splits, into a working one */
  ncclComm_t child = NULL;
  NCCL_OK(ncclCommSplit(victim, 0, -g_rank, &child, NULL));
  int rev[64];
  for (int r = 0; r < g_nranks; r++) rev[r] = g_nranks - 1 - r;
  expect_sum(child, rev, 777, "split of a revoked comm");
  NCCL_OK(ncclCommDestroy(child));
  /* and shrinks, the usual next step after a peer failed */
  if (g_nranks > 2) {
    int gone = g_nranks - 1;
    if (g_rank != gone) {
      ncclComm_t shrunk = NULL;
      NCCL_OK(ncclCommShrink(victim, &gone, 1, &shrunk, NULL, NCCL_SHRINK_ABORT));
      expect_sum(shrunk, identity, 333, "shrink of a revoked comm");
      NCCL_OK(ncclCommDestroy(shrunk));
    }
  }
  NCCL_OK(ncclCommDestroy(victim));
  expect_sum(world, identity, 100, "world after revoking another comm");
}

/* A destroy refused (a thread is in an operation on the comm) keeps what
 * the shim holds for it: rank 0's grow id is still pending after. */
static void test_refused_destroy(ncclComm_t world) {
  ncclComm_t c = NULL;
  NCCL_OK(ncclCommSplit(world, 0, g_rank, &c, NULL));
  if (g_rank == 0) {
    ncclUniqueId id, second;
    NCCL_OK(ncclCommGetUniqueId(c, &id));
    struct inflight f = {c, ncclSuccess, 0};
    pthread_t t;
    pthread_create(&t, NULL, lonely_allreduce, &f);
    struct timespec wait = {0, 200 * 1000 * 1000};
    nanosleep(&wait, NULL);
    EXPECT_ERR(ncclCommDestroy(c), ncclInvalidUsage, NULL, "in use");
    EXPECT_ERR(ncclCommGetUniqueId(c, &second), ncclInvalidUsage, NULL, "not been used");
    NCCL_OK(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT)); /* ends the lonely call */
    pthread_join(t, NULL);
  }
  /* the others leave c alone until then (a destroy would end the call) */
  expect_sum(world, identity, 50, "world after a refused destroy");
  NCCL_OK(ncclCommDestroy(c));
}

/* A rank dies (exits without a word); the others' next operation fails
 * within the timeout, and they revoke, shrink it out and go on. Runs last:
 * the dead rank does not come back. */
static void test_dead_peer(ncclComm_t world) {
  const int dead = g_nranks - 1;
  ncclComm_t ft = NULL;
  NCCL_OK(ncclCommSplit(world, 0, g_rank, &ft, NULL));
  expect_sum(ft, identity, 513, "before the failure");
  /* the dying rank leaves once every survivor has its data (a rank's
   * collective may complete while its last bytes are still on their way) */
  int ack = 1;
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < dead; r++)
    if (g_rank == dead) NCCL_OK(ncclRecv(&ack, 1, ncclInt32, r, ft, NULL));
  if (g_rank != dead) NCCL_OK(ncclSend(&ack, 1, ncclInt32, dead, ft, NULL));
  NCCL_OK(ncclGroupEnd());
  if (g_rank == dead) {
    fflush(NULL);
    _exit(0);
  }
  float x[4096] = {0};
  double t0 = nccl_now_s();
  ncclResult_t res = ncclAllReduce(x, x, 4096, ncclFloat32, ncclSum, ft, NULL);
  double failed_s = nccl_now_s() - t0;
  EXPECT(res == ncclRemoteError, "an all-reduce with a dead rank gave %d (%s), want ncclRemoteError",
         (int)res, ncclGetLastError(ft));
  EXPECT(failed_s < 20, "the dead rank was noticed after %.1f s (timeout 60 s)", failed_s);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(ft, &async));
  EXPECT(async != ncclSuccess, "no async error after a peer died");
  NCCL_OK(ncclCommRevoke(ft, NCCL_REVOKE_DEFAULT));
  NCCL_OK(ncclCommGetAsyncError(ft, &async));
  EXPECT(async == ncclSuccess, "async error %d after the revoke", (int)async);
  ncclComm_t survivors = NULL;
  NCCL_OK(ncclCommShrink(ft, (int[]){dead}, 1, &survivors, NULL, NCCL_SHRINK_ABORT));
  int n = 0;
  NCCL_OK(ncclCommCount(survivors, &n));
  EXPECT(n == g_nranks - 1, "%d survivors, want %d", n, g_nranks - 1);
  expect_sum(survivors, identity, 20011, "survivors after the shrink");
  NCCL_OK(ncclCommDestroy(survivors));
  NCCL_OK(ncclCommDestroy(ft));
  if (g_rank == 0)
    printf("nccl_comm_test: a dead rank noticed in %.2f s, revoked and shrunk out\n", failed_s);
}

/* --- Suspend, resume, memory statistics ---------------------------------------- */

static uint64_t stat_of(ncclComm_t comm, ncclCommMemStat_t stat) {
  uint64_t v = ~0ull;
  NCCL_OK(ncclCommMemStats(comm, stat, &v));
  return v;
}

static void expect_stats_add_up(ncclComm_t comm, const char *when) {
  uint64_t total = stat_of(comm, ncclStatGpuMemTotal), susp = stat_of(comm, ncclStatGpuMemSuspend),
           persist = stat_of(comm, ncclStatGpuMemPersist);
  EXPECT(total == susp + persist, "%s: total %llu != suspendable %llu + persistent %llu", when,
         (unsigned long long)total, (unsigned long long)susp, (unsigned long long)persist);
}

struct suspender {
  ncclComm_t comm;
  ncclResult_t res;
};

static void *suspend_thread(void *arg) {
  struct suspender *s = arg;
  s->res = ncclCommSuspend(s->comm, NCCL_SUSPEND_MEM);
  return NULL;
}

static void test_suspend(ncclComm_t world) {
  ncclComm_t comm = NULL;
  NCCL_OK(ncclCommSplit(world, 0, g_rank, &comm, NULL));
  const size_t big = (size_t)3 << 19; /* 12 MiB of int64: past the small-message paths */
  expect_sum(comm, identity, big, "before suspending");
  EXPECT(stat_of(comm, ncclStatGpuMemSuspended) == 0, "suspended before ncclCommSuspend");
  expect_stats_add_up(comm, "active");
  uint64_t before = stat_of(comm, ncclStatGpuMemSuspend);
  uint64_t v;
  EXPECT_ERR(ncclCommMemStats(comm, (ncclCommMemStat_t)9, &v), ncclInvalidArgument, NULL, "9");
  EXPECT_ERR(ncclCommMemStats(comm, ncclStatGpuMemTotal, NULL), ncclInvalidArgument, NULL, "NULL");

  EXPECT_ERR(ncclCommSuspend(comm, 0x4), ncclInvalidArgument, NULL, "unknown flags");
  EXPECT_ERR(ncclCommResume(comm), ncclInvalidUsage, NULL, "not suspended");
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  EXPECT(stat_of(comm, ncclStatGpuMemSuspended) == 1, "not suspended after ncclCommSuspend");
  EXPECT(stat_of(comm, ncclStatGpuMemSuspend) == 0, "%llu suspendable bytes left after suspending (%llu before)",
         (unsigned long long)stat_of(comm, ncclStatGpuMemSuspend), (unsigned long long)before);
  expect_stats_add_up(comm, "suspended");
  int64_t x = 5;
  EXPECT_ERR(ncclAllReduce(&x, &x, 1, ncclInt64, ncclSum, comm, NULL), ncclInvalidUsage, comm,
             "suspended");
  EXPECT_ERR(ncclBroadcast(&x, &x, 1, ncclInt64, 0, comm, NULL), ncclInvalidUsage, comm,
             "suspended");
  EXPECT(x == 5, "a refused all-reduce changed the buffer to %lld", (long long)x);
  EXPECT_ERR(ncclCommSuspend(comm, 0), ncclInvalidUsage, NULL, "already suspended");
  NCCL_OK(ncclCommResume(comm));
  EXPECT(stat_of(comm, ncclStatGpuMemSuspended) == 0, "still suspended after ncclCommResume");
  expect_sum(comm, identity, big, "after resuming");
  expect_stats_add_up(comm, "resumed");

  /* an all-reduce recorded in a group before another thread suspends the
   * communicator runs after the suspension: it refuses itself when it
   * starts, touching neither the buffer nor the freed scratch */
  int64_t y = 7;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(&y, &y, 1, ncclInt64, ncclSum, comm, NULL));
  struct suspender sus = {comm, ncclInternalError};
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, suspend_thread, &sus) == 0, "pthread_create");
  pthread_join(th, NULL);
  EXPECT(sus.res == ncclSuccess, "ncclCommSuspend from another thread gave %d", (int)sus.res);
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, NULL, "suspended");
  EXPECT(y == 7, "an all-reduce recorded before the suspension changed the buffer to %lld",
         (long long)y);
  NCCL_OK(ncclCommResume(comm));
  expect_sum(comm, identity, big, "after a refused group");

  /* a suspension without NCCL_SUSPEND_MEM refuses operations too */
  NCCL_OK(ncclCommSuspend(comm, 0));
  EXPECT_ERR(ncclAllReduce(&x, &x, 1, ncclInt64, ncclSum, comm, NULL), ncclInvalidUsage, comm,
             "suspended");
  NCCL_OK(ncclCommResume(comm));
  expect_sum(comm, identity, 1001, "after a plain suspension");
  /* destroying a suspended communicator is allowed */
  NCCL_OK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  NCCL_OK(ncclCommDestroy(comm));
  if (g_rank == 0) printf("nccl_comm_test: %llu scratch bytes released by a suspension\n",
                          (unsigned long long)before);
}

/* --- Last error ------------------------------------------------------------------ */

static void *failing_thread(void *arg) {
  (void)arg;
  ncclGetVersion(NULL);
  return NULL;
}

/* ncclGetLastError(NULL) on a thread whose last call did not fail gives the
 * process's last failure, as NCCL's one text does (a watchdog thread asking
 * about another thread's failure); after the thread's own failure, that. */
static void test_last_error_any_thread(ncclComm_t world) {
  pthread_t th;
  EXPECT(pthread_create(&th, NULL, failing_thread, NULL) == 0, "pthread_create");
  pthread_join(th, NULL);
  int v = 0;
  NCCL_OK(ncclGetVersion(&v));
  const char *e = ncclGetLastError(NULL);
  EXPECT(e != NULL && strstr(e, "version is NULL") != NULL,
         "another thread's failure not in ncclGetLastError(NULL): '%s'", e ? e : "(null)");
  EXPECT_ERR(ncclCommSuspend(world, 0x4), ncclInvalidArgument, NULL, "unknown flags");
}

/* --- Grow ------------------------------------------------------------------------ */

/* The last world rank stays out of `small`, then joins it by a grow. */
static void test_grow(ncclComm_t world) {
  const int newbie = g_nranks - 1;
  ncclComm_t small = NULL;
  NCCL_OK(ncclCommSplit(world, g_rank == newbie ? NCCL_SPLIT_NOCOLOR : 0, g_rank, &small, NULL));
  EXPECT((small == NULL) == (g_rank == newbie), "split left the wrong rank out");

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (g_rank == 0) {
    NCCL_OK(ncclCommGetUniqueId(small, &id));
    ncclUniqueId second;
    EXPECT_ERR(ncclCommGetUniqueId(small, &second), ncclInvalidUsage, NULL, "not been used");
  }
  NCCL_OK(ncclBroadcast(&id, &id, sizeof id, ncclUint8, 0, world, NULL));

  ncclComm_t grown = NULL;
  if (small != NULL) {
    /* refused before any rank talks to another */
    EXPECT_ERR(ncclCommGrow(small, g_nranks, NULL, g_rank, &grown, NULL), ncclInvalidArgument,
               NULL, "rank -1");
    EXPECT_ERR(ncclCommGrow(small, g_nranks - 1, NULL, -1, &grown, NULL), ncclInvalidArgument,
               NULL, "does not exceed");
    if (g_rank == 0) {
      /* a bad configuration is refused before the id is taken: it serves below */
      ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
      bad.blocking = 7;
      EXPECT_ERR(ncclCommGrow(small, g_nranks, &id, -1, &grown, &bad), ncclInvalidArgument, NULL,
                 "blocking is 7");
    }
    if (g_rank != 0) {
      ncclUniqueId forged = id;
      EXPECT_ERR(ncclCommGrow(small, g_nranks, &forged, -1, &grown, NULL), ncclInvalidArgument,
                 NULL, "not made by ncclCommGetUniqueId");
    }
    NCCL_OK(ncclCommGrow(small, g_nranks, g_rank == 0 ? &id : NULL, -1, &grown, NULL));
  } else {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "grown";
    NCCL_OK(ncclCommGrow(NULL, g_nranks, &id, newbie, &grown, &cfg));
  }
  int n = 0, r = -1;
  NCCL_OK(ncclCommCount(grown, &n));
  NCCL_OK(ncclCommUserRank(grown, &r));
  EXPECT(n == g_nranks && r == g_rank, "grown comm: rank %d of %d, want %d of %d", r, n, g_rank,
         g_nranks);
  expect_sum(grown, identity, 4097, "grown comm");
  if (g_rank == 0) /* consumed: a second grow with it is refused */
    EXPECT_ERR(ncclCommGrow(small, g_nranks, &id, -1, &grown, NULL), ncclInvalidArgument, NULL,
               "used already");
  NCCL_OK(ncclCommDestroy(grown));
  NCCL_OK(ncclCommDestroy(small));
}

/* --- Windows, refused calls, teams ------------------------------------------------ */

static void test_windows_and_refusals(ncclComm_t comm, ncclComm_t other) {
  const size_t count = 4099;
  double *buf = NULL;
  NCCL_OK(ncclMemAlloc((void **)&buf, count * sizeof *buf));
  ncclWindow_t win = NULL;
  NCCL_OK(ncclCommWindowRegister(comm, buf, count * sizeof *buf, &win,
                                 NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING));
  void *user = NULL;
  NCCL_OK(ncclWinGetUserPtr(comm, win, &user));
  EXPECT(user == buf, "ncclWinGetUserPtr gave %p, want %p", user, (void *)buf);
  EXPECT_ERR(ncclWinGetUserPtr(other, win, &user), ncclInvalidArgument, NULL,
             "not registered with this communicator");
  EXPECT_ERR(ncclWinGetUserPtr(comm, win, NULL), ncclInvalidArgument, NULL, "NULL");

  /* each refusal names its function, as the comm's last error too */
  void *ptr = &ptr;
  ncclMultimemHandle_t mm = {NULL};
  EXPECT_ERR(ncclGetPeerDevicePointer(win, 0, 0, &ptr), ncclInvalidUsage, comm,
             "ncclGetPeerDevicePointer");
  EXPECT_ERR(ncclGetLsaDevicePointer(win, 0, 0, &ptr), ncclInvalidUsage, comm,
             "ncclGetLsaDevicePointer");
  EXPECT_ERR(ncclGetLsaMultimemDevicePointer(win, 0, &ptr), ncclInvalidUsage, comm,
             "ncclGetLsaMultimemDevicePointer");
  EXPECT_ERR(ncclGetMultimemDevicePointer(win, 0, mm, &ptr), ncclInvalidUsage, comm,
             "ncclGetMultimemDevicePointer");
  EXPECT(ptr == &ptr, "a refused call wrote its output");
  EXPECT_ERR(ncclPutSignal(buf, 1, ncclFloat64, (g_rank + 1) % g_nranks, win, 0, 0, 0, 0, comm, NULL),
             ncclInvalidUsage, comm, "ncclPutSignal");
  EXPECT_ERR(ncclSignal(0, 0, 0, 0, comm, NULL), ncclInvalidUsage, comm, "ncclSignal");
  ncclWaitSignalDesc_t desc = {1, 0, 0, 0};
  EXPECT_ERR(ncclWaitSignal(1, &desc, comm, NULL), ncclInvalidUsage, comm, "ncclWaitSignal");
  EXPECT_ERR(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage, comm, "ncclDevCommCreate");
  EXPECT_ERR(ncclCommQueryProperties(comm, NULL), ncclInvalidUsage, comm,
             "ncclCommQueryProperties");
  ncclTeam_t world_team = ncclTeamWorld(comm);
  EXPECT_ERR(ncclGinBarrierCreateRequirement(comm, world_team, 1, NULL, NULL), ncclInvalidUsage,
             comm, "ncclGinBarrierCreateRequirement");
  EXPECT_ERR(ncclLsaBarrierCreateRequirement(world_team, 1, NULL, NULL), ncclInvalidUsage, NULL,
             "ncclLsaBarrierCreateRequirement");
  EXPECT_ERR(ncclLLA2ACreateRequirement(1, 1, NULL, NULL), ncclInvalidUsage, NULL,
             "ncclLLA2ACreateRequirement");
  EXPECT(ncclLLA2ACalcSlots(16, 8) == -1, "ncclLLA2ACalcSlots answered");

  /* the refusals broke nothing: the window's memory still all-reduces */
  for (size_t i = 0; i < count; i++) buf[i] = g_rank * 0.5 + (double)i;
  NCCL_OK(ncclAllReduce(buf, buf, count, ncclFloat64, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; i++)
    if (buf[i] != 0.25 * g_nranks * (g_nranks - 1) + g_nranks * (double)i) {
      FAIL("all-reduce after refused calls: [%zu] = %g", i, buf[i]);
      break;
    }
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  EXPECT(async == ncclSuccess, "refused calls left async error %d", (int)async);
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  EXPECT_ERR(ncclCommWindowDeregister(comm, NULL), ncclInvalidArgument, NULL, "window");
  /* a NULL registration handle is nothing to deregister, as NCCL's */
  NCCL_OK(ncclCommDeregister(comm, NULL));
  NCCL_OK(ncclMemFree(buf));

  /* teams: the world, and an LSA team of this rank alone */
  EXPECT(world_team.nRanks == g_nranks && world_team.rank == g_rank && world_team.stride == 1,
         "world team {%d, %d, %d}", world_team.nRanks, world_team.rank, world_team.stride);
  ncclTeam_t lsa = ncclTeamLsa(comm), rail = ncclTeamRail(comm);
  EXPECT(lsa.nRanks == 1 && lsa.rank == 0 && lsa.stride == 1, "lsa team {%d, %d, %d}", lsa.nRanks,
         lsa.rank, lsa.stride);
  EXPECT(rail.nRanks == g_nranks && rail.rank == g_rank, "rail team {%d, %d, %d}", rail.nRanks,
         rail.rank, rail.stride);
  for (int r = 0; r < g_nranks; r++)
    EXPECT(ncclTeamRankToWorld(comm, world_team, r) == r, "world rank of team rank %d", r);
  EXPECT(ncclTeamRankToWorld(comm, world_team, g_nranks) == -1, "a rank past the world mapped");
  EXPECT(ncclTeamRankToWorld(comm, lsa, 0) == g_rank, "the lsa team's rank 0 is not this rank");
  EXPECT(ncclTeamRankToLsa(comm, world_team, g_rank) == 0, "this rank is not 0 in its lsa team");
  EXPECT(ncclTeamRankToLsa(comm, world_team, (g_rank + 1) % g_nranks) == -1,
         "a peer is in the lsa team");
  ncclTeam_t none = ncclTeamWorld(NULL);
  EXPECT(none.nRanks == 0, "a team of a NULL comm has %d ranks", none.nRanks);
}

/* --- Parameters (the test runs with NCCL_PROTO=Simple) ----------------------- */

static void test_params(void) {
  ncclParamHandle_t h = NULL;
  NCCL_OK(ncclParamBind(&h, "WEFT_SLOT_BYTES"));
  int64_t i64 = 0;
  uint32_t u32 = 0;
  uint16_t u16 = 7;
  NCCL_OK(ncclParamGetI64(h, &i64)); /* the default, 128K */
  NCCL_OK(ncclParamGetU32(h, &u32));
  EXPECT(i64 == 131072 && u32 == 131072, "WEFT_SLOT_BYTES read as %lld / %u", (long long)i64, u32);
  EXPECT_ERR(ncclParamGetU16(h, &u16), ncclInvalidArgument, NULL, "does not fit");
  EXPECT(u16 == 7, "a value that does not fit was written");
  const char *str = NULL;
  EXPECT_ERR(ncclParamGetStr(h, &str), ncclInvalidArgument, NULL, "integer");
  int64_t raw = 0;
  int len = 0;
  NCCL_OK(ncclParamGet(h, &raw, sizeof raw, &len));
  EXPECT(raw == 131072 && len == (int)sizeof raw, "ncclParamGet: %lld, %d bytes", (long long)raw, len);
  EXPECT_ERR(ncclParamGet(h, &raw, 4, &len), ncclInvalidArgument, NULL, "maxLen");

  /* an NCCL name weft maps: NCCL_PROTO=Simple became WEFT_PROTO=simple at load */
  NCCL_OK(ncclParamBind(&h, "NCCL_PROTO"));
  NCCL_OK(ncclParamGetStr(h, &str));
  EXPECT(str != NULL && strcmp(str, "simple") == 0, "NCCL_PROTO read as '%s'", str ? str : "(null)");
  EXPECT_ERR(ncclParamGetI64(h, &i64), ncclInvalidArgument, NULL, "string");
  int vlen = 0;
  const char *text = NULL;
  NCCL_OK(ncclParamGetParameter("WEFT_SLOT_BYTES", &text, &vlen));
  EXPECT(strcmp(text, "131072") == 0 && vlen == 6, "WEFT_SLOT_BYTES as text: '%s' (%d)", text, vlen);
  /* ncclParamGetStr's text is valid until its own next call, whatever else
   * is asked between (they shared one buffer) */
  EXPECT(strcmp(str, "simple") == 0, "NCCL_PROTO's text after another call: '%s'", str);
  EXPECT_ERR(ncclParamGetParameter("NCCL_NO_SUCH_THING", &str, &vlen), ncclInvalidArgument, NULL,
             "NCCL_NO_SUCH_THING");
  EXPECT(str == NULL && vlen == 0, "an unknown key left a value");
  EXPECT_ERR(ncclParamBind(&h, "NCCL_NO_SUCH_THING"), ncclInvalidArgument, NULL, "no parameter");

  const char **keys = NULL;
  int nkeys = 0, seen = 0;
  NCCL_OK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  for (int i = 0; i < nkeys; i++) {
    seen += strcmp(keys[i], "WEFT_TIMEOUT") == 0 || strcmp(keys[i], "WEFT_SLOT_BYTES") == 0;
    ncclParamHandle_t each = NULL;
    EXPECT(ncclParamBind(&each, keys[i]) == ncclSuccess, "key '%s' does not bind", keys[i]);
  }
  EXPECT(nkeys > 10 && seen == 2, "%d keys, WEFT_TIMEOUT and WEFT_SLOT_BYTES %d of 2", nkeys, seen);
}

/* A rank whose split config is bad (an uninitialised ncclConfig_t) still
 * takes part, so every rank's ncclCommSplit fails at once rather than the
 * others waiting out the timeout (60 s); the bad rank says why. */
static void test_split_bad_config(ncclComm_t world) {
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  ncclComm_t child = NULL;
  double t0 = nccl_now_s();
  ncclResult_t res = ncclCommSplit(world, 0, g_rank, &child, g_rank == 0 ? &bad : NULL);
  double s = nccl_now_s() - t0;
  EXPECT(res != ncclSuccess, "a split with one rank's bad config succeeded");
  EXPECT(child == NULL, "a failed split left a communicator");
  EXPECT(s < 10.0, "the failed split took %.1f s", s);
  if (g_rank == 0)
    EXPECT(strstr(ncclGetLastError(world), "NCCL_CONFIG_INITIALIZER") != NULL ||
               strstr(ncclGetLastError(world), "config") != NULL,
           "the bad rank's error: '%s'", ncclGetLastError(world));
  expect_sum(world, identity, 1000, "world after a split refused for a bad config");
}

int main(void) {
  ncclUniqueId id;
  nccl_test_job(&id);
  if (g_nranks < 2 || g_nranks > 64) {
    fprintf(stderr, "nccl_comm_test needs 2 to 64 ranks\n");
    return 2;
  }
  for (int r = 0; r < 64; r++) identity[r] = r;
  ncclComm_t world = NULL;
  NCCL_OK(ncclCommInitRank(&world, g_nranks, id, g_rank));
  ncclComm_t other = NULL;
  NCCL_OK(ncclCommSplit(world, 0, g_rank, &other, NULL));

  test_params();
  test_split_bad_config(world);
  test_windows_and_refusals(world, other);
  test_suspend(world);
  test_last_error_any_thread(world);
  test_grow(world);
  test_revoke(world);
  test_refused_destroy(world);
  test_dead_peer(world); /* the last rank ends here */

  NCCL_OK(ncclCommDestroy(other));
  NCCL_OK(ncclCommDestroy(world));
  if (g_failures) fprintf(stderr, "rank %d: %d checks failed\n", g_rank, g_failures);
  else if (g_rank == 0) printf("nccl_comm_test: %d ranks: all checks passed\n", g_nranks);
  return g_failures ? 1 : 0;
}
