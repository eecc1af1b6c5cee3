/* Matrix products of weft-train's transformer: row-major C = alpha op(A)
 * op(B) + beta C through OpenBLAS's cblas_sgemm (TRAIN_OPENBLAS), else a
 * plain loop of the same meaning, so the trainer builds without it. */
#ifndef WEFT_TRAIN_BLAS_H
#define WEFT_TRAIN_BLAS_H

#include <stdlib.h>
#include <string.h>

#ifdef TRAIN_OPENBLAS
#include <cblas.h>
#endif

/* ta, tb: 0 as stored, 1 transposed. op(A) is m x k, op(B) k x n, C m x n. */
static inline void train_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                               int lda, const float *b, int ldb, float beta, float *c, int ldc) {
#ifdef TRAIN_OPENBLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
              n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  for (int i = 0; i < m; i++) {
    float *ci = c + (long)i * ldc;
    for (int j = 0; j < n; j++) ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
    for (int p = 0; p < k; p++) {
      float av = alpha * (ta ? a[(long)p * lda + i] : a[(long)i * lda + p]);
      if (tb)
        for (int j = 0; j < n; j++) ci[j] += av * b[(long)j * ldb + p];
      else
        for (int j = 0; j < n; j++) ci[j] += av * b[(long)p * ldb + j];
    }
  }
#endif
}

/* One thread per rank: ranks share the machine's cores. */
static inline void train_blas_threads_one(void) {
#ifdef TRAIN_OPENBLAS
  openblas_set_num_threads(1);
#endif
}

/* The kernels OpenBLAS chose when it loaded ("Haswell", "SkylakeX",
 * "Cooperlake", ...: OPENBLAS_CORETYPE's if set, else the CPU's); "loop"
 * without OpenBLAS. On AMD's Zen 5 its AVX-512 kernels run sgemm at about
 * twice the rate of its AVX2 (Haswell) ones, so a pinned OPENBLAS_CORETYPE
 * is worth a look when figures seem low. */
static inline const char *train_blas_core(void) {
#ifdef TRAIN_OPENBLAS
  const char *name = openblas_get_corename();
  return name != NULL ? name : "OpenBLAS";
#else
  return "loop";
#endif
}

/* A line for the log when OPENBLAS_CORETYPE holds OpenBLAS to AVX2 or older
 * kernels on a CPU with AVX-512 (about half its sgemm rate there), else NULL. */
static inline const char *train_blas_pinned_note(void) {
#if defined(TRAIN_OPENBLAS) && defined(__x86_64__) && defined(__GNUC__)
  static const char *const narrow[] = {"Haswell", "Zen", "Sandybridge", "Nehalem", "Prescott",
                                       "Core2", "Penryn", "Dunnington", "Atom"};
  const char *core = train_blas_core();
  if (getenv("OPENBLAS_CORETYPE") == NULL || !__builtin_cpu_supports("avx512f")) return NULL;
  for (size_t i = 0; i < sizeof narrow / sizeof narrow[0]; i++)
    if (strcmp(core, narrow[i]) == 0)
      return "OPENBLAS_CORETYPE holds OpenBLAS to kernels without AVX-512, which this CPU has: "
             "unset it for OpenBLAS's own choice (up to twice the sgemm rate)";
#endif
  return NULL;
}

#endif
