/* Ring collectives over bulk transfers: each step of the ring goes as
 * chunk-sized messages that the transport moves straight from the sender's
 * buffer into the receiver's (UCX: one tagged send and receive each), posted
 * by the rank's own thread. No slots, no hand-off to a proxy thread and no
 * copy into or out of a FIFO: over UCX's TCP that is what a large transfer
 * costs weft beyond UCX itself.
 *
 * Ring positions follow channel 0's ring; position p is this rank's, and
 * blocks are named by position: for all-gather and reduce-scatter block q is
 * the block of the rank at position q, for all-reduce the q-th of nranks
 * equal shares of the buffer. With n ranks:
 *   reduce steps t = 0 .. n-2: send block p-t-1 (the input at t = 0, else
 *     the chunk step t-1 reduced), receive block p-t-2 and reduce this
 *     rank's input into it; the last reduce step gives block p, final.
 *   gather steps u = 0 .. n-2: send block p-u, receive block p-u-1 straight
 *     into the output.
 * All-reduce runs both, reduce-scatter the first, all-gather the second.
 * Each final block is reduced by one rank only, so every rank holds the same
 * bits. All-reduce on two ranks is a single exchange instead (the same bytes
 * each way, in one step rather than two): each rank sends its whole input,
 * receives the peer's and reduces both, the lower rank's first, so both
 * compute the same bits.
 *
 * A block is cut into chunks; chunk j of every block walks through the steps
 * on its own (its step t + 1 starts when step t's send and receive are
 * done), WEFT_BULK_WINDOW chunks at a time, so transfers of some overlap the
 * reductions of others. Chunk j goes over channel j % nchannels: several
 * connections (TCP streams) at once. A message's id is (call, step, chunk).
 *
 * The call's signature (collectives/core/signature.h) goes to the next
 * rank as one 16-byte message of its own (step BULK_SIG_STEP, which no ring
 * step reaches), posted with the first chunks (before them, for chunks
 * above 8 KiB, which may go by rendezvous); the call returns only
 * once the previous rank's has come and matched, so every link compares.
 *
 * Scratch (per communicator, kept): two chunk buffers per chunk in flight,
 * one receiving step t, the other holding step t - 1's reduced chunk while
 * it is sent. The exchange out of place needs none for that: it receives
 * into the output and reduces there.
 *
 * The lifetime rule: no transfer that may outlive the call refers to the
 * caller's buffers. A send the peer may read after this rank gave it up
 * (above the transport's peer_reads_above: UCX's rendezvous, which the
 * receiver's process reads when it matches, and which cannot be cancelled)
 * goes from scratch: a chunk of the user's buffers is first copied into a
 * chunk buffer of its own (the staging copy; steps that send a reduced
 * chunk already send scratch). Scratch that a transfer given up still
 * refers to is never freed (chunks_abandon), so a late reader always finds
 * it mapped. Receives into the user's buffers are cancelled or completed
 * before an error returns (past BULK_EAGER_NBYTES they are posted only once
 * the previous rank's signature has matched); the signature's own two
 * messages live in scratch too. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/log.h"
#include "../../transport/base/status.h"
#include "../../transport/base/wait.h"
#include "bulk.h"
#include "../core/plan.h"
#include "../core/signature.h"
#include "../reduce/reduce_host.h"

/* The message id: call (8 bits) | step (10 bits) | chunk (14 bits). */
#define BULK_MAX_STEPS (1 << 10)
#define BULK_MAX_CHUNKS (1 << 14)
#define BULK_MAX_WINDOW 64
#define BULK_IDLE_PASSES 16 /* progress passes between the wait's checks */
#define BULK_DOWN_GRACE_NS 200000000ull /* a peer down, nothing coming in: give up */
#define BULK_CANCEL_WAIT_NS 200000000ull /* for the transport to let go after a cancel */

