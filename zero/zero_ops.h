/* The one seam between a context's step code and the memory its buffers
 * live in: host memory (zero_ops_host.c) or CUDA device memory
 * (zero_device.c, over zero_device_kernels.cu). Everything in zero/ that
 * allocates, copies or computes on a context's buffers goes through
 * z->ops, so the host path runs the same step code the device path does.
 *
 * Host: streams are weft host streams, events weft events; copies, zeroing
 * and the math run on the calling thread at once (callers synchronize the
 * stream first where a queued collective writes what they read).
 * Device: buffers are cudaMalloc'ed on the context's device, streams are
 * cudaStream_t (NULL: the legacy default stream), events cudaEvent_t; the
 * math is queued on the stream and returns; zero and copy are queued on
 * the stream and waited for, so they are complete on return, as on the
 * host. Every function that can fail records the text (zero_fail). */
#ifndef WEFT_ZERO_OPS_H
#define WEFT_ZERO_OPS_H

#include <stddef.h>

#include "weft.h"
#include "zero_math.h"

struct zero_ops {
  const char *name; /* "host" or "device" */
  int device;       /* 1: buffers are device memory */
  /* 1: a trainer may order its work after an event on a stream of its own
   * (cudaStreamWaitEvent) instead of waiting on the host, so a stage 3
   * parameter is handed out while its gather's event is still pending */
  int stream_waits;
  /* memory: zeroed on return; free takes NULL */
  weftResult_t (*alloc)(void **ptr_out, size_t nbytes);
  void (*free)(void *ptr);
  weftResult_t (*zero)(void *ptr, size_t nbytes, weftStream_t stream);
  /* between host memory and the context's memory, or within the latter */
  weftResult_t (*copy)(void *dst, const void *src, size_t nbytes, weftStream_t stream);
  /* the same queued on stream behind its work, not waited for (device: to or
   * from pinned host memory); NULL where copies are immediate (the host's
   * tables, whose collectives run on their streams' threads) */
  weftResult_t (*copy_async)(void *dst, const void *src, size_t nbytes, weftStream_t stream);
  /* waits for everything queued on stream; a failure's text names what
   * was being done (and takes comm's last error on the host) */
  weftResult_t (*sync)(weftStream_t stream, weftComm_t comm, const char *what);
  weftResult_t (*event_create)(weftEvent_t *event_out);
  void (*event_destroy)(weftEvent_t event);
  weftResult_t (*event_record)(weftEvent_t event, weftStream_t stream);
  weftResult_t (*event_sync)(weftEvent_t event);
  int (*event_done)(weftEvent_t event); /* 1: the last record was reached */
  /* work queued on stream later starts once event's last record is reached;
   * does not block (but on the host's NULL stream) */
  weftResult_t (*stream_wait)(weftStream_t stream, weftEvent_t event);
  /* waits for all work queued on the context's device by anyone: a
   * release that cannot know the caller's streams (nothing on the host,
   * whose callers compute on their own thread) */
  weftResult_t (*quiesce)(void);
  /* a stream of the context's own (NULL where work is immediate: host) */
  weftResult_t (*stream_create)(weftStream_t *stream_out);
  void (*stream_destroy)(weftStream_t stream);
  /* the math of zero_math.h: dst = (fp32)(src * scale) with stats[0] +=
   * non-finite results, stats[1] += their squares; to_float without stats
   * (scratch: 2 doubles of context memory the device path may write) */
  weftResult_t (*load_scaled)(const void *src, weftDataType_t type, float *dst, size_t count,
                              double scale, double *stats, weftStream_t stream);
  weftResult_t (*to_float)(const void *src, weftDataType_t type, float *dst, size_t count,
                           double *scratch, weftStream_t stream);
  weftResult_t (*store)(const float *src, weftDataType_t type, void *dst, size_t count,
                        weftStream_t stream);
  /* dst += src, both of type (fp32 sums, rounded to type) */
  weftResult_t (*add)(void *dst, const void *src, weftDataType_t type, size_t count,
                      weftStream_t stream);
  weftResult_t (*scale)(float *g, size_t count, float factor, weftStream_t stream);
  weftResult_t (*adamw)(float *p, float *m, float *v, const float *g, size_t count,
                        const struct zero_adamw_coef *coef, weftStream_t stream);
  weftResult_t (*sgd)(float *p, float *m, const float *g, size_t count, float mu, float lr,
                      float wd, weftStream_t stream);
};

extern const struct zero_ops zero_ops_host;
extern const struct zero_ops zero_ops_device;
/* Tests: host memory taken through every branch that only device contexts
 * take (device = 1), so that machines without a GPU run them. */
extern const struct zero_ops zero_ops_host_staged;
/* The host's work on pinned host memory (cudaMallocHost): where a device
 * context's offloaded optimizer state lives (offloadOptimizer). Its memory
 * functions, refused without CUDA: */
extern const struct zero_ops zero_ops_pinned;
weftResult_t zero_pinned_alloc(void **ptr_out, size_t nbytes);
void zero_pinned_free(void *ptr);

/* Whether a device context can be made here: weftSuccess, or
 * weftInvalidUsage saying why (built without CUDA, no device visible). */
weftResult_t zero_dev_usable(void);
/* The calling thread's current CUDA device. */
weftResult_t zero_dev_current(int *device_out);

#endif
