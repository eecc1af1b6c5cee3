/* Bad arguments through libnccl.so.2, in one process that drives every rank
 * (as a program with one thread per GPU does): each is refused at once with
 * NCCL's code and a message, never a hang until the timeout nor a crash.
 *   groups:        a refused init, split or shrink in a group fails the
 *                  group, whose end returns at once and creates nothing; the
 *                  thread's next group and the parent communicator still
 *                  work; a grouped shrink of two survivors makes both
 *   registrations: ncclCommDeregister of a handle not handed out, or handed
 *                  out and deregistered already, or another comm's
 *   windows:       the same for ncclCommWindowDeregister and ncclWinGetUserPtr
 *   memfree:       ncclMemFree of a pointer ncclMemAlloc did not return
 *   last_error:    ncclGetLastError of a destroyed or aborted communicator,
 *                  on another thread, and while another thread destroys it
 *   late_env:      an NCCL_* variable the program sets before its first NCCL
 *                  call counts, as in NCCL
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

/* The call returns want at once, and the last error contains text. */
#define EXPECT_REFUSED(call, want, text)                                       \
  do {                                                                         \
    const double t0_ = nccl_now_s();                                                \
    ncclResult_t r_ = (call);                                                  \
    const double dt_ = nccl_now_s() - t0_;                                          \
    const char *e_ = ncclGetLastError(NULL);                                   \
    EXPECT(r_ == (want), "%s gave %d (%s), want %d", #call, (int)r_, e_, (int)(want)); \
    EXPECT(strstr(e_, text) != NULL, "%s: last error '%s' lacks '%s'", #call, e_, text); \
    EXPECT(dt_ < 5, "%s took %.1f s", #call, dt_);                             \
  } while (0)

/* A placeholder the calls must overwrite with NULL. */
#define UNWRITTEN ((ncclComm_t)(uintptr_t)0x1)

/* Sums one float over the two comms of one clique, in a group. */
static void expect_sum2(ncclComm_t c0, ncclComm_t c1, const char *what) {
  float x[2] = {1, 2}, y[2] = {0, 0};
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(&x[0], &y[0], 1, ncclFloat32, ncclSum, c0, NULL));
  NCCL_OK(ncclAllReduce(&x[1], &y[1], 1, ncclFloat32, ncclSum, c1, NULL));
  NCCL_OK(ncclGroupEnd());
  EXPECT(y[0] == 3 && y[1] == 3, "%s: sums %g %g, want 3", what, (double)y[0], (double)y[1]);
}

/* --- Variables set by the program --------------------------------------------- */

/* NCCL reads its variables at its first init, not when the library loads:
 * one the program sets before its first NCCL call counts (an interface
 * that does not exist fails the unique id and the init at once). As in
 * NCCL, the interface is then chosen for the process: this part runs
 * alone, in a process of its own (named on the command line). */
static void part_late_env(void) {
  setenv("NCCL_SOCKET_IFNAME", "nosuchif0", 1);
  ncclUniqueId id;
  EXPECT_REFUSED(ncclGetUniqueId(&id), ncclInvalidArgument, "nosuchif0");
  ncclComm_t c[2] = {UNWRITTEN, UNWRITTEN};
  EXPECT_REFUSED(ncclCommInitAll(c, 2, NULL), ncclInvalidArgument, "nosuchif0");
}

/* --- Groups --------------------------------------------------------------------- */

/* One thread makes both ranks of a clique in a group; the second's arguments
 * are refused (bad is 0: a config NCCL refuses, 1: its rank out of range, 2:
 * a collective refused between the inits). */
static void group_init_refused(int bad) {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  ncclComm_t c[2] = {UNWRITTEN, UNWRITTEN};
  ncclConfig_t blocking7 = NCCL_CONFIG_INITIALIZER;
  blocking7.blocking = 7;
  static const char *const why[] = {"blocking is 7", "rank 2 out of range", "comm is NULL"};
  const double t0 = nccl_now_s();
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&c[0], 2, id, 0));
  if (bad == 0) {
    EXPECT_REFUSED(ncclCommInitRankConfig(&c[1], 2, id, 1, &blocking7), ncclInvalidArgument,
                   why[0]);
  } else if (bad == 1) {
    EXPECT_REFUSED(ncclCommInitRank(&c[1], 2, id, 2), ncclInvalidArgument, why[1]);
  } else {
    float x = 0;
    EXPECT_REFUSED(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, NULL, NULL),
                   ncclInvalidArgument, why[2]);
    NCCL_OK(ncclCommInitRank(&c[1], 2, id, 1));
  }
  EXPECT_REFUSED(ncclGroupEnd(), ncclInvalidArgument, why[bad]);
  EXPECT(nccl_now_s() - t0 < 5, "init refusal %d: the group took %.1f s", bad, nccl_now_s() - t0);
  EXPECT(c[0] == NULL && c[1] == NULL, "init refusal %d: the failed group left comms %p %p", bad,
         (void *)c[0], (void *)c[1]);
  for (int i = 0; i < 2; i++)
    if (c[i] != NULL && c[i] != UNWRITTEN) ncclCommDestroy(c[i]);
  /* nothing of it is left: the same id makes the clique in the next group */
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRank(&c[0], 2, id, 0));
  NCCL_OK(ncclCommInitRank(&c[1], 2, id, 1));
  NCCL_OK(ncclGroupEnd());
  expect_sum2(c[0], c[1], "the group after a refused one");
  NCCL_OK(ncclCommDestroy(c[0]));
  NCCL_OK(ncclCommDestroy(c[1]));
}

