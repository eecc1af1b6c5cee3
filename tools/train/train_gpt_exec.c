/* The transformer's executors (train_gpt_exec.h): the host's operations, or
 * train_gpt_kern.h's kernels through a gk_table (a GPU's, or the host loop
 * of the simulated executor). */
#include "train_gpt_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train_blas.h"
#include "train_gpt_ops.h"
#include "weft_zero.h"

#ifndef TRAIN_CUDA
const struct gk_table *gk_cuda_table(void) { return NULL; }
#endif

/* A kernel executor's launcher returned err: the first failure is kept,
 * with a message. */
static int kx_ok(struct gpt_exec *x, int err, const char *what) {
  if (err != 0 && x->status == weftSuccess) {
    fprintf(stderr, "weft-train: %s (%s executor): %s\n", what, x->name,
            x->kern->error_string(err));
    x->status = strcmp(x->name, "cuda") == 0 ? weftUnhandledCudaError : weftSystemError;
  }
  return x->status == weftSuccess;
}

/* Skips the operation after a failure. */
#define KX_LIVE(x)                              \
  do {                                          \
    if ((x)->status != weftSuccess) return;     \
  } while (0)

#define KX(x, what, call) (void)kx_ok(x, (call), what)

void *gpt_x_alloc(struct gpt_exec *x, size_t bytes) {
  if (x->kern == NULL) {
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL && x->status == weftSuccess) {
      fprintf(stderr, "weft-train: out of memory (%zu MiB)\n", bytes >> 20);
      x->status = weftSystemError;
    }
    return p;
  }
  void *p = NULL;
  if (!kx_ok(x, x->kern->alloc(&p, bytes), "allocating memory")) return NULL;
  return p;
}

void gpt_x_free(struct gpt_exec *x, void *p) {
  if (p == NULL) return;
  if (x->kern == NULL) free(p);
  else x->kern->free(p);
}

void gpt_x_upload(struct gpt_exec *x, void *dst, const void *src, size_t bytes) {
  KX_LIVE(x);
  if (x->kern == NULL) memcpy(dst, src, bytes);
  else KX(x, "copying to the executor", x->kern->copy(x->stream, dst, src, bytes));
}

void gpt_x_download(struct gpt_exec *x, void *dst, const void *src, size_t bytes) {
  KX_LIVE(x);
  if (x->kern == NULL) memcpy(dst, src, bytes);
  else KX(x, "copying from the executor", x->kern->copy(x->stream, dst, src, bytes));
}

weftResult_t gpt_exec_open(struct gpt_exec *x, const struct gk_table *kern, void *stream,
                           const struct train_gpt_shape *s, int B, int T) {
  memset(x, 0, sizeof *x);
  x->kern = kern;
  x->stream = stream;
  x->name = kern != NULL ? kern->name : "host";
  x->gemm = kern != NULL ? kern->gemm_name : train_blas_core();
  x->V = s->vocab;
  x->maxn = B * T;
  size_t n = (size_t)x->maxn, tt = (size_t)T * T;
  if (kern == NULL) {
    x->host_scratch = gpt_x_alloc(x, tt * sizeof(float));
    return x->status;
  }
  x->tok = gpt_x_alloc(x, n * sizeof(int));
  x->tgt = gpt_x_alloc(x, n * sizeof(int));
  x->off = gpt_x_alloc(x, ((size_t)x->V + 1) * sizeof(int));
  x->pos = gpt_x_alloc(x, n * sizeof(int));
  x->loss = gpt_x_alloc(x, n * sizeof(double));
  x->scores = gpt_x_alloc(x, (size_t)s->heads * tt * sizeof(float));
  x->host_off = malloc(2 * ((size_t)x->V + 1) * sizeof(int)); /* and each token's next place */
  x->host_pos = malloc(n * sizeof(int));
  x->host_loss = malloc(n * sizeof(double));
  if (x->status == weftSuccess &&
      (x->host_off == NULL || x->host_pos == NULL || x->host_loss == NULL)) {
    fprintf(stderr, "weft-train: out of memory\n");
    x->status = weftSystemError;
  }
  return x->status;
}

