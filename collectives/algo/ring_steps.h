/* The ring algorithms as step sequences: one source for both executors.
 *
 * A ring collective on one channel is a loop over pieces of the channel's
 * share; each loop is a fixed sequence of primitive steps. ring_step_at(g, ring, base,
 * s) says what step s of the loop starting at element `base` does: which
 * primitive, which elements of the send and receive buffers, how many. The
 * host executor (ring.c) runs the steps with the host primitives; the
 * CUDA kernels (device/kernels.cuh) run the very same function with device
 * primitives, so both follow one algorithm.
 *
 * Compiles as C11, C++ and CUDA (host and device); no pointers to buffers,
 * only element indices, so it can be tested on the host without memory. */
#ifndef WEFT_RING_STEPS_H
#define WEFT_RING_STEPS_H

#include <stddef.h>

#if defined(__CUDACC__)
#define RING_HD static __host__ __device__ __forceinline__
#else
#define RING_HD static inline
#endif

/* The ring collectives, numbered as enum coll_kind (plan.h). */
enum ring_coll {
  RING_ALLREDUCE = 0,
  RING_ALLGATHER,
  RING_REDUCESCATTER,
  RING_BROADCAST,
  RING_REDUCE,
  RING_NCOLLS,
  /* Not a collective of its own: all-reduce of two ranks in one exchange
   * (below), which the device executor runs for small LL all-reduces. */
  RING_ALLREDUCE_PAIR = 8
};

/* The primitives a step can be (exec/host/prims.h describes each, and the
 * flags of prims_step that make it). */
enum ring_prim {
  PRIM_SEND = 0,          /* src -> next */
  PRIM_COPY_SEND,         /* src -> next and dst */
  PRIM_RECV,              /* prev -> dst */
  PRIM_RECV_REDUCE_SEND,  /* prev op src -> next */
  PRIM_RECV_REDUCE_COPY_SEND, /* prev op src -> next and dst */
  PRIM_RECV_COPY_SEND,    /* prev -> next and dst */
  PRIM_RECV_REDUCE_COPY,  /* prev op src -> dst */
  PRIM_NPRIMS
};

/* Which buffers each primitive reads (src) and writes (dst). */
RING_HD int ring_prim_has_src(int prim) {
  return prim == PRIM_SEND || prim == PRIM_COPY_SEND || prim == PRIM_RECV_REDUCE_SEND ||
         prim == PRIM_RECV_REDUCE_COPY_SEND || prim == PRIM_RECV_REDUCE_COPY;
}
RING_HD int ring_prim_has_dst(int prim) {
  return prim == PRIM_COPY_SEND || prim == PRIM_RECV || prim == PRIM_RECV_REDUCE_COPY_SEND ||
         prim == PRIM_RECV_COPY_SEND || prim == PRIM_RECV_REDUCE_COPY;
}

#define RING_MAX_RANKS 1024

/* One channel's view of one call. */
struct ring_geom {
  int coll;           /* enum ring_coll */
  int nranks;         /* k */
  int pos;            /* our position in the ring */
  int root_pos;       /* the root's position (broadcast, reduce), else -1 */
  size_t total_count; /* the plan's count: elements per rank block (all-gather,
                         reduce-scatter), else of the whole buffer */
  size_t offset;      /* the channel's share: elements [offset, offset + count) */
  size_t count;
  size_t slot_count;  /* elements one slot carries */
  size_t align_count; /* all-reduce chunks are multiples of this (64 bytes) */
};

/* What one step does: src_elem indexes the send buffer, dst_elem the
 * receive buffer; each is meaningful when the primitive has that buffer. */
struct ring_step {
  int prim; /* enum ring_prim */
  size_t src_elem;
  size_t dst_elem;
  size_t count;
};

/* Elements one loop of the algorithm covers, and its number of steps. */
RING_HD size_t ring_loop_nelems(const struct ring_geom *g) {
  return g->coll == RING_ALLREDUCE ? (size_t)g->nranks * g->slot_count : g->slot_count;
}
RING_HD int ring_loop_nsteps(const struct ring_geom *g) {
  switch (g->coll) {
    case RING_ALLREDUCE: return 2 * g->nranks - 1;
    case RING_ALLREDUCE_PAIR: return 2;
    case RING_ALLGATHER: return g->nranks;
    case RING_REDUCESCATTER: return g->nranks;
    default: return 1;
  }
}

