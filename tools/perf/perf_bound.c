/* The perf tools' bound: a cache-line ping-pong between ranks 0 and 1 and a
 * copy on every rank at once, both short, measured before the first row. */
#include "perf_bound.h"

#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The ping-pong: the first batch warms up, the fastest of the others counts
 * (a floor: a batch in which another process took a CPU is only slower). */
#define PINGPONG_BATCHES 31
#define PINGPONG_PER_BATCH 300
/* A ping-pong that has not finished by then stops (other processes on the
 * CPUs, ranks 0 and 1 time-sliced on one, a peer stopped): the batches done
 * count if there are PINGPONG_MIN_BATCHES, else the round trip is left out. */
#define PINGPONG_LIMIT_S 0.25
#define PINGPONG_MIN_BATCHES 3
#define PINGPONG_STOP UINT64_MAX

/* Each rank's copy is the last-level cache's size, within these limits, so
 * that the ranks' buffers together are several times the cache. */
#define COPY_MIN_NBYTES ((size_t)16 << 20)
#define COPY_MAX_NBYTES ((size_t)128 << 20)
#define COPY_PASSES 3

/* The shared page of the ping-pong. */
struct bound_page {
  alignas(64) uint64_t line; /* ranks 0 and 1 take turns at it */
  alignas(64) uint32_t done; /* rank 0 is finished: the other ranks may go on */
};

/* What rank 0 broadcasts before the ping-pong. */
struct bound_hello {
  char name[64]; /* the page's shared-memory name; empty when rank 0 has none */
  int cpu;       /* rank 0's CPU */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The lowest CPU this process may run on other than `avoid`, or -1. */
static int cpu_pick(int avoid) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set) && c != avoid) return c;
  return -1;
}

/* Pins this process to cpu, keeping its mask in *saved_out; 0 on success. */
static int cpu_pin(int cpu, cpu_set_t *saved_out) {
  if (sched_getaffinity(0, sizeof *saved_out, saved_out) != 0) return -1;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof one, &one);
}

/* Spins until *line holds want; 0, or -1 on the stop value or past deadline. */
static int line_wait(const uint64_t *line, uint64_t want, double deadline) {
  for (unsigned spins = 1;; spins++) {
    uint64_t v = __atomic_load_n(line, __ATOMIC_ACQUIRE);
    if (v == want) return 0;
    if (v == PINGPONG_STOP) return -1;
    if ((spins & 1023) == 0 && now_s() > deadline) return -1;
  }
}

/* Rank 0's side: the time of a round trip in us, or NAN. */
static double pingpong_lead(struct bound_page *page) {
  const double deadline = now_s() + PINGPONG_LIMIT_S;
  double best = NAN;
  int timed = 0; /* batches after the first */
  uint64_t v = 1;
  if (line_wait(&page->line, v, deadline) != 0) goto stop; /* rank 1 is pinned */
  for (int b = 0; b < PINGPONG_BATCHES; b++) {
    const double t0 = now_s();
    for (int i = 0; i < PINGPONG_PER_BATCH; i++) {
      __atomic_store_n(&page->line, v + 1, __ATOMIC_RELEASE);
      if (line_wait(&page->line, v + 2, deadline) != 0) goto stop;
      v += 2;
    }
    const double us = (now_s() - t0) * 1e6 / PINGPONG_PER_BATCH;
    if (b > 0 && (timed++ == 0 || us < best)) best = us;
  }
  return best;
stop:
  __atomic_store_n(&page->line, PINGPONG_STOP, __ATOMIC_RELEASE);
  return timed >= PINGPONG_MIN_BATCHES ? best : NAN;
}

/* Rank 1's side: answers every ping. */
static void pingpong_follow(struct bound_page *page) {
  const double deadline = now_s() + PINGPONG_LIMIT_S;
  uint64_t v = 1;
  __atomic_store_n(&page->line, v, __ATOMIC_RELEASE);
  for (long i = 0; i < (long)PINGPONG_BATCHES * PINGPONG_PER_BATCH; i++) {
    if (line_wait(&page->line, v + 1, deadline) != 0) return;
    __atomic_store_n(&page->line, v + 2, __ATOMIC_RELEASE);
    v += 2;
  }
}

/* Maps the page of `name`, created by rank 0; NULL on failure. */
static struct bound_page *page_map(const char *name, int create) {
  int fd = shm_open(name, O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0), 0600);
  if (fd < 0) return NULL;
  void *p = MAP_FAILED;
  if (!create || ftruncate(fd, sizeof(struct bound_page)) == 0)
    p = mmap(NULL, sizeof(struct bound_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    if (create) shm_unlink(name);
    return NULL;
  }
  return p;
}

