/* Bootstrap: rendezvous through a root, then a ring of sockets that gives
 * out-of-band allgather and barrier to the layers above (transport set-up,
 * communicator init). Every call is bounded by the timeout it was given. */
#ifndef WEFT_BOOTSTRAP_H
#define WEFT_BOOTSTRAP_H

#include <assert.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../include/weft.h"
#include "../base/peer_info.h"
#include "../base/param_load.h"
#include "../base/sock.h"

/* The bootstrap's settings (WEFT_HOSTID), and the launcher variables of
 * weft's own that weftCommInitFromEnv reads (launcher_env.c). */
extern struct weft_param bootstrap_params[];
extern struct weft_param launcher_params[];

#define BOOTSTRAP_SECRET_BYTES 32

/* What a weftUniqueId holds. */
/* The root of an id made at a fixed address (environment mode, NCCL_COMM_ID)
 * may start after the ranks: they retry a refused connection until the
 * timeout. Without the flag the root was up before the id existed, so a
 * refused connection means the process that made it has gone. */
#define BOOTSTRAP_ID_ROOT_LATE 1u

struct bootstrap_id {
  uint32_t magic;
  uint32_t flags; /* BOOTSTRAP_ID_* */
  union weft_sockaddr root;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
};
static_assert(sizeof(struct bootstrap_id) <= WEFT_UNIQUE_ID_BYTES, "bootstrap id too large");


struct bootstrap;

/* Makes an id with a fresh secret and starts its root service on this host,
 * on the interface sock_local_addr chooses (WEFT_SOCKET_IFNAME, transport/base/sock.h). */
weftResult_t bootstrap_id_create(struct bootstrap_id *id_out);

/* The same, with the root listening on bind_addr (port 0 picks one). */
weftResult_t bootstrap_id_create_at(const union weft_sockaddr *bind_addr,
                                    struct bootstrap_id *id_out);
/* The same on loopback: for jobs whose ranks all live in this process. */
weftResult_t bootstrap_id_create_local(struct bootstrap_id *id_out);
/* The same on the interface bs listens on: for jobs made of bs's ranks. */
weftResult_t bootstrap_id_create_like(const struct bootstrap *bs, struct bootstrap_id *id_out);

/* Starts a root service for id->secret listening on bind_addr (port 0 picks
 * one); writes the bound address. The service runs in a detached thread that
 * ends once all ranks have joined, or after the timeout. */
weftResult_t bootstrap_root_start(const union weft_sockaddr *bind_addr,
                                  const uint8_t secret[BOOTSTRAP_SECRET_BYTES],
                                  union weft_sockaddr *bound_out);

/* Tells the root service of id, which this process serves, that process
 * pid of this host is to join as rank: should it end before it joins, the
 * ranks waiting for the rendezvous fail at once, naming it, instead of at
 * their timeout. weftInvalidArgument where no root of this process has id's
 * secret (never served here, or ended). */
weftResult_t bootstrap_root_watch(const struct bootstrap_id *id, int rank, pid_t pid);

/* Fills the parts of peer info that bootstrap knows: pid, host identity. */
void bootstrap_peer_info_local(struct peer_info *info);

/* A rank's presence while it joins: from its first step of set-up to its
 * last, a marker other processes of the host can see, so
 * that the root learns within a serving slice that a rank of this host died
 * before it joined (instead of waiting out the timeout). Best effort: without
 * /dev/shm nothing is marked. */
struct bootstrap_presence {
  char name[64];
};
void bootstrap_presence_begin(const struct bootstrap_id *id, int rank,
                              struct bootstrap_presence *p);
/* Removes the marker; a set-up that failed also unlinks what ranks that died
 * on this host left behind (their markers and segments). */
void bootstrap_presence_end(struct bootstrap_presence *p, int failed);

/* Removes what ranks of this host that died left in shared memory (their
 * segments and presence markers). A communicator that failed calls it as it
 * closes: a rank killed after its peers finished joining leaves its marker,
 * and only a survivor is there to see it. */
void bootstrap_sweep_dead(void);

/* Joins: proves the secret to the root, exchanges peer info, builds the ring.
 * peers_out has nranks entries. Blocks until done or timeout_ns passes. */
weftResult_t bootstrap_init(const struct bootstrap_id *id, int rank, int nranks,
                            const struct peer_info *self, uint64_t timeout_ns,
                            struct bootstrap **bs_out, struct peer_info *peers_out);

/* data has nranks blocks of nbytes; this rank's block is filled in, the others
 * are filled on return. */
weftResult_t bootstrap_allgather(struct bootstrap *bs, void *data, size_t nbytes);
weftResult_t bootstrap_barrier(struct bootstrap *bs);
/* Point-to-point messages of up to 64 KiB between two ranks, matched by
 * (sender, tag) in order. send does not wait for the receiver to ask. */
weftResult_t bootstrap_send(struct bootstrap *bs, int peer, uint32_t tag, const void *data,
                            size_t nbytes);
weftResult_t bootstrap_recv(struct bootstrap *bs, int peer, uint32_t tag, void *data,
                            size_t nbytes);
/* As bootstrap_recv, without waiting for the peer: takes what has arrived
 * (looking at the listener for at most a millisecond), or returns
 * weftInProgress. */
weftResult_t bootstrap_try_recv(struct bootstrap *bs, int peer, uint32_t tag, void *data,
                                size_t nbytes);
void bootstrap_close(struct bootstrap *bs);

/* Questions a rank answers on a thread of its own (query.c), whatever its
 * other threads do: the layer above asks every peer where it is when a wait
 * stalls. An answer is at most QUERY_ANSWER_MAX_NBYTES. */
