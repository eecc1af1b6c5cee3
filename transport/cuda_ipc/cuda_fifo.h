/* Device FIFOs for the device executor's connections (cuda_ipc and p2p).
 *
 * The receiver cudaMalloc's one region per connection: a control block of
 * fifo_ctrl_nbytes (the kernels' tail and head counters) and then the slots.
 * The sender maps the same region, through a CUDA IPC handle from another
 * process (several ranks may share one GPU) or directly with peer access in
 * its own process. A weft_conn made by these transports has ctrl == NULL
 * (the host never touches device counters) and slots pointing at the slots
 * in device memory; cuda_fifo_ctrl gives the control block. */
#ifndef WEFT_CUDA_FIFO_H
#define WEFT_CUDA_FIFO_H

#include "../transport.h"

#define CUDA_FIFO_CTRL_NBYTES 256 /* struct dev_fifo_ctrl: tail, head, poison */

/* What a receiver publishes about its FIFO. */
struct cuda_fifo_blob {
  int32_t pid;
  int32_t cuda_dev;
  uint64_t base;       /* the region's device address in the receiver's process */
  uint64_t nbytes;
  uint8_t ipc_handle[64]; /* cudaIpcMemHandle_t */
};
static_assert(sizeof(struct cuda_fifo_blob) <= sizeof(((struct conn_blob *)0)->data),
              "cuda fifo blob fits a conn blob");

/* The control block of a device connection (device address). */
static inline void *cuda_fifo_ctrl(const struct weft_conn *conn) {
  return conn->slots - CUDA_FIFO_CTRL_NBYTES;
}

/* Shared by both transports: allocate and describe the receiver's region, and
 * free whatever an end holds. */
weftResult_t cuda_fifo_recv_setup(struct weft_conn *conn, struct conn_blob *blob_out);
/* Copies nbytes from host memory src to device memory dst (src NULL: zeroes
 * dst) on a non-blocking stream of its own and waits for it. Set-up uses it
 * instead of cudaMemcpy/cudaMemset, whose legacy default stream waits for
 * every blocking stream of the device: kernels of other ranks of this
 * process that wait for this rank (a deadlock until the timeout), and a
 * stream being captured into a graph (the capture fails). Blocks the
 * calling thread; "what" names the copy in the error message. */
weftResult_t cuda_fifo_copy(void *dst, const void *src, size_t nbytes, const char *what);
weftResult_t cuda_fifo_recv_connect(struct weft_conn *conn);
void cuda_fifo_close(struct weft_conn *conn);

/* What every device transport asks first: device memory, a GPU on both
 * ends, one host; where not, the reason in why and 0. */
static inline int cuda_fifo_can_connect(const struct peer_info *sender,
                                        const struct peer_info *receiver,
                                        const struct transport_need *need, char *why,
                                        size_t why_nbytes) {
  if (need->mem != TRANSPORT_MEM_DEVICE)
    return transport_refuse(why, why_nbytes, "device memory only");
  if (sender->cuda_dev < 0 || receiver->cuda_dev < 0)
    return transport_refuse(why, why_nbytes, "the %s has no GPU",
                            sender->cuda_dev < 0 ? "sender" : "receiver");
  if (sender->host_hash != receiver->host_hash)
    return transport_refuse(why, why_nbytes, "the ranks are on different hosts");
  return 1;
}

extern const struct weft_transport cuda_ipc_transport;
extern const struct weft_transport peer_access_transport;

#endif