/* The round trip between ranks 0 and 1, each pinned to a CPU of its own for
 * the while; the other ranks sleep meanwhile. */
static weftResult_t measure_round_trip(weftComm_t comm, int rank, struct perf_bound *b) {
  struct bound_hello hello = {.name = "", .cpu = -1};
  struct bound_page *page = NULL;
  if (rank == 0) {
    hello.cpu = cpu_pick(-1);
    snprintf(hello.name, sizeof hello.name, "/weft-perf-bound-%d-%lx", (int)getpid(),
             (unsigned long)(now_s() * 1e9));
    page = page_map(hello.name, 1);
    if (page == NULL) hello.name[0] = '\0';
  }
  weftResult_t res = weftBroadcast(&hello, &hello, sizeof hello, weftUint8, 0, comm, NULL);
  if (res != weftSuccess) goto unmap;
  if (rank != 0 && hello.name[0] != '\0') page = page_map(hello.name, 0);
  /* [0]: a rank could not map the page; [1]: rank 1's CPU */
  int agree[2] = {page == NULL, rank == 1 ? cpu_pick(hello.cpu) : -1}, all[2];
  res = weftAllReduce(agree, all, 2, weftInt32, weftMax, comm, NULL);
  if (rank == 0 && page != NULL) shm_unlink(hello.name); /* every rank has it open */
  if (res != weftSuccess) goto unmap;
  if (all[0]) {
    snprintf(b->why, sizeof b->why, "no round trip: ranks share no memory");
    goto unmap;
  }
  if (all[1] < 0 || hello.cpu < 0) {
    snprintf(b->why, sizeof b->why, "no round trip: ranks 0 and 1 have one CPU between them");
    goto unmap;
  }
  b->cpus[0] = hello.cpu;
  b->cpus[1] = all[1];
  if (rank <= 1) {
    cpu_set_t saved;
    const int pinned = cpu_pin(b->cpus[rank], &saved) == 0;
    if (rank == 0) {
      b->round_trip_us = pinned ? pingpong_lead(page) : NAN;
      if (!pinned) __atomic_store_n(&page->line, PINGPONG_STOP, __ATOMIC_RELEASE);
      b->have_round_trip = !isnan(b->round_trip_us);
      if (!b->have_round_trip)
        snprintf(b->why, sizeof b->why,
                 "no round trip: fewer than %d batches of the ping-pong in %g s (a busy "
                 "machine?)", PINGPONG_MIN_BATCHES, PINGPONG_LIMIT_S);
      __atomic_store_n(&page->done, 1, __ATOMIC_RELEASE);
    } else if (pinned) {
      pingpong_follow(page);
    }
    if (pinned) sched_setaffinity(0, sizeof saved, &saved);
  } else {
    /* off the CPUs of the two that measure, asleep */
    const double deadline = now_s() + PINGPONG_LIMIT_S + 1;
    const struct timespec nap = {.tv_sec = 0, .tv_nsec = 200000};
    while (!__atomic_load_n(&page->done, __ATOMIC_ACQUIRE) && now_s() < deadline)
      nanosleep(&nap, NULL);
  }
unmap:
  if (page != NULL) munmap(page, sizeof *page);
  return res;
}

/* The last-level cache's size in bytes as sysfs gives it (glibc's figure is
 * the host's under some hypervisors), else glibc's, else 0. */
static size_t llc_nbytes(void) {
  size_t best = 0;
  for (int i = 0; i < 8; i++) {
    char path[96], text[32];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *f = fopen(path, "r");
    if (f == NULL) break;
    char *got = fgets(text, sizeof text, f);
    fclose(f);
    char *end;
    unsigned long long v = got != NULL ? strtoull(text, &end, 10) : 0;
    if (v == 0) continue;
    if (*end == 'K') v <<= 10;
    else if (*end == 'M') v <<= 20;
    if (v > best) best = (size_t)v;
  }
  if (best == 0) {
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    best = v > 0 ? (size_t)v : 0;
  }
  return best;
}

/* A copy whose stores bypass the caches (x86's streaming stores): no line
 * of dst is read before it is written, as memcpy's stores do below glibc's
 * non-temporal threshold, so it moves less than memcpy where the copy is
 * larger than the caches. nbytes a multiple of 64, both 64-byte aligned. */
