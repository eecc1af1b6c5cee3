/* weft-train's transformer (train_gpt.h): its parameters in ZeRO layers,
 * forward and backward through an executor (train_gpt_exec.h: the host, a
 * GPU, or the GPU's kernels simulated on the host), and the loop: batches
 * from the token file, a learning-rate schedule, validation, a generated
 * sample at the end. */
#include "train_gpt.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "train_blas.h"
#include "train_data.h"
#include "train_device.h"
#include "train_gpt_exec.h"
#include "train_model_int.h"

enum { LN1W, LN1B, QKVW, QKVB, ATTPW, ATTPB, LN2W, LN2B, FCW, FCB, FCPW, FCPB, BLOCK_TENSORS };
/* where a layer's fp32 views live while it is in use: the embeddings and the
 * final norm stay from the forward's start or end through backward */
enum { SLOT_EMB, SLOT_BLOCK, SLOT_LNF, SLOTS };

struct gpt_acts {
  float *ln1, *mean1, *rstd1, *qkv, *att, *atty, *res2, *ln2, *mean2, *rstd2, *fch, *fchg, *res3;
};

struct gpt {
  const struct train_opts *o;
  struct train_gpt_shape s;
  int T, B;                   /* sequence, sequences per rank and micro-step */
  int rank, nranks;
  weftZero_t zero;
  weftStream_t stream;        /* m's: a CUDA stream on a GPU */
  struct model m;             /* the stream, the loss's event, collectives of host values */
  struct gpt_exec x;          /* where the operations run; every array below but
                                 ids, inp, tgt, win and sample is in its memory */
  int *ids;                   /* ids[layer * BLOCK_TENSORS + k] */
  float *w[SLOTS][BLOCK_TENSORS], *dw[SLOTS][BLOCK_TENSORS];
  void *graw[SLOTS][BLOCK_TENSORS];
  float *wbuf[SLOTS], *gbuf[SLOTS]; /* fp32 copies when parameters are bf16/fp16 */
  float *acts, *enc, *lnf, *lnf_mean, *lnf_rstd, *logits;
  struct gpt_acts *blk;
  float *dres, *dln, *dbuf, *dqkv;
  int *inp, *tgt;
  uint8_t *win;
  float *sample;              /* host: one row of logits */
  struct train_data data;
};

int train_gpt_shape_named(const char *name, struct train_gpt_shape *out) {
  static const struct {
    const char *name;
    struct train_gpt_shape s;
  } shapes[] = {
      {"tiny", {5, 4, 128, 64, 256}},    /* 1.03 M parameters */
      {"mid", {6, 6, 384, 256, 256}},    /* 10.8 M */
      {"gpt2", {12, 12, 768, 1024, 256}}, /* GPT-2 small's blocks, byte vocabulary: 85.8 M */
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    if (strcmp(name, shapes[i].name) == 0) {
      *out = shapes[i].s;
      return 0;
    }
  return -1;
}

static int layer_tensors(const struct train_gpt_shape *s, int layer) {
  return layer == 0 || layer == s->layers + 1 ? 2 : BLOCK_TENSORS;
}

static size_t tensor_count(const struct train_gpt_shape *s, int layer, int k) {
  size_t C = (size_t)s->channels;
  if (layer == 0) return (k == 0 ? (size_t)s->vocab : (size_t)s->context) * C;
  if (layer == s->layers + 1) return C;
  static const int rows[BLOCK_TENSORS] = {0, 0, 3, 3, 1, 1, 0, 0, 4, 4, 1, 1};
  static const int cols[BLOCK_TENSORS] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0};
  if (rows[k] == 0) return C;                  /* layer norms */
  return rows[k] * C * (cols[k] ? cols[k] * C : 1); /* weights, biases */
}

size_t train_gpt_param_count(const struct train_gpt_shape *s) {
  size_t n = 0;
  for (int l = 0; l < s->layers + 2; l++)
    for (int k = 0; k < layer_tensors(s, l); k++) n += tensor_count(s, l, k);
  return n;
}

static uint64_t gpt_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* (0, 1] from a counter */
static double gpt_uniform(uint64_t key, uint64_t i) {
  return ((double)(gpt_mix64(key ^ gpt_mix64(i)) >> 11) + 1.0) * 0x1.0p-53;
}

/* GPT-2's initialisation: weights N(0, 0.02), the projections into the
 * residual stream N(0, 0.02 / sqrt(2L)), biases 0, layer norms 1 and 0. */
static void init_tensor(const struct gpt *g, int layer, int k, float *out, size_t n) {
  const struct train_gpt_shape *s = &g->s;
  int block = layer >= 1 && layer <= s->layers;
  float std = 0.02f;
  if (block && (k == ATTPW || k == FCPW)) std = 0.02f / sqrtf(2.0f * (float)s->layers);
  float fill = -1.0f; /* < 0: random */
  if (block && (k == LN1W || k == LN2W)) fill = 1.0f;
  if (block && (k == LN1B || k == LN2B || k == QKVB || k == ATTPB || k == FCB || k == FCPB))
    fill = 0.0f;
  if (layer == s->layers + 1) fill = k == 0 ? 1.0f : 0.0f;
  if (fill >= 0) {
    for (size_t i = 0; i < n; i++) out[i] = fill;
    return;
  }
  uint64_t key = gpt_mix64(g->o->seed * 1000003ull + (uint64_t)layer * 64 + (uint64_t)k);
  for (size_t i = 0; i < n; i += 2) { /* Box-Muller, two at a time */
    double r = sqrt(-2.0 * log(gpt_uniform(key, i))), a = 2 * M_PI * gpt_uniform(key, i + 1);
    out[i] = (float)(std * r * cos(a));
    if (i + 1 < n) out[i + 1] = (float)(std * r * sin(a));
  }
}

