/* What an API layered over weft's (the NCCL drop-in) needs beyond
 * include/weft.h: compat.h says what and why. */
#include "compat.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/log.h"
#include "../../transport/base/param.h"
#include "../../transport/bootstrap/bootstrap.h"
#include "../core/comm.h"
#include "../exec/device/device.h"
#include "comm_lifecycle.h"
#include "comm_split.h"
#include "config.h"
#include "group.h"

/* --- Communicators ------------------------------------------------------------ */

weftResult_t compat_comm_check(weftComm_t comm) { return comm_check(comm); }

/* Whether comm is live, without touching the thread's error text. */
static int comm_live(const struct weftComm *comm) {
  return comm != NULL && comm->magic == COMM_MAGIC && comm->pid == comm_self_pid();
}

void compat_comm_error_keep(weftComm_t comm) { (void)comm_error_keep(comm, weftSuccess); }

const char *compat_comm_error_text(weftComm_t comm) {
  static __thread char text[sizeof comm->last_error];
  return comm_error_text_copy_live(comm, text, sizeof text) ? text : NULL;
}

weftResult_t compat_comm_usable(weftComm_t comm, const char *fn) {
  if (!comm_live(comm)) return weftSuccess;
  weftResult_t res = comm_op_begin(comm, 0, fn);
  if (res != weftSuccess) compat_comm_error_keep(comm);
  return res;
}

/* A recorded init or split is checked at the call, as weft's own calls are
 * (a rank out of range would leave the others waiting for it at the
 * group's end): a refusal, or a failure to record, fails the group. */
static weftResult_t group_defer_done(weftResult_t res) {
  if (res != weftSuccess) group_fail(res);
  return res;
}

weftResult_t compat_comm_init(weftComm_t *comm_out, int nranks, const weftUniqueId *id, int rank,
                              const weftConfig_t *config) {
  if (group_depth_get() > 0) {
    weftResult_t res = comm_init_args_check(comm_out, nranks, rank, config);
    if (res == weftSuccess) res = group_defer_init(comm_out, nranks, id, rank, config);
    return group_defer_done(res);
  }
  const int dev = device_current();
  if (comm_config_nonblocking(config)) {
    /* NCCL's nonblocking init: the device current now is the comm's */
    WEFT_TRY(comm_init_args_check(comm_out, nranks, rank, config));
    struct bootstrap_id bid;
    memcpy(&bid, id->internal, sizeof bid);
    return comm_init_nonblocking(comm_out, nranks, &bid, rank, config, dev);
  }
  weftResult_t res = weftCommInitRankConfig(comm_out, nranks, *id, rank, (weftConfig_t *)config);
  if (res == weftSuccess) comm_device_bind(*comm_out, dev);
  return res;
}

/* weftCommSplit's checks of this rank's arguments (the parent's state, and
 * whether it broke, are asked when the split runs). */
static weftResult_t split_args_check(weftComm_t parent, int color, weftComm_t *newcomm,
                                     const weftConfig_t *config) {
  WEFT_TRY(comm_check(parent));
  if (newcomm == NULL) return weft_error_set(weftInvalidArgument, "CommSplit: newcomm is NULL");
  if (color < WEFT_SPLIT_NOCOLOR)
    return weft_error_set(weftInvalidArgument,
                          "CommSplit: color %d is negative (only WEFT_SPLIT_NOCOLOR, -1, is)",
                          color);
  weftConfig_t checked;
  return comm_config_read(config, &checked);
}

weftResult_t compat_comm_split(weftComm_t comm, int color, int key, weftComm_t *newcomm,
                               const weftConfig_t *config) {
  if (group_depth_get() > 0) {
    weftResult_t res = split_args_check(comm, color, newcomm, config);
    if (res == weftSuccess) res = group_defer_split(comm, color, key, newcomm, config);
    return group_defer_done(res);
  }
  return weftCommSplit(comm, color, key, newcomm, (weftConfig_t *)config);
}

weftResult_t compat_comm_shrink(weftComm_t comm, const int *exclude, int nexclude,
                                weftComm_t *newcomm, const weftConfig_t *config) {
  if (group_depth_get() > 0) {
    weftResult_t res = comm_shrink_args_check(comm, exclude, nexclude, newcomm, config);
    if (res == weftSuccess) res = group_defer_shrink(comm, exclude, nexclude, newcomm, config);
    return group_defer_done(res);
  }
  return weftCommShrink(comm, exclude, nexclude, newcomm, (weftConfig_t *)config);
}

weftResult_t compat_comm_split_refused(weftComm_t comm, int key, weftResult_t refused) {
  return comm_split_refused(comm, key, refused);
}

weftResult_t compat_comm_suspend(weftComm_t comm, int release_scratch, const char *fn) {
  return comm_life_suspend(comm, release_scratch, fn);
}

int compat_comm_resume(weftComm_t comm) { return comm_life_resume(comm); }

int compat_comm_suspended(weftComm_t comm) { return comm_life(comm) == COMM_SUSPENDED; }

uint64_t compat_comm_scratch_nbytes(weftComm_t comm) { return comm_states_scratch_nbytes(comm); }

/* Existing ranks learn which of them is the root (the one with the id) and
 * its id through comm. */
