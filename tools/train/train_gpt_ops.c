/* The transformer's operations on the host (see train_gpt_ops.h). */
#include "train_gpt_ops.h"

/* Floating-point exceptions are not looked at: without trapping math, GCC
 * if-converts the clamps of ops_expf and vectorises the loops that call it. */
#pragma GCC optimize("no-trapping-math")

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "train_blas.h"

/* The loops below are built for SSE2, AVX2 and AVX-512 and the CPU's best
 * runs, picked at load time (not under ThreadSanitizer, whose runtime is not
 * up when the picking runs). Without contraction (-ffp-contract=off) every
 * version rounds alike: the same losses on every CPU. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define OPS_CLONES __attribute__((target_clones("avx2", "avx512f", "default")))
#else
#define OPS_CLONES
#endif

/* Reductions in OPS_LANES independent partial sums, so that they vectorise
 * without reassociation flags; the order differs from a serial loop only in
 * rounding. */
#define OPS_LANES 8

static inline float ops_lanes_sum(const float *lanes) {
  float s = 0;
  for (int k = 0; k < OPS_LANES; k++) s += lanes[k];
  return s;
}

static inline float ops_sum(const float *x, int n) {
  float lanes[OPS_LANES] = {0};
  int i = 0;
  for (; i + OPS_LANES <= n; i += OPS_LANES)
    for (int k = 0; k < OPS_LANES; k++) lanes[k] += x[i + k];
  for (; i < n; i++) lanes[0] += x[i];
  return ops_lanes_sum(lanes);
}

static inline float ops_dot(const float *x, const float *y, int n) {
  float lanes[OPS_LANES] = {0};
  int i = 0;
  for (; i + OPS_LANES <= n; i += OPS_LANES)
    for (int k = 0; k < OPS_LANES; k++) lanes[k] += x[i + k] * y[i + k];
  for (; i < n; i++) lanes[0] += x[i] * y[i];
  return ops_lanes_sum(lanes);
}

static inline float ops_max(const float *x, int n) {
  float lanes[OPS_LANES];
  for (int k = 0; k < OPS_LANES; k++) lanes[k] = x[0];
  int i = 0;
  for (; i + OPS_LANES <= n; i += OPS_LANES)
    for (int k = 0; k < OPS_LANES; k++) lanes[k] = x[i + k] > lanes[k] ? x[i + k] : lanes[k];
  for (; i < n; i++) lanes[0] = x[i] > lanes[0] ? x[i] : lanes[0];
  float m = lanes[0];
  for (int k = 1; k < OPS_LANES; k++) m = lanes[k] > m ? lanes[k] : m;
  return m;
}

/* e^x in straight-line arithmetic that vectorises (Cephes' expf: x = n ln2
 * + r, |r| <= ln2 / 2, a degree-6 polynomial for e^r, 2^n in the exponent
 * bits), within 2 ulp of expf; x is clamped to [-87.3, 88.3], where 2^n stays
 * a normal float. Its callers pass x <= 0. */
static inline float ops_expf(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union {
    int32_t i;
    float f;
  } two_n = {.i = ((int32_t)n + 127) << 23};
  return p * two_n.f;
}

/* x = e^(x - shift) in place; returns their sum */
static inline float ops_exp_shift(float *x, int n, float shift) {
  for (int i = 0; i < n; i++) x[i] = ops_expf(x[i] - shift);
  return ops_sum(x, n);
}

OPS_CLONES void gpt_encoder_forward(float *out, const int *tok, const float *wte, const float *wpe, int B,
                         int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *o = out + ((long)b * T + t) * C;
      const float *e = wte + (long)tok[b * T + t] * C, *p = wpe + (long)t * C;
      for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
    }
}

OPS_CLONES void gpt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tok, int B,
                          int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *d = dout + ((long)b * T + t) * C;
      float *de = dwte + (long)tok[b * T + t] * C, *dp = dwpe + (long)t * C;
      for (int i = 0; i < C; i++) {
        de[i] += d[i];
        dp[i] += d[i];
      }
    }
}