RING_HD size_t ring_min(size_t a, size_t b) { return a < b ? a : b; }

/* --- all-reduce -----------------------------------------------------------
 * The loop's elements are cut into k chunks, each at most one slot. k ranks,
 * position i:
 *   step 0:            send chunk i-1;
 *   steps 1..k-2:      recv-reduce-send chunk i-1-s (the chunk before);
 *   step k-1:          recv-reduce-copy-send chunk i (now fully reduced: keep
 *                      it and pass it on);
 *   steps k..2k-3:     recv-copy-send chunk i-(s-k+1);
 *   step 2k-2:         recv chunk i+1, the last one. */
RING_HD void ring_allreduce_step(const struct ring_geom *g, size_t base, int s,
                                 struct ring_step *st) {
  const int k = g->nranks, pos = g->pos;
  /* chunk size for this loop: a full slot, or an even share of the rest */
  size_t chunk = (g->count - base + (size_t)k - 1) / (size_t)k;
  chunk = (chunk + g->align_count - 1) / g->align_count * g->align_count;
  if (chunk > g->slot_count) chunk = g->slot_count;
  int c;
  if (s == 0) {
    c = (pos - 1 + k) % k;
    st->prim = PRIM_SEND;
  } else if (s < k - 1) {
    c = (pos - (s + 1) + k) % k;
    st->prim = PRIM_RECV_REDUCE_SEND;
  } else if (s == k - 1) {
    c = pos;
    st->prim = PRIM_RECV_REDUCE_COPY_SEND;
  } else if (s < 2 * k - 2) {
    c = (pos - (s - k + 1) + k) % k;
    st->prim = PRIM_RECV_COPY_SEND;
  } else {
    c = (pos + 1) % k;
    st->prim = PRIM_RECV;
  }
  size_t off = base + (size_t)c * chunk;
  st->count = off >= g->count ? 0 : ring_min(g->count - off, chunk);
  st->src_elem = g->offset + off;
  st->dst_elem = g->offset + off;
}

/* --- all-reduce of a pair ---------------------------------------------------
 * Two ranks, each the other's next and previous: one exchange instead of the
 * ring's two dependent ones (reduce-scatter, then all-gather), the same bytes
 * sent. Per piece of a slot:
 *   step 0:  send our input's piece (pre-multiplied, as every send of src);
 *   step 1:  recv-reduce-copy: the peer's piece op ours, into the output (avg
 *            divides here).
 * Each rank reduces the same two values, in the other order; every op is
 * commutative (reduce_ops.h), so both ranks hold the same result, bit for
 * bit (a GPU's sum and product of two NaNs give its one NaN, whatever the
 * order). */
RING_HD void ring_allreduce_pair_step(const struct ring_geom *g, size_t base, int s,
                                      struct ring_step *st) {
  st->prim = s == 0 ? PRIM_SEND : PRIM_RECV_REDUCE_COPY;
  st->count = ring_min(g->count - base, g->slot_count);
  st->src_elem = g->offset + base;
  st->dst_elem = g->offset + base;
}

/* --- all-gather -----------------------------------------------------------
 * Each rank's block travels once around the ring, a piece at a time:
 *   step 0:          copy-send our own block's piece (into our output, and on);
 *   steps 1..k-2:    recv-copy-send the block of the rank s steps back;
 *   step k-1:        recv the block of the next rank, come all the way round. */
RING_HD void ring_allgather_step(const struct ring_geom *g, size_t base, int s,
                                 struct ring_step *st, const int *ring) {
  const int k = g->nranks, pos = g->pos;
  int q;
  if (s == 0) {
    q = pos;
    st->prim = PRIM_COPY_SEND;
  } else if (s < k - 1) {
    q = pos + k - s;
    st->prim = PRIM_RECV_COPY_SEND;
  } else {
    q = pos + 1;
    st->prim = PRIM_RECV;
  }
  st->count = ring_min(g->count - base, g->slot_count);
  st->src_elem = g->offset + base;
  st->dst_elem = (size_t)ring[q % k] * g->total_count + g->offset + base;
}

/* --- reduce-scatter -------------------------------------------------------
 * Block b of every rank's input is reduced along the ring and lands on rank b:
 *   step 0:          send the piece of the block of position i-1;
 *   steps 1..k-2:    recv-reduce-send the block one further back;
 *   step k-1:        recv-reduce-copy our own block into the output (avg
 *                    divides here). */
