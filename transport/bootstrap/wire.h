/* The bootstrap's own: what its ranks and its root send each other, the
 * state of a rank's bootstrap, and the helpers its files share (root.c: the
 * root service; ring.c: joining and the ring's exchanges; listener.c: what
 * arrives at a rank's listener; msg.c: messages between two ranks and
 * failure notices; host.c: host identity and presence). Nothing outside
 * transport/bootstrap/ includes it. */
#ifndef WEFT_BOOTSTRAP_WIRE_H
#define WEFT_BOOTSTRAP_WIRE_H

#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "../base/sock.h"
#include "../base/wait.h"
#include "bootstrap.h"

#define BOOTSTRAP_MAGIC 0x77667462u /* "wftb" */
#define BOOTSTRAP_VERSION 4u
/* A connection must say its hello within this (and within the job's
 * timeout); unproven connections are served together, so a silent one
 * delays no one, it only holds a place until then. */
#define HELLO_TIMEOUT_NS 5000000000ull
#define SERVE_SLICE_NS 100000000ull /* how often the root looks at joined ranks */
#define ROOT_MAX_RANKS (1 << 20)       /* the root's tables grow with what a hello claims */

/* The hello deadline for a job whose waits last timeout_ns: a quarter of it
 * when that is shorter than HELLO_TIMEOUT_NS (a legitimate hello is sent
 * right after the connect), but not under 100 ms. */
static inline uint64_t hello_timeout(uint64_t timeout_ns) {
  uint64_t t = timeout_ns / 4;
  if (t > HELLO_TIMEOUT_NS) t = HELLO_TIMEOUT_NS;
  return t < 100000000ull ? 100000000ull : t;
}


/* The root's answer to a hello whose secret is right. A hello with a wrong
 * secret gets no answer at all: the root closes the connection. */
enum root_reply { ROOT_OK = 0, ROOT_BAD_NRANKS = 2, ROOT_BAD_RANK, ROOT_DUP_RANK };
/* What the root sends every joined rank at the end: the peer table follows
 * ROOT_ALL_JOINED; ROOT_RANK_LEFT is followed by the rank (int32) whose
 * connection closed before every rank joined; ROOT_GAVE_UP: the timeout,
 * followed by struct root_missing;
 * ROOT_OUT_OF_FDS: the root's process cannot hold a connection per rank,
 * followed by struct root_fds; ROOT_RANK_REFUSED: a process of the job (it
 * had the secret) was refused, followed by struct root_refusal. */
enum root_outcome {
  ROOT_ALL_JOINED = 0x6a6f696e,
  ROOT_RANK_LEFT,
  ROOT_GAVE_UP,
  ROOT_OUT_OF_FDS,
  ROOT_RANK_REFUSED
};

/* A refusal the root tells the other ranks of: its reason (enum
 * root_reply) and the rank and size the refused hello claimed. */
struct root_refusal {
  uint32_t code; /* 0: none yet */
  int32_t rank;
  int32_t nranks;
};

/* The ranks that had not joined when the root gave up: how many had, and
 * the first ROOT_MISSING_NAMED of the nmissing others. */
#define ROOT_MISSING_NAMED 16
/* How often a rank waiting for its previous rank's ring connection checks
 * that something still listens at that rank's address. */
#define RING_PROBE_NS 1000000000ull
/* How long a rank whose ring broke asks the others where they are. */
#define RING_ASK_NS 500000000ull
/* How long past its own deadline a joined rank waits for the root's verdict. */
#define ROOT_VERDICT_GRACE_NS 1000000000ull
struct root_missing {
  uint32_t joined;
  uint32_t nmissing;
  int32_t ranks[ROOT_MISSING_NAMED];
};

/* The root's descriptors when they are short: how many the job needs in its
 * process, and its RLIMIT_NOFILE (UINT32_MAX: unlimited). */
struct root_fds {
  uint32_t need;
  uint32_t soft;
  uint32_t hard;
};

struct hello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  int32_t rank;
  int32_t nranks;
  struct peer_info info;
};

struct ring_hello {
  uint32_t magic;
  int32_t rank;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
};

