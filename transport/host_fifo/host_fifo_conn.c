/* The host_fifo transport (host_fifo.h). */
#include "host_fifo.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../cuda_ipc/cuda_fifo.h"
#include "../cuda_ipc/cuda_params.h"
#include "../base/param.h"
#include "../proxy.h"
#include "../base/shm_segment.h"
#include "../topology/topo.h"
#include "../base/status.h"

struct host_fifo_blob {
  char name[SHM_NAME_BYTES];
  uint64_t nbytes;
};
static_assert(sizeof(struct host_fifo_blob) <= sizeof(((struct conn_blob *)0)->data),
              "host fifo blob fits a conn blob");

struct host_fifo_end {
  struct shm_segment seg;
  const struct proxy_fifo_mem *mem;
};

static int host_fifo_disabled(void) {
  return param_int(&cuda_transport_params[CUDA_P_HOST_FIFO_DISABLE]) != 0;
}

/* GPUs of this host, whether or not they reach each other. */
static int host_fifo_can_connect(const struct peer_info *sender, const struct peer_info *receiver,
                                 const struct transport_need *need, char *why,
                                 size_t why_nbytes) {
  if (!cuda_fifo_can_connect(sender, receiver, need, why, why_nbytes)) return 0;
  return 1;
}

/* Maps seg for the device and makes it conn's FIFO; closes seg on failure. */
static weftResult_t host_fifo_attach(struct weft_conn *conn, struct shm_segment *seg) {
  struct host_fifo_end *end = calloc(1, sizeof *end);
  void *dev = NULL;
  weftResult_t res = end == NULL ? weft_error_set(weftSystemError, "out of memory") : weftSuccess;
  if (res == weftSuccess && (conn->fifo_mem == NULL || conn->fifo_mem->map == NULL))
    res = weft_error_set(weftInternalError, "rank %d: a host_fifo connection without device "
                         "memory mapping", conn->peer_rank);
  if (res == weftSuccess) res = conn->fifo_mem->map(seg->base, seg->nbytes, &dev);
  if (res != weftSuccess) {
    free(end);
    shm_segment_close(seg);
    return res;
  }
  end->seg = *seg;
  end->mem = conn->fifo_mem;
  conn->priv = end;
  conn->ctrl = seg->base;
  conn->slots = (char *)dev + CUDA_FIFO_CTRL_NBYTES;
  conn->step = 0;
  return weftSuccess;
}

static weftResult_t host_fifo_recv_setup(struct weft_conn *conn, struct conn_blob *blob_out) {
  size_t nbytes = CUDA_FIFO_CTRL_NBYTES + (size_t)conn->nslots * conn->slot_nbytes;
  struct shm_segment seg;
  WEFT_TRY(shm_segment_create(nbytes, topo_mem_place, &seg));
  memset(seg.base, 0, CUDA_FIFO_CTRL_NBYTES);
  struct host_fifo_blob b;
  memset(&b, 0, sizeof b);
  memcpy(b.name, seg.name, sizeof b.name);
  b.nbytes = nbytes;
  memcpy(blob_out->data, &b, sizeof b);
  return host_fifo_attach(conn, &seg);
}

static weftResult_t host_fifo_send_connect(struct weft_conn *conn, const struct conn_blob *blob) {
  struct host_fifo_blob b;
  memcpy(&b, blob->data, sizeof b);
  b.name[SHM_NAME_BYTES - 1] = '\0';
  WEFT_TRY(transport_check_fifo(conn->peer_rank, conn->nslots, conn->slot_nbytes,
                                b.nbytes - CUDA_FIFO_CTRL_NBYTES));
  struct shm_segment seg;
  WEFT_TRY(shm_segment_attach(b.name, (size_t)b.nbytes, &seg));
  return host_fifo_attach(conn, &seg);
}

static weftResult_t host_fifo_recv_connect(struct weft_conn *conn) {
  struct host_fifo_end *end = conn->priv;
  shm_unlink(end->seg.name); /* normally already gone: the sender unlinks on attach */
  end->seg.owner = 0;
  return weftSuccess;
}

static void host_fifo_close(struct weft_conn *conn) {
  struct host_fifo_end *end = conn->priv;
  if (end != NULL) {
    end->mem->unmap(end->seg.base);
    shm_segment_close_conn(&end->seg);
    free(end);
  }
  conn->priv = NULL;
  conn->ctrl = NULL;
  conn->slots = NULL;
}

const struct weft_transport host_fifo_transport = {
    .name = "host_fifo",
    .caps = TRANSPORT_CAP_DEVICE_MEMORY | TRANSPORT_CAP_PINNED_FIFO,
    .disable_env = "WEFT_DEVICE_HOST_FIFO_DISABLE",
    .disabled = host_fifo_disabled,
    .can_connect = host_fifo_can_connect,
    .recv_setup = host_fifo_recv_setup,
    .send_connect = host_fifo_send_connect,
    .recv_connect = host_fifo_recv_connect,
    .close = host_fifo_close,
};
