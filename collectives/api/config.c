/* The library's one list of settings tables, in layer order: each module
 * defines its table and declares it in its own header; this list, at the
 * top of the library where every layer is in sight, names each once. It is
 * what weftConfigPrint prints, what docs/environment.md is generated from
 * (tests/tools/environment_doc.c) and what tests reset between runs;
 * tests/tools/check_param_tables.py fails when a table of the sources is
 * missing from it. */
#include "config.h"

#include "../../include/weft.h"
#include "../../transport/base/log.h"
#include "../../transport/base/sock.h"
#include "../../transport/base/wait.h"
#include "../../transport/cuda_ipc/cuda_params.h"
#include "../../transport/bootstrap/bootstrap.h"
#include "../../transport/socket/socket_proxy.h"
#include "../../transport/topology/topo.h"
#include "../../transport/transport.h"
#include "../../transport/ucx/ucx_params.h"
#include "../algo/bulk.h"
#include "../algo/cma.h"
#include "../algo/copy_stream.h"
#include "../algo/sendrecv_cma.h"
#include "../core/params.h"
#include "../core/trace.h"
#include "../exec/device/device_params.h"

struct weft_param *const weft_param_tables[] = {
    /* transport/: base, bootstrap, transports, topology, the device path */
    log_params, wait_params, sock_params, bootstrap_params, launcher_params, transport_params,
    shm_params, socket_params, ucx_params, cuda_transport_params,
    /* collectives/ */
    coll_params, trace_params, topo_params, device_params, cma_params, bulk_params, sendrecv_cma_params,
    copy_stream_params, NULL,
};

void weft_params_reset(void) { param_tables_reset(weft_param_tables); }

void weftConfigPrint(FILE *out) { param_tables_print(weft_param_tables, out ? out : stdout); }
