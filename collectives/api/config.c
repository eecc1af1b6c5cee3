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
#include "../tune/tuner.h"
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

void config_agreement_fill(struct peer_info *self, int nchannels, struct param_agreement *mine) {
  param_agreement_fill(weft_param_tables, mine);
  /* WEFT_ALGO and WEFT_PROTO by what they allow, not how they are written */
  int64_t algo_key, proto_key;
  tuner_rules_keys(&algo_key, &proto_key);
  for (int i = 0; i < mine->count; i++) {
    const struct weft_param *p = param_agreed(weft_param_tables, i);
    if (p == &coll_params[P_ALGO]) mine->value[i] = algo_key;
    else if (p == &coll_params[P_PROTO]) mine->value[i] = proto_key;
  }
  self->nchannels = nchannels;
  self->settings_digest = param_agreement_digest(mine);
}

/* What each rank tells the others where digests differ or a rank refused. */
struct agreement_share {
  struct param_agreement settings;
  int32_t nchannels;
  int32_t refused;
  char refusal[256];
};

/* text_groups' view of entry i of every rank's (-1: the channels) */
struct agreed_entry {
  const struct agreement_share *all;
  int i;
};
static int64_t agreed_value(const void *ctx, int r) {
  const struct agreed_entry *e = ctx;
  return e->i < 0 ? e->all[r].nchannels : e->all[r].settings.value[e->i];
}
static void agreed_format(const void *ctx, int r, char *buf, size_t n) {
  const struct agreed_entry *e = ctx;
  if (e->i < 0) snprintf(buf, n, "%d", (int)e->all[r].nchannels);
  else param_agreement_format(weft_param_tables, &e->all[r].settings, e->i, buf, n);
}

/* The message of every rank's shares: the ranks that refused, else each
 * setting that differs. */
static weftResult_t agreement_verdict(const struct agreement_share *all, int nranks, int rank) {
  char buf[1024] = "";
  struct text t = {.buf = buf, .n = sizeof buf, .len = 0};
  for (int r = 0; r < nranks; r++)
    if (all[r].refused && r != rank)
      text_add(&t, "%srank %d refused the communicator: %s", t.len ? "; " : "", r,
               all[r].refusal);
  if (t.len > 0) return weft_error_set(weftRemoteError, "%s", buf);
  const int count = all[0].settings.count;
  for (int r = 1; r < nranks; r++)
    if (all[r].settings.count != count)
      return weft_error_set(weftInvalidUsage,
                            "ranks run different builds of weft: rank %d shares %d settings, "
                            "rank 0 %d", r, (int)all[r].settings.count, count);
  int *members = malloc(sizeof *members * (size_t)nranks);
  if (members == NULL) return weft_error_set(weftSystemError, "out of memory");
  for (int i = -1; i < count; i++) {
    const struct agreed_entry e = {all, i};
    int same = 1;
    for (int r = 1; r < nranks && same; r++) same = agreed_value(&e, r) == agreed_value(&e, 0);
    if (same) continue;
    if (t.len == 0) text_add(&t, "settings that must be the same on every rank differ: ");
    else text_add(&t, "; ");
    if (i < 0) text_add(&t, "channels (WEFT_NCHANNELS within the config's minChannels and "
                            "maxChannels): ");
    else text_add(&t, "%s: ", param_agreed(weft_param_tables, i)->name);
    text_groups(&t, nranks, NULL, agreed_value, agreed_format, &e, 1, members);
  }
  free(members);
  if (t.len == 0) /* the digests differ, the values not: a hash that collides */
    text_add(&t, "settings that must be the same on every rank differ (by their digests)");
  return weft_error_set(weftInvalidUsage, "%s", buf);
}

weftResult_t config_agreement_check(struct bootstrap *bs, const struct peer_info *peers,
                                    int nranks, int rank, const struct param_agreement *mine,
                                    const char *refusal) {
  int differ = 0;
  for (int r = 0; r < nranks; r++)
    differ |= peers[r].refused || peers[r].nchannels != peers[0].nchannels ||
              peers[r].settings_digest != peers[0].settings_digest;
  if (!differ) return weftSuccess;
  /* every rank saw the same digests: all gather the whole to name it */
  struct agreement_share *all = calloc((size_t)nranks, sizeof *all);
  if (all == NULL) return weft_error_set(weftSystemError, "out of memory");
  all[rank].settings = *mine;
  all[rank].nchannels = peers[rank].nchannels;
  all[rank].refused = peers[rank].refused;
  snprintf(all[rank].refusal, sizeof all[rank].refusal, "%s", refusal);
  weftResult_t res = bootstrap_allgather(bs, all, sizeof *all);
  if (res != weftSuccess) {
    res = weft_error_set(res, "the ranks' settings differ or a rank refused the communicator, "
                         "and gathering them failed: %s", weft_error_text());
  } else {
    for (int r = 0; r < nranks; r++) { /* another rank's: bounded, whatever it holds */
      if (all[r].settings.count < 0 || all[r].settings.count > PARAM_AGREE_MAX)
        all[r].settings.count = -1;
      all[r].refusal[sizeof all[r].refusal - 1] = '\0';
    }
    res = agreement_verdict(all, nranks, rank);
  }
  free(all);
  return res;
}
