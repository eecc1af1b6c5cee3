/* The p2p transport: device FIFOs of GPUs driven by one process (CommInitAll),
 * addressed directly, with peer access (NVLink or PCIe) between different
 * GPUs. Ranks on the same GPU need nothing more. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "../cuda_ipc/cuda_fifo.h"
#include "../base/param.h"
#include "../base/status.h"

static int p2p_disabled(void) { return param_int(&cuda_params[CUDA_P_P2P_DISABLE]) != 0; }

static int p2p_can_connect(const struct peer_info *sender, const struct peer_info *receiver) {
  return sender->host_hash == receiver->host_hash && sender->pid == receiver->pid &&
         sender->cuda_dev >= 0 && receiver->cuda_dev >= 0;
}

static weftResult_t p2p_send_connect(struct weft_conn *conn, const struct conn_blob *blob) {
  struct cuda_fifo_blob b;
  memcpy(&b, blob->data, sizeof b);
  if (b.pid != (int32_t)getpid())
    return weft_error_set(weftInternalError, "p2p: FIFO of process %d is not ours", (int)b.pid);
  int dev;
  cudaGetDevice(&dev);
  if (dev != b.cuda_dev) {
    int can = 0;
    cudaDeviceCanAccessPeer(&can, dev, b.cuda_dev);
    if (!can)
      return weft_error_set(weftSystemError, "p2p: GPU %d cannot access GPU %d", dev, b.cuda_dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(b.cuda_dev, 0);
    if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled)
      return weft_error_set(weftSystemError, "p2p: enabling access to GPU %d: %s", b.cuda_dev,
                            cudaGetErrorString(err));
    cudaGetLastError();
  }
  conn->priv = NULL; /* the receiver owns the region */
  conn->ctrl = NULL;
  conn->slots = (char *)(uintptr_t)b.base + CUDA_FIFO_CTRL_NBYTES;
  return weftSuccess;
}

const struct weft_transport p2p_transport = {
    .name = "p2p",
    .caps = TRANSPORT_CAP_DEVICE_MEMORY,
    .disabled = p2p_disabled,
    .can_connect = p2p_can_connect,
    .recv_setup = cuda_fifo_recv_setup,
    .send_connect = p2p_send_connect,
    .recv_connect = cuda_fifo_recv_connect,
    .close = cuda_fifo_close,
};
