/* What weft's communicator does not keep itself for the NCCL API (an
 * unconsumed grow id): a small table keyed by communicator. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_shim.h"

struct comm_state {
  ncclComm_t comm;
  int closing; /* its comm is being freed: only nccl_comm_close_end sees it */
  int grow_id_pending; /* grow_id was made and no grow has consumed it */
  ncclUniqueId grow_id;
};

static pthread_mutex_t states_lock = PTHREAD_MUTEX_INITIALIZER;
static struct comm_state *states;
static int nstates, states_cap;

/* comm's entry, made when create is set (NULL when out of memory). Called
 * with states_lock held. */
static struct comm_state *state_find(ncclComm_t comm, int create) {
  for (int i = 0; i < nstates; i++)
    if (states[i].comm == comm && !states[i].closing) return &states[i];
  if (!create) return NULL;
  if (nstates == states_cap) {
    int cap = states_cap ? 2 * states_cap : 8;
    struct comm_state *s = realloc(states, (size_t)cap * sizeof *s);
    if (s == NULL) return NULL;
    states = s;
    states_cap = cap;
  }
  struct comm_state *s = &states[nstates++];
  memset(s, 0, sizeof *s);
  s->comm = comm;
  return s;
}

void nccl_comm_close_begin(ncclComm_t comm) {
  pthread_mutex_lock(&states_lock);
  struct comm_state *s = state_find(comm, 0);
  if (s != NULL) s->closing = 1;
  pthread_mutex_unlock(&states_lock);
}

void nccl_comm_close_end(ncclComm_t comm, int freed) {
  pthread_mutex_lock(&states_lock);
  for (int i = 0; i < nstates; i++) {
    struct comm_state *s = &states[i];
    if (s->comm != comm || !s->closing) continue;
    if (freed) {
      *s = states[--nstates];
    } else if (state_find(comm, 0) == NULL) { /* back as it was */
      s->closing = 0;
    } else { /* marked meanwhile (a caller's race): the newer entry stays */
      *s = states[--nstates];
    }
    break;
  }
  pthread_mutex_unlock(&states_lock);
}

weftResult_t nccl_comm_grow_id_make(ncclComm_t comm, ncclUniqueId *uniqueId) {
  weftResult_t res;
  pthread_mutex_lock(&states_lock);
  struct comm_state *s = state_find(comm, 1);
  if (s == NULL) {
    res = weft_error_set(weftSystemError, "ncclCommGetUniqueId: out of memory");
  } else if (s->grow_id_pending) {
    res = weft_error_set(weftInvalidUsage,
                         "ncclCommGetUniqueId: the previous id has not been used by ncclCommGrow");
  } else {
    weftUniqueId id;
    res = weftGetUniqueId(&id);
    if (res == weftSuccess) {
      memcpy(&s->grow_id, &id, sizeof id);
      s->grow_id_pending = 1;
      *uniqueId = s->grow_id;
    }
  }
  pthread_mutex_unlock(&states_lock);
  return res;
}

int nccl_comm_grow_id_consume(ncclComm_t comm, const ncclUniqueId *uniqueId) {
  pthread_mutex_lock(&states_lock);
  struct comm_state *s = state_find(comm, 0);
  int ours = s != NULL && s->grow_id_pending &&
             memcmp(&s->grow_id, uniqueId, sizeof *uniqueId) == 0;
  if (ours) s->grow_id_pending = 0;
  pthread_mutex_unlock(&states_lock);
  return ours;
}
