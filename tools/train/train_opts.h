/* weft-train's options: what the command line sets and the model, the
 * training loop (train_model.h) and the GPU side (train_model_int.h) read,
 * and what both loops make of a skipped step. */
#ifndef WEFT_TRAIN_OPTS_H
#define WEFT_TRAIN_OPTS_H

#include <stddef.h>
#include <stdio.h>

#include "weft.h"
#include "weft_zero.h"

#define TRAIN_MAX_LAYERS 8
/* the MLP's widest layer: its width x width weights are indexed by int */
#define TRAIN_MAX_WIDTH 46340
/* --sample: the prompt and the bytes generated are counted in an int */
#define TRAIN_MAX_SAMPLE (1 << 30)
/* --val-batches all: every window of the held-out split */
#define TRAIN_VAL_ALL (-1)
/* --skip-limit's default: steps in a row skipped for a non-finite gradient
 * (fp32, bf16) that end a run */
#define TRAIN_SKIP_LIMIT 3

/* --model: the MLP, or a GPT-2-shaped transformer (train_gpt.h) */
enum train_model_kind { TRAIN_MODEL_MLP = 0, TRAIN_MODEL_GPT = 1 };

/* The transformer's shape: blocks, heads, channels, context, vocabulary. */
struct train_gpt_shape {
  int layers, heads, channels, context, vocab;
};

struct train_opts {
  int stage;
  int steps;            /* total steps; a resumed run continues up to it */
  int stop_at;          /* > 0: stop after this step (the schedule still spans steps) */
  unsigned long seed;
  weftDataType_t dtype;
  weftDataType_t reduce_type;
  weftZeroOptimizer_t optimizer;
  int accum;            /* micro-steps per step */
  int reduce_every;     /* stages 2-3: reduce every micro-step (reduceEveryMicroStep) */
  int global_batch;     /* samples per step over all ranks and micro-steps */
  double lr;
  double clip;          /* max gradient norm; <= 0: none */
  double weight_decay;  /* of the weight matrices (and the transformer's embeddings), as
                           GPT-2's trainers: AdamW's decoupled, SGD's added to the
                           gradient; biases and norms' gains none (default 0: none) */
  int skip_limit;       /* fp32, bf16: steps in a row skipped for a non-finite gradient
                           that fail the run (fp16: one at the least loss scale does) */
  int nlayers;          /* layers of the MLP */
  int widths[TRAIN_MAX_LAYERS + 1]; /* widths[0] inputs ... widths[nlayers] outputs */
  size_t gather_bound;  /* stage 3 */
  int prefetch;
  const char *save;     /* checkpoint directory written after the last step */
  const char *resume;   /* checkpoint directory loaded before the first step */
  FILE *log;            /* rank 0 prints loss per step and the memory table here; may be NULL */
  int device;           /* 1: the model and its ZeRO context on a GPU (--device cuda) */
  int device_sim;       /* the transformer's GPU kernels run on the host (--device sim) */
  int offload_optimizer; /* device: the optimizer state and step on the host (ZeRO-Offload) */
  int local_rank;       /* device: the rank uses GPU local_rank % (visible GPUs) */
  /* the transformer (model TRAIN_MODEL_GPT) */
  enum train_model_kind model;
  struct train_gpt_shape gpt;
  int seq;              /* tokens per sequence, <= gpt.context */
  const char *data;     /* text file; NULL: the files of /usr/share/common-licenses */
  const char *tokens;   /* token file written once from data; NULL: one in $TMPDIR */
  int val_every;        /* validation loss every N steps (0: never), over val_batches */
  int val_batches;      /* global batches of held-out windows (0: none), or TRAIN_VAL_ALL */
  int sample_len;       /* bytes generated at the end (0: none) */
  double temperature;   /* of the sample; 0: greedy */
  int cosine;           /* learning rate: warm-up then cosine down to lr * min_lr_frac */
  int warmup;
  double min_lr_frac;
  const char *dump_init;    /* rank 0 writes the parameters before the first step here */
  const char *dump_batches; /* rank 0 writes every micro-step's global batch here */
};

/* The note on a step's line: the reason it was skipped, or "". */
static inline const char *train_opts_skip_note(const struct train_opts *o,
                                               const weftZeroStepInfo_t *info) {
  if (!info->skipped) return "";
  if (o->dtype != weftFloat16) return " (non-finite gradient: step skipped)";
  return info->lossScale > 1.0 ? " (overflow: skipped, loss scale halved)"
                               : " (overflow: skipped at the least loss scale, 1)";
}

/* After step `step` (from 1) of info: *run counts the steps skipped in a
 * row (0 after an update); 1 where the run must stop, with the reason on
 * why (NULL: not said), the step having been skipped as fp16 at the least
 * loss scale (1), which can fall no further, or as the skip_limit-th in a
 * row in fp32 or bf16, whose scale is 1 throughout. */
static inline int train_opts_skips_fail(const struct train_opts *o, const weftZeroStepInfo_t *info,
                                        long step, int *run, FILE *why) {
  *run = info->skipped ? *run + 1 : 0;
  if (!info->skipped) return 0;
  if (o->dtype == weftFloat16 ? info->lossScale > 1.0 : *run < o->skip_limit) return 0;
  if (why != NULL && o->dtype == weftFloat16)
    fprintf(why, "weft-train: step %ld: the gradient overflowed at fp16's least loss scale, 1: "
                 "the run stops\n", step);
  else if (why != NULL)
    fprintf(why, "weft-train: step %ld: the gradient was not finite in %d steps in a row, each "
                 "skipped (--skip-limit %d): the run stops\n", step, *run, o->skip_limit);
  return 1;
}

#endif
