/* Host streams. Each stream has a worker thread and a FIFO of items; an item
 * is one group launch (one op, or a whole group). Communicators count the
 * items that name them, so that finalize, destroy and abort wait for them.
 *
 * Sends and receives queued back to back on one communicator run as a
 * group's do, all advancing together: an item of them keeps taking in the
 * items of them queued behind it (and the event records among them) while
 * it runs, so a send queued while an earlier receive waits for its peer
 * starts at once, as MPI's and Gloo's nonblocking sends do, and no order of
 * them deadlocks. A record taken in fires once everything before it is done.
 * An item that reads or writes a buffer that an earlier one still writes (or
 * writes one it still reads) is not taken in: it runs once those are done,
 * in the stream's order, as on a CUDA stream. */
#include "stream.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../algo/sendrecv.h"
#include "../core/hang.h"
#include "../core/trace.h"
#include "../exec/device/device.h"

#define STREAM_MAGIC 0x73747265616d2121ull

struct stream_item {
  struct stream_item *next;
  void (*hook)(void *arg); /* an item without ops runs this (events) */
  void *hook_arg;
  int mark; /* the hook only marks a point: it never blocks */
  const void *tag; /* the caller's name for a hook item (stream_run_head), or NULL */
  /* ops of an aborted or revoked comm taken out while queued
   * (stream_drop_comm): the item fails with this when it is reached */
  weftResult_t dropped;
  size_t nops;
  struct group_op ops[];
};

struct host_stream {
  uint64_t magic;
  struct host_stream *next_live; /* the registry of live streams */
  pthread_t worker;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  struct stream_item *head, *tail;
  int busy;    /* the worker is running an item */
  int stop;
  weftResult_t error; /* the first failure since the last synchronize */
  char error_text[1024];
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct host_stream *registry;
/* Bumped under registry_lock by every create and destroy: a thread's memo of
 * its recent stream_is_host answers (a few slots, by address: one thread may
 * drive several ranks' streams) holds while the generation is unchanged. A
 * process with no host stream (the CUDA users') never takes the lock. */
static uint64_t registry_generation;
static unsigned registry_live;
#define STREAM_MEMO_SLOTS 8
static __thread struct {
  weftStream_t stream;
  uint64_t generation;
  int is_host;
} memo[STREAM_MEMO_SLOTS];

weftResult_t stream_lookup(weftStream_t stream, struct host_stream **out) {
  pthread_mutex_lock(&registry_lock);
  struct host_stream *s = registry;
  while (s != NULL && (void *)s != stream) s = s->next_live;
  pthread_mutex_unlock(&registry_lock);
  if (s == NULL)
    return weft_error_set(weftInvalidArgument,
                          "stream %p is not a weft host stream (create one with weftStreamCreate)%s",
                          stream,
                          device_built() ? ""
                                         : "; CUDA streams need device memory and a build "
                                           "with CUDA, and weft was built without CUDA");
  *out = s;
  return weftSuccess;
}

int stream_is_host(weftStream_t stream) {
  if (stream == NULL) return 1;
  /* the stream's creator published it after the count rose */
  if (__atomic_load_n(&registry_live, __ATOMIC_ACQUIRE) == 0) return 0;
  const uint64_t generation = __atomic_load_n(&registry_generation, __ATOMIC_ACQUIRE);
  const size_t slot = ((uintptr_t)stream >> 4) % STREAM_MEMO_SLOTS;
  if (memo[slot].stream == stream && memo[slot].generation == generation)
    return memo[slot].is_host;
  pthread_mutex_lock(&registry_lock);
  struct host_stream *s = registry;
  while (s != NULL && (void *)s != stream) s = s->next_live;
  memo[slot].stream = stream;
  memo[slot].generation = registry_generation;
  memo[slot].is_host = s != NULL;
  pthread_mutex_unlock(&registry_lock);
  return s != NULL;
}

static void item_pending(const struct stream_item *item, int delta) {
  for (size_t i = 0; i < item->nops; i++)
    __atomic_add_fetch(&item->ops[i].comm->pending, delta, __ATOMIC_SEQ_CST);
}

/* Whether item is sends and receives on comm's host memory only (with the
 * marks of the all-to-alls, gathers and scatters they are: those run among
 * the sends and receives around them, as before they had marks). */
static int item_is_sendrecv(const struct stream_item *item, const struct weftComm *comm) {
  if (item->hook != NULL || item->nops == 0) return 0;
  for (size_t i = 0; i < item->nops; i++) {
    const struct weft_plan *plan = &item->ops[i].plan;
    if (item->ops[i].comm != comm || !(plan_is_sendrecv(plan) || plan_is_mark(plan)) ||
        plan->on_device)
      return 0;
  }
  return 1;
}

/* The items a run of sends and receives has taken, each with the count of
 * ops added up to its end. */
struct taken {
  struct stream_item **items;
  size_t *ends;
  size_t n, cap, retired;
  /* ops retired while the run still holds the comm: their count comes off
   * comm->pending only once the hold is let go (launch_op_end), so that a
   * destroy that waits for pending never finds the run's hold after it */
  size_t held;
};

static weftResult_t taken_push(struct taken *t, struct stream_item *item, size_t end) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    struct stream_item **items = realloc(t->items, cap * sizeof *items);
    if (items != NULL) t->items = items;
    size_t *ends = items != NULL ? realloc(t->ends, cap * sizeof *ends) : NULL;
    if (ends == NULL) return weft_error_set(weftSystemError, "out of memory");
    t->ends = ends;
    t->cap = cap;
  }
  t->items[t->n] = item;
  t->ends[t->n++] = end;
  return weftSuccess;
}