enum { BULK_P_MIN, BULK_P_CHUNK, BULK_P_WINDOW };
struct weft_param bulk_params[] = {
    [BULK_P_MIN] = {.name = "WEFT_BULK_MIN_NBYTES", .type = PARAM_INT, .default_str = "0",
     .doc = "smallest all-reduce, all-gather or reduce-scatter (bytes over all ranks) that runs "
            "as bulk transfers where the rings' transport has them (UCX): the rank posts "
            "chunk-sized messages straight from and into the user's buffers instead of going "
            "through slots and the proxy; 0: every size; larger than any size turns it off. "
            "`WEFT_ALGO` calls it `bulk` (`^bulk` turns it off)",
     .see = "ucx.md", .agree = 1},
    [BULK_P_CHUNK] = {.name = "WEFT_BULK_CHUNK_NBYTES", .type = PARAM_INT, .default_str = "1M",
     .doc = "bytes per message of a bulk collective (more where a block would need over 16384 "
            "chunks)", .agree = 1},
    [BULK_P_WINDOW] = {.name = "WEFT_BULK_WINDOW", .type = PARAM_INT, .default_str = "2",
     .min = 1, .max = BULK_MAX_WINDOW, .out_of_range = PARAM_RANGE_CLAMP,
     .doc = "chunks of a bulk collective in flight at once; a value out of the range takes its "
            "nearest end"},
    PARAM_END,
};

/* Chunks up to this size start beside the signature; larger ones, which
 * may go by rendezvous, only once it has matched (sig_first). */
#define BULK_EAGER_NBYTES 8192

/* The step of the signature's message. */
#define BULK_SIG_STEP (BULK_MAX_STEPS - 1)

static uint32_t bulk_id(uint64_t call, int step, size_t chunk) {
  return (uint32_t)(call & 0xff) << 24 | (uint32_t)step << 14 | (uint32_t)chunk;
}

size_t bulk_min_nbytes(void) {
  int64_t v = param_int(&bulk_params[BULK_P_MIN]);
  return v > 0 ? (size_t)v : 0;
}

static int conn_has_bulk(const struct weft_conn *c) {
  return c->transport != NULL && c->transport->bulk.post != NULL && c->priv != NULL;
}

/* Channels that can carry bulk transfers: the first ones whose ring is
 * channel 0's and whose connections, on every rank, have them. */
static int bulk_nchannels(const struct weftComm *comm) {
  const struct weft_channel *ch0 = &comm->channels[0];
  int nch = 0;
  while (nch < comm->nchannels && nch < comm->bulk_nchannels_all) {
    const struct weft_channel *ch = &comm->channels[nch];
    if (!conn_has_bulk(&ch->send) || !conn_has_bulk(&ch->recv)) break;
    if (memcmp(ch->ring, ch0->ring, (size_t)comm->nranks * sizeof *ch->ring) != 0) break;
    nch++;
  }
  return nch;
}

/* Moves the transfers of the first nch channels along once: one call when
 * the transport's progress moves every connection of the process
 * (TRANSPORT_CAP_PROGRESS_ALL), else one per connection. */
static void bulk_progress(struct weftComm *comm, int nch) {
  for (int c = 0; c < nch; c++) {
    struct weft_channel *ch = &comm->channels[c];
    ch->send.transport->bulk.progress(&ch->send);
    if (ch->send.transport->caps & TRANSPORT_CAP_PROGRESS_ALL) return;
    ch->recv.transport->bulk.progress(&ch->recv);
  }
}

/* Brackets a bulk call (struct weft_bulk_ops' begin and end) on the
 * connections whose progress bulk_progress drives. */
static void bulk_bracket(struct weftComm *comm, int nch, int begin) {
  for (int c = 0; c < nch; c++) {
    struct weft_conn *conns[2] = {&comm->channels[c].send, &comm->channels[c].recv};
    for (int k = 0; k < 2; k++) {
      const struct weft_bulk_ops *ops = &conns[k]->transport->bulk;
      void (*fn)(struct weft_conn *) = begin ? ops->begin : ops->end;
      if (fn != NULL) fn(conns[k]);
      if (conns[k]->transport->caps & TRANSPORT_CAP_PROGRESS_ALL) return;
    }
  }
}

int bulk_possible(const struct weftComm *comm) {
  return comm->nranks >= 2 && 2 * (comm->nranks - 1) < BULK_SIG_STEP && comm->nchannels > 0 &&
         bulk_nchannels(comm) > 0;
}

