/* The transports of device connections, in order of preference: GPUs of one
 * process with peer access first, then CUDA IPC between processes of one
 * host. The device executor indexes this table with a blob's transport. */
#include "transport.h"

#include "cuda_ipc/cuda_fifo.h"

const struct weft_transport *const weft_device_transports[] = {
    &p2p_transport,
    &cuda_ipc_transport,
    NULL,
};
