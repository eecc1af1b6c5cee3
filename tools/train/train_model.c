/* weft-train's MLP: tanh hidden layers, a linear output, mean squared error
 * against a fixed random teacher on generated inputs. Each linear layer
 * (weights, then biases) is one ZeRO layer. */
#include "train_model.h"
#include "train_device.h"
#include "train_model_int.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void train_opts_defaults(struct train_opts *o) {
  memset(o, 0, sizeof *o);
  o->stage = 0;
  o->steps = 10;
  o->seed = 1;
  o->dtype = weftFloat32;
  o->reduce_type = weftFloat32;
  o->optimizer = weftZeroAdamW;
  o->accum = 1;
  o->global_batch = 24;
  o->lr = 1e-2;
  o->clip = 0;
  o->skip_limit = TRAIN_SKIP_LIMIT;
  o->nlayers = 3;
  int widths[] = {12, 37, 29, 3}; /* layers of 481, 1102 and 90 parameters */
  memcpy(o->widths, widths, sizeof widths);
  o->prefetch = 1;
  o->model = TRAIN_MODEL_MLP;
  o->val_every = 20;
  o->val_batches = 2;
  o->sample_len = 96;
  o->temperature = 0.8;
  o->min_lr_frac = 0.1;
}

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-1, 1) from a counter. */
static float uniform_at(uint64_t seed, uint64_t i) {
  return (float)((double)(mix64(seed ^ mix64(i)) >> 11) * 0x1.0p-52 - 1.0);
}

/* all[q*n + i] = rank q's mine[i], complete on return: on the host stream,
 * or through device memory on the CUDA stream (host buffers do not go on a
 * CUDA stream). */
weftResult_t train_gather_doubles(struct model *m, weftComm_t comm, const double *mine,
                                  double *all, size_t n, int nranks) {
  if (n > TRAIN_GATHER_MAX) return weftInvalidArgument; /* the device buffer's share */
  if (!m->dev) {
    weftResult_t res = weftAllGather(mine, all, n, weftFloat64, comm, m->stream);
    return res == weftSuccess ? weftStreamSynchronize(m->stream) : res;
  }
  double *dall = m->dscalars + n;
  weftResult_t res = train_dev_copy(m->dscalars, mine, n * sizeof *mine);
  if (res == weftSuccess) res = weftAllGather(m->dscalars, dall, n, weftFloat64, comm, m->stream);
  if (res == weftSuccess) res = train_dev_copy(all, dall, n * (size_t)nranks * sizeof *all);
  return res;
}

/* --save's directory made as mkdir -p does, and checked writable: 0, or the
 * errno that would fail the save after the last step. */
static int save_dir_make(const char *dir) {
  char path[PATH_MAX];
  const size_t n = strlen(dir);
  if (n == 0) return ENOENT;
  if (n > PATH_MAX - 64) return ENAMETOOLONG; /* weftZeroSave's limit: the shards' names */
  memcpy(path, dir, n + 1);
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    const char was = *p;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return errno;
    *p = was;
    if (was == '\0') break;
  }
  struct stat st;
  if (stat(dir, &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  return access(dir, W_OK | X_OK) != 0 ? errno : 0;
}

weftResult_t train_save_plan(struct model *m, weftComm_t comm, int rank, int nranks, long first,
                             long last, int *save_out) {
  const struct train_opts *o = m->o;
  *save_out = o->save != NULL;
  if (o->save == NULL) return weftSuccess;
  enum { PLAN, DIR_ERRNO, NCOLS };
  /* every rank writes its shard there: every rank makes and checks it */
  double mine[NCOLS] = {1, save_dir_make(o->save)};
  double *all = calloc((size_t)nranks * NCOLS, sizeof *all);
  if (all == NULL) return weftSystemError;
  if (rank == 0 && mine[DIR_ERRNO] == 0) {
    char path[PATH_MAX + 16], current[256] = "", name[64];
    snprintf(path, sizeof path, "%s/LATEST", o->save);
    snprintf(name, sizeof name, "step-%ld", first > last ? first : last);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
      if (fscanf(f, "%255s", current) != 1) current[0] = '\0';
      fclose(f);
    }
    if (strcmp(current, name) == 0) mine[PLAN] = first < last ? -1 : 0;
  }
  weftResult_t res = train_gather_doubles(m, comm, mine, all, NCOLS, nranks);
  const double plan = all[PLAN];
  int bad_rank = -1, bad_errno = 0;
  for (int q = 0; q < nranks && bad_rank < 0; q++)
    if (all[q * NCOLS + DIR_ERRNO] != 0) {
      bad_rank = q;
      bad_errno = (int)all[q * NCOLS + DIR_ERRNO];
    }
  free(all);
  if (res != weftSuccess) return res;
  if (bad_rank >= 0) {
    if (rank == 0)
      fprintf(stderr,
              "weft-train: --save %s: %s (rank %d): no checkpoint could be written there; "
              "refused before the first step\n",
              o->save, strerror(bad_errno), bad_rank);
    return weftInvalidUsage;
  }
  if (plan < 0) {
    if (rank == 0)
      fprintf(stderr,
              "weft-train: --save %s holds the checkpoint of step %ld already, which this run "
              "would save again after its steps (and be refused): save elsewhere, or move it "
              "away\n",
              o->save, last);
    return weftInvalidUsage;
  }
  *save_out = plan > 0;
  if (plan == 0 && rank == 0 && o->log != NULL)
    fprintf(o->log, "# no step to run: %s holds step %ld's checkpoint already; nothing saved\n",
            o->save, last);
  return weftSuccess;
}

