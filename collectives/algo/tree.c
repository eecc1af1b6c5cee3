/* Tree all-reduce over the two trees of comm_trees (tree_links.h; small
 * calls over one shallower tree, whole: comm_tree_small): the
 * first half of the buffer goes through tree 0, the second through tree 1,
 * each in slot-sized pieces, reduced up and broadcast down. The steps and
 * their order (which keeps the trees concurrent and free of deadlock) are
 * tree_steps.h's, which the device kernels run as well; here each step is
 * one primitive on the point-to-point connections to a parent or child.
 *
 * Piece 0 of each tree carries the call's signature (16 bytes, struct
 * signature_packed) after its data on every link, up and down; a piece
 * leaves room in its slot for it. Each receiver compares it with its own as
 * the piece arrives (peer_recv_signed_wait), so every link of both trees
 * checks the call at no extra message. */
#include <string.h>

#include "../../transport/base/status.h"
#include "../core/plan.h"
#include "../core/signature.h"
#include "../exec/host/prims.h"
#include "../exec/host/prims_peer.h"
#include "../reduce/reduce_host.h"
#include "../core/channel.h"
#include "../core/tree_links.h"
#include "algo.h"
#include "tree_steps.h"

struct tree_run {
  struct weftComm *comm;
  const struct tree_geom *g;
  weft_reduce_fn reduce;
  size_t elem_nbytes;
  int divisor; /* applied by the root's last reduction (avg); 1 otherwise */
  const char *src;
  char *dst;
  struct signature_packed sig;
};

/* One step: the slot from the peer it receives from, op the input it
 * reduces (a ((input op c0) op c1) ... order, as tree_steps.h says), into
 * the slot to the peer it sends to and/or the receive buffer. */
static weftResult_t tree_step_run(struct tree_run *r, const struct tree_step *st) {
  struct weftComm *comm = r->comm;
  const size_t off = st->elem * r->elem_nbytes, nbytes = st->count * r->elem_nbytes;
  const char *own = st->src_own ? r->src + off : r->dst + off;
  char *mine = r->dst + off;
  const char *in = NULL;
  char *out = NULL;
  struct weft_conn *rc = NULL, *sc = NULL;
  if (st->recv_peer >= 0) {
    rc = &comm->recv_conns[r->g->peer[st->recv_peer]];
    if (WEFT_SLOT_SIGNATURE && st->piece == 0) /* piece 0 ends in the sender's signature */
      WEFT_TRY(peer_recv_signed_wait(comm, rc, nbytes + sizeof r->sig, &r->sig, 1, &in));
    else
      WEFT_TRY(peer_recv_wait(comm, rc, nbytes, &in));
  }
  if (st->send_peer >= 0) {
    sc = &comm->send_conns[r->g->peer[st->send_peer]];
    WEFT_TRY(peer_send_wait(comm, sc, &out));
  }
  char *target = out != NULL ? out : mine;
  if (in != NULL && ring_prim_has_src(st->prim))
    r->reduce(target, NULL, own, in, st->count, st->divide ? r->divisor : 1);
  else if (nbytes > 0 && target != (in != NULL ? in : own))
    memcpy(target, in != NULL ? in : own, nbytes);
  if (out != NULL && ring_prim_has_dst(st->prim) && nbytes > 0) memcpy(mine, out, nbytes);
  if (sc != NULL) {
    if (WEFT_SLOT_SIGNATURE && st->piece == 0) /* piece 0 with the signature */
      peer_send_post_signed(sc, nbytes, &r->sig);
    else
      peer_send_post(sc, nbytes);
  }
  if (rc != NULL) peer_recv_done(rc);
  return weftSuccess;
}

weftResult_t tree_allreduce(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count) {
  (void)ch; /* the trees use point-to-point connections, not the ring's */
  if (count == 0) return weftSuccess;
  const size_t esize = weftTypeSize(plan->datatype);
  struct tree_geom g;
  struct tree_run r = {.comm = comm,
                       .g = &g,
                       .reduce = reduce_host_fn(plan->datatype, plan->op),
                       .elem_nbytes = esize,
                       .divisor = plan->op == weftAvg ? comm->nranks : 1,
                       .src = (const char *)plan->sendbuf + offset * esize,
                       .dst = (char *)plan->recvbuf + offset * esize};
  if (comm->nranks == 1) {
    if (r.dst != r.src) memcpy(r.dst, r.src, count * esize);
    return weftSuccess;
  }

  /* set-up: both trees on one channel (hierarchical across hosts:
   * comm_trees; a small call, by comm_tree_small on the whole call's size
   * as the device decides, the one tree of small calls), a slot per piece
   * less the signature's room, connected to every neighbour both ways */
  signature_pack(&r.sig, plan);
  const size_t piece = prims_slot_room(comm->slot_nbytes) / esize;
  if (comm_tree_small(comm, plan->count * esize))
    tree_geom_init_trees(&g, &comm->tree_small, 1, 1, 0, count, esize, piece);
  else
    tree_geom_init(&g, comm->trees, 1, 0, count, esize, piece);
  WEFT_TRY(peer_connect(comm, g.peer, g.npeers));

  /* run: every step of both trees in (key, tree) order */
  struct tree_iter order;
  struct tree_step st;
  tree_iter_init(&order, &g);
  while (tree_iter_next(&g, &order, &st)) WEFT_TRY(tree_step_run(&r, &st));
  return weftSuccess;
}
