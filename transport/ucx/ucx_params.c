/* The UCX transport's settings: built with or without UCX, so that every
 * build lists them (weft-info --config, docs/environment.md). */
#include "ucx_params.h"

#include <stddef.h>

struct weft_param ucx_params[] = {
    [UCX_P_DISABLE] = {.name = "WEFT_UCX_DISABLE", .type = PARAM_INT, .min = 0, .max = 1,
     .out_of_range = PARAM_RANGE_ERROR, .default_str = "0",
     .doc = "`1` disables the UCX transport (builds with UCX), which is preferred over sockets "
            "between hosts; `WEFT_TRANSPORT=ucx` forces it. UCX's own variables (`UCX_TLS`, "
            "`UCX_NET_DEVICES`, ...) pass through to UCX",
     .see = "ucx.md"},
    [UCX_P_EAGER] = {.name = "WEFT_UCX_EAGER", .type = PARAM_INT, .min = -1, .max = 1,
     .out_of_range = PARAM_RANGE_ERROR, .default_str = "-1",
     .doc = "`1`: UCX sends weft's slots eagerly (`RNDV_THRESH` one byte past "
            "`WEFT_SLOT_BYTES`; bulk messages above it go by rendezvous); `0`: UCX's own "
            "rendezvous threshold; `-1`: eager unless an RDMA device is present or "
            "`UCX_RNDV_THRESH` is set",
     .see = "ucx.md"},
    PARAM_END,
};
