/* The device executor's settings (device_params.c), indexed by enum
 * device_param. */
#ifndef WEFT_DEVICE_PARAMS_H
#define WEFT_DEVICE_PARAMS_H

#include "../../../transport/base/param.h"

enum device_param {
  DEVICE_P_NCHANNELS,
  DEVICE_P_SENDRECV_LANES,
  DEVICE_P_RING_INTERLEAVE,
  DEVICE_P_PDL,
  DEVICE_P_PTR_CACHE,
  DEVICE_P_NUM
};

extern struct weft_param device_params[];

#endif
