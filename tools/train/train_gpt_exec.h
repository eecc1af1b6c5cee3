/* Where the transformer's operations run: the host (train_gpt_ops.h
 * directly), a GPU (train_gpt_kern.h's bodies as CUDA kernels, products
 * through cuBLAS), or those same kernel bodies looped on the host (the
 * simulated executor, --device sim, that CI runs). train_gpt.c calls these
 * only, so one training loop drives all three.
 *
 * Every operation has its train_gpt_ops.h namesake's meaning, on the
 * executor's memory (from alloc), queued on its stream in call order. The
 * first failure is kept (status) and the rest are skipped. */
#ifndef WEFT_TRAIN_GPT_EXEC_H
#define WEFT_TRAIN_GPT_EXEC_H

#include <stddef.h>

#include "train_gpt_kern.h"
#include "train_opts.h"
#include "weft.h"

struct gpt_exec {
  const char *name;     /* "host", "cuda" or "sim" */
  const char *gemm;     /* what does the products: "OpenBLAS ...", "cuBLAS", ... */
  void *stream;         /* CUDA: the stream everything is queued on */
  const struct gk_table *kern; /* NULL on the host */
  weftResult_t status;  /* the first failure */
  /* kernels' scratch */
  int V, maxn;
  int *tok, *tgt, *off, *pos, *host_off, *host_pos;
  double *loss, *host_loss;
  float *scores;        /* heads x T x T: the scores' gradient of one sequence */
  const int *host_tok, *host_tgt; /* host: the arrays tokens() was given */
  float *host_scratch;  /* host: T x T for attention's backward */
  double host_loss_sum; /* host: the last softmax_xent_forward's */
};

/* The executor: host (kern NULL), or kern's. stream: CUDA's, for kern's
 * launches. Sized for B x T tokens at most of shape s; weftSystemError or
 * the runtime's failure with a message on stderr. */
weftResult_t gpt_exec_open(struct gpt_exec *x, const struct gk_table *kern, void *stream,
                           const struct train_gpt_shape *s, int B, int T);
void gpt_exec_close(struct gpt_exec *x);

void *gpt_x_alloc(struct gpt_exec *x, size_t bytes);
void gpt_x_free(struct gpt_exec *x, void *p);
/* host -> executor, executor -> host; complete on return */
void gpt_x_upload(struct gpt_exec *x, void *dst, const void *src, size_t bytes);
void gpt_x_download(struct gpt_exec *x, void *dst, const void *src, size_t bytes);

/* The micro-step's B x T input tokens and targets (tgt may be NULL), host
 * arrays, for the encoder and the loss; inp and tgt stay valid until the
 * next call. */
void gpt_x_tokens(struct gpt_exec *x, const int *inp, const int *tgt, int B, int T);

void gpt_x_encoder_forward(struct gpt_exec *x, float *out, const float *wte, const float *wpe,
                           int B, int T, int C);
void gpt_x_encoder_backward(struct gpt_exec *x, float *dwte, float *dwpe, const float *dout,
                            int B, int T, int C);
void gpt_x_layernorm_forward(struct gpt_exec *x, float *out, float *mean, float *rstd,
                             const float *in, const float *w, const float *b, int n, int C);
void gpt_x_layernorm_backward(struct gpt_exec *x, float *dx, float *dw, float *db,
                              const float *dout, const float *in, const float *w,
                              const float *mean, const float *rstd, int n, int C);
void gpt_x_linear_forward(struct gpt_exec *x, float *out, const float *in, const float *w,
                          const float *bias, int n, int ic, int oc);
void gpt_x_linear_backward(struct gpt_exec *x, float *dx, float *dw, float *dbias,
                           const float *dout, const float *in, const float *w, int n, int ic,
                           int oc);
void gpt_x_attention_forward(struct gpt_exec *x, float *out, float *att, const float *qkv, int B,
                             int T, int C, int NH);
void gpt_x_attention_backward(struct gpt_exec *x, float *dqkv, const float *dout,
                              const float *qkv, const float *att, int B, int T, int C, int NH);
void gpt_x_gelu_forward(struct gpt_exec *x, float *out, const float *in, long count);
void gpt_x_gelu_backward(struct gpt_exec *x, float *d, const float *in, long count);
/* logits -> probabilities, each row's loss kept for gpt_x_loss_sum */
void gpt_x_softmax_xent_forward(struct gpt_exec *x, float *logits, int n, int V);
/* The sum of the last softmax_xent_forward's n row losses, waited for (0
 * after a failure): read once the micro-step's work is queued, so that the
 * host does not wait between forward and backward. */
double gpt_x_loss_sum(struct gpt_exec *x, int n);
void gpt_x_softmax_xent_backward(struct gpt_exec *x, float *probs, int n, int V, float scale);
/* out = a + b; p = 0 */
void gpt_x_add(struct gpt_exec *x, float *out, const float *a, const float *b, long count);
void gpt_x_zero(struct gpt_exec *x, float *p, long count);
/* parameters and gradients of dtype as fp32 and back (the ZeRO context's
 * memory, which is the executor's) */
void gpt_x_to_float(struct gpt_exec *x, const void *src, weftDataType_t dtype, float *dst,
                    size_t count);
void gpt_x_accumulate(struct gpt_exec *x, void *dst, weftDataType_t dtype, const float *src,
                      size_t count);

#endif
