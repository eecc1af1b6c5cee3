/* Groups: weftGroupStart/End record operations and launch them together,
 * now on the calling thread (and a kept worker thread per further
 * communicator) or later on a host stream's worker.
 *
 * A group also records communicator creation (group_defer_init/split/
 * shrink, for the NCCL drop-in): NCCL lets one thread create the communicators of
 * several ranks (one per GPU) between ncclGroupStart and ncclGroupEnd.
 * weft's init and split block until every rank has joined, so inside a
 * group they are recorded, and the outermost end runs all recorded ones at
 * once, a thread each, before it launches the group's operations. Their
 * arguments are checked at the call (by the caller), as every recorded
 * call's are: a group in which any call failed runs nothing at its end,
 * creations included. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../exec/device/device.h"
#include "../algo/sendrecv.h"
#include "../exec/host/launch.h"
#include "group.h"
#include "stream.h"
#include "../tune/tuner.h"
#include "../core/signature.h"
#include "../core/trace.h"

__thread int group_depth;
/* A call recorded in the group: one to run, or one that runs nothing (refused
 * when called, or of no elements where nothing runs) but still takes its
 * number and its place in the trace at the end, in call order. */
struct group_entry {
  struct group_op op;
  int runs;              /* 0: nothing to run */
  weftResult_t result;   /* where it runs nothing: its result */
};
static _Thread_local struct group_entry *group_entries;
static _Thread_local size_t group_nops, group_cap;
static _Thread_local weftResult_t group_error; /* first failure while recording */
static _Thread_local char group_why[WEFT_ERROR_TEXT_NBYTES]; /* and its text */

void group_fail(weftResult_t res) {
  if (group_depth > 0 && group_error == weftSuccess) {
    group_error = res;
    snprintf(group_why, sizeof group_why, "%s", weft_error_text());
  }
}

/* The group's failure while recording, as the thread's error: what its end
 * returns. */
static weftResult_t group_refusal(void) {
  return weft_error_set(group_error, "%s", group_why);
}

/* The thread's entries are kept from one group to the next (a group's
 * allocation cost as much as its calls' work); freed when the thread ends. */
static pthread_key_t entries_key;
static pthread_once_t entries_once = PTHREAD_ONCE_INIT;
/* at the thread's end: a destructor after it that opens a group starts anew */
static void entries_free(void *entries) {
  if (group_entries == entries) {
    group_entries = NULL;
    group_nops = group_cap = 0;
  }
  free(entries);
}
static void entries_key_make(void) { (void)pthread_key_create(&entries_key, entries_free); }

/* entries (cap of them) become the thread's again, for the next group. */
static void entries_keep(struct group_entry *entries, size_t cap) {
  group_entries = entries;
  group_cap = cap;
  group_nops = 0;
  pthread_once(&entries_once, entries_key_make);
  (void)pthread_setspecific(entries_key, entries);
}

static weftResult_t group_add(const struct group_entry *e) {
  if (group_nops == group_cap) {
    size_t cap = group_cap ? group_cap * 2 : 16;
    struct group_entry *entries = realloc(group_entries, cap * sizeof *entries);
    if (entries == NULL) return weft_error_set(weftSystemError, "out of memory");
    const size_t n = group_nops;
    entries_keep(entries, cap);
    group_nops = n;
  }
  group_entries[group_nops++] = *e;
  return weftSuccess;
}

weftResult_t group_record(struct weftComm *comm, const struct weft_plan *plan,
                          weftStream_t stream) {
  const struct group_entry e = {.op = {.comm = comm, .plan = *plan, .stream = stream}, .runs = 1};
  return group_add(&e);
}

void group_record_done(struct weftComm *comm, const struct weft_plan *plan,
                       weftResult_t result) {
  const struct group_entry e = {.op = {.comm = comm, .plan = *plan}, .result = result};
  if (group_add(&e) != weftSuccess) {
    /* not kept: it takes its number now rather than not at all */
    signature_skipped(comm, plan);
    trace_set_state(comm->trace, trace_record(comm->trace, plan, 0),
                    result == weftSuccess ? TRACE_COMPLETED : TRACE_FAILED, -1, result);
  }
}

void group_call_done(struct weftComm *comm, const struct weft_plan *plan, weftResult_t res) {
  if (group_depth > 0) {
    group_record_done(comm, plan, res);
    return;
  }
  signature_skipped(comm, plan);
  trace_set_state(comm->trace, trace_record(comm->trace, plan, 0),
                  res == weftSuccess ? TRACE_COMPLETED : TRACE_FAILED, -1, res);
}

