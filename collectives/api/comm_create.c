/* Nonblocking communicator creation (a config's blocking = 0, as NCCL's):
 * the call hands back the comm at once, marked COMM_MAGIC_CREATING, and
 * returns weftInProgress while a thread of its own joins and connects it.
 * weftCommGetAsyncError reports weftInProgress until that thread is done,
 * then its result; the first report of success makes the comm live (its
 * magic COMM_MAGIC), and every other call refuses a comm still being created
 * (comm_check_slow). Destroy waits for the creation to end; abort returns at
 * once and leaves the thread to free what it makes (an abort while a
 * destroy waits leaves the comm to the destroy).
 *
 * One lock over every creation: they are few, and a destroy or abort that
 * frees the state never races the thread's last touch of it. */
#include "comm_create.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/log.h"
#include "../../transport/base/status.h"

struct comm_creation {
  int done;      /* the thread finished comm_init_into */
  int abandoned; /* aborted while it ran: the thread frees what it made */
  int ending;    /* a destroy waits for the thread: it, not an abort, frees */
  weftResult_t res;
  char error[sizeof((struct weftComm *)0)->last_error];
  /* the call's arguments, kept for the thread */
  struct comm_create_fns fns;
  int nranks, rank, bind_dev, has_cfg;
  struct bootstrap_id id;
  weftConfig_t cfg;
  char name[sizeof((struct weftComm *)0)->name];
};

static pthread_mutex_t creations_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t creations_done = PTHREAD_COND_INITIALIZER;

int comm_creating(const struct weftComm *comm) {
  return comm != NULL && __atomic_load_n(&comm->magic, __ATOMIC_ACQUIRE) == COMM_MAGIC_CREATING &&
         comm->pid == comm_self_pid();
}

/* Under creations_lock, the creation seen done and successful: comm is live. */
static void creation_publish(struct weftComm *comm) {
  free(comm->creation);
  comm->creation = NULL;
  __atomic_store_n(&comm->magic, COMM_MAGIC, __ATOMIC_RELEASE);
}

static void *creation_main(void *arg) {
  struct weftComm *comm = arg;
  struct comm_creation *c = comm->creation; /* the thread's until it says done */
  weftResult_t res = c->fns.init(comm, c->nranks, &c->id, c->rank,
                                 c->has_cfg ? &c->cfg : NULL, -1);
  if (res == weftSuccess) comm_device_bind(comm, c->bind_dev);
  pthread_mutex_lock(&creations_lock);
  c->res = res;
  if (res != weftSuccess) snprintf(c->error, sizeof c->error, "%s", weft_error_text());
  c->done = 1;
  const int abandoned = c->abandoned;
  pthread_cond_broadcast(&creations_done);
  pthread_mutex_unlock(&creations_lock);
  if (!abandoned) return NULL; /* the comm is its caller's again */
  const struct comm_create_fns fns = c->fns;
  free(c);
  comm->creation = NULL;
  if (res != weftSuccess) {
    free(comm);
    return NULL;
  }
  __atomic_store_n(&comm->magic, COMM_MAGIC, __ATOMIC_RELEASE);
  WEFT_INFO(LOG_INIT, "comm %p rank %d: created after its abort; aborting it now", (void *)comm,
            comm->rank);
  fns.abort(comm);
  return NULL;
}

weftResult_t comm_create_start(weftComm_t *comm_out, int nranks, const struct bootstrap_id *id,
                               int rank, const weftConfig_t *config, int bind_dev,
                               const struct comm_create_fns *fns) {
  struct weftComm *comm = calloc(1, sizeof *comm);
  struct comm_creation *c = calloc(1, sizeof *c);
  if (comm == NULL || c == NULL) {
    free(comm);
    free(c);
    return weft_error_set(weftSystemError, "out of memory");
  }
  c->fns = *fns;
  c->nranks = nranks;
  c->rank = rank;
  c->bind_dev = bind_dev;
  c->id = *id;
  c->res = weftInProgress;
  if (config != NULL) { /* a whole one, read (comm_config_read) from the caller's */
    c->has_cfg = 1;
    c->cfg = *config;
    if (config->commName != NULL) {
      snprintf(c->name, sizeof c->name, "%s", config->commName);
      c->cfg.commName = c->name;
    }
  }
  comm->pid = comm_self_pid();
  comm->rank = rank;
  comm->nranks = nranks;
  comm->creation = c;
  comm->magic = COMM_MAGIC_CREATING;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  const int err = pthread_create(&thread, &attr, creation_main, comm);
  pthread_attr_destroy(&attr);
  if (err != 0) {
    free(c);
    free(comm);
    return weft_error_set(weftSystemError, "starting a nonblocking creation's thread: %s",
                          strerror(err));
  }
  WEFT_INFO(LOG_INIT, "comm %p rank %d/%d: created without blocking (config blocking = 0)",
            (void *)comm, rank, nranks);
  *comm_out = comm;
  return weftInProgress;
}

weftResult_t comm_create_poll(struct weftComm *comm, weftResult_t *state) {
  pthread_mutex_lock(&creations_lock);
  struct comm_creation *c = comm->creation;
  const weftResult_t res = c == NULL ? weftSuccess : c->done ? c->res : weftInProgress;
  if (c != NULL && c->done && res == weftSuccess) creation_publish(comm);
  /* a failure is the thread's text too (weftGetLastError of a comm that is
   * not live gives it) */
  if (res != weftSuccess && res != weftInProgress) (void)weft_error_set(res, "%s", c->error);
  pthread_mutex_unlock(&creations_lock);
  *state = res;
  return weftSuccess;
}

int comm_create_end(struct weftComm *comm, int abort) {
  pthread_mutex_lock(&creations_lock);
  struct comm_creation *c = comm->creation;
  if (c == NULL) { /* published by a caller racing this one: live */
    pthread_mutex_unlock(&creations_lock);
    return 1;
  }
  if (c->abandoned || (abort && c->ending)) {
    /* another thread's abort took it (the creation's thread frees it), or
     * a destroy waits for it (and frees it) */
    pthread_mutex_unlock(&creations_lock);
    return 0;
  }
  if (abort && !c->done) {
    c->abandoned = 1;
    comm->magic = 0; /* the handle is dead: the thread frees the memory */
    pthread_mutex_unlock(&creations_lock);
    WEFT_INFO(LOG_INIT, "comm %p: aborted while being created; its creation ends in the "
                        "background (at most its timeout)",
              (void *)comm);
    return 0;
  }
  /* the destroy's: no abort takes the creation from it while it waits, and
   * a poll that sees it done may publish it (looked at again on each wake) */
  c->ending = 1;
  while ((c = comm->creation) != NULL && !c->done)
    pthread_cond_wait(&creations_done, &creations_lock);
  if (c == NULL) {
    pthread_mutex_unlock(&creations_lock);
    return 1;
  }
  if (c->res == weftSuccess) {
    creation_publish(comm);
    pthread_mutex_unlock(&creations_lock);
    return 1;
  }
  free(c);
  comm->creation = NULL;
  comm->magic = 0;
  pthread_mutex_unlock(&creations_lock);
  free(comm);
  return 0;
}
