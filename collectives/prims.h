/* Primitives: the steps algorithms are written in. Each moves one slot (at
 * most slot_nbytes) through the channel's connections:
 *   send            src -> next
 *   copy_send       src -> next and dst (dst may be NULL or src)
 *   recv            prev -> dst
 *   recv_reduce_send        prev op src -> next
 *   recv_reduce_copy_send   prev op src -> next and dst (the final value)
 *   recv_copy_send          prev -> next and dst
 *   recv_reduce_copy        prev op src -> dst
 * The host executor runs them with vectorised loops; every wait is bounded by
 * the comm's timeout and abort flag and the peer's liveness. */
#ifndef WEFT_PRIMS_H
#define WEFT_PRIMS_H

#include <stddef.h>

#include "comm.h"
#include "reduce_host.h"

struct prims {
  struct weftComm *comm;
  struct weft_conn *send; /* may be NULL when the algorithm never sends */
  struct weft_conn *recv;
  weft_reduce_fn reduce;
  size_t elem_nbytes;
  int divisor; /* applied by the final reduction (avg); 1 otherwise */
};

void prims_init(struct prims *p, struct weftComm *comm, struct weft_channel *ch,
                weftDataType_t datatype, weftRedOp_t op);

weftResult_t prims_send(struct prims *p, const void *src, size_t count);
weftResult_t prims_copy_send(struct prims *p, const void *src, void *dst, size_t count);
weftResult_t prims_recv(struct prims *p, void *dst, size_t count);
weftResult_t prims_recv_reduce_send(struct prims *p, const void *src, size_t count);
weftResult_t prims_recv_reduce_copy_send(struct prims *p, const void *src, void *dst,
                                         size_t count);
weftResult_t prims_recv_copy_send(struct prims *p, void *dst, size_t count);
weftResult_t prims_recv_reduce_copy(struct prims *p, const void *src, void *dst, size_t count);

/* Elements per slot for this datatype. */
static inline size_t prims_slot_count(const struct prims *p) {
  return p->send != NULL ? p->send->slot_nbytes / p->elem_nbytes
                         : p->recv->slot_nbytes / p->elem_nbytes;
}

#endif