/* The layer's parameters as fp32 in the slot: gathered (stage 3), waited for. */
static weftResult_t layer_open(struct gpt *g, int layer, int slot) {
  weftEvent_t ready;
  /* a device context's kernels queued after the gather on its stream wait for it */
  weftResult_t res = weftZeroGather(g->zero, layer, g->stream, g->m.dev ? NULL : &ready);
  if (res == weftSuccess && !g->m.dev) res = weftEventSynchronize(ready);
  size_t off = 0;
  for (int k = 0; k < layer_tensors(&g->s, layer) && res == weftSuccess; k++) {
    void *p;
    size_t n = tensor_count(&g->s, layer, k);
    res = weftZeroParam(g->zero, g->ids[layer * BLOCK_TENSORS + k], &p);
    if (res != weftSuccess) break;
    if (g->o->dtype == weftFloat32) {
      g->w[slot][k] = p;
    } else {
      g->w[slot][k] = g->wbuf[slot] + off;
      gpt_x_to_float(&g->x, p, g->o->dtype, g->w[slot][k], n);
    }
    off += n;
  }
  return res == weftSuccess ? g->x.status : res;
}

/* The layer's gradient buffers as fp32 in the slot (fp32 parameters: the
 * context's own; else zeroed copies that grads_done adds in). */
static weftResult_t grads_open(struct gpt *g, int layer, int slot) {
  size_t off = 0;
  for (int k = 0; k < layer_tensors(&g->s, layer); k++) {
    size_t n = tensor_count(&g->s, layer, k);
    weftResult_t res = weftZeroGrad(g->zero, g->ids[layer * BLOCK_TENSORS + k], &g->graw[slot][k]);
    if (res != weftSuccess) return res;
    if (g->o->dtype == weftFloat32) {
      g->dw[slot][k] = g->graw[slot][k];
    } else {
      g->dw[slot][k] = g->gbuf[slot] + off;
      gpt_x_zero(&g->x, g->dw[slot][k], (long)n);
    }
    off += n;
  }
  return g->x.status;
}

/* The layer is done: its gradients into the context, the parameters given
 * back (stage 3), the reduction queued. */
static weftResult_t grads_done(struct gpt *g, int layer, int slot) {
  if (g->o->dtype != weftFloat32)
    for (int k = 0; k < layer_tensors(&g->s, layer); k++)
      gpt_x_accumulate(&g->x, g->graw[slot][k], g->o->dtype, g->dw[slot][k],
                       tensor_count(&g->s, layer, k));
  if (g->x.status != weftSuccess) return g->x.status;
  weftResult_t res = weftZeroReleaseOn(g->zero, layer, g->stream);
  return res == weftSuccess ? weftZeroGradReady(g->zero, layer, g->stream) : res;
}

static void block_forward(struct gpt *g, int l, const float *in, int B, int T) {
  int C = g->s.channels, n = B * T;
  float **w = g->w[SLOT_BLOCK];
  struct gpt_acts *a = &g->blk[l];
  struct gpt_exec *x = &g->x;
  gpt_x_layernorm_forward(x, a->ln1, a->mean1, a->rstd1, in, w[LN1W], w[LN1B], n, C);
  gpt_x_linear_forward(x, a->qkv, a->ln1, w[QKVW], w[QKVB], n, C, 3 * C);
  gpt_x_attention_forward(x, a->atty, a->att, a->qkv, B, T, C, g->s.heads);
  gpt_x_linear_forward(x, a->res2, a->atty, w[ATTPW], w[ATTPB], n, C, C);
  gpt_x_add(x, a->res2, a->res2, in, (long)n * C);
  gpt_x_layernorm_forward(x, a->ln2, a->mean2, a->rstd2, a->res2, w[LN2W], w[LN2B], n, C);
  gpt_x_linear_forward(x, a->fch, a->ln2, w[FCW], w[FCB], n, C, 4 * C);
  gpt_x_gelu_forward(x, a->fchg, a->fch, (long)n * 4 * C);
  gpt_x_linear_forward(x, a->res3, a->fchg, w[FCPW], w[FCPB], n, 4 * C, C);
  gpt_x_add(x, a->res3, a->res3, a->res2, (long)n * C);
}

/* dres: the gradient of the block's output on entry, of its input on return */
static void block_backward(struct gpt *g, int l, const float *in, int B, int T) {
  int C = g->s.channels, n = B * T;
  float **w = g->w[SLOT_BLOCK], **dw = g->dw[SLOT_BLOCK];
  struct gpt_acts *a = &g->blk[l];
  struct gpt_exec *x = &g->x;
  gpt_x_linear_backward(x, g->dbuf, dw[FCPW], dw[FCPB], g->dres, a->fchg, w[FCPW], n, 4 * C, C);
  gpt_x_gelu_backward(x, g->dbuf, a->fch, (long)n * 4 * C);
  gpt_x_linear_backward(x, g->dln, dw[FCW], dw[FCB], g->dbuf, a->ln2, w[FCW], n, C, 4 * C);
  gpt_x_layernorm_backward(x, g->dres, dw[LN2W], dw[LN2B], g->dln, a->res2, w[LN2W], a->mean2,
                           a->rstd2, n, C);
  gpt_x_linear_backward(x, g->dln, dw[ATTPW], dw[ATTPB], g->dres, a->atty, w[ATTPW], n, C, C);
  gpt_x_attention_backward(x, g->dqkv, g->dln, a->qkv, a->att, B, T, C, g->s.heads);
  gpt_x_linear_backward(x, g->dln, dw[QKVW], dw[QKVB], g->dqkv, a->ln1, w[QKVW], n, C, 3 * C);
  gpt_x_layernorm_backward(x, g->dres, dw[LN1W], dw[LN1B], g->dln, in, w[LN1W], a->mean1,
                           a->rstd1, n, C);
}