static weftResult_t grow_root_id(struct weftComm *c, int nranks, const weftUniqueId *id,
                                 weftUniqueId *id_out) {
  const int n = c->nranks;
  int32_t mine = id != NULL, *has = calloc((size_t)n, sizeof *has);
  if (has == NULL) return weft_error_set(weftSystemError, "ncclCommGrow: out of memory");
  weftResult_t res = weftAllGather(&mine, has, 1, weftInt32, c, NULL);
  int root = -1, nroots = 0;
  for (int r = 0; res == weftSuccess && r < n; r++)
    if (has[r]) root = r, nroots++;
  free(has);
  if (res != weftSuccess) return res;
  if (nroots != 1)
    return weft_error_set(weftInvalidUsage,
                          "ncclCommGrow: %d existing ranks passed an id; exactly one (the root, "
                          "which made it with ncclCommGetUniqueId) must",
                          nroots);
  if (id != NULL) *id_out = *id;
  res = weftBroadcast(id_out, id_out, sizeof *id_out, weftUint8, root, c, NULL);
  if (res == weftSuccess)
    WEFT_INFO(LOG_INIT, "grow: rank %d of %d joins a communicator of %d (root %d)", c->rank, n,
              nranks, root);
  return res;
}

weftResult_t compat_comm_grow(weftComm_t comm, int nranks, const weftUniqueId *id,
                              const weftConfig_t *config, weftComm_t *newcomm) {
  struct weftComm *c = comm;
  weftConfig_t cfg;
  if (config == NULL) {
    /* the parent's timeout and name; channels come from the environment, as
     * on the new ranks, which have no parent: every rank must agree on them */
    const weftConfig_t defaults = WEFT_CONFIG_INITIALIZER;
    cfg = defaults;
    uint64_t timeout_ms = comm_timeout_ns(c) / 1000000ull;
    if (timeout_ms > 0 && timeout_ms <= INT32_MAX) cfg.timeoutMs = (int)timeout_ms;
    cfg.commName = c->name[0] != '\0' ? c->name : NULL;
  } else {
    cfg = *config;
  }
  weftUniqueId root_id;
  memset(&root_id, 0, sizeof root_id);
  /* the parent is held until the grown comm exists (its name and timeout
   * are read there): an abort from another thread waits, as for a split */
  weftResult_t res = comm_op_begin(c, COMM_OP_HOLD, "ncclCommGrow");
  if (res == weftSuccess) res = grow_root_id(c, nranks, id, &root_id);
  if (res == weftSuccess) res = weftCommInitRankConfig(newcomm, nranks, root_id, c->rank, &cfg);
  if (res != weftSuccess) compat_comm_error_keep(c);
  comm_op_end(c);
  return res;
}

/* --- Groups ------------------------------------------------------------------- */

int compat_group_depth(void) { return group_depth_get(); }

void compat_group_fail(weftResult_t res) { group_fail(res); }

/* --- Unique ids ---------------------------------------------------------------- */

_Static_assert(sizeof(struct bootstrap_id) <= sizeof(weftUniqueId), "a bootstrap id fits");

weftResult_t compat_id_from_hostport(const char *hostport, const char *what,
                                     weftUniqueId *id_out) {
  struct bootstrap_id id;
  WEFT_TRY(bootstrap_id_from_hostport(hostport, what, &id));
  memset(id_out, 0, sizeof *id_out);
  memcpy(id_out, &id, sizeof id);
  return weftSuccess;
}

weftResult_t compat_id_root_start(const weftUniqueId *uid) {
  struct bootstrap_id id;
  memcpy(&id, uid, sizeof id);
  union weft_sockaddr any = id.root;
  if (any.sa.sa_family == AF_INET) any.in.sin_addr.s_addr = htonl(INADDR_ANY);
  else any.in6.sin6_addr = in6addr_any;
  return bootstrap_root_start(&any, id.secret, NULL);
}

/* --- The CUDA device ------------------------------------------------------------ */

int compat_device_current(void) { return device_current(); }
int compat_device_count(void) { return device_count(); }
void compat_device_ctx_make(void) { device_ctx_make(); }

/* --- Settings --------------------------------------------------------------------- */

struct weft_param *compat_param_find(const char *name) {
  for (struct weft_param *const *t = weft_param_tables; *t != NULL; t++)
    for (struct weft_param *p = *t; p->name != NULL; p++)
      if (strcmp(p->name, name) == 0) return p;
  return NULL;
}

struct weft_param *compat_param_at(int i) {
  for (struct weft_param *const *t = weft_param_tables; *t != NULL && i >= 0; t++)
    for (struct weft_param *p = *t; p->name != NULL; p++)
      if (i-- == 0) return p;
  return NULL;
}

const char *compat_param_name(const struct weft_param *p) { return p->name; }
int compat_param_is_text(const struct weft_param *p) { return p->type == PARAM_STR; }
int64_t compat_param_int(struct weft_param *p) { return param_int(p); }
const char *compat_param_text(struct weft_param *p) { return param_str(p); }

void compat_log_settings_reset(void) {
  static struct weft_param *const tables[] = {log_params, NULL};
  param_tables_reset(tables);
}

void compat_coll_mark_refused(weftComm_t comm, int coll, const void *sendbuf, void *recvbuf,
                              size_t count, weftDataType_t datatype, int root, weftResult_t res) {
  if (comm != NULL && comm_check(comm) == weftSuccess)
    (void)group_coll_mark(comm, (enum coll_kind)coll, sendbuf, recvbuf, count, datatype, root,
                          NULL, res);
  group_fail(res); /* as compat_coll_refused does, device memory too */
}