double train_lr_at(const struct train_opts *o, long step) {
  if (!o->cosine) return o->lr;
  if (step < o->warmup) return o->lr * (double)(step + 1) / o->warmup;
  if (o->steps <= o->warmup) return o->lr;
  /* 0 at the first step after warm-up, 1 at the last (steps - 1); where the
   * first is the last, 1: the last step runs at the floor */
  const long span = o->steps - 1 - o->warmup;
  const double progress = span > 0 ? (double)(step - o->warmup) / (double)span : 1.0;
  const double low = o->lr * o->min_lr_frac;
  return low + 0.5 * (1.0 + cos(M_PI * progress)) * (o->lr - low);
}

/* The loss's sum over ranks, queued before the step (start) and read after
 * it (end): waited for by its own event on the host; on a GPU the copy back
 * waits for the stream. */
weftResult_t train_loss_reduce_start(struct model *m, weftComm_t comm, double *loss) {
  weftResult_t res;
  if (!m->dev) {
    res = weftAllReduce(loss, loss, 1, weftFloat64, weftSum, comm, m->stream);
    return res == weftSuccess ? weftEventRecord(m->loss_ev, m->stream) : res;
  }
  res = train_dev_copy(m->dscalars, loss, sizeof *loss);
  if (res != weftSuccess) return res;
  return weftAllReduce(m->dscalars, m->dscalars, 1, weftFloat64, weftSum, comm, m->stream);
}

weftResult_t train_loss_reduce_end(struct model *m, double *loss) {
  return m->dev ? train_dev_copy(loss, m->dscalars, sizeof *loss) : weftEventSynchronize(m->loss_ev);
}

/* Sample idx of the stream of data: inputs and the teacher's outputs. */
static void sample_make(const struct model *m, uint64_t idx, float *x, float *y) {
  const struct train_opts *o = m->o;
  int in = o->widths[0], out = o->widths[o->nlayers];
  for (int i = 0; i < in; i++) x[i] = uniform_at(o->seed * 7919 + 17, idx * (uint64_t)in + i);
  for (int j = 0; j < out; j++) {
    double s = 0;
    for (int i = 0; i < in; i++) s += m->teacher[j * in + i] * x[i];
    y[j] = (float)(0.8 * sin(s));
  }
}

/* The layer's parameters, gathered (stage 3) and converted to fp32. */
static weftResult_t layer_weights(struct model *m, int l) {
  const struct train_opts *o = m->o;
  weftEvent_t ready;
  weftResult_t res = weftZeroGather(m->zero, l, m->stream, &ready);
  if (res == weftSuccess) res = weftEventSynchronize(ready);
  void *w = NULL, *b = NULL;
  if (res == weftSuccess) res = weftZeroParam(m->zero, m->pw[l], &w);
  if (res == weftSuccess) res = weftZeroParam(m->zero, m->pb[l], &b);
  if (res != weftSuccess) return res;
  int in = o->widths[l], out = o->widths[l + 1];
  weftZeroToFloat(w, o->dtype, m->wf, (size_t)in * out);
  weftZeroToFloat(b, o->dtype, m->bf, (size_t)out);
  return weftSuccess;
}