OPS_CLONES void gpt_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int n, int C) {
  for (int r = 0; r < n; r++) {
    const float *xr = x + (long)r * C;
    float *o = out + (long)r * C;
    float m = ops_sum(xr, C) / (float)C;
    float lanes[OPS_LANES] = {0};
    int i = 0;
    for (; i + OPS_LANES <= C; i += OPS_LANES)
      for (int k = 0; k < OPS_LANES; k++) lanes[k] += (xr[i + k] - m) * (xr[i + k] - m);
    for (; i < C; i++) lanes[0] += (xr[i] - m) * (xr[i] - m);
    float s = 1.0f / sqrtf(ops_lanes_sum(lanes) / (float)C + 1e-5f);
    for (i = 0; i < C; i++) o[i] = (xr[i] - m) * s * w[i] + b[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

OPS_CLONES void gpt_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                            const float *w, const float *mean, const float *rstd, int n, int C) {
  for (int r = 0; r < n; r++) {
    const float *d = dout + (long)r * C, *xr = x + (long)r * C;
    float *dxr = dx + (long)r * C;
    float m = mean[r], s = rstd[r];
    /* the mean of dnorm and of dnorm * norm */
    float lm[OPS_LANES] = {0}, ln[OPS_LANES] = {0};
    int i = 0;
    for (; i + OPS_LANES <= C; i += OPS_LANES)
      for (int k = 0; k < OPS_LANES; k++) {
        float norm = (xr[i + k] - m) * s, dnorm = w[i + k] * d[i + k];
        lm[k] += dnorm;
        ln[k] += dnorm * norm;
      }
    for (; i < C; i++) {
      float norm = (xr[i] - m) * s, dnorm = w[i] * d[i];
      lm[0] += dnorm;
      ln[0] += dnorm * norm;
    }
    float dmean = ops_lanes_sum(lm) / (float)C, dnmean = ops_lanes_sum(ln) / (float)C;
    for (i = 0; i < C; i++) {
      float norm = (xr[i] - m) * s, dnorm = w[i] * d[i];
      db[i] += d[i];
      dw[i] += norm * d[i];
      dxr[i] += (dnorm - dmean - norm * dnmean) * s;
    }
  }
}

OPS_CLONES void gpt_linear_forward(float *out, const float *x, const float *w, const float *bias, int n,
                        int ic, int oc) {
  train_sgemm(0, 1, n, oc, ic, 1.0f, x, ic, w, ic, 0.0f, out, oc);
  if (bias != NULL)
    for (int r = 0; r < n; r++) {
      float *o = out + (long)r * oc;
      for (int j = 0; j < oc; j++) o[j] += bias[j];
    }
}

OPS_CLONES void gpt_linear_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                         const float *w, int n, int ic, int oc) {
  if (dx != NULL) train_sgemm(0, 0, n, ic, oc, 1.0f, dout, oc, w, ic, 0.0f, dx, ic);
  train_sgemm(1, 0, oc, ic, n, 1.0f, dout, oc, x, ic, 1.0f, dw, ic);
  if (dbias != NULL)
    for (int r = 0; r < n; r++) {
      const float *d = dout + (long)r * oc;
      for (int j = 0; j < oc; j++) dbias[j] += d[j];
    }
}

/* Attention works on blocks of ATT_ROWS query rows: rows [i0, i1) see keys
 * [0, i1) at most, so that the products skip the masked upper triangle but
 * for the diagonal blocks, whose masked entries are zeros. */
#define ATT_ROWS 32

OPS_CLONES void gpt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (long)b * T * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
      float *a = att + ((long)b * NH + h) * T * T, *y = out + (long)b * T * C + h * hs;
      for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
        int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T, m = i1 - i0;
        float *ab = a + (long)i0 * T;
        train_sgemm(0, 1, m, i1, hs, scale, q + (long)i0 * 3 * C, 3 * C, k, 3 * C, 0.0f, ab, T);
        for (int i = i0; i < i1; i++) { /* row i sees positions 0..i */
          float *row = a + (long)i * T;
          float inv = 1.0f / ops_exp_shift(row, i + 1, ops_max(row, i + 1));
          for (int j = 0; j <= i; j++) row[j] *= inv;
          for (int j = i + 1; j < i1; j++) row[j] = 0.0f;
        }
        train_sgemm(0, 0, m, hs, i1, 1.0f, ab, T, v, 3 * C, 0.0f, y + (long)i0 * C, C);
      }
    }
}