/* One call's shape. */
struct bulk_geom {
  enum coll_kind coll;
  int n, p;               /* ranks, this rank's position */
  const int *ring;
  size_t esize;
  size_t block_count;     /* elements per block (all-reduce's last may be shorter) */
  size_t total_count;     /* all-reduce: the buffer's elements */
  size_t chunk_count;     /* elements per chunk */
  size_t nchunks;         /* per block */
  int reduce_steps, nsteps;
  int exchange;           /* all-reduce on two ranks: one step, whole buffer */
  int lower;              /* exchange: this rank is the lower of the two */
  weft_reduce_fn reduce;
  int divisor;
};

static int pos_mod(int q, int n) { return ((q % n) + n) % n; }

/* Elements of block q (a position) before chunk j, and in chunk j. */
static size_t chunk_len(const struct bulk_geom *g, int q, size_t j) {
  size_t block_len = g->block_count;
  if (g->coll == COLL_ALLREDUCE && !g->exchange) {
    size_t start = (size_t)q * g->block_count;
    block_len = start >= g->total_count ? 0
                : g->total_count - start < g->block_count ? g->total_count - start
                                                          : g->block_count;
  }
  size_t off = j * g->chunk_count;
  if (off >= block_len) return 0;
  return block_len - off < g->chunk_count ? block_len - off : g->chunk_count;
}

/* Byte offset of chunk j in a buffer of this rank's block alone (all-gather's
 * input, reduce-scatter's output). */
static size_t chunk_own_at(const struct bulk_geom *g, size_t j) {
  return j * g->chunk_count * g->esize;
}

/* Byte offset of chunk j of block q in a buffer laid out by block: the
 * all-reduce buffer, or all ranks' blocks (all-gather's output,
 * reduce-scatter's input). */
static size_t chunk_at(const struct bulk_geom *g, int q, size_t j) {
  if (g->exchange) return chunk_own_at(g, j);
  size_t block = g->coll == COLL_ALLREDUCE ? (size_t)q : (size_t)g->ring[q];
  return (block * g->block_count + j * g->chunk_count) * g->esize;
}

/* One chunk index on its way through the steps. */
struct bulk_chunk {
  size_t j;
  int step;
  int live;              /* has a step posted */
  struct weft_conn *to, *from;
  struct weft_bulk_req send, recv;
  int send_staged;       /* the send goes from scratch, copied from the user's */
  char *buf[2];          /* scratch: step t receives into buf[t & 1] (reduce
                            steps) or buf[0] stages its send (no buf[1]) */
};

struct bulk_run_state {
  struct weftComm *comm;
  const struct weft_plan *plan;
  struct bulk_geom g;
  uint64_t call;
  int nch;
  size_t peer_reads_above; /* sends larger than this go from scratch */
};

/* Whether the two-rank exchange receives the peer's operand straight into
 * the output and reduces there: out of place, where the output is not what
 * this rank sends. */
static int exchange_into_output(const struct bulk_geom *g, const struct weft_plan *plan) {
  return g->exchange && plan->recvbuf != plan->sendbuf;
}

/* Where chunk c's reduce step receives: scratch, or the output for the
 * exchange out of place. */
static char *reduce_recv_at(const struct bulk_run_state *s, const struct bulk_chunk *c) {
  if (exchange_into_output(&s->g, s->plan))
    return (char *)s->plan->recvbuf + chunk_at(&s->g, 0, c->j);
  return c->buf[c->step & 1];
}

/* The scratch buffer that step t of chunk c stages its send in: one the
 * step does not receive into (reduce step 0 receives into buf[0]; gather
 * steps into the output). */
static char *chunk_stage(const struct bulk_chunk *c, int t) {
  return t == 0 && c->buf[1] != NULL ? c->buf[1] : c->buf[0];
}

