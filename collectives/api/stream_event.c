/* Host events: a marker queued on a stream. Each record makes a completion
 * of its own, which the stream's worker marks done when it reaches the
 * marker; the event names its newest. A wait queued on another stream holds
 * the completion it was queued for and blocks that stream's worker until it
 * is done, so ordering between streams (and between a stream and the
 * caller) is always explicit, and records on several streams, finishing out
 * of order, release each wait at its own. Queued markers and waits hold the
 * event too: it is freed once destroyed and none is left. */
#include <pthread.h>
#include <stdlib.h>

#include "../../transport/base/status.h"
#include "stream.h"

#define EVENT_MAGIC 0x6576656e74212121ull

/* One record's completion; its fields under the event's lock. */
struct event_rec {
  int done;
  int refs; /* the event while it is the newest, queued hooks, waiters */
};

struct weft_event {
  uint64_t magic;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  struct event_rec *last; /* the newest record; NULL before the first */
  int refs;               /* the caller's handle until destroyed, and queued hooks */
};

/* What a queued marker or wait carries: a reference to each. */
struct event_mark {
  struct weft_event *ev;
  struct event_rec *rec;
};

static weftResult_t event_check(weftEvent_t event, struct weft_event **out) {
  struct weft_event *ev = event;
  if (ev == NULL || ev->magic != EVENT_MAGIC)
    return weft_error_set(weftInvalidArgument,
                          "event %p is not a weft event (create one with weftEventCreate)", event);
  *out = ev;
  return weftSuccess;
}

/* Under ev->lock. */
static void rec_unref(struct event_rec *rec) {
  if (--rec->refs == 0) free(rec);
}

/* Drops a reference to ev; the last frees it. */
static void event_unref(struct weft_event *ev) {
  pthread_mutex_lock(&ev->lock);
  const int last = --ev->refs == 0;
  if (last && ev->last != NULL) rec_unref(ev->last);
  pthread_mutex_unlock(&ev->lock);
  if (!last) return;
  pthread_cond_destroy(&ev->changed);
  pthread_mutex_destroy(&ev->lock);
  free(ev);
}

/* The newest record, referenced for the caller (NULL when there is none or
 * it is done already: nothing to wait for). Under ev->lock. */
static struct event_rec *event_pending(struct weft_event *ev) {
  struct event_rec *rec = ev->last;
  if (rec == NULL || rec->done) return NULL;
  rec->refs++;
  return rec;
}

/* Waits until rec is done, and drops the caller's reference. */
static void rec_wait(struct weft_event *ev, struct event_rec *rec) {
  pthread_mutex_lock(&ev->lock);
  while (!rec->done) pthread_cond_wait(&ev->changed, &ev->lock);
  rec_unref(rec);
  pthread_mutex_unlock(&ev->lock);
}

static int rec_done(struct weft_event *ev, struct event_rec *rec) {
  pthread_mutex_lock(&ev->lock);
  const int done = rec->done;
  pthread_mutex_unlock(&ev->lock);
  return done;
}

static void rec_complete(struct weft_event *ev, struct event_rec *rec) {
  pthread_mutex_lock(&ev->lock);
  rec->done = 1;
  pthread_cond_broadcast(&ev->changed);
  pthread_mutex_unlock(&ev->lock);
}

/* Stream hooks: run on the stream's worker, in queue order. */
static void event_record_hook(void *arg) {
  struct event_mark *mark = arg;
  pthread_mutex_lock(&mark->ev->lock);
  mark->rec->done = 1;
  pthread_cond_broadcast(&mark->ev->changed);
  rec_unref(mark->rec);
  pthread_mutex_unlock(&mark->ev->lock);
  event_unref(mark->ev);
  free(mark);
}

static void event_wait_hook(void *arg) {
  struct event_mark *mark = arg;
  rec_wait(mark->ev, mark->rec);
  event_unref(mark->ev);
  free(mark);
}

/* Queues hook with a mark holding ev and rec, whose references the caller
 * took for it (and gets back, dropped, where it cannot be queued). */
static weftResult_t event_mark_queue(struct host_stream *s, struct weft_event *ev,
                                     struct event_rec *rec, void (*hook)(void *), int mark_only) {
  struct event_mark *mark = malloc(sizeof *mark);
  if (mark != NULL) *mark = (struct event_mark){ev, rec};
  /* a record is named by its completion, for a caller that waits for it */
  const void *tag = mark_only ? rec : NULL;
  weftResult_t res = mark == NULL ? weft_error_set(weftSystemError, "out of memory")
                                  : stream_enqueue_hook(s, hook, mark, mark_only, tag);
  if (res == weftSuccess) return res;
  free(mark);
  pthread_mutex_lock(&ev->lock);
  rec_unref(rec);
  pthread_mutex_unlock(&ev->lock);
  event_unref(ev);
  return res;
}

