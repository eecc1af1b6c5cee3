/* weft-train's MLP on the GPU (--device cuda): train_model.c's forward and
 * backward with the kernels of train_kernels.cu, on the model's CUDA
 * stream, reading the ZeRO context's device parameters and adding into its
 * device gradients. The data and the loss stay on the host: the inputs and
 * targets are copied in, the outputs copied out. */
#include <stdlib.h>

#include "train_device.h"
#include "train_model_int.h"

#ifdef TRAIN_CUDA

static int dev_kind(weftDataType_t t) {
  return t == weftBfloat16 ? 1 : t == weftFloat16 ? 2 : 0;
}

weftResult_t dev_model_alloc(struct model *m, int maxw) {
  const struct train_opts *o = m->o;
  size_t nb = (size_t)m->batch, mw = (size_t)maxw;
  float **arrays[] = {&m->d.delta, &m->d.delta_prev, &m->d.wf, &m->d.gw, &m->d.bf, &m->d.gb,
                      &m->d.target};
  size_t counts[] = {nb * mw, nb * mw, mw * mw, mw * mw, mw, mw, nb * o->widths[o->nlayers]};
  weftResult_t res = weftSuccess;
  for (size_t a = 0; a < sizeof counts / sizeof counts[0] && res == weftSuccess; a++)
    res = train_dev_alloc((void **)arrays[a], counts[a] * sizeof(float));
  for (int l = 0; l <= o->nlayers && res == weftSuccess; l++)
    res = train_dev_alloc((void **)&m->d.act[l], nb * o->widths[l] * sizeof(float));
  return res;
}

void dev_model_free(struct model *m) {
  float *arrays[] = {m->d.delta, m->d.delta_prev, m->d.wf, m->d.gw, m->d.bf, m->d.gb,
                     m->d.target};
  for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) train_dev_free(arrays[a]);
  for (int l = 0; l <= TRAIN_MAX_LAYERS; l++) train_dev_free(m->d.act[l]);
}

/* The layer's parameters, gathered (stage 3) and converted to fp32 into the
 * device's wf and bf. The gather is queued on the model's stream, so the
 * kernels queued after it read the layer once it is in place: nothing waits
 * on the host (a device context hands out the pointer before the event). */
static weftResult_t dev_layer_weights(struct model *m, int l) {
  const struct train_opts *o = m->o;
  weftResult_t res = weftZeroGather(m->zero, l, m->stream, NULL);
  void *w = NULL, *b = NULL;
  if (res == weftSuccess) res = weftZeroParam(m->zero, m->pw[l], &w);
  if (res == weftSuccess) res = weftZeroParam(m->zero, m->pb[l], &b);
  if (res != weftSuccess) return res;
  size_t in = (size_t)o->widths[l], out = (size_t)o->widths[l + 1];
  int kind = dev_kind(o->dtype);
  res = train_dev_launched(train_kern_to_float(w, kind, m->d.wf, in * out, m->stream),
                           "converting weights");
  if (res == weftSuccess)
    res = train_dev_launched(train_kern_to_float(b, kind, m->d.bf, out, m->stream),
                             "converting biases");
  return res;
}

/* Stage 3 gives the gathered layer back, ordered after the kernels queued
 * on the model's stream so far (the last to read it): nothing blocks, and
 * the gather that reuses its buffer waits for them on its own stream. */
static weftResult_t dev_release(struct model *m, int l) {
  return weftZeroReleaseOn(m->zero, l, m->stream);
}

weftResult_t dev_forward(struct model *m, int n) {
  const struct train_opts *o = m->o;
  weftResult_t res = train_dev_copy(m->d.act[0], m->act[0],
                                    (size_t)n * o->widths[0] * sizeof(float));
  for (int l = 0; l < o->nlayers && res == weftSuccess; l++) {
    int in = o->widths[l], out = o->widths[l + 1], last = l == o->nlayers - 1;
    res = dev_layer_weights(m, l);
    if (res == weftSuccess)
      res = train_dev_launched(train_kern_linear(m->d.wf, m->d.bf, m->d.act[l], m->d.act[l + 1],
                                                 n, in, out, !last, m->stream),
                               "a layer's forward");
    if (res == weftSuccess && !last) res = dev_release(m, l);
  }
  if (res != weftSuccess) return res;
  int outw = o->widths[o->nlayers];
  return train_dev_copy(m->act[o->nlayers], m->d.act[o->nlayers],
                        (size_t)n * outw * sizeof(float));
}

/* Layer l's gradients into the context (times scale), then, below the
 * first layer, the delta of the layer under it. */
static weftResult_t dev_layer_backward(struct model *m, int l, int n, float scale) {
  const struct train_opts *o = m->o;
  int in = o->widths[l], out = o->widths[l + 1], kind = dev_kind(o->dtype);
  weftResult_t res = train_dev_launched(
      train_kern_grad(m->d.delta, m->d.act[l], m->d.gw, m->d.gb, n, in, out, scale, m->stream),
      "a layer's gradients");
  void *gw = NULL, *gb = NULL;
  if (res == weftSuccess) res = weftZeroGrad(m->zero, m->pw[l], &gw);
  if (res == weftSuccess) res = weftZeroGrad(m->zero, m->pb[l], &gb);
  if (res == weftSuccess)
    res = train_dev_launched(
        train_kern_accumulate(gw, kind, m->d.gw, (size_t)in * out, m->stream), "adding gradients");
  if (res == weftSuccess)
    res = train_dev_launched(train_kern_accumulate(gb, kind, m->d.gb, (size_t)out, m->stream),
                             "adding gradients");
  if (res != weftSuccess || l == 0) return res;
  res = train_dev_launched(train_kern_back_delta(m->d.delta, m->d.wf, m->d.act[l],
                                                 m->d.delta_prev, n, in, out, m->stream),
                           "a layer's backward");
  float *t = m->d.delta;
  m->d.delta = m->d.delta_prev;
  m->d.delta_prev = t;
  return res;
}

weftResult_t dev_backward(struct model *m, int n, float scale) {
  const struct train_opts *o = m->o;
  int outw = o->widths[o->nlayers];
  size_t count = (size_t)n * outw;
  weftResult_t res = train_dev_copy(m->d.target, m->target, count * sizeof(float));
  if (res == weftSuccess)
    res = train_dev_launched(train_kern_out_delta(m->d.act[o->nlayers], m->d.target, m->d.delta,
                                                  count, (float)(n * outw), m->stream),
                             "the loss's gradient");
  for (int l = o->nlayers - 1; l >= 0 && res == weftSuccess; l--) {
    res = dev_layer_weights(m, l);
    if (res == weftSuccess) res = dev_layer_backward(m, l, n, scale);
    if (res == weftSuccess) res = dev_release(m, l);
    if (res == weftSuccess) res = weftZeroGradReady(m->zero, l, m->stream);
  }
  return res;
}

#else

/* No GPU side without CUDA: train_dev_open refuses before any is used. */
weftResult_t dev_model_alloc(struct model *m, int maxw) {
  (void)m, (void)maxw;
  return weftInvalidUsage;
}
void dev_model_free(struct model *m) { (void)m; }
weftResult_t dev_forward(struct model *m, int n) {
  (void)m, (void)n;
  return weftInvalidUsage;
}
weftResult_t dev_backward(struct model *m, int n, float scale) {
  (void)m, (void)n, (void)scale;
  return weftInvalidUsage;
}

#endif
