/* The UCX transport's process-wide state and how it moves slots. One UCP
 * context and one worker serve every UCX connection of the process; one
 * thread of the proxy core (../proxy.h) progresses the worker and moves each
 * connection's slots.
 *
 * Each end keeps its FIFO in memory registered with UCX (a ctrl page, then
 * the slots, as shm lays it out). The receiver's proxy keeps a tagged receive
 * posted into every free slot and, once a drained slot's receive is posted
 * again, tells the sender with a credit message (the receiver's head). The
 * sender's proxy sends each filled slot with a plain tagged send as long as
 * the credits allow, and hands the slot back to its rank as soon as UCX no
 * longer needs the buffer and the receiver has room for it: no round trip
 * per slot, and UCX never holds more than the receiver's slots (past the
 * first nslots, each with its receive already posted).
 * Slots go eagerly unless an RDMA device is present (the rendezvous threshold
 * sits one byte past the slot, so bulk transfers still use it): with one,
 * large slots go by UCX's rendezvous, zero-copy from slot to slot. The tag carries the
 * connection's token and the slot's used word; other kinds of tag carry
 * credits, poison and heartbeats.
 *
 * Liveness: each end sends its peer a heartbeat every quarter of WEFT_TIMEOUT
 * and fails the connection once it has heard nothing from the peer (a
 * heartbeat, a slot, a credit) for WEFT_TIMEOUT. The peer's proxy sends them
 * whatever its rank does, so silence means a dead host or a cut link, which
 * UCX's TCP transport learns of only when the kernel gives up on the
 * connection (past a minute here, with data unacknowledged), and UCX's shared-memory
 * transports never.
 *
 * Tagged messages rather than ucp_put_nbx: on transports without registered
 * memory (TCP) UCX 1.13 emulates puts with active messages, whose target-side
 * handler ends the process (ucs_fatal) when the origin dies mid-stream. */
#ifndef WEFT_UCX_PROXY_H
#define WEFT_UCX_PROXY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <ucp/api/ucp.h>

#include "../../include/weft.h"
#include "../base/param.h"
#include "../proxy.h"
#include "../transport.h"
#include "ucx_params.h"


/* Tags: token (30 bits) | kind (2 bits) | the slot's used word (32 bits).
 * A connection's token has 29 random bits; bulk transfers (whole buffers
 * outside the slots, ucx_conn.c) set the 30th and carry their id in place of
 * the used word, so no slot receive ever matches them. */
#define UCX_TAG_TOKEN_SHIFT 34
#define UCX_TOKEN_BITS 29
#define UCX_TOKEN_BULK (1ull << UCX_TOKEN_BITS)
#define UCX_TAG_KIND_SHIFT 32
#define UCX_TAG_MATCH_MASK 0xffffffff00000000ull
enum {
  UCX_TAG_DATA = 0,
  UCX_TAG_POISON_TO_RECEIVER = 1, /* sender to receiver: UCX_CTRL_* in the used word */
  UCX_TAG_POISON_TO_SENDER = 2,   /* receiver to sender: UCX_CTRL_* in the used word */
  UCX_TAG_CREDIT = 3, /* receiver to sender: its head */
};
/* What a POISON_TO_* tag carries in place of the used word. */
enum { UCX_CTRL_POISON = 0, UCX_CTRL_ALIVE = 1, UCX_CTRL_READY = 2 /* set-up done (ucx_conn.c) */ };

static inline uint64_t ucx_tag(uint64_t token, unsigned kind, uint32_t used) {
  return token << UCX_TAG_TOKEN_SHIFT | (uint64_t)kind << UCX_TAG_KIND_SHIFT | used;
}

/* One end of a UCX connection. Set up by ucx_conn.c; while registered, only
 * the proxy thread moves its slots. */
