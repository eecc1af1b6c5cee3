/* The transformer's operations on the host (see train_gpt_ops.h). */
#include "train_gpt_ops.h"

#include <math.h>
#include <string.h>

#include "train_blas.h"

void gpt_encoder_forward(float *out, const int *tok, const float *wte, const float *wpe, int B,
                         int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *o = out + ((long)b * T + t) * C;
      const float *e = wte + (long)tok[b * T + t] * C, *p = wpe + (long)t * C;
      for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
    }
}

void gpt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tok, int B,
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

void gpt_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int n, int C) {
  for (int r = 0; r < n; r++) {
    const float *xr = x + (long)r * C;
    float *o = out + (long)r * C;
    float m = 0;
    for (int i = 0; i < C; i++) m += xr[i];
    m /= C;
    float v = 0;
    for (int i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
    v /= C;
    float s = 1.0f / sqrtf(v + 1e-5f);
    for (int i = 0; i < C; i++) o[i] = (xr[i] - m) * s * w[i] + b[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

void gpt_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                            const float *w, const float *mean, const float *rstd, int n, int C) {
  for (int r = 0; r < n; r++) {
    const float *d = dout + (long)r * C, *xr = x + (long)r * C;
    float *dxr = dx + (long)r * C;
    float m = mean[r], s = rstd[r];
    /* the mean of dnorm and of dnorm * norm */
    float dmean = 0, dnmean = 0;
    for (int i = 0; i < C; i++) {
      float norm = (xr[i] - m) * s, dnorm = w[i] * d[i];
      dmean += dnorm;
      dnmean += dnorm * norm;
    }
    dmean /= C;
    dnmean /= C;
    for (int i = 0; i < C; i++) {
      float norm = (xr[i] - m) * s, dnorm = w[i] * d[i];
      db[i] += d[i];
      dw[i] += norm * d[i];
      dxr[i] += (dnorm - dmean - norm * dnmean) * s;
    }
  }
}

void gpt_linear_forward(float *out, const float *x, const float *w, const float *bias, int n,
                        int ic, int oc) {
  train_sgemm(0, 1, n, oc, ic, 1.0f, x, ic, w, ic, 0.0f, out, oc);
  if (bias != NULL)
    for (int r = 0; r < n; r++) {
      float *o = out + (long)r * oc;
      for (int j = 0; j < oc; j++) o[j] += bias[j];
    }
}

void gpt_linear_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                         const float *w, int n, int ic, int oc) {
  if (dx != NULL) train_sgemm(0, 0, n, ic, oc, 1.0f, dout, oc, w, ic, 0.0f, dx, ic);
  train_sgemm(1, 0, oc, ic, n, 1.0f, dout, oc, x, ic, 1.0f, dw, ic);
  if (dbias != NULL)
    for (int r = 0; r < n; r++) {
      const float *d = dout + (long)r * oc;
      for (int j = 0; j < oc; j++) dbias[j] += d[j];
    }
}

void gpt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const float *q = qkv + (long)b * T * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
      float *a = att + ((long)b * NH + h) * T * T;
      train_sgemm(0, 1, T, T, hs, scale, q, 3 * C, k, 3 * C, 0.0f, a, T);
      for (int i = 0; i < T; i++) { /* row i sees positions 0..i */
        float *row = a + (long)i * T;
        float mx = row[0];
        for (int j = 1; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = 0;
        for (int j = 0; j <= i; j++) {
          row[j] = expf(row[j] - mx);
          sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int j = 0; j <= i; j++) row[j] *= inv;
        for (int j = i + 1; j < T; j++) row[j] = 0.0f;
      }
      train_sgemm(0, 0, T, hs, T, 1.0f, a, T, v, 3 * C, 0.0f, out + (long)b * T * C + h * hs, C);
    }
}

void gpt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                            float *scratch, int B, int T, int C, int NH) {
  int hs = C / NH;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      long base = (long)b * T * 3 * C + h * hs;
      const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
      const float *a = att + ((long)b * NH + h) * T * T;
      const float *d = dout + (long)b * T * C + h * hs;
      /* dv = att^T dout; datt = dout v^T */
      train_sgemm(1, 0, T, hs, T, 1.0f, a, T, d, C, 0.0f, dv, 3 * C);
      train_sgemm(0, 1, T, T, hs, 1.0f, d, C, v, 3 * C, 0.0f, scratch, T);
      /* through the softmax: dpre = att * (datt - sum(att * datt)) */
      for (int i = 0; i < T; i++) {
        const float *ar = a + (long)i * T;
        float *dr = scratch + (long)i * T;
        float dot = 0;
        for (int j = 0; j <= i; j++) dot += ar[j] * dr[j];
        for (int j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - dot);
        for (int j = i + 1; j < T; j++) dr[j] = 0.0f;
      }
      /* pre = scale q k^T: dq = scale dpre k, dk = scale dpre^T q */
      train_sgemm(0, 0, T, hs, T, scale, scratch, T, k, 3 * C, 0.0f, dq, 3 * C);
      train_sgemm(1, 0, T, hs, T, scale, scratch, T, q, 3 * C, 0.0f, dk, 3 * C);
    }
}

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

void gpt_gelu_forward(float *out, const float *x, long count) {
  for (long i = 0; i < count; i++) {
    float u = GELU_S * (x[i] + 0.044715f * x[i] * x[i] * x[i]);
    out[i] = 0.5f * x[i] * (1.0f + tanhf(u));
  }
}

void gpt_gelu_backward(float *d, const float *x, long count) {
  for (long i = 0; i < count; i++) {
    float xi = x[i], u = GELU_S * (xi + 0.044715f * xi * xi * xi);
    float th = tanhf(u);
    float du = GELU_S * (1.0f + 3.0f * 0.044715f * xi * xi);
    d[i] *= 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du;
  }
}

double gpt_softmax_xent_forward(float *logits, const int *targets, int n, int V) {
  double loss = 0;
  for (int r = 0; r < n; r++) {
    float *row = logits + (long)r * V;
    float target_logit = row[targets[r]];
    float mx = row[0];
    for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
    float sum = 0;
    for (int j = 0; j < V; j++) {
      row[j] = expf(row[j] - mx);
      sum += row[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < V; j++) row[j] *= inv;
    loss += (double)mx + log((double)sum) - (double)target_logit;
  }
  return loss;
}

void gpt_softmax_xent_backward(float *probs, const int *targets, int n, int V, float scale) {
  for (int r = 0; r < n; r++) {
    float *row = probs + (long)r * V;
    row[targets[r]] -= 1.0f;
    for (int j = 0; j < V; j++) row[j] *= scale;
  }
}
