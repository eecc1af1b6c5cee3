/* What the NCCL-API test programs share: each is one rank of a weftrun job,
 * counts its failed checks in g_failures and ends at the first failed call. */
#ifndef WEFT_TESTS_NCCL_CHECK_H
#define WEFT_TESTS_NCCL_CHECK_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

/* defined by each program */
extern int g_rank, g_nranks, g_failures;

#define FAIL(...)                                                              \
  do {                                                                         \
    if (g_failures++ < 20) {                                                   \
      fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__);         \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
    }                                                                          \
  } while (0)

#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) FAIL(__VA_ARGS__);                                            \
  } while (0)

/* A failed call ends the run: what follows would only report its effects. */
#define NCCL_OK(call)                                                          \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) {                                                   \
      fprintf(stderr, "rank %d: %s:%d: %s: %s (%s)\n", g_rank, __FILE__,       \
              __LINE__, #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static inline double nccl_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A small seeded generator: the same values on every rank for one seed. */
static inline uint64_t nccl_rng_next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 17;
}

/* SIGALRM's handler for a program that arms alarm() around a part that
 * must not hang: ends it with status 3, saying so. */
static inline void nccl_watchdog_fired(int sig) {
  (void)sig;
  static const char msg[] = "NCCL-API test: hung (watchdog)\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(3);
}

static inline int nccl_hex_digit(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The job as weftrun gives it: g_rank and g_nranks from WEFT_RANK and
 * WEFT_NRANKS, *id from WEFT_UNIQUE_ID (the id's bytes in hex). Ends the
 * program (status 2) outside weftrun. */
static inline void nccl_test_job(ncclUniqueId *id) {
  const char *rank_s = getenv("WEFT_RANK"), *size_s = getenv("WEFT_NRANKS");
  const char *hex = getenv("WEFT_UNIQUE_ID");
  if (rank_s == NULL || size_s == NULL || hex == NULL || strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES) {
    fprintf(stderr, "run under weftrun: WEFT_RANK, WEFT_NRANKS and WEFT_UNIQUE_ID are needed\n");
    exit(2);
  }
  g_rank = atoi(rank_s);
  g_nranks = atoi(size_s);
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    id->internal[i] = (char)(nccl_hex_digit(hex[2 * i]) << 4 | nccl_hex_digit(hex[2 * i + 1]));
}

#endif