/* A grouped split of both ranks whose second config NCCL refuses: the group
 * fails at once, and the parent is not broken by a split that never ran. */
static void group_split_refused(void) {
  ncclComm_t parent[2];
  NCCL_OK(ncclCommInitAll(parent, 2, NULL));
  ncclComm_t s[2] = {UNWRITTEN, UNWRITTEN};
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.minCTAs = 0;
  const double t0 = nccl_now_s();
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommSplit(parent[0], 0, 0, &s[0], NULL));
  EXPECT_REFUSED(ncclCommSplit(parent[1], 0, 1, &s[1], &bad), ncclInvalidArgument,
                 "minCTAs is 0");
  EXPECT_REFUSED(ncclGroupEnd(), ncclInvalidArgument, "minCTAs is 0");
  EXPECT(nccl_now_s() - t0 < 5, "split refusal: the group took %.1f s", nccl_now_s() - t0);
  EXPECT(s[0] == NULL && s[1] == NULL, "split refusal: the failed group left comms %p %p",
         (void *)s[0], (void *)s[1]);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(parent[0], &async));
  EXPECT(async == ncclSuccess, "the parent broke: %s", ncclGetLastError(parent[0]));
  expect_sum2(parent[0], parent[1], "the parent after a refused split");
  /* a split whose parent is not a communicator fails the group the same way */
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommSplit(parent[0], 0, 0, &s[0], NULL));
  EXPECT_REFUSED(ncclCommSplit(NULL, 0, 1, &s[1], NULL), ncclInvalidArgument, "comm is NULL");
  EXPECT_REFUSED(ncclGroupEnd(), ncclInvalidArgument, "comm is NULL");
  EXPECT(s[0] == NULL, "split of a NULL parent: the failed group left comm %p", (void *)s[0]);
  /* and the next grouped split works */
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommSplit(parent[0], 0, 0, &s[0], NULL));
  NCCL_OK(ncclCommSplit(parent[1], 0, 1, &s[1], NULL));
  NCCL_OK(ncclGroupEnd());
  expect_sum2(s[0], s[1], "the split after a refused one");
  for (int i = 0; i < 2; i++) {
    NCCL_OK(ncclCommDestroy(s[i]));
    NCCL_OK(ncclCommDestroy(parent[i]));
  }
}

/* One thread shrinks a clique of three in a group, as NCCL lets it: the
 * end makes both survivors' comms at once (each shrink called alone would
 * wait for the other until the timeout); a refused shrink in a group fails
 * it at once and makes nothing. */
