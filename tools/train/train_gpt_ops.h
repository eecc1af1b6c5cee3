/* The transformer's operations on the host, forward and backward, on fp32
 * rows of `n` tokens (batch x sequence): loops the compiler vectorises, and
 * matrix products through train_blas.h. Backward functions add into the
 * weight gradients (as over micro-steps) and write or add the input's as
 * each says. Weights are stored as PyTorch's nn.Linear: out x in. */
#ifndef WEFT_TRAIN_GPT_OPS_H
#define WEFT_TRAIN_GPT_OPS_H

#include <stdint.h>

/* out[b,t,:] = wte[tok[b,t]] + wpe[t] */
void gpt_encoder_forward(float *out, const int *tok, const float *wte, const float *wpe, int B,
                         int T, int C);
/* dwte[tok] += dout, dwpe[t] += dout */
void gpt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *tok, int B,
                          int T, int C);

/* out = (x - mean) / sqrt(var + 1e-5) * w + b per row; keeps mean and rstd */
void gpt_layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w,
                           const float *b, int n, int C);
/* dx += the input's gradient; dw, db += */
void gpt_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                            const float *w, const float *mean, const float *rstd, int n, int C);

/* out (n x oc) = x (n x ic) W^T + bias (bias may be NULL) */
void gpt_linear_forward(float *out, const float *x, const float *w, const float *bias, int n,
                        int ic, int oc);
/* dx = dout W (overwritten; dx may be NULL), dw += dout^T x, dbias += column sums */
void gpt_linear_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                         const float *w, int n, int ic, int oc);

/* Causal self-attention of qkv (B*T x 3C: q, k, v, heads side by side) into
 * out (B*T x C); att (B x NH x T x T) keeps the softmax. */
void gpt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv = the gradient of qkv (overwritten); scratch: T x T floats. Both
 * compute only the causal lower triangle, in blocks of rows. */
void gpt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                            float *scratch, int B, int T, int C, int NH);

/* GELU, tanh approximation */
void gpt_gelu_forward(float *out, const float *x, long count);
/* d = d * gelu'(x), in place */
void gpt_gelu_backward(float *d, const float *x, long count);

/* probs = softmax(logits) per row of V, in place; returns the sum over rows
 * of -log probs[target] */
double gpt_softmax_xent_forward(float *logits, const int *targets, int n, int V);
/* probs -> their gradient, in place: (probs - onehot(target)) * scale */
void gpt_softmax_xent_backward(float *probs, const int *targets, int n, int V, float scale);

#endif