/* Posts chunk c's step: its send and its receive (either may be empty). */
static weftResult_t chunk_post(struct bulk_run_state *s, struct bulk_chunk *c) {
  const struct bulk_geom *g = &s->g;
  const struct weft_plan *plan = s->plan;
  const int t = c->step, p = g->p, n = g->n;
  const char *src;
  char *dst;
  int sq, rq;
  if (t < g->reduce_steps) {
    sq = pos_mod(p - t - 1, n);
    rq = pos_mod(p - t - 2, n);
    src = t == 0 ? (const char *)plan->sendbuf + chunk_at(g, sq, c->j) : c->buf[(t - 1) & 1];
    dst = reduce_recv_at(s, c);
  } else {
    int u = t - g->reduce_steps;
    sq = pos_mod(p - u, n);
    rq = pos_mod(p - u - 1, n);
    /* all-gather's first step sends the input; then the output holds it all */
    if (g->coll == COLL_ALLGATHER && u == 0)
      src = (const char *)plan->sendbuf + chunk_own_at(g, c->j);
    else
      src = (const char *)plan->recvbuf + chunk_at(g, sq, c->j);
    dst = (char *)plan->recvbuf + chunk_at(g, rq, c->j);
  }
  const size_t send_nbytes = chunk_len(g, sq, c->j) * g->esize;
  const size_t recv_nbytes = chunk_len(g, rq, c->j) * g->esize;
  const uint32_t id = bulk_id(s->call, t, c->j);
  c->send.handle = c->recv.handle = NULL;
  if (recv_nbytes > 0)
    WEFT_TRY(c->from->transport->bulk.post(c->from, dst, recv_nbytes, id, &c->recv));
  /* the user's memory (reduce step 0, gather steps) goes out from scratch
   * where the peer may read it late (the lifetime rule, above); the copy
   * after the receive is posted, so that the peer's data need not wait */
  const int from_user = t == 0 || t >= g->reduce_steps;
  c->send_staged = from_user && send_nbytes > s->peer_reads_above;
  if (c->send_staged) {
    char *stage = chunk_stage(c, t);
    memcpy(stage, src, send_nbytes);
    src = stage;
  }
  if (send_nbytes > 0)
    WEFT_TRY(c->to->transport->bulk.post(c->to, (void *)src, send_nbytes, id, &c->send));
  c->live = 1;
  return weftSuccess;
}

/* Chunk c's step is done: reduces what arrived. */
static void chunk_reduce(struct bulk_run_state *s, struct bulk_chunk *c) {
  const struct bulk_geom *g = &s->g;
  const int t = c->step;
  if (t >= g->reduce_steps) return;
  const int rq = pos_mod(g->p - t - 2, g->n);
  const size_t m = chunk_len(g, rq, c->j);
  if (m == 0) return;
  const char *own = (const char *)s->plan->sendbuf + chunk_at(g, rq, c->j);
  char *in = reduce_recv_at(s, c);
  if (t + 1 < g->reduce_steps) {
    g->reduce(in, NULL, in, own, m, 1);
    return;
  }
  if (g->exchange) {
    char *out = (char *)s->plan->recvbuf + chunk_at(g, 0, c->j);
    g->reduce(out, NULL, g->lower ? own : in, g->lower ? in : own, m, g->divisor);
    return;
  }
  /* the last reduce step: block p, final */
  char *out = (char *)s->plan->recvbuf +
              (g->coll == COLL_ALLREDUCE ? chunk_at(g, rq, c->j) : chunk_own_at(g, c->j));
  g->reduce(out, NULL, in, own, m, g->divisor);
}

/* Tests chunk c's requests; *done when both have completed. */
static weftResult_t chunk_test(struct bulk_chunk *c, int *done) {
  *done = 0;
  if (c->recv.handle != NULL) {
    weftResult_t r = c->from->transport->bulk.test(c->from, &c->recv);
    if (r != weftInProgress && r != weftSuccess) return r;
  }
  if (c->send.handle != NULL) {
    weftResult_t r = c->to->transport->bulk.test(c->to, &c->send);
    if (r != weftInProgress && r != weftSuccess) return r;
  }
  *done = c->recv.handle == NULL && c->send.handle == NULL;
  return weftSuccess;
}

/* What bulk keeps per communicator (comm_state_get). */
struct bulk_comm {
  uint64_t calls;        /* bulk collectives run */
  void *scratch;         /* the chunk buffers, then the signatures (bulk_sigs) */
  size_t scratch_nbytes;
};

/* The scratch's last bytes: the call's signature and the previous rank's,
 * one message each way. */
#define BULK_SIG_AREA 64
static struct signature_packed *bulk_sigs(const struct bulk_comm *b) {
  _Static_assert(2 * sizeof(struct signature_packed) <= BULK_SIG_AREA, "signatures fit");
  return (struct signature_packed *)((char *)b->scratch + b->scratch_nbytes - BULK_SIG_AREA);
}

