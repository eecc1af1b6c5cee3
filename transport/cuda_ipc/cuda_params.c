/* Environment of the device transports (cuda_ipc, p2p). Built in every
 * build, so that weft-info lists them; they matter only with CUDA. */
#include "../param.h"

struct weft_param cuda_params[] = {
    {"WEFT_CUDA_IPC_DISABLE", PARAM_INT, "0",
     "1 disables the cuda_ipc transport (device FIFOs of other processes)", 0, 0, NULL},
    {"WEFT_P2P_DISABLE", PARAM_INT, "0",
     "1 disables the p2p transport (device FIFOs of GPUs in this process)", 0, 0, NULL},
    PARAM_END,
};
