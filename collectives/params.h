/* The collectives layer's parameters, and the list of every table. */
#ifndef WEFT_COLL_PARAMS_H
#define WEFT_COLL_PARAMS_H

#include "../transport/param.h"

extern struct weft_param coll_params[];
enum coll_param {
  P_NCHANNELS,
  P_NSLOTS,
  P_SLOT_BYTES,
  P_CHECK,
  P_ALGO,
  P_PROTO,
};

/* Every table of every module, NULL-terminated, in layer order. */
extern struct weft_param *const weft_param_tables[];

/* Forgets every cached value (tests change the environment between runs). */
void weft_params_reset(void);

#endif
