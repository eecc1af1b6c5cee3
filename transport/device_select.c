/* Which transport carries a device connection (device_select.h). */
#include "device_select.h"

#include <stdio.h>

const char *device_hop_name(enum device_hop hop) {
  switch (hop) {
  case DEVICE_HOP_P2P: return "p2p";
  case DEVICE_HOP_CUDA_IPC: return "cuda_ipc";
  case DEVICE_HOP_HOST_FIFO: return "host_fifo";
  case DEVICE_HOP_NET: return "net";
  default: return "none";
  }
}

static enum device_hop hop_refuse(char *why, size_t why_nbytes, const char *fmt, int from,
                                  int to, const char *reason) {
  if (why_nbytes > 0) snprintf(why, why_nbytes, fmt, from, to, reason);
  return DEVICE_HOP_NONE;
}

/* Ranks of one host: device memory where the GPUs reach each other, else
 * pinned host memory both processes map. */
static enum device_hop hop_same_host(const struct peer_info *s, const struct peer_info *r,
                                     const struct device_hop_env *env, char *why,
                                     size_t why_nbytes) {
  if (env->peer_access) {
    if (s->pid == r->pid && !env->p2p_disabled) return DEVICE_HOP_P2P;
    if (s->pid != r->pid && !env->cuda_ipc_disabled) return DEVICE_HOP_CUDA_IPC;
  }
  if (!env->host_fifo_disabled) return DEVICE_HOP_HOST_FIFO;
  return hop_refuse(why, why_nbytes,
                    "no device transport connects rank %d to rank %d: same host, %s, and the "
                    "host-memory FIFO is disabled (WEFT_DEVICE_HOST_FIFO_DISABLE=1)",
                    s->rank, r->rank,
                    !env->peer_access ? "GPUs without peer access"
                    : s->pid == r->pid ? "p2p disabled (WEFT_P2P_DISABLE=1)"
                                       : "cuda_ipc disabled (WEFT_CUDA_IPC_DISABLE=1)");
}

enum device_hop device_hop_choose(const struct peer_info *sender,
                                  const struct peer_info *receiver,
                                  const struct device_hop_env *env, char *why,
                                  size_t why_nbytes) {
  if (sender->cuda_dev < 0 || receiver->cuda_dev < 0)
    return hop_refuse(why, why_nbytes, "no device transport connects rank %d to rank %d: %s",
                      sender->rank, receiver->rank,
                      sender->cuda_dev < 0 ? "the sender has no GPU" : "the receiver has no GPU");
  if (sender->host_hash == receiver->host_hash)
    return hop_same_host(sender, receiver, env, why, why_nbytes);
  if (env->net >= 0) return DEVICE_HOP_NET;
  return hop_refuse(why, why_nbytes,
                    "no device transport connects rank %d to rank %d: %s", sender->rank,
                    receiver->rank,
                    "they are on different hosts and no network transport (ucx, socket) is "
                    "enabled (WEFT_TRANSPORT, WEFT_SOCKET_DISABLE, WEFT_UCX_DISABLE)");
}
