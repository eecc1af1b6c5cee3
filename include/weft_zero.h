/*
 * weft ZeRO: sharded data-parallel training state for a trainer to embed.
 *
 * A context holds a model's parameters for one data-parallel rank of a
 * communicator, in layers. Stage 0 keeps everything on every rank and
 * all-reduces gradients in buckets (DDP). Stage 1 shards the optimizer state,
 * stage 2 also the gradients, stage 3 also the parameters, which are gathered
 * one layer at a time around their use. Each layer is a flat buffer of its
 * parameters in registration order, padded to a multiple of the rank count;
 * rank r owns elements [r*s, (r+1)*s) of it (s = padded count / nranks), so a
 * parameter may straddle ranks.
 *
 * Parameters and gradients are kept in the context's parameter type (fp32,
 * bf16 or fp16); the optimizer works on fp32 master weights of the owned
 * shard. Every communication goes on the stream the caller names; every wait
 * is explicit (an event, or weftZeroStep). Use one stream for one context, and
 * no other operations of the same communicator in between unless they are on
 * that stream too.
 *
 * A communication failure (a dead peer, a timeout) surfaces at the next
 * call that synchronizes the stream or waits for a gather: weftZeroStep,
 * weftZeroGetParams, weftZeroSave, weftZeroSaveWithState, weftZeroLoad,
 * weftZeroParam (stages 1-2) or a gather's event. Calls are collective where marked: every
 * rank must make them, in the same order. Errors are weftResult_t, with text in weftZeroLastError().
 */
#ifndef WEFT_ZERO_H
#define WEFT_ZERO_H

#include <stddef.h>

#include "weft.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct weftZero *weftZero_t;

typedef enum { weftZeroAdamW = 0, weftZeroSgdMomentum = 1 } weftZeroOptimizer_t;

/* Where a context's parameters, gradients, buckets, gathered layers, fp32
 * master shard and moments live.
 *
 * weftZeroHostMemory (the default): host memory; streams are weft host
 * streams (weftStreamCreate) or NULL, events weft events.
 *
 * weftZeroDeviceMemory: device memory (cudaMalloc) on the CUDA device that
 * is current on the thread calling weftZeroCreate, which must be comm's
 * device (weftCommCuDevice) when comm has one; call everything else from
 * threads with that device current. weftZeroParam and weftZeroGrad then
 * give device pointers; every weftStream_t argument is a cudaStream_t
 * (NULL: the legacy default stream) and the events weftZeroGather and
 * weftZeroGatherEvent give are cudaEvent_t (wait with cudaEventSynchronize
 * or cudaStreamWaitEvent, not weftEventSynchronize; stage 3's weftZeroParam
 * then hands out a gathered layer's pointer before its event completes, for
 * kernels queued after cudaStreamWaitEvent, or on the gather's stream, to
 * read). The step's conversions,
 * norm, clipping and update run as kernels on the stream named, its
 * collectives as weft's on device buffers on that stream; a trainer's
 * writes to gradients must be ordered before weftZeroGradReady's stream
 * (weftZeroToFloat, weftZeroFromFloat and weftZeroAccumulate take host
 * memory: a trainer converts device buffers with kernels of its own).
 * weftZeroGetParams fills a host array; checkpoints are the same files as a
 * host context's (staged through host memory), loadable by either kind.
 * weftZeroCreate refuses it with weftInvalidUsage when weft_zero was built
 * without CUDA or no CUDA device is visible, before allocating anything. */
typedef enum { weftZeroHostMemory = 0, weftZeroDeviceMemory = 1 } weftZeroMemoryKind_t;

