/* The perf tools' driver with a fault in weftReduce, for test_perf.sh: linked
 * with -Wl,--wrap=weftReduce, run under the name reduce_perf (a link to it).
 * WEFT_PERF_FAULT picks the fault, on the root or rank 1:
 *   wrong   the root's first output element off by 1000 after every call
 *           (the footer counts one rank's sides, not every rank's)
 *   replay  a check round on the root gets the first round's output of its
 *           count again (caught only when each round's inputs differ)
 *   stall   rank 1 sleeps 1 s after its first call on a buffer moved off its
 *           alignment (-u 1: the first side's warm-up), before the timed loop
 * Tests only: never installed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weft.h"

weftResult_t __real_weftReduce(const void *sendbuff, void *recvbuff, size_t count,
                               weftDataType_t datatype, weftRedOp_t op, int root,
                               weftComm_t comm, weftStream_t stream);

static int fault_is(const char *name) {
  const char *f = getenv("WEFT_PERF_FAULT");
  return f != NULL && strcmp(f, name) == 0;
}

/* the tools poison an output (0xa5 bytes) before each check round's call */
static int poisoned(const void *buf, size_t nbytes) {
  const unsigned char *b = buf;
  for (size_t i = 0; i < nbytes && i < 4; i++)
    if (b[i] != 0xa5) return 0;
  return nbytes > 0;
}

/* replay: the first check round's output on the root, and its size */
static void *first_out;
static size_t first_nbytes;

weftResult_t __wrap_weftReduce(const void *sendbuff, void *recvbuff, size_t count,
                               weftDataType_t datatype, weftRedOp_t op, int root,
                               weftComm_t comm, weftStream_t stream) {
  static int stalled;
  int rank = -1;
  weftCommUserRank(comm, &rank);
  const size_t nbytes = count * weftTypeSize(datatype);
  const int check_round = rank == root && poisoned(recvbuff, nbytes);
  const weftResult_t res =
      __real_weftReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  if (res != weftSuccess) return res;
  if (fault_is("wrong") && rank == root && datatype == weftFloat32 && count > 1)
    ((float *)recvbuff)[0] += 1000.0f;
  if (fault_is("replay") && check_round) {
    if (first_out != NULL && first_nbytes == nbytes) {
      memcpy(recvbuff, first_out, nbytes);
    } else {
      free(first_out);
      first_out = malloc(nbytes);
      if (first_out != NULL) memcpy(first_out, recvbuff, nbytes);
      first_nbytes = nbytes;
    }
  }
  if (fault_is("stall") && rank == 1 && !stalled && (uintptr_t)sendbuff % 64 != 0) {
    stalled = 1;
    sleep(1);
  }
  return res;
}
