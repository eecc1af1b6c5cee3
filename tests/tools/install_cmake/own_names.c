/* A program with functions of its own under names that weft's files use
 * inside the library (clock_ns, env_int, comm_init, zero_alloc ...), linked
 * against the static libraries (tests/tools/test_install.sh): libweft.a and
 * libweft_zero.a define only their API, so the link sees no second
 * definition, and weft keeps calling its own functions. Joins the ranks
 * weftrun started, all-reduces, makes a ZeRO context of one parameter and
 * reads the parameter back. Exits 0 when all of it held. */
#include <stdio.h>
#include <string.h>
#include <weft.h>
#include <weft_zero.h>

/* the program's own: other meanings, other signatures than weft's */
long long clock_ns(void) { return 42; }
int env_int(const char *name, int fallback) { return name ? fallback + 1 : fallback; }
const char *env_str(const char *name) { return name; }
int comm_init(void) { return 7; }
int bootstrap_init(int x) { return x * 2; }
int sock_connect(void) { return -5; }
int topo_load(void) { return 3; }
void *zero_alloc(size_t n) { return n ? NULL : (void *)&zero_alloc; }
unsigned zero_crc32c(unsigned x) { return x + 1; }
int ckpt_latest(void) { return 11; }

int main(void) {
  if (clock_ns() != 42 || env_int("x", 1) != 2 || strcmp(env_str("y"), "y") != 0 ||
      comm_init() != 7 || bootstrap_init(2) != 4 || sock_connect() != -5 || topo_load() != 3 ||
      zero_alloc(0) != (void *)&zero_alloc || zero_crc32c(1) != 2 || ckpt_latest() != 11) {
    fprintf(stderr, "own_names: the program's own functions were not called\n");
    return 1;
  }
  weftComm_t comm;
  weftResult_t r = weftCommInitFromEnv(&comm, NULL);
  if (r != weftSuccess) {
    fprintf(stderr, "own_names: weftCommInitFromEnv: %s\n", weftGetErrorString(r));
    return 1;
  }
  int rank = 0, nranks = 0;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  float data[64];
  for (int i = 0; i < 64; i++) data[i] = (float)(rank + 1) * (float)i;
  r = weftAllReduce(data, data, 64, weftFloat32, weftSum, comm, NULL);
  int wrong = r != weftSuccess;
  const float ranks_sum = (float)nranks * (float)(nranks + 1) / 2;
  for (int i = 0; i < 64 && !wrong; i++) wrong = data[i] != ranks_sum * (float)i;

  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = 2;
  weftZero_t zero;
  float init[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, got[10] = {0};
  int param = -1;
  void *ptr = NULL;
  if (weftZeroCreate(&zero, comm, &cfg) != weftSuccess ||
      weftZeroAddParam(zero, 0, 10, init, &param) != weftSuccess ||
      weftZeroFinalize(zero) != weftSuccess || weftZeroParam(zero, param, &ptr) != weftSuccess ||
      weftZeroToFloat(ptr, cfg.paramType, got, 10) != weftSuccess ||
      memcmp(init, got, sizeof init) != 0 || weftZeroDestroy(zero) != weftSuccess) {
    fprintf(stderr, "own_names: ZeRO: %s\n", weftZeroLastError());
    wrong = 1;
  }
  weftCommDestroy(comm);
  printf("own_names: rank %d of %d: %s\n", rank, nranks, wrong ? "WRONG" : "ok");
  return wrong;
}
