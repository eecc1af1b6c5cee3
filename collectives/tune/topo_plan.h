/* Plans for a topology: the peer info that nranks ranks on nhosts copies of
 * a topology would exchange, so that the rings, trees and transports weft
 * would build there can be printed (weft-topo) and tested without the
 * machine. */
#ifndef WEFT_TOPO_PLAN_H
#define WEFT_TOPO_PLAN_H

#include "../../transport/bootstrap/bootstrap.h"
#include "../../transport/topology/topo.h"

/* The most ranks a plan takes: ring order and trees cost O(nranks^2). */
#define TOPO_PLAN_MAX_RANKS 16384

/* Fills peers_out[nranks] for ranks spread over nhosts hosts of topo as
 * weftTopoPrint describes (flags: WEFT_TOPO_GPUS, WEFT_TOPO_ROUND_ROBIN).
 * Host h gets host_hash h + 1 and hostname "hostH". */
weftResult_t topo_plan_peers(const struct topo *topo, int nranks, int nhosts, int flags,
                             struct peer_info *peers_out);

/* Crossings of a ring: neighbours (ring[i], ring[i+1 mod n]) on different
 * hosts, on different NUMA nodes (or hosts), behind different PCI switches
 * (or hosts). */
struct ring_crossings {
  int hosts, numa, switches;
};
void ring_count_crossings(const struct peer_info *peers, int nranks, const int *ring,
                          struct ring_crossings *out);

#endif