RING_HD void ring_reducescatter_step(const struct ring_geom *g, size_t base, int s,
                                     struct ring_step *st, const int *ring) {
  const int k = g->nranks, pos = g->pos;
  int q;
  if (s == 0) {
    q = pos + k - 1;
    st->prim = PRIM_SEND;
  } else if (s < k - 1) {
    q = pos + k - (s + 1);
    st->prim = PRIM_RECV_REDUCE_SEND;
  } else {
    q = pos;
    st->prim = PRIM_RECV_REDUCE_COPY;
  }
  st->count = ring_min(g->count - base, g->slot_count);
  st->src_elem = (size_t)ring[q % k] * g->total_count + g->offset + base;
  st->dst_elem = g->offset + base;
}

/* --- broadcast ------------------------------------------------------------
 * A chain from the root along the ring: the root copy-sends each piece, the
 * ranks in between recv-copy-send, the rank just before the root receives. */
RING_HD void ring_broadcast_step(const struct ring_geom *g, size_t base, struct ring_step *st) {
  const int k = g->nranks;
  if (g->pos == g->root_pos) st->prim = PRIM_COPY_SEND;
  else if ((g->pos + 1) % k == g->root_pos) st->prim = PRIM_RECV;
  else st->prim = PRIM_RECV_COPY_SEND;
  st->count = ring_min(g->count - base, g->slot_count);
  st->src_elem = g->offset + base;
  st->dst_elem = g->offset + base;
}

/* --- reduce ---------------------------------------------------------------
 * A chain that starts just after the root and ends at it: the first rank
 * sends each piece, the ranks in between recv-reduce-send, and the root
 * recv-reduce-copies into its output (avg divides here). */
RING_HD void ring_reduce_step(const struct ring_geom *g, size_t base, struct ring_step *st) {
  const int k = g->nranks;
  if ((g->pos + k - 1) % k == g->root_pos) st->prim = PRIM_SEND;
  else if (g->pos == g->root_pos) st->prim = PRIM_RECV_REDUCE_COPY;
  else st->prim = PRIM_RECV_REDUCE_SEND;
  st->count = ring_min(g->count - base, g->slot_count);
  st->src_elem = g->offset + base;
  st->dst_elem = g->offset + base;
}

/* Step s of the loop that starts at element base of the channel's share.
 * ring[i] is the rank at ring position i. */
RING_HD void ring_step_at(const struct ring_geom *g, const int *ring, size_t base, int s,
                          struct ring_step *st) {
  switch (g->coll) {
    case RING_ALLREDUCE: ring_allreduce_step(g, base, s, st); break;
    case RING_ALLREDUCE_PAIR: ring_allreduce_pair_step(g, base, s, st); break;
    case RING_ALLGATHER: ring_allgather_step(g, base, s, st, ring); break;
    case RING_REDUCESCATTER: ring_reducescatter_step(g, base, s, st, ring); break;
    case RING_BROADCAST: ring_broadcast_step(g, base, st); break;
    default: ring_reduce_step(g, base, st); break;
  }
}

/* The most loops a channel may take together over FIFOs of nslots slots
 * (2 or more, as every ring needs): one fewer. With as many loops as slots,
 * every rank can fill its next rank's FIFO with the first steps of the
 * loops while waiting for its own, around the ring: a deadlock (device_host
 * simulates it). */
RING_HD int ring_interleave_max(int nslots) { return nslots > 1 ? nslots - 1 : 1; }

/* A channel's steps in all: its loops times a loop's steps. */
RING_HD size_t ring_nsteps_total(const struct ring_geom *g) {
  const size_t loop = ring_loop_nelems(g);
  return (g->count + loop - 1) / loop * (size_t)ring_loop_nsteps(g);
}

/* The order a channel runs its loops' steps in. Around a ring, step s of a
 * loop waits for the previous rank's step s - 1 of that loop, which that
 * rank ran just before its own step s: one loop at a time, every step
 * waits for a hand-over (the previous rank publishing its slot, this rank
 * seeing it) that nothing overlaps. Taking `interleave` loops together,
 * step s of each before step s + 1 of any, leaves interleave - 1 steps of
 * other loops between a hand-over and the step that waits for it. Every
 * rank of a channel must take the same interleave, since it orders the
 * slots of each FIFO; 1 is one loop after another (the host executor's
 * order). An iterator, so that a kernel's step costs no division:
 *   ring_iter_init(&o, g, interleave);
 *   while (ring_iter_next(&o, &base, &s)) ... ring_step_at(g, ring, base, s, ...) */
