/* What the machine itself allows a 2-rank 8-byte all-reduce, with no library
 * around it: two processes pinned to two CPUs, sharing memory.
 *
 *   pingpong   one cache line that the two take turns at, as the perf tools'
 *              round trip (docs/perf.md, "The bound column"), in longer batches:
 *              it reads higher than theirs, which keep the fastest of 300
 *   exchange   each process has a ring of 8 slots of one cache line each
 *              towards the other; a call stores its 8 bytes and the call's
 *              number in the next slot, spins until the peer's slot of the
 *              same number holds it, and adds the two values into an output
 *              (the lower rank's first): the fewest transfers an all-reduce
 *              of 8 bytes can have, a flag that is the data's own line
 *   exchange+W the same with W ns of other work per call (a library's CPU
 *              time), a calibrated loop before the call's store
 *   post+W     the same work between the store and the spin: what a call
 *              can do while its line is on the way without being slower
 *   warm+W     exchange+W where each process, once the peer's value is in,
 *              asks for its next slot's line for writing (PREFETCHW, as
 *              weft's peer_send_warm): the take of the line back from the
 *              peer's cache overlaps the work instead of delaying the store
 *
 *   exchange_floor [CALLS_PER_BATCH=2000] [BATCHES=41] [WORK_NS=0,20,40,80]
 *
 * Prints, per mode, the fastest and the median batch in ns per call and in
 * round trips (the fastest ping-pong batch of the same run). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_pair.h"

#define NSLOTS 8
#define MAX_BATCHES 1001
#define MAX_WORKS 16

struct slot {
  _Alignas(64) volatile uint64_t seq;
  volatile double value;
};

struct shared {
  _Alignas(64) volatile uint64_t line;     /* the ping-pong's */
  struct slot out[2][NSLOTS];              /* out[r]: rank r's slots to the other */
  double batch_ns[MAX_BATCHES];            /* rank 0's figures of one mode */
};

static double now_ns(void) { return bench_now_s() * 1e9; }

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
}

/* Busy work without the clock (a clock read costs tens of ns in a VM):
 * iterations of a dependent chain, calibrated once. */
static double iters_per_ns;

static uint64_t work_chain(uint64_t iters) {
  uint64_t x = iters;
  for (uint64_t i = 0; i < iters; i++) __asm__ volatile("" : "+r"(x));
  return x;
}

static void calibrate(void) {
  const uint64_t n = 200000000;
  const double t0 = now_ns();
  work_chain(n);
  iters_per_ns = (double)n / (now_ns() - t0);
}

