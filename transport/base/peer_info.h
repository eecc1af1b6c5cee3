/* What every rank tells the others about itself at set-up (exchanged by the
 * bootstrap, filled in by the topology code), apart from both.  */
#ifndef WEFT_PEER_INFO_H
#define WEFT_PEER_INFO_H

#include <stdint.h>

#include "sock.h"

struct peer_info {
  int32_t rank;
  int32_t pid;
  uint64_t host_hash; /* equal for ranks that share memory (same host, same namespaces) */
  char hostname[64];
  union weft_sockaddr listen_addr;
  union weft_sockaddr query_addr; /* where its bootstrap answers questions (bootstrap_ask_all) */
  int32_t cuda_dev; /* -1 for a host rank */
  int32_t numa_node;
  int64_t bus_id;
  /* topology (topo.h); -1 when unknown */
  int32_t package;
  int32_t host_bridge;
  int32_t pci_switch;
  int32_t nic; /* index of the NIC this rank uses in its host's topology */
  /* what the communicator's ranks must share (collectives/api/config.c):
   * its channels (WEFT_NCHANNELS within the config's bounds) and a digest
   * of the settings marked so; and whether this rank refused the
   * communicator (a bad setting of its own), which it joins only to say so */
  int32_t nchannels;
  int32_t refused;
  uint64_t settings_digest;
  /* bit i: weft_transports[i] is off on this rank (WEFT_TRANSPORT names
   * another, or its disable setting is 1; transport_peer_info), so that no
   * connection of its uses it, whichever end chooses */
  uint32_t transports_off;
  uint32_t pad;
  /* equal for ranks in one network namespace of one boot of one machine,
   * whatever WEFT_HOSTID says: those that reach each other's loopback */
  uint64_t net_hash;
};

#endif
