/* The LL protocol's step (prims_ll.c), private to the host executor:
 * prims_step calls it when prims_init chose PROTO_LL. */
#ifndef WEFT_PRIMS_LL_H
#define WEFT_PRIMS_LL_H

#include <stddef.h>

#include "prims.h"

/* In slot_used_nbytes: the slot was filled by LL; the low bits count its
 * bytes (8 per word, flags included). Bit 31 is send/recv's, bits 0-26 the bytes. */
#define PRIMS_LL_USED_MARK 0x40000000u
#define PRIMS_USED_NBYTES_MASK 0x07ffffffu

/* prims_step under LL, flags checked. */
weftResult_t prims_ll_step(struct prims *p, unsigned flags, const void *src, void *dst,
                           size_t count);

/* prims_sign_alone under LL. */
weftResult_t prims_ll_sign_alone(struct prims *p, unsigned flags);

#endif