static void bulk_comm_scratch_release(void *state) {
  struct bulk_comm *b = state;
  free(b->scratch);
  b->scratch = NULL;
  b->scratch_nbytes = 0;
}

static uint64_t bulk_comm_scratch_nbytes(const void *state) {
  const struct bulk_comm *b = state;
  return b->scratch != NULL ? b->scratch_nbytes : 0;
}

static void bulk_comm_destroy(void *state) {
  bulk_comm_scratch_release(state);
  free(state);
}

static const struct comm_state_ops bulk_comm_ops = {
    .name = "bulk",
    .destroy = bulk_comm_destroy,
    .scratch_nbytes = bulk_comm_scratch_nbytes,
    .scratch_release = bulk_comm_scratch_release,
};

#ifdef WEFT_TEST_HOOKS
uint64_t bulk_comm_calls(const struct weftComm *comm) {
  const struct bulk_comm *b = comm_state_get(comm, &bulk_comm_ops);
  return b != NULL ? b->calls : 0;
}
#endif

/* comm's bulk state, made on first use. */
static weftResult_t bulk_comm_get(struct weftComm *comm, struct bulk_comm **out) {
  struct bulk_comm *b = comm_state_get(comm, &bulk_comm_ops);
  if (b == NULL) {
    b = calloc(1, sizeof *b);
    if (b == NULL) return weft_error_set(weftSystemError, "bulk collective: out of memory");
    weftResult_t res = comm_state_set(comm, &bulk_comm_ops, b);
    if (res != weftSuccess) {
      free(b);
      return res;
    }
  }
  *out = b;
  return weftSuccess;
}

/* How many of the chunks' transfers are still in flight (tests them),
 * staged sends included or not. */
static int chunks_in_flight(struct bulk_chunk *chunks, int nchunks, int staged_too) {
  int left = 0;
  for (int i = 0; i < nchunks; i++) {
    struct bulk_chunk *c = &chunks[i];
    if (c->recv.handle != NULL && c->from->transport->bulk.test(c->from, &c->recv) == weftInProgress)
      left++;
    if (c->send.handle != NULL && (staged_too || !c->send_staged) &&
        c->to->transport->bulk.test(c->to, &c->send) == weftInProgress)
      left++;
  }
  return left;
}

/* After the error res: ends every transfer still in flight (the connections
 * that carried them fail), so that none touches the user's buffers once this
 * call returns. Keeps res's text.
 *
 * Receives are cancelled; one that a sender had already matched completes
 * as its data comes in. Sends of the user's memory below the transport's
 * peer_reads_above finish on this end. Staged sends (the lifetime rule) are
 * not waited for: a peer that refused the call never answers them.
 *
 * A receive cut off in the middle of a message (its sender died, or its
 * connection was just closed) can be neither cancelled nor completed: UCX
 * holds it until the worker goes, though nothing can reach it any more.
 * So does a send whose receiver never answered its rendezvous (a peer that
 * refused the call or stalled; ucx_bulk_ep). The scratch such transfers may
 * point into is then left to them, never freed. */
static weftResult_t chunks_abandon(struct weftComm *comm, int nch, struct bulk_chunk *chunks,
                                   int nchunks, weftResult_t res) {
  char text[1024];
  snprintf(text, sizeof text, "%s", weft_error_text());
  for (int i = 0; i < nchunks; i++) {
    struct bulk_chunk *c = &chunks[i];
    if (c->recv.handle != NULL) c->from->transport->bulk.cancel(c->from, &c->recv);
    if (c->send.handle != NULL) c->to->transport->bulk.cancel(c->to, &c->send);
  }
  uint64_t deadline = clock_ns() + BULK_CANCEL_WAIT_NS;
  while (chunks_in_flight(chunks, nchunks, 0) > 0 && clock_ns() < deadline)
    bulk_progress(comm, nch);
  const int left = chunks_in_flight(chunks, nchunks, 1);
  if (left > 0) {
    WEFT_INFO(LOG_COLL, "bulk collective: %d transfers given up stay with the transport, "
              "and the scratch they use with them", left);
    struct bulk_comm *b = comm_state_get(comm, &bulk_comm_ops);
    b->scratch = NULL; /* theirs now */
    b->scratch_nbytes = 0;
  }
  return weft_error_set(res, "%s", text);
}

