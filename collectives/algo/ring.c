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
  /* the agreement token of a rooted chain: where the chain's ranks are
   * c0 (the broadcast's root, the reduce's first sender) to c[k-1] (the rank
   * before the broadcast's root, the reduce's root), a rank's data depends
   * only on the checks upstream of it, so nothing it received says that the
   * ranks downstream agreed. c[k-1], whose first step checked the whole chain
   * (each rank checks a link before passing its data on), sends a slot
   * holding the signature to c0 over the link the chain leaves free; c0 to
   * c[k-3] each receive it after their steps and pass it on to the next but
   * the last. So a rank returns success only once every link has compared.
   * Two ranks need none: the slot alone already carries c[1]'s signature to
   * c0, which checks it before it returns. */
  int chain_idx = -1, token_send = 0, token_recv = 0;
  if (rooted && count > 0 && comm->nranks > 1) {
    const int k = comm->nranks;
    const int next_is_root = (g.pos + 1) % k == g.root_pos;
    const int prev_is_root = (g.pos + k - 1) % k == g.root_pos;
    if (plan->coll == COLL_BROADCAST) {
      if (next_is_root) alone_first = PRIMS_SEND;
      if (g.pos == g.root_pos) alone_last = PRIMS_RECV;
      chain_idx = (g.pos - g.root_pos + k) % k;
    } else {
      if (g.pos == g.root_pos) alone_first = PRIMS_SEND;
      if (prev_is_root) alone_last = PRIMS_RECV;
      chain_idx = (g.pos - g.root_pos - 1 + 2 * k) % k;
    }
    token_send = k > 2 && (chain_idx == k - 1 || chain_idx <= k - 3);
    token_recv = k > 2 && chain_idx != k - 1;
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
      if (chain_idx == comm->nranks - 1 && token_send) { /* the chain checked: say so */
        WEFT_TRY(prims_sign_alone(&p, PRIMS_SEND));
        token_send = 0;
      }
    }
  if (token_recv) WEFT_TRY(prims_sign_alone(&p, PRIMS_RECV));
  if (token_send) WEFT_TRY(prims_sign_alone(&p, PRIMS_SEND));
  return weftSuccess;
}

weftResult_t ring_empty_run(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan) {
  if (!WEFT_SLOT_SIGNATURE) return weftSuccess;
  struct prims p;
  prims_init(&p, comm, ch, plan->datatype, weftSum, plan->proto);
  struct signature_packed sig;
  signature_pack(&sig, plan);
  prims_sign(&p, &sig);
  for (int r = 0; r + 1 < comm->nranks; r++) {
    WEFT_TRY(prims_sign_alone(&p, PRIMS_SEND));
    WEFT_TRY(prims_sign_alone(&p, PRIMS_RECV));
  }
  return weftSuccess;
}
