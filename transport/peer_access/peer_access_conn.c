/* The peer_access transport: device FIFOs of GPUs driven by one process
 * (CommInitAll), addressed directly, with peer access (NVLink or PCIe)
 * between different GPUs. Ranks on the same GPU need nothing more. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "../cuda_ipc/cuda_fifo.h"
#include "../cuda_ipc/cuda_params.h"
#include "../base/param.h"
#include "../base/status.h"

static int peer_access_disabled(void) { return param_int(&cuda_transport_params[CUDA_P_PEER_ACCESS_DISABLE]) != 0; }

/* GPUs of one process that reach each other's memory. */
static int peer_access_can_connect(const struct peer_info *sender,
                                   const struct peer_info *receiver,
                                   const struct transport_need *need, char *why,
                                   size_t why_nbytes) {
  if (!cuda_fifo_can_connect(sender, receiver, need, why, why_nbytes)) return 0;
  if (sender->pid != receiver->pid)
    return transport_refuse(why, why_nbytes, "the ranks are in different processes");
  if (!need->peer_access) return transport_refuse(why, why_nbytes, "GPUs without peer access");
  return 1;
}

static weftResult_t peer_access_send_connect(struct weft_conn *conn, const struct conn_blob *blob) {
  struct cuda_fifo_blob b;
  memcpy(&b, blob->data, sizeof b);
  if (b.pid != (int32_t)getpid())
    return weft_error_set(weftInternalError, "peer_access: FIFO of process %d is not ours", (int)b.pid);
  int dev;
  cudaGetDevice(&dev);
  if (dev != b.cuda_dev) {
    int can = 0;
    cudaDeviceCanAccessPeer(&can, dev, b.cuda_dev);
    if (!can)
      return weft_error_set(weftSystemError, "peer_access: GPU %d cannot access GPU %d", dev, b.cuda_dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(b.cuda_dev, 0);
    if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled)
      return weft_error_set(weftSystemError, "peer_access: enabling access to GPU %d: %s", b.cuda_dev,
                            cudaGetErrorString(err));
    cudaGetLastError();
  }
  conn->priv = NULL; /* the receiver owns the region */
  conn->ctrl = NULL;
  conn->slots = (char *)(uintptr_t)b.base + CUDA_FIFO_CTRL_NBYTES;
  return weftSuccess;
}

const struct weft_transport peer_access_transport = {
    .name = "peer_access",
    .caps = TRANSPORT_CAP_DEVICE_MEMORY,
    .disable_env = "WEFT_P2P_DISABLE",
    .disabled = peer_access_disabled,
    .can_connect = peer_access_can_connect,
    .recv_setup = cuda_fifo_recv_setup,
    .send_connect = peer_access_send_connect,
    .recv_connect = cuda_fifo_recv_connect,
    .close = cuda_fifo_close,
};
