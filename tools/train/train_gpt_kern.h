/* The transformer's kernels for --device cuda, one body per output element
 * (or row, or column), written once in the C that both nvcc and the host
 * compiler take: train_gpt_kernels.cu launches each body as one thread per
 * index on a CUDA stream, train_gpt_sim.c runs the same bodies in a loop on
 * the host (--device sim), so that CI checks every index and every call of
 * the device path against the host's operations without a GPU.
 *
 * Matrices are row-major; weights as PyTorch's nn.Linear (out x in). No body
 * writes where another index of the same launch reads or writes, so any
 * order of indices gives the same result: sums over shared outputs run
 * inside one index, in the host loop's order. */
#ifndef WEFT_TRAIN_GPT_KERN_H
#define WEFT_TRAIN_GPT_KERN_H

#include <math.h>
#include <stddef.h>

#include "weft.h"

#ifdef __CUDACC__
#define GK_FN static __host__ __device__ inline
#else
#define GK_FN static inline
#endif

#define GK_GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

/* out[r, i] = wte[tok[r], i] + wpe[r % T, i]; index r * C + i */
GK_FN void gk_encoder_fwd(size_t k, float *out, const int *tok, const float *wte,
                          const float *wpe, int T, int C) {
  size_t r = k / (size_t)C, i = k % (size_t)C;
  out[k] = wte[(size_t)tok[r] * C + i] + wpe[(r % (size_t)T) * C + i];
}

/* dwte[v, i] += dout[r, i] over the rows r holding token v, in row order:
 * pos[off[v] .. off[v + 1]) lists them; index v * C + i */
GK_FN void gk_encoder_bwd_wte(size_t k, float *dwte, const float *dout, const int *off,
                              const int *pos, int C) {
  size_t v = k / (size_t)C, i = k % (size_t)C;
  float acc = dwte[k];
  for (int p = off[v]; p < off[v + 1]; p++) acc += dout[(size_t)pos[p] * C + i];
  dwte[k] = acc;
}

/* dwpe[t, i] += dout[b * T + t, i] over b; index t * C + i */
GK_FN void gk_encoder_bwd_wpe(size_t k, float *dwpe, const float *dout, int B, int T, int C) {
  float acc = dwpe[k];
  for (int b = 0; b < B; b++) acc += dout[(size_t)b * T * C + k];
  dwpe[k] = acc;
}

