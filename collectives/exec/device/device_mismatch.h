/* A device comm's report of a mismatch its kernels found (device_mismatch.c). */
#ifndef WEFT_DEVICE_MISMATCH_H
#define WEFT_DEVICE_MISMATCH_H

#include "../../../include/weft.h"
#include "dev_types.h"

/* weftInvalidUsage, with a message that names the fields that differ and
 * rank and the peer (or, where the peer's slot held no signature of the
 * step, says that the peer is in another call), from the first found
 * record among recs[0..nrecs); for a send/recv chunk's head, both sizes. */
weftResult_t device_mismatch_error(int rank, const struct dev_mismatch *recs, int nrecs);
/* Whether any of recs[0..nrecs) is found. */
int device_mismatch_found(const struct dev_mismatch *recs, int nrecs);
/* What the first found stall record among recs[0..nrecs) says, into buf:
 * "rank 3 (waiting for its data at step 12 of their connection)"; 0, and
 * nothing written, where none is found. */
int device_stall_describe(char *buf, size_t n, const struct dev_stall *recs, int nrecs);
/* The first of recs[0..nrecs) that a block filled, or NULL. */
const struct dev_stall *device_stall_first(const struct dev_stall *recs, int nrecs);

#endif