/* Whether a connection in use is down: poisoned (a peer or this rank failed
 * or closed, the news passed on around the ring) or its peer's process gone.
 * Sets the error text. */
static int conn_down(const struct weft_conn *c) {
  if (__atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE)) {
    weft_error_set(weftRemoteError, "bulk collective: rank %d failed, aborted or left "
                   "(its connection is poisoned)", c->peer_rank);
    return 1;
  }
  if (c->peer_pid > 0 && kill(c->peer_pid, 0) != 0 && errno == ESRCH) {
    weft_error_set(weftRemoteError, "bulk collective: rank %d (pid %d) died", c->peer_rank,
                   (int)c->peer_pid);
    return 1;
  }
  return 0;
}

static int bulk_peer_down(const struct weftComm *comm, int nch) {
  for (int c = 0; c < nch; c++)
    if (conn_down(&comm->channels[c].recv) || conn_down(&comm->channels[c].send)) return 1;
  return 0;
}

/* The previous rank's signature (theirs) is not this rank's (mine): names
 * the difference. */
__attribute__((noinline, cold)) static weftResult_t
bulk_sig_mismatch(struct weftComm *comm, int peer, const struct signature_packed *theirs_packed,
                  const struct signature_packed *mine_packed) {
  struct signature mine, theirs;
  signature_unpack(&mine, mine_packed);
  signature_unpack(&theirs, theirs_packed);
  const int lower = peer < comm->rank;
  const struct signature pair[2] = {lower ? theirs : mine, lower ? mine : theirs};
  const int ranks[2] = {lower ? peer : comm->rank, lower ? comm->rank : peer};
  if (signature_compare_ranks(pair, ranks, 2, "ranks disagree on a collective") != weftSuccess)
    return weftInvalidUsage;
  return weft_error_set(weftInvalidUsage,
                        "ranks disagree on a collective: %s: rank %d's bulk signature is not "
                        "rank %d's", coll_kind_name((enum coll_kind)mine.coll), peer, comm->rank);
}

/* Grows the comm's scratch to chunk buffers of nbytes and the signatures. */
static weftResult_t bulk_scratch(struct bulk_comm *b, size_t nbytes) {
  nbytes = (nbytes + BULK_SIG_AREA - 1) / BULK_SIG_AREA * BULK_SIG_AREA + BULK_SIG_AREA;
  if (b->scratch_nbytes >= nbytes) return weftSuccess;
  bulk_comm_scratch_release(b);
  if (posix_memalign(&b->scratch, 4096, nbytes) != 0)
    return weft_error_set(weftSystemError, "bulk collective: cannot allocate %zu bytes", nbytes);
  b->scratch_nbytes = nbytes;
  return weftSuccess;
}

static void bulk_geom_init(struct bulk_geom *g, const struct weftComm *comm,
                           const struct weft_plan *plan) {
  const int n = comm->nranks;
  memset(g, 0, sizeof *g);
  g->coll = plan->coll;
  g->n = n;
  g->p = comm->channels[0].ring_pos;
  g->ring = comm->channels[0].ring;
  g->esize = weftTypeSize(plan->datatype);
  if (plan->coll == COLL_ALLREDUCE && n == 2) {
    g->exchange = 1;
    g->lower = comm->rank < g->ring[1 - g->p];
    g->block_count = g->total_count = plan->count;
  } else if (plan->coll == COLL_ALLREDUCE) {
    const size_t align = 64 / g->esize; /* blocks start on cache lines */
    size_t b = (plan->count + (size_t)n - 1) / (size_t)n;
    g->block_count = (b + align - 1) / align * align;
    g->total_count = plan->count;
  } else {
    g->block_count = plan->count;
  }
  int64_t want = param_int(&bulk_params[BULK_P_CHUNK]);
  size_t chunk = want > 0 ? (size_t)want / g->esize : 1;
  if (chunk == 0) chunk = 1;
  size_t least = (g->block_count + BULK_MAX_CHUNKS - 1) / BULK_MAX_CHUNKS;
  g->chunk_count = chunk > least ? chunk : least;
  g->nchunks = (g->block_count + g->chunk_count - 1) / g->chunk_count;
  const int reduces = plan->coll != COLL_ALLGATHER;
  g->reduce_steps = reduces ? n - 1 : 0;
  g->nsteps = g->reduce_steps + (plan->coll != COLL_REDUCESCATTER && !g->exchange ? n - 1 : 0);
  if (reduces) {
    g->reduce = reduce_host_fn(plan->datatype, plan->op);
    g->divisor = plan->op == weftAvg ? n : 1;
  }
}

