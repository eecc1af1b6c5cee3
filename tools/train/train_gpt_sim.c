/* The device path's kernels run on the host (--device sim): every body of
 * train_gpt_kern.h in a loop over its indices, the products by gk_gemm, the
 * conversions by weft's own. Memory is host memory; nothing is queued, so
 * every launcher is complete on return. */
#include <stdlib.h>
#include <string.h>

#include "train_gpt_kern.h"
#include "weft_zero.h"


static int sim_gemm_batched(void *stream, int ta, int tb, int m, int n, int kk, float alpha,
                            const float *a, int lda, long sa, const float *b, int ldb, long sb,
                            float beta, float *c, int ldc, long sc, int batch) {
  (void)stream;
  for (size_t k = 0; k < (size_t)batch * m * n; k++)
    gk_gemm(k, ta, tb, m, n, kk, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc);
  return 0;
}

static int sim_to_float(void *stream, const void *src, weftDataType_t dtype, float *dst,
                        size_t count) {
  (void)stream;
  return weftZeroToFloat(src, dtype, dst, count) == weftSuccess ? 0 : 1;
}

static int sim_accumulate(void *stream, void *dst, weftDataType_t dtype, const float *src,
                          size_t count) {
  (void)stream;
  return weftZeroAccumulate(dst, dtype, src, count) == weftSuccess ? 0 : 1;
}

static int sim_copy(void *stream, void *dst, const void *src, size_t bytes) {
  (void)stream;
  memcpy(dst, src, bytes);
  return 0;
}

static int sim_alloc(void **out, size_t bytes) {
  *out = malloc(bytes > 0 ? bytes : 1);
  return *out == NULL;
}

static const char *sim_error_string(int err) {
  return err == 0 ? "no error" : "a conversion was refused or memory ran out";
}

#define SIM_LAUNCHER(name, params, args)                                        \
  static int sim_##name(void *stream, size_t total, GK_UNPAREN params) {       \
    (void)stream;                                                               \
    for (size_t k = 0; k < total; k++) gk_##name(k, GK_UNPAREN args);         \
    return 0;                                                                   \
  }
GK_KERNELS(SIM_LAUNCHER)
#undef SIM_LAUNCHER

static const struct gk_table sim_table = {
    .name = "sim",
#define SIM_ENTRY(name, params, args) .name = sim_##name,
    GK_KERNELS(SIM_ENTRY)
#undef SIM_ENTRY
    .gemm_batched = sim_gemm_batched,
    .to_float = sim_to_float,
    .accumulate = sim_accumulate,
    .copy = sim_copy,
    .alloc = sim_alloc,
    .free = free,
    .error_string = sim_error_string,
    .gemm_name = "host loop",
};

const struct gk_table *gk_sim_table(void) { return &sim_table; }
