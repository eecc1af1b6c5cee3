/* The proxy core of the network transports (socket, ucx). Each end of a
 * network connection keeps its FIFO in private memory, laid out as shm lays
 * it out (a ctrl page, then the slots); a proxy thread moves filled slots
 * from the sender's FIFO to the receiver's over the network and hands the
 * credits back. This core owns what every network shares:
 *
 *   - the private FIFO (proxy_fifo_alloc) and the slot/credit accessors;
 *   - poison and liveness: proxy_conn_fail poisons the local rank and lets
 *     the network tell the peer; a local abort is noticed every pass;
 *   - the thread: its spin-then-sleep loop (ppoll on the network's file
 *     descriptors and a wake eventfd), CPU binding, signal mask and name;
 *   - add/remove of connection ends, a pool of threads to spread them on,
 *     and the hand-over of passes to a rank's thread (proxy_drive_*).
 *
 * A network supplies a struct proxy_net_ops: how one end's slots move
 * (progress), how a failure reaches the peer (notify_fail), and optionally a
 * per-pass hook and the descriptors to sleep on. A third network is one file
 * with one such table.
 *
 * Locking: a proxy's mutex is held through each of its passes, so a rank's
 * thread holding it (proxy_lock) sees the proxy between passes; the thread
 * gives way at once to such waiters. */
#ifndef WEFT_PROXY_H
#define WEFT_PROXY_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/weft.h"
#include "transport.h"

#define PROXY_CTRL_NBYTES 4096 /* the slots start on their own page */
#define PROXY_MAX_THREADS 16

/* A slot holds at most 64 MiB (2^26 bytes), so the low 27 bits of
 * slot_used_nbytes are its byte count; the bits above are flags of the
 * algorithms (p2p marks a message's last slot), carried unchanged. */
#define PROXY_USED_NBYTES_MASK 0x07ffffffu

struct proxy;
struct proxy_conn;

/* Where a FIFO lives when not in private pages: memory a device reaches as
 * well (pinned and mapped: net_dev.h). The ctrl page then doubles as the
 * kernels' struct dev_fifo_ctrl (tail at byte 0, head at byte 64, as in
 * struct conn_ctrl), and the kernels record each slot's used bytes in its
 * slot_used_nbytes as the host's prims do. */
struct proxy_fifo_mem {
  const char *name;
  /* nbytes of zeroed memory, page-aligned: its address here and the
   * device's (the same where the device is emulated) */
  weftResult_t (*alloc)(size_t nbytes, void **host_out, void **dev_out);
  void (*free)(void *host, size_t nbytes);
  /* Makes nbytes of existing page-aligned host memory (shared with another
   * process) reachable by the device: its device address (the same where
   * the device is emulated). unmap undoes it. */
  weftResult_t (*map)(void *host, size_t nbytes, void **dev_out);
  void (*unmap)(void *host);
};

/* What a network adds to the core. Every function runs on the proxy thread
 * (or a driving rank's thread) under the proxy's mutex. */
struct proxy_net_ops {
  const char *name;      /* "socket": logs, and the thread's name "weft-<name>-<i>" */
  uint64_t sleep_min_ns; /* the first sleep once idle; later ones grow ... */
  uint64_t sleep_max_ns; /* ... up to this */
  int linger;            /* 1: the thread runs until proxy_stop, even with no connection */
  /* 1: where the rank is pinned to one CPU, its proxy may run on any CPU of
   * the process; 0: it shares the rank's (a rank that waits by driving the
   * proxy's passes itself, as UCX's bulk calls do, and weftrun's binding of
   * UCX ranks to a core each, keep the pair on one core) until the proxy
   * serves a device's FIFOs, which no rank's thread drives */
  int unpin;
  /* Moves what it can of c's slots, publishing credits and arrivals with
   * proxy_conn_publish_*; checks the peer's liveness and calls
   * proxy_conn_fail when the connection breaks. Does not block. Returns
   * whether anything happened. */
  int (*progress)(struct proxy_conn *c);
  /* Tells the peer (best effort) that c failed: called once, from
   * proxy_conn_fail, after the local poison is set. */
  void (*notify_fail)(struct proxy_conn *c);
  /* Optional: work of the whole network once per pass (progressing a
   * shared worker). Returns whether anything happened. */
  int (*pass)(struct proxy *p);
  /* Optional: fills the c->npoll descriptors the thread sleeps on for c (fd
   * -1: none now), and handles what ppoll returned for them. */
  void (*poll_fill)(struct proxy_conn *c, struct pollfd *pfds);
  void (*poll_event)(struct proxy_conn *c, int index, const struct pollfd *pfd);
};

/* The part of a connection end that the core owns; each network embeds it
 * (as its member pc) and fills the set-up fields. */
