/* Host events: a marker queued on a stream. Recording bumps the event's
 * generation; the stream's worker marks that generation complete when it
 * reaches the marker. A wait queued on another stream blocks that stream's
 * worker until the generation it names is complete, so ordering between
 * streams (and between a stream and the caller) is always explicit. */
#include <pthread.h>
#include <stdlib.h>

#include "../../transport/base/status.h"
#include "stream.h"

#define EVENT_MAGIC 0x6576656e74212121ull

struct weft_event {
  uint64_t magic;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  uint64_t recorded;  /* the generation of the last record */
  uint64_t completed; /* the newest generation a stream has reached */
};

/* What a queued marker or wait carries. */
struct event_mark {
  struct weft_event *ev;
  uint64_t gen;
};

static weftResult_t event_check(weftEvent_t event, struct weft_event **out) {
  struct weft_event *ev = event;
  if (ev == NULL || ev->magic != EVENT_MAGIC)
    return weft_error_set(weftInvalidArgument,
                          "event %p is not a weft event (create one with weftEventCreate)", event);
  *out = ev;
  return weftSuccess;
}

static void event_complete(struct weft_event *ev, uint64_t gen) {
  pthread_mutex_lock(&ev->lock);
  if (gen > ev->completed) ev->completed = gen;
  pthread_cond_broadcast(&ev->changed);
  pthread_mutex_unlock(&ev->lock);
}

static void event_wait_gen(struct weft_event *ev, uint64_t gen) {
  pthread_mutex_lock(&ev->lock);
  while (ev->completed < gen) pthread_cond_wait(&ev->changed, &ev->lock);
  pthread_mutex_unlock(&ev->lock);
}

/* Stream hooks: run on the stream's worker, in queue order. */
static void event_record_hook(void *arg) {
  struct event_mark *mark = arg;
  event_complete(mark->ev, mark->gen);
  free(mark);
}

static void event_wait_hook(void *arg) {
  struct event_mark *mark = arg;
  event_wait_gen(mark->ev, mark->gen);
  free(mark);
}

static weftResult_t event_mark_queue(struct host_stream *s, struct weft_event *ev, uint64_t gen,
                                     void (*hook)(void *), int mark_only) {
  struct event_mark *mark = malloc(sizeof *mark);
  if (mark == NULL) return weft_error_set(weftSystemError, "out of memory");
  mark->ev = ev;
  mark->gen = gen;
  weftResult_t res = stream_enqueue_hook(s, hook, mark, mark_only);
  if (res != weftSuccess) free(mark);
  return res;
}

weftResult_t weftEventCreate(weftEvent_t *event) {
  weft_error_clear();
  if (event == NULL) return weft_error_set(weftInvalidArgument, "event is NULL");
  struct weft_event *ev = calloc(1, sizeof *ev);
  if (ev == NULL) return weft_error_set(weftSystemError, "out of memory");
  ev->magic = EVENT_MAGIC;
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
  pthread_mutex_lock(&ev->lock);
  uint64_t gen = ++ev->recorded;
  pthread_mutex_unlock(&ev->lock);
  if (s == NULL) { /* the NULL stream has nothing pending */
    event_complete(ev, gen);
    return weftSuccess;
  }
  weftResult_t res = event_mark_queue(s, ev, gen, event_record_hook, 1);
  if (res != weftSuccess) event_complete(ev, gen); /* never leave a waiter stuck */
  return res;
}

weftResult_t weftEventSynchronize(weftEvent_t event) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  pthread_mutex_lock(&ev->lock);
  uint64_t gen = ev->recorded;
  pthread_mutex_unlock(&ev->lock);
  event_wait_gen(ev, gen);
  return weftSuccess;
}

weftResult_t weftEventSynchronizeOnStream(weftEvent_t event, weftStream_t stream) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  struct host_stream *s = NULL;
  WEFT_TRY(stream_lookup(stream, &s));
  pthread_mutex_lock(&ev->lock);
  uint64_t gen = ev->recorded;
  int done = ev->completed >= gen;
  pthread_mutex_unlock(&ev->lock);
  /* while the worker is idle and sends and receives lead the queue, this
   * thread runs them; else it waits as weftEventSynchronize does */
  while (!done && stream_run_head(s)) {
    pthread_mutex_lock(&ev->lock);
    done = ev->completed >= gen;
    pthread_mutex_unlock(&ev->lock);
  }
  if (!done) event_wait_gen(ev, gen);
  return weftSuccess;
}

weftResult_t weftEventQuery(weftEvent_t event) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  pthread_mutex_lock(&ev->lock);
  int done = ev->completed >= ev->recorded;
  pthread_mutex_unlock(&ev->lock);
  return done ? weftSuccess : weftInProgress;
}

weftResult_t weftStreamWaitEvent(weftStream_t stream, weftEvent_t event) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  pthread_mutex_lock(&ev->lock);
  uint64_t gen = ev->recorded;
  int done = ev->completed >= gen;
  pthread_mutex_unlock(&ev->lock);
  if (stream == NULL) { /* the caller is the NULL stream: wait here */
    event_wait_gen(ev, gen);
    return weftSuccess;
  }
  if (done) return weftSuccess;
  struct host_stream *s;
  WEFT_TRY(stream_lookup(stream, &s));
  return event_mark_queue(s, ev, gen, event_wait_hook, 0);
}

weftResult_t weftEventDestroy(weftEvent_t event) {
  weft_error_clear();
  struct weft_event *ev = NULL;
  WEFT_TRY(event_check(event, &ev));
  /* a queued marker still points at the event: let it pass first */
  pthread_mutex_lock(&ev->lock);
  uint64_t gen = ev->recorded;
  pthread_mutex_unlock(&ev->lock);
  event_wait_gen(ev, gen);
  ev->magic = 0;
  pthread_cond_destroy(&ev->changed);
  pthread_mutex_destroy(&ev->lock);
  free(ev);
  return weftSuccess;
}