struct ring_iter {
  size_t loop_nelems, nloops;
  size_t first;    /* the group's first loop */
  size_t together; /* loops in the group: interleave, or fewer at the end */
  size_t j;        /* the next loop within the group */
  int s, nsteps;   /* the group's step now, and a loop's steps */
  int depth;       /* interleave, at least 1 */
};

RING_HD void ring_iter_init(struct ring_iter *o, const struct ring_geom *g, int interleave) {
  o->loop_nelems = ring_loop_nelems(g);
  o->nloops = (g->count + o->loop_nelems - 1) / o->loop_nelems;
  o->depth = interleave > 1 ? interleave : 1;
  o->first = 0;
  o->together = o->nloops < (size_t)o->depth ? o->nloops : (size_t)o->depth;
  o->j = 0;
  o->s = 0;
  o->nsteps = ring_loop_nsteps(g);
}

/* The next step's loop (by its first element) and step; 0 when the
 * channel's steps are done. */
RING_HD int ring_iter_next(struct ring_iter *o, size_t *base_out, int *s_out) {
  if (o->first >= o->nloops) return 0;
  *base_out = (o->first + o->j) * o->loop_nelems;
  *s_out = o->s;
  if (++o->j < o->together) return 1;
  o->j = 0;
  if (++o->s < o->nsteps) return 1;
  o->s = 0;
  o->first += o->together;
  o->together = o->nloops - o->first < (size_t)o->depth ? o->nloops - o->first : (size_t)o->depth;
  return 1;
}

/* Channel c's share of a call of total elements over nchannels: contiguous,
 * 64-byte aligned; count 0 for channels past the end (they do not run). The
 * host executor and the kernels cut alike. */
RING_HD void ring_channel_share(size_t total, int nchannels, size_t elem_nbytes, int c,
                                size_t *offset, size_t *count) {
  size_t align = 64 / elem_nbytes;
  size_t share = (total + (size_t)nchannels - 1) / (size_t)nchannels;
  share = (share + align - 1) / align * align;
  *offset = (size_t)c * share;
  *count = *offset >= total ? 0 : (total - *offset < share ? total - *offset : share);
}

/* Sets g up for channel share [offset, offset + count) of a call. */
RING_HD void ring_geom_init(struct ring_geom *g, int coll, int nranks, int pos, int root_pos,
                            size_t total_count, size_t offset, size_t count, size_t slot_count,
                            size_t elem_nbytes) {
  g->coll = coll;
  g->nranks = nranks;
  g->pos = pos;
  g->root_pos = root_pos;
  g->total_count = total_count;
  g->offset = offset;
  g->count = count;
  g->slot_count = slot_count;
  g->align_count = 64 / elem_nbytes;
}

/* The ring position whose link to the next carries no data in a chain
 * (broadcast: the rank before the root; reduce: the root), or -1 where every
 * link carries data. */
RING_HD int ring_free_link_sender(int coll, int nranks, int root_pos) {
  if (root_pos < 0 || (coll != RING_BROADCAST && coll != RING_REDUCE)) return -1;
  return coll == RING_BROADCAST ? (root_pos + nranks - 1) % nranks : root_pos;
}

/* A chain's agreement on the device (kernels.cuh): the chain's last rank
 * c[k-1] sends a slot of no data over the free link to c0 before its
 * steps (whose head c0 compares), and another once its first step has
 * compared (which vouches for the whole chain); c0 takes both after its
 * own steps; c0 to c[k-3] each then pass a slot of no data on to the next
 * rank, after their own steps, and c1 to c[k-2] wait for it. So no rank of
 * a chain ends before every link has compared. This rank's place in the
 * chain (0 for c0), or -1 for the collectives that are no chain. */
