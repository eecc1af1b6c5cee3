/* weft-train's options: what the command line sets and the model, the
 * training loop (train_model.h) and the GPU side (train_model_int.h) read. */
#ifndef WEFT_TRAIN_OPTS_H
#define WEFT_TRAIN_OPTS_H

#include <stddef.h>
#include <stdio.h>

#include "weft.h"
#include "weft_zero.h"

#define TRAIN_MAX_LAYERS 8

struct train_opts {
  int stage;
  int steps;            /* total steps; a resumed run continues up to it */
  unsigned long seed;
  weftDataType_t dtype;
  weftDataType_t reduce_type;
  weftZeroOptimizer_t optimizer;
  int accum;            /* micro-steps per step */
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
  int device;           /* 1: the MLP and its ZeRO context on a GPU (--device cuda) */
  int local_rank;       /* device: the rank uses GPU local_rank % (visible GPUs) */
};

#endif
