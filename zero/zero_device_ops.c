/* The device side of zero_ops.h: cudaMalloc'ed buffers, CUDA streams and
 * events, and zero_device.h's kernels, every CUDA call's failure turned into
 * weftUnhandledCudaError with its text. A build without CUDA has stubs for
 * the runtime calls that fail saying so; weftZeroCreate refuses a device
 * context there first (zero_dev_usable), so they are never reached. */
#include <stdio.h>

#include "zero_device.h"
#include "zero_internal.h"

#ifndef ZERO_HAVE_CUDA
#define ZERO_HAVE_CUDA 0
#endif

#define ZERO_NO_CUDA_ERR (-1000)

#if !ZERO_HAVE_CUDA
int zero_kern_malloc(void **p, size_t n) { (void)p, (void)n; return ZERO_NO_CUDA_ERR; }
int zero_kern_free(void *p) { (void)p; return 0; }
int zero_kern_host_malloc(void **p, size_t n) { (void)p, (void)n; return ZERO_NO_CUDA_ERR; }
int zero_kern_host_free(void *p) { (void)p; return 0; }
int zero_kern_memset(void *p, size_t n, void *s) { (void)p, (void)n, (void)s; return ZERO_NO_CUDA_ERR; }
int zero_kern_copy(void *d, const void *s, size_t n, void *st) {
  (void)d, (void)s, (void)n, (void)st;
  return ZERO_NO_CUDA_ERR;
}
int zero_kern_copy_async(void *d, const void *s, size_t n, void *st) {
  (void)d, (void)s, (void)n, (void)st;
  return ZERO_NO_CUDA_ERR;
}
int zero_kern_sync(void *s) { (void)s; return ZERO_NO_CUDA_ERR; }
int zero_kern_event_create(void **e) { (void)e; return ZERO_NO_CUDA_ERR; }
int zero_kern_event_destroy(void *e) { (void)e; return 0; }
int zero_kern_event_record(void *e, void *s) { (void)e, (void)s; return ZERO_NO_CUDA_ERR; }
int zero_kern_event_sync(void *e) { (void)e; return ZERO_NO_CUDA_ERR; }
int zero_kern_event_query(void *e) { (void)e; return -ZERO_NO_CUDA_ERR; }
int zero_kern_stream_wait(void *s, void *e) { (void)s, (void)e; return ZERO_NO_CUDA_ERR; }
int zero_kern_device_sync(void) { return ZERO_NO_CUDA_ERR; }
int zero_kern_stream_create(void **s) { (void)s; return ZERO_NO_CUDA_ERR; }
int zero_kern_stream_destroy(void *s) { (void)s; return 0; }
int zero_kern_current_device(int *d) { (void)d; return ZERO_NO_CUDA_ERR; }
#endif

/* err from zero_kern_*: weftSuccess, or the failure with its text. */
static weftResult_t dev_cuda(const char *what, int err) {
  if (err == 0) return weftSuccess;
#if ZERO_HAVE_CUDA
  return zero_fail(weftUnhandledCudaError, "%s: %s", what, zero_kern_error(err));
#else
  return zero_fail(weftInvalidUsage, "%s: weft_zero was built without CUDA", what);
#endif
}

weftResult_t zero_dev_usable(void) {
  if (!ZERO_HAVE_CUDA)
    return zero_fail(weftInvalidUsage,
                     "device memory was asked for (memory = weftZeroDeviceMemory), but weft_zero "
                     "was built without CUDA");
  if (!zero_dev_available())
    return zero_fail(weftInvalidUsage,
                     "device memory was asked for (memory = weftZeroDeviceMemory), but no CUDA "
                     "device is visible");
  return weftSuccess;
}

static weftResult_t dev_alloc(void **ptr_out, size_t nbytes) {
  void *p = NULL;
  int err = zero_kern_malloc(&p, nbytes);
  if (err != 0) {
    char what[96];
    snprintf(what, sizeof what, "allocating %zu bytes of device memory", nbytes);
    return dev_cuda(what, err);
  }
  weftResult_t res = dev_cuda("zeroing new device memory", zero_kern_memset(p, nbytes, NULL));
  if (res != weftSuccess) {
    zero_kern_free(p);
    return res;
  }
  *ptr_out = p;
  return weftSuccess;
}

/* A failure here reports an earlier asynchronous error, which the next
 * synchronization reports too: nothing to return it to. */
static void dev_free(void *ptr) {
  if (ptr != NULL) (void)zero_kern_free(ptr);
}