RING_HD int ring_chain_index(int coll, int nranks, int root_pos, int pos) {
  const int last = ring_free_link_sender(coll, nranks, root_pos);
  return last < 0 ? -1 : (pos - (last + 1) + 2 * nranks) % nranks;
}
/* The slots of the agreement above this rank sends and receives. */
RING_HD void ring_chain_agree_nslots(int coll, int nranks, int root_pos, int pos, size_t *nsends,
                                     size_t *nrecvs) {
  const int i = ring_chain_index(coll, nranks, root_pos, pos);
  *nsends = i == nranks - 1 ? 2 : i >= 0 && i <= nranks - 3;
  *nrecvs = i == 0 ? 2 : i >= 1 && i <= nranks - 2;
}

/* The device kernel's order of one channel's steps: ring_iter's, with a
 * chain's agreement (above) around them. ring_kernel_iter_next gives each
 * step and says whether it is one of the agreement's slots of no data (run
 * with no buffers; count 0). The host's tests run this order on a
 * simulated ring (device_host's RingSteps). */
struct ring_kernel_iter {
  struct ring_iter it;
  int nranks;
  int chain;     /* ring_chain_index */
  int stage;     /* 0 before the steps, 1 the steps, 2 to 4 after them, 5 done */
  int agree_due; /* c[k-1]: its agreement goes after its first step ... */
  int agree_now; /* ... which has just run */
};

RING_HD void ring_kernel_iter_init(struct ring_kernel_iter *ki, const struct ring_geom *g,
                                   int interleave) {
  ring_iter_init(&ki->it, g, interleave);
  ki->nranks = g->nranks;
  ki->chain = ring_chain_index(g->coll, g->nranks, g->root_pos, g->pos);
  ki->stage = 0;
  ki->agree_due = ki->chain == g->nranks - 1;
  ki->agree_now = 0;
}

RING_HD int ring_kernel_iter_next(struct ring_kernel_iter *ki, const struct ring_geom *g,
                                  const int *ring, struct ring_step *st, int *agree) {
  const int k = ki->nranks, i = ki->chain;
  *agree = 1;
  st->src_elem = st->dst_elem = 0;
  st->count = 0;
  if (ki->stage == 0) { /* c[k-1]'s signature over the free link, before its steps */
    ki->stage = 1;
    if (i == k - 1) {
      st->prim = PRIM_SEND;
      return 1;
    }
  }
  if (ki->stage == 1) {
    if (ki->agree_now) { /* c[k-1]'s agreement, once its first step compared */
      ki->agree_now = 0;
      st->prim = PRIM_SEND;
      return 1;
    }
    size_t base;
    int s;
    if (ring_iter_next(&ki->it, &base, &s)) {
      ring_step_at(g, ring, base, s, st);
      *agree = 0;
      ki->agree_now = ki->agree_due;
      ki->agree_due = 0;
      return 1;
    }
    ki->stage = 2;
  }
  if (ki->stage == 2) { /* c0: c[k-1]'s signature (its first slot on the link) */
    ki->stage = 3;
    if (i == 0) {
      st->prim = PRIM_RECV;
      return 1;
    }
  }
  if (ki->stage == 3) { /* c0 to c[k-2]: the agreement */
    ki->stage = 4;
    if (i >= 0 && i <= k - 2) {
      st->prim = PRIM_RECV;
      return 1;
    }
  }
  if (ki->stage == 4) { /* c0 to c[k-3] pass it on */
    ki->stage = 5;
    if (i >= 0 && i <= k - 3) {
      st->prim = PRIM_SEND;
      return 1;
    }
  }
  return 0;
}

/* The slots a channel sends to its next rank and receives from its previous
 * one in one call (g as set up for its share, count > 0). Every loop runs
 * the same primitives (they depend on the step, the position and the root,
 * not on the loop), so: the loops times one loop's sends and receives. The
 * proxies of network hops are told this many are coming. */
RING_HD void ring_channel_nslots(const struct ring_geom *g, const int *ring, size_t *nsends,
                                 size_t *nrecvs) {
  const size_t loop = ring_loop_nelems(g);
  const size_t nloops = (g->count + loop - 1) / loop;
  size_t sends = 0, recvs = 0;
  for (int s = 0; s < ring_loop_nsteps(g); s++) {
    struct ring_step st;
    ring_step_at(g, ring, 0, s, &st);
    sends += st.prim != PRIM_RECV && st.prim != PRIM_RECV_REDUCE_COPY;
    recvs += st.prim >= PRIM_RECV;
  }
  *nsends = nloops * sends;
  *nrecvs = nloops * recvs;
}

#endif