typedef struct {
  int stage;                 /* 0, 1, 2 or 3 */
  weftDataType_t paramType;  /* weftFloat32, weftBfloat16 or weftFloat16 */
  weftDataType_t reduceType; /* gradients are reduced in this type: paramType or weftFloat32 */
  weftZeroOptimizer_t optimizer;
  double lr;
  double beta1, beta2, eps; /* AdamW */
  double momentum;          /* SGD with momentum */
  double weightDecay;       /* decoupled (AdamW) or added to the gradient (SGD); every
                               parameter's unless weftZeroSetParamWeightDecay sets its own */
  double maxGradNorm;       /* clip by global norm; <= 0 turns clipping off */
  int accumSteps;           /* micro-steps per step; gradients are averaged over them */
  size_t bucketBytes;       /* stage 0: gradients are all-reduced in buckets of about this
                               size; stages 2-3: a new layer gradient buffer past it first
                               waits for earlier reductions to finish and frees their buffers */
  size_t gatherBoundBytes;  /* stage 3: gathered buffers, held or idle in the pool, never
                               exceed this; 0 = no bound */
  int prefetchLayers;       /* stage 3: layers gathered ahead of the one asked for */
  double lossScale;         /* initial loss scale; dynamic for fp16 (within [1, 2^24],
                               else weftZeroCreate refuses it: an overflow halves it, down
                               to 1; lossScaleWindow clean steps double it, up to 2^24; a
                               loaded fp16 checkpoint's is brought into the range, one of
                               bf16 or fp32 leaves this one), fixed 1 otherwise */
  int lossScaleWindow;      /* steps without overflow before the scale doubles */
  int allowNonFinite;       /* weftZeroLoad takes NaN and infinite values from a
                               checkpoint; 0 (default): such a checkpoint is refused */
  weftZeroMemoryKind_t memory; /* host (default) or device memory, see above */
  int offloadOptimizer;     /* 1: a device context keeps the fp32 master shard and the
                               moments in pinned host memory and runs the optimizer on the
                               host's threads (offloadThreads): the owned gradients (in
                               reduceType) come to the host behind their reductions and the
                               updated parameters (in paramType) go back, so the device holds
                               params and grads alone (with bf16 or fp16: 2 + 2 bytes a
                               parameter at stage 0, 4/N at stage 3, as ZeRO-Offload).
                               Results equal the device's within its tolerances; checkpoints
                               are the same files. 0 (default): the state lives in the
                               context's memory. A host context's state is on the host
                               already: 1 there is weftInvalidUsage */
  int offloadThreads;       /* offloadOptimizer: threads the update runs on, 1 to 64; 0
                               (default): the CPUs the process may run on, divided among
                               the host's ranks where the launcher says how many
                               (WEFT_LOCAL_SIZE, LOCAL_WORLD_SIZE,
                               OMPI_COMM_WORLD_LOCAL_SIZE). The update is elementwise:
                               the bits do not depend on it */
  int reduceEveryMicroStep; /* stages 2-3 with accumulation (weftZeroSetSync(zero, 0)): 1
                               reduce-scatters every micro-step's gradients as each layer is
                               marked ready, and sums them into this rank's gradient shard
                               (as DeepSpeed's ZeRO-2), so that a rank holds its shard and
                               the buckets in flight (within bucketBytes) instead of every
                               layer's full gradient: accumSteps times the communication,
                               Psi/N of gradient memory. 0 (default): micro-steps before the
                               last only sum locally (as FSDP's no_sync). Stages 0-1 hold
                               full gradients by design: nothing changes there */
} weftZeroConfig_t;

/* Defaults: stage 0, fp32, AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, decay
 * 0), no clipping, 1 micro-step, 4 MiB buckets, no gather bound, prefetch 1,
 * loss scale 65536 with a window of 100 (used for fp16 only), host memory,
 * no offload, micro-steps summed locally. */
void weftZeroConfigDefaults(weftZeroConfig_t *config);

/* The shard of a rank, as a pure function: elements [offset, offset + count)
 * of a flat buffer of `count` elements padded to a multiple of nranks.
 * count may be smaller than the padded shard on the last ranks, and 0.
 * Exact for every count, also where the padded count would not fit size_t;
 * {0, 0} for nranks < 1 or a rank outside [0, nranks). */
typedef struct {
  size_t offset;
  size_t count;
} weftZeroShard_t;
weftZeroShard_t weftZeroShardOf(size_t count, int nranks, int rank);
/* Elements of the flat buffer, padded: nranks * ceil(count / nranks). 0
 * (refused, never wrapped) where that does not fit size_t, and for
 * nranks < 1. */
size_t weftZeroPadded(size_t count, int nranks);
/* The part of the parameter at [param_offset, param_offset + param_count) of
 * its layer that lies in shard: {offset within the parameter, count}. */