OPS_CLONES void gpt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                            float *scratch, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  int last = (T - 1) / ATT_ROWS * ATT_ROWS;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      long base = (long)b * T * 3 * C + h * hs;
      const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
      const float *a = att + ((long)b * NH + h) * T * T;
      const float *d = dout + (long)b * T * C + h * hs;
      /* from the last block, which writes dk and dv of every key, the others add */
      for (int i0 = last; i0 >= 0; i0 -= ATT_ROWS) {
        int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T, m = i1 - i0;
        float beta = i0 == last ? 0.0f : 1.0f;
        const float *ab = a + (long)i0 * T, *db = d + (long)i0 * C;
        float *sb = scratch + (long)i0 * T;
        /* dv = att^T dout; datt = dout v^T */
        train_sgemm(1, 0, i1, hs, m, 1.0f, ab, T, db, C, beta, dv, 3 * C);
        train_sgemm(0, 1, m, i1, hs, 1.0f, db, C, v, 3 * C, 0.0f, sb, T);
        /* through the softmax: dpre = att * (datt - sum(att * datt)) */
        for (int i = i0; i < i1; i++) {
          const float *ar = a + (long)i * T;
          float *dr = scratch + (long)i * T;
          float dot = ops_dot(ar, dr, i + 1);
          for (int j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - dot);
          for (int j = i + 1; j < i1; j++) dr[j] = 0.0f;
        }
        /* pre = scale q k^T: dq = scale dpre k, dk = scale dpre^T q */
        train_sgemm(0, 0, m, hs, i1, scale, sb, T, k, 3 * C, 0.0f, dq + (long)i0 * 3 * C, 3 * C);
        train_sgemm(1, 0, i1, hs, m, scale, sb, T, q + (long)i0 * 3 * C, 3 * C, beta, dk, 3 * C);
      }
    }
}

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

/* 0.5 x (1 + tanh(u)) = x sigmoid(2u) = x / (1 + e^-2u) */
OPS_CLONES void gpt_gelu_forward(float *out, const float *x, long count) {
  for (long i = 0; i < count; i++) {
    float xi = x[i], u = GELU_S * (xi + 0.044715f * xi * xi * xi);
    float e = ops_expf(-2.0f * fabsf(u)); /* <= 1: sigmoid(2u) = 1 / (1 + e) or e / (1 + e) */
    out[i] = xi * (u >= 0.0f ? 1.0f : e) / (1.0f + e);
  }
}

/* with s = sigmoid(2u): gelu' = s + 2 x s (1 - s) du/dx */
OPS_CLONES void gpt_gelu_backward(float *d, const float *x, long count) {
  for (long i = 0; i < count; i++) {
    float xi = x[i], u = GELU_S * (xi + 0.044715f * xi * xi * xi);
    float e = ops_expf(-2.0f * fabsf(u));
    float s = (u >= 0.0f ? 1.0f : e) / (1.0f + e);
    float du = GELU_S * (1.0f + 3.0f * 0.044715f * xi * xi);
    d[i] *= s + 2.0f * xi * s * (1.0f - s) * du;
  }
}

OPS_CLONES double gpt_softmax_xent_forward(float *logits, const int *targets, int n, int V) {
  double loss = 0;
  for (int r = 0; r < n; r++) {
    float *row = logits + (long)r * V;
    float target_logit = row[targets[r]];
    float mx = ops_max(row, V);
    float sum = ops_exp_shift(row, V, mx);
    float inv = 1.0f / sum;
    for (int j = 0; j < V; j++) row[j] *= inv;
    loss += (double)mx + log((double)sum) - (double)target_logit;
  }
  return loss;
}

OPS_CLONES void gpt_softmax_xent_backward(float *probs, const int *targets, int n, int V, float scale) {
  for (int r = 0; r < n; r++) {
    float *row = probs + (long)r * V;
    row[targets[r]] -= 1.0f;
    for (int j = 0; j < V; j++) row[j] *= scale;
  }
}