void gpt_exec_close(struct gpt_exec *x) {
  gpt_x_free(x, x->host_scratch);
  void *dev[] = {x->tok, x->tgt, x->off, x->pos, x->loss, x->scores};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpt_x_free(x, dev[i]);
  free(x->host_off);
  free(x->host_pos);
  free(x->host_loss);
  memset(x, 0, sizeof *x);
}

/* The kernels' encoder backward adds each token's rows in row order: the
 * rows of token v are pos[off[v] .. off[v + 1]) (a counting sort). */
void gpt_x_tokens(struct gpt_exec *x, const int *inp, const int *tgt, int B, int T) {
  x->host_tok = inp;
  x->host_tgt = tgt;
  if (x->kern == NULL) return;
  int n = B * T, V = x->V;
  memset(x->host_off, 0, ((size_t)V + 1) * sizeof(int));
  for (int r = 0; r < n; r++) x->host_off[inp[r] + 1]++;
  for (int v = 0; v < V; v++) x->host_off[v + 1] += x->host_off[v];
  int *next = x->host_off + V + 1;
  memcpy(next, x->host_off, (size_t)V * sizeof(int));
  for (int r = 0; r < n; r++) x->host_pos[next[inp[r]]++] = r;
  gpt_x_upload(x, x->tok, inp, (size_t)n * sizeof(int));
  if (tgt != NULL) gpt_x_upload(x, x->tgt, tgt, (size_t)n * sizeof(int));
  gpt_x_upload(x, x->off, x->host_off, ((size_t)V + 1) * sizeof(int));
  gpt_x_upload(x, x->pos, x->host_pos, (size_t)n * sizeof(int));
}

void gpt_x_encoder_forward(struct gpt_exec *x, float *out, const float *wte, const float *wpe,
                           int B, int T, int C) {
  KX_LIVE(x);
  if (x->kern == NULL) gpt_encoder_forward(out, x->host_tok, wte, wpe, B, T, C);
  else
    KX(x, "the encoder",
       x->kern->encoder_fwd(x->stream, (size_t)B * T * C, out, x->tok, wte, wpe, T, C));
}

void gpt_x_encoder_backward(struct gpt_exec *x, float *dwte, float *dwpe, const float *dout,
                            int B, int T, int C) {
  KX_LIVE(x);
  if (x->kern == NULL) {
    gpt_encoder_backward(dwte, dwpe, dout, x->host_tok, B, T, C);
    return;
  }
  KX(x, "the encoder's backward",
     x->kern->encoder_bwd_wte(x->stream, (size_t)x->V * C, dwte, dout, x->off, x->pos, C));
  KX(x, "the encoder's backward",
     x->kern->encoder_bwd_wpe(x->stream, (size_t)T * C, dwpe, dout, B, T, C));
}

void gpt_x_layernorm_forward(struct gpt_exec *x, float *out, float *mean, float *rstd,
                             const float *in, const float *w, const float *b, int n, int C) {
  KX_LIVE(x);
  if (x->kern == NULL) gpt_layernorm_forward(out, mean, rstd, in, w, b, n, C);
  else
    KX(x, "a layer norm",
       x->kern->layernorm_fwd(x->stream, (size_t)n, out, mean, rstd, in, w, b, C));
}

void gpt_x_layernorm_backward(struct gpt_exec *x, float *dx, float *dw, float *db,
                              const float *dout, const float *in, const float *w,
                              const float *mean, const float *rstd, int n, int C) {
  KX_LIVE(x);
  if (x->kern == NULL) {
    gpt_layernorm_backward(dx, dw, db, dout, in, w, mean, rstd, n, C);
    return;
  }
  KX(x, "a layer norm's backward",
     x->kern->layernorm_bwd_dx(x->stream, (size_t)n, dx, dout, in, w, mean, rstd, C));
  KX(x, "a layer norm's backward",
     x->kern->layernorm_bwd_dw(x->stream, (size_t)C, dw, db, dout, in, mean, rstd, n, C));
}