static weftResult_t forward(struct model *m, int n) {
  const struct train_opts *o = m->o;
  for (int l = 0; l < o->nlayers; l++) {
    weftResult_t res = layer_weights(m, l);
    if (res != weftSuccess) return res;
    int in = o->widths[l], out = o->widths[l + 1], last = l == o->nlayers - 1;
    for (int s = 0; s < n; s++) {
      const float *x = m->act[l] + (size_t)s * in;
      float *y = m->act[l + 1] + (size_t)s * out;
      for (int j = 0; j < out; j++) {
        float acc = m->bf[j];
        for (int i = 0; i < in; i++) acc += m->wf[j * in + i] * x[i];
        y[j] = last ? acc : tanhf(acc);
      }
    }
    if (!last && (res = weftZeroReleaseOn(m->zero, l, m->stream)) != weftSuccess) return res;
  }
  return weftSuccess;
}

/* Backward from the loss, layer by layer: gradients go to the context and
 * each layer is marked ready as soon as it is done. */
static weftResult_t backward(struct model *m, int n, float scale) {
  const struct train_opts *o = m->o;
  int outw = o->widths[o->nlayers];
  const float *y = m->act[o->nlayers];
  for (int s = 0; s < n; s++)
    for (int j = 0; j < outw; j++)
      m->delta[s * outw + j] = 2.0f * (y[s * outw + j] - m->target[s * outw + j]) / (float)(n * outw);
  for (int l = o->nlayers - 1; l >= 0; l--) {
    weftResult_t res = layer_weights(m, l);
    if (res != weftSuccess) return res;
    int in = o->widths[l], out = o->widths[l + 1];
    const float *x = m->act[l];
    memset(m->gw, 0, (size_t)in * out * sizeof *m->gw);
    memset(m->gb, 0, (size_t)out * sizeof *m->gb);
    for (int s = 0; s < n; s++)
      for (int j = 0; j < out; j++) {
        float d = m->delta[s * out + j] * scale;
        m->gb[j] += d;
        for (int i = 0; i < in; i++) m->gw[j * in + i] += d * x[s * in + i];
      }
    void *gw, *gb;
    if ((res = weftZeroGrad(m->zero, m->pw[l], &gw)) != weftSuccess ||
        (res = weftZeroGrad(m->zero, m->pb[l], &gb)) != weftSuccess)
      return res;
    weftZeroAccumulate(gw, o->dtype, m->gw, (size_t)in * out);
    weftZeroAccumulate(gb, o->dtype, m->gb, (size_t)out);
    if (l > 0) {
      for (int s = 0; s < n; s++)
        for (int i = 0; i < in; i++) {
          float acc = 0;
          for (int j = 0; j < out; j++) acc += m->delta[s * out + j] * m->wf[j * in + i];
          float a = x[s * in + i];
          m->delta_prev[s * in + i] = acc * (1.0f - a * a);
        }
      float *t = m->delta;
      m->delta = m->delta_prev;
      m->delta_prev = t;
    }
    if ((res = weftZeroReleaseOn(m->zero, l, m->stream)) != weftSuccess) return res;
    if ((res = weftZeroGradReady(m->zero, l, m->stream)) != weftSuccess) return res;
  }
  return weftSuccess;
}

weftResult_t train_result_params(weftZero_t zero, weftStream_t stream, struct train_result *out) {
  out->nparams = out->memory.psi;
  out->params = malloc(out->nparams * sizeof *out->params);
  weftResult_t res =
      out->params == NULL ? weftSystemError : weftZeroGetParams(zero, out->params, stream);
  for (size_t i = 0; i < out->nparams && res == weftSuccess; i++) {
    out->l2 += (double)out->params[i] * out->params[i];
    out->sum += out->params[i];
  }
  out->l2 = sqrt(out->l2);
  return res;
}