/* Forward of g->inp (B x T) to logits; with targets, to probabilities and
 * each token's loss (gpt_x_loss_sum). keep: layers 0 and L+1 stay gathered
 * for backward. */
static weftResult_t forward(struct gpt *g, int B, int T, int with_loss, int keep) {
  const struct train_gpt_shape *s = &g->s;
  int C = s->channels, L = s->layers, n = B * T;
  weftResult_t res = layer_open(g, 0, SLOT_EMB);
  if (res != weftSuccess) return res;
  gpt_x_encoder_forward(&g->x, g->enc, g->w[SLOT_EMB][0], g->w[SLOT_EMB][1], B, T, C);
  const float *x = g->enc;
  for (int l = 0; l < L; l++) {
    if ((res = layer_open(g, 1 + l, SLOT_BLOCK)) != weftSuccess) return res;
    block_forward(g, l, x, B, T);
    if (g->x.status != weftSuccess) return g->x.status;
    if ((res = weftZeroReleaseOn(g->zero, 1 + l, g->stream)) != weftSuccess) return res;
    x = g->blk[l].res3;
  }
  if ((res = layer_open(g, L + 1, SLOT_LNF)) != weftSuccess) return res;
  gpt_x_layernorm_forward(&g->x, g->lnf, g->lnf_mean, g->lnf_rstd, x, g->w[SLOT_LNF][0],
                          g->w[SLOT_LNF][1], n, C);
  /* the output projection is the token embedding */
  gpt_x_linear_forward(&g->x, g->logits, g->lnf, g->w[SLOT_EMB][0], NULL, n, C, s->vocab);
  if (with_loss) gpt_x_softmax_xent_forward(&g->x, g->logits, n, s->vocab);
  if (g->x.status != weftSuccess) return g->x.status;
  if (!keep) {
    if ((res = weftZeroReleaseOn(g->zero, L + 1, g->stream)) != weftSuccess) return res;
    res = weftZeroReleaseOn(g->zero, 0, g->stream);
  }
  return res;
}

/* Backward from forward's probabilities; gradients times scale. */
static weftResult_t backward(struct gpt *g, int B, int T, float scale) {
  const struct train_gpt_shape *s = &g->s;
  int C = s->channels, L = s->layers, n = B * T;
  weftResult_t res = grads_open(g, 0, SLOT_EMB);
  if (res == weftSuccess) res = grads_open(g, L + 1, SLOT_LNF);
  if (res != weftSuccess) return res;
  struct gpt_exec *x = &g->x;
  gpt_x_softmax_xent_backward(x, g->logits, n, s->vocab, scale / (float)n);
  /* the tied embedding's first share of its gradient */
  gpt_x_linear_backward(x, g->dln, g->dw[SLOT_EMB][0], NULL, g->logits, g->lnf, g->w[SLOT_EMB][0],
                        n, C, s->vocab);
  const float *top = L > 0 ? g->blk[L - 1].res3 : g->enc;
  gpt_x_zero(x, g->dres, (long)n * C);
  gpt_x_layernorm_backward(x, g->dres, g->dw[SLOT_LNF][0], g->dw[SLOT_LNF][1], g->dln, top,
                           g->w[SLOT_LNF][0], g->lnf_mean, g->lnf_rstd, n, C);
  if ((res = grads_done(g, L + 1, SLOT_LNF)) != weftSuccess) return res;
  for (int l = L - 1; l >= 0; l--) {
    if ((res = layer_open(g, 1 + l, SLOT_BLOCK)) != weftSuccess) return res;
    if ((res = grads_open(g, 1 + l, SLOT_BLOCK)) != weftSuccess) return res;
    block_backward(g, l, l > 0 ? g->blk[l - 1].res3 : g->enc, B, T);
    if ((res = grads_done(g, 1 + l, SLOT_BLOCK)) != weftSuccess) return res;
  }
  /* the second share, and the position embedding */
  gpt_x_encoder_backward(x, g->dw[SLOT_EMB][0], g->dw[SLOT_EMB][1], g->dres, B, T, C);
  return grads_done(g, 0, SLOT_EMB);
}

static float *carve(float **at, size_t n) {
  float *p = *at;
  *at += n;
  return p;
}

