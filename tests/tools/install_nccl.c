/* A program written against nccl.h alone, linked with -lnccl (the wheel's
 * libnccl.so.2, tests/tools/test_wheel.sh): under weftrun, the ranks take
 * their id from WEFT_UNIQUE_ID (the id's bytes in hex), all-reduce, and check
 * the sums. Exits 0 when every element matched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

static int hex_digit(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

int main(void) {
  const char *rank_s = getenv("WEFT_RANK"), *size_s = getenv("WEFT_NRANKS");
  const char *hex = getenv("WEFT_UNIQUE_ID");
  if (!rank_s || !size_s || !hex || strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES) {
    fprintf(stderr, "install_nccl: run under weftrun\n");
    return 2;
  }
  int rank = atoi(rank_s), nranks = atoi(size_s);
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
    id.internal[i] = (char)(hex_digit(hex[2 * i]) << 4 | hex_digit(hex[2 * i + 1]));
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  if (r != ncclSuccess) {
    fprintf(stderr, "install_nccl: ncclCommInitRank: %s\n", ncclGetErrorString(r));
    return 1;
  }
  enum { count = 1000 };
  static double data[count];
  for (int i = 0; i < count; i++) data[i] = (double)(rank + 1) * i;
  r = ncclAllReduce(data, data, count, ncclFloat64, ncclSum, comm, NULL);
  int wrong = r != ncclSuccess;
  const double ranks_sum = (double)nranks * (nranks + 1) / 2;
  for (int i = 0; i < count && !wrong; i++) wrong = data[i] != ranks_sum * i;
  ncclCommDestroy(comm);
  printf("install_nccl: rank %d of %d: %s\n", rank, nranks, wrong ? "WRONG" : "ok");
  return wrong;
}
