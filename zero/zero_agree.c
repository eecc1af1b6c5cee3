/* What every rank of a context must agree on, compared where a difference
 * would otherwise pass silently: the configuration, the parameters' layout,
 * weight decays and initial values at weftZeroFinalize (7 and 8 elements
 * pad alike, so the collectives' own size checks pass), and each step's order of
 * reductions and learning rate (two layers of one size marked in another
 * order pair one rank's gradients of one with another's of the other). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"

/* 64-bit mixing of words (a multiply and a rotate a word): collisions of
 * distinct models are what a check can miss, at 2^-64 a pair. */
static uint64_t mix(uint64_t h, uint64_t w) {
  h ^= w * 0x9e3779b97f4a7c15ull;
  h = (h << 27 | h >> 37) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 31);
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = mix(h, w);
  }
  uint64_t tail = 0;
  memcpy(&tail, b + i, n - i);
  return mix(h, tail ^ (uint64_t)n << 56);
}

/* --- weftZeroFinalize ----------------------------------------------------- */

enum field_kind { F_INT, F_REAL, F_BYTES, F_HASH };

struct field {
  const char *name;
  enum field_kind kind;
  double v;     /* F_HASH: the high 32 bits; v2 the low */
  double v2;
};

/* The fields compared: those that change results or the collectives' order
 * (bucketBytes plans stage 0's buckets; the gather bound and prefetch queue
 * stage 3's gathers). Memory kind and offload are a rank's own. */
static size_t model_fields(const struct weftZero *z, struct field *f) {
  const weftZeroConfig_t *c = &z->cfg;
  uint64_t layout = 0x6c61796f7574ull, decay = 0x6465636179ull;
  for (size_t i = 0; i < z->nparams; i++) {
    layout = mix(mix(layout, (uint64_t)z->params[i].layer), (uint64_t)z->params[i].count);
    uint64_t bits;
    memcpy(&bits, &z->params[i].weight_decay, sizeof bits);
    decay = mix(decay, bits);
  }
  const uint64_t init =
      z->psi > 0 ? hash_bytes(0x696e6974ull, z->init, z->psi * sizeof *z->init) : 0;
  size_t n = 0;
  f[n++] = (struct field){"stage", F_INT, c->stage, 0};
  f[n++] = (struct field){"paramType", F_INT, c->paramType, 0};
  f[n++] = (struct field){"reduceType", F_INT, c->reduceType, 0};
  f[n++] = (struct field){"optimizer", F_INT, c->optimizer, 0};
  f[n++] = (struct field){"lr", F_REAL, c->lr, 0};
  f[n++] = (struct field){"beta1", F_REAL, c->beta1, 0};
  f[n++] = (struct field){"beta2", F_REAL, c->beta2, 0};
  f[n++] = (struct field){"eps", F_REAL, c->eps, 0};
  f[n++] = (struct field){"momentum", F_REAL, c->momentum, 0};
  f[n++] = (struct field){"weightDecay", F_REAL, c->weightDecay, 0};
  f[n++] = (struct field){"maxGradNorm", F_REAL, c->maxGradNorm > 0 ? c->maxGradNorm : 0, 0};
  f[n++] = (struct field){"accumSteps", F_INT, c->accumSteps, 0};
  f[n++] = (struct field){"reduceEveryMicroStep", F_INT, c->reduceEveryMicroStep, 0};
  f[n++] = (struct field){"lossScale", F_REAL, z->loss_scale, 0};
  f[n++] = (struct field){"lossScaleWindow", F_INT,
                          c->paramType == weftFloat16 ? c->lossScaleWindow : 0, 0};
  f[n++] = (struct field){"bucketBytes (stage 0's buckets)", F_BYTES,
                          c->stage == 0 ? (double)c->bucketBytes : 0, 0};
  f[n++] = (struct field){"gatherBoundBytes", F_BYTES,
                          c->stage == 3 ? (double)c->gatherBoundBytes : 0, 0};
  f[n++] = (struct field){"prefetchLayers", F_INT, c->stage == 3 ? c->prefetchLayers : 0, 0};
  f[n++] = (struct field){"layers", F_INT, z->nlayers, 0};
  f[n++] = (struct field){"parameters", F_BYTES, (double)z->nparams, 0};
  f[n++] = (struct field){"elements", F_BYTES, (double)z->psi, 0};
  f[n++] = (struct field){"parameters' layers and sizes (hashed)", F_HASH,
                          (double)(layout >> 32), (double)(uint32_t)layout};
  f[n++] = (struct field){"parameters' weight decays (weftZeroSetParamWeightDecay, hashed)",
                          F_HASH, (double)(decay >> 32), (double)(uint32_t)decay};
  f[n++] = (struct field){"initial values (hashed)", F_HASH, (double)(init >> 32),
                          (double)(uint32_t)init};
  return n;
}

#define MODEL_FIELDS_MAX 32

/* The shortest text that reads back as v. */
static void real_text(double v, char *out, size_t len) {
  for (int digits = 6; digits <= 17; digits++) {
    snprintf(out, len, "%.*g", digits, v);
    if (strtod(out, NULL) == v) return;
  }
}

