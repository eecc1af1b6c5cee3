/* Every module's parameter table, in layer order: what weftConfigPrint
 * prints and what tests reset between runs. */
#include "config.h"

#include "../../include/weft.h"
#include "../algo/bulk.h"
#include "../algo/cma.h"
#include "../algo/copy_stream.h"
#include "../algo/sendrecv_cma.h"
#include "../core/params.h"
#include "weft_build_config.h"

#if WEFT_HAVE_UCX
#define UCX_PARAMS ucx_params,
#else
#define UCX_PARAMS
#endif

struct weft_param *const weft_param_tables[] = {
    log_params,       wait_params, bootstrap_params, transport_params, shm_params,
    socket_params, UCX_PARAMS coll_params, topo_params, cuda_params, cma_params, bulk_params,
    sendrecv_cma_params, copy_stream_params, NULL,
};

void weft_params_reset(void) { param_tables_reset(weft_param_tables); }

void weftConfigPrint(FILE *out) { param_tables_print(weft_param_tables, out ? out : stdout); }
