/* The device side of a ZeRO context: the owned shard's optimizer update and
 * the buffer conversions as CUDA kernels on the caller's stream, with
 * zero_math.h's arithmetic (the host's, bit for bit: the kernels are built
 * with nvcc -fmad=false). Buffers are device memory (cudaMalloc); stream is
 * a cudaStream_t (NULL: the default stream). Each call checks its
 * arguments, enqueues one kernel and returns: it does not block. A build
 * without CUDA refuses every call with weftInvalidUsage. Types are
 * weftFloat32, weftBfloat16 and weftFloat16, as on the host. */
#ifndef WEFT_ZERO_DEVICE_H
#define WEFT_ZERO_DEVICE_H

#include <stddef.h>

#include "weft.h"
#include "zero_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when weft_zero was built with CUDA and a device is visible. */
int zero_dev_available(void);

/* dst[i] = (float)(src[i] as fp32 * scale), in double as the host step does;
 * stats (device memory, two doubles, accumulated into, not reset) gains the
 * count of non-finite results and their sum of squares. */
weftResult_t zero_dev_load_scaled(const void *src, weftDataType_t type, float *dst, size_t count,
                                  double scale, double *stats, void *stream);
/* dst[i] = src[i] rounded to type (to nearest even). */
weftResult_t zero_dev_store(const float *src, weftDataType_t type, void *dst, size_t count,
                            void *stream);
/* dst[i] = (dst[i] as fp32 + src[i]) rounded to type. */
weftResult_t zero_dev_accumulate(void *dst, weftDataType_t type, const float *src, size_t count,
                                 void *stream);
/* dst[i] = (dst[i] as fp32 + src[i] as fp32) rounded to type: both of type. */
weftResult_t zero_dev_add(void *dst, const void *src, weftDataType_t type, size_t count,
                          void *stream);
/* g[i] *= factor (gradient clipping). */
weftResult_t zero_dev_scale(float *g, size_t count, float factor, void *stream);
/* AdamW and SGD with momentum on count elements of master weights p and
 * moments m (and v), with the gradient g. */
weftResult_t zero_dev_adamw(float *p, float *m, float *v, const float *g, size_t count,
                            const struct zero_adamw_coef *coef, void *stream);
weftResult_t zero_dev_sgd(float *p, float *m, const float *g, size_t count, float mu, float lr,
                          float wd, void *stream);

/* The kernels' launchers (zero_device_kernels.cu): kind 0 fp32, 1 bf16,
 * 2 fp16; each returns 0 or a cudaError_t, whose text zero_kern_error gives. */
int zero_kern_load_scaled(const void *src, int kind, float *dst, size_t count, double scale,
                          double *stats, void *stream);
int zero_kern_store(const float *src, int kind, void *dst, size_t count, void *stream);
int zero_kern_accumulate(void *dst, int kind, const float *src, size_t count, void *stream);
int zero_kern_add(void *dst, int kind, const void *src, size_t count, void *stream);
int zero_kern_scale(float *g, size_t count, float factor, void *stream);
int zero_kern_adamw(float *p, float *m, float *v, const float *g, size_t count,
                    const struct zero_adamw_coef *coef, void *stream);
int zero_kern_sgd(float *p, float *m, const float *g, size_t count, float mu, float lr, float wd,
                  void *stream);
int zero_kern_device_count(void);
int zero_kern_malloc(void **ptr_out, size_t nbytes);
int zero_kern_free(void *ptr);
int zero_kern_host_malloc(void **ptr_out, size_t nbytes); /* pinned, zeroed */
int zero_kern_host_free(void *ptr);
int zero_kern_memset(void *ptr, size_t nbytes, void *stream);   /* waits for stream */
int zero_kern_copy(void *dst, const void *src, size_t nbytes, void *stream); /* waits */
int zero_kern_copy_async(void *dst, const void *src, size_t nbytes, void *stream);
int zero_kern_sync(void *stream);
int zero_kern_event_create(void **event_out);
int zero_kern_event_destroy(void *event);
int zero_kern_event_record(void *event, void *stream);
int zero_kern_event_sync(void *event);
int zero_kern_event_query(void *event); /* 0 done, 1 not yet, else -(the error) */
int zero_kern_stream_wait(void *stream, void *event); /* does not block */
int zero_kern_device_sync(void);                      /* the whole device */
int zero_kern_stream_create(void **stream_out);       /* non-blocking */
int zero_kern_stream_destroy(void *stream);
int zero_kern_current_device(int *device_out);
const char *zero_kern_error(int err);

#ifdef __cplusplus
}
#endif

#endif