static void field_text(const struct field *f, double v, double v2, char *out, size_t len) {
  if (f->kind == F_HASH)
    snprintf(out, len, "%08" PRIx32 "%08" PRIx32, (uint32_t)v, (uint32_t)v2);
  else if (f->kind == F_REAL) real_text(v, out, len);
  else snprintf(out, len, "%.0f", v);
}

weftResult_t zero_agree_model(struct weftZero *z) {
  struct field f[MODEL_FIELDS_MAX];
  const size_t n = model_fields(z, f);
  /* the largest of v and of -v over the ranks: a field differs where they
   * are not each other's negation (every value is exact in a double) */
  double vals[4 * MODEL_FIELDS_MAX];
  for (size_t i = 0; i < n; i++) {
    vals[4 * i] = f[i].v;
    vals[4 * i + 1] = -f[i].v;
    vals[4 * i + 2] = f[i].v2;
    vals[4 * i + 3] = -f[i].v2;
  }
  WEFT_TRY(zero_allreduce_max(z, vals, 4 * n, NULL));
  char text[1536];
  size_t len = 0;
  int differ = 0;
  for (size_t i = 0; i < n; i++) {
    const double *r = &vals[4 * i];
    if (r[0] == -r[1] && r[2] == -r[3]) continue;
    char mine[40], lo[40], hi[40];
    field_text(&f[i], f[i].v, f[i].v2, mine, sizeof mine);
    if (f[i].kind == F_HASH)
      len += (size_t)snprintf(text + len, sizeof text - len, "%s%s: this rank's is %s, another's "
                              "differs", differ ? "; " : "", f[i].name, mine);
    else {
      field_text(&f[i], -r[1], 0, lo, sizeof lo);
      field_text(&f[i], r[0], 0, hi, sizeof hi);
      len += (size_t)snprintf(text + len, sizeof text - len, "%s%s: this rank has %s, the ranks "
                              "%s to %s", differ ? "; " : "", f[i].name, mine, lo, hi);
    }
    differ = 1;
    if (len >= sizeof text) break;
  }
  if (!differ) return weftSuccess;
  return zero_fail(weftInvalidUsage,
                   "weftZeroFinalize: the ranks' contexts differ (every rank creates its context "
                   "with the same configuration and adds the same parameters with the same "
                   "initial values): %s",
                   text);
}

/* --- weftZeroStep --------------------------------------------------------- */

/* Each value v < 2^16 as the pair (v, v*v): summed over n ranks (exact for
 * n < 2^21), the ranks agree exactly where the sums are n*v and n*v*v for
 * this rank's v (their squared deviations from v then sum to 0). */
static void pair(double *out, uint32_t v) {
  out[0] = v;
  out[1] = (double)v * v;
}

void zero_agree_step_values(const struct weftZero *z, double out[ZERO_AGREE_STEP_N]) {
  const uint64_t order = mix(z->step_order, (uint64_t)z->step_reductions);
  uint64_t lr_bits;
  memcpy(&lr_bits, &z->cfg.lr, sizeof lr_bits);
  const uint64_t lr = mix(0x6c72ull, lr_bits);
  pair(out, (uint32_t)(order & 0xffff));
  pair(out + 2, (uint32_t)(order >> 16 & 0xffff));
  pair(out + 4, (uint32_t)(lr & 0xffff));
  pair(out + 6, (uint32_t)(lr >> 16 & 0xffff));
}

weftResult_t zero_agree_step_check(struct weftZero *z, const double sums[ZERO_AGREE_STEP_N]) {
  double mine[ZERO_AGREE_STEP_N];
  zero_agree_step_values(z, mine);
  const double n = z->nranks;
  int order_differs = 0, lr_differs = 0;
  for (int i = 0; i < ZERO_AGREE_STEP_N; i += 2) {
    const int differs = sums[i] != n * mine[i] || sums[i + 1] != n * mine[i + 1];
    if (i < 4) order_differs |= differs;
    else lr_differs |= differs;
  }
  if (!order_differs && !lr_differs) return weftSuccess;
  char text[512];
  size_t len = 0;
  if (order_differs)
    len += (size_t)snprintf(text, sizeof text,
                            "the ranks queued their gradient reductions in different orders "
                            "(this rank queued %ld, of %s in the order it marked them ready): "
                            "their collectives paired one rank's gradients of one %s with "
                            "another's of another; mark layers ready in the same order on every "
                            "rank",
                            z->step_reductions, z->cfg.stage == 0 ? "buckets" : "layers",
                            z->cfg.stage == 0 ? "bucket" : "layer");
  if (lr_differs && len < sizeof text) {
    char lr[40];
    real_text(z->cfg.lr, lr, sizeof lr);
    snprintf(text + len, sizeof text - len,
             "%sthe ranks' learning rates differ (this rank's is %s): weftZeroSetLr must set "
             "the same rate on every rank",
             len ? "; " : "", lr);
  }
  return zero_fail(weftInvalidUsage, "%s", text);
}
