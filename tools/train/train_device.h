/* weft-train's CUDA side (--device cuda): the rank's GPU and stream, and
 * copies between host memory and the ZeRO context's device memory. Built
 * with the CUDA runtime where nvcc is (TRAIN_CUDA); elsewhere opening
 * refuses. Each failure prints what failed on stderr. */
#ifndef WEFT_TRAIN_DEVICE_H
#define WEFT_TRAIN_DEVICE_H

#include <stddef.h>

#include "weft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Selects GPU local_rank % (visible GPUs), so that ranks share GPUs when
 * there are fewer, and creates a stream. weftInvalidUsage with a message
 * when built without CUDA or no GPU is visible. */
weftResult_t train_dev_open(int local_rank, void **stream_out);
void train_dev_close(void *stream);
/* Copies nbytes between any two of host and device memory; complete on
 * return (ordered after the device's earlier work, as cudaMemcpy is). */
weftResult_t train_dev_copy(void *dst, const void *src, size_t nbytes);
weftResult_t train_dev_sync(void *stream);
weftResult_t train_dev_alloc(void **ptr_out, size_t nbytes);
void train_dev_free(void *ptr);
/* err from a train_kern_* launcher: weftSuccess, or a message on stderr
 * and weftUnhandledCudaError. */
weftResult_t train_dev_launched(int err, const char *what);

/* The MLP's kernels (train_kernels.cu), queued on stream; each returns 0
 * or a cudaError_t. kind: 0 fp32, 1 bf16, 2 fp16. */
int train_kern_to_float(const void *src, int kind, float *dst, size_t count, void *stream);
int train_kern_accumulate(void *dst, int kind, const float *src, size_t count, void *stream);
int train_kern_linear(const float *w, const float *b, const float *x, float *y, int n, int in,
                      int out, int use_tanh, void *stream);
int train_kern_out_delta(const float *y, const float *t, float *d, size_t count, float denom,
                         void *stream);
int train_kern_grad(const float *d, const float *x, float *gw, float *gb, int n, int in, int out,
                    float scale, void *stream);
int train_kern_back_delta(const float *d, const float *w, const float *x, float *dp, int n, int in,
                          int out, void *stream);

#ifdef __cplusplus
}
#endif
#endif