static weftResult_t gpt_alloc(struct gpt *g) {
  const struct train_gpt_shape *s = &g->s;
  size_t C = (size_t)s->channels, L = (size_t)s->layers, n = (size_t)g->B * g->T;
  size_t att = (size_t)g->B * s->heads * g->T * g->T;
  size_t per_block = n * (C + 2 + 3 * C + C + C + C + 2 + 4 * C + 4 * C + C) + att;
  size_t total = L * per_block + n * (2 * C + 2 + s->vocab) + n * (C + C + 4 * C + 3 * C);
  g->acts = gpt_x_alloc(&g->x, total * sizeof(float));
  g->blk = calloc(L + 1, sizeof *g->blk);
  g->inp = malloc(n * sizeof(int));
  g->tgt = malloc(n * sizeof(int));
  g->win = malloc((size_t)g->B * (g->T + 1));
  g->sample = malloc((size_t)s->vocab * sizeof(float));
  size_t maxl = 0;
  for (int l = 0; l < s->layers + 2; l++) {
    size_t c = 0;
    for (int k = 0; k < layer_tensors(s, l); k++) c += tensor_count(s, l, k);
    maxl = c > maxl ? c : maxl;
  }
  int missing = g->acts == NULL || g->blk == NULL || g->inp == NULL || g->tgt == NULL ||
                g->win == NULL || g->sample == NULL;
  if (g->o->dtype != weftFloat32)
    for (int k = 0; k < SLOTS; k++) {
      g->wbuf[k] = gpt_x_alloc(&g->x, maxl * sizeof(float));
      g->gbuf[k] = gpt_x_alloc(&g->x, maxl * sizeof(float));
      missing |= g->wbuf[k] == NULL || g->gbuf[k] == NULL;
    }
  if (missing) {
    fprintf(stderr, "weft-train: out of memory for activations (%zu MiB, %s)\n",
            total * sizeof(float) >> 20, g->x.name);
    return weftSystemError;
  }
  float *at = g->acts;
  for (size_t l = 0; l < L; l++) {
    struct gpt_acts *a = &g->blk[l];
    a->ln1 = carve(&at, n * C);
    a->mean1 = carve(&at, n);
    a->rstd1 = carve(&at, n);
    a->qkv = carve(&at, 3 * n * C);
    a->att = carve(&at, att);
    a->atty = carve(&at, n * C);
    a->res2 = carve(&at, n * C);
    a->ln2 = carve(&at, n * C);
    a->mean2 = carve(&at, n);
    a->rstd2 = carve(&at, n);
    a->fch = carve(&at, 4 * n * C);
    a->fchg = carve(&at, 4 * n * C);
    a->res3 = carve(&at, n * C);
  }
  g->enc = carve(&at, n * C);
  g->lnf = carve(&at, n * C);
  g->lnf_mean = carve(&at, n);
  g->lnf_rstd = carve(&at, n);
  g->logits = carve(&at, n * s->vocab);
  g->dres = carve(&at, n * C);
  g->dln = carve(&at, n * C);
  g->dbuf = carve(&at, 4 * n * C);
  g->dqkv = carve(&at, 3 * n * C);
  return weftSuccess;
}

/* Whether tensor k of layer is a matrix, which --weight-decay decays (as
 * GPT-2's trainers, llm.c among them: the 2-D tensors, the token and
 * position embeddings included; biases and the layer norms' gains and
 * biases not). */
static int tensor_is_matrix(const struct train_gpt_shape *s, int layer, int k) {
  if (layer == 0) return 1; /* the token and position embeddings */
  if (layer == s->layers + 1) return 0; /* the final layer norm */
  return k == QKVW || k == ATTPW || k == FCW || k == FCPW;
}

static void gpt_free(struct gpt *g) {
  if (g->zero != NULL) weftZeroDestroy(g->zero);
  free(g->ids);
  gpt_x_free(&g->x, g->acts);
  free(g->blk);
  free(g->inp);
  free(g->tgt);
  free(g->win);
  free(g->sample);
  for (int k = 0; k < SLOTS; k++) {
    gpt_x_free(&g->x, g->wbuf[k]);
    gpt_x_free(&g->x, g->gbuf[k]);
  }
  gpt_exec_close(&g->x);
  train_model_close(&g->m);
  train_data_close(&g->data);
}

static weftResult_t gpt_setup(struct gpt *g, weftComm_t comm) {
  const struct train_opts *o = g->o;
  const struct train_gpt_shape *s = &g->s;
  weftZeroConfig_t cfg;
  train_zero_config(o, &cfg);
  if (o->stage == 0) {
    /* a bucket a block at most, so that each block's all-reduce overlaps the
     * backward of those below (tiny's five blocks fit one default bucket,
     * whose all-reduce could only start once backward was over) */
    size_t block = 0, elsize = o->dtype == weftFloat32 ? 4 : 2;
    for (int k = 0; k < BLOCK_TENSORS; k++) block += tensor_count(s, 1, k);
    if (s->layers > 0 && block * elsize < cfg.bucketBytes) cfg.bucketBytes = block * elsize;
  }
  cfg.memory = g->m.dev ? weftZeroDeviceMemory : weftZeroHostMemory;
  cfg.offloadOptimizer = o->offload_optimizer;
  g->m.o = o;
  weftResult_t res = train_model_open(&g->m, g->nranks);
  g->stream = g->m.stream;
  /* --device sim: the GPU's kernels on the host, the context in host memory */
  const struct gk_table *kern = g->m.dev ? gk_cuda_table() : o->device_sim ? gk_sim_table() : NULL;
  if (res == weftSuccess) res = gpt_exec_open(&g->x, kern, g->stream, s, g->B, g->T);
  if (res == weftSuccess) res = weftZeroCreate(&g->zero, comm, &cfg);
  if (res != weftSuccess) return res;
  g->ids = calloc((size_t)(s->layers + 2) * BLOCK_TENSORS, sizeof *g->ids);
  size_t maxn = (size_t)s->channels * 4 * s->channels;
  size_t emb = (size_t)(s->vocab > s->context ? s->vocab : s->context) * s->channels;
  float *init = malloc((maxn > emb ? maxn : emb) * sizeof *init);
  if (g->ids == NULL || init == NULL) {
    free(init);
    return weftSystemError;
  }
  for (int l = 0; l < s->layers + 2 && res == weftSuccess; l++)
    for (int k = 0; k < layer_tensors(s, l) && res == weftSuccess; k++) {
      size_t n = tensor_count(s, l, k);
      init_tensor(g, l, k, init, n);
      res = weftZeroAddParam(g->zero, l, n, init, &g->ids[l * BLOCK_TENSORS + k]);
      if (res == weftSuccess && tensor_is_matrix(s, l, k))
        res = weftZeroSetParamWeightDecay(g->zero, g->ids[l * BLOCK_TENSORS + k],
                                          o->weight_decay);
    }
  free(init);
  if (res == weftSuccess) res = weftZeroFinalize(g->zero);
  if (res == weftSuccess) res = gpt_alloc(g);
  return res;
}

