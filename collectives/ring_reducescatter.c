/* Ring reduce-scatter. Block b of every rank's input is reduced along the ring
 * and lands on rank b. Position i in the ring, k ranks, for each piece:
 *   send the piece of block i-1;
 *   k-2 times recv-reduce-send the block one further back;
 *   recv-reduce-copy our own block into the output (avg divides here). */
#include "../transport/status.h"
#include "plan.h"
#include "prims.h"

weftResult_t ring_reducescatter(struct weftComm *comm, struct weft_channel *ch,
                                const struct weft_plan *plan, size_t offset, size_t count) {
  struct prims p;
  prims_init(&p, comm, ch, plan->datatype, plan->op, plan->proto);
  const int k = comm->nranks, pos = ch->ring_pos;
  const size_t esize = p.elem_nbytes, slot_count = prims_slot_count(&p);
  const char *src = plan->sendbuf;
  char *dst = (char *)plan->recvbuf + offset * esize;
  /* element e of our input block destined for the rank at ring position q */
#define BLOCK(q, e) (src + ((size_t)ch->ring[(q) % k] * plan->count + offset + (e)) * esize)
  for (size_t e = 0; e < count; e += slot_count) {
    size_t n = count - e < slot_count ? count - e : slot_count;
    WEFT_TRY(prims_send(&p, BLOCK(pos + k - 1, e), n));
    for (int j = 2; j < k; j++) WEFT_TRY(prims_recv_reduce_send(&p, BLOCK(pos + k - j, e), n));
    WEFT_TRY(prims_recv_reduce_copy(&p, BLOCK(pos, e), dst + e * esize, n));
  }
#undef BLOCK
  return weftSuccess;
}