/* Retires, in order, the taken items whose ops and every op before are done
 * (all of them when all is set): runs a record's hook, frees the item. */
static void taken_retire(struct taken *t, const struct sendrecv_exec *x, int all,
                         weftResult_t res) {
  while (t->retired < t->n) {
    const size_t begin = t->retired > 0 ? t->ends[t->retired - 1] : 0;
    for (size_t i = begin; i < t->ends[t->retired] && !all; i++)
      if (!sendrecv_exec_finished(x, i)) return;
    struct stream_item *item = t->items[t->retired++];
    /* the trace: done, or failed with the batch where it was not finished */
    for (size_t i = 0; i < item->nops; i++) {
      const int finished = x != NULL && begin + i < t->ends[t->retired - 1] &&
                           sendrecv_exec_finished(x, begin + i);
      trace_done(item->ops[i].comm->trace, item->ops[i].plan.trace_id,
                 finished || res == weftSuccess ? weftSuccess : res, 1);
    }
    if (item->hook != NULL) item->hook(item->hook_arg);
    if (!all) t->held += item->nops;
    else item_pending(item, -1);
    free(item);
  }
}

/* Adds item's ops to x. */
static weftResult_t exec_add_item(struct sendrecv_exec *x, const struct stream_item *item) {
  const struct weft_plan **plans = malloc(item->nops * sizeof *plans);
  if (plans == NULL) return weft_error_set(weftSystemError, "out of memory");
  for (size_t i = 0; i < item->nops; i++) {
    plans[i] = &item->ops[i].plan;
    trace_set_state(item->ops[i].comm->trace, item->ops[i].plan.trace_id, TRACE_STARTED, -1,
                    weftSuccess);
  }
  weftResult_t res = sendrecv_exec_add(x, plans, item->nops);
  free(plans);
  return res;
}

/* The trace ids of the ops x takes, in x's order, for the hang watch. */
struct watched {
  uint64_t *ids;
  size_t n, cap;
  int lost; /* out of memory: ids no longer follow x's order */
};

static void watched_add(struct watched *w, const struct stream_item *item) {
  if (w->n + item->nops > w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 16;
    while (cap < w->n + item->nops) cap *= 2;
    uint64_t *ids = realloc(w->ids, cap * sizeof *ids);
    if (ids == NULL) { /* the waits still time out, unnamed */
      w->lost = 1;
      return;
    }
    w->ids = ids;
    w->cap = cap;
  }
  for (size_t i = 0; i < item->nops; i++) w->ids[w->n++] = item->ops[i].plan.trace_id;
}

/* The bytes a send reads or a receive writes (nbytes 0: none, or a mark). */
static const char *op_range(const struct weft_plan *plan, size_t *nbytes, int *writes) {
  *writes = plan->coll == COLL_RECV;
  *nbytes = plan_is_sendrecv(plan) ? plan->count * plan_type_size(plan->datatype) : 0;
  return *writes ? (const char *)plan->recvbuf : (const char *)plan->sendbuf;
}