void train_report_memory(struct model *m, weftComm_t comm, int rank, int nranks) {
  const struct train_opts *o = m->o;
  weftZeroMemory_t r;
  weftZeroMemoryReport(m->zero, &r);
  enum { NCOLS = 7 };
  _Static_assert((int)NCOLS <= (int)TRAIN_GATHER_MAX,
                 "the gather's device buffer holds NCOLS a rank");
  double mine[NCOLS] = {(double)r.params, (double)r.grads, (double)r.optimizer,
                        (double)r.bucketsPeak, (double)r.gatheredPeak,
                        (double)(r.params + r.grads + r.optimizer), (double)r.offloaded};
  double *all = calloc((size_t)nranks * NCOLS, sizeof *all);
  if (all == NULL) return;
  if (train_gather_doubles(m, comm, mine, all, NCOLS, nranks) == weftSuccess && rank == 0 &&
      o->log != NULL) {
    weftZeroConfig_t cfg;
    train_zero_config(o, &cfg);
    size_t formula = weftZeroMemoryFormulaFor(&cfg, r.psiPadded, nranks);
    fprintf(o->log,
            "# memory per rank in bytes: psi %zu, padded %zu; ZeRO formula for stage %d: %zu\n",
            r.psi, r.psiPadded, o->stage, formula);
    if (o->offload_optimizer)
      fprintf(o->log,
              "# the optimizer state is offloaded: optimizer and host-pinned (the state and "
              "the step's staging) are host memory, the rest the GPU's\n");
    fprintf(o->log, "# %4s %10s %10s %10s %12s %13s %10s%s\n", "rank", "params", "grads",
            "optimizer", "buckets-peak", "gathered-peak", "total",
            o->offload_optimizer ? "  host-pinned" : "");
    for (int q = 0; q < nranks; q++) {
      const double *v = all + q * NCOLS;
      fprintf(o->log, "  %4d %10.0f %10.0f %10.0f %12.0f %13.0f %10.0f", q, v[0], v[1], v[2],
              v[3], v[4], v[5]);
      if (o->offload_optimizer) fprintf(o->log, " %12.0f", v[6]);
      fprintf(o->log, "\n");
    }
  }
  free(all);
}

void train_zero_config(const struct train_opts *o, weftZeroConfig_t *cfg) {
  weftZeroConfigDefaults(cfg);
  cfg->stage = o->stage;
  cfg->paramType = o->dtype;
  cfg->reduceType = o->reduce_type;
  cfg->optimizer = o->optimizer;
  cfg->lr = o->lr;
  cfg->maxGradNorm = o->clip;
  cfg->accumSteps = o->accum;
  cfg->reduceEveryMicroStep = o->reduce_every;
  cfg->gatherBoundBytes = o->gather_bound;
  cfg->prefetchLayers = o->prefetch;
}

static weftResult_t model_setup(struct model *m, weftComm_t comm) {
  const struct train_opts *o = m->o;
  weftZeroConfig_t cfg;
  train_zero_config(o, &cfg);
  cfg.bucketBytes = 4096; /* small buckets, so that even this model has several */
  cfg.memory = m->dev ? weftZeroDeviceMemory : weftZeroHostMemory;
  cfg.offloadOptimizer = o->offload_optimizer;
  weftResult_t res = weftZeroCreate(&m->zero, comm, &cfg);
  if (res != weftSuccess) return res;
  int in0 = o->widths[0], maxw = 0;
  for (int l = 0; l <= o->nlayers; l++) maxw = o->widths[l] > maxw ? o->widths[l] : maxw;
  int outw = o->widths[o->nlayers];
  m->teacher = malloc((size_t)outw * in0 * sizeof *m->teacher);
  float *init = malloc((size_t)maxw * maxw * sizeof *init);
  if (m->teacher == NULL || init == NULL) {
    fprintf(stderr, "weft-train: out of memory for a layer of %d x %d\n", maxw, maxw);
    free(init);
    return weftSystemError;
  }
  for (int i = 0; i < outw * in0; i++) m->teacher[i] = 0.5f * uniform_at(o->seed + 4242, (uint64_t)i);
  for (int l = 0; l < o->nlayers && res == weftSuccess; l++) {
    int in = o->widths[l], out = o->widths[l + 1];
    float bound = 1.0f / sqrtf((float)in);
    for (int i = 0; i < in * out; i++)
      init[i] = bound * uniform_at(o->seed * 31 + 2 * l, (uint64_t)i);
    res = weftZeroAddParam(m->zero, l, (size_t)in * out, init, &m->pw[l]);
    /* the weights decay, the biases not (the configuration's 0) */
    if (res == weftSuccess)
      res = weftZeroSetParamWeightDecay(m->zero, m->pw[l], o->weight_decay);
    for (int j = 0; j < out; j++) init[j] = 0.1f * uniform_at(o->seed * 31 + 2 * l + 1, (uint64_t)j);
    if (res == weftSuccess) res = weftZeroAddParam(m->zero, l, (size_t)out, init, &m->pb[l]);
  }
  free(init);
  if (res == weftSuccess) res = weftZeroFinalize(m->zero);
  size_t nb = (size_t)m->batch;
  for (int l = 0; l <= o->nlayers; l++) m->act[l] = malloc(nb * o->widths[l] * sizeof(float));
  m->delta = malloc(nb * maxw * sizeof(float));
  m->delta_prev = malloc(nb * maxw * sizeof(float));
  m->wf = malloc((size_t)maxw * maxw * sizeof(float));
  m->bf = malloc((size_t)maxw * sizeof(float));
  m->gw = malloc((size_t)maxw * maxw * sizeof(float));
  m->gb = malloc((size_t)maxw * sizeof(float));
  m->target = malloc(nb * outw * sizeof(float));
  int missing = m->teacher == NULL || m->delta == NULL || m->delta_prev == NULL ||
                m->wf == NULL || m->bf == NULL || m->gw == NULL || m->gb == NULL ||
                m->target == NULL;
  for (int l = 0; l <= o->nlayers; l++) missing |= m->act[l] == NULL;
  if (res == weftSuccess && missing) {
    fprintf(stderr, "weft-train: out of memory\n");
    res = weftSystemError;
  }
  if (res == weftSuccess && m->dev) res = dev_model_alloc(m, maxw);
  return res;
}