weftResult_t group_coll_mark(struct weftComm *comm, enum coll_kind coll, const void *sendbuf,
                             void *recvbuf, size_t count, weftDataType_t datatype, int root,
                             weftStream_t stream, weftResult_t res) {
  struct weft_plan plan;
  plan_init(&plan, coll, sendbuf, recvbuf, count, datatype, weftSum, root);
  /* it plans nothing: no algorithm or protocol in the trace */
  plan.algo = (enum coll_algo)-1;
  plan.proto = (enum coll_proto)-1;
  const int scatter = coll == COLL_SCATTER;
  if (count > 0 && device_plan_on_device(&plan, !scatter, scatter) != 0) return weftSuccess;
  if (res != weftSuccess) { /* refused: it counts, as every call of the comm */
    comm->seq++;
    group_call_done(comm, &plan, res);
    group_fail(res);
    return weftSuccess;
  }
  /* moves nothing: its sends and receives end at once too; WEFT_CHECK=1
   * compares it all the same (a rank of count 0 beside peers of another
   * count sends nothing the peers could miss) where it runs on the host:
   * the NULL stream or a host stream (a CUDA stream's call of no elements
   * launches nothing, as on device memory) */
  if (count == 0 && !(signature_checking() && stream_is_host(stream))) {
    group_record_done(comm, &plan, weftSuccess);
    return weftSuccess;
  }
  return group_record(comm, &plan, stream);
}

/* --- communicator creation in a group ------------------------------------- */

enum deferred_kind { DEFER_INIT, DEFER_SPLIT, DEFER_SHRINK };

struct deferred {
  enum deferred_kind kind;
  weftComm_t *out;
  /* init */
  int nranks, rank;
  weftUniqueId id;
  int dev; /* the CUDA device current at the call (comm_device_bind) */
  /* split and shrink */
  weftComm_t parent;
  int color, key;
  int *exclude; /* shrink: a copy of the caller's list, freed by the run */
  int nexclude;
  /* the config, with its name copied: the caller's string may be gone */
  int has_cfg;
  weftConfig_t cfg;
  char name[64];
  /* result */
  weftComm_t comm;
  weftResult_t res;
  char error[1024];
  pthread_t tid;
};

static _Thread_local struct deferred *deferred;
static _Thread_local size_t ndeferred, deferred_cap;

/* Records d, its arguments checked by the caller. */
static weftResult_t defer(const struct deferred *d, const weftConfig_t *cfg) {
  if (ndeferred == deferred_cap) {
    size_t cap = deferred_cap ? 2 * deferred_cap : 8;
    struct deferred *p = realloc(deferred, cap * sizeof *p);
    if (p == NULL) return weft_error_set(weftSystemError, "out of memory");
    deferred = p;
    deferred_cap = cap;
  }
  struct deferred *slot = &deferred[ndeferred++];
  *slot = *d;
  if (cfg != NULL) {
    slot->has_cfg = 1;
    slot->cfg = *cfg;
    if (cfg->commName != NULL) {
      snprintf(slot->name, sizeof slot->name, "%s", cfg->commName);
      slot->cfg.commName = slot->name;
    }
  }
  return weftSuccess;
}

weftResult_t group_defer_init(weftComm_t *out, int nranks, const weftUniqueId *id, int rank,
                              const weftConfig_t *cfg) {
  struct deferred d = {.out = out, .nranks = nranks, .rank = rank, .id = *id,
                       .dev = device_current()};
  return defer(&d, cfg);
}

weftResult_t group_defer_split(weftComm_t parent, int color, int key, weftComm_t *out,
                               const weftConfig_t *cfg) {
  struct deferred d = {.kind = DEFER_SPLIT, .out = out, .parent = parent, .color = color,
                       .key = key};
  return defer(&d, cfg);
}

weftResult_t group_defer_shrink(weftComm_t parent, const int *exclude, int nexclude,
                                weftComm_t *out, const weftConfig_t *cfg) {
  struct deferred d = {.kind = DEFER_SHRINK, .out = out, .parent = parent,
                       .nexclude = nexclude};
  if (nexclude > 0) {
    d.exclude = malloc((size_t)nexclude * sizeof *d.exclude);
    if (d.exclude == NULL) return weft_error_set(weftSystemError, "out of memory");
    memcpy(d.exclude, exclude, (size_t)nexclude * sizeof *d.exclude);
  }
  weftResult_t res = defer(&d, cfg);
  if (res != weftSuccess) free(d.exclude);
  return res;
}

static const char *deferred_kind_name(enum deferred_kind kind) {
  return kind == DEFER_SPLIT ? "split" : kind == DEFER_SHRINK ? "shrink" : "init";
}

