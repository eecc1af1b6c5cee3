/* weftCommShrink: a new communicator of the ranks of an old one that remain
 * once some are left out (typically because they died).
 *
 * Only the remaining ranks take part, so nothing may wait on a left-out one:
 *   1. each remaining rank works out the same list of survivors; the first
 *      of them (the leader) creates a fresh unique id, serving its rendezvous;
 *   2. the leader sends the id to every other survivor with a point-to-point
 *      bootstrap message, which connects to that survivor directly;
 *   3. survivors join the new communicator through the ordinary init path,
 *      ranked in their old order.
 * The parent may be broken by the failure that caused the shrink: only its
 * bootstrap addresses are used, never its connections. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "comm_lifecycle.h"

enum { TAG_SHRINK_ID = 0x73680001u };

struct shrink_id {
  int32_t ok; /* 0: the leader could not create an id */
  int32_t reserved;
  struct bootstrap_id id;
};

/* Sets the error text to "CommShrink: <what>: <the current text>". */
static weftResult_t shrink_error_wrap(weftResult_t res, const char *what) {
  char cause[768];
  snprintf(cause, sizeof cause, "%s", weft_error_text());
  return weft_error_set(res, "CommShrink: %s: %s", what, cause);
}

/* Marks excluded ranks in out[nranks]; rejects ranks out of range and
 * duplicates, so that every survivor derives the same list. */
static weftResult_t shrink_excluded(const struct weftComm *comm, const int *exclude, int nexclude,
                                    char *out) {
  if (nexclude < 0 || nexclude >= comm->nranks)
    return weft_error_set(weftInvalidArgument,
                          "CommShrink: %d ranks to exclude from %d (at least one must remain)",
                          nexclude, comm->nranks);
  if (nexclude > 0 && exclude == NULL)
    return weft_error_set(weftInvalidArgument, "CommShrink: excludeRanksList is NULL");
  memset(out, 0, (size_t)comm->nranks);
  for (int i = 0; i < nexclude; i++) {
    int r = exclude[i];
    if (r < 0 || r >= comm->nranks)
      return weft_error_set(weftInvalidArgument, "CommShrink: excluded rank %d is not in 0..%d", r,
                            comm->nranks - 1);
    if (out[r])
      return weft_error_set(weftInvalidArgument, "CommShrink: rank %d is excluded twice", r);
    out[r] = 1;
  }
  if (out[comm->rank]) /* as NCCL: an invalid argument */
    return weft_error_set(weftInvalidArgument,
                          "CommShrink: rank %d is in its own exclude list; excluded ranks must "
                          "not call CommShrink",
                          comm->rank);
  return weftSuccess;
}

weftResult_t comm_shrink_args_check(weftComm_t comm, const int *exclude, int nexclude,
                                    const weftComm_t *newcomm, const weftConfig_t *config) {
  WEFT_TRY(comm_check(comm));
  if (newcomm == NULL) return weft_error_set(weftInvalidArgument, "CommShrink: newcomm is NULL");
  char *excluded = malloc((size_t)comm->nranks);
  if (excluded == NULL) return weft_error_set(weftSystemError, "CommShrink: out of memory");
  weftResult_t res = shrink_excluded(comm, exclude, nexclude, excluded);
  free(excluded);
  weftConfig_t checked;
  if (res == weftSuccess) res = comm_config_read(config, &checked);
  return res;
}

