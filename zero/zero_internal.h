/* The ZeRO context's state, shared by the files of zero/. Uses the public
 * headers only. */
#ifndef WEFT_ZERO_INTERNAL_H
#define WEFT_ZERO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "weft.h"
#include "weft_zero.h"
#include "zero_ops.h"

/* Errors, as the library's own (transport/status.h): a function that fails
 * records the text weftZeroLastError shows (zero_fail) and returns the code;
 * callers propagate it unchanged with WEFT_TRY or WEFT_TRY_GOTO. A weft
 * call's failure is converted where it is made (zero_weft), its text kept
 * behind what was being done. zero/ sees the public API only, which has no
 * log: the text carries the context instead of a logged frame per call. */
weftResult_t zero_fail(weftResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A failure that leaves the training state incomplete (part of a step's
 * reductions or of its update done): records it in z->broken, so that
 * zero_sound refuses the steps after it until a load, and returns code with
 * "what: the failure's text; ..." as its text. */
weftResult_t zero_break(struct weftZero *z, weftResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* weftInvalidUsage naming what broke the state (zero_break), or success. */
weftResult_t zero_sound(const struct weftZero *z);
/* A failure of a weft call: takes its text from weftGetLastError. */
weftResult_t zero_fail_weft(weftResult_t code, weftComm_t comm, const char *what);
/* res as it is; a failure gets "what: weft's text (code)" as its text. */
weftResult_t zero_weft(const struct weftZero *z, weftResult_t res, const char *what);

#define WEFT_TRY(call)                                                          \
  do {                                                                          \
    weftResult_t try_res_ = (call);                                             \
    if (try_res_ != weftSuccess) return try_res_;                               \
  } while (0)

/* As WEFT_TRY, but stores the code in res and jumps to a cleanup label. */
#define WEFT_TRY_GOTO(call, res, label)                                         \
  do {                                                                          \
    (res) = (call);                                                             \
    if ((res) != weftSuccess) goto label;                                       \
  } while (0)

int zero_type_ok(weftDataType_t type);
float zero_load(const void *src, weftDataType_t type, size_t i);
void zero_store(void *dst, weftDataType_t type, size_t i, float v);

/* Memory categories the report counts. */
enum zero_mem { ZERO_MEM_PARAMS, ZERO_MEM_GRADS, ZERO_MEM_OPTIM, ZERO_MEM_BUCKETS,
                ZERO_MEM_GATHERED, ZERO_MEM_NUM };

enum zero_gather_state { ZERO_RELEASED = 0, ZERO_GATHERING };

struct zero_param {
  int layer;
  size_t offset; /* within the layer's flat buffer */
  size_t count;
  double weight_decay; /* cfg.weightDecay unless weftZeroSetParamWeightDecay set it */
};

/* Consecutive elements of the owned range (master indices) that share one
 * weight decay: the owned range cut at the parameters' boundaries where
 * their decays differ (padding takes cfg.weightDecay), equal neighbours
 * merged, so that a model without per-parameter decays has one run. */
struct zero_decay_run {
  size_t begin, count;
  double weight_decay;
};

struct zero_layer {
  size_t count;        /* parameters, unpadded */
  size_t padded;       /* weftZeroPadded(count, nranks) */
  size_t shard;        /* padded / nranks */
  size_t first_param, nparams;
  size_t flat_offset;  /* in the full flat buffers (params and grads, stages 0-1) */
  size_t shard_offset; /* in the shard buffers (stage 2-3 gradients, stage 3 params) */
  size_t own_offset;   /* the owned range in the layer: stage 0 all of it, else the shard */
  size_t own_count;
  size_t master_offset; /* of the owned range in master and moments */
  /* stage 3 */
  int gather_state;
  void *gathered;        /* a buffer of the gather pool */
  weftEvent_t gather_ev; /* the last gather (stage 3), or the last write-back of the
                            layer's parameters (with stages 1-2 their all-gather) */
  weftStream_t gather_stream; /* the stream gather_ev was last recorded on */
  int gather_pending;    /* the last write-back (and stages 1-2 all-gather) was queued on
                            gather_stream and not yet waited for here */
  /* gradients of this step */
  void *grad_bucket;   /* stages 2-3: the layer's gradients (paramType, padded) */
  void *red_copy;      /* stages 1-3: a reduceType copy when it differs from paramType */
  weftEvent_t red_ev;  /* the last reduction's completion */
  int reduced;         /* the step's (last micro-step's) reduction is queued */
  int sent;            /* stages 2-3: grad_bucket (and red_copy) are read by the
                          reduction of red_ev: given back once it is done */
  int shard_sums;      /* reductions summed into the gradient shard this step
                          (reduceEveryMicroStep: one a micro-step) */
  int bucket;          /* stage 0: the bucket of this layer */
  int off_queued;      /* offloadOptimizer: the owned gradients' copy to the host's
                          staging is queued behind the reduction (red_ev, at stage 0 the
                          bucket's ev, is recorded after it) */
};

/* Stage 0: consecutive layers whose gradients are all-reduced together. */
struct zero_bucket {
  int first_layer, last_layer;
  size_t flat_offset, count;
  int pending;         /* layers not yet marked ready */
  void *red_copy;      /* reduceType copy when it differs */
  weftEvent_t ev;
};

/* A buffer of a pool (zero_pool.c). */
struct zero_pbuf {
  void *ptr;             /* NULL: a free slot */
  size_t nbytes;
  weftEvent_t release_ev; /* a release ordered on the last user's stream */
  weftStream_t release_stream; /* that stream */
  int in_use;
  int ordered;           /* release_ev was recorded: a taker's stream waits for it */
};

/* Temporary buffers kept for reuse: in use, counted in mem[cat]. */
struct zero_pool {
  struct zero_pbuf *bufs;
  int n, cap;
  enum zero_mem cat;
  size_t keep;   /* held and idle may reach this even past the peak in use */
  size_t idle;   /* bytes of idle buffers */
  size_t allocs; /* buffers allocated so far */
};

struct weftZero {
  weftComm_t comm;
  const struct zero_ops *ops; /* host or device memory: every buffer goes through it */
  double *stats;     /* the step's non-finite count and sum of squares (context memory) */
  int rank, nranks;
  weftZeroConfig_t cfg;
  size_t param_size; /* bytes of paramType */
  size_t red_size;   /* bytes of reduceType */
  int finalized;
  int finalize_tried; /* weftZeroFinalize ran: a second call is refused (a failed one
                         leaves its partial state to weftZeroDestroy) */
  struct zero_param *params;
  size_t nparams, params_cap;
  struct zero_layer *layers;
  int nlayers;
  float *init;       /* registration: initial values, in parameter order */
  size_t init_cap;
  struct zero_bucket *buckets;
  int nbuckets;
  size_t psi, psi_padded, shard_total, own_total;
  struct zero_decay_run *decay_runs; /* weftZeroFinalize's cut of [0, own_total) */
  size_t ndecay_runs;
  void *params_full; /* stages 0-2: every layer, padded (paramType) */
  void *params_shard;/* stage 3: the shards (paramType) */
  void *grads_full;  /* stages 0-1: every layer, padded (paramType) */
  void *grad_shard;  /* stages 2-3: the reduced shards (reduceType) */
  float *master, *moment1, *moment2; /* owned range; moment2 for AdamW only */
  /* offloadOptimizer: where the state above lives and the optimizer runs
   * (zero_ops_pinned; a test may name the host's), the step's fp32 gradient
   * of the owned range, the staging of raw gradients in (own_total elements
   * of at most 4 bytes) and of parameters out (paramType), all in
   * offload_ops' memory (offloaded counts them); the parameters' copies to
   * the context are queued on the step's stream, off_params_ev recorded
   * after the last (pending: not yet waited for), so that the next
   * publication writes off_params once they have read it */
  const struct zero_ops *offload_ops;
  float *off_grad;
  void *off_stage;
  void *off_params;
  weftEvent_t off_params_ev;
  int off_params_pending;
  size_t offloaded;
  int sync;
  /* why the training state is incomplete ("" when sound): a gradient
   * reduction or a step that failed part way, after which a step would apply
   * stale or partial gradients; set by zero_break, cleared by a load */
  char broken[384];
  /* the optimizer's update failed part way: the shard and its state are
   * partly moved, so a save is refused too (until a load) */
  int state_damaged;
  long step;    /* weftZeroStep calls, skipped ones included */
  /* this step's reductions so far (zero_agree.c): a hash of the buckets'
   * (stage 0) or layers' indices in the order they were queued, and their
   * number, compared across ranks by the step */
  uint64_t step_order;
  long step_reductions;
  long updates; /* optimizer updates (Adam's bias correction counts these) */
  double loss_scale;
  int good_steps;
  unsigned char run_id[16]; /* the run's identity in its checkpoints */
  int has_run_id;           /* set by the first save, or by a load */
  /* the client state of the last load's checkpoint, for weftZeroLoadedState
   * (malloc'd; NULL and 0: none) */
  void *loaded_state;
  size_t loaded_state_nbytes;
  int last_gather;
  int gather_dir;
  size_t mem[ZERO_MEM_NUM];
  size_t mem_peak[ZERO_MEM_NUM];
  struct zero_pool gather_pool; /* stage 3's gathered layers */
  struct zero_pool bucket_pool; /* gradient buckets and reduce-type copies */
  struct zero_pool step_pool;   /* the step's fp32 gradient (one buffer, counted as buckets) */
  weftStream_t reduced_on;      /* the stream of the last reduction queued (reduced_any) */
  int reduced_any;
  weftStream_t zero_stream;     /* a device context's own stream, for zeroing a reused
                                   bucket (NULL on the host, whose zeroing is immediate) */
};

/* Allocation by category through z->ops (zeroed, zero_mem.c); the report
 * counts from these. */
weftResult_t zero_alloc(struct weftZero *z, enum zero_mem cat, size_t nbytes, void **ptr_out);

/* Buffer pools (zero_pool.c). fits: nbytes can be had within bound (0:
 * none): an idle buffer, or a new one beside those in use. take: a buffer
 * of at least nbytes (new ones zeroed), stream ordered after its last
 * user's release; give: back to the pool (ptr NULL: nothing), with a
 * release recorded on stream when ordered; destroy: frees every buffer
 * (waiting for ordered releases). */
int zero_pool_fits(const struct weftZero *z, const struct zero_pool *p, size_t bound,
                   size_t nbytes);
weftResult_t zero_pool_take(struct weftZero *z, struct zero_pool *p, size_t nbytes,
                            weftStream_t stream, void **ptr_out);
weftResult_t zero_pool_give(struct weftZero *z, struct zero_pool *p, void *ptr,
                            weftStream_t stream, int ordered);
weftResult_t zero_pool_destroy(struct weftZero *z, struct zero_pool *p);
/* Work queued on a is ordered before what is queued on b: the same host
 * stream (a host stream waits for its work before it is destroyed, so its
 * handle names one queue; a CUDA stream's may be reused while work it had
 * is still running, so device contexts always wait on an event). */
int zero_same_stream(const struct weftZero *z, weftStream_t a, weftStream_t b);

/* reduceEveryMicroStep in effect: stages 2-3 reduce every micro-step. */
static inline int zero_reduces_micro_steps(const struct weftZero *z) {
  return z->cfg.reduceEveryMicroStep && z->cfg.stage >= 2;
}

/* Stages 2-3: layer l's buffers of an earlier micro-step's reduction back to
 * the pool once it is done (waits for it; nothing when none was sent). */
weftResult_t zero_layer_retire(struct weftZero *z, struct zero_layer *l);

/* Stages 1-3: a zeroed gradient buffer of nbytes from the bucket pool. */
weftResult_t zero_bucket_take(struct weftZero *z, size_t nbytes, void **ptr_out);

/* fp16's dynamic loss scale stays within [1, 2^24], the range mixed-precision
 * loss scalers commonly keep: persistent overflows would halve it to 0,
 * clean steps double it to infinity. clamp brings a scale into it. */
#define ZERO_LOSS_SCALE_MIN 1.0
#define ZERO_LOSS_SCALE_MAX 16777216.0
double zero_loss_scale_clamp(double scale);

/* Where the optimizer state lives and its math runs: the context's ops, or
 * offload_ops with offloadOptimizer. */
static inline const struct zero_ops *zero_opt_ops(const struct weftZero *z) {
  return z->cfg.offloadOptimizer ? z->offload_ops : z->ops;
}

/* Optimizer arrays per element: master and moments. */
int zero_optim_arrays(weftZeroOptimizer_t optimizer);

/* Owned fp32 master -> parameters of every rank: each layer's write-back
 * (and at stages 1-2 its all-gather) queued on stream with the layer's
 * gather event recorded after it, in flight on return (a host context's
 * write-back is done at once: stages 0 and 3 record nothing); with the NULL
 * stream complete on return. Collective for stages 1-2. */
weftResult_t zero_publish_params(struct weftZero *z, weftStream_t stream);

/* Where the reduced gradients of layer l's owned range are, and their type
 * (zero_mem.c). */
const void *zero_owned_grads(const struct weftZero *z, const struct zero_layer *l,
                             weftDataType_t *type_out);
/* offloadOptimizer (zero_offload.c). queue: layer l's owned gradients to
 * the host's staging, queued on stream behind its reduction, so that the
 * copy overlaps the rest of backward (nothing where the ops copy at once:
 * load copies then). load: the step's averaged fp32 gradient into g (host)
 * and this rank's statistics (non-finite count, sum of squares) into stats,
 * for the step to agree on. adamw, sgd, scale: the update of the owned range on
 * cfg.offloadThreads threads, each walking the runs of one weight decay
 * (decay_runs) within its part: AdamW's coef with wd = lr * the run's decay,
 * SGD's decay the run's. threads_default: the CPUs this process may run on,
 * shared among the host's ranks where the launcher says how many. */
#define ZERO_OFFLOAD_THREADS_MAX 64
weftResult_t zero_offload_queue(struct weftZero *z, struct zero_layer *l, weftStream_t stream);
weftResult_t zero_offload_load(struct weftZero *z, float *g, double stats[2],
                               weftStream_t stream);
weftResult_t zero_offload_adamw(struct weftZero *z, const float *g,
                                const struct zero_adamw_coef *coef, double lr);
weftResult_t zero_offload_sgd(struct weftZero *z, const float *g, float mu, float lr);
weftResult_t zero_offload_scale(struct weftZero *z, float *g, float factor);
int zero_offload_threads_default(void);

/* Waits for the layer's write-back (and gather) queued by the last
 * publication. */
weftResult_t zero_gather_wait(struct weftZero *z, struct zero_layer *l);

/* Gives back this step's gradient buckets and copies, zeroes the gradients
 * (on stream, complete on return). */
weftResult_t zero_grads_reset(struct weftZero *z, weftStream_t stream);

/* Stages 2-3: gives back the buckets of finished reductions. */
weftResult_t zero_buckets_reclaim(struct weftZero *z);

/* Before a collective queued on stream (a reduction, a checkpoint's
 * agreement, weftZeroGetParams' all-gathers): the gathers queued on another
 * stream, the last publication's (stages 1-2: its all-gathers) and stage
 * 3's held or prefetched ones, are ordered first, so that every rank starts
 * its collectives in one order. The host waits for them now, a device
 * queues the wait on stream; gathered stage 3 layers stay held. Nothing
 * waits for gathers queued on stream itself: it keeps their order. */
weftResult_t zero_gathers_order(struct weftZero *z, weftStream_t stream);

/* Waits for the parameter write-backs and gathers in flight; stage 3: drops
 * every gathered layer. */
weftResult_t zero_release_all(struct weftZero *z);

/* Sums n doubles (host memory) over ranks on stream, through context
 * memory; complete on return. */
/* zero_agree.c. model: weftZeroFinalize's comparison of the ranks'
 * configurations, layouts and initial values (collective; weftInvalidUsage
 * naming what differs). step_note: a reduction of bucket or layer `index`
 * queued. step_values: this rank's values for the step's comparison, summed
 * over the ranks with its statistics; step_check: weftInvalidUsage where
 * those sums show that ranks differ (the order of reductions, the learning
 * rate). */
#define ZERO_AGREE_STEP_N 8
weftResult_t zero_agree_model(struct weftZero *z);
static inline void zero_agree_step_note(struct weftZero *z, int index) {
  /* FNV-1a over the indices; zero_agree.c mixes it further */
  z->step_order = (z->step_order ^ ((uint64_t)(uint32_t)index + 1)) * 0x100000001b3ull;
  z->step_reductions++;
}
void zero_agree_step_values(const struct weftZero *z, double out[ZERO_AGREE_STEP_N]);
weftResult_t zero_agree_step_check(struct weftZero *z, const double sums[ZERO_AGREE_STEP_N]);
weftResult_t zero_allreduce_sum(struct weftZero *z, double *vals, size_t n, weftStream_t stream);
/* The largest of each of n doubles (host memory) over ranks, the same way:
 * the checkpoints' agreements. */
weftResult_t zero_allreduce_max(struct weftZero *z, double *vals, size_t n, weftStream_t stream);
/* zero_allreduce_sum on n doubles of context memory. */
weftResult_t zero_allreduce_sum_ctx(struct weftZero *z, double *vals, size_t n,
                                    weftStream_t stream);

/* The optimizer state (master, moment1, moment2) in host memory: the
 * arrays themselves in a host context, copies in a device one
 * (zero_mem.c). zero_state_put writes copies back; zero_state_free frees
 * them (nothing for a host context). */
weftResult_t zero_state_get(struct weftZero *z, float *host_out[3]);
weftResult_t zero_state_put(struct weftZero *z, float *host[3]);
void zero_state_free(struct weftZero *z, float *host[3]);
/* Host copies of the state on either kind of context (NULL where an array
 * is absent), written back by zero_state_install, freed by
 * zero_state_copy_free. */
weftResult_t zero_state_copy(struct weftZero *z, float *host_out[3]);
weftResult_t zero_state_install(struct weftZero *z, float *host[3]);
void zero_state_copy_free(float *host[3]);

#endif
