/* Every module's parameter table (collectives/api/config.c). */
#ifndef WEFT_CONFIG_H
#define WEFT_CONFIG_H

#include "../../transport/base/param.h"

/* Every table of every module, NULL-terminated, in layer order. */
extern struct weft_param *const weft_param_tables[];

/* Forgets every cached value (tests change the environment between runs). */
void weft_params_reset(void);

#endif