struct proxy_conn {
  const struct proxy_net_ops *ops;
  int is_send;
  int peer_rank;
  int npoll; /* descriptors poll_fill fills */
  /* the private FIFO (proxy_fifo_alloc) */
  struct conn_ctrl *ctrl;
  char *slots;
  uint32_t nslots;
  size_t slot_nbytes;
  void *fifo;
  size_t fifo_nbytes;
  const struct proxy_fifo_mem *mem; /* NULL: private pages */
  void *fifo_dev;   /* the FIFO's device address (mem only) */
  /* the tail (sender) or head (receiver) the rank is known to reach
   * (proxy_conn_expect: device kernels launched, which fill and drain slots
   * without telling anyone); the thread does not sleep while the counter
   * lags it, for up to PROXY_EXPECT_MAX_NS after the last announcement */
  uint64_t expect;
  uint64_t expect_ns;
  /* owned by the proxy while registered */
  uint64_t sent_step; /* sender: slots the network no longer needs (proxy_conn_drain) */
  int failed;         /* poison set, peer told */
  struct proxy *proxy; /* set while registered */
  struct proxy_conn *next;
};

/* One proxy thread and the connection ends it moves. */
struct proxy {
  const struct proxy_net_ops *ops;
  int index;
  pthread_mutex_t mutex; /* held through every pass; guards what follows */
  pthread_cond_t undriven;
  int running;
  int stop;
  pthread_t tid;
  int wake_fd; /* an eventfd: interrupts the thread's sleep */
  int nconns;
  int device_conns;   /* of them, FIFOs a device fills (proxy_fifo_mem): the thread
                         leaves its rank's one CPU (proxy_net_ops.unpin) */
  int drivers;        /* ranks' threads making the passes (proxy_drive_begin) */
  uint32_t waiters;   /* threads waiting for the mutex: the thread lets them in */
  uint64_t gen;       /* bumped at each removal: stale poll results are dropped */
  uint64_t busy_until_ns; /* no sleep before this (proxy_kick) */
  uint32_t sleeping;      /* in ppoll, or about to be */
  uint64_t sleeps;        /* times the thread went to sleep (read by tests) */
  struct proxy_conn *conns;
  /* the thread's poll set */
  struct pollfd *pfds;
  struct proxy_conn **pfd_conns;
  int *pfd_index;
  int pfds_cap;
};

#define PROXY_INITIALIZER(ops_)                                                              \
  {.ops = (ops_), .mutex = PTHREAD_MUTEX_INITIALIZER, .undriven = PTHREAD_COND_INITIALIZER, \
   .wake_fd = -1}

/* Threads of one network among which connections are spread (least loaded
 * first); a thread starts with its first connection and stops with its
 * last. */
struct proxy_pool {
  const struct proxy_net_ops *ops;
  pthread_mutex_t mutex;
  struct proxy threads[PROXY_MAX_THREADS];
};

#define PROXY_POOL_INITIALIZER(ops_) {.ops = (ops_), .mutex = PTHREAD_MUTEX_INITIALIZER}

/* --- the FIFO ----------------------------------------------------------- */

/* Allocates c's FIFO (ctrl page, then nslots slots of slot_nbytes): zeroed,
 * page-aligned; in private pages on the rank's NUMA node, or from mem
 * (non-NULL: a device FIFO). */
weftResult_t proxy_fifo_alloc(struct proxy_conn *c, uint32_t nslots, size_t slot_nbytes,
                              const struct proxy_fifo_mem *mem);
void proxy_fifo_free(struct proxy_conn *c);

static inline char *proxy_slot(const struct proxy_conn *c, uint64_t step) {
  return c->slots + (size_t)slot_index(step, c->nslots) * c->slot_nbytes;
}

/* Sender: the slots the rank has filled. */
static inline uint64_t proxy_conn_tail(const struct proxy_conn *c) {
  return __atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE);
}

/* Receiver: the slots the rank has drained. */
static inline uint64_t proxy_conn_head(const struct proxy_conn *c) {
  return __atomic_load_n(&c->ctrl->head, __ATOMIC_ACQUIRE);
}

/* Sender: the used word of the filled slot `step`, in *used_out. Returns -1
 * (the connection failed) when it claims more bytes than a slot holds. */
int proxy_conn_slot_used(struct proxy_conn *c, uint64_t step, uint32_t *used_out);

/* Receiver: records the used word of the slot `step` that arrived. */
static inline void proxy_conn_slot_set_used(struct proxy_conn *c, uint64_t step, uint32_t used) {
  c->ctrl->slot_used_nbytes[slot_index(step, c->nslots)] = used;
}

/* Sender: the rank may fill slots up to head + nslots (the credits). Receiver:
 * the slots before tail arrived. Each returns whether the counter moved. */