static void *deferred_main(void *arg) {
  struct deferred *d = arg;
  weftConfig_t *cfg = d->has_cfg ? &d->cfg : NULL;
  if (d->kind == DEFER_SPLIT) {
    d->res = weftCommSplit(d->parent, d->color, d->key, &d->comm, cfg);
  } else if (d->kind == DEFER_SHRINK) {
    d->res = weftCommShrink(d->parent, d->exclude, d->nexclude, &d->comm, cfg);
  } else {
    /* the group's end creates its comms before it returns: a nonblocking
     * config's creation does not run apart (NCCL may return ncclSuccess) */
    if (cfg != NULL) cfg->blocking = 1;
    d->res = weftCommInitRankConfig(&d->comm, d->nranks, d->id, d->rank, cfg);
    if (d->res == weftSuccess) comm_device_bind(d->comm, d->dev);
  }
  if (d->res != weftSuccess) snprintf(d->error, sizeof d->error, "%s", weft_error_text());
  return NULL;
}

/* Forgets every recorded creation, which runs nothing: each *out is NULL. */
static void deferred_drop(void) {
  for (size_t i = 0; i < ndeferred; i++) {
    *deferred[i].out = NULL;
    free(deferred[i].exclude);
  }
  free(deferred);
  deferred = NULL;
  ndeferred = deferred_cap = 0;
}

/* Runs every recorded creation, each on a thread of its own (the first on
 * the caller's), and writes the communicators. Returns a failure of a rank
 * that failed of itself where there is one: a peer that waited for it fails
 * too (weftRemoteError: timed out, or told), which says less. */
static weftResult_t deferred_run(void) {
  struct deferred *ds = deferred;
  size_t n = ndeferred;
  deferred = NULL;
  ndeferred = deferred_cap = 0;
  /* the copies moved with realloc: point the names at their own buffers */
  for (size_t i = 0; i < n; i++)
    if (ds[i].has_cfg && ds[i].cfg.commName != NULL) ds[i].cfg.commName = ds[i].name;
  weftResult_t res = weftSuccess;
  size_t started = 1;
  for (; started < n; started++)
    if (pthread_create(&ds[started].tid, NULL, deferred_main, &ds[started]) != 0) {
      res = weft_error_errno(weftSystemError, "starting a thread for a grouped init");
      break;
    }
  if (n > 0 && res == weftSuccess) deferred_main(&ds[0]);
  for (size_t i = 1; i < started; i++) pthread_join(ds[i].tid, NULL);
  const struct deferred *failed = NULL;
  for (size_t i = 0; i < n; i++) {
    if (i < started && ds[i].res != weftSuccess &&
        (failed == NULL || (failed->res == weftRemoteError && ds[i].res != weftRemoteError)))
      failed = &ds[i];
    *ds[i].out = ds[i].res == weftSuccess ? ds[i].comm : NULL;
  }
  if (res == weftSuccess && failed != NULL)
    res = weft_error_set(failed->res, "%s in a group: %s", deferred_kind_name(failed->kind),
                         failed->error);
  for (size_t i = 0; i < n; i++) free(ds[i].exclude);
  free(ds);
  return res;
}

/* --- the public calls ---------------------------------------------------- */

weftResult_t weftGroupStart(void) {
  if (group_depth == 0) group_error = weftSuccess;
  group_depth++;
  return weftSuccess;
}

/* Enqueues the group's operations on device memory on their CUDA streams, in
 * call order, once the whole group is known. */
static weftResult_t group_dispatch_device(const struct group_op *ops, size_t nops) {
  size_t n = 0;
  for (size_t i = 0; i < nops; i++) n += ops[i].plan.on_device != 0;
  if (n == 0) return weftSuccess;
  struct weftComm **comms = malloc(sizeof *comms * n);
  const struct weft_plan **plans = malloc(sizeof *plans * n);
  void **streams = malloc(sizeof *streams * n);
  weftResult_t res = comms && plans && streams
                         ? weftSuccess
                         : weft_error_set(weftSystemError, "out of memory");
  n = 0;
  for (size_t i = 0; i < nops && res == weftSuccess; i++)
    if (ops[i].plan.on_device) {
      comms[n] = ops[i].comm;
      plans[n] = &ops[i].plan;
      streams[n++] = ops[i].stream;
    }
  if (res == weftSuccess) res = device_enqueue_group(comms, plans, streams, n);
  free(comms);
  free(plans);
  free(streams);
  return res;
}

/* The outermost end of a group that runs: each op takes its number, in
 * call order, whether it then runs or fails, so that what this rank calls
 * next is compared as the call after them; the host ones are recorded in
 * their comm's trace (the device ones are at launch). A simulated group
 * (weftGroupSimulateEnd) does neither: its peers may not simulate it. */