static void model_free(struct model *m) {
  if (m->zero != NULL) weftZeroDestroy(m->zero);
  for (int l = 0; l <= TRAIN_MAX_LAYERS; l++) free(m->act[l]);
  free(m->teacher);
  free(m->delta);
  free(m->delta_prev);
  free(m->wf);
  free(m->bf);
  free(m->gw);
  free(m->gb);
  free(m->target);
  if (m->dev) dev_model_free(m);
  train_model_close(m);
}

void train_model_close(struct model *m) {
  if (m->dev) {
    train_dev_free(m->dscalars);
    train_dev_close(m->stream);
  } else if (m->stream != NULL) {
    weftStreamDestroy(m->stream);
  }
  if (m->loss_ev != NULL) weftEventDestroy(m->loss_ev);
  m->dscalars = NULL;
  m->stream = NULL;
  m->loss_ev = NULL;
}

/* The stream (host, or CUDA on the rank's GPU), the loss's event and, on a
 * GPU, the device buffer of host values' collectives. */
weftResult_t train_model_open(struct model *m, int nranks) {
  weftResult_t res;
  if (m->dev) {
    res = train_dev_open(m->o->local_rank, &m->stream);
    if (res == weftSuccess)
      res = train_dev_alloc((void **)&m->dscalars,
                            TRAIN_GATHER_MAX * ((size_t)nranks + 1) * sizeof(double));
  } else {
    res = weftStreamCreate(&m->stream);
  }
  return res == weftSuccess ? weftEventCreate(&m->loss_ev) : res;
}