/* The batch of this rank at micro-step `micro` (global): inputs and targets. */
static void batch_load(struct gpt *g, uint64_t micro) {
  int T = g->T;
  uint64_t base = micro * (uint64_t)(g->B * g->nranks) + (uint64_t)g->rank * g->B;
  for (int b = 0; b < g->B; b++) {
    uint8_t *w = g->win + (size_t)b * (T + 1);
    train_data_sample(&g->data, g->o->seed, base + b, w);
    for (int t = 0; t < T; t++) {
      g->inp[b * T + t] = w[t];
      g->tgt[b * T + t] = w[t + 1];
    }
  }
  gpt_x_tokens(&g->x, g->inp, g->tgt, g->B, T);
}

/* --dump-batches: rank 0 opens the file and writes its header ("WEFTBAT1",
 * then uint32 sequence, sequences a micro-step, micro-steps a step, first
 * step); every rank learns whether it could before any step, so that none
 * trains alone. Collective. */
static weftResult_t batch_dump_open(struct gpt *g, weftComm_t comm, long first, FILE **dump_out) {
  const char *path = g->o->dump_batches;
  FILE *f = NULL;
  double mine = 0, *all = calloc((size_t)g->nranks, sizeof *all);
  if (all == NULL) return weftSystemError;
  if (g->rank == 0) {
    const uint32_t h[4] = {(uint32_t)g->T, (uint32_t)(g->B * g->nranks), (uint32_t)g->o->accum,
                           (uint32_t)first};
    errno = 0;
    f = fopen(path, "wb");
    if (f == NULL || fwrite("WEFTBAT1", 1, 8, f) != 8 || fwrite(h, sizeof h, 1, f) != 1) {
      mine = errno != 0 ? errno : EIO;
      fprintf(stderr, "weft-train: --dump-batches %s: %s\n", path, strerror((int)mine));
      if (f != NULL) fclose(f);
      f = NULL;
    }
  }
  weftResult_t res = train_gather_doubles(&g->m, comm, &mine, all, 1, g->nranks);
  if (res == weftSuccess && all[0] != 0) res = weftInvalidUsage;
  free(all);
  if (res != weftSuccess && f != NULL) fclose(f);
  if (res == weftSuccess) *dump_out = f;
  return res;
}

/* --dump-batches: rank 0 writes every rank's windows of the micro-step. A
 * failed write fails rank 0's run at once (and the others' with it). */
static weftResult_t batch_dump(struct gpt *g, FILE *f, uint64_t micro) {
  size_t nb = (size_t)g->B * g->nranks, len = (size_t)g->T + 1;
  uint8_t *w = malloc(len);
  if (w == NULL) return weftSystemError;
  int ok = 1;
  for (size_t i = 0; i < nb && ok; i++) {
    train_data_sample(&g->data, g->o->seed, micro * nb + i, w);
    ok = fwrite(w, 1, len, f) == len;
  }
  free(w);
  ok = ok && fflush(f) == 0; /* a full disk fails this step, not the run's end */
  if (ok) return weftSuccess;
  fprintf(stderr, "weft-train: writing --dump-batches %s: %s\n", g->o->dump_batches,
          strerror(errno));
  return weftSystemError;
}

/* How many held-out windows a validation reads: --val-batches global
 * batches of them, at most all. */
static uint64_t val_window_count(const struct gpt *g) {
  const uint64_t all = g->data.val_windows;
  if (g->o->val_batches == TRAIN_VAL_ALL) return all;
  const uint64_t asked = (uint64_t)g->o->val_batches * (uint64_t)g->o->global_batch;
  return asked < all ? asked : all;
}

/* The validation loss: the mean over the tokens of count = val_window_count
 * windows spread evenly over the held-out split (the j-th of them is window
 * j W / count of its W: every one where count is W), rank r forwarding the
 * r-th of nranks contiguous shares of j (the first count % nranks ranks one
 * more) in forwards of at most B sequences. Every rank runs as many
 * forwards (stage 3's gathers are collective): one out of windows forwards
 * a window and drops its loss. So the loss is the same, up to the order of
 * sums, for any --accum and rank count. */
