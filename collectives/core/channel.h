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
 * unless NULL. small (unless NULL): the trees of small calls
 * (comm_tree_links), on one host tree_small_links over the ring order as
 * both trees, across hosts the two trees again. Returns the depth of the
 * deepest rank in either tree, the same on every rank, or -1 when out of
 * memory. */
int comm_trees(const struct peer_info *peers, int nranks, int rank, struct tree_links trees[2],
               struct tree_links small[2], struct tree_links (*all_out)[2]);

/* The trees an all-reduce of nbytes takes, the same on every rank and in
 * both executors: comm->tree_small up to WEFT_TREE_SMALL_BYTES, else
 * comm->trees. */
const struct tree_links *comm_tree_links(const struct weftComm *comm, size_t nbytes);

/* Connects every channel's ring (collective over the bootstrap). */
weftResult_t channels_connect(struct weftComm *comm, uint32_t nslots, size_t slot_nbytes);
void channels_close(struct weftComm *comm);

#endif
