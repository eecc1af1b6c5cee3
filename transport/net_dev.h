/* Device network connections: the device executor's FIFO for a peer on
 * another host. The FIFO is an ordinary socket or UCX connection of the
 * proxy core (proxy.h) whose memory comes from a struct proxy_fifo_mem:
 * pinned host memory mapped for the device (cudaHostAlloc) in a CUDA
 * build, plain page-aligned memory in the host emulation. Its ctrl page is
 * laid out so that the kernels read it as their struct dev_fifo_ctrl (tail
 * at byte 0, head at byte 64); the kernel fills a slot, records the bytes
 * it put there (slot_used_nbytes, as the host's prims do) and advances
 * tail, the proxy moves those bytes to the peer host's FIFO and hands the
 * credit back through head, exactly as between two hosts' ranks.
 *
 * Failure: the proxy poisons the connection (ctrl->poison) as on the host
 * path; the kernels read that poison word in the mapped FIFO and give up,
 * as they do for a poisoned cuda_ipc or host_fifo connection. Only the SIMPLE protocol crosses
 * hosts (LL lines carry their flags inside the slot, which the proxy cannot
 * tell complete).
 *
 * WEFT_NET_GDR (-1 auto, 0 off, 1 on) chooses device memory for the FIFO
 * where UCX can move it directly (GPUDirect RDMA); this build has no such
 * path: auto and 0 log that the FIFO is in host memory, 1 is refused. */
#ifndef WEFT_NET_DEV_H
#define WEFT_NET_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "../include/weft.h"
#include "proxy.h"
#include "transport.h"
#include "weft_build_config.h"

/* Plain zeroed page-aligned host memory; the device address is the host's:
 * the host emulation of the kernels' side. */
extern const struct proxy_fifo_mem net_dev_mem_host;

/* The memory for this process's device network FIFOs, with the GPUDirect
 * choice made (and logged) on first use: emulated selects net_dev_mem_host;
 * otherwise pinned mapped memory, or an error where CUDA is not built in.
 * WEFT_NET_GDR=1 fails (no GPUDirect path). Does not block. */
weftResult_t net_dev_fifo_mem(int emulated, const struct proxy_fifo_mem **mem_out);

/* The kernel's view of a device network connection's FIFO (device
 * addresses). */
struct net_dev_fifo {
  void *ctrl;   /* read as struct dev_fifo_ctrl */
  uint32_t *used_nbytes; /* the ctrl page's slot_used_nbytes: the sending
                           kernel writes each slot's bytes there before its
                           tail, and the proxy moves those bytes only (so
                           every kernel that fills a network FIFO must:
                           SIMPLE's do; LL never crosses hosts) */
  char *slots;  /* nslots * slot_nbytes */
  uint32_t nslots;
  size_t slot_nbytes;
};

/* conn: a set-up socket or ucx connection made with fifo_mem from
 * net_dev_fifo_mem. */
weftResult_t net_dev_conn_fifo(const struct weft_conn *conn, struct net_dev_fifo *fifo_out);

/* A device kernel is about to use conn (a network connection; others are
 * left alone): its proxy polls without sleeping for NET_DEV_KICK_NS. */
#define NET_DEV_KICK_NS 10000000ull
void net_dev_conn_kick(const struct weft_conn *conn);

/* A launched kernel will fill (sending end) or drain (receiving end)
 * nslots slots of conn, a network connection (others are left alone): its
 * proxy polls until it has, however late the kernel starts
 * (proxy_conn_expect). */
void net_dev_conn_expect(const struct weft_conn *conn, uint64_t nslots);

#ifdef WEFT_TEST_HOOKS
/* The suites' build only: whether the proxy gave up on conn (the peer died,
 * the link went down, the local rank aborted), the host's view of the
 * poison the kernels see. */
int net_dev_conn_failed(const struct weft_conn *conn);
#endif

#if WEFT_HAVE_CUDA
/* cudaHostAlloc'd with cudaHostAllocMapped (net_dev_cuda.c). */
extern const struct proxy_fifo_mem net_dev_mem_cuda;
#endif

#endif