/* Whether an op of later reads what an op of earlier still to finish
 * writes, or writes what it reads or writes: later must wait for earlier
 * then, as the stream's order says (a receive, then a send forwarding what
 * it got), instead of advancing with it. */
static int item_depends(const struct stream_item *later, const struct taken *t,
                        const struct sendrecv_exec *x) {
  for (size_t k = t->retired; k < t->n; k++) {
    const struct stream_item *earlier = t->items[k];
    const size_t begin = k > 0 ? t->ends[k - 1] : 0;
    for (size_t i = 0; i < earlier->nops; i++) {
      size_t en, ln;
      int ew, lw;
      const char *e = op_range(&earlier->ops[i].plan, &en, &ew);
      if (en == 0 || sendrecv_exec_finished(x, begin + i)) continue;
      for (size_t j = 0; j < later->nops; j++) {
        const char *l = op_range(&later->ops[j].plan, &ln, &lw);
        if (ln > 0 && (ew || lw) && l < e + en && e < l + ln) return 1;
      }
    }
  }
  return 0;
}

/* Runs first, an item of sends and receives, taking in the like items and
 * the marks queued behind it until all it took is done (none after the item
 * tagged stop_tag, where that is not NULL: what is queued behind it is the
 * worker's); retires them all. Called without the stream's lock, which it
 * takes to look at the queue. */
static weftResult_t stream_run_sendrecv(struct host_stream *s, struct stream_item *first,
                                        const void *stop_tag) {
  struct weftComm *comm = first->ops[0].comm;
  struct taken t = {0};
  struct sendrecv_exec *x = NULL;
  /* watched as a collective is: a wait that times out names the peer and
   * what it did last */
  struct watched wids = {0};
  struct hang_watch hw = {0};
  weftResult_t res = launch_op_begin(comm);
  if (res == weftSuccess) res = sendrecv_exec_create(comm, 1, &x);
  if (res == weftSuccess) res = exec_add_item(x, first);
  if (res == weftSuccess) {
    watched_add(&wids, first);
    hang_watch_begin(&hw, comm, wids.ids, wids.n, SIZE_MAX, 0);
  }
  weftResult_t pushed = taken_push(&t, first, x != NULL ? sendrecv_exec_count(x) : 0);
  if (pushed != weftSuccess) {
    /* nowhere to keep it: it ends here */
    item_pending(first, -1);
    free(first);
    if (res == weftSuccess) res = pushed;
  }
  int stopped = stop_tag != NULL && first->tag == stop_tag;
  while (res == weftSuccess || res == weftInProgress) {
    res = sendrecv_exec_poll(x);
    taken_retire(&t, x, 0, weftSuccess);
    if (res != weftSuccess && res != weftInProgress) break;
    /* take in what was queued meanwhile: all of it that may advance with
     * what runs (one item a poll made thousands of queued sends quadratic) */
    int took = 0;
    for (;;) {
      struct stream_item *more = NULL;
      pthread_mutex_lock(&s->lock);
      if (!stopped && s->head != NULL && s->head->dropped == weftSuccess &&
          (s->head->mark || (item_is_sendrecv(s->head, comm) && !item_depends(s->head, &t, x)))) {
        more = s->head;
        s->head = more->next;
        if (s->head == NULL) s->tail = NULL;
      }
      pthread_mutex_unlock(&s->lock);
      if (more == NULL) break;
      took = 1;
      if (stop_tag != NULL && more->tag == stop_tag) stopped = 1;
      weftResult_t added = more->nops > 0 ? exec_add_item(x, more) : weftSuccess;
      if (added == weftSuccess && more->nops > 0 && hw.comm != NULL) {
        watched_add(&wids, more);
        hw.ids = wids.ids;
        hw.nids = wids.n;
      }
      pushed = taken_push(&t, more, sendrecv_exec_count(x));
      if (pushed != weftSuccess) {
        if (more->hook != NULL) more->hook(more->hook_arg);
        item_pending(more, -1);
        free(more);
      }
      if (added != weftSuccess || pushed != weftSuccess) {
        res = added != weftSuccess ? added : pushed;
        break;
      }
    }
    if (res != weftSuccess && res != weftInProgress) break;
    if (!took && res == weftSuccess) break; /* all done, nothing queued */
    if (took) res = weftInProgress;
  }
  /* the comm's state and error text first: the records that fire below
   * wake callers who ask for them */
  if (hw.comm != NULL) {
    /* the ops retired are done in the trace already: the watch ends the others */
    const size_t retired = t.retired > 0 ? t.ends[t.retired - 1] : 0;
    hw.ids = wids.ids + (retired < wids.n ? retired : wids.n);
    hw.nids = retired < wids.n && !wids.lost ? wids.n - retired : 0;
    res = hang_watch_end(&hw, res);
  }
  free(wids.ids);
  res = launch_op_end(comm, res);
  __atomic_sub_fetch(&comm->pending, t.held, __ATOMIC_SEQ_CST);
  /* a failure ends every item taken: the records among them fire, as the
   * worker runs the hooks behind a failed item */
  taken_retire(&t, x, 1, res);
  free(t.items);
  free(t.ends);
  sendrecv_exec_free(x);
  return res;
}

