/* Host reduction loops: the datatype x op matrix of the host executor. The
 * arithmetic is reduce_ops.h's, so host and device results are bit-identical. */
#ifndef WEFT_REDUCE_HOST_H
#define WEFT_REDUCE_HOST_H

#include <stddef.h>
#include "../../include/weft.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst0[i] = a[i] op b[i] (then divided by divisor when divisor > 1, used for
 * weftAvg's final step); when dst1 != NULL, dst1[i] receives the same value.
 * a, b, dst0, dst1 may alias each other exactly (in-place) but never
 * partially overlap. count is in elements. */
typedef void (*weft_reduce_fn)(void *dst0, void *dst1, const void *a, const void *b,
                               size_t count, int divisor);

/* The loop for (datatype, op); weftAvg returns the sum loop (the caller passes
 * divisor = nranks at the last step). NULL for an invalid datatype or op. */
weft_reduce_fn reduce_host_fn(weftDataType_t datatype, weftRedOp_t op);

/* dst[i] = src[i] / divisor for the given datatype (avg of a single rank or a
 * final scaling); in-place allowed. divisor <= 1 copies. Does nothing for an
 * invalid datatype. */
void reduce_host_divide(weftDataType_t datatype, void *dst, const void *src, size_t count,
                        int divisor);

/* memcpy for copies larger than the caches: stores that bypass them
 * (no read of each destination line first, no eviction of what the next
 * steps need). Falls back to memcpy where the CPU has none. */
void copy_host_stream(void *dst, const void *src, size_t nbytes);

/* The same copy to each of ndsts destinations at once (each source line
 * loaded once), without the closing fence: call copy_host_stream_fence
 * before another rank may look at any destination. */
void copy_host_stream_to(void *const *dsts, int ndsts, const void *src, size_t nbytes);
void copy_host_stream_fence(void);

/* The vector instructions of the streaming loops: the widest this CPU has,
 * or a narrower one that it also has (the tests run each). */
enum stream_isa { STREAM_ISA_BEST = 0, STREAM_ISA_SSE2 = 1, STREAM_ISA_AVX2 = 2, STREAM_ISA_AVX512 = 3 };
/* The widest this CPU has (SSE2 where it is not x86-64: then plain loops). */
enum stream_isa stream_isa_best(void);
/* copy_host_stream_to with isa's loop (one the CPU has: at most stream_isa_best). */
void copy_host_stream_to_isa(void *const *dsts, int ndsts, const void *src, size_t nbytes,
                             enum stream_isa isa);

/* dsts[k][i] = a[i] op b[i] for every k < ndsts (then divided by divisor
 * when divisor > 1), stored past the caches, as copy_host_stream_to; count
 * elements; no fence. a and b may be any of the destinations exactly (correct,
 * but slow: streaming stores into lines just loaded; in place, reduce in the
 * cache and stream to the other outputs, as cma.c does). */
typedef void (*weft_reduce_stream_fn)(void *const *dsts, int ndsts, const void *a,
                                      const void *b, size_t count, int divisor);
/* Such a loop for (datatype, op) where this CPU has one (float32 and float64
 * sum, avg and prod with AVX-512 or AVX2), else NULL: reduce, then
 * copy_host_stream_to. */
weft_reduce_stream_fn reduce_host_stream_fn(weftDataType_t datatype, weftRedOp_t op);
/* The same with isa's loop: NULL where isa is above stream_isa_best or has
 * no such loop (SSE2). */
weft_reduce_stream_fn reduce_host_stream_fn_isa(weftDataType_t datatype, weftRedOp_t op,
                                                enum stream_isa isa);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_REDUCE_HOST_H */
