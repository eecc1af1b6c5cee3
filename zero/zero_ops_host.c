/* The host side of zero_ops.h: heap buffers, weft host streams and events,
 * and zero_math.h's arithmetic in plain loops, on the calling thread. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zero_internal.h"

/* The optimizer's loops are built for SSE2, AVX2 and AVX-512 and the CPU's
 * best runs, picked at load time (not under ThreadSanitizer, whose runtime is
 * not up when the picking runs). zero/ builds without contraction, so every
 * version rounds alike. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define HOST_CLONES __attribute__((target_clones("avx2", "avx512f", "default")))
#else
#define HOST_CLONES
#endif

static weftResult_t host_alloc(void **ptr_out, size_t nbytes) {
  void *p = calloc(1, nbytes > 0 ? nbytes : 1);
  if (p == NULL) return zero_fail(weftSystemError, "out of memory for %zu bytes", nbytes);
  *ptr_out = p;
  return weftSuccess;
}

static void host_free(void *ptr) { free(ptr); }

static weftResult_t host_zero(void *ptr, size_t nbytes, weftStream_t stream) {
  (void)stream;
  if (nbytes > 0) memset(ptr, 0, nbytes);
  return weftSuccess;
}

static weftResult_t host_copy(void *dst, const void *src, size_t nbytes, weftStream_t stream) {
  (void)stream;
  if (nbytes > 0) memcpy(dst, src, nbytes);
  return weftSuccess;
}

static weftResult_t host_sync(weftStream_t stream, weftComm_t comm, const char *what) {
  if (stream == NULL) return weftSuccess;
  weftResult_t res = weftStreamSynchronize(stream);
  return res == weftSuccess ? res : zero_fail_weft(res, comm, what);
}

static weftResult_t host_event_create(weftEvent_t *event_out) {
  weftResult_t res = weftEventCreate(event_out);
  return res == weftSuccess ? res : zero_fail_weft(res, NULL, "creating an event");
}

static void host_event_destroy(weftEvent_t event) {
  if (event != NULL) weftEventDestroy(event);
}

static weftResult_t host_event_record(weftEvent_t event, weftStream_t stream) {
  weftResult_t res = weftEventRecord(event, stream);
  return res == weftSuccess ? res : zero_fail_weft(res, NULL, "recording an event");
}

static weftResult_t host_event_sync(weftEvent_t event) {
  weftResult_t res = weftEventSynchronize(event);
  return res == weftSuccess ? res : zero_fail_weft(res, NULL, "waiting for an event");
}

static int host_event_done(weftEvent_t event) { return weftEventQuery(event) == weftSuccess; }

static weftResult_t host_stream_wait(weftStream_t stream, weftEvent_t event) {
  weftResult_t res = weftStreamWaitEvent(stream, event);
  return res == weftSuccess ? res : zero_fail_weft(res, NULL, "ordering a stream after an event");
}

static weftResult_t host_quiesce(void) { return weftSuccess; }

/* host zeroing and copies run at once on the calling thread: no stream */
static weftResult_t host_stream_create(weftStream_t *stream_out) {
  *stream_out = NULL;
  return weftSuccess;
}

static void host_stream_destroy(weftStream_t stream) { (void)stream; }

/* The step's order of sums: one running sum over the layers' elements. */
static weftResult_t host_load_scaled(const void *src, weftDataType_t type, float *dst,
                                     size_t count, double scale, double *stats,
                                     weftStream_t stream) {
  (void)stream;
  double nonfinite = stats[0], squares = stats[1];
  if (type == weftFloat32) { /* the common case without a call per element */
    const float *s = src;
    for (size_t k = 0; k < count; k++) {
      float v = (float)(s[k] * scale);
      nonfinite += !isfinite(v);
      dst[k] = v;
      squares += (double)v * v;
    }
  } else {
    for (size_t k = 0; k < count; k++) {
      float v = (float)(zero_load(src, type, k) * scale);
      nonfinite += !isfinite(v);
      dst[k] = v;
      squares += (double)v * v;
    }
  }
  stats[0] = nonfinite;
  stats[1] = squares;
  return weftSuccess;
}

