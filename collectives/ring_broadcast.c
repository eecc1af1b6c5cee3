/* Ring broadcast: a chain that starts at the root and follows the ring. The
 * root copy-sends each piece, the ranks in between recv-copy-send, and the
 * rank just before the root only receives. */
#include "../transport/status.h"
#include "plan.h"
#include "prims.h"

weftResult_t ring_broadcast(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count) {
  struct prims p;
  prims_init(&p, comm, ch, plan->datatype, weftSum, plan->proto);
  const int k = comm->nranks;
  const size_t esize = p.elem_nbytes, slot_count = prims_slot_count(&p);
  const int is_root = comm->rank == plan->root;
  const int is_last = ch->ring[(ch->ring_pos + 1) % k] == plan->root;
  const char *src = is_root ? (const char *)plan->sendbuf + offset * esize : NULL;
  char *dst = (char *)plan->recvbuf + offset * esize;
  for (size_t e = 0; e < count; e += slot_count) {
    size_t n = count - e < slot_count ? count - e : slot_count;
    if (is_root) WEFT_TRY(prims_copy_send(&p, src + e * esize, dst + e * esize, n));
    else if (is_last) WEFT_TRY(prims_recv(&p, dst + e * esize, n));
    else WEFT_TRY(prims_recv_copy_send(&p, dst + e * esize, n));
  }
  return weftSuccess;
}
