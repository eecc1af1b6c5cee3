/* Host streams. Each stream has a worker thread and a FIFO of items; an item
 * is one group launch (one op, or a whole group). Communicators count the
 * items that name them, so that finalize, destroy and abort wait for them. */
#include "stream.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../exec/device/device.h"

#define STREAM_MAGIC 0x73747265616d2121ull

struct stream_item {
  struct stream_item *next;
  void (*hook)(void *arg); /* an item without ops runs this (events) */
  void *hook_arg;
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

static void item_pending(const struct stream_item *item, int delta) {
  for (size_t i = 0; i < item->nops; i++)
    __atomic_add_fetch(&item->ops[i].comm->pending, delta, __ATOMIC_SEQ_CST);
}

static void *stream_worker(void *arg) {
  struct host_stream *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (s->head == NULL && !s->stop) pthread_cond_wait(&s->changed, &s->lock);
    if (s->head == NULL) break; /* stopping, and drained */
    struct stream_item *item = s->head;
    s->head = item->next;
    if (s->head == NULL) s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->lock);
    weftResult_t res = weftSuccess;
    if (item->hook != NULL) item->hook(item->hook_arg);
    else res = group_launch(item->ops, item->nops);
    pthread_mutex_lock(&s->lock);
    if (res != weftSuccess && s->error == weftSuccess) {
      s->error = res;
      snprintf(s->error_text, sizeof s->error_text, "%s", weft_error_text());
    }
    item_pending(item, -1);
    free(item);
    s->busy = 0;
    pthread_cond_broadcast(&s->changed);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Appends one item: ops to launch, or (nops == 0) a hook to call. */
static weftResult_t stream_push(struct host_stream *s, const struct group_op *ops, size_t nops,
                                void (*hook)(void *arg), void *arg) {
  struct stream_item *item = malloc(sizeof *item + nops * sizeof *ops);
  if (item == NULL) return weft_error_set(weftSystemError, "out of memory");
  item->next = NULL;
  item->hook = hook;
  item->hook_arg = arg;
  item->nops = nops;
  if (nops > 0) memcpy(item->ops, ops, nops * sizeof *ops);
  item_pending(item, +1);
  pthread_mutex_lock(&s->lock);
  if (s->tail != NULL) s->tail->next = item;
  else s->head = item;
  s->tail = item;
  pthread_cond_broadcast(&s->changed);
  pthread_mutex_unlock(&s->lock);
  return weftSuccess;
}

weftResult_t stream_enqueue(struct host_stream *s, const struct group_op *ops, size_t nops) {
  return stream_push(s, ops, nops, NULL, NULL);
}

weftResult_t stream_enqueue_hook(struct host_stream *s, void (*hook)(void *arg), void *arg) {
  return stream_push(s, NULL, 0, hook, arg);
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