/* Called with the stream's lock held, which it drops while the item runs. */
static void stream_record_error(struct host_stream *s, weftResult_t res) {
  if (res != weftSuccess && s->error == weftSuccess) {
    s->error = res;
    snprintf(s->error_text, sizeof s->error_text, "%s", weft_error_text());
  }
}

int stream_run_head(struct host_stream *s, const void *tag) {
  pthread_mutex_lock(&s->lock);
  struct stream_item *item = s->head;
  /* an item that lost ops to an abort is the worker's, which reports it */
  if (s->busy || item == NULL || item->nops == 0 || item->dropped != weftSuccess ||
      !item_is_sendrecv(item, item->ops[0].comm) || s->tail == NULL || s->tail->tag != tag) {
    pthread_mutex_unlock(&s->lock);
    return 0;
  }
  s->head = item->next;
  if (s->head == NULL) s->tail = NULL;
  s->busy = 1; /* the worker waits meanwhile */
  pthread_mutex_unlock(&s->lock);
  weftResult_t res = stream_run_sendrecv(s, item, tag); /* which retires item */
  pthread_mutex_lock(&s->lock);
  stream_record_error(s, res);
  s->busy = 0;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  return 1;
}

static void *stream_worker(void *arg) {
  struct host_stream *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    /* busy here: a caller runs the head (stream_run_head) */
    while (s->busy || (s->head == NULL && !s->stop)) pthread_cond_wait(&s->changed, &s->lock);
    if (s->head == NULL) break; /* stopping, and drained */
    struct stream_item *item = s->head;
    s->head = item->next;
    if (s->head == NULL) s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->lock);
    weftResult_t res = weftSuccess;
    const weftResult_t dropped = item->dropped;
    const int sendrecv = dropped == weftSuccess && item->nops > 0 &&
                         item_is_sendrecv(item, item->ops[0].comm);
    if (sendrecv) res = stream_run_sendrecv(s, item, NULL); /* which retires item */
    else if (item->hook != NULL) item->hook(item->hook_arg);
    else if (item->nops > 0) res = group_launch(item->ops, item->nops, 0);
    pthread_mutex_lock(&s->lock);
    if (dropped != weftSuccess)
      stream_record_error(s, weft_error_set(dropped, "an operation queued on this stream was "
                                                     "not run: its communicator was aborted or "
                                                     "revoked before the stream reached it"));
    stream_record_error(s, res);
    if (!sendrecv) {
      item_pending(item, -1);
      free(item);
    }
    s->busy = 0;
    pthread_cond_broadcast(&s->changed);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Appends one item: ops to launch, or (nops == 0) a hook to call (mark: one
 * that never blocks). */
static weftResult_t stream_push(struct host_stream *s, const struct group_op *ops, size_t nops,
                                void (*hook)(void *arg), void *arg, int mark, const void *tag) {
  struct stream_item *item = malloc(sizeof *item + nops * sizeof *ops);
  if (item == NULL) return weft_error_set(weftSystemError, "out of memory");
  item->next = NULL;
  item->hook = hook;
  item->hook_arg = arg;
  item->mark = mark;
  item->tag = tag;
  item->dropped = weftSuccess;
  item->nops = nops;
  if (nops > 0) memcpy(item->ops, ops, nops * sizeof *ops);
  pthread_mutex_lock(&s->lock);
  item_pending(item, +1); /* with the item in the queue, as stream_drop_comm sees them */
  if (s->tail != NULL) s->tail->next = item;
  else s->head = item;
  s->tail = item;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  return weftSuccess;
}