weftZeroShard_t weftZeroShardIntersect(weftZeroShard_t shard, size_t param_offset,
                                       size_t param_count);

/* Creates a context on comm (which must outlive it). Not collective. */
weftResult_t weftZeroCreate(weftZero_t *zero, weftComm_t comm, const weftZeroConfig_t *config);

/* Registers a parameter of count elements (at least 1: count 0 is
 * weftInvalidArgument; leave empty tensors out) in layer `layer` (layers are
 * numbered from 0 and registered in non-decreasing order), initialised from
 * init (fp32, count values; every rank must pass the same values). Writes
 * its id. weftInvalidArgument, with nothing registered, where the model's
 * elements with this one, plus up to nranks - 1 elements of padding a
 * layer, would exceed SIZE_MAX / 4 (the buffers' sizes in bytes would not
 * fit size_t). */
weftResult_t weftZeroAddParam(weftZero_t zero, int layer, size_t count, const float *init,
                              int *param_out);

/* The weight decay of one parameter (PyTorch's parameter groups; GPT-2
 * trainers decay the weight matrices and not the biases, norms' gains or
 * other vectors): decoupled for AdamW, added to the gradient for SGD, as
 * config.weightDecay, which every parameter has unless this sets another.
 * Padding keeps config.weightDecay. Between weftZeroAddParam and
 * weftZeroFinalize (after it, or after a failed one, weftInvalidUsage); a
 * param that was not added, or a negative or non-finite weightDecay, is
 * weftInvalidArgument. weftZeroFinalize compares every parameter's decay
 * across ranks. Not collective. */
weftResult_t weftZeroSetParamWeightDecay(weftZero_t zero, int param, double weightDecay);

/* Ends registration, compares the ranks' contexts, allocates buffers and
 * writes the initial parameters back (stages 1-2: all-gathers them). The
 * comparison covers the configuration (but memory, offloadOptimizer and
 * offloadThreads), the layers' and parameters' sizes, the parameters'
 * weight decays and a hash of the initial values: where a rank differs, every rank's call fails with
 * weftInvalidUsage naming what, before anything is allocated. After it,
 * stage 0-2 parameters are readable; stage 3 ones after weftZeroGather.
 * Called once: a second call is weftInvalidUsage, after a failed one too
 * (weftZeroDestroy frees what the failed call made); where only the
 * write-back failed, the context refuses steps (weftInvalidUsage) until a
 * weftZeroLoad. Collective (on the NULL stream, complete on return). */
weftResult_t weftZeroFinalize(weftZero_t zero);

/* The parameter's values (paramType). Stage 3: only while its layer is
 * gathered and (host memory) after the gather's event; else
 * weftInvalidUsage. Stages 0-2: waits for the layer's write-back (stages
 * 1-2: and its all-gather) from the last weftZeroStep or weftZeroLoad if it
 * is still in flight; a pointer kept across a step is readable once the
 * layer's gather event (weftZeroGather, weftZeroGatherEvent) has completed. */
weftResult_t weftZeroParam(weftZero_t zero, int param, void **ptr_out);

/* The parameter's gradient buffer (paramType, zero at the start of a step):
 * the trainer adds its gradient of the loss times weftZeroLossScale to it
 * (weftZeroAccumulate). Stages 0-1: the same buffer every step. Stages 2
 * and 3 hand out a layer buffer from the bucket pool, held until the
 * layer's reduction is done (may wait for earlier reductions, see
 * bucketBytes): ask for it in every step. A pointer kept from an earlier
 * step is not this step's buffer: what is written there is lost, and may
 * land in the buffer another layer holds now. A layer marked ready with no
 * weftZeroGrad in the step (one with no gradient this step, on any rank)
 * reduces as zeros. With reduceEveryMicroStep there, the
 * buffer is the micro-step's: ask for it again in each micro-step (a pointer
 * kept from an earlier one points at a buffer being reduced, or back in the
 * pool); the call waits for the layer's previous reduction first. */
weftResult_t weftZeroGrad(weftZero_t zero, int param, void **ptr_out);

