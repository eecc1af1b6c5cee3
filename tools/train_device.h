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
weftResult_t train_dev_wait_event(void *event); /* a cudaEvent_t */
weftResult_t train_dev_sync(void *stream);
weftResult_t train_dev_alloc(void **ptr_out, size_t nbytes);
void train_dev_free(void *ptr);

#ifdef __cplusplus
}
#endif
#endif