void stream_drop_comm(struct weftComm *comm, weftResult_t res) {
  pthread_mutex_lock(&registry_lock);
  for (struct host_stream *s = registry; s != NULL; s = s->next_live) {
    pthread_mutex_lock(&s->lock);
    for (struct stream_item *item = s->head; item != NULL; item = item->next) {
      size_t kept = 0;
      for (size_t i = 0; i < item->nops; i++) {
        if (item->ops[i].comm != comm) {
          item->ops[kept++] = item->ops[i];
          continue;
        }
        trace_done(comm->trace, item->ops[i].plan.trace_id, res, 1);
        __atomic_sub_fetch(&comm->pending, 1, __ATOMIC_SEQ_CST);
        item->dropped = res;
      }
      item->nops = kept;
    }
    pthread_mutex_unlock(&s->lock);
  }
  pthread_mutex_unlock(&registry_lock);
}

weftResult_t stream_enqueue(struct host_stream *s, const struct group_op *ops, size_t nops) {
  for (size_t i = 0; i < nops; i++) trace_share(ops[i].comm->trace);
  return stream_push(s, ops, nops, NULL, NULL, 0, NULL);
}

weftResult_t stream_enqueue_hook(struct host_stream *s, void (*hook)(void *arg), void *arg,
                                 int mark, const void *tag) {
  return stream_push(s, NULL, 0, hook, arg, mark, tag);
}

weftResult_t weftStreamCreate(weftStream_t *stream) {
  weft_error_clear();
  if (stream == NULL) return weft_error_set(weftInvalidArgument, "stream is NULL");
  struct host_stream *s = calloc(1, sizeof *s);
  if (s == NULL) return weft_error_set(weftSystemError, "out of memory");
  s->magic = STREAM_MAGIC;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->changed, NULL);
  int rc = pthread_create(&s->worker, NULL, stream_worker, s);
  if (rc != 0) {
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s);
    errno = rc;
    return weft_error_errno(weftSystemError, "starting a stream thread");
  }
  pthread_mutex_lock(&registry_lock);
  s->next_live = registry;
  registry = s;
  __atomic_add_fetch(&registry_live, 1, __ATOMIC_RELEASE);
  __atomic_add_fetch(&registry_generation, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&registry_lock);
  *stream = s;
  return weftSuccess;
}

/* Takes the stream's recorded failure, if any, into the caller's error. */
static weftResult_t stream_take_error(struct host_stream *s) {
  weftResult_t res = s->error;
  if (res != weftSuccess) weft_error_set(res, "%s", s->error_text);
  s->error = weftSuccess;
  return res;
}

weftResult_t weftStreamSynchronize(weftStream_t stream) {
  weft_error_clear();
  struct host_stream *s;
  WEFT_TRY(stream_lookup(stream, &s));
  pthread_mutex_lock(&s->lock);
  while (s->head != NULL || s->busy) pthread_cond_wait(&s->changed, &s->lock);
  weftResult_t res = stream_take_error(s);
  pthread_mutex_unlock(&s->lock);
  return res;
}

weftResult_t weftStreamQuery(weftStream_t stream) {
  weft_error_clear();
  struct host_stream *s;
  WEFT_TRY(stream_lookup(stream, &s));
  pthread_mutex_lock(&s->lock);
  weftResult_t res = s->head != NULL || s->busy ? weftInProgress : stream_take_error(s);
  pthread_mutex_unlock(&s->lock);
  return res;
}

weftResult_t weftStreamDestroy(weftStream_t stream) {
  weft_error_clear();
  struct host_stream *s;
  WEFT_TRY(stream_lookup(stream, &s));
  pthread_mutex_lock(&registry_lock);
  struct host_stream **link = &registry;
  while (*link != s) link = &(*link)->next_live;
  *link = s->next_live;
  __atomic_sub_fetch(&registry_live, 1, __ATOMIC_RELEASE);
  __atomic_add_fetch(&registry_generation, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&registry_lock);
  pthread_mutex_lock(&s->lock);
  s->stop = 1; /* the worker drains the queue first */
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->worker, NULL);
  weftResult_t res = stream_take_error(s);
  s->magic = 0;
  pthread_cond_destroy(&s->changed);
  pthread_mutex_destroy(&s->lock);
  free(s);
  return res;
}
