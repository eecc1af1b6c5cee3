/* The cuda_ipc transport: device FIFOs of another process on the same host,
 * mapped with CUDA IPC handles. Several ranks may share one GPU: the handle
 * maps the region into each process, whatever device it runs on. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "../base/param.h"
#include "../base/status.h"
#include "cuda_fifo.h"
#include "cuda_params.h"

/* A device end's own state: the region it allocated or mapped. */
struct cuda_fifo_priv {
  void *base;
  int owned;  /* cudaMalloc'd here (receiver) */
  int mapped; /* opened from an IPC handle (sender in another process) */
};

static weftResult_t cuda_fail(cudaError_t err, const char *what) {
  cudaGetLastError();
  return weft_error_set(weftSystemError, "cuda_ipc: %s: %s", what, cudaGetErrorString(err));
}

weftResult_t cuda_fifo_copy(void *dst, const void *src, size_t nbytes, const char *what) {
  cudaStream_t s;
  cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess) return cuda_fail(err, what);
  if (src != NULL) err = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s);
  else err = cudaMemsetAsync(dst, 0, nbytes, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  return err == cudaSuccess ? weftSuccess : cuda_fail(err, what);
}

weftResult_t cuda_fifo_recv_setup(struct weft_conn *conn, struct conn_blob *blob_out) {
  struct cuda_fifo_priv *priv = calloc(1, sizeof *priv);
  if (priv == NULL) return weft_error_set(weftSystemError, "cuda_ipc: out of memory");
  size_t nbytes = CUDA_FIFO_CTRL_NBYTES + (size_t)conn->nslots * conn->slot_nbytes;
  struct cuda_fifo_blob b;
  memset(&b, 0, sizeof b);
  cudaError_t err = cudaMalloc(&priv->base, nbytes);
  if (err != cudaSuccess) {
    free(priv);
    return cuda_fail(err, "allocating a FIFO");
  }
  /* zeroed before any peer can see it: counters at 0 and LL flags that
   * match no step */
  weftResult_t res = cuda_fifo_copy(priv->base, NULL, nbytes, "clearing a FIFO");
  if (res != weftSuccess) {
    cudaFree(priv->base);
    cudaGetLastError();
    free(priv);
    return res;
  }
  priv->owned = 1;
  conn->priv = priv;
  conn->ctrl = NULL;
  conn->slots = (char *)priv->base + CUDA_FIFO_CTRL_NBYTES;
  cudaIpcMemHandle_t handle;
  err = cudaIpcGetMemHandle(&handle, priv->base);
  if (err == cudaSuccess) memcpy(b.ipc_handle, &handle, sizeof handle);
  else cudaGetLastError(); /* peer_access in one process needs no handle */
  b.pid = (int32_t)getpid();
  cudaGetDevice(&b.cuda_dev);
  b.base = (uint64_t)(uintptr_t)priv->base;
  b.nbytes = nbytes;
  memcpy(blob_out->data, &b, sizeof b);
  return weftSuccess;
}

weftResult_t cuda_fifo_recv_connect(struct weft_conn *conn) {
  (void)conn;
  return weftSuccess;
}

void cuda_fifo_close(struct weft_conn *conn) {
  struct cuda_fifo_priv *priv = conn->priv;
  if (priv == NULL) return;
  if (priv->mapped) cudaIpcCloseMemHandle(priv->base);
  if (priv->owned) cudaFree(priv->base);
  cudaGetLastError();
  free(priv);
  conn->priv = NULL;
  conn->slots = NULL;
}

static int cuda_ipc_disabled(void) { return param_int(&cuda_transport_params[CUDA_P_IPC_DISABLE]) != 0; }

/* GPUs of other processes of this host that reach each other's memory. */
static int cuda_ipc_can_connect(const struct peer_info *sender, const struct peer_info *receiver,
                                const struct transport_need *need, char *why,
                                size_t why_nbytes) {
  if (!cuda_fifo_can_connect(sender, receiver, need, why, why_nbytes)) return 0;
  if (sender->pid == receiver->pid)
    return transport_refuse(why, why_nbytes, "the ranks are in one process");
  if (!need->peer_access) return transport_refuse(why, why_nbytes, "GPUs without peer access");
  return 1;
}

static weftResult_t cuda_ipc_send_connect(struct weft_conn *conn, const struct conn_blob *blob) {
  struct cuda_fifo_blob b;
  memcpy(&b, blob->data, sizeof b);
  struct cuda_fifo_priv *priv = calloc(1, sizeof *priv);
  if (priv == NULL) return weft_error_set(weftSystemError, "cuda_ipc: out of memory");
  cudaIpcMemHandle_t handle;
  memcpy(&handle, b.ipc_handle, sizeof handle);
  cudaError_t err = cudaIpcOpenMemHandle(&priv->base, handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    free(priv);
    return cuda_fail(err, "mapping the FIFO of a peer process");
  }
  priv->mapped = 1;
  conn->priv = priv;
  conn->ctrl = NULL;
  conn->slots = (char *)priv->base + CUDA_FIFO_CTRL_NBYTES;
  return weftSuccess;
}

const struct weft_transport cuda_ipc_transport = {
    .name = "cuda_ipc",
    .caps = TRANSPORT_CAP_DEVICE_MEMORY,
    .disable_env = "WEFT_CUDA_IPC_DISABLE",
    .disabled = cuda_ipc_disabled,
    .can_connect = cuda_ipc_can_connect,
    .recv_setup = cuda_fifo_recv_setup,
    .send_connect = cuda_ipc_send_connect,
    .recv_connect = cuda_fifo_recv_connect,
    .close = cuda_fifo_close,
};