/* Bytes of one chunk buffer: the largest chunk, whole cache lines. */
static size_t bulk_buf_nbytes(const struct bulk_geom *g) {
  const size_t count = g->chunk_count < g->block_count ? g->chunk_count : g->block_count;
  return (count * g->esize + 63) / 64 * 64;
}

/* Chunk buffers per chunk in flight: two where reduce steps go through
 * scratch (one of them stages step 0's send), else one where sends of the
 * user's memory are staged, else none. */
static int bulk_nbufs(const struct bulk_run_state *s) {
  const struct bulk_geom *g = &s->g;
  if (g->reduce_steps > 0 && !exchange_into_output(g, s->plan)) return 2;
  return bulk_buf_nbytes(g) > s->peer_reads_above ? 1 : 0;
}

/* The chunks through every step, window at a time; the scratch is there. */
static weftResult_t bulk_chunks_run(struct bulk_run_state *s, int window) {
  struct weftComm *comm = s->comm;
  const struct weft_plan *plan = s->plan;
  const struct bulk_geom *g = &s->g;
  const size_t buf_nbytes = bulk_buf_nbytes(g);
  const int nbufs = bulk_nbufs(s);
  struct bulk_comm *b = comm_state_get(comm, &bulk_comm_ops);
  char *scratch = b->scratch;
  struct signature_packed *sig_out = &bulk_sigs(b)[0], *sig_in = &bulk_sigs(b)[1];
  struct bulk_chunk chunks[BULK_MAX_WINDOW + 1]; /* the chunks, then the signature's */
  memset(chunks, 0, sizeof chunks);
  struct bulk_chunk *sig = &chunks[window];
  int sig_done = !WEFT_SLOT_SIGNATURE;
  weftResult_t res = weftSuccess;
  size_t next_j = 0, ndone = 0;
  for (int i = 0; i < window && nbufs > 0; i++) {
    struct bulk_chunk *c = &chunks[i];
    c->buf[0] = scratch + (size_t)nbufs * (size_t)i * buf_nbytes;
    c->buf[1] = nbufs == 2 ? c->buf[0] + buf_nbytes : NULL;
  }
  struct weft_channel *ch0 = &comm->channels[0];
  /* the wait watches the abort flag and the timeout; a peer that is down is
   * this loop's to judge: what it sent before may still be on its way in */
  struct weft_wait w;
  unsigned idle = 0;
  uint64_t down_since = 0;
  wait_begin(&w, comm_timeout_ns(comm), &comm->abort_flag, NULL, 0, ch0->recv.peer_rank,
             "bulk transfer from");
  if (!sig_done) {
    const uint32_t id = bulk_id(s->call, BULK_SIG_STEP, 0);
    signature_pack(sig_out, plan);
    memset(sig_in, 0, sizeof *sig_in);
    sig->to = &ch0->send;
    sig->from = &ch0->recv;
    WEFT_TRY_GOTO(sig->from->transport->bulk.post(sig->from, sig_in, sizeof *sig_in, id,
                                                  &sig->recv), res, fail);
    WEFT_TRY_GOTO(sig->to->transport->bulk.post(sig->to, sig_out, sizeof *sig_out, id,
                                                &sig->send), res, fail);
  }
  /* chunks that may go by rendezvous wait for the signature: a receive into
   * the user's buffers then only ever matches a sender whose call agreed */
  const int sig_first = !sig_done && bulk_buf_nbytes(g) > BULK_EAGER_NBYTES;
  while (ndone < g->nchunks || !sig_done) {
    /* start chunks where the window has room */
    for (int i = 0; i < window && next_j < g->nchunks && !(sig_first && !sig_done); i++) {
      struct bulk_chunk *c = &chunks[i];
      if (c->live) continue;
      struct weft_channel *ch = &comm->channels[next_j % (size_t)s->nch];
      c->j = next_j++;
      c->step = 0;
      c->to = &ch->send;
      c->from = &ch->recv;
      WEFT_TRY_GOTO(chunk_post(s, c), res, fail);
    }
    bulk_progress(comm, s->nch);
    int moved = 0;
    if (!sig_done) {
      WEFT_TRY_GOTO(chunk_test(sig, &sig_done), res, fail);
      if (sig_done && !signature_packed_same(sig_in, sig_out)) {
        res = bulk_sig_mismatch(comm, ch0->recv.peer_rank, sig_in, sig_out);
        goto fail;
      }
      moved |= sig_done;
    }
    for (int i = 0; i < window; i++) {
      struct bulk_chunk *c = &chunks[i];
      if (!c->live) continue;
      int done;
      WEFT_TRY_GOTO(chunk_test(c, &done), res, fail);
      if (!done) continue;
      moved = 1;
      chunk_reduce(s, c);
      c->live = 0;
      if (++c->step < g->nsteps) {
        WEFT_TRY_GOTO(chunk_post(s, c), res, fail);
      } else {
        ndone++;
      }
    }
    if (moved) {
      wait_begin(&w, comm_timeout_ns(comm), &comm->abort_flag, NULL, 0, ch0->recv.peer_rank,
                 "bulk transfer from");
      idle = 0;
      down_since = 0;
      continue;
    }
    /* each pass made a progress call (a system call or more): the wait's
     * checks and back-off (a yield when ranks outnumber cores) every few */
    if (++idle % BULK_IDLE_PASSES != 0) continue;
    if (bulk_peer_down(comm, s->nch)) {
      /* fail once nothing more has come in for a while */
      uint64_t now = clock_ns();
      if (down_since == 0) down_since = now;
      if (now - down_since > BULK_DOWN_GRACE_NS) {
        res = weftRemoteError;
        goto fail;
      }
    }
    res = wait_poll(&w);
    if (res != weftInProgress) goto fail;
  }
  return weftSuccess;
fail:
  res = chunks_abandon(comm, s->nch, chunks, window + 1, res);
  if (res == weftInvalidUsage) comm_fail_alone(comm, res); /* the steps no longer pair up */
  return res;
}

