/* weft-train's model and loop: a tanh MLP in plain C, trained on data it
 * generates, with its parameters held by a weft ZeRO context. The tests
 * call train_run directly. */
#ifndef WEFT_TRAIN_MODEL_H
#define WEFT_TRAIN_MODEL_H

#include <stdio.h>

#include "weft.h"
#include "weft_zero.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* Defaults: stage 0, 10 steps, seed 1, fp32, AdamW lr 1e-2, 1 micro-step,
 * global batch 24, layers 12-37-29-3. */
void train_opts_defaults(struct train_opts *o);

struct train_result {
  double first_loss, final_loss; /* mean over the global batch */
  double l2, sum;                /* over the full fp32 parameters */
  float *params;                 /* the full parameters (malloc; free it) */
  size_t nparams;
  weftZeroMemory_t memory;       /* this rank's report after the last step */
  long steps_done;
};

/* Trains on comm. Collective. Returns weftSuccess or the first failure,
 * with text in weftZeroLastError(). */
weftResult_t train_run(weftComm_t comm, const struct train_opts *o, struct train_result *res);

#ifdef __cplusplus
}
#endif
#endif
