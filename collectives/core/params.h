/* The collectives layer's parameters (collectives/api/config.c lists every
 * module's table). */
#ifndef WEFT_COLL_PARAMS_H
#define WEFT_COLL_PARAMS_H

#include "../../transport/base/param.h"

extern struct weft_param coll_params[];
enum coll_param {
  P_NCHANNELS,
  P_NSLOTS,
  P_SLOT_BYTES,
  P_CHECK,
  P_ALGO,
  P_PROTO,
  P_DETERMINISTIC,
  P_TREE_SMALL_BYTES,
};

#endif