/* Stage 3: queues the all-gather of layer on stream, and of up to
 * prefetchLayers more in the direction of travel (upward; downward from the
 * last layer or after a lower layer), as gatherBoundBytes allows; asking for
 * a layer that does not fit is weftInvalidUsage; a gather on another stream
 * than the last step's first waits (on the stream) for that step's
 * write-back of the layer's shard. *ready_out (may be NULL) is an event that
 * completes when the layer's parameters are in place; synchronize it before
 * weftZeroParam. Stages 0-2: queues nothing; the event is that of the
 * layer's write-back (stages 1-2: and its all-gather) queued by the last
 * weftZeroStep or weftZeroLoad, so the next forward waits for each layer as
 * it reaches it while the later layers still arrive; it is complete before
 * the first step, after a step on the NULL stream, and at stage 0 in a host
 * context (whose write-back is done at once). Does not block.
 * Collective. */
weftResult_t weftZeroGather(weftZero_t zero, int layer, weftStream_t stream,
                            weftEvent_t *ready_out);
/* The event of the layer's last gather, prefetched or asked for (complete
 * when none is in flight). Does not queue anything. */
weftResult_t weftZeroGatherEvent(weftZero_t zero, int layer, weftEvent_t *event_out);
/* Stage 3: gives the layer's gathered parameters back; a later gather of
 * any layer may write them. With gatherBoundBytes set, every rank must
 * release (here or with weftZeroReleaseOn) in the same order relative to
 * its weftZeroGather calls: whether a prefetch fits the bound depends on
 * what is held, and the ranks must queue the same gathers. The buffer
 * returns to the context's pool of gathered buffers, and a gather of a
 * layer it holds takes it again (the smallest idle one that fits) instead
 * of allocating: after the first step a trainer's gathers allocate nothing
 * (weftZeroMemory_t gatheredAllocs).
 * It waits for the layer's gather if it is still in flight and, in a
 * device context, for all work on the device (a caller's kernels on any
 * stream may still read the layer; the cudaFree this replaced waited as
 * much). In a host context it does not wait for weft calls the caller
 * queued on host streams that read the layer: finish them first, or use
 * weftZeroReleaseOn on their stream. Other stages: nothing. Blocks. */
weftResult_t weftZeroRelease(weftZero_t zero, int layer);
/* Stage 3: weftZeroRelease ordered on a stream, without blocking: the work
 * queued on stream so far (and the layer's gather) is the last use of its
 * parameters. An event is recorded on stream, and the gather that next
 * takes the buffer orders its own stream after it (cudaStreamWaitEvent,
 * weftStreamWaitEvent); freeing the buffer waits for it. stream: as for
 * weftZeroGather (NULL: on the host, waits for the layer's gather, as the
 * NULL stream completes everything). Nothing may read the layer's
 * parameters from work queued after the call, on any stream. Other stages
 * and a layer not gathered: nothing. Not collective. */
weftResult_t weftZeroReleaseOn(weftZero_t zero, int layer, weftStream_t stream);

/* Micro-steps before the last of a step pass sync = 0: their gradients stay
 * in the gradient buffers and accumulate, unreduced (no communication). At
 * stages 2-3 these are each layer's full buffer, held until the last
 * micro-step: Psi gradients a rank, beyond bucketBytes (as FSDP's no_sync),
 * unless the configuration's reduceEveryMicroStep is set: then each
 * micro-step's weftZeroGradReady reduces the layer into the gradient shard
 * as the last one does, and its buffer is freed once that is done.
 * Default 1. */
weftResult_t weftZeroSetSync(weftZero_t zero, int sync);

/* Marks layer's gradients complete for this micro-step. With sync on, queues
 * its reduction on stream (stage 0: the bucket's all-reduce once all its
 * layers are marked; stages 1-3: the layer's reduce-scatter), so it overlaps
 * the rest of backward. Does not block (a reduceType copy is made first),
 * but for what orders it: a reduction queued before on another stream is
 * waited for (on the host; on a device the stream waits), as every rank must
 * start its collectives in one order. Each layer is marked once per step
 * (with reduceEveryMicroStep at stages 2-3, in every micro-step: sync off,
 * its reduction is queued and summed into the shard, gradients added after
 * it go into the next, and a second mark with no weftZeroGrad between waits
 * for the first's reduction and adds zeros). Every rank marks its layers
 * in the same order: the step compares the order of its reductions and
 * fails with weftInvalidUsage, before the update, where it differs.
 * Collective. */