/* A point-to-point message that arrived before anyone asked for it. */
struct bs_msg {
  struct bs_msg *next;
  int32_t from;
  uint32_t tag;
  uint32_t nbytes;
  char data[];
};

struct msg_header {
  uint32_t magic;
  int32_t from;
  uint32_t tag;
  uint32_t nbytes;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
};

#define MSG_MAX_NBYTES 65536
#define MSG_TAG_FAILED 0xfa11ed00u /* "this rank failed": ends the receiver's waits on it */
#define MSG_MAGIC 0x77667470u /* "wftp": never mistaken for a ring hello */

static_assert(sizeof(struct hello) <= SOCK_HELLO_MAX_NBYTES, "hello fits a pending buffer");
static_assert(sizeof(struct msg_header) <= SOCK_HELLO_MAX_NBYTES, "header fits");

struct bootstrap {
  int rank;
  int nranks;
  int fd_next;
  int fd_prev;
  int listen_fd;                  /* stays open for point-to-point messages */
  union weft_sockaddr *addrs;     /* every rank's listener */
  pid_t *pids;                    /* every rank's pid where it shares this host, else 0 */
  struct sock_hellos hellos;      /* connections to listen_fd not proven yet */
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  uint64_t job_hash;              /* bootstrap_job_hash: the secret and every rank's process */
  struct bs_msg *unexpected;
  const volatile uint32_t *abort; /* the owner's abort flag, or NULL */
  uint32_t poisoned;              /* bootstrap_poison ran (in this epoch) */
  uint32_t epoch;                 /* bootstrap_revoke calls so far: failures of older ones
                                     are over */
  uint64_t timeout_ns;
  /* query.c: the query listener and the thread that answers on it */
  int query_fd;
  int query_stop[2];              /* a byte written ends the thread */
  int query_running;
  pthread_t query_tid;
  union weft_sockaddr *query_addrs; /* every rank's query listener */
  uint64_t *asked_ns;             /* when each rank asked last (clock_ns), 0: never */
  uint64_t failed_ns;             /* when bootstrap_poison told the peers, 0: never */
  pthread_mutex_t answer_mutex;   /* held while answer_fn runs and while it changes */
  bootstrap_answer_fn answer_fn;
  void *answer_arg;
};

static inline int secret_equal(const uint8_t *a, const uint8_t *b) {
  uint8_t diff = 0; /* constant time */
  for (int i = 0; i < BOOTSTRAP_SECRET_BYTES; i++) diff |= (uint8_t)(a[i] ^ b[i]);
  return diff == 0;
}

/* host.c: FNV-1a over n bytes, continuing from h. */
uint64_t bootstrap_hash_bytes(uint64_t h, const void *data, size_t n);
/* host.c: the name of rank's presence marker in the job of this secret. */
uint32_t bootstrap_presence_key(const uint8_t secret[BOOTSTRAP_SECRET_BYTES], int rank);

/* listener.c: serves the listener until one thing arrives: a message (queued)
 * or, when ring_fd_out is not NULL, the ring connection from rank
 * ring_prev. weftInProgress when `until` passes first or a stranger was
 * dropped. */
weftResult_t bootstrap_listener_serve(struct bootstrap *bs, uint64_t until,
                                      struct weft_wait *watch, int ring_prev, int *ring_fd_out);
/* listener.c: the first rank (peer, or any when peer < 0) that said it failed,
 * or -1. Only while this rank has not failed itself: after that the ranks
 * are recovering (a shrink), and what they send then is new. */
int bootstrap_msg_failed_rank(const struct bootstrap *bs, int peer);
/* listener.c: a watch on rank peer for a wait of timeout_ns: its pid when it
 * shares the host, and the owner's abort flag. */
void bootstrap_watch(const struct bootstrap *bs, int peer, uint64_t timeout_ns,
                     const char *what, struct weft_wait *w);

/* query.c: a bootstrap's query state before anything can fail (calloc'd
 * bs); its listener (on the interface addr names, port 0); the thread once
 * the ranks joined; the thread stopped and everything closed (any state). */
void bootstrap_query_init(struct bootstrap *bs);
weftResult_t bootstrap_query_start(struct bootstrap *bs);
void bootstrap_query_stop(struct bootstrap *bs);

#endif