static void group_shrink(void) {
  ncclComm_t parent[3];
  NCCL_OK(ncclCommInitAll(parent, 3, NULL));
  int gone = 1;
  ncclComm_t s[3] = {UNWRITTEN, UNWRITTEN, UNWRITTEN};
  const double t0 = nccl_now_s();
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommShrink(parent[0], &gone, 1, &s[0], NULL, NCCL_SHRINK_DEFAULT));
  EXPECT_REFUSED(ncclCommShrink(parent[1], &gone, 1, &s[1], NULL, NCCL_SHRINK_DEFAULT),
                 ncclInvalidArgument, "own exclude list");
  EXPECT_REFUSED(ncclGroupEnd(), ncclInvalidArgument, "own exclude list");
  EXPECT(nccl_now_s() - t0 < 5, "shrink refusal: the group took %.1f s", nccl_now_s() - t0);
  EXPECT(s[0] == NULL, "shrink refusal: the failed group left comm %p", (void *)s[0]);
  const double t1 = nccl_now_s();
  int list[1] = {gone};
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommShrink(parent[0], list, 1, &s[0], NULL, NCCL_SHRINK_DEFAULT));
  list[0] = 0; /* the call copied its list */
  NCCL_OK(ncclCommShrink(parent[2], &gone, 1, &s[2], NULL, NCCL_SHRINK_ABORT));
  NCCL_OK(ncclGroupEnd());
  EXPECT(nccl_now_s() - t1 < 5, "grouped shrink took %.1f s", nccl_now_s() - t1);
  EXPECT(s[0] != NULL && s[0] != UNWRITTEN && s[2] != NULL && s[2] != UNWRITTEN,
         "grouped shrink made comms %p %p", (void *)s[0], (void *)s[2]);
  if (s[0] != NULL && s[0] != UNWRITTEN && s[2] != NULL && s[2] != UNWRITTEN) {
    int n0 = 0, r2 = -1;
    NCCL_OK(ncclCommCount(s[0], &n0));
    NCCL_OK(ncclCommUserRank(s[2], &r2));
    EXPECT(n0 == 2 && r2 == 1, "grouped shrink: %d ranks, the last survivor rank %d", n0, r2);
    expect_sum2(s[0], s[2], "the grouped shrink");
    NCCL_OK(ncclCommDestroy(s[0]));
    NCCL_OK(ncclCommDestroy(s[2]));
  }
  for (int i = 0; i < 3; i++) NCCL_OK(ncclCommDestroy(parent[i]));
}

static void part_groups(void) {
  for (int bad = 0; bad < 3; bad++) group_init_refused(bad);
  group_split_refused();
  group_shrink();
}

/* --- Registrations and windows ------------------------------------------------ */

static void part_registrations(void) {
  ncclComm_t c[2];
  NCCL_OK(ncclCommInitAll(c, 2, NULL));
  float buf[64];
  uint64_t not_a_handle[8] = {0};
  EXPECT_REFUSED(ncclCommDeregister(c[0], (void *)(uintptr_t)0x1234), ncclInvalidUsage,
                 "not registered with");
  EXPECT_REFUSED(ncclCommDeregister(c[0], not_a_handle), ncclInvalidUsage, "not registered with");
  void *h = NULL, *h1 = NULL, *kept = NULL;
  NCCL_OK(ncclCommRegister(c[0], buf, sizeof buf, &h));
  NCCL_OK(ncclCommRegister(c[1], buf, sizeof buf, &h1));
  EXPECT_REFUSED(ncclCommDeregister(c[1], h), ncclInvalidUsage, "not registered with");
  NCCL_OK(ncclCommDeregister(c[0], h));
  EXPECT_REFUSED(ncclCommDeregister(c[0], h), ncclInvalidUsage, "not registered with");
  NCCL_OK(ncclCommDeregister(c[1], h1));
  NCCL_OK(ncclCommDeregister(c[0], NULL)); /* NCCL's: nothing to deregister */
  /* left registered: the comm's destroy frees it */
  NCCL_OK(ncclCommRegister(c[0], buf, sizeof buf, &kept));
  NCCL_OK(ncclCommDestroy(c[0]));
  NCCL_OK(ncclCommDestroy(c[1]));
}

static void part_windows(void) {
  ncclComm_t c[2];
  NCCL_OK(ncclCommInitAll(c, 2, NULL));
  float buf[64];
  uint64_t not_a_window[8] = {0};
  void *ptr = NULL;
  EXPECT_REFUSED(ncclCommWindowDeregister(c[0], (ncclWindow_t)(uintptr_t)0x40),
                 ncclInvalidArgument, "not registered with");
  EXPECT_REFUSED(ncclCommWindowDeregister(c[0], (ncclWindow_t)(void *)not_a_window),
                 ncclInvalidArgument, "not registered with");
  EXPECT_REFUSED(ncclWinGetUserPtr(c[0], (ncclWindow_t)(void *)not_a_window, &ptr),
                 ncclInvalidArgument, "not registered with");
  ncclWindow_t w = NULL, kept = NULL;
  NCCL_OK(ncclCommWindowRegister(c[0], buf, sizeof buf, &w, NCCL_WIN_DEFAULT));
  EXPECT_REFUSED(ncclCommWindowDeregister(c[1], w), ncclInvalidArgument, "not registered with");
  NCCL_OK(ncclWinGetUserPtr(c[0], w, &ptr));
  EXPECT(ptr == buf, "ncclWinGetUserPtr gave %p, want %p", ptr, (void *)buf);
  NCCL_OK(ncclCommWindowDeregister(c[0], w));
  EXPECT_REFUSED(ncclCommWindowDeregister(c[0], w), ncclInvalidArgument, "not registered with");
  EXPECT_REFUSED(ncclWinGetUserPtr(c[0], w, &ptr), ncclInvalidArgument, "not registered with");
  /* left registered: the comm's destroy frees it */
  NCCL_OK(ncclCommWindowRegister(c[1], buf, sizeof buf, &kept, NCCL_WIN_DEFAULT));
  NCCL_OK(ncclCommDestroy(c[0]));
  NCCL_OK(ncclCommDestroy(c[1]));
}

