/* Channels (core/channel.c): the ring order, the two trees, and each
 * channel's ring connected through the transports. */
#ifndef WEFT_CHANNEL_H
#define WEFT_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"

/* The ring order: ranks of one host adjacent, hosts by their lowest rank. */
void ring_order(const struct peer_info *peers, int nranks, int *ring_out);

/* Rank's links in the two trees over peers: hierarchical across hosts
 * (tree_hier_links over the ring order); every rank's too in all_out[nranks]
 * unless NULL; and in *small (unless NULL) the tree of small calls,
 * tree_small_links over the ring order. Returns the depth of the deepest
 * rank in either of the two trees, the same on every rank, or -1 when out
 * of memory. */
int comm_trees(const struct peer_info *peers, int nranks, int rank, struct tree_links trees[2],
               struct tree_links *small, struct tree_links (*all_out)[2]);

/* Whether a tree all-reduce of nbytes takes comm->tree_small (as one tree,
 * tree_geom_init_trees) rather than the double binary tree comm->trees:
 * up to WEFT_TREE_SMALL_BYTES on one host, never across hosts. The same on
 * every rank and in both executors. */
int comm_tree_small(const struct weftComm *comm, size_t nbytes);

/* Connects every channel's ring (collective over the bootstrap). */
weftResult_t channels_connect(struct weftComm *comm, uint32_t nslots, size_t slot_nbytes);
void channels_close(struct weftComm *comm);

#endif
