#include "params.h"
#include "bulk.h"
#include "cma.h"

#include "../include/weft.h"
#include "weft_build_config.h"

#if WEFT_HAVE_UCX
#define UCX_PARAMS ucx_params,
#else
#define UCX_PARAMS
#endif

struct weft_param coll_params[] = {
    [P_NCHANNELS] = {"WEFT_NCHANNELS", PARAM_INT, "1",
                     "channels (independent rings) per communicator, 1 to 16", 0, 0, NULL},
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

struct weft_param *const weft_param_tables[] = {
    log_params,       wait_params, bootstrap_params, transport_params, shm_params,
    socket_params, UCX_PARAMS coll_params, topo_params, cuda_params, cma_params, bulk_params, NULL,
};

void weft_params_reset(void) { param_tables_reset(weft_param_tables); }

void weftConfigPrint(FILE *out) { param_tables_print(weft_param_tables, out ? out : stdout); }