weftResult_t weftZeroGradReady(weftZero_t zero, int layer, weftStream_t stream);

typedef struct {
  double gradNorm;  /* global norm of the averaged gradient, before clipping */
  double lossScale; /* the scale the step used */
  int skipped;      /* 1: an overflow on some rank: no update (fp16: the scale halves) */
} weftZeroStepInfo_t;

/* Finishes the reductions, clips by global norm (across shards), updates the
 * owned shard (AdamW or SGD with momentum, fp32), writes parameters back
 * and zeroes the gradients. Stage 3 drops gathered layers, which would be
 * stale. The write-back is queued on stream layer by layer (a kernel in a
 * device context; done at once in a host one), stages 1-2 queue the
 * all-gather of the updated parameters after it, and each layer's gather
 * event is recorded after what was queued for it (in a device context at
 * every stage; in a host one after stages 1-2's all-gather): the step
 * returns with them in flight, to overlap the next forward, which waits for
 * each layer's event (weftZeroGather, or weftZeroParam at stages 0-2) before
 * reading it. Everything else is complete when it returns (blocks); with
 * the NULL stream everything is. info may be NULL. Collective. A step that
 * fails after its arguments were accepted leaves the context refusing
 * steps until weftZeroLoad (its collectives may be out of step with the
 * other ranks'). */
weftResult_t weftZeroStep(weftZero_t zero, weftStream_t stream, weftZeroStepInfo_t *info);

/* The factor the trainer multiplies its loss by (1 unless fp16). */
double weftZeroLossScale(weftZero_t zero);
/* The learning rate of the next weftZeroSteps (a schedule sets it before
 * each step; every rank alike: a step whose ranks' rates differ fails with
 * weftInvalidUsage). Not collective; a checkpoint's manifest records it for
 * information, and a load does not restore it. */
weftResult_t weftZeroSetLr(weftZero_t zero, double lr);
/* weftZeroStep calls so far (skipped steps included); restored by weftZeroLoad. */
long weftZeroStepCount(weftZero_t zero);

/* Bytes this rank holds, by category, counted where they are allocated (in
 * device memory for a device context, but the optimizer state with
 * offloadOptimizer, which is in host memory: see offloaded; 16 bytes of step
 * statistics are not counted, on either kind). params + grads + optimizer follow the ZeRO formulas (weftZeroMemoryFormulaFor)
 * for psiPadded parameters and N ranks: with an fp32 reduceType, stages 2
 * and 3 keep the gradient shard in fp32 (grads is 4psi/N where
 * weftZeroMemoryFormula, for reduceType = paramType, counts 2psi/N); buckets and gathered are the
 * temporary buffers held now (peak: the most at once). Temporary buffers
 * given back are kept in a pool of the context for the next taker (the
 * smallest idle one that fits), counted apart as idle, so that steps after
 * the first allocate nothing (stage 3 gathers) or little (buckets, which
 * come back as reductions finish: at most one a layer in all while they
 * fit in bucketBytes). gathered + gatheredIdle <= gatheredPeak; buckets +
 * bucketsIdle <= the larger of bucketsPeak and bucketBytes, plus the
 * step's gradient. weftZeroDestroy frees them. */
