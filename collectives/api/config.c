/* The library's one list of settings tables, in layer order: each module
 * defines its table and declares it in its own header; this list, at the
 * top of the library where every layer is in sight, names each once. It is
 * what weftConfigPrint prints, what docs/environment.md is generated from
 * (tests/tools/environment_doc.c) and what tests reset between runs;
 * tests/tools/check_param_tables.py fails when a table of the sources is
 * missing from it. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

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
#include "../core/text.h"
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

void config_agreement_fill(struct peer_info *self, int nchannels) {
  self->nchannels = nchannels;
  param_agreement_fill(weft_param_tables, &self->settings);
}

/* text_groups' view of entry i of every rank's (-1: the channels) */
struct agreed_entry {
  const struct peer_info *peers;
  int i;
};
static int64_t agreed_value(const void *ctx, int r) {
  const struct agreed_entry *e = ctx;
  return e->i < 0 ? e->peers[r].nchannels : e->peers[r].settings.value[e->i];
}
static void agreed_format(const void *ctx, int r, char *buf, size_t n) {
  const struct agreed_entry *e = ctx;
  if (e->i < 0) snprintf(buf, n, "%d", (int)e->peers[r].nchannels);
  else param_agreement_format(weft_param_tables, &e->peers[r].settings, e->i, buf, n);
}

weftResult_t config_agreement_check(const struct peer_info *peers, int nranks) {
  const int count = peers[0].settings.count;
  for (int r = 1; r < nranks; r++)
    if (peers[r].settings.count != count)
      return weft_error_set(weftInvalidUsage,
                            "ranks run different builds of weft: rank %d shares %d settings, "
                            "rank 0 %d", r, (int)peers[r].settings.count, count);
  char buf[1024] = "";
  struct text t = {.buf = buf, .n = sizeof buf, .len = 0};
  int *members = NULL;
  for (int i = -1; i < count; i++) {
    const struct agreed_entry e = {peers, i};
    int same = 1;
    for (int r = 1; r < nranks && same; r++) same = agreed_value(&e, r) == agreed_value(&e, 0);
    if (same) continue;
    if (members == NULL && (members = malloc(sizeof *members * (size_t)nranks)) == NULL)
      return weft_error_set(weftSystemError, "out of memory");
    if (t.len == 0) text_add(&t, "settings that must be the same on every rank differ: ");
    else text_add(&t, "; ");
    if (i < 0) text_add(&t, "channels (WEFT_NCHANNELS within the config's minChannels and "
                            "maxChannels): ");
    else text_add(&t, "%s: ", param_agreed(weft_param_tables, i)->name);
    text_groups(&t, nranks, NULL, agreed_value, agreed_format, &e, 1, members);
  }
  if (members == NULL) return weftSuccess;
  free(members);
  return weft_error_set(weftInvalidUsage, "%s", t.buf);
}
