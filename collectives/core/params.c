/* The collectives layer's parameters. */
#include "params.h"

#include "../../include/weft.h"

struct weft_param coll_params[] = {
    [P_NCHANNELS] = {"WEFT_NCHANNELS", PARAM_INT, "1",
                     "channels (independent rings) per communicator, 1 to 16 (bulk uses them; "
                     "host ring plans take one)", 0, 0, NULL},
    [P_NSLOTS] = {"WEFT_NSLOTS", PARAM_INT, "8", "FIFO slots per connection, 2 to 64", 0, 0,
                  NULL},
    [P_SLOT_BYTES] = {"WEFT_SLOT_BYTES", PARAM_INT, "128K",
                      "bytes per FIFO slot: the pipelining chunk (multiple of 64)", 0, 0, NULL},
    [P_CHECK] = {"WEFT_CHECK", PARAM_INT, "0",
                 "1: ranks compare each collective's signature before running it", 0, 0, NULL},
    [P_ALGO] = {"WEFT_ALGO", PARAM_STR, NULL,
                "algorithms the tuner may pick: ring, tree, rd; ^ excludes; per collective "
                "as allreduce:tree;broadcast:ring", 0, 0, NULL},
    [P_PROTO] = {"WEFT_PROTO", PARAM_STR, NULL,
                 "protocols the tuner may pick: simple, ll; same syntax as WEFT_ALGO", 0, 0, NULL},
    PARAM_END,
};