/* Row r: out = (x - mean) rstd w + b, mean and rstd kept; index r */
GK_FN void gk_layernorm_fwd(size_t r, float *out, float *mean, float *rstd, const float *x,
                            const float *w, const float *b, int C) {
  const float *xr = x + r * C;
  float *o = out + r * C;
  float m = 0, v = 0;
  for (int i = 0; i < C; i++) m += xr[i];
  m /= (float)C;
  for (int i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
  float s = 1.0f / sqrtf(v / (float)C + 1e-5f);
  for (int i = 0; i < C; i++) o[i] = (xr[i] - m) * s * w[i] + b[i];
  mean[r] = m;
  rstd[r] = s;
}

/* Row r of the input's gradient, added to dx; index r */
GK_FN void gk_layernorm_bwd_dx(size_t r, float *dx, const float *dout, const float *x,
                               const float *w, const float *mean, const float *rstd, int C) {
  const float *d = dout + r * C, *xr = x + r * C;
  float *dxr = dx + r * C;
  float m = mean[r], s = rstd[r], dm = 0, dn = 0;
  for (int i = 0; i < C; i++) {
    float norm = (xr[i] - m) * s, dnorm = w[i] * d[i];
    dm += dnorm;
    dn += dnorm * norm;
  }
  dm /= (float)C;
  dn /= (float)C;
  for (int i = 0; i < C; i++) {
    float norm = (xr[i] - m) * s;
    dxr[i] += (w[i] * d[i] - dm - norm * dn) * s;
  }
}

/* Column i of the weight and bias gradients over the n rows, added; index i */
GK_FN void gk_layernorm_bwd_dw(size_t i, float *dw, float *db, const float *dout, const float *x,
                               const float *mean, const float *rstd, int n, int C) {
  float aw = dw[i], ab = db[i];
  for (int r = 0; r < n; r++) {
    float d = dout[(size_t)r * C + i];
    aw += (x[(size_t)r * C + i] - mean[r]) * rstd[r] * d;
    ab += d;
  }
  dw[i] = aw;
  db[i] = ab;
}

/* out[r, j] += bias[j]; index r * oc + j */
GK_FN void gk_bias_add(size_t k, float *out, const float *bias, int oc) {
  out[k] += bias[k % (size_t)oc];
}

/* dbias[j] += the column sum of dout (n x oc); index j */
GK_FN void gk_bias_bwd(size_t j, float *dbias, const float *dout, int n, int oc) {
  float acc = dbias[j];
  for (int r = 0; r < n; r++) acc += dout[(size_t)r * oc + j];
  dbias[j] = acc;
}

/* Row q (of rows T x T matrices) of causal attention scores into their
 * softmax: row i = q % T sees columns 0..i, the rest zero; index q */
GK_FN void gk_softmax_causal(size_t q, float *att, int T) {
  float *row = att + q * T;
  int i = (int)(q % (size_t)T);
  float mx = row[0], sum = 0;
  for (int j = 1; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
  for (int j = 0; j <= i; j++) {
    row[j] = expf(row[j] - mx);
    sum += row[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j <= i; j++) row[j] *= inv;
  for (int j = i + 1; j < T; j++) row[j] = 0.0f;
}

/* Row q of the scores' gradient through the softmax: d = a (d - sum(a d)),
 * zero above the diagonal; index q */
GK_FN void gk_softmax_causal_bwd(size_t q, float *d, const float *att, int T) {
  float *dr = d + q * T;
  const float *ar = att + q * T;
  int i = (int)(q % (size_t)T);
  float dot = 0;
  for (int j = 0; j <= i; j++) dot += ar[j] * dr[j];
  for (int j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - dot);
  for (int j = i + 1; j < T; j++) dr[j] = 0.0f;
}

/* GELU, tanh approximation: 0.5 x (1 + tanh(u)) = x sigmoid(2u) */
GK_FN void gk_gelu_fwd(size_t k, float *out, const float *x) {
  float xi = x[k], u = GK_GELU_S * (xi + 0.044715f * xi * xi * xi);
  float e = expf(-2.0f * fabsf(u));
  out[k] = xi * (u >= 0.0f ? 1.0f : e) / (1.0f + e);
}

/* d *= gelu'(x) */
GK_FN void gk_gelu_bwd(size_t k, float *d, const float *x) {
  float xi = x[k], u = GK_GELU_S * (xi + 0.044715f * xi * xi * xi);
  float e = expf(-2.0f * fabsf(u));
  float s = (u >= 0.0f ? 1.0f : e) / (1.0f + e);
  float du = GK_GELU_S * (1.0f + 3.0f * 0.044715f * xi * xi);
  d[k] *= s + 2.0f * xi * s * (1.0f - s) * du;
}

/* Row r of the logits into probabilities, its loss -log p[target] into
 * loss[r]; index r */
GK_FN void gk_xent_fwd(size_t r, float *logits, double *loss, const int *tgt, int V) {
  float *row = logits + r * V;
  float tl = row[tgt[r]], mx = row[0], sum = 0;
  for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
  for (int j = 0; j < V; j++) {
    row[j] = expf(row[j] - mx);
    sum += row[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j < V; j++) row[j] *= inv;
  loss[r] = (double)mx + log((double)sum) - (double)tl;
}

/* probs -> (probs - onehot(target)) scale; index r * V + j */
GK_FN void gk_xent_bwd(size_t k, float *probs, const int *tgt, int V, float scale) {
  size_t r = k / (size_t)V;
  float p = probs[k];
  if ((int)(k % (size_t)V) == tgt[r]) p -= 1.0f;
  probs[k] = p * scale;
}

/* out = a + b */
GK_FN void gk_add(size_t k, float *out, const float *a, const float *b) { out[k] = a[k] + b[k]; }

GK_FN void gk_zero(size_t k, float *p) { p[k] = 0.0f; }

/* One element of a strided batch of row-major products: C = alpha op(A) op(B)
 * + beta C (beta 0: C is not read), op(A) m x kk, op(B) kk x n; ta, tb: 1
 * transposed. Index (batch * m + i) * n + j. */
GK_FN void gk_gemm(size_t idx, int ta, int tb, int m, int n, int kk, float alpha, const float *a,
                   int lda, long sa, const float *b, int ldb, long sb, float beta, float *c,
                   int ldc, long sc) {
  size_t mn = (size_t)m * n, z = idx / mn, e = idx % mn, i = e / (size_t)n, j = e % (size_t)n;
  const float *az = a + z * sa, *bz = b + z * sb;
  float acc = 0;
  for (int p = 0; p < kk; p++) {
    float av = ta ? az[(size_t)p * lda + i] : az[i * lda + p];
    float bv = tb ? bz[j * ldb + p] : bz[(size_t)p * ldb + j];
    acc += av * bv;
  }
  float *cz = c + z * sc + i * ldc + j;
  *cz = beta == 0.0f ? alpha * acc : alpha * acc + beta * *cz;
}

/* Every kernel of the table below: name, parameters, arguments. */
#define GK_UNPAREN(...) __VA_ARGS__
#define GK_KERNELS(X)                                                                         \
  X(encoder_fwd, (float *out, const int *tok, const float *wte, const float *wpe, int T, int C), \
    (out, tok, wte, wpe, T, C))                                                               \
  X(encoder_bwd_wte, (float *dwte, const float *dout, const int *off, const int *pos, int C),  \
    (dwte, dout, off, pos, C))                                                                \
  X(encoder_bwd_wpe, (float *dwpe, const float *dout, int B, int T, int C),                    \
    (dwpe, dout, B, T, C))                                                                    \
  X(layernorm_fwd,                                                                            \
    (float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,    \
     int C),                                                                                  \
    (out, mean, rstd, x, w, b, C))                                                            \
  X(layernorm_bwd_dx,                                                                         \
    (float *dx, const float *dout, const float *x, const float *w, const float *mean,         \
     const float *rstd, int C),                                                               \
    (dx, dout, x, w, mean, rstd, C))                                                          \
  X(layernorm_bwd_dw,                                                                         \
    (float *dw, float *db, const float *dout, const float *x, const float *mean,              \
     const float *rstd, int n, int C),                                                        \
    (dw, db, dout, x, mean, rstd, n, C))                                                      \
  X(bias_add, (float *out, const float *bias, int oc), (out, bias, oc))                       \
  X(bias_bwd, (float *dbias, const float *dout, int n, int oc), (dbias, dout, n, oc))         \
  X(softmax_causal, (float *att, int T), (att, T))                                            \
  X(softmax_causal_bwd, (float *d, const float *att, int T), (d, att, T))                     \
  X(gelu_fwd, (float *out, const float *x), (out, x))                                         \
  X(gelu_bwd, (float *d, const float *x), (d, x))                                             \
  X(xent_fwd, (float *logits, double *loss, const int *tgt, int V), (logits, loss, tgt, V))   \
  X(xent_bwd, (float *probs, const int *tgt, int V, float scale), (probs, tgt, V, scale))     \
  X(add, (float *out, const float *a, const float *b), (out, a, b))                           \
  X(zero, (float *p), (p))                                                                    \
  X(gemm,                                                                                     \
    (int ta, int tb, int m, int n, int kk, float alpha, const float *a, int lda, long sa,     \
     const float *b, int ldb, long sb, float beta, float *c, int ldc, long sc),               \
    (ta, tb, m, n, kk, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc))

#ifdef __cplusplus
extern "C" {
#endif

/* What runs the kernels: each launcher runs its body for every index below
 * total, queued on stream, and returns 0 or the runtime's error (a
 * cudaError_t); gemm may be a library's with gk_gemm's meaning over
 * `batch` products. Memory is the executor's (device or host). */
struct gk_table {
  const char *name;
#define GK_MEMBER(name, params, args) int (*name)(void *stream, size_t total, GK_UNPAREN params);
  GK_KERNELS(GK_MEMBER)
#undef GK_MEMBER
  int (*gemm_batched)(void *stream, int ta, int tb, int m, int n, int kk, float alpha,
                      const float *a, int lda, long sa, const float *b, int ldb, long sb,
                      float beta, float *c, int ldc, long sc, int batch);
  /* parameters and gradients of dtype (fp32, bf16, fp16) as fp32, and back */
  int (*to_float)(void *stream, const void *src, weftDataType_t dtype, float *dst, size_t count);
  int (*accumulate)(void *stream, void *dst, weftDataType_t dtype, const float *src,
                    size_t count);
  /* between host and the executor's memory, complete on return */
  int (*copy)(void *stream, void *dst, const void *src, size_t bytes);
  int (*alloc)(void **out, size_t bytes);
  void (*free)(void *p);
  const char *(*error_string)(int err);
  const char *gemm_name; /* "cuBLAS", "weft's kernel", "host loop" */
};

/* The CUDA executor (NULL in a build without CUDA) and the host one. */
const struct gk_table *gk_cuda_table(void);
const struct gk_table *gk_sim_table(void);

#ifdef __cplusplus
}
#endif
#endif
