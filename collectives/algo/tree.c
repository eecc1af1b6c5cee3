/* Tree all-reduce over the two trees of comm_trees (tree.h): the first half
 * of the buffer goes through tree 0, the second through tree 1, each in
 * slot-sized pieces.
 * Per tree and piece i, every rank does two steps:
 *   up(i):   recv piece i from each child, reduce with its own input, send
 *            the partial result to the parent (a leaf just sends its input;
 *            the root keeps the full result, dividing for avg);
 *   down(i): recv the result from the parent (the root has it), keep it,
 *            send it to each child.
 *
 * The order of the steps is what makes it run concurrently and never
 * deadlock. Every step gets a key: up(i) at depth d is 2i - d, down(i) is
 * 2i + 1 + d; every rank runs its steps (of both trees) in order of (key,
 * tree). A message is consumed by a step whose key is one more than the
 * producer's, so a sender and its receiver put the messages of a connection
 * in the same order, even when the connection carries both trees. Piece i+1
 * follows piece i by 2 on every connection, so of any three messages on a
 * connection, the first's key is at least 2 below the third's, and its
 * consumer (key + 1) comes before the third's producer: with two slots, the
 * credit a send waits for is returned by a step earlier in the global (key,
 * tree) order, never by itself or later (the comm has at least two slots
 * per connection). The earliest unfinished step of all ranks can therefore
 * always proceed. A rank at depth d runs up() about d pieces ahead of
 * down(), so pieces go down while later ones still go up, and the two trees
 * alternate at every key.
 *
 * Piece 0 of each tree carries the call's signature (16 bytes, struct
 * signature_packed) after its data on every link, up and down; a piece
 * leaves a cache line of its slot for it. Each receiver compares it with
 * its own as the piece arrives (peer_recv_signed_wait), so every link of both
 * trees checks the call at no extra message. */
#include <string.h>

#include "../../transport/base/status.h"
#include "../core/plan.h"
#include "../core/signature.h"
#include "../exec/host/prims.h"
#include "../exec/host/prims_peer.h"
#include "../reduce/reduce_host.h"
#include "../core/tree_links.h"
#include "algo.h"

/* One tree's part of the call, from this rank. */
struct tree_half {
  struct tree_links links;
  size_t first;   /* first element of this tree's half */
  size_t count;   /* elements in the half */
  long npieces;
};

struct tree_run {
  struct weftComm *comm;
  weft_reduce_fn reduce;
  size_t elem_nbytes;
  int divisor; /* applied by the root's last reduction (avg); 1 otherwise */
  const char *src;
  char *dst;
  size_t piece_count; /* elements per piece: a slot, less room for the signature */
  struct signature_packed sig;
};

/* Waits for piece i from conn: piece 0 ends in the sender's signature. */
static weftResult_t tree_recv_wait(struct tree_run *r, struct weft_conn *conn, long i,
                                   size_t nbytes, const char **in_out) {
  if (WEFT_SLOT_SIGNATURE && i == 0)
    return peer_recv_signed_wait(r->comm, conn, nbytes + sizeof r->sig, &r->sig, 1, in_out);
  return peer_recv_wait(r->comm, conn, nbytes, in_out);
}

/* Posts piece i, of nbytes at out, to conn: piece 0 with the signature. */
static void tree_send_post(struct tree_run *r, struct weft_conn *conn, char *out, long i,
                           size_t nbytes) {
  if (WEFT_SLOT_SIGNATURE && i == 0) {
    memcpy(out + nbytes, &r->sig, sizeof r->sig);
    nbytes += sizeof r->sig;
  }
  peer_send_post(conn, nbytes);
}

static size_t piece_len(const struct tree_run *r, const struct tree_half *h, long i,
                        size_t *first_out) {
  size_t first = h->first + (size_t)i * r->piece_count;
  *first_out = first;
  return h->count - (first - h->first) < r->piece_count ? h->count - (first - h->first)
                                                         : r->piece_count;
}

/* up(i): children's partial results op own input, to the parent. */
static weftResult_t tree_up(struct tree_run *r, const struct tree_half *h, long i) {
  struct weftComm *comm = r->comm;
  const struct tree_links *l = &h->links;
  size_t first, n = piece_len(r, h, i, &first);
  const size_t esize = r->elem_nbytes, nbytes = n * esize;
  const char *in[TREE_MAX_CHILDREN];
  char *out;
  for (int c = 0; c < l->nchildren; c++)
    WEFT_TRY(tree_recv_wait(r, &comm->recv_conns[l->child[c]], i, nbytes, &in[c]));
  int divisor = 1;
  if (l->parent != TREE_NONE) {
    WEFT_TRY(peer_send_wait(comm, &comm->send_conns[l->parent], &out));
  } else {
    out = r->dst + first * esize; /* the root: the result */
    divisor = r->divisor;
  }
  const char *own = r->src + first * esize;
  if (l->nchildren == 0) memcpy(out, own, nbytes);
  for (int c = 0; c < l->nchildren; c++) /* the last reduction divides */
    r->reduce(out, NULL, c == 0 ? own : out, in[c], n, c == l->nchildren - 1 ? divisor : 1);
  if (l->parent != TREE_NONE) tree_send_post(r, &comm->send_conns[l->parent], out, i, nbytes);
  for (int c = 0; c < l->nchildren; c++) peer_recv_done(&comm->recv_conns[l->child[c]]);
  return weftSuccess;
}