typedef struct {
  size_t psi;             /* parameters, unpadded */
  size_t psiPadded;       /* parameters, each layer padded to a multiple of N */
  size_t params;          /* parameter buffers (paramType): Psi, or Psi/N at stage 3 */
  size_t grads;           /* gradient buffers: Psi, or Psi/N at stages 2-3 */
  size_t optimizer;       /* fp32 master + moments: K*Psi, or K*Psi/N at stages 1-3 */
  size_t buckets;         /* stage 2-3 layer gradients, reduce-type copies and, during
                             weftZeroStep, its fp32 gradient of the owned range held now */
  size_t bucketsPeak;
  size_t gathered;        /* stage 3 gathered layers held now (their pool buffers' bytes) */
  size_t gatheredPeak;    /* the most held at once */
  size_t gatheredIdle;    /* gather pool buffers no layer holds */
  size_t gatheredAllocs;  /* gather pool buffers allocated so far */
  size_t bucketsIdle;     /* bucket pool buffers no layer holds */
  size_t bucketsAllocs;   /* bucket pool buffers allocated so far */
  size_t offloaded;       /* offloadOptimizer: bytes of pinned host memory, the optimizer
                             state (also counted in optimizer) and the step's staging for
                             gradients and parameters (8 bytes and one paramType an owned
                             element); 0 without it, when nothing lives outside the
                             context's memory */
} weftZeroMemory_t;
weftResult_t weftZeroMemoryReport(weftZero_t zero, weftZeroMemory_t *report);
/* The formula alone: bytes of params + grads + optimizer for psi parameters
 * of paramType on nranks ranks at stage (psi divisible by nranks; gradients
 * reduced in paramType: see weftZeroMemory for an fp32 reduceType). With fp16
 * or bf16 and AdamW this is 16psi, 4psi + 12psi/N, 2psi + 14psi/N, 16psi/N. */
size_t weftZeroMemoryFormula(int stage, size_t psi, int nranks, weftDataType_t paramType,
                             weftZeroOptimizer_t optimizer);
/* The same for the context config would make (its stage, paramType,
 * reduceType and optimizer): stages 2 and 3 keep the gradient shard in
 * reduceType, so with bf16 parameters and fp32 reduction AdamW takes
 * 2psi + 16psi/N at stage 2 and 18psi/N at stage 3. What weftZeroMemoryReport's
 * params + grads + optimizer come to, for psiPadded parameters. 0 for a NULL
 * config or nranks < 1. */
size_t weftZeroMemoryFormulaFor(const weftZeroConfig_t *config, size_t psi, int nranks);

/* The full fp32 master parameters, in registration order (psi floats), on
 * every rank. Its all-gathers start after the gathers queued on another
 * stream (the last step's, stage 3's held or prefetched layers, which stay
 * gathered): on the host it waits for them, on a device stream waits for
 * their events. Collective. */
weftResult_t weftZeroGetParams(weftZero_t zero, float *out, weftStream_t stream);

/* Sharded checkpoints. Save writes dir/step-<n>/ (dir and the folders above it
 * made where missing, by rank 0) with one file per rank (its
 * shard of master weights and moments, padding removed, behind a header with
 * the run's identity, the step and a CRC-32C of the data) and a manifest
 * (layout, counters, every shard's size and checksum, and its own checksum),
 * then points dir/LATEST at it by an atomic rename; a crash mid-save leaves
 * the previous checkpoint as LATEST. It then removes the same run's
 * checkpoints of lower steps, and nothing else (another run's, a higher
 * step's, what it cannot read stay). A save of the step LATEST names, or
 * over another run's checkpoint of the same step, is refused before
 * anything is written. The manifest also records each parameter's layer,
 * size and weight decay, and the hyperparameters of the save (lr, betas,
 * eps, momentum, weightDecay, maxGradNorm, accumSteps) for information.
 * Load reads LATEST on any number of ranks and any stage (same layers,
 * parameters and optimizer: a checkpoint whose parameters are cut otherwise
 * within layers of the same sizes is weftInvalidUsage on every rank, naming
 * the first parameter that differs; hyperparameters and weight decays may
 * differ, the context's own stay in force). It first checks on every rank
 * what that rank will read (checksums, run, step, sizes against the files'
 * lengths, finite values unless config allowNonFinite): a checkpoint that
 * fails anywhere, or ranks that read different checkpoints, are
 * weftInvalidUsage on every rank (weftRemoteError where another rank found
 * the fault) with the reason in weftZeroLastError, and the context is left
 * as it was. Each rank then reads its ranges into host copies of its state
 * and installs them; a read or an installation that fails on any rank
 * fails the load on every rank (weftSystemError or the copy's error, or
 * weftRemoteError) and leaves every context as it was too (the state put
 * back from a second host copy). Only then are the gradients (zeroed) and
 * the counters replaced, and the parameters written back as by a step. The
 * exceptions, said in weftZeroLastError: putting the state back failing
 * too (the context's state is damaged: load again or destroy it), and
 * zeroing the gradients or writing the parameters back failing after the
 * installation (the state is the checkpoint's, the parameters partly not:
 * steps are refused, weftInvalidUsage, until a load succeeds). Both
 * collective; like weftZeroGetParams, they start their collectives after
 * the gathers queued on another stream. */
