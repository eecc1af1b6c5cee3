/* The tree all-reduce as step sequences: one source for both executors.
 *
 * The double binary tree (core/tree_links.h) reduces a piece up each tree
 * and broadcasts the result down it, pipelined in slot-sized pieces; each
 * tree carries its own part of the buffer. Small calls take one shallower
 * tree instead (tree_small_links), the whole buffer one part
 * (tree_geom_init_trees). A channel runs one part (tree c
 * % 2 over channel c's share) or, alone, both (the first half over tree 0,
 * the second over tree 1). Per tree and piece i, every rank does
 *   up(i):   receive the piece from each child and reduce it into its own
 *            input, send the partial result to the parent (a leaf sends
 *            its input; the root keeps the result, dividing for avg);
 *   down(i): receive the result from the parent (the root has it), keep
 *            it, send it to each child.
 * Each is cut into the primitives of ring_steps.h, one link at a time, the
 * receive buffer holding the partial result between them:
 *   up, n children:    recv-reduce-copy child 0 op input -> dst, then child
 *                      j op dst -> dst; the last child's step sends to the
 *                      parent instead (recv-reduce-send), or at the root
 *                      divides (avg);
 *   up, a leaf:        send input -> parent;
 *   down, the root:    send dst -> child j, for each child;
 *   down, otherwise:   recv-copy-send parent -> dst and child 0 (a leaf:
 *                      recv parent -> dst), then send dst -> child j >= 1.
 * The reduction is ((input op c0) op c1) op c2 at every rank, whichever
 * executor runs it.
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
 * tree) order, never by itself or later. The earliest unfinished step of
 * all ranks can therefore always proceed. A rank at depth d runs up() about
 * d pieces ahead of down(), so pieces go down while later ones still go up,
 * and the two trees alternate at every key. Cutting a step into one
 * primitive per link keeps this: each primitive waits for a subset of what
 * its step waited for.
 *
 * Compiles as C11, C++ and CUDA (host and device); no pointers to buffers,
 * only element indices and links, so it can be tested on the host without
 * memory. Two ranks or more (one rank is a copy, which the executors do). */
#ifndef WEFT_TREE_STEPS_H
#define WEFT_TREE_STEPS_H

#include <stddef.h>

#include "../core/tree_links.h"
#include "ring_steps.h"

/* The neighbours one channel talks to: the parent and children of the
 * trees it runs, each once. */
#define TREE_MAX_PEERS (2 * (TREE_MAX_CHILDREN + 1))

/* One tree's part of a channel's work. */
struct tree_part {
  struct tree_links links;
  int parent_peer;                    /* index in tree_geom.peer; -1 at the root */
  int child_peer[TREE_MAX_CHILDREN];  /* the same, for each child */
  size_t first;                       /* the part's first element */
  size_t count;                       /* its elements */
  size_t npieces;
};

/* One channel's view of one call. */
struct tree_geom {
  int nparts;                 /* 1, or 2 for a channel alone */
  struct tree_part part[2];
  int npeers;
  int peer[TREE_MAX_PEERS];   /* ranks, in the order parts and links name them */
  size_t piece_count;         /* elements one slot carries */
  long key_first, key_last;   /* the keys the steps take, at most */
};

/* What one step does: prim (enum ring_prim) on elements [elem, elem +
 * count) of both buffers, receiving from peer[recv_peer] and sending to
 * peer[send_peer] (-1: none). A step with a source (ring_prim_has_src)
 * reads this rank's input (src_own: the send buffer) or the partial or
 * final result the receive buffer holds; its reduction divides (avg) when
 * divide is set. piece numbers the step's piece within its tree's part (0:
 * the first message of the call on each of the tree's links). */
struct tree_step {
  int prim;
  int recv_peer;
  int send_peer;
  int src_own;
  int divide;
  size_t piece;
  size_t elem;
  size_t count;
};

RING_HD int tree_peer_index(struct tree_geom *g, int rank) {
  if (rank == TREE_NONE) return -1;
  for (int i = 0; i < g->npeers; i++)
    if (g->peer[i] == rank) return i;
  g->peer[g->npeers] = rank;
  return g->npeers++;
}

/* Sets g up for channel c of nchannels over ntrees trees: trees[0] and
 * trees[1] this rank's links in the two trees of the double binary tree
 * (ntrees 2), or trees[0] its links in the one tree of small calls (ntrees
 * 1: every channel runs its share over it, a channel alone the whole call,
 * as one part); total the call's elements, piece_count the elements of a
 * slot. The order above holds for one tree as for two: what it needs is a
 * child one level below its parent. */
RING_HD void tree_geom_init_trees(struct tree_geom *g, const struct tree_links *trees, int ntrees,
                                  int nchannels, int c, size_t total, size_t elem_nbytes,
                                  size_t piece_count) {
  g->nparts = nchannels == 1 && ntrees == 2 ? 2 : 1;
  g->npeers = 0;
  g->piece_count = piece_count;
  long depth_max = 0;
  size_t npieces_max = 0;
  for (int p = 0; p < g->nparts; p++) {
    struct tree_part *h = &g->part[p];
    const int t = ntrees == 1 ? 0 : nchannels == 1 ? p : c % 2;
    if (nchannels == 1) ring_channel_share(total, g->nparts, elem_nbytes, p, &h->first, &h->count);
    else ring_channel_share(total, nchannels, elem_nbytes, c, &h->first, &h->count);
    h->links = trees[t];
    h->npieces = (h->count + piece_count - 1) / piece_count;
    h->parent_peer = tree_peer_index(g, h->links.parent);
    for (int k = 0; k < TREE_MAX_CHILDREN; k++)
      h->child_peer[k] = k < h->links.nchildren ? tree_peer_index(g, h->links.child[k]) : -1;
    if (h->links.depth > depth_max) depth_max = h->links.depth;
    if (h->npieces > npieces_max) npieces_max = h->npieces;
  }
  g->key_first = -depth_max;
  g->key_last = 2 * (long)npieces_max + depth_max;
}