static void copy_streaming(char *dst, const char *src, size_t nbytes) {
#if defined(__x86_64__) || defined(__SSE2__)
  for (size_t i = 0; i < nbytes; i += 64) {
    const __m128i a = _mm_load_si128((const __m128i *)(src + i));
    const __m128i b = _mm_load_si128((const __m128i *)(src + i + 16));
    const __m128i c = _mm_load_si128((const __m128i *)(src + i + 32));
    const __m128i d = _mm_load_si128((const __m128i *)(src + i + 48));
    _mm_stream_si128((__m128i *)(dst + i), a);
    _mm_stream_si128((__m128i *)(dst + i + 16), b);
    _mm_stream_si128((__m128i *)(dst + i + 32), c);
    _mm_stream_si128((__m128i *)(dst + i + 48), d);
  }
  _mm_sfence();
#else
  memcpy(dst, src, nbytes);
#endif
}

/* The read + write rate of a copy that every rank runs at once: each rank
 * copies copy_nbytes, timed from the first rank's start to the last rank's
 * end (one clock for the host; ranks that share a CPU take turns); best of
 * the passes, memcpy's and streaming stores' in turn (a library may move
 * its bytes either way: the bound is the faster). */
static weftResult_t measure_copy(weftComm_t comm, int nranks, struct perf_bound *b) {
  const size_t llc = llc_nbytes();
  size_t nbytes = llc > 0 ? llc : (size_t)32 << 20;
  if (nbytes < COPY_MIN_NBYTES) nbytes = COPY_MIN_NBYTES;
  if (nbytes > COPY_MAX_NBYTES) nbytes = COPY_MAX_NBYTES;
  nbytes &= ~(size_t)4095;
  char *src = aligned_alloc(4096, nbytes), *dst = aligned_alloc(4096, nbytes);
  int failed = src == NULL || dst == NULL, any_failed = 0;
  if (!failed) { /* the pages exist before any pass is timed */
    memset(src, 1, nbytes);
    memset(dst, 0, nbytes);
  }
  weftResult_t res = weftAllReduce(&failed, &any_failed, 1, weftInt32, weftMax, comm, NULL);
  if (res == weftSuccess && any_failed)
    snprintf(b->why, sizeof b->why, "no copy bound: cannot allocate 2 x %zu bytes", nbytes);
  double best = 0;
  for (int pass = 0; pass < 2 * COPY_PASSES && res == weftSuccess && !any_failed; pass++) {
    int token = 0, sink;
    res = weftAllReduce(&token, &sink, 1, weftInt32, weftSum, comm, NULL); /* start together */
    if (res != weftSuccess) break;
    double span[2] = {-now_s()}, all[2]; /* -start, end: both maxima */
    if (pass % 2 == 0) memcpy(dst, src, nbytes);
    else copy_streaming(dst, src, nbytes);
    __asm__ volatile("" : : "r"(dst) : "memory"); /* the copy is not dead */
    span[1] = now_s();
    res = weftAllReduce(span, all, 2, weftFloat64, weftMax, comm, NULL);
    const double rw = 2.0 * (double)nbytes * nranks / (all[1] + all[0]) / 1e9;
    if (rw > best) best = rw;
  }
  free(src);
  free(dst);
  if (res == weftSuccess && !any_failed) {
    b->have_copy = 1;
    b->copy_rw_GBps = best;
    b->copy_nbytes = nbytes;
  }
  return res;
}

weftResult_t perf_bound_measure(weftComm_t comm, struct perf_bound *b) {
  const double t0 = now_s();
  int rank, nranks;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  *b = (struct perf_bound){.cpus = {-1, -1}};
  weftResult_t res = weftSuccess;
  if (nranks > 1) res = measure_round_trip(comm, rank, b);
  else snprintf(b->why, sizeof b->why, "no round trip: one rank");
  if (res == weftSuccess) res = measure_copy(comm, nranks, b);
  b->measure_s = now_s() - t0;
  return res;
}

double perf_bound_us(const struct perf_bound *b, double traffic_nbytes, int *by_copy_out) {
  const double rt = b->have_round_trip ? b->round_trip_us : 0;
  const double copy = b->have_copy ? traffic_nbytes / (b->copy_rw_GBps * 1e3) : 0;
  *by_copy_out = copy > rt;
  if (!b->have_round_trip && !b->have_copy) return NAN;
  return copy > rt ? copy : rt;
}
