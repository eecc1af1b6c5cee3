/* The transports of device connections, in order of preference: GPUs of one
 * process with peer access first, then CUDA IPC between processes of one
 * host, then pinned host memory shared by the processes of one host. The
 * device executor indexes this table with a blob's transport (enum
 * device_hop, device_select.h); hops to other hosts use the comm's network
 * transport as a device network connection (net_dev.h). */
#include "transport.h"

#include "cuda_ipc/cuda_fifo.h"
#include "device_select.h"
#include "host_fifo/host_fifo.h"

const struct weft_transport *const weft_device_transports[] = {
    &p2p_transport,
    &cuda_ipc_transport,
    &host_fifo_transport,
    NULL,
};

_Static_assert(DEVICE_HOP_P2P == 0 && DEVICE_HOP_CUDA_IPC == 1 && DEVICE_HOP_HOST_FIFO == 2,
               "enum device_hop indexes the table");