static weftResult_t validate(struct gpt *g, weftComm_t comm, double *loss_out) {
  const int T = g->T;
  const uint64_t count = val_window_count(g), nranks = (uint64_t)g->nranks,
                 rank = (uint64_t)g->rank;
  const uint64_t share = count / nranks, extra = count % nranks;
  const uint64_t mine = share + (rank < extra);
  const uint64_t first = rank * share + (rank < extra ? rank : extra);
  const uint64_t B = (uint64_t)g->B, most = share + (extra > 0), forwards = (most + B - 1) / B;
  double sum = 0;
  for (uint64_t k = 0; k < forwards; k++) {
    const uint64_t at = k * B, left = at < mine ? mine - at : 0;
    const int n = (int)(left < B ? left : B), rows = n > 0 ? n : 1;
    for (int b = 0; b < rows; b++) {
      uint8_t *w = g->win + (size_t)b * (T + 1);
      const uint64_t j = n > 0 ? first + at + (uint64_t)b : 0;
      train_data_val_sample(&g->data, j * g->data.val_windows / count, w);
      for (int t = 0; t < T; t++) {
        g->inp[b * T + t] = w[t];
        g->tgt[b * T + t] = w[t + 1];
      }
    }
    gpt_x_tokens(&g->x, g->inp, g->tgt, rows, T);
    weftResult_t res = forward(g, rows, T, 1, 0);
    if (res == weftSuccess && n > 0) sum += gpt_x_loss_sum(&g->x, rows * T);
    if (res == weftSuccess) res = g->x.status;
    if (res != weftSuccess) return res;
  }
  weftResult_t res = train_loss_reduce_start(&g->m, comm, &sum);
  if (res == weftSuccess) res = train_loss_reduce_end(&g->m, &sum);
  *loss_out = sum / ((double)count * T);
  return res;
}

/* Text from a prompt of the validation split: every rank generates (stage
 * 3's gathers are collective), rank 0 prints. */
static weftResult_t sample_text(struct gpt *g) {
  const struct train_opts *o = g->o;
  /* a quarter of the sequence, 1 to 16 bytes: the first prediction reads
   * the prompt's last position */
  int prompt = g->T / 4 < 1 ? 1 : g->T / 4 < 16 ? g->T / 4 : 16, len = prompt + o->sample_len;
  uint8_t *text = malloc((size_t)len + 1);
  if (text == NULL) return weftSystemError;
  train_data_val_sample(&g->data, 0, g->win);
  memcpy(text, g->win, (size_t)prompt);
  weftResult_t res = weftSuccess;
  for (int i = prompt; i < len && res == weftSuccess; i++) {
    int start = i > g->T ? i - g->T : 0, T = i - start;
    for (int t = 0; t < T; t++) g->inp[t] = text[start + t];
    gpt_x_tokens(&g->x, g->inp, NULL, 1, T);
    res = forward(g, 1, T, 0, 0);
    gpt_x_download(&g->x, g->sample, g->logits + (size_t)(T - 1) * g->s.vocab,
                   (size_t)g->s.vocab * sizeof(float));
    if (res == weftSuccess) res = g->x.status;
    const float *row = g->sample;
    int pick = 0;
    if (o->temperature <= 0) {
      for (int j = 1; j < g->s.vocab; j++) pick = row[j] > row[pick] ? j : pick;
    } else { /* softmax(row / temperature), drawn from the seed */
      double mx = row[0], sum = 0;
      for (int j = 1; j < g->s.vocab; j++) mx = row[j] > mx ? row[j] : mx;
      for (int j = 0; j < g->s.vocab; j++) sum += exp((row[j] - mx) / o->temperature);
      double u = gpt_uniform(o->seed * 7 + 3, (uint64_t)i) * sum, acc = 0;
      for (pick = 0; pick < g->s.vocab - 1; pick++) {
        acc += exp((row[pick] - mx) / o->temperature);
        if (acc >= u) break;
      }
    }
    text[i] = (uint8_t)pick;
  }
  if (res == weftSuccess && g->rank == 0 && o->log != NULL) {
    fprintf(o->log, "# sample (temperature %g; the first %d bytes are the prompt):\n", o->temperature,
            prompt);
    fputs("# ", o->log);
    for (int i = 0; i < len; i++) {
      int c = text[i];
      if (c == '\n') fputs("\n# ", o->log);
      else fputc(c >= 32 && c < 127 ? c : '?', o->log);
    }
    fputc('\n', o->log);
  }
  free(text);
  return res;
}