/* Steps 1 and 2: the new rank, size and id of this survivor. */
static weftResult_t shrink_exchange(struct weftComm *comm, const char *excluded, int *newrank_out,
                                    int *newsize_out, struct bootstrap_id *id_out) {
  int leader = -1, newrank = 0, newsize = 0;
  for (int r = 0; r < comm->nranks; r++) {
    if (excluded[r]) continue;
    if (leader < 0) leader = r;
    if (r < comm->rank) newrank++;
    newsize++;
  }
  struct shrink_id msg;
  memset(&msg, 0, sizeof msg);
  if (leader == comm->rank) {
    weftResult_t created = bootstrap_id_create_like(comm->bs, &msg.id);
    msg.ok = created == weftSuccess;
    /* a survivor of this host that dies before it joins fails the others */
    for (int r = 0, rank_in_child = 0; msg.ok && r < comm->nranks; r++)
      if (!excluded[r]) comm_child_watch(comm, &msg.id, r, rank_in_child++);
    char why[768];
    snprintf(why, sizeof why, "%s", weft_error_text());
    /* send even a failure, so that no survivor waits for its timeout */
    for (int r = leader + 1; r < comm->nranks; r++) {
      if (excluded[r]) continue;
      weftResult_t res = bootstrap_send(comm->bs, r, TAG_SHRINK_ID, &msg, sizeof msg);
      if (res != weftSuccess) {
        char what[64];
        snprintf(what, sizeof what, "sending the new id to rank %d", r);
        return shrink_error_wrap(res, what);
      }
    }
    if (!msg.ok) return weft_error_set(weftSystemError, "CommShrink: creating an id: %s", why);
  } else {
    weftResult_t res = bootstrap_recv(comm->bs, leader, TAG_SHRINK_ID, &msg, sizeof msg);
    if (res != weftSuccess) {
      char what[64];
      snprintf(what, sizeof what, "receiving the new id from rank %d", leader);
      return shrink_error_wrap(res, what);
    }
    if (!msg.ok)
      return weft_error_set(weftRemoteError, "CommShrink: rank %d could not create an id", leader);
  }
  *newrank_out = newrank;
  *newsize_out = newsize;
  *id_out = msg.id;
  return weftSuccess;
}

/* The parent's channels, timeout and name, for a shrink without a config. */
static void shrink_config_inherit(const struct weftComm *parent, weftConfig_t *cfg) {
  weftConfig_t defaults = WEFT_CONFIG_INITIALIZER;
  *cfg = defaults;
  cfg->minChannels = cfg->maxChannels = parent->nchannels;
  uint64_t timeout_ms = comm_timeout_ns(parent) / 1000000ull;
  if (timeout_ms > 0 && timeout_ms <= INT_MAX) cfg->timeoutMs = (int)timeout_ms;
  cfg->commName = parent->name[0] != '\0' ? parent->name : NULL;
}

weftResult_t weftCommShrink(weftComm_t comm, const int *excludeRanks, int nexclude,
                            weftComm_t *newcomm, weftConfig_t *config) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  weftResult_t res = weftSuccess;
  char *excluded = malloc((size_t)comm->nranks);
  if (newcomm == NULL)
    res = weft_error_set(weftInvalidArgument, "CommShrink: newcomm is NULL");
  else if (excluded == NULL)
    res = weft_error_set(weftSystemError, "CommShrink: out of memory");
  else /* a finalized comm shrinks no more */
    res = comm_op_begin(comm, COMM_OP_REBUILD, "CommShrink");
  if (res == weftSuccess) res = shrink_excluded(comm, excludeRanks, nexclude, excluded);
  if (res != weftSuccess) {
    comm_error_keep(comm, res);
    free(excluded);
    return res;
  }

  /* an abort of the parent waits while we use its bootstrap */
  int newrank = 0, newsize = 0;
  struct bootstrap_id id;
  weftComm_t child = NULL;
  res = comm_op_begin(comm, COMM_OP_REBUILD | COMM_OP_HOLD, "CommShrink");
  if (res == weftSuccess) res = shrink_exchange(comm, excluded, &newrank, &newsize, &id);
  if (res == weftSuccess) {
    weftConfig_t inherited;
    if (config == NULL) shrink_config_inherit(comm, &inherited);
    res = comm_init(&child, newsize, &id, newrank, config ? config : &inherited, comm->cuda_dev);
    if (res == weftSuccess && config == NULL) { /* the parent's device channel bounds too */
      child->cfg_min_channels = comm->cfg_min_channels;
      child->cfg_max_channels = comm->cfg_max_channels;
    }
    if (res != weftSuccess) {
      char what[64];
      snprintf(what, sizeof what, "joining as rank %d of %d", newrank, newsize);
      shrink_error_wrap(res, what);
    }
  }
  if (res != weftSuccess) comm_error_keep(comm, res);
  const int oldrank = comm->rank;
  comm_op_end(comm);
  free(excluded);
  if (res != weftSuccess) return res;
  WEFT_INFO(LOG_INIT, "shrank rank %d (%d excluded) into comm %p as rank %d of %d", oldrank,
            nexclude, (void *)child, newrank, newsize);
  *newcomm = child;
  return weftSuccess;
}
