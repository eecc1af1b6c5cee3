/* Ring reduce: a chain that starts just after the root and ends at it. The
 * first rank sends each piece, the ranks in between recv-reduce-send, and
 * the root recv-reduce-copies into its output (avg divides here). */
#include "../transport/status.h"
#include "plan.h"
#include "prims.h"

weftResult_t ring_reduce(struct weftComm *comm, struct weft_channel *ch,
                         const struct weft_plan *plan, size_t offset, size_t count) {
  struct prims p;
  prims_init(&p, comm, ch, plan->datatype, plan->op, plan->proto);
  const int k = comm->nranks;
  const size_t esize = p.elem_nbytes, slot_count = prims_slot_count(&p);
  const int is_root = comm->rank == plan->root;
  const int is_first = ch->ring[(ch->ring_pos + k - 1) % k] == plan->root;
  const char *src = (const char *)plan->sendbuf + offset * esize;
  char *dst = is_root ? (char *)plan->recvbuf + offset * esize : NULL;
  for (size_t e = 0; e < count; e += slot_count) {
    size_t n = count - e < slot_count ? count - e : slot_count;
    if (is_first) WEFT_TRY(prims_send(&p, src + e * esize, n));
    else if (is_root) WEFT_TRY(prims_recv_reduce_copy(&p, src + e * esize, dst + e * esize, n));
    else WEFT_TRY(prims_recv_reduce_send(&p, src + e * esize, n));
  }
  return weftSuccess;
}
