/* weftCommSplit: new communicators from the ranks of an old one.
 *
 * Three steps, all ranks of the parent taking part:
 *   1. allgather (color, key) over the parent's bootstrap;
 *   2. the lowest old rank of each color creates a fresh unique id (and so
 *      serves its rendezvous); a second allgather publishes every rank's id,
 *      and each member takes its leader's;
 *   3. members join the new communicator through the ordinary init path, with
 *      ranks ordered by key, then by old rank.
 * The new communicator has its own bootstrap and connections: it does not
 * depend on the parent once created.
 *
 * A rank whose arguments are bad still takes part in step 1, marked failed,
 * so that the others learn at once that no split happens (rather than wait
 * for it until the timeout); every rank returns an error and the parent goes
 * on working. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "comm_lifecycle.h"
#include "comm_split.h"

struct split_entry {
  int32_t color;
  int32_t key;
  int32_t ok; /* 0: this rank's call failed its argument checks */
  int32_t reserved;
};

struct split_id {
  int32_t ok; /* 0: this rank led a color and failed to create its id */
  int32_t reserved;
  struct bootstrap_id id;
};

/* Sets the error text to "CommSplit: <what>: <the current text>". */
static weftResult_t split_error_wrap(weftResult_t res, const char *what) {
  char cause[768];
  snprintf(cause, sizeof cause, "%s", weft_error_text()); /* the text is overwritten next */
  return weft_error_set(res, "CommSplit: %s: %s", what, cause);
}

/* The parent's settings, for a split without a config. */
static void config_inherit(const struct weftComm *parent, weftConfig_t *cfg) {
  weftConfig_t defaults = WEFT_CONFIG_INITIALIZER;
  *cfg = defaults;
  cfg->minChannels = cfg->maxChannels = parent->nchannels;
  uint64_t timeout_ms = comm_timeout_ns(parent) / 1000000ull;
  if (timeout_ms > 0 && timeout_ms <= INT_MAX) cfg->timeoutMs = (int)timeout_ms;
  cfg->commName = parent->name[0] != '\0' ? parent->name : NULL;
}

/* Where rank `me` of the parent lands: its new rank, the new size and the
 * old rank of its color's leader. */
static void split_place(const struct split_entry *all, int nranks, int me, int *newrank_out,
                        int *newsize_out, int *leader_out) {
  int newrank = 0, newsize = 0, leader = -1;
  for (int r = 0; r < nranks; r++) {
    if (all[r].color != all[me].color) continue;
    if (leader < 0) leader = r;
    newsize++;
    /* before me: a smaller key, or an equal key and a smaller old rank */
    if (all[r].key < all[me].key || (all[r].key == all[me].key && r < me)) newrank++;
  }
  *newrank_out = newrank;
  *newsize_out = newsize;
  *leader_out = leader;
}

/* Steps 1 and 2 over the parent's bootstrap. On success, color_out and the
 * placement are set; id_out only when color is not WEFT_SPLIT_NOCOLOR. With
 * failed set, this rank only tells the others (step 1) and returns
 * weftSuccess; a rank that learns of a failed one returns weftInvalidUsage. */
static weftResult_t split_exchange(struct weftComm *comm, int color, int key, int failed,
                                   int *newrank_out, int *newsize_out,
                                   struct bootstrap_id *id_out) {
  const int n = comm->nranks, me = comm->rank;
  weftResult_t res = weftSuccess;
  struct split_entry *all = calloc((size_t)n, sizeof *all);
  struct split_id *ids = calloc((size_t)n, sizeof *ids);
  if (all == NULL || ids == NULL) {
    /* the other ranks would wait in the exchange until their timeout */
    res = weft_error_set(weftSystemError, "CommSplit: out of memory");
    goto free_all;
  }
  all[me] = (struct split_entry){.color = color, .key = key, .ok = !failed};
  res = bootstrap_allgather(comm->bs, all, sizeof *all);
  if (res != weftSuccess) {
    split_error_wrap(res, "exchanging colors and keys");
    goto free_all;
  }
  if (failed) goto free_all;
  for (int r = 0; r < n; r++)
    if (!all[r].ok) {
      res = weft_error_set(weftInvalidUsage,
                           "CommSplit: rank %d refused its call (bad arguments there): no "
                           "communicator was made",
                           r);
      goto free_all;
    }
  int newrank, newsize, leader;
  split_place(all, n, me, &newrank, &newsize, &leader);

  /* the leader's id creation may fail: still publish, so members learn it */
  ids[me].ok = 1;
  char why[512] = "";
  if (color != WEFT_SPLIT_NOCOLOR && leader == me &&
      bootstrap_id_create_like(comm->bs, &ids[me].id) != weftSuccess) {
    ids[me].ok = 0;
    snprintf(why, sizeof why, "%s", weft_error_text());
  } else if (color != WEFT_SPLIT_NOCOLOR && leader == me) {
    /* a member of this host that dies before it joins fails the others */
    for (int r = 0; r < n; r++) {
      if (all[r].color != color || r == me) continue;
      int their_rank, size_unused, leader_unused;
      split_place(all, n, r, &their_rank, &size_unused, &leader_unused);
      comm_child_watch(comm, &ids[me].id, r, their_rank);
    }
  }
  res = bootstrap_allgather(comm->bs, ids, sizeof *ids);
  if (res != weftSuccess) {
    split_error_wrap(res, "exchanging ids");
    goto free_all;
  }
  if (color != WEFT_SPLIT_NOCOLOR && !ids[leader].ok) {
    res = weft_error_set(weftSystemError,
                         "CommSplit: rank %d, leader of color %d, could not create an id%s%s",
                         leader, color, leader == me ? ": " : "", why);
    goto free_all;
  }
  *newrank_out = newrank;
  *newsize_out = newsize;
  if (color != WEFT_SPLIT_NOCOLOR) *id_out = ids[leader].id;

free_all:
  free(ids);
  free(all);
  return res;
}

