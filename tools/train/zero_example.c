/* Fits y = w.x + b with ZeRO: the smallest complete trainer. Every rank
 * draws its own part of each batch; run it as `weftrun -n 4 zero-example 3`
 * (the stage), with a directory after it to save a checkpoint there. */
#include <stdio.h>
#include <stdlib.h>

#include <weft.h>
#include <weft_zero.h>

#define DIM 10
#define BATCH 16 /* per rank */

/* every call returns weftSuccess or an error whose text weftGetLastError
 * (communicators, streams) or weftZeroLastError (the ZeRO context) has */
#define CHECK_WITH(call, text)                                     \
  do {                                                             \
    if ((call) != weftSuccess) {                                   \
      fprintf(stderr, "%s failed: %s\n", #call, text);             \
      exit(1);                                                     \
    }                                                              \
  } while (0)
#define CHECK(call) CHECK_WITH(call, weftGetLastError(NULL))
#define CHECK_ZERO(call) CHECK_WITH(call, weftZeroLastError())

int main(int argc, char **argv) {
  weftComm_t comm;
  CHECK(weftCommInitFromEnv(&comm, NULL));
  int rank;
  CHECK(weftCommUserRank(comm, &rank));

  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = argc > 1 ? atoi(argv[1]) : 3;
  cfg.paramType = cfg.reduceType = weftBfloat16; /* fp32 master weights inside */
  cfg.lr = 0.05;
  cfg.maxGradNorm = 1.0;
  weftZero_t zero;
  CHECK_ZERO(weftZeroCreate(&zero, comm, &cfg));
  /* one layer: the weights, then the bias; every rank passes the same values */
  float w0[DIM] = {0}, b0[1] = {0};
  int pw, pb;
  CHECK_ZERO(weftZeroAddParam(zero, 0, DIM, w0, &pw));
  CHECK_ZERO(weftZeroAddParam(zero, 0, 1, b0, &pb));
  CHECK_ZERO(weftZeroFinalize(zero));

  weftStream_t stream;
  CHECK(weftStreamCreate(&stream));
  srand(1234 + rank);
  for (int step = 0; step < 200; step++) {
    /* forward: gather the layer (stage 3), wait for its event, read it */
    weftEvent_t ready;
    CHECK_ZERO(weftZeroGather(zero, 0, stream, &ready));
    CHECK(weftEventSynchronize(ready));
    void *wp, *bp;
    CHECK_ZERO(weftZeroParam(zero, pw, &wp));
    CHECK_ZERO(weftZeroParam(zero, pb, &bp));
    float w[DIM], b, gw[DIM] = {0}, gb = 0, loss = 0;
    CHECK_ZERO(weftZeroToFloat(wp, cfg.paramType, w, DIM));
    CHECK_ZERO(weftZeroToFloat(bp, cfg.paramType, &b, 1));
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
    CHECK_ZERO(weftZeroRelease(zero, 0));
    /* backward: add gradients (times the loss scale), mark the layer ready */
    float scale = (float)weftZeroLossScale(zero);
    for (int i = 0; i < DIM; i++) gw[i] *= scale;
    gb *= scale;
    void *gwp, *gbp;
    CHECK_ZERO(weftZeroGrad(zero, pw, &gwp));
    CHECK_ZERO(weftZeroGrad(zero, pb, &gbp));
    CHECK_ZERO(weftZeroAccumulate(gwp, cfg.paramType, gw, DIM));
    CHECK_ZERO(weftZeroAccumulate(gbp, cfg.paramType, &gb, 1));
    CHECK_ZERO(weftZeroGradReady(zero, 0, stream)); /* reduce-scatter starts on the stream */
    /* step: finish reductions, clip, AdamW on this rank's shard */
    weftZeroStepInfo_t info;
    CHECK_ZERO(weftZeroStep(zero, stream, &info));
    if (rank == 0 && step % 50 == 0) printf("step %d loss %.5f\n", step, loss);
  }
  float full[DIM + 1];
  CHECK_ZERO(weftZeroGetParams(zero, full, stream)); /* collective: the whole model in fp32 */
  weftZeroMemory_t mem;
  CHECK_ZERO(weftZeroMemoryReport(zero, &mem));
  if (rank == 0)
    printf("w0 %.3f w9 %.3f b %.3f; this rank holds %zu bytes of model state\n", full[0],
           full[DIM - 1], full[DIM], mem.params + mem.grads + mem.optimizer);
  if (argc > 2) CHECK_ZERO(weftZeroSave(zero, argv[2], stream)); /* collective */
  CHECK_ZERO(weftZeroDestroy(zero));
  CHECK(weftStreamDestroy(stream));
  CHECK(weftCommDestroy(comm));
  return 0;
}