/* --dump-init: the parameters as weft-zero-consolidate writes them. */
static weftResult_t dump_params(struct gpt *g, const char *path) {
  size_t psi = train_gpt_param_count(&g->s);
  float *p = malloc(psi * sizeof *p);
  if (p == NULL) return weftSystemError;
  weftResult_t res = weftZeroGetParams(g->zero, p, g->stream);
  if (res == weftSuccess && g->rank == 0) {
    errno = 0;
    FILE *f = fopen(path, "wb");
    uint64_t nl = (uint64_t)g->s.layers + 2;
    int ok = f != NULL && fwrite("WEFTZF32", 1, 8, f) == 8 && fwrite(&nl, 8, 1, f) == 1;
    for (int l = 0; l < g->s.layers + 2 && ok; l++) {
      uint64_t c = 0;
      for (int k = 0; k < layer_tensors(&g->s, l); k++) c += tensor_count(&g->s, l, k);
      ok = fwrite(&c, 8, 1, f) == 1;
    }
    ok = ok && fwrite(p, sizeof *p, psi, f) == psi;
    if (f != NULL) ok &= fclose(f) == 0;
    if (!ok) {
      fprintf(stderr, "weft-train: writing --dump-init %s: %s\n", path,
              errno != 0 ? strerror(errno) : "failed");
      res = weftSystemError;
    }
  }
  free(p);
  return res;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Peak resident memory of every rank, in MiB. Collective. */
static weftResult_t report_rss(struct gpt *g, weftComm_t comm) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double mine = (double)ru.ru_maxrss / 1024.0;
  double *all = calloc((size_t)g->nranks, sizeof *all);
  if (all == NULL) return weftSystemError;
  weftResult_t res = train_gather_doubles(&g->m, comm, &mine, all, 1, g->nranks);
  if (res == weftSuccess && g->rank == 0 && g->o->log != NULL) {
    fprintf(g->o->log, "# peak RSS per rank (MiB):");
    for (int q = 0; q < g->nranks; q++) fprintf(g->o->log, " %.0f", all[q]);
    fputc('\n', g->o->log);
  }
  free(all);
  return res;
}

static weftResult_t train_loop(struct gpt *g, weftComm_t comm, struct train_result *out) {
  const struct train_opts *o = g->o;
  long first = weftZeroStepCount(g->zero);
  long last = o->stop_at > 0 && o->stop_at < o->steps ? o->stop_at : o->steps;
  FILE *dump = NULL;
  weftResult_t res = weftSuccess;
  if (o->dump_init != NULL) res = dump_params(g, o->dump_init);
  if (res == weftSuccess && o->dump_batches != NULL) res = batch_dump_open(g, comm, first, &dump);
  double tokens_step = (double)g->B * g->nranks * o->accum * g->T, timed = 0;
  long timed_steps = 0;
  double loss = 0; /* outlives the loop: its all-reduce may be queued when a step fails */
  int skipped_run = 0; /* steps skipped in a row */
  for (long step = first; step < last && res == weftSuccess; step++) {
    double t0 = now_s(), lr = train_lr_at(o, step);
    res = weftZeroSetLr(g->zero, lr);
    loss = 0;
    for (int micro = 0; micro < o->accum && res == weftSuccess; micro++) {
      uint64_t index = (uint64_t)step * o->accum + micro;
      weftZeroSetSync(g->zero, micro == o->accum - 1);
      batch_load(g, index);
      if (dump != NULL) res = batch_dump(g, dump, index);
      if (res == weftSuccess) res = forward(g, g->B, g->T, 1, 1);
      if (res == weftSuccess) res = backward(g, g->B, g->T, (float)weftZeroLossScale(g->zero));
      /* read once backward is queued: the host does not wait in between */
      if (res == weftSuccess) loss += gpt_x_loss_sum(&g->x, g->B * g->T) / ((double)g->B * g->T);
      if (res == weftSuccess) res = g->x.status;
    }
    weftZeroStepInfo_t info;
    if (res == weftSuccess) res = train_loss_reduce_start(&g->m, comm, &loss);
    if (res == weftSuccess) res = weftZeroStep(g->zero, g->stream, &info);
    if (res == weftSuccess) res = train_loss_reduce_end(&g->m, &loss);
    if (res != weftSuccess) break;
    loss /= (double)g->nranks * o->accum;
    double dt = now_s() - t0;
    if (step > first) {
      timed += dt;
      timed_steps++;
    }
    if (step == first) out->first_loss = loss;
    out->final_loss = loss;
    out->steps_run++;
    if (g->rank == 0 && o->log != NULL)
      fprintf(o->log, "step %4ld loss %.6f lr %.3e grad-norm %.4g %8.0f tok/s %7.1f ms%s\n",
              step + 1, loss, lr, info.gradNorm, tokens_step / dt, dt * 1e3,
              train_opts_skip_note(o, &info));
    if (train_opts_skips_fail(o, &info, step + 1, &skipped_run, g->rank == 0 ? stderr : NULL)) {
      res = weftInvalidUsage;
      break;
    }
    if (o->val_every > 0 && o->val_batches != 0 &&
        ((step + 1) % o->val_every == 0 || step + 1 == last)) {
      double vl;
      res = validate(g, comm, &vl);
      if (res == weftSuccess && g->rank == 0 && o->log != NULL)
        fprintf(o->log, "val  %4ld loss %.6f\n", step + 1, vl);
    }
  }
  if (dump != NULL && fclose(dump) != 0 && res == weftSuccess) {
    fprintf(stderr, "weft-train: writing --dump-batches %s: %s\n", o->dump_batches,
            strerror(errno));
    res = weftSystemError;
  }
  if (res == weftSuccess && timed_steps > 0 && g->rank == 0 && o->log != NULL)
    fprintf(o->log, "# %.0f tokens/s over steps %ld-%ld (%.0f tokens a step)\n",
            tokens_step * timed_steps / timed, first + 2, last, tokens_step);
  return res;
}

/* --gather-bound below what stage 3 holds gathered at once: the
 * embeddings (layer 0), held from the forward's start through backward,
 * and the largest other layer (the final norm, held with them, takes the
 * idle buffer of the last block); 1 where refused, with the reason on rank
 * 0's stderr. */