weftResult_t bulk_run(struct weftComm *comm, const struct weft_plan *plan) {
  struct bulk_comm *b = NULL;
  WEFT_TRY(bulk_comm_get(comm, &b));
  struct bulk_run_state s = {.comm = comm, .plan = plan, .call = b->calls++};
  struct bulk_geom *g = &s.g;
  bulk_geom_init(g, comm, plan);
  s.nch = bulk_nchannels(comm);
  if (s.nch == 0 || g->nsteps >= BULK_SIG_STEP)
    return weft_error_set(weftInternalError, "bulk collective on a comm without bulk transfers");
  if (plan->nchannels > 0 && plan->nchannels < s.nch) s.nch = plan->nchannels;
  int window = (int)param_int(&bulk_params[BULK_P_WINDOW]); /* clamped to 1..BULK_MAX_WINDOW */
  if ((size_t)window > g->nchunks) window = (int)g->nchunks;
  const struct weft_conn *send0 = &comm->channels[0].send;
  s.peer_reads_above = send0->transport->bulk.peer_reads_above != NULL
                           ? send0->transport->bulk.peer_reads_above(send0)
                           : 0;
  WEFT_TRY(bulk_scratch(b, (size_t)bulk_nbufs(&s) * (size_t)window * bulk_buf_nbytes(g)));

  /* all-gather out of place: this rank's block into the output first */
  if (plan->coll == COLL_ALLGATHER) {
    char *own = (char *)plan->recvbuf + (size_t)comm->rank * plan->count * g->esize;
    if (own != plan->sendbuf) memcpy(own, plan->sendbuf, plan->count * g->esize);
  }

  /* this thread progresses the transport throughout (every chunk's test
   * needs it): the transport's own thread may wait meanwhile */
  bulk_bracket(comm, s.nch, 1);
  weftResult_t res = bulk_chunks_run(&s, window);
  bulk_bracket(comm, s.nch, 0);
  return res;
}