/* down(i): the result from the parent (or the root's own), kept and passed
 * to the children. */
static weftResult_t tree_down(struct tree_run *r, const struct tree_half *h, long i) {
  struct weftComm *comm = r->comm;
  const struct tree_links *l = &h->links;
  size_t first, n = piece_len(r, h, i, &first);
  const size_t nbytes = n * r->elem_nbytes;
  char *mine = r->dst + first * r->elem_nbytes, *out[TREE_MAX_CHILDREN];
  const char *in = mine;
  if (l->parent != TREE_NONE)
    WEFT_TRY(tree_recv_wait(r, &comm->recv_conns[l->parent], i, nbytes, &in));
  for (int c = 0; c < l->nchildren; c++)
    WEFT_TRY(peer_send_wait(comm, &comm->send_conns[l->child[c]], &out[c]));
  if (in != mine) memcpy(mine, in, nbytes);
  for (int c = 0; c < l->nchildren; c++) {
    memcpy(out[c], mine, nbytes);
    tree_send_post(r, &comm->send_conns[l->child[c]], out[c], i, nbytes);
  }
  if (l->parent != TREE_NONE) peer_recv_done(&comm->recv_conns[l->parent]);
  return weftSuccess;
}

/* Connects to every neighbour in both trees, both ways. */
static weftResult_t tree_connect(struct weftComm *comm, const struct tree_half half[2]) {
  int peers[2 * (TREE_MAX_CHILDREN + 1)], npeers = 0;
  for (int t = 0; t < 2; t++) {
    const struct tree_links *l = &half[t].links;
    int mine[TREE_MAX_CHILDREN + 1] = {l->parent, l->child[0], l->child[1], l->child[2]};
    for (int k = 0; k < TREE_MAX_CHILDREN + 1; k++) {
      int dup = mine[k] == TREE_NONE;
      for (int j = 0; j < npeers && !dup; j++) dup = peers[j] == mine[k];
      if (!dup) peers[npeers++] = mine[k];
    }
  }
  return peer_connect(comm, peers, npeers);
}

weftResult_t tree_allreduce(struct weftComm *comm, struct weft_channel *ch,
                            const struct weft_plan *plan, size_t offset, size_t count) {
  (void)ch; /* the trees use point-to-point connections, not the ring's */
  if (count == 0) return weftSuccess;
  struct tree_run r = {.comm = comm,
                       .reduce = reduce_host_fn(plan->datatype, plan->op),
                       .elem_nbytes = weftTypeSize(plan->datatype),
                       .divisor = plan->op == weftAvg ? comm->nranks : 1};
  const size_t esize = r.elem_nbytes;
  r.src = (const char *)plan->sendbuf + offset * esize;
  r.dst = (char *)plan->recvbuf + offset * esize;
  if (comm->nranks == 1) {
    if (r.dst != r.src) memcpy(r.dst, r.src, count * esize);
    return weftSuccess;
  }
  r.piece_count = prims_slot_room(comm->slot_nbytes) / esize;
  signature_pack(&r.sig, plan);

  /* set-up: each tree's half (the second starting 64-byte aligned), its
   * pieces, this rank's links */
  struct tree_half half[2];
  const size_t align = 64 / esize;
  size_t first_half = ((count + 1) / 2 + align - 1) / align * align;
  if (first_half > count) first_half = count;
  long depth_max = 0, npieces_max = 0;
  for (int t = 0; t < 2; t++) {
    struct tree_half *h = &half[t];
    h->links = comm->trees[t]; /* hierarchical across hosts (comm_trees) */
    h->first = t == 0 ? 0 : first_half;
    h->count = t == 0 ? first_half : count - first_half;
    h->npieces = (long)((h->count + r.piece_count - 1) / r.piece_count);
    if (h->links.depth > depth_max) depth_max = h->links.depth;
    if (h->npieces > npieces_max) npieces_max = h->npieces;
  }
  WEFT_TRY(tree_connect(comm, half));

  /* run: every step of both trees in (key, tree) order */
  for (long key = -depth_max; key <= 2 * npieces_max + depth_max; key++) {
    for (int t = 0; t < 2; t++) {
      const struct tree_half *h = &half[t];
      const long d = h->links.depth;
      if ((key + d) % 2 == 0) { /* up(i) has key 2i - d */
        long i = (key + d) / 2;
        if (i >= 0 && i < h->npieces) WEFT_TRY(tree_up(&r, h, i));
      } else { /* down(i) has key 2i + 1 + d */
        long i = (key - 1 - d) / 2;
        if (key - 1 - d >= 0 && i < h->npieces) WEFT_TRY(tree_down(&r, h, i));
      }
    }
  }
  return weftSuccess;
}