weftResult_t zero_pinned_alloc(void **ptr_out, size_t nbytes) {
  void *p = NULL;
  int err = zero_kern_host_malloc(&p, nbytes);
  if (err != 0) {
    char what[96];
    snprintf(what, sizeof what, "allocating %zu bytes of pinned host memory", nbytes);
    return dev_cuda(what, err);
  }
  *ptr_out = p;
  return weftSuccess;
}

void zero_pinned_free(void *ptr) {
  if (ptr != NULL) (void)zero_kern_host_free(ptr);
}

static weftResult_t dev_zero(void *ptr, size_t nbytes, weftStream_t stream) {
  if (nbytes == 0) return weftSuccess;
  return dev_cuda("zeroing device memory", zero_kern_memset(ptr, nbytes, stream));
}

static weftResult_t dev_copy(void *dst, const void *src, size_t nbytes, weftStream_t stream) {
  if (nbytes == 0) return weftSuccess;
  return dev_cuda("copying to or from device memory", zero_kern_copy(dst, src, nbytes, stream));
}

static weftResult_t dev_copy_async(void *dst, const void *src, size_t nbytes,
                                   weftStream_t stream) {
  if (nbytes == 0) return weftSuccess;
  return dev_cuda("queuing a copy to or from device memory",
                  zero_kern_copy_async(dst, src, nbytes, stream));
}

static weftResult_t dev_sync(weftStream_t stream, weftComm_t comm, const char *what) {
  (void)comm;
  return dev_cuda(what, zero_kern_sync(stream));
}

static weftResult_t dev_event_create(weftEvent_t *event_out) {
  return dev_cuda("creating a CUDA event", zero_kern_event_create(event_out));
}

static void dev_event_destroy(weftEvent_t event) {
  if (event != NULL) (void)zero_kern_event_destroy(event);
}

static weftResult_t dev_event_record(weftEvent_t event, weftStream_t stream) {
  return dev_cuda("recording a CUDA event", zero_kern_event_record(event, stream));
}

static weftResult_t dev_event_sync(weftEvent_t event) {
  return dev_cuda("waiting for a CUDA event", zero_kern_event_sync(event));
}

/* An error counts as done: the wait that follows reports it. */
static int dev_event_done(weftEvent_t event) { return zero_kern_event_query(event) != 1; }

static weftResult_t dev_stream_wait(weftStream_t stream, weftEvent_t event) {
  return dev_cuda("ordering a CUDA stream after an event", zero_kern_stream_wait(stream, event));
}

static weftResult_t dev_quiesce(void) {
  return dev_cuda("waiting for the device", zero_kern_device_sync());
}

static weftResult_t dev_stream_create(weftStream_t *stream_out) {
  return dev_cuda("creating a CUDA stream", zero_kern_stream_create(stream_out));
}

static void dev_stream_destroy(weftStream_t stream) {
  if (stream != NULL) (void)zero_kern_stream_destroy(stream);
}

static weftResult_t dev_to_float(const void *src, weftDataType_t type, float *dst, size_t count,
                                 double *scratch, weftStream_t stream) {
  return zero_dev_load_scaled(src, type, dst, count, 1.0, scratch, stream);
}

/* The math entries are zero_device.h's checked launchers themselves: their
 * signatures are the table's (a stream is a void * in both). */
const struct zero_ops zero_ops_device = {
    .name = "device",
    .device = 1,
    .stream_waits = 1,
    .alloc = dev_alloc,
    .free = dev_free,
    .zero = dev_zero,
    .copy = dev_copy,
    .copy_async = dev_copy_async,
    .sync = dev_sync,
    .event_create = dev_event_create,
    .event_destroy = dev_event_destroy,
    .event_record = dev_event_record,
    .event_sync = dev_event_sync,
    .event_done = dev_event_done,
    .stream_wait = dev_stream_wait,
    .quiesce = dev_quiesce,
    .stream_create = dev_stream_create,
    .stream_destroy = dev_stream_destroy,
    .load_scaled = zero_dev_load_scaled,
    .to_float = dev_to_float,
    .store = zero_dev_store,
    .add = zero_dev_add,
    .scale = zero_dev_scale,
    .adamw = zero_dev_adamw,
    .sgd = zero_dev_sgd,
};

weftResult_t zero_dev_current(int *device_out) {
  return dev_cuda("asking for the current CUDA device", zero_kern_current_device(device_out));
}