static void group_number(struct group_entry *entries, size_t n) {
  for (size_t i = 0; i < n; i++) {
    struct group_op *op = &entries[i].op;
    signature_number(&op->comm->signature_seq, &op->plan);
    if (entries[i].runs && op->plan.on_device) continue;
    op->plan.trace_id = trace_record(op->comm->trace, &op->plan, 0);
    if (!entries[i].runs)
      trace_set_state(op->comm->trace, op->plan.trace_id,
                      entries[i].result == weftSuccess ? TRACE_COMPLETED : TRACE_FAILED, -1,
                      entries[i].result);
  }
}

/* Ops of a group that do not run: each is failed with res in its comm's
 * trace (the host ones, recorded at the end already; the device ones, which
 * would have been at launch, now), so that every rank's trace numbers the
 * group's calls alike. */
static void group_drop(const struct group_op *ops, size_t nops, weftResult_t res) {
  for (size_t i = 0; i < nops; i++) {
    struct trace *t = ops[i].comm->trace;
    if (ops[i].plan.trace_id != 0) trace_set_state(t, ops[i].plan.trace_id, TRACE_FAILED, -1, res);
    else if (ops[i].plan.on_device) trace_record_done(t, &ops[i].plan, res);
  }
}

/* Ends the group end's hold of each op's comm. */
static void group_holds_end(const struct group_op *ops, size_t nops) {
  for (size_t i = 0; i < nops; i++) comm_op_end(ops[i].comm);
}

/* Launches ops: each stream's as one item of that stream, the rest now. The
 * caller holds each op's comm once (comm_hold): group_launch takes over the
 * holds of the ops it runs, and ends each as that comm's ops are done, so an
 * abort of one comm waits for its own ops only; the rest end here. */
static weftResult_t group_dispatch(const struct group_op *ops, size_t nops) {
  /* a comm's ops run as one batch, so they must agree on their stream */
  for (size_t i = 0; i < nops; i++)
    for (size_t j = 0; j < i; j++)
      if (ops[j].comm == ops[i].comm && ops[j].stream != ops[i].stream) {
        const weftResult_t res =
            weft_error_set(weftInvalidUsage,
                           "a group uses two streams for one communicator (rank %d)",
                           ops[i].comm->rank);
        group_drop(ops, nops, res);
        group_holds_end(ops, nops);
        return res;
      }
  /* a group's few ops (the common case) on the stack */
  struct group_op part_few[8];
  char passed_few[8] = {0};
  const int few = nops <= 8;
  struct group_op *part = few ? part_few : malloc(sizeof *part * (nops ? nops : 1));
  /* host ops handed on (they report themselves) */
  char *passed = few ? passed_few : calloc(nops ? nops : 1, 1);
  if (part == NULL || passed == NULL) {
    if (!few) free(part);
    if (!few) free(passed);
    const weftResult_t res = weft_error_set(weftSystemError, "out of memory");
    group_drop(ops, nops, res);
    group_holds_end(ops, nops);
    return res;
  }
  weftResult_t res = group_dispatch_device(ops, nops);
  for (size_t i = 0; i < nops && res == weftSuccess; i++) {
    int first = ops[i].stream != NULL && !ops[i].plan.on_device;
    for (size_t j = 0; j < i && first; j++) first = ops[j].stream != ops[i].stream;
    if (!first) continue;
    struct host_stream *s;
    res = stream_lookup(ops[i].stream, &s);
    size_t n = 0;
    for (size_t j = i; j < nops; j++)
      if (ops[j].stream == ops[i].stream) part[n++] = ops[j];
    if (res == weftSuccess) res = stream_enqueue(s, part, n);
    for (size_t j = i; j < nops && res == weftSuccess; j++)
      if (ops[j].stream == ops[i].stream) passed[j] = 1;
  }
  size_t n = 0;
  for (size_t i = 0; i < nops; i++)
    if (ops[i].stream == NULL && !ops[i].plan.on_device) part[n++] = ops[i];
  char *taken = passed; /* the ops whose holds group_launch took: those it ran */
  if (res == weftSuccess && n > 0) {
    for (size_t i = 0; i < nops; i++)
      if (ops[i].stream == NULL && !ops[i].plan.on_device) passed[i] = 2;
    res = group_launch(part, n, 1);
  }
  /* host ops that a failure kept back never run: failed in the trace, not
   * left scheduled (the device ones were recorded by their launch) */
  for (size_t i = 0; i < nops && res != weftSuccess; i++)
    if (!passed[i] && !ops[i].plan.on_device && ops[i].plan.trace_id != 0)
      trace_set_state(ops[i].comm->trace, ops[i].plan.trace_id, TRACE_FAILED, -1, res);
  for (size_t i = 0; i < nops; i++) /* what group_launch did not take */
    if (taken[i] != 2) comm_op_end(ops[i].comm);
  if (!few) free(part);
  if (!few) free(passed);
  return res;
}

