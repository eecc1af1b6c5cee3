/* The shm transport: the receiver's FIFO lives in a POSIX shared-memory
 * segment that the sender maps, so data moves with one copy in and one out. */
#include <assert.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "../base/param.h"
#include "../base/status.h"
#include "../transport.h"
#include "../base/shm_segment.h"
#include "../topology/topo.h"

struct weft_param shm_params[] = {
    {.name = "WEFT_SHM_DISABLE", .type = PARAM_INT, .min = 0, .max = 1,
     .out_of_range = PARAM_RANGE_ERROR, .default_str = "0",
     .doc = "`1` disables the shared-memory transport"},
    PARAM_END,
};
enum { P_DISABLE };

struct shm_blob {
  char name[SHM_NAME_BYTES];
  uint64_t nbytes;
};
static_assert(sizeof(struct shm_blob) <= sizeof(((struct conn_blob *)0)->data),
               "shm blob too large");

#define SHM_CTRL_NBYTES 4096 /* the slots start on their own page */

static int shm_disabled(void) { return param_int(&shm_params[P_DISABLE]) != 0; }

/* Host memory of ranks that share it. */
static int shm_can_connect(const struct peer_info *sender, const struct peer_info *receiver,
                           const struct transport_need *need, char *why, size_t why_nbytes) {
  if (need->mem != TRANSPORT_MEM_HOST)
    return transport_refuse(why, why_nbytes, "host memory only");
  if (sender->host_hash != receiver->host_hash)
    return transport_refuse(why, why_nbytes, "the ranks are on different hosts");
  return 1;
}

static weftResult_t shm_attach_conn(struct weft_conn *conn, struct shm_segment *seg) {
  struct shm_segment *keep = malloc(sizeof *keep);
  if (keep == NULL) {
    shm_segment_close(seg);
    return weft_error_set(weftSystemError, "out of memory");
  }
  *keep = *seg;
  conn->priv = keep;
  conn->ctrl = seg->base;
  conn->slots = (char *)seg->base + SHM_CTRL_NBYTES;
  conn->step = 0;
  return weftSuccess;
}

static weftResult_t shm_recv_setup(struct weft_conn *conn, struct conn_blob *blob_out) {
  static_assert(sizeof(struct conn_ctrl) <= SHM_CTRL_NBYTES, "ctrl fits its page");
  size_t nbytes = SHM_CTRL_NBYTES + (size_t)conn->nslots * conn->slot_nbytes;
  struct shm_segment seg;
  WEFT_TRY(shm_segment_create(nbytes, topo_mem_place, &seg));
  memset(seg.base, 0, sizeof(struct conn_ctrl));
  struct shm_blob b;
  memset(&b, 0, sizeof b);
  memcpy(b.name, seg.name, sizeof b.name);
  b.nbytes = nbytes;
  memcpy(blob_out->data, &b, sizeof b);
  return shm_attach_conn(conn, &seg);
}

static weftResult_t shm_send_connect(struct weft_conn *conn, const struct conn_blob *blob) {
  struct shm_blob b;
  memcpy(&b, blob->data, sizeof b);
  b.name[sizeof b.name - 1] = '\0';
  WEFT_TRY(transport_check_fifo(conn->peer_rank, conn->nslots, conn->slot_nbytes,
                                b.nbytes - SHM_CTRL_NBYTES));
  struct shm_segment seg;
  WEFT_TRY(shm_segment_attach(b.name, b.nbytes, &seg));
  return shm_attach_conn(conn, &seg);
}

static weftResult_t shm_recv_connect(struct weft_conn *conn) {
  struct shm_segment *seg = conn->priv;
  shm_unlink(seg->name); /* normally already gone: the sender unlinks on attach */
  seg->owner = 0;
  return weftSuccess;
}

static void shm_close(struct weft_conn *conn) {
  struct shm_segment *seg = conn->priv;
  if (seg == NULL) return;
  shm_segment_close_conn(seg);
  free(seg);
  conn->priv = NULL;
  conn->ctrl = NULL;
  conn->slots = NULL;
}

const struct weft_transport shm_transport = {
    .name = "shm",
    .caps = TRANSPORT_CAP_HOST_MEMORY,
    .disable_env = "WEFT_SHM_DISABLE",
    .disabled = shm_disabled,
    .can_connect = shm_can_connect,
    .recv_setup = shm_recv_setup,
    .send_connect = shm_send_connect,
    .recv_connect = shm_recv_connect,
    .close = shm_close,
};
