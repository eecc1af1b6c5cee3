/* The host executor of the ring algorithms: runs the step sequences of
 * ring_steps.h (shared with the CUDA kernels) with the host primitives. */
#include "../../transport/base/status.h"
#include "../core/signature.h"
#include "../core/plan.h"
#include "../exec/host/prims.h"
#include "ring_steps.h"
#include "algo.h"

_Static_assert((int)RING_ALLREDUCE == (int)COLL_ALLREDUCE &&
                   (int)RING_ALLGATHER == (int)COLL_ALLGATHER &&
                   (int)RING_REDUCESCATTER == (int)COLL_REDUCESCATTER &&
                   (int)RING_BROADCAST == (int)COLL_BROADCAST &&
                   (int)RING_REDUCE == (int)COLL_REDUCE && (int)RING_NCOLLS == (int)COLL_NUM_RING,
               "ring_coll follows coll_kind");

/* Each primitive of ring_steps.h as prims_step's flags (prims.h). */
static const unsigned ring_prim_flags[PRIM_NPRIMS] = {
    [PRIM_SEND] = PRIMS_SEND,
    [PRIM_COPY_SEND] = PRIMS_SEND | PRIMS_COPY,
    [PRIM_RECV] = PRIMS_RECV | PRIMS_COPY,
    [PRIM_RECV_REDUCE_SEND] = PRIMS_RECV | PRIMS_REDUCE | PRIMS_SEND,
    [PRIM_RECV_REDUCE_COPY_SEND] = PRIMS_RECV | PRIMS_REDUCE | PRIMS_SEND | PRIMS_COPY,
    [PRIM_RECV_COPY_SEND] = PRIMS_RECV | PRIMS_SEND | PRIMS_COPY,
    [PRIM_RECV_REDUCE_COPY] = PRIMS_RECV | PRIMS_REDUCE | PRIMS_COPY,
};

static weftResult_t ring_step_run(struct prims *p, const struct ring_step *st, const char *src,
                                  char *dst) {
  if ((unsigned)st->prim >= PRIM_NPRIMS)
    return weft_error_set(weftInternalError, "ring: unknown primitive %d", st->prim);
  const void *s = ring_prim_has_src(st->prim) ? src + st->src_elem * p->elem_nbytes : NULL;
  void *d = ring_prim_has_dst(st->prim) ? dst + st->dst_elem * p->elem_nbytes : NULL;
  return prims_step(p, ring_prim_flags[st->prim], s, d, st->count);
}

static int ring_root_pos(const struct weft_channel *ch, int nranks, int root) {
  for (int i = 0; i < nranks; i++)
    if (ch->ring[i] == root) return i;
  return -1;
}

weftResult_t ring_run(struct weftComm *comm, struct weft_channel *ch, const struct weft_plan *plan,
                      size_t offset, size_t count) {
  struct prims p;
  int reduces = plan->coll == COLL_ALLREDUCE || plan->coll == COLL_REDUCESCATTER ||
                plan->coll == COLL_REDUCE;
  prims_init(&p, comm, ch, plan->datatype, reduces ? plan->op : weftSum, plan->proto);
  struct signature_packed sig; /* rides after the data of the first slot (prims_sign) */
  signature_pack(&sig, plan);
  if (WEFT_SLOT_SIGNATURE) prims_sign(&p, &sig);
  int rooted = plan->coll == COLL_BROADCAST || plan->coll == COLL_REDUCE;
  struct ring_geom g;
  ring_geom_init(&g, (int)plan->coll, comm->nranks, ch->ring_pos,
                 rooted ? ring_root_pos(ch, comm->nranks, plan->root) : -1, plan->count, offset,
                 count, prims_slot_count(&p), p.elem_nbytes);
  /* a rooted chain leaves one link of the ring without data (into the root
   * of a broadcast, out of the root of a reduce): it carries a signature
   * alone, sent first and checked after the receiver's first step (not
   * before: it would delay the chain; not last: two ranks that both think
   * they start the chain would fill each other's FIFOs and wait there), so
   * that every link compares */
  unsigned alone_first = 0, alone_last = 0; /* prims_sign_alone's flags */
  if (rooted && count > 0 && comm->nranks > 1) {
    const int next_is_root = (g.pos + 1) % comm->nranks == g.root_pos;
    const int prev_is_root = (g.pos + comm->nranks - 1) % comm->nranks == g.root_pos;
    if (plan->coll == COLL_BROADCAST) {
      if (next_is_root) alone_first = PRIMS_SEND;
      if (g.pos == g.root_pos) alone_last = PRIMS_RECV;
    } else {
      if (g.pos == g.root_pos) alone_first = PRIMS_SEND;
      if (prev_is_root) alone_last = PRIMS_RECV;
    }
  }
  if (alone_first) WEFT_TRY(prims_sign_alone(&p, alone_first));
  const int nsteps = ring_loop_nsteps(&g);
  const size_t loop_nelems = ring_loop_nelems(&g);
  for (size_t base = 0; base < count; base += loop_nelems)
    for (int s = 0; s < nsteps; s++) {
      struct ring_step st;
      ring_step_at(&g, ch->ring, base, s, &st);
      WEFT_TRY(ring_step_run(&p, &st, plan->sendbuf, plan->recvbuf));
      if (alone_last) {
        WEFT_TRY(prims_sign_alone(&p, alone_last));
        alone_last = 0;
      }
    }
  return weftSuccess;
}