static weftResult_t host_to_float(const void *src, weftDataType_t type, float *dst, size_t count,
                                  double *scratch, weftStream_t stream) {
  (void)scratch;
  (void)stream;
  if (type == weftFloat32) {
    if (count > 0 && (const void *)dst != src) memmove(dst, src, count * sizeof(float));
    return weftSuccess;
  }
  for (size_t k = 0; k < count; k++) dst[k] = zero_load(src, type, k);
  return weftSuccess;
}

static weftResult_t host_store(const float *src, weftDataType_t type, void *dst, size_t count,
                               weftStream_t stream) {
  (void)stream;
  if (type == weftFloat32) {
    if (count > 0 && dst != (const void *)src) memmove(dst, src, count * sizeof(float));
    return weftSuccess;
  }
  for (size_t k = 0; k < count; k++) zero_store(dst, type, k, src[k]);
  return weftSuccess;
}

static weftResult_t host_add(void *dst, const void *src, weftDataType_t type, size_t count,
                             weftStream_t stream) {
  (void)stream;
  if (type == weftFloat32) {
    float *d = dst;
    const float *s = src;
    for (size_t k = 0; k < count; k++) d[k] += s[k];
    return weftSuccess;
  }
  for (size_t k = 0; k < count; k++)
    zero_store(dst, type, k, zero_load(dst, type, k) + zero_load(src, type, k));
  return weftSuccess;
}

HOST_CLONES static weftResult_t host_scale(float *g, size_t count, float factor, weftStream_t stream) {
  (void)stream;
  for (size_t k = 0; k < count; k++) g[k] *= factor;
  return weftSuccess;
}

HOST_CLONES static weftResult_t host_adamw(float *p, float *m, float *v, const float *g, size_t count,
                               const struct zero_adamw_coef *coef, weftStream_t stream) {
  (void)stream;
  for (size_t i = 0; i < count; i++) zero_adamw_elem(&p[i], &m[i], &v[i], g[i], coef);
  return weftSuccess;
}

HOST_CLONES static weftResult_t host_sgd(float *p, float *m, const float *g, size_t count, float mu, float lr,
                             float wd, weftStream_t stream) {
  (void)stream;
  for (size_t i = 0; i < count; i++) zero_sgd_elem(&p[i], &m[i], g[i], mu, lr, wd);
  return weftSuccess;
}

/* The functions of the host tables but memory's. */
#define ZERO_HOST_WORK                                                          \
  .zero = host_zero, .copy = host_copy, .sync = host_sync,                      \
  .event_create = host_event_create, .event_destroy = host_event_destroy,       \
  .event_record = host_event_record, .event_sync = host_event_sync,             \
  .event_done = host_event_done, .stream_wait = host_stream_wait,               \
  .quiesce = host_quiesce, .stream_create = host_stream_create,                 \
  .stream_destroy = host_stream_destroy, .load_scaled = host_load_scaled,       \
  .to_float = host_to_float, .store = host_store, .add = host_add,              \
  .scale = host_scale, .adamw = host_adamw, .sgd = host_sgd
#define ZERO_HOST_FUNCTIONS .alloc = host_alloc, .free = host_free, ZERO_HOST_WORK

const struct zero_ops zero_ops_host = {.name = "host", .device = 0, ZERO_HOST_FUNCTIONS};

/* Host memory through the device path's branches (the optimizer state and
 * step statistics staged through copies, gather events recorded on the NULL
 * stream): lets machines without a GPU run that logic. */
const struct zero_ops zero_ops_host_staged = {.name = "host-staged", .device = 1,
                                              ZERO_HOST_FUNCTIONS};

/* The host's work on pinned memory (cudaMallocHost, zero_device_ops.c): an
 * offloaded optimizer's state and staging. */
const struct zero_ops zero_ops_pinned = {.name = "pinned", .device = 0, .alloc = zero_pinned_alloc,
                                         .free = zero_pinned_free, ZERO_HOST_WORK};
