/* A program built only with `pkg-config --cflags --libs weft` against an
 * installed weft (tests/tools/test_install.sh): joins the ranks weftrun
 * started, all-reduces, checks the sums. Exits 0 when every element matched. */
#include <stdio.h>
#include <weft.h>

int main(void) {
  weftComm_t comm;
  weftResult_t r = weftCommInitFromEnv(&comm, NULL);
  if (r != weftSuccess) {
    fprintf(stderr, "install_weft: weftCommInitFromEnv: %s\n", weftGetErrorString(r));
    return 1;
  }
  int rank = 0, nranks = 0;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  enum { count = 1000 };
  static float data[count];
  for (int i = 0; i < count; i++) data[i] = (float)(rank + 1) * (float)i;
  r = weftAllReduce(data, data, count, weftFloat32, weftSum, comm, NULL);
  int wrong = r != weftSuccess;
  const float ranks_sum = (float)nranks * (float)(nranks + 1) / 2;
  for (int i = 0; i < count && !wrong; i++) wrong = data[i] != ranks_sum * (float)i;
  weftCommDestroy(comm);
  printf("install_weft: rank %d of %d: %s\n", rank, nranks, wrong ? "WRONG" : "ok");
  return wrong;
}
