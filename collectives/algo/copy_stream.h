/* When copies between ranks of one host bypass the caches (streaming
 * stores, copy_host_stream): the single-copy collectives (cma.c) and groups
 * of sends and receives (sendrecv.c) judge it alike. */
#ifndef WEFT_COPY_STREAM_H
#define WEFT_COPY_STREAM_H

#include <stddef.h>

#include "../../transport/base/param.h"

extern struct weft_param copy_stream_params[];

/* From what size of each rank's output a call's copies go past the caches:
 * where all nranks ranks' outputs together no longer fit in the last-level
 * cache, counted at 32 MiB at most (WEFT_CMA_STREAM_NBYTES overrides). */
size_t copy_stream_min_nbytes(int nranks);

#endif