weftResult_t weftZeroSave(weftZero_t zero, const char *dir, weftStream_t stream);
weftResult_t weftZeroLoad(weftZero_t zero, const char *dir, weftStream_t stream);

/* The most bytes of client state a checkpoint holds. */
#define WEFT_ZERO_STATE_MAX_NBYTES ((size_t)64 << 20)

/* weftZeroSave that also keeps the caller's own state in the checkpoint
 * (what a trainer needs to resume exactly: its data position, random
 * generators, schedule): rank 0's nbytes bytes at state, written as
 * dir/step-<n>/client-state.bin before the checkpoint is renamed into place
 * and LATEST moved, its size and CRC-32C in the manifest, so that the bytes
 * and the model state are committed together or not at all. Other ranks'
 * state and nbytes are ignored (may be NULL, 0). On rank 0, nbytes over
 * WEFT_ZERO_STATE_MAX_NBYTES, or state NULL with nbytes > 0, is
 * weftInvalidArgument there and weftRemoteError on the other ranks, before
 * anything is written. nbytes 0 saves a checkpoint without client state, as
 * weftZeroSave does. Collective, as weftZeroSave. */
weftResult_t weftZeroSaveWithState(weftZero_t zero, const char *dir, const void *state,
                                   size_t nbytes, weftStream_t stream);
/* The client state of the checkpoint whose state the last weftZeroLoad
 * installed (with its counters: a successful load, or one that failed only
 * after the installation): *state_out points at *nbytes_out bytes that the
 * context holds (read-only) until a later load installs another checkpoint,
 * or weftZeroDestroy. A load reads and checks the state file on every rank
 * with the rest of the checkpoint: a state that is missing, cut short,
 * longer or damaged fails the load on every rank and leaves the context,
 * and the state this call returns, as they were. *state_out NULL and
 * *nbytes_out 0 when the checkpoint has none (saved by weftZeroSave, or of
 * format 4 or older) or before any load installed one. NULL arguments
 * are weftInvalidArgument. Not collective. */
weftResult_t weftZeroLoadedState(weftZero_t zero, const void **state_out, size_t *nbytes_out);

/* Writes the checkpoint LATEST names in dir as one file of full fp32
 * parameters: the 8 bytes "WEFTZF32", a uint64 layer count, a uint64
 * parameter count per layer, then every parameter in registration order
 * (little-endian float32). Every shard is checked as weftZeroLoad checks it
 * before anything is written; out_path is written beside and renamed into
 * place, so a refused checkpoint leaves it as it was. Not collective; no
 * communicator needed. The client state is neither read nor checked. */
weftResult_t weftZeroConsolidate(const char *dir, const char *out_path);
/* Flags of weftZeroConsolidateFlags. */
typedef enum { weftZeroAllowNonFinite = 1 } weftZeroConsolidateFlags_t;
/* weftZeroConsolidate with flags: weftZeroAllowNonFinite takes NaN and
 * infinite values. */
weftResult_t weftZeroConsolidateFlags(const char *dir, const char *out_path, int flags);

/* The text of the calling thread's last ZeRO failure ("" if none). */
const char *weftZeroLastError(void);

/* Waits for the context's outstanding work and frees it. */
weftResult_t weftZeroDestroy(weftZero_t zero);

/* Conversions between fp32 and paramType (fp32, bf16, fp16; round to
 * nearest even). Accumulate adds src (fp32) to dst (type) element-wise. */
weftResult_t weftZeroToFloat(const void *src, weftDataType_t type, float *dst, size_t count);
weftResult_t weftZeroFromFloat(const float *src, weftDataType_t type, void *dst, size_t count);
weftResult_t weftZeroAccumulate(void *dst, weftDataType_t type, const float *src, size_t count);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_ZERO_H */
