/* OpenBLAS opened at run time (see train_blas.h). */
#include "train_blas.h"

#ifdef TRAIN_OPENBLAS
#include <dlfcn.h>
#include <stdlib.h>

__typeof__(cblas_sgemm) *train_cblas_sgemm;
static char *(*blas_corename)(void);

/* OpenBLAS 0.3.21 runs Haswell's AVX2 kernels on AMD CPUs it does not know;
 * later releases run the SkylakeX ones on those with AVX-512 (Zen 4 on). */
static void blas_pick_core(void) {
  if (getenv("OPENBLAS_CORETYPE") != NULL) return; /* the user's choice */
  __builtin_cpu_init();
  if (__builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 0);
}

int train_blas_open(void) {
  if (train_cblas_sgemm != NULL) return 0;
  blas_pick_core();
  static const char *const names[] = {"libopenblas.so.0", "libopenblas.so"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof names[0] && lib == NULL; i++)
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "weft-train: cannot open OpenBLAS (libopenblas.so.0): %s\n", dlerror());
    return -1;
  }
  void (*set_threads)(int) = (void (*)(int))dlsym(lib, "openblas_set_num_threads");
  blas_corename = (char *(*)(void))dlsym(lib, "openblas_get_corename");
  train_cblas_sgemm = (__typeof__(cblas_sgemm) *)dlsym(lib, "cblas_sgemm");
  if (set_threads == NULL || train_cblas_sgemm == NULL) {
    fprintf(stderr, "weft-train: OpenBLAS lacks cblas_sgemm or openblas_set_num_threads\n");
    train_cblas_sgemm = NULL;
    return -1;
  }
  set_threads(1);
  return 0;
}

const char *train_blas_core(void) {
  const char *name = blas_corename != NULL ? blas_corename() : NULL;
  return name != NULL ? name : "OpenBLAS";
}
#else
int train_blas_open(void) { return 0; }

const char *train_blas_core(void) { return "loop"; }
#endif
