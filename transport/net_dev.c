/* Device network connections (net_dev.h): their FIFO memory, the GPUDirect
 * choice, and the kernels' view of a connection. */
#include "net_dev.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/param.h"
#include "base/status.h"
#include "base/wait.h"
#include "cuda_ipc/cuda_params.h"

static weftResult_t net_dev_host_alloc(size_t nbytes, void **host_out, void **dev_out) {
  void *p = NULL;
  int rc = posix_memalign(&p, 4096, nbytes);
  if (rc != 0)
    return weft_error_set(weftSystemError, "allocating a %zu-byte device network FIFO", nbytes);
  memset(p, 0, nbytes);
  *host_out = p;
  *dev_out = p; /* the emulated device shares the host's addresses */
  return weftSuccess;
}

static void net_dev_host_free(void *host, size_t nbytes) {
  (void)nbytes;
  free(host);
}

static weftResult_t net_dev_host_map(void *host, size_t nbytes, void **dev_out) {
  (void)nbytes;
  *dev_out = host;
  return weftSuccess;
}

static void net_dev_host_unmap(void *host) { (void)host; }

const struct proxy_fifo_mem net_dev_mem_host = {
    .name = "host (emulated device)",
    .alloc = net_dev_host_alloc,
    .free = net_dev_host_free,
    .map = net_dev_host_map,
    .unmap = net_dev_host_unmap,
};

static pthread_mutex_t gdr_mutex = PTHREAD_MUTEX_INITIALIZER;
static int gdr_logged;

/* Reads WEFT_NET_GDR and says (once) where the FIFOs go. */
static weftResult_t net_dev_gdr_check(const char *where) {
  int64_t gdr = param_int(&cuda_transport_params[CUDA_P_NET_GDR]);
  if (gdr < -1 || gdr > 1)
    return weft_error_set(weftInvalidArgument, "WEFT_NET_GDR=%lld: must be -1 (auto), 0 or 1",
                          (long long)gdr);
  if (gdr == 1)
    return weft_error_set(weftInvalidArgument,
                          "WEFT_NET_GDR=1: GPUDirect RDMA is unavailable here (no FIFO in device "
                          "memory is built in); use 0 or -1");
  pthread_mutex_lock(&gdr_mutex);
  if (!gdr_logged)
    WEFT_INFO(LOG_NET, "device network FIFOs: %s (WEFT_NET_GDR=%lld; GPUDirect RDMA unavailable "
              "here: no device-memory FIFO path)", where, (long long)gdr);
  gdr_logged = 1;
  pthread_mutex_unlock(&gdr_mutex);
  return weftSuccess;
}

weftResult_t net_dev_fifo_mem(int emulated, const struct proxy_fifo_mem **mem_out) {
  if (emulated) {
    WEFT_TRY(net_dev_gdr_check("host memory, device emulated"));
    *mem_out = &net_dev_mem_host;
    return weftSuccess;
  }
#if WEFT_HAVE_CUDA
  WEFT_TRY(net_dev_gdr_check("pinned host memory mapped for the device"));
  *mem_out = &net_dev_mem_cuda;
  return weftSuccess;
#else
  return weft_error_set(weftInvalidUsage,
                        "device network connections need CUDA, and this build has none");
#endif
}

/* The core's part of a network connection end (socket and ucx both put it
 * first in theirs). */
static const struct proxy_conn *net_dev_proxy_conn(const struct weft_conn *conn) {
  if (conn->priv == NULL || conn->transport == NULL) return NULL;
  if (strcmp(conn->transport->name, "socket") != 0 && strcmp(conn->transport->name, "ucx") != 0)
    return NULL;
  return conn->priv;
}

weftResult_t net_dev_conn_fifo(const struct weft_conn *conn, struct net_dev_fifo *fifo_out) {
  const struct proxy_conn *pc = net_dev_proxy_conn(conn);
  if (pc == NULL)
    return weft_error_set(weftInternalError, "rank %d: not a set-up network connection",
                          conn->peer_rank);
  if (pc->mem == NULL)
    return weft_error_set(weftInternalError,
                          "rank %d: a network connection whose FIFO the device cannot reach",
                          conn->peer_rank);
  fifo_out->ctrl = pc->fifo_dev;
  fifo_out->used_nbytes =
      (uint32_t *)((char *)pc->fifo_dev + offsetof(struct conn_ctrl, slot_used_nbytes));
  fifo_out->slots = (char *)pc->fifo_dev + PROXY_CTRL_NBYTES;
  fifo_out->nslots = pc->nslots;
  fifo_out->slot_nbytes = pc->slot_nbytes;
  return weftSuccess;
}

void net_dev_conn_kick(const struct weft_conn *conn) {
  /* a transport with a kick is a network one, moved by a proxy */
  if (conn->transport != NULL && conn->transport->kick != NULL)
    proxy_conn_kick_for(conn, clock_ns(), NET_DEV_KICK_NS);
}

void net_dev_conn_expect(const struct weft_conn *conn, uint64_t nslots) {
  if (conn->transport != NULL && conn->transport->kick != NULL)
    proxy_conn_expect(conn, nslots, clock_ns());
}

#ifdef WEFT_TEST_HOOKS
int net_dev_conn_failed(const struct weft_conn *conn) {
  const struct proxy_conn *pc = net_dev_proxy_conn(conn);
  return pc == NULL || __atomic_load_n(&pc->ctrl->poison, __ATOMIC_ACQUIRE) != 0;
}
#endif
