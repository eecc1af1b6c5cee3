/* The model's state, shared by train_model.c (the host's loops and the
 * training loop) and train_model_dev.c (the same on the GPU). */
#ifndef WEFT_TRAIN_MODEL_INT_H
#define WEFT_TRAIN_MODEL_INT_H

#include "train_opts.h"
#include "weft.h"
#include "weft_zero.h"

/* --device cuda: the model's arrays on the GPU, as the host's below */
struct model_dev {
  float *act[TRAIN_MAX_LAYERS + 1];
  float *delta, *delta_prev, *wf, *bf, *gw, *gb;
  float *target;
};

struct model {
  const struct train_opts *o;
  weftZero_t zero;
  weftStream_t stream;
  weftEvent_t loss_ev;          /* the step's loss all-reduce */
  int pw[TRAIN_MAX_LAYERS], pb[TRAIN_MAX_LAYERS];
  float *teacher;               /* outputs x inputs */
  float *act[TRAIN_MAX_LAYERS + 1];
  float *delta, *delta_prev, *wf, *bf, *gw, *gb;
  float *target;
  int batch;                    /* samples per rank per micro-step */
  int dev;                      /* the context is in device memory; stream is a CUDA stream */
  double *dscalars;             /* device: host values' collectives go through here */
  struct model_dev d;           /* device: the arrays the kernels use */
};

/* The GPU's side of the model (train_model_dev.c): its arrays, a forward
 * that leaves the outputs in the host's act[nlayers] too, and a backward
 * from the host's target; both queue their kernels on m->stream. */
weftResult_t dev_model_alloc(struct model *m, int maxw);
void dev_model_free(struct model *m);
weftResult_t dev_forward(struct model *m, int n);
weftResult_t dev_backward(struct model *m, int n, float scale);

/* The stream (host, or CUDA on GPU o->local_rank % GPUs when m->dev), the
 * loss's event and, on a GPU, the device buffer of host values'
 * collectives (TRAIN_GATHER_MAX (nranks + 1) doubles); train_model_close
 * ends them. The transformer (train_gpt.c) keeps its own in a struct model
 * too. */
weftResult_t train_model_open(struct model *m, int nranks);
void train_model_close(struct model *m);
/* The learning rate of step (from 0): o->lr, or with o->cosine a linear
 * warm-up over o->warmup steps, then a cosine down to lr * min_lr_frac at
 * the last step (steps - 1). */
double train_lr_at(const struct train_opts *o, long step);

/* The ZeRO config the options ask for (stage, types, optimizer, schedule's
 * base rate, clipping, accumulation, gathers), the rest at its defaults. */
void train_zero_config(const struct train_opts *o, weftZeroConfig_t *cfg);
/* The most doubles a rank gives train_gather_doubles. */
enum { TRAIN_GATHER_MAX = 8 };
/* all[q*n + i] = rank q's mine[i] (n <= TRAIN_GATHER_MAX, else
 * weftInvalidArgument), complete on return. */
weftResult_t train_gather_doubles(struct model *m, weftComm_t comm, const double *mine,
                                  double *all, size_t n, int nranks);
/* What --save DIR (o->save) gets after the steps [first, last): *save_out
 * 1, the checkpoint of step last; 0, nothing, where no step runs and DIR's
 * LATEST names that step already; or weftInvalidUsage before any step runs,
 * where the save would be refused or fail after them (LATEST names step last
 * already; DIR cannot be made, as mkdir -p does, or is no writable
 * directory on some rank), with the reason on stderr. Every rank makes DIR;
 * rank 0 reads LATEST. Collective. */
weftResult_t train_save_plan(struct model *m, weftComm_t comm, int rank, int nranks, long first,
                             long last, int *save_out);
/* The sum of *loss over ranks, queued (start), then read back (end). */
weftResult_t train_loss_reduce_start(struct model *m, weftComm_t comm, double *loss);
weftResult_t train_loss_reduce_end(struct model *m, double *loss);

/* Rank 0 prints the memory table of every rank (the report's bytes and the
 * ZeRO formula) to o->log. Collective. */
void train_report_memory(struct model *m, weftComm_t comm, int rank, int nranks);

#endif
