/* Ring all-gather. Each rank's block travels once around the ring, in pieces
 * of one slot. Position i in the ring, k ranks, for each piece:
 *   copy-send our own block's piece (into our output, and on);
 *   k-2 times recv-copy-send the block of the rank j steps back;
 *   recv the block of the next rank, which has come all the way round. */
#include "../transport/status.h"
#include "plan.h"
#include "prims.h"

weftResult_t ring_allgather(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count) {
  struct prims p;
  prims_init(&p, comm, ch, plan->datatype, weftSum, plan->proto);
  const int k = comm->nranks, pos = ch->ring_pos;
  const size_t esize = p.elem_nbytes, slot_count = prims_slot_count(&p);
  const char *src = (const char *)plan->sendbuf + offset * esize;
  char *dst = plan->recvbuf;
  /* element e of the block of the rank at ring position q */
#define BLOCK(q, e) (dst + ((size_t)ch->ring[(q) % k] * plan->count + offset + (e)) * esize)
  for (size_t e = 0; e < count; e += slot_count) {
    size_t n = count - e < slot_count ? count - e : slot_count;
    WEFT_TRY(prims_copy_send(&p, src + e * esize, BLOCK(pos, e), n));
    for (int j = 1; j < k - 1; j++) WEFT_TRY(prims_recv_copy_send(&p, BLOCK(pos + k - j, e), n));
    WEFT_TRY(prims_recv(&p, BLOCK(pos + 1, e), n));
  }
#undef BLOCK
  return weftSuccess;
}
