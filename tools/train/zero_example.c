/* Fits y = w.x + b with ZeRO: the smallest complete trainer. Every rank
 * draws its own part of each batch; run it as `weftrun -n 4 zero-example 3`. */
#include <stdio.h>
#include <stdlib.h>

#include <weft.h>
#include <weft_zero.h>

#define DIM 10
#define BATCH 16 /* per rank */

int main(int argc, char **argv) {
  weftComm_t comm;
  if (weftCommInitFromEnv(&comm, NULL) != weftSuccess) return 1;
  int rank;
  weftCommUserRank(comm, &rank);

  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = argc > 1 ? atoi(argv[1]) : 3;
  cfg.paramType = cfg.reduceType = weftBfloat16; /* fp32 master weights inside */
  cfg.lr = 0.05;
  cfg.maxGradNorm = 1.0;
  weftZero_t zero;
  if (weftZeroCreate(&zero, comm, &cfg) != weftSuccess) {
    fprintf(stderr, "%s\n", weftZeroLastError());
    return 1;
  }
  /* one layer: the weights, then the bias; every rank passes the same values */
  float w0[DIM] = {0}, b0[1] = {0};
  int pw, pb;
  weftZeroAddParam(zero, 0, DIM, w0, &pw);
  weftZeroAddParam(zero, 0, 1, b0, &pb);
  weftZeroFinalize(zero);

  weftStream_t stream;
  weftStreamCreate(&stream);
  srand(1234 + rank);
  for (int step = 0; step < 200; step++) {
    /* forward: gather the layer (stage 3), wait for its event, read it */
    weftEvent_t ready;
    weftZeroGather(zero, 0, stream, &ready);
    weftEventSynchronize(ready);
    void *wp, *bp;
    weftZeroParam(zero, pw, &wp);
    weftZeroParam(zero, pb, &bp);
    float w[DIM], b, gw[DIM] = {0}, gb = 0, loss = 0;
    weftZeroToFloat(wp, cfg.paramType, w, DIM);
    weftZeroToFloat(bp, cfg.paramType, &b, 1);
    for (int s = 0; s < BATCH; s++) {
      float x[DIM], y = 0.5f, pred = b;
      for (int i = 0; i < DIM; i++) {
        x[i] = (float)rand() / RAND_MAX - 0.5f;
        y += (i + 1) * 0.1f * x[i]; /* the answer: w_i = 0.1 (i+1), b = 0.5 */
        pred += w[i] * x[i];
      }
      float d = pred - y;
      loss += d * d / BATCH;
      for (int i = 0; i < DIM; i++) gw[i] += 2 * d * x[i] / BATCH;
      gb += 2 * d / BATCH;
    }
    weftZeroRelease(zero, 0);
    /* backward: add gradients (times the loss scale), mark the layer ready */
    float scale = (float)weftZeroLossScale(zero);
    for (int i = 0; i < DIM; i++) gw[i] *= scale;
    gb *= scale;
    void *gwp, *gbp;
    weftZeroGrad(zero, pw, &gwp);
    weftZeroGrad(zero, pb, &gbp);
    weftZeroAccumulate(gwp, cfg.paramType, gw, DIM);
    weftZeroAccumulate(gbp, cfg.paramType, &gb, 1);
    weftZeroGradReady(zero, 0, stream); /* reduce-scatter starts on the stream */
    /* step: finish reductions, clip, AdamW on this rank's shard */
    weftZeroStepInfo_t info;
    if (weftZeroStep(zero, stream, &info) != weftSuccess) {
      fprintf(stderr, "%s\n", weftZeroLastError());
      return 1;
    }
    if (rank == 0 && step % 50 == 0) printf("step %d loss %.5f\n", step, loss);
  }
  float full[DIM + 1];
  weftZeroGetParams(zero, full, stream); /* collective: the whole model in fp32 */
  weftZeroMemory_t mem;
  weftZeroMemoryReport(zero, &mem);
  if (rank == 0)
    printf("w0 %.3f w9 %.3f b %.3f; this rank holds %zu bytes of model state\n", full[0],
           full[DIM - 1], full[DIM], mem.params + mem.grads + mem.optimizer);
  weftZeroSave(zero, "/tmp/zero-example-ckpt", stream);
  weftZeroDestroy(zero);
  weftStreamDestroy(stream);
  weftCommDestroy(comm);
  return 0;
}
