/* Environment of the device transports (cuda_ipc, peer_access, host_fifo)
 * and of device network connections. Built in every build, so that
 * weft-info lists them; they matter only with CUDA. */
#include "cuda_params.h"

struct weft_param cuda_transport_params[] = {
    [CUDA_P_IPC_DISABLE] = {"WEFT_CUDA_IPC_DISABLE", PARAM_INT, "0",
     "1 disables the cuda_ipc transport (device FIFOs of other processes)", 0, 0, NULL},
    [CUDA_P_PEER_ACCESS_DISABLE] = {"WEFT_P2P_DISABLE", PARAM_INT, "0",
     "1 disables the peer_access transport (device FIFOs of GPUs in this process)", 0, 0, NULL},
    [CUDA_P_NET_GDR] = {"WEFT_NET_GDR", PARAM_INT, "-1",
     "device FIFOs to other hosts in GPU memory moved by UCX directly (GPUDirect RDMA): -1 "
     "auto, 0 off (pinned host memory), 1 required", 0, 0, NULL},
    [CUDA_P_HOST_FIFO_DISABLE] = {"WEFT_DEVICE_HOST_FIFO_DISABLE", PARAM_INT, "0",
     "1 disables the host_fifo transport (device FIFOs in pinned host memory shared by the "
     "processes of one host, where GPUs lack peer access or peer_access/cuda_ipc are disabled)", 0, 0,
     NULL},
    [CUDA_P_NUM] = PARAM_END,
};