static void spin_work(double ns) {
  if (ns > 0) work_chain((uint64_t)(ns * iters_per_ns));
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void pingpong(struct shared *s, int rank, int calls, int batches) {
  uint64_t v = 0;
  for (int b = 0; b < batches; b++) {
    const double t0 = now_ns();
    for (int i = 0; i < calls; i++) {
      if (rank == 0) {
        s->line = v + 1;
        while (s->line != v + 2) {
        }
      } else {
        while (s->line != v + 1) {
        }
        s->line = v + 2;
      }
      v += 2;
    }
    if (rank == 0) s->batch_ns[b] = (now_ns() - t0) / calls;
  }
}

/* Asks for the line at p for writing, without waiting for it. */
static void prefetch_write(const volatile void *p) {
#if defined(__x86_64__)
  __asm__ volatile("prefetchw %0" ::"m"(*(const volatile char *)p));
#else
  __builtin_prefetch((const void *)p, 1, 3);
#endif
}

enum mode { MODE_EXCHANGE, MODE_POST, MODE_WARM };

static void exchange(struct shared *s, int rank, int calls, int batches, double work_ns,
                     enum mode mode, uint64_t *seq) {
  double in = 1.0 + rank, out = 0;
  for (int b = 0; b < batches; b++) {
    const double t0 = now_ns();
    for (int i = 0; i < calls; i++) {
      if (mode != MODE_POST) spin_work(work_ns);
      const uint64_t n = ++*seq;
      struct slot *mine = &s->out[rank][n % NSLOTS];
      const struct slot *theirs = &s->out[!rank][n % NSLOTS];
      mine->value = in;
      __atomic_store_n(&mine->seq, n, __ATOMIC_RELEASE);
      if (mode == MODE_POST) spin_work(work_ns);
      while (__atomic_load_n(&theirs->seq, __ATOMIC_ACQUIRE) != n) {
      }
      if (mode == MODE_WARM) prefetch_write(&s->out[rank][(n + 1) % NSLOTS]);
      out = rank == 0 ? in + theirs->value : theirs->value + in;
      in = out - in; /* keeps the values small and the add live */
    }
    if (rank == 0) s->batch_ns[b] = (now_ns() - t0) / calls;
  }
  if (out < 0) printf("%g\n", out);
}

/* Prints mode's fastest and median batch (the first is a warm-up), in round
 * trips too when rt_ns > 0; returns the fastest. */
static double report(struct shared *s, const char *mode, int batches, double rt_ns) {
  double sorted[MAX_BATCHES];
  memcpy(sorted, s->batch_ns + 1, sizeof(double) * (size_t)(batches - 1));
  qsort(sorted, (size_t)(batches - 1), sizeof(double), cmp_double);
  const double best = sorted[0], median = sorted[(batches - 1) / 2];
  if (rt_ns > 0)
    printf("%-16s %8.1f ns %8.1f ns   %5.2f %5.2f round trips\n", mode, best, median,
           best / rt_ns, median / rt_ns);
  else
    printf("%-16s %8.1f ns %8.1f ns\n", mode, best, median);
  return best;
}

struct run {
  struct shared *s;
  int calls, batches, nworks;
  double works[MAX_WORKS];
};

/* One process's side: rank 0 times and prints, both take every step
 * together (bench_barrier between modes). */
static void side(int rank, int fd, void *arg) {
  const struct run *r = arg;
  struct shared *s = r->s;
  pin(rank);
  calibrate();
  uint64_t seq = 0;
  bench_barrier(fd);
  pingpong(s, rank, r->calls, r->batches);
  double rt_ns = 0;
  if (rank == 0) {
    printf("# 2 processes on CPUs 0 and 1; %d batches of %d calls; fastest and median batch\n",
           r->batches, r->calls);
    rt_ns = report(s, "pingpong", r->batches, 0);
  }
  static const char *const names[] = {"exchange", "post", "warm"};
  for (int m = MODE_EXCHANGE; m <= MODE_WARM; m++)
    for (int w = 0; w < r->nworks; w++) {
      if (m == MODE_POST && r->works[w] <= 0) continue;
      bench_barrier(fd);
      exchange(s, rank, r->calls, r->batches, r->works[w], (enum mode)m, &seq);
      if (rank == 0) {
        char mode[32];
        if (r->works[w] > 0) snprintf(mode, sizeof mode, "%s+%g", names[m], r->works[w]);
        else snprintf(mode, sizeof mode, "%s", names[m]);
        report(s, mode, r->batches, rt_ns);
      }
    }
}

int main(int argc, char **argv) {
  struct run r = {.calls = argc > 1 ? atoi(argv[1]) : 2000,
                  .batches = argc > 2 ? atoi(argv[2]) : 41,
                  .works = {0, 20, 40, 80},
                  .nworks = 4};
  if (argc > 3) {
    r.nworks = 0;
    for (char *t = strtok(argv[3], ","); t != NULL && r.nworks < MAX_WORKS; t = strtok(NULL, ","))
      r.works[r.nworks++] = atof(t);
  }
  if (r.calls < 1 || r.batches < 2 || r.batches > MAX_BATCHES) {
    fprintf(stderr, "usage: exchange_floor [CALLS_PER_BATCH>=1] [BATCHES 2..%d] [WORK_NS,...]\n",
            MAX_BATCHES);
    return 2;
  }
  r.s = mmap(NULL, sizeof *r.s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (r.s == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(r.s, 0, sizeof *r.s);
  return bench_run_pair(side, &r);
}