/* One row-major product, or `batch` of them at the strides given. */
static void kx_gemm(struct gpt_exec *x, int ta, int tb, int m, int n, int k, float alpha,
                    const float *a, int lda, long sa, const float *b, int ldb, long sb, float beta,
                    float *c, int ldc, long sc, int batch) {
  KX(x, "a matrix product",
     x->kern->gemm_batched(x->stream, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc,
                           sc, batch));
}

void gpt_x_linear_forward(struct gpt_exec *x, float *out, const float *in, const float *w,
                          const float *bias, int n, int ic, int oc) {
  KX_LIVE(x);
  if (x->kern == NULL) {
    gpt_linear_forward(out, in, w, bias, n, ic, oc);
    return;
  }
  kx_gemm(x, 0, 1, n, oc, ic, 1.0f, in, ic, 0, w, ic, 0, 0.0f, out, oc, 0, 1);
  if (bias != NULL)
    KX(x, "a bias", x->kern->bias_add(x->stream, (size_t)n * oc, out, bias, oc));
}

void gpt_x_linear_backward(struct gpt_exec *x, float *dx, float *dw, float *dbias,
                           const float *dout, const float *in, const float *w, int n, int ic,
                           int oc) {
  KX_LIVE(x);
  if (x->kern == NULL) {
    gpt_linear_backward(dx, dw, dbias, dout, in, w, n, ic, oc);
    return;
  }
  if (dx != NULL) kx_gemm(x, 0, 0, n, ic, oc, 1.0f, dout, oc, 0, w, ic, 0, 0.0f, dx, ic, 0, 1);
  kx_gemm(x, 1, 0, oc, ic, n, 1.0f, dout, oc, 0, in, ic, 0, 1.0f, dw, ic, 0, 1);
  if (dbias != NULL)
    KX(x, "a bias's gradient", x->kern->bias_bwd(x->stream, (size_t)oc, dbias, dout, n, oc));
}

/* Per sequence b, the heads as a batch: head h of q, k, v is the columns
 * [h hs, (h + 1) hs) of its third of qkv (rows 3C apart), so consecutive
 * heads are hs floats apart; the scores of (b, h) are T x T at att + (b NH +
 * h) T T. The products fill the whole T x T; the softmax zeroes above the
 * diagonal. */
void gpt_x_attention_forward(struct gpt_exec *x, float *out, float *att, const float *qkv, int B,
                             int T, int C, int NH) {
  KX_LIVE(x);
  if (x->kern == NULL) {
    gpt_attention_forward(out, att, qkv, B, T, C, NH);
    return;
  }
  int hs = C / NH;
  long tt = (long)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * 3 * C, *k = q + C;
    kx_gemm(x, 0, 1, T, T, hs, scale, q, 3 * C, hs, k, 3 * C, hs, 0.0f, att + (size_t)b * NH * tt,
            T, tt, NH);
  }
  KX(x, "attention's softmax", x->kern->softmax_causal(x->stream, (size_t)B * NH * T, att, T));
  for (int b = 0; b < B; b++) {
    const float *v = qkv + (size_t)b * T * 3 * C + 2 * C;
    kx_gemm(x, 0, 0, T, hs, T, 1.0f, att + (size_t)b * NH * tt, T, tt, v, 3 * C, hs, 0.0f,
            out + (size_t)b * T * C, C, hs, NH);
  }
}

