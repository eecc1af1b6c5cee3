/* Which transport carries each device connection (one hop of a device ring
 * or a point-to-point lane): pure decisions on what the ranks exchanged, so
 * that they are tested on the host (device_host) and the CUDA executor only
 * acts on them. Built with and without CUDA.
 *
 *   same process, GPUs with peer access (or one GPU)    p2p
 *   other process of this host, GPUs with peer access   cuda_ipc
 *   same host otherwise (no peer access, or p2p /
 *   cuda_ipc disabled)                                  host_fifo: pinned host memory
 *                                                       shared between the processes
 *   another host                                        the comm's network transport
 *                                                       (ucx, else socket) as a device
 *                                                       network connection (net_dev.h)
 */
#ifndef WEFT_DEVICE_SELECT_H
#define WEFT_DEVICE_SELECT_H

#include <stddef.h>

#include "bootstrap/bootstrap.h"

enum device_hop {
  DEVICE_HOP_NONE = -1,
  DEVICE_HOP_P2P = 0,      /* weft_device_transports[0] */
  DEVICE_HOP_CUDA_IPC = 1, /* weft_device_transports[1] */
  DEVICE_HOP_HOST_FIFO = 2, /* weft_device_transports[2] */
  DEVICE_HOP_NET = 3,      /* a network transport of weft_transports */
};

/* What the environment and the GPUs allow for one hop. */
struct device_hop_env {
  int p2p_disabled;      /* WEFT_P2P_DISABLE */
  int cuda_ipc_disabled; /* WEFT_CUDA_IPC_DISABLE */
  int host_fifo_disabled; /* WEFT_DEVICE_HOST_FIFO_DISABLE */
  /* the sender's GPU can reach the receiver's memory, where the FIFO lies
   * (the same GPU, or cudaDeviceCanAccessPeer from the sender's GPU) */
  int peer_access;
  /* index in weft_transports of the network transport between the two
   * hosts (transport_select), or -1 where none is enabled */
  int net;
};

/* The hop from sender to receiver; DEVICE_HOP_NONE with a message naming
 * both ranks and why in why (why_nbytes > 0). */
enum device_hop device_hop_choose(const struct peer_info *sender,
                                  const struct peer_info *receiver,
                                  const struct device_hop_env *env, char *why,
                                  size_t why_nbytes);

/* A device blob's transport field: the device transport's index for the
 * memory hops, DEVICE_BLOB_NET + the weft_transports index for the network. */
#define DEVICE_BLOB_NET 16

const char *device_hop_name(enum device_hop hop);

#endif