int proxy_conn_publish_head(struct proxy_conn *c, uint64_t head);
int proxy_conn_publish_tail(struct proxy_conn *c, uint64_t tail);

/* Sender: the network no longer needs the slots before step. */
static inline void proxy_conn_publish_sent(struct proxy_conn *c, uint64_t step) {
  __atomic_store_n(&c->sent_step, step, __ATOMIC_RELEASE);
}

/* --- poison and liveness ------------------------------------------------ */

/* Marks c failed: poison for the local rank, then the network's notice to
 * the peer; logs why (detail: the system's or the network's words, or
 * NULL). Later calls do nothing. */
void proxy_conn_fail(struct proxy_conn *c, const char *why, const char *detail);

/* Sender, closing: waits until the network has taken every filled slot (or
 * the connection failed, or the timeout passed), so the last slots reach the
 * peer after this end is gone. */
void proxy_conn_drain(struct proxy_conn *c);

/* --- threads and registration ------------------------------------------- */

/* Starts p's thread (p as from PROXY_INITIALIZER, or stopped). Under p's
 * mutex once other threads can see p. */
weftResult_t proxy_start(struct proxy *p, int index);

/* Stops p's thread and waits for it. Not under p's mutex. */
void proxy_stop(struct proxy *p);

/* After fork(): forgets the parent's thread and connections (the child has
 * neither), keeping the mutex usable. */
void proxy_forget(struct proxy *p);

/* Hands c to p (whose thread runs). Under p's mutex. Does not block. */
void proxy_add_locked(struct proxy *p, struct proxy_conn *c);

/* Takes c back after one last pass over it: on return no proxy touches it.
 * Under p's mutex. */
void proxy_remove_locked(struct proxy_conn *c);

/* The pool: hands c to the least loaded of the first nthreads threads,
 * starting it if needed; and takes it back, stopping a thread left with no
 * connection. Neither blocks for long (one pass of the thread). */
weftResult_t proxy_pool_add(struct proxy_pool *pool, struct proxy_conn *c, int nthreads);
void proxy_pool_remove(struct proxy_pool *pool, struct proxy_conn *c);

/* p's mutex, taken ahead of the thread's next pass. */
void proxy_lock(struct proxy *p);
void proxy_unlock(struct proxy *p);

/* Under p's mutex: one pass over p's network and connections. Returns
 * whether anything happened. */
int proxy_pass(struct proxy *p);

/* A rank's thread makes p's passes from proxy_drive_begin until
 * proxy_drive_end (a pass at a time, proxy_drive_pass); p's thread waits
 * meanwhile. Two threads on one core taking turns cost more than either
 * alone. Calls nest across threads. */
void proxy_drive_begin(struct proxy *p);
void proxy_drive_end(struct proxy *p);

/* Keeps p's thread polling, not sleeping, for the next for_ns, and wakes it
 * if it sleeps: a rank begins an operation (host ranks post slots in
 * memory, which wakes nothing), or a GPU kernel is about to fill slots in
 * mapped memory. Cheap to repeat: a system call only to wake a sleeping
 * thread, and nothing at all while the thread is kept busy for at least half
 * of for_ns already. */
void proxy_kick(struct proxy *p, uint64_t for_ns);
void proxy_kick_at(struct proxy *p, uint64_t now_ns, uint64_t for_ns);

/* The network transports' kick (struct weft_transport): conn->priv begins
 * with its struct proxy_conn; the thread polls for WEFT_PROXY_KICK_US
 * (100 us, as after any work), which covers a small operation, while a
 * longer one keeps it busy moving slots. */
struct weft_conn;
void proxy_conn_kick(const struct weft_conn *conn, uint64_t now_ns);
/* The same for for_ns (a device launch's longer window, net_dev.c). */
void proxy_conn_kick_for(const struct weft_conn *conn, uint64_t now_ns, uint64_t for_ns);

/* An end whose slots the proxy cannot see coming (a device kernel fills or
 * drains them in mapped memory, and nothing wakes a sleeping thread): the
 * rank will fill (sender: tail) or drain (receiver: head) nslots more. The
 * thread polls without sleeping until the counter reaches the announced
 * value, however late the kernel runs, unless the connection is poisoned or
 * PROXY_EXPECT_MAX_NS pass without a new announcement. The count starts
 * from the counter as it is when above what was announced (slots nobody
 * announced: a graph's replays), so an announcement never asks for more
 * than the rank will do. conn->priv begins with a struct proxy_conn. */
#define PROXY_EXPECT_MAX_NS 60000000000ull
void proxy_conn_expect(const struct weft_conn *conn, uint64_t nslots, uint64_t now_ns);

#endif