void gpt_x_attention_backward(struct gpt_exec *x, float *dqkv, const float *dout,
                              const float *qkv, const float *att, int B, int T, int C, int NH) {
  KX_LIVE(x);
  if (x->kern == NULL) {
    gpt_attention_backward(dqkv, dout, qkv, att, x->host_scratch, B, T, C, NH);
    return;
  }
  int hs = C / NH;
  long tt = (long)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) {
    size_t base = (size_t)b * T * 3 * C;
    const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
    const float *a = att + (size_t)b * NH * tt, *d = dout + (size_t)b * T * C;
    /* dv = att^T dout; dscores = dout v^T, through the softmax */
    kx_gemm(x, 1, 0, T, hs, T, 1.0f, a, T, tt, d, C, hs, 0.0f, dv, 3 * C, hs, NH);
    kx_gemm(x, 0, 1, T, T, hs, 1.0f, d, C, hs, v, 3 * C, hs, 0.0f, x->scores, T, tt, NH);
    KX(x, "attention's softmax backward",
       x->kern->softmax_causal_bwd(x->stream, (size_t)NH * T, x->scores, a, T));
    /* scores = scale q k^T: dq = scale dscores k, dk = scale dscores^T q */
    kx_gemm(x, 0, 0, T, hs, T, scale, x->scores, T, tt, k, 3 * C, hs, 0.0f, dq, 3 * C, hs, NH);
    kx_gemm(x, 1, 0, T, hs, T, scale, x->scores, T, tt, q, 3 * C, hs, 0.0f, dk, 3 * C, hs, NH);
  }
}

void gpt_x_gelu_forward(struct gpt_exec *x, float *out, const float *in, long count) {
  KX_LIVE(x);
  if (x->kern == NULL) gpt_gelu_forward(out, in, count);
  else KX(x, "GELU", x->kern->gelu_fwd(x->stream, (size_t)count, out, in));
}

void gpt_x_gelu_backward(struct gpt_exec *x, float *d, const float *in, long count) {
  KX_LIVE(x);
  if (x->kern == NULL) gpt_gelu_backward(d, in, count);
  else KX(x, "GELU's backward", x->kern->gelu_bwd(x->stream, (size_t)count, d, in));
}

void gpt_x_softmax_xent_forward(struct gpt_exec *x, float *logits, int n, int V) {
  KX_LIVE(x);
  if (x->kern == NULL) x->host_loss_sum = gpt_softmax_xent_forward(logits, x->host_tgt, n, V);
  else KX(x, "the loss", x->kern->xent_fwd(x->stream, (size_t)n, logits, x->loss, x->tgt, V));
}

double gpt_x_loss_sum(struct gpt_exec *x, int n) {
  if (x->status != weftSuccess) return 0;
  if (x->kern == NULL) return x->host_loss_sum;
  gpt_x_download(x, x->host_loss, x->loss, (size_t)n * sizeof(double));
  double sum = 0;
  for (int r = 0; r < n && x->status == weftSuccess; r++) sum += x->host_loss[r];
  return sum;
}

void gpt_x_softmax_xent_backward(struct gpt_exec *x, float *probs, int n, int V, float scale) {
  KX_LIVE(x);
  if (x->kern == NULL) gpt_softmax_xent_backward(probs, x->host_tgt, n, V, scale);
  else
    KX(x, "the loss's gradient",
       x->kern->xent_bwd(x->stream, (size_t)n * V, probs, x->tgt, V, scale));
}

void gpt_x_add(struct gpt_exec *x, float *out, const float *a, const float *b, long count) {
  KX_LIVE(x);
  if (x->kern == NULL)
    for (long i = 0; i < count; i++) out[i] = a[i] + b[i];
  else KX(x, "a residual", x->kern->add(x->stream, (size_t)count, out, a, b));
}

void gpt_x_zero(struct gpt_exec *x, float *p, long count) {
  KX_LIVE(x);
  if (x->kern == NULL) memset(p, 0, (size_t)count * sizeof(float));
  else KX(x, "zeroing", x->kern->zero(x->stream, (size_t)count, p));
}

void gpt_x_to_float(struct gpt_exec *x, const void *src, weftDataType_t dtype, float *dst,
                    size_t count) {
  KX_LIVE(x);
  if (x->kern == NULL) weftZeroToFloat(src, dtype, dst, count);
  else KX(x, "converting parameters", x->kern->to_float(x->stream, src, dtype, dst, count));
}

void gpt_x_accumulate(struct gpt_exec *x, void *dst, weftDataType_t dtype, const float *src,
                      size_t count) {
  KX_LIVE(x);
  if (x->kern == NULL) weftZeroAccumulate(dst, dtype, src, count);
  else KX(x, "adding gradients", x->kern->accumulate(x->stream, dst, dtype, src, count));
}
