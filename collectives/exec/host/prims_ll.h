/* The LL protocol's primitives (prims_ll.c), private to the host executor:
 * prims_host.c's primitives call these when prims_init chose PROTO_LL. Each
 * has the contract of the prims_* primitive of the same name (prims.h). */
#ifndef WEFT_PRIMS_LL_H
#define WEFT_PRIMS_LL_H

#include <stddef.h>

#include "prims.h"

/* In slot_used_nbytes: the slot was filled by LL; the low bits count its
 * bytes (8 per word, flags included). Bit 31 is p2p's, bits 0-26 the bytes. */
#define PRIMS_LL_USED_MARK 0x40000000u
#define PRIMS_USED_NBYTES_MASK 0x07ffffffu

weftResult_t prims_ll_send(struct prims *p, const void *src, size_t count);
weftResult_t prims_ll_copy_send(struct prims *p, const void *src, void *dst, size_t count);
weftResult_t prims_ll_recv(struct prims *p, void *dst, size_t count);
weftResult_t prims_ll_recv_reduce_send(struct prims *p, const void *src, size_t count);
weftResult_t prims_ll_recv_reduce_copy_send(struct prims *p, const void *src, void *dst,
                                            size_t count);
weftResult_t prims_ll_recv_copy_send(struct prims *p, void *dst, size_t count);
weftResult_t prims_ll_recv_reduce_copy(struct prims *p, const void *src, void *dst,
                                       size_t count);

#endif
