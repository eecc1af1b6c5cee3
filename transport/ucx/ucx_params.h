/* The UCX transport's settings (ucx_params.c), indexed by the enum below. */
#ifndef WEFT_UCX_PARAMS_H
#define WEFT_UCX_PARAMS_H

#include "../base/param_load.h"

extern struct weft_param ucx_params[];
enum { UCX_P_DISABLE, UCX_P_EAGER };

#endif