/* The outermost end's first step: the recorded creations, where no call of
 * the group failed (else none runs). Their failure, with its text, is the
 * end's result once the operations have run too. */
static weftResult_t group_end_creations(char *why, size_t why_nbytes) {
  if (group_error != weftSuccess) {
    deferred_drop();
    return weftSuccess;
  }
  weftResult_t created = deferred_run();
  if (created != weftSuccess) snprintf(why, why_nbytes, "%s", weft_error_text());
  return created;
}

weftResult_t weftGroupEnd(void) {
  if (group_depth == 0)
    return weft_error_set(weftInvalidUsage, "weftGroupEnd without weftGroupStart");
  if (--group_depth > 0) return weftSuccess;
  /* a call failed while recording: nothing runs, neither creations nor
   * operations, and the end returns that failure */
  const weftResult_t refused = group_error;
  char why[1024];
  const weftResult_t created = group_end_creations(why, sizeof why);
  struct group_entry *entries = group_entries;
  const size_t nentries = group_nops, cap = group_cap;
  /* taken away while the group runs: what runs may open groups of its own
   * (which then keep a buffer of their own, named by the key instead) */
  group_entries = NULL;
  group_nops = group_cap = 0;
  weftResult_t res = refused;
  /* every comm of the group held until the end is done with it (once per
   * entry: a count), as an operation holds its own */
  for (size_t i = 0; i < nentries; i++) comm_hold(entries[i].op.comm);
  group_number(entries, nentries);
  /* the calls that run, in call order (moved down over the others, which
   * are done with: their holds end) */
  struct group_op *ops = (struct group_op *)(void *)entries;
  size_t nops = 0;
  for (size_t i = 0; i < nentries; i++) {
    if (entries[i].runs) memmove(&ops[nops++], &entries[i].op, sizeof *ops);
    else comm_op_end(entries[i].op.comm);
  }
  if (res == weftSuccess) {
    res = group_dispatch(ops, nops); /* which ends the holds */
  } else {
    group_drop(ops, nops, res);
    group_holds_end(ops, nops);
  }
  if (group_entries == NULL) { /* still the key's: kept */
    group_entries = entries;
    group_cap = entries != NULL ? cap : 0;
  } else {
    free(entries);
  }
  if (refused != weftSuccess) return group_refusal();
  if (created != weftSuccess) return weft_error_set(created, "%s", why);
  return res;
}

/* The estimate of the calls recorded so far, in microseconds: one comm's
 * operations run one after another, comms side by side. */
static double group_estimate_us(void) {
  double longest = 0;
  const struct group_entry *e = group_entries;
  for (size_t i = 0; i < group_nops; i++) {
    int first = 1;
    for (size_t j = 0; j < i && first; j++) first = e[j].op.comm != e[i].op.comm;
    if (!first) continue;
    double us = 0;
    for (size_t j = i; j < group_nops; j++)
      if (e[j].op.comm == e[i].op.comm && e[j].runs && !plan_is_mark(&e[j].op.plan))
        us += plan_estimate_us(e[j].op.comm, &e[j].op.plan);
    if (us > longest) longest = us;
  }
  return longest;
}

/* Nested inside another group, it closes one level as weftGroupEnd does (as
 * NCCL's does: the outermost end runs the calls) and writes the estimate of
 * the calls recorded so far, which still run at that end. */
weftResult_t weftGroupSimulateEnd(float *estimatedUs) {
  if (group_depth == 0)
    return weft_error_set(weftInvalidUsage, "weftGroupSimulateEnd without weftGroupStart");
  if (--group_depth > 0) {
    if (group_error != weftSuccess) return group_refusal();
    if (estimatedUs != NULL) *estimatedUs = (float)group_estimate_us();
    return weftSuccess;
  }
  char why[1024];
  const weftResult_t created = group_end_creations(why, sizeof why);
  const double longest = group_estimate_us();
  group_nops = 0; /* the entries are kept for the next group */
  if (group_error != weftSuccess) return group_refusal();
  if (created != weftSuccess) return weft_error_set(created, "%s", why);
  if (estimatedUs != NULL) *estimatedUs = (float)longest;
  return weftSuccess;
}
