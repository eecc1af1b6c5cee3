/* weft-train's model and loop: a tanh MLP in plain C, trained on data it
 * generates, with its parameters held by a weft ZeRO context. The tests
 * call train_run directly. */
#ifndef WEFT_TRAIN_MODEL_H
#define WEFT_TRAIN_MODEL_H

#include <stdio.h>

#include "train_opts.h"
#include "weft.h"
#include "weft_zero.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Defaults: stage 0, 10 steps, seed 1, fp32, AdamW lr 1e-2, 1 micro-step,
 * global batch 24, layers 12-37-29-3. */
void train_opts_defaults(struct train_opts *o);

struct train_result {
  double first_loss, final_loss; /* mean over the global batch */
  double l2, sum;                /* over the full fp32 parameters */
  float *params;                 /* the full parameters (malloc; free it) */
  size_t nparams;
  weftZeroMemory_t memory;       /* this rank's report after the last step */
  long steps_done;               /* the step count after the last step (a resumed run's too) */
  long steps_run;                /* steps this run took; 0: the losses above are none */
};

/* Trains on comm. Collective. Returns weftSuccess or the first failure,
 * with text in weftZeroLastError(). */
weftResult_t train_run(weftComm_t comm, const struct train_opts *o, struct train_result *res);

#ifdef __cplusplus
}
#endif
/* Fills out's params (every parameter, gathered; out->memory.psi of them),
 * their L2 norm and sum: the final line both models print. Collective. */
weftResult_t train_result_params(weftZero_t zero, weftStream_t stream, struct train_result *out);

#endif
