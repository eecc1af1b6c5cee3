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
 * unless NULL. Returns the depth of the deepest rank in either tree, the
 * same on every rank, or -1 when out of memory. */
int comm_trees(const struct peer_info *peers, int nranks, int rank, struct tree_links trees[2],
               struct tree_links (*all_out)[2]);

/* Connects every channel's ring (collective over the bootstrap). */
weftResult_t channels_connect(struct weftComm *comm, uint32_t nslots, size_t slot_nbytes);
void channels_close(struct weftComm *comm);

#endif