weftResult_t weftEventCreate(weftEvent_t *event) {
  weft_error_clear();
  if (event == NULL) return weft_error_set(weftInvalidArgument, "event is NULL");
  struct weft_event *ev = calloc(1, sizeof *ev);
  if (ev == NULL) return weft_error_set(weftSystemError, "out of memory");
  ev->magic = EVENT_MAGIC;
  ev->refs = 1;
  pthread_mutex_init(&ev->lock, NULL);
  pthread_cond_init(&ev->changed, NULL);
  *event = ev;
  return weftSuccess;
}

weftResult_t weftEventRecord(weftEvent_t event, weftStream_t stream) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  struct host_stream *s = NULL;
  if (stream != NULL) WEFT_TRY(stream_lookup(stream, &s));
  struct event_rec *rec = calloc(1, sizeof *rec);
  if (rec == NULL) return weft_error_set(weftSystemError, "out of memory");
  pthread_mutex_lock(&ev->lock);
  if (ev->last != NULL) rec_unref(ev->last);
  ev->last = rec;
  rec->refs = 1;     /* the event's */
  rec->done = s == NULL; /* the NULL stream has nothing pending */
  if (s != NULL) {
    rec->refs++; /* the marker's, */
    ev->refs++;  /* which holds the event too */
  }
  pthread_cond_broadcast(&ev->changed);
  pthread_mutex_unlock(&ev->lock);
  if (s == NULL) return weftSuccess;
  weftResult_t res = event_mark_queue(s, ev, rec, event_record_hook, 1);
  if (res != weftSuccess) rec_complete(ev, rec); /* never leave a waiter stuck */
  return res;
}

weftResult_t weftEventSynchronize(weftEvent_t event) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  pthread_mutex_lock(&ev->lock);
  struct event_rec *rec = event_pending(ev);
  pthread_mutex_unlock(&ev->lock);
  if (rec != NULL) rec_wait(ev, rec);
  return weftSuccess;
}

weftResult_t weftEventSynchronizeOnStream(weftEvent_t event, weftStream_t stream) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  struct host_stream *s = NULL;
  WEFT_TRY(stream_lookup(stream, &s));
  pthread_mutex_lock(&ev->lock);
  struct event_rec *rec = event_pending(ev);
  pthread_mutex_unlock(&ev->lock);
  if (rec == NULL) return weftSuccess;
  /* while the worker is idle, sends and receives lead the queue and this
   * record ends it, this thread runs them, taking in what is queued before
   * the record, not behind it; else it waits as weftEventSynchronize does
   * (the worker runs what was queued behind the record, which may wait for
   * what this thread does next) */
  while (!rec_done(ev, rec) && stream_run_head(s, rec)) {
  }
  rec_wait(ev, rec);
  return weftSuccess;
}

weftResult_t weftEventQuery(weftEvent_t event) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  pthread_mutex_lock(&ev->lock);
  const int done = ev->last == NULL || ev->last->done;
  pthread_mutex_unlock(&ev->lock);
  return done ? weftSuccess : weftInProgress;
}

weftResult_t weftStreamWaitEvent(weftStream_t stream, weftEvent_t event) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  struct host_stream *s = NULL;
  if (stream != NULL) WEFT_TRY(stream_lookup(stream, &s));
  pthread_mutex_lock(&ev->lock);
  struct event_rec *rec = event_pending(ev); /* the last record as of this call */
  if (rec != NULL && s != NULL) ev->refs++;  /* the wait's, queued below */
  pthread_mutex_unlock(&ev->lock);
  if (rec == NULL) return weftSuccess;
  if (s == NULL) { /* the caller is the NULL stream: wait here */
    rec_wait(ev, rec);
    return weftSuccess;
  }
  return event_mark_queue(s, ev, rec, event_wait_hook, 0);
}

weftResult_t weftEventDestroy(weftEvent_t event) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  /* the newest record passes first, as before; markers and waits still
   * queued hold the event, which the last of them frees */
  pthread_mutex_lock(&ev->lock);
  struct event_rec *rec = event_pending(ev);
  pthread_mutex_unlock(&ev->lock);
  if (rec != NULL) rec_wait(ev, rec);
  ev->magic = 0;
  event_unref(ev);
  return weftSuccess;
}