static weftResult_t split_with(weftComm_t comm, int color, int key, weftComm_t *newcomm,
                               weftConfig_t *config, weftResult_t res);

/* Whether comm's state lets it split (comm_op_begin): where it does not (a
 * finalized comm), this rank takes part in nothing, its last error saying
 * why. */
static weftResult_t split_state_check(struct weftComm *comm) {
  weftResult_t res = comm_op_begin(comm, COMM_OP_REBUILD, "CommSplit");
  if (res != weftSuccess)
    comm_error_keep(comm, res);
  return res;
}

weftResult_t weftCommSplit(weftComm_t comm, int color, int key, weftComm_t *newcomm,
                           weftConfig_t *config) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  weftResult_t res = weftSuccess;
  weftConfig_t checked;
  WEFT_TRY(split_state_check(comm));
  if (newcomm == NULL) {
    res = weft_error_set(weftInvalidArgument, "CommSplit: newcomm is NULL");
  } else if (color < WEFT_SPLIT_NOCOLOR) {
    res = weft_error_set(weftInvalidArgument,
                         "CommSplit: color %d is negative (only WEFT_SPLIT_NOCOLOR, -1, is)",
                         color);
  } else if (comm_config_read(config, &checked) != weftSuccess) {
    res = split_error_wrap(weftInvalidArgument, "config");
  }
  return split_with(comm, color, key, newcomm, config, res);
}

weftResult_t comm_split_refused(weftComm_t comm, int key, weftResult_t refused) {
  WEFT_TRY(comm_check(comm));
  char why[1024];
  snprintf(why, sizeof why, "%s", weft_error_text());
  if (split_state_check(comm) != weftSuccess) return refused;
  weft_error_set(refused, "%s", why);
  return split_with(comm, WEFT_SPLIT_NOCOLOR, key, NULL, NULL, refused);
}

/* The split after this rank's argument checks (res: their outcome, the
 * thread's error text saying why when it failed). */
static weftResult_t split_with(weftComm_t comm, int color, int key, weftComm_t *newcomm,
                               weftConfig_t *config, weftResult_t res) {
  if (res != weftSuccess && comm->nranks == 1) {
    comm_error_keep(comm, res);
    return res;
  }
  const weftResult_t refused = res; /* the peers hear of it in the exchange */
  char refusal[1024] = "";
  if (refused != weftSuccess) snprintf(refusal, sizeof refusal, "%s", weft_error_text());

  /* the parent is held until the child exists: an abort waits for us, so
   * that nothing here reads a freed parent */
  int newrank = 0, newsize = 0;
  struct bootstrap_id id;
  weftComm_t child = NULL;
  res = comm_op_begin(comm, COMM_OP_REBUILD | COMM_OP_HOLD, "CommSplit");
  if (res != weftSuccess) {
    /* refused before the exchange, as the peers are by the same state */
  } else if (comm_async_error(comm) != weftSuccess) {
    res = comm_broken_refusal(comm, "CommSplit");
  } else {
    res = split_exchange(comm, color, key, refused != weftSuccess, &newrank, &newsize, &id);
    /* a failed exchange leaves the parent's bootstrap out of step: it is broken */
    if (res != weftSuccess && res != weftInvalidUsage) comm_fail(comm, res);
    if (res == weftSuccess && refused != weftSuccess)
      res = weft_error_set(refused, "%s", refusal);
  }
  if (res == weftSuccess && color != WEFT_SPLIT_NOCOLOR) {
    weftConfig_t inherited;
    if (config == NULL) config_inherit(comm, &inherited);
    res = comm_init(&child, newsize, &id, newrank, config ? config : &inherited, comm->cuda_dev);
    if (res == weftSuccess && config == NULL) { /* the parent's device channel bounds too */
      child->cfg_min_channels = comm->cfg_min_channels;
      child->cfg_max_channels = comm->cfg_max_channels;
    }
    if (res != weftSuccess) {
      /* the parent is unharmed; its last error says why the split failed */
      char what[96];
      snprintf(what, sizeof what, "joining color %d as rank %d of %d", color, newrank, newsize);
      split_error_wrap(res, what);
      comm_error_keep(comm, res);
    }
  } else if (res != weftSuccess) {
    comm_error_keep(comm, res);
  }
  const int oldrank = comm->rank;
  comm_op_end(comm);
  if (res != weftSuccess) return res;
  if (child != NULL)
    WEFT_INFO(LOG_INIT, "split rank %d (color %d, key %d) into comm %p as rank %d of %d",
              oldrank, color, key, (void *)child, newrank, newsize);
  *newcomm = child; /* NULL for WEFT_SPLIT_NOCOLOR */
  return weftSuccess;
}