/* --- Memory ---------------------------------------------------------------------- */

static void part_memfree(void) {
  int local = 0;
  EXPECT_REFUSED(ncclMemFree(&local), ncclInvalidArgument, "MemFree");
  void *heap = malloc(64);
  if (heap == NULL) exit(1);
  EXPECT_REFUSED(ncclMemFree(heap), ncclInvalidArgument, "MemFree");
  free(heap);
  const size_t sizes[] = {100, 1u << 20};
  for (int i = 0; i < 2; i++) {
    void *p = NULL;
    NCCL_OK(ncclMemAlloc(&p, sizes[i]));
    EXPECT_REFUSED(ncclMemFree((char *)p + 8), ncclInvalidArgument, "MemFree");
    NCCL_OK(ncclMemFree(p));
    EXPECT_REFUSED(ncclMemFree(p), ncclInvalidArgument, "MemFree");
  }
  NCCL_OK(ncclMemFree(NULL));
}

/* --- The last error of a freed communicator ------------------------------------- */

struct last_error_ask {
  ncclComm_t comm;
  char text[256];
  volatile int stop;
};

/* On a thread of its own (no failure of its own): what ncclGetLastError(comm) says. */
static void *last_error_once(void *arg) {
  struct last_error_ask *a = arg;
  snprintf(a->text, sizeof a->text, "%s", ncclGetLastError(a->comm));
  return NULL;
}

/* Asks until told to stop, as a watchdog thread does while the caller frees. */
static void *last_error_loop(void *arg) {
  struct last_error_ask *a = arg;
  while (!a->stop) snprintf(a->text, sizeof a->text, "%s", ncclGetLastError(a->comm));
  return NULL;
}

static void part_last_error(void) {
  for (int abort = 0; abort < 2; abort++) {
    ncclComm_t c[1];
    NCCL_OK(ncclCommInitAll(c, 1, NULL));
    float x = 1;
    EXPECT(ncclAllReduce(&x, &x, 1, (ncclDataType_t)99, ncclSum, c[0], NULL) ==
               ncclInvalidArgument, "a datatype of 99 accepted");
    NCCL_OK(abort ? ncclCommAbort(c[0]) : ncclCommDestroy(c[0]));
    /* a freed comm is not read: the process's last failure, as NCCL's */
    struct last_error_ask a = {.comm = c[0]};
    pthread_t t;
    if (pthread_create(&t, NULL, last_error_once, &a) != 0) exit(1);
    pthread_join(t, NULL);
    EXPECT(strstr(a.text, "invalid datatype 99") != NULL,
           "ncclGetLastError of the %s comm on another thread: '%s'",
           abort ? "aborted" : "destroyed", a.text);
  }
  /* a thread asking while comms are made and freed under it */
  for (int i = 0; i < 20; i++) {
    ncclComm_t c[1];
    NCCL_OK(ncclCommInitAll(c, 1, NULL));
    struct last_error_ask a = {.comm = c[0]};
    pthread_t t;
    if (pthread_create(&t, NULL, last_error_loop, &a) != 0) exit(1);
    NCCL_OK(i % 2 ? ncclCommAbort(c[0]) : ncclCommDestroy(c[0]));
    a.stop = 1;
    pthread_join(t, NULL);
  }
}

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    void (*run)(void);
  } parts[] = {{"late_env", part_late_env}, /* named alone: it needs the first NCCL call */
               {"groups", part_groups},     {"registrations", part_registrations},
               {"windows", part_windows},   {"memfree", part_memfree},
               {"last_error", part_last_error}};
  signal(SIGALRM, nccl_watchdog_fired);
  int ran = 0;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    if ((argc < 2 && parts[i].run != part_late_env) ||
        (argc >= 2 && strcmp(argv[1], parts[i].name) == 0)) {
      alarm(60);
      parts[i].run();
      alarm(0);
      ran++;
    }
  if (ran == 0) {
    fprintf(stderr, "usage: %s [late_env|groups|registrations|windows|memfree|last_error]\n",
            argv[0]);
    return 2;
  }
  if (g_failures > 0) fprintf(stderr, "%d check(s) failed\n", g_failures);
  return g_failures > 0;
}