#define QUERY_ANSWER_MAX_NBYTES 1024
/* Writes this rank's answer (at most cap bytes) into reply and returns its
 * length; runs on the query thread, so it must not block. */
typedef size_t (*bootstrap_answer_fn)(void *arg, void *reply, size_t cap);
/* Makes fn (NULL: none; the empty answer) what this rank answers with;
 * returns once an answer in progress is done, so arg may be freed after a
 * call with NULL. */
void bootstrap_answer_set(struct bootstrap *bs, bootstrap_answer_fn fn, void *arg);
enum bootstrap_ask_outcome {
  BOOTSTRAP_ASK_ANSWERED, /* the answer is in */
  BOOTSTRAP_ASK_GONE,     /* nothing listens: its process ended (or its comm was destroyed) */
  BOOTSTRAP_ASK_SILENT,   /* no answer within the time: a host or a network in trouble */
  BOOTSTRAP_ASK_UNASKED,  /* this rank could not ask (out of descriptors, no local address):
                             says nothing about the peer */
};
/* Asks every other rank at once: replies holds nranks blocks of nbytes, rank
 * r's answer lands in block r (got[r] bytes of it), outcome[r] says how it
 * went (this rank's own entry: SILENT, untouched). GONE only where the
 * peer's listener refused the question, or its pid (on this host) is gone.
 * Where some rank went UNASKED, why (why_nbytes, may be 0) says what failed
 * here, else it is made empty. Blocks for timeout_ns at most. Any thread;
 * not against bootstrap_close. */
void bootstrap_ask_all(struct bootstrap *bs, uint64_t timeout_ns, void *replies, size_t nbytes,
                       size_t *got, enum bootstrap_ask_outcome *outcome, char *why,
                       size_t why_nbytes);
/* Keeps answering, before a bootstrap of a failed job closes, until every
 * other rank whose process lives has asked since bootstrap_poison told it
 * of the failure (without one: within the last recent_ns), or for max_ns: ranks that fail a little later than this one still learn
 * where it was, instead of finding it gone. */
void bootstrap_query_linger(struct bootstrap *bs, uint64_t recent_ns, uint64_t max_ns);
/* Tells every other rank, best effort and briefly, that this one will ask
 * no more questions (its communicator closes): their lingers stop waiting
 * for it. Before this rank's own linger, so that ranks that close together
 * do not each wait out the other's. */
void bootstrap_query_bye(struct bootstrap *bs);
/* A number that names this run of the job (the same on every rank of it,
 * different between jobs and between runs of one job at a fixed rendezvous,
 * whose secret is the same: it hashes the ranks' processes too), and does not
 * reveal its secret. */
uint64_t bootstrap_job_hash(const struct bootstrap *bs);
/* Rank's process id where it shares this host, else 0. */
pid_t bootstrap_peer_pid(const struct bootstrap *bs, int rank);
/* The timeout of the waits that begin after the call. Thread-safe. */
void bootstrap_timeout_set(struct bootstrap *bs, uint64_t timeout_ns);
/* Tells every other rank, once and best effort (a quarter second per rank at
 * most), that this rank failed: their bootstrap waits on it (messages,
 * allgathers) end at once with an error instead of at the timeout. Safe
 * from any thread. */
void bootstrap_poison(struct bootstrap *bs);

/* Ends the failures told so far: every rank calls it once its operations
 * are over (a revoke), after which failure messages sent before any rank's
 * call are ignored and this rank may tell of a new failure. Not thread-safe
 * against the bootstrap's other calls. */
void bootstrap_revoke(struct bootstrap *bs);
/* Point-to-point waits end early when *abort becomes non-zero. */
void bootstrap_set_abort(struct bootstrap *bs, const volatile uint32_t *abort);
/* Where this rank's bootstrap listener is: other listeners of the job bind
 * the same interface. */
const union weft_sockaddr *bootstrap_listen_addr(const struct bootstrap *bs);

/* The job described by a launcher's environment (see weftCommInitFromEnv). */
struct bootstrap_env {
  int found; /* 0: no launcher variables; a 1-rank job */
  int rank;
  int nranks;
  int serve_root; /* this rank must start the root service on id.root */
  int use_store;  /* torchrun: the id travels through its store at store_addr */
  union weft_sockaddr store_addr;
  const char *source; /* "weft", "torchrun", "openmpi", "slurm" */
  struct bootstrap_id id;
};
weftResult_t bootstrap_env_read(struct bootstrap_env *env_out);
/* Completes env's id: a loopback root for a job of one; under torchrun, an id
 * made by rank 0 (random secret, root on a port of its own) and handed to
 * the others through torchrun's store, whose port MASTER_PORT is; else the
 * root service on rank 0 (on the rendezvous address's interface). */
weftResult_t bootstrap_env_rendezvous(struct bootstrap_env *env);

/* The id of a rendezvous at a fixed "host:port" (NCCL_COMM_ID; `what` names
 * the variable in errors): the same on every process that computes it, with
 * a secret from WEFT_SECRET, the launcher's job identity and the address. No root
 * service is started: one rank starts it with bootstrap_root_start. */
weftResult_t bootstrap_id_from_hostport(const char *hostport, const char *what,
                                        struct bootstrap_id *id_out);

/* Hex form of a unique id (2*WEFT_UNIQUE_ID_BYTES chars + NUL). */
weftResult_t bootstrap_id_from_hex(const char *hex, struct bootstrap_id *id_out);

#endif
