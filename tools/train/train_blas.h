/* Matrix products of weft-train's transformer: row-major C = alpha op(A)
 * op(B) + beta C through OpenBLAS's cblas_sgemm (TRAIN_OPENBLAS), else a
 * plain loop of the same meaning, so the trainer builds without it.
 *
 * OpenBLAS is opened at run time (train_blas_open), not linked: it picks its
 * kernels for the CPU when it loads, from OPENBLAS_CORETYPE if set, and
 * 0.3.21 (Debian 12's) does not know AMD's Zen 4 and Zen 5, whose AVX-512 it
 * leaves unused (its Haswell kernels: half the rate of its SkylakeX ones on
 * Zen 5). Opened later, the trainer names the core type first. */
#ifndef WEFT_TRAIN_BLAS_H
#define WEFT_TRAIN_BLAS_H

#include <stdio.h>

#ifdef TRAIN_OPENBLAS
#include <cblas.h>
extern __typeof__(cblas_sgemm) *train_cblas_sgemm;
#endif

/* Opens OpenBLAS, one thread per rank (ranks share the machine's cores);
 * with an AMD CPU of AVX-512 and no OPENBLAS_CORETYPE, sets that to SkylakeX
 * first. 0, or -1 with a message on stderr. Without TRAIN_OPENBLAS: 0. */
int train_blas_open(void);
/* The kernels in use ("Haswell", "SkylakeX", ...; "loop" without OpenBLAS) */
const char *train_blas_core(void);

/* ta, tb: 0 as stored, 1 transposed. op(A) is m x k, op(B) k x n, C m x n. */
static inline void train_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                               int lda, const float *b, int ldb, float beta, float *c, int ldc) {
#ifdef TRAIN_OPENBLAS
  train_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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

#endif