/* The double binary tree's: trees[0] and trees[1] this rank's links in its
 * two trees. */
RING_HD void tree_geom_init(struct tree_geom *g, const struct tree_links *trees, int nchannels,
                            int c, size_t total, size_t elem_nbytes, size_t piece_count) {
  tree_geom_init_trees(g, trees, 2, nchannels, c, total, elem_nbytes, piece_count);
}

/* Primitives in up(i) and in down(i) of a part. */
RING_HD int tree_up_nsteps(const struct tree_part *h) {
  if (h->links.parent == TREE_NONE) return h->links.nchildren;
  return h->links.nchildren > 0 ? h->links.nchildren : 1;
}
RING_HD int tree_down_nsteps(const struct tree_part *h) {
  if (h->links.parent == TREE_NONE) return h->links.nchildren;
  return h->links.nchildren > 0 ? h->links.nchildren : 1;
}

/* Primitive j of up(i) (up) or down(i) of part h. */
RING_HD void tree_step_at(const struct tree_part *h, size_t piece_count, int up, size_t i, int j,
                          struct tree_step *st) {
  const int n = h->links.nchildren, root = h->links.parent == TREE_NONE;
  st->piece = i;
  st->elem = h->first + i * piece_count;
  st->count = ring_min(piece_count, h->count - i * piece_count);
  st->recv_peer = -1;
  st->send_peer = -1;
  st->src_own = 0;
  st->divide = 0;
  if (up) {
    if (n == 0) { /* a leaf: its input, up */
      st->prim = PRIM_SEND;
      st->send_peer = h->parent_peer;
      st->src_own = 1;
      return;
    }
    st->recv_peer = h->child_peer[j];
    st->src_own = j == 0;
    if (j == n - 1 && !root) { /* the last child's: the partial result, up */
      st->prim = PRIM_RECV_REDUCE_SEND;
      st->send_peer = h->parent_peer;
    } else {
      st->prim = PRIM_RECV_REDUCE_COPY;
      st->divide = root && j == n - 1;
    }
    return;
  }
  if (root) { /* the result, to each child */
    st->prim = PRIM_SEND;
    st->send_peer = h->child_peer[j];
    return;
  }
  if (j == 0) {
    st->recv_peer = h->parent_peer;
    st->prim = n > 0 ? PRIM_RECV_COPY_SEND : PRIM_RECV;
    st->send_peer = n > 0 ? h->child_peer[0] : -1;
    return;
  }
  st->prim = PRIM_SEND;
  st->send_peer = h->child_peer[j];
}

/* A channel's steps in (key, tree) order, one primitive at a time:
 *   tree_iter_init(&o, g);
 *   while (tree_iter_next(g, &o, &st)) ... run st */
struct tree_iter {
  long key;
  int part;
  int up;       /* the (key, part) is an up(), else a down() */
  size_t piece;
  int j, nsteps; /* the next primitive of it, and its primitives */
};

RING_HD void tree_iter_init(struct tree_iter *o, const struct tree_geom *g) {
  o->key = g->key_first - 1;
  o->part = g->nparts - 1;
  o->up = 0;
  o->piece = 0;
  o->j = 0;
  o->nsteps = 0;
}

/* The next primitive; 0 when the channel's steps are done. */
RING_HD int tree_iter_next(const struct tree_geom *g, struct tree_iter *o, struct tree_step *st) {
  while (o->j >= o->nsteps) {
    if (++o->part >= g->nparts) {
      o->part = 0;
      o->key++;
    }
    if (o->key > g->key_last) return 0;
    const struct tree_part *h = &g->part[o->part];
    const long d = h->links.depth, key = o->key;
    o->j = 0;
    o->nsteps = 0;
    if ((key + d) % 2 == 0) { /* up(i) has key 2i - d */
      if (key + d >= 0 && (size_t)((key + d) / 2) < h->npieces) {
        o->up = 1;
        o->piece = (size_t)((key + d) / 2);
        o->nsteps = tree_up_nsteps(h);
      }
    } else if (key - 1 - d >= 0 && (size_t)((key - 1 - d) / 2) < h->npieces) {
      o->up = 0; /* down(i) has key 2i + 1 + d */
      o->piece = (size_t)((key - 1 - d) / 2);
      o->nsteps = tree_down_nsteps(h);
    }
  }
  tree_step_at(&g->part[o->part], g->piece_count, o->up, o->piece, o->j++, st);
  return 1;
}

/* A channel's primitives in all. */
RING_HD size_t tree_nsteps_total(const struct tree_geom *g) {
  size_t n = 0;
  for (int p = 0; p < g->nparts; p++)
    n += g->part[p].npieces *
         (size_t)(tree_up_nsteps(&g->part[p]) + tree_down_nsteps(&g->part[p]));
  return n;
}

#endif