struct ucx_conn {
  struct proxy_conn pc; /* the FIFO, poison, registration (proxy.h) */
  ucp_context_h context;
  ucp_worker_h worker;
  size_t eager_nbytes; /* the worker's (struct ucx_worker) */
  uint64_t token;     /* 29 random bits: ties the blob, the messages and the tags together */
  int oversubscribed_hold; /* taken for a peer on this host (wait_oversubscribed_hold) */
  ucp_mem_h memh;     /* the local FIFO's registration */
  ucp_ep_h ep;        /* to the peer: data (sender), poison (either) */
  ucp_ep_h bulk_ep;   /* to the peer's worker (ucx_bulk_ep: shared); sends: sender only */
  /* owned by the proxy once registered */
  uint64_t posted_step; /* sender: slots sent; receiver: receives posted */
  uint64_t done_step;   /* sender: sends done with the slot; receiver: slots arrived */
  ucs_status_ptr_t reqs[CONN_MAX_SLOTS]; /* per slot, in flight */
  /* credits: the receiver's head, as the sender last heard it / as sent */
  uint64_t credit_step;
  uint64_t credit_buf;          /* the credit message's buffer, either way */
  ucs_status_ptr_t credit_req;  /* sender: the posted receive; receiver: the send */
  ucs_status_ptr_t poison_req; /* the posted receive for the peer's poison or heartbeat */
  uint32_t poison_in;                    /* its buffer */
  uint64_t heard_ns; /* when the peer was last heard from (0: not yet registered) */
  uint64_t beat_ns;  /* when this end's next heartbeat is due */
  ucs_status_t ep_status; /* set by the endpoint's error callback */
  int peer_gone;          /* the peer failed, aborted or cannot be reached */
  int peer_ready;         /* the peer's UCX_CTRL_READY came (set-up order, ucx_conn.c) */
  pid_t peer_pid;         /* the peer's process on this host, or 0 */
  const void *setup_key;  /* while set up: the bootstrap the end belongs to */
  struct ucx_conn *setup_next; /* among the ends still being set up (ucx_conn.c) */
  struct ucx_conn *retired_next; /* among the retired */
  void (*free_fn)(struct ucx_conn *);
};

/* The process's UCX context and worker, made on first use. */
struct ucx_worker {
  ucp_context_h context;
  ucp_worker_h worker;
  /* Messages up to this many bytes go eagerly (RNDV_THRESH set one past
   * it); 0 where UCX keeps its own thresholds, which weft does not know. */
  size_t eager_nbytes;
};

/* Takes a reference on the process's worker, creating it (and the context)
 * on first use, with slots of slot_nbytes going eagerly (ucx_slots_eager).
 * Does not block. */
weftResult_t ucx_worker_get(size_t slot_nbytes, struct ucx_worker **worker_out);
/* Drops a reference; the last one stops the proxy and destroys the worker. */
void ucx_worker_put(void);

/* Converts a UCX status into weft's, with "what: UCX's text" as last error. */
weftResult_t ucx_error(ucs_status_t status, const char *what, ...)
    __attribute__((format(printf, 2, 3)));

/* How a UCX connection's slots move (the proxy core's ops table). */
extern const struct proxy_net_ops ucx_net_ops;

/* Hands conn to the proxy thread (started if none runs). Does not block. */
weftResult_t ucx_proxy_add(struct ucx_conn *conn);

/* Tells the peer that this end's set-up is done (UCX_CTRL_READY: a
 * heartbeat that also sets the peer end's peer_ready). Does not block. */
void ucx_conn_ready(struct ucx_conn *conn);

/* Takes conn back: on return the proxy thread no longer touches it. */
void ucx_proxy_remove(struct ucx_conn *conn);

/* Brackets UCX calls from the ranks' threads (set-up, close): the proxy
 * thread is then between passes. */
void ucx_enter(void);
void ucx_leave(void);

/* Between ucx_enter and ucx_leave: the endpoint for bulk transfers to the
 * worker at address, made on first use and shared by every connection to it
 * until the worker goes. It has no peer failure handling: with it, UCX 1.13
 * moves large messages over TCP in 64 KiB active messages, copied on both
 * ends, rather than by zero-copy rendezvous (a third of the throughput on
 * loopback). A peer's death shows on the connection's own endpoint, its
 * pid, or the timeout instead. */
weftResult_t ucx_bulk_ep(const void *address, size_t address_nbytes, ucp_ep_h *ep_out);

/* Progresses the worker once from the calling thread. */
void ucx_worker_progress_once(void);

/* A rank's thread takes over the proxy's work from ucx_drive_begin until
 * ucx_drive_end (a bulk call), with a ucx_drive_pass at a time; the proxy
 * thread waits meanwhile. Two threads on one core taking turns at the worker
 * (and its lock) cost more than either one alone. Calls nest across threads. */
void ucx_drive_begin(void);
void ucx_drive_pass(void);
void ucx_drive_end(void);

/* Fails conn (poison both ways, as a dead peer would) and force-closes its
 * endpoint, so that UCX ends every transfer on it; waits a bounded time for
 * the close. A bulk transfer given up on (error, abort, timeout) takes the
 * connection with it. Bulk sends go over the worker's bulk endpoint, which
 * cannot be force-closed (ucx_bulk_ep): one still waiting for its peer's
 * rendezvous answer stays with UCX. */
void ucx_conn_kill(struct ucx_conn *conn, const char *why);

/* Keeps a closed end whose requests are still in flight (UCX may yet write
 * into or read from its FIFO) until they complete or the worker goes; then
 * free_fn releases it. */
void ucx_retire(struct ucx_conn *conn, void (*free_fn)(struct ucx_conn *));

#endif