static int gather_bound_refused(const struct gpt *g) {
  const struct train_opts *o = g->o;
  if (o->stage != 3 || o->gather_bound == 0) return 0;
  size_t embeddings = 0, largest = 0, elsize = o->dtype == weftFloat32 ? 4 : 2;
  for (int l = 0; l < g->s.layers + 2; l++) {
    size_t count = 0;
    for (int k = 0; k < layer_tensors(&g->s, l); k++) count += tensor_count(&g->s, l, k);
    const size_t nbytes = weftZeroPadded(count, g->nranks) * elsize;
    if (l == 0) embeddings = nbytes;
    else if (nbytes > largest) largest = nbytes;
  }
  if (o->gather_bound >= embeddings + largest) return 0;
  if (g->rank == 0)
    fprintf(stderr, "weft-train: --gather-bound %zu: at least %zu bytes, the embeddings and a "
                    "block gathered together (%s on %d ranks)\n",
            o->gather_bound, embeddings + largest,
            o->dtype == weftBfloat16 ? "bf16" : o->dtype == weftFloat16 ? "fp16" : "fp32",
            g->nranks);
  return 1;
}

weftResult_t train_gpt_run(weftComm_t comm, const struct train_opts *o, struct train_result *out) {
  struct gpt g;
  memset(&g, 0, sizeof g);
  memset(out, 0, sizeof *out);
  g.o = o;
  g.s = o->gpt;
  g.T = o->seq > 0 ? o->seq : o->gpt.context;
  weftCommUserRank(comm, &g.rank);
  weftCommCount(comm, &g.nranks);
  if (g.s.channels % g.s.heads != 0 || g.s.vocab != 256) {
    fprintf(stderr, "weft-train: %d heads do not divide %d channels, or the vocabulary %d is not "
                    "the bytes' 256\n", g.s.heads, g.s.channels, g.s.vocab);
    return weftInvalidArgument;
  }
  if (g.T > g.s.context) {
    fprintf(stderr, "weft-train: --seq %d: at most the context, %d\n", g.T, g.s.context);
    return weftInvalidArgument;
  }
  if (o->accum < 1) {
    fprintf(stderr, "weft-train: --accum %d: at least 1\n", o->accum);
    return weftInvalidArgument;
  }
  if (o->global_batch % ((long long)o->accum * g.nranks) != 0) {
    fprintf(stderr, "weft-train: --batch %d does not divide by --accum %d x %d ranks: a rank's "
                    "micro-step takes batch / (accum x ranks) sequences\n",
            o->global_batch, o->accum, g.nranks);
    return weftInvalidArgument;
  }
  if (gather_bound_refused(&g)) return weftInvalidArgument;
  g.B = o->global_batch / (o->accum * g.nranks);
  g.m.dev = o->device;
  train_blas_threads_one();
  weftResult_t res = train_data_open(&g.data, o->data, o->tokens, g.T, comm);
  if (res == weftSuccess) res = gpt_setup(&g, comm);
  if (res == weftSuccess && o->resume != NULL) res = weftZeroLoad(g.zero, o->resume, g.stream);
  int save = 0;
  if (res == weftSuccess) {
    const long first = weftZeroStepCount(g.zero);
    const long last = o->stop_at > 0 && o->stop_at < o->steps ? o->stop_at : o->steps;
    res = train_save_plan(&g.m, comm, g.rank, g.nranks, first, last, &save);
  }
  if (res == weftSuccess && g.rank == 0 && o->log != NULL) {
    fprintf(o->log,
            "# weft-train: %d ranks, stage %d, %s, %s, GPT %d layers %d heads %d channels, "
            "context %d, vocabulary %d (bytes): %zu parameters in %d ZeRO layers; sequence %d, "
            "global batch %d, accum %d, from step %ld; data %zu tokens (%zu train: %llu "
            "windows an epoch; validation %llu of %llu windows); %s executor, sgemm: %s\n",
            g.nranks, o->stage,
            o->dtype == weftBfloat16 ? "bf16" : o->dtype == weftFloat16 ? "fp16" : "fp32",
            o->optimizer == weftZeroAdamW ? "adamw" : "sgd-momentum", g.s.layers, g.s.heads,
            g.s.channels, g.s.context, g.s.vocab, train_gpt_param_count(&g.s), g.s.layers + 2,
            g.T, o->global_batch, o->accum, weftZeroStepCount(g.zero), g.data.count,
            g.data.train_count, (unsigned long long)g.data.train_windows,
            (unsigned long long)(o->val_every > 0 ? val_window_count(&g) : 0),
            (unsigned long long)g.data.val_windows, g.x.name, g.x.gemm);
    const char *note = train_blas_pinned_note();
    if (note != NULL) fprintf(o->log, "# %s\n", note);
  }
  if (res == weftSuccess) res = train_loop(&g, comm, out);
  if (res == weftSuccess) {
    g.m.zero = g.zero; /* the memory table's view of this model */
    out->steps_done = weftZeroStepCount(g.zero);
    weftZeroMemoryReport(g.zero, &out->memory);
    train_report_memory(&g.m, comm, g.rank, g.nranks);
    res = report_rss(&g, comm);
  }
  if (res == weftSuccess && o->sample_len > 0) res = sample_text(&g);
  if (res == weftSuccess) {
    res = train_result_params(g.zero, g.stream, out);
  }
  if (res == weftSuccess && save) res = weftZeroSave(g.zero, o->save, g.stream);
  gpt_free(&g);
  return res;
}
