/* What the NCCL-API test programs share: each is one rank of a weftrun job,
 * counts its failed checks in g_failures and ends at the first failed call. */
#ifndef WEFT_TESTS_NCCL_CHECK_H
#define WEFT_TESTS_NCCL_CHECK_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