weftResult_t train_run(weftComm_t comm, const struct train_opts *o, struct train_result *out) {
  int rank, nranks;
  memset(out, 0, sizeof *out);
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  if (o->nlayers < 1 || o->nlayers > TRAIN_MAX_LAYERS) {
    fprintf(stderr, "weft-train: %d layers: 1 to %d\n", o->nlayers, TRAIN_MAX_LAYERS);
    return weftInvalidArgument;
  }
  if (o->accum < 1) {
    fprintf(stderr, "weft-train: --accum %d: at least 1\n", o->accum);
    return weftInvalidArgument;
  }
  if (o->global_batch % ((long long)o->accum * nranks) != 0) {
    fprintf(stderr, "weft-train: --batch %d does not divide by --accum %d x %d ranks: a rank's "
                    "micro-step takes batch / (accum x ranks) samples\n",
            o->global_batch, o->accum, nranks);
    return weftInvalidArgument;
  }
  for (int l = 0; l <= o->nlayers; l++)
    if (o->widths[l] < 1 || o->widths[l] > TRAIN_MAX_WIDTH) {
      fprintf(stderr, "weft-train: width %d: 1 to %d (width x width weights are indexed by int)\n",
              o->widths[l], TRAIN_MAX_WIDTH);
      return weftInvalidArgument;
    }
  if (o->stage == 3 && o->gather_bound > 0) { /* a layer is gathered at a time */
    size_t least = 0, elsize = o->dtype == weftFloat32 ? 4 : 2;
    for (int l = 0; l < o->nlayers; l++) {
      size_t count = (size_t)o->widths[l] * o->widths[l + 1] + (size_t)o->widths[l + 1];
      size_t nbytes = weftZeroPadded(count, nranks) * elsize;
      least = nbytes > least ? nbytes : least;
    }
    if (o->gather_bound < least) {
      if (rank == 0)
        fprintf(stderr, "weft-train: --gather-bound %zu: at least %zu bytes, the largest layer "
                        "(%s on %d ranks)\n",
                o->gather_bound, least,
                o->dtype == weftBfloat16 ? "bf16" : o->dtype == weftFloat16 ? "fp16" : "fp32",
                nranks);
      return weftInvalidArgument;
    }
  }
  struct model m;
  memset(&m, 0, sizeof m);
  m.o = o;
  m.batch = o->global_batch / (o->accum * nranks);
  m.dev = o->device;
  weftResult_t res = train_model_open(&m, nranks);
  if (res == weftSuccess) res = model_setup(&m, comm);
  if (res == weftSuccess && o->resume != NULL) res = weftZeroLoad(m.zero, o->resume, m.stream);
  int in = o->widths[0], outw = o->widths[o->nlayers];
  long first = res == weftSuccess ? weftZeroStepCount(m.zero) : 0;
  if (rank == 0 && o->log != NULL && res == weftSuccess) {
    weftZeroMemory_t r;
    weftZeroMemoryReport(m.zero, &r);
    fprintf(o->log, "# weft-train: %d ranks, stage %d, %s, %s, %zu parameters in %d layers, "
                    "global batch %d, accum %d, from step %ld\n",
            nranks, o->stage,
            o->dtype == weftBfloat16 ? "bf16" : o->dtype == weftFloat16 ? "fp16" : "fp32",
            o->optimizer == weftZeroAdamW ? "adamw" : "sgd-momentum", r.psi, o->nlayers,
            o->global_batch, o->accum, first);
  }
  double loss = 0; /* outlives the loop: its all-reduce may be queued when a step fails */
  long last = o->stop_at > 0 && o->stop_at < o->steps ? o->stop_at : o->steps;
  int save = 0;
  if (res == weftSuccess) res = train_save_plan(&m, comm, rank, nranks, first, last, &save);
  int skipped_run = 0; /* steps skipped in a row */
  for (long step = first; step < last && res == weftSuccess; step++) {
    loss = 0;
    res = weftZeroSetLr(m.zero, train_lr_at(o, step));
    for (int micro = 0; micro < o->accum && res == weftSuccess; micro++) {
      weftZeroSetSync(m.zero, micro == o->accum - 1);
      uint64_t base = ((uint64_t)step * o->accum + micro) * (uint64_t)(m.batch * nranks) +
                      (uint64_t)rank * m.batch;
      for (int s = 0; s < m.batch; s++)
        sample_make(&m, base + s, m.act[0] + (size_t)s * in, m.target + (size_t)s * outw);
      res = m.dev ? dev_forward(&m, m.batch) : forward(&m, m.batch);
      if (res != weftSuccess) break;
      double l = 0;
      const float *y = m.act[o->nlayers];
      for (int i = 0; i < m.batch * outw; i++) {
        double d = (double)y[i] - m.target[i];
        l += d * d;
      }
      loss += l / (m.batch * outw);
      float scale = (float)weftZeroLossScale(m.zero);
      res = m.dev ? dev_backward(&m, m.batch, scale) : backward(&m, m.batch, scale);
    }
    /* the loss's all-reduce is queued before the step and waited for by its
     * own event: nothing after the step waits for the parameter gathers it
     * leaves in flight (stages 1-2), which the next forward overlaps */
    weftZeroStepInfo_t info;
    if (res == weftSuccess) res = train_loss_reduce_start(&m, comm, &loss);
    if (res == weftSuccess) res = weftZeroStep(m.zero, m.stream, &info);
    if (res == weftSuccess) res = train_loss_reduce_end(&m, &loss);
    if (res != weftSuccess) break;
    loss /= (double)nranks * o->accum;
    if (step == first) out->first_loss = loss;
    out->final_loss = loss;
    out->steps_run++;
    if (rank == 0 && o->log != NULL)
      fprintf(o->log, "step %4ld loss %.6f grad-norm %.4g%s\n", step + 1, loss, info.gradNorm,
              train_opts_skip_note(o, &info));
    if (train_opts_skips_fail(o, &info, step + 1, &skipped_run, rank == 0 ? stderr : NULL))
      res = weftInvalidUsage;
  }
  if (res == weftSuccess) {
    out->steps_done = weftZeroStepCount(m.zero);
    weftZeroMemoryReport(m.zero, &out->memory);
    train_report_memory(&m, comm, rank, nranks);
    res = train_result_params(m.zero, m.stream, out);
  }
  if (res == weftSuccess && save) res = weftZeroSave(m.zero, o->save, m.stream);
  model_free(&m);
  return res;
}
