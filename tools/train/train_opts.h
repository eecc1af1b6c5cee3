/* weft-train's options: what the command line sets and the model, the
 * training loop (train_model.h) and the GPU side (train_model_int.h) read. */
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
  int val_batches;
  int sample_len;       /* bytes generated at the end (0: none) */
  double temperature;   /* of the sample; 0: greedy */
  int cosine;           /* learning rate: warm-up then cosine down to lr * min_lr_frac */
  int warmup;
  double min_lr_frac;
  const char *dump_init;    /* rank 0 writes the parameters before the first step here */
  const char *dump_batches; /* rank 0 writes every micro-step's global batch here */
};

#endif
