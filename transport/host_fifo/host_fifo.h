/* The host_fifo transport: a device connection between processes of one
 * host whose GPUs cannot reach each other's memory (no peer access, or p2p
 * and cuda_ipc disabled). The receiver's FIFO is a POSIX shared-memory
 * segment in the kernels' layout (CUDA_FIFO_CTRL_NBYTES of struct
 * dev_fifo_ctrl, then the slots), pinned and mapped for the device in both
 * processes by conn->fifo_mem's map (cudaHostRegister; the identity in the
 * host emulation). conn->ctrl is the host's view (so the host can poison
 * it), conn->slots the device's, and cuda_fifo_ctrl(conn) gives the
 * kernels' ctrl, as for cuda_ipc and p2p. */
#ifndef WEFT_HOST_FIFO_H
#define WEFT_HOST_FIFO_H

#include "../transport.h"

extern const struct weft_transport host_fifo_transport;

#endif
