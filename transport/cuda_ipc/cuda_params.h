/* The device transports' settings (cuda_params.c), indexed by enum
 * cuda_param. */
#ifndef WEFT_CUDA_PARAMS_H
#define WEFT_CUDA_PARAMS_H

#include "../base/param.h"

enum cuda_param {
  CUDA_P_IPC_DISABLE,
  CUDA_P_PEER_ACCESS_DISABLE,
  CUDA_P_NET_GDR,
  CUDA_P_HOST_FIFO_DISABLE,
  CUDA_P_NUM
};

extern struct weft_param cuda_transport_params[];

#endif
