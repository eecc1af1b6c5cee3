/* The UCX transport's process-wide state and progress thread. One UCP
 * context and one worker serve every UCX connection of the process; a proxy
 * thread progresses the worker and moves each connection's slots.
 *
 * Each end keeps its FIFO in memory registered with UCX (a ctrl page, then
 * the slots, as shm lays it out). The sender's proxy copies filled slots
 * with ucp_put_nbx straight from its FIFO into the receiver's (zero-copy where
 * the transport allows), flushes the endpoint, then puts the new tail: so
 * the receiver never sees a tail before the data behind it. The receiver's
 * proxy puts its head into the sender's ctrl page (the credits), and either
 * proxy puts the poison word when its rank fails. */
#ifndef WEFT_UCX_PROXY_H
#define WEFT_UCX_PROXY_H

#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "../../include/weft.h"
#include "../param.h"
#include "../transport.h"

/* ucx_params[] (param.h), defined in ucx_conn.c */
enum { UCX_P_DISABLE, UCX_P_MAX_BATCH };

/* A slot holds at most 64 MiB (2^26 bytes), so the low 27 bits of
 * slot_used_nbytes are its byte count; the bits above are the algorithms'
 * flags, carried unchanged. */
#define UCX_USED_NBYTES_MASK 0x07ffffffu

#define UCX_CTRL_NBYTES 4096 /* the slots start on their own page */
#define UCX_EXT_OFFSET 2048  /* struct ucx_ctrl_ext, past struct conn_ctrl */

/* The UCX transport's own words in the ctrl page, beside struct conn_ctrl. */
struct ucx_ctrl_ext {
  alignas(64) uint64_t remote_head; /* sender: the receiver's head, put by its proxy */
  alignas(64) uint64_t tail_src;    /* sender: the tail value being put */
  uint64_t head_src;                /* receiver: the head value being put */
  uint32_t poison_src;              /* 1, the value put into the peer's poison */
  uint32_t closed_src;              /* 1, the value put into the peer's peer_closed */
  alignas(64) uint32_t peer_closed; /* put by the peer once it writes here no more */
};

/* A sender's group of slots put together and flushed together. */
struct ucx_batch {
  uint64_t end;          /* the slot number after the batch's last */
  ucs_status_ptr_t req;  /* the flush; NULL once done */
};

/* One end of a UCX connection. Set up by ucx_conn.c; while registered, only
 * the proxy thread moves its slots. */
struct ucx_conn {
  ucp_context_h context;
  uint64_t token;     /* ties the blob to the bootstrap messages */
  int registered;     /* with the proxy */
  int is_send;
  int peer_rank;
  struct conn_ctrl *ctrl; /* the local FIFO: ctrl page, then the slots */
  struct ucx_ctrl_ext *ext;
  char *slots;
  uint32_t nslots;
  size_t slot_nbytes;
  void *fifo;
  size_t fifo_nbytes;
  ucp_mem_h memh;     /* the local FIFO's registration */
  /* the peer's FIFO */
  ucp_ep_h ep;
  ucp_rkey_h rkey;
  uint64_t remote_fifo; /* its address in the peer's process */
  /* the sender's progress, owned by the proxy */
  uint64_t put_step;    /* the next slot to put */
  uint32_t max_batch;   /* slots put between two flushes, at most */
  struct ucx_batch batches[CONN_MAX_SLOTS];
  uint32_t batch_first, nbatches;
  /* the receiver's progress */
  uint64_t head_sent;
  /* failure */
  ucs_status_t ep_status; /* set by the endpoint's error callback */
  int failed;
  struct ucx_conn *next; /* in the proxy's list, or among the retired */
  void (*free_fn)(struct ucx_conn *);
};

/* The process's UCX context and worker, made on first use. */
struct ucx_worker {
  ucp_context_h context;
  ucp_worker_h worker;
};

/* Takes a reference on the process's worker, creating it (and the context)
 * on first use. Does not block. */
weftResult_t ucx_worker_get(struct ucx_worker **worker_out);
/* Drops a reference; the last one stops the proxy and destroys the worker. */
void ucx_worker_put(void);

/* Converts a UCX status into weft's, with "what: UCX's text" as last error. */
weftResult_t ucx_error(ucs_status_t status, const char *what, ...)
    __attribute__((format(printf, 2, 3)));

/* Hands conn to the proxy thread (started if none runs). Does not block. */
weftResult_t ucx_proxy_add(struct ucx_conn *conn);

/* Takes conn back: on return the proxy thread no longer touches it. */
void ucx_proxy_remove(struct ucx_conn *conn);

/* Brackets UCX calls from the ranks' threads (set-up, close): the proxy
 * thread is then between passes. */
void ucx_enter(void);
void ucx_leave(void);

/* Progresses the worker once from the calling thread. */
void ucx_worker_progress_once(void);

/* Keeps a closed end's FIFO (and frees conn) once the peer has said it writes
 * there no more, or when the worker goes: until then a late put from the
 * peer (credits, poison) must land in memory that is still ours. free_fn
 * releases the end. */
void ucx_retire(struct ucx_conn *conn, void (*free_fn)(struct ucx_conn *));

#endif
