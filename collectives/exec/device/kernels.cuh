// The ring kernel: one block per channel runs the channel's share of a ring
// collective, step by step as ring_steps.h says (the host executor runs the
// same steps), with the device primitives of prims_device.cuh. The tree
// kernel does the same for the tree all-reduce (tree_steps.h). Both are
// instantiated for every (datatype, op, protocol) by the files
// gen_kernels.py writes.
#ifndef WEFT_KERNELS_CUH
#define WEFT_KERNELS_CUH

#include "collectives/algo/tree_steps.h"
#include "collectives/exec/device/prims_device.cuh"

// The pre-multiply sum's scalar: read now from device memory
// (weftScalarDevice), or the value the host passed.
template <class T>
__device__ __forceinline__ T dev_premul_scalar(const dev_work &w) {
  T s;
  if (w.scalar_ptr != NULL) s = *static_cast<const T *>(w.scalar_ptr);
  else memcpy(&s, &w.scalar_bits, sizeof s);
  return s;
}

// A kernel launched to overlap the stream's previous one (WEFT_DEVICE_PDL)
// waits for it (done, its memory visible) before it reads anything. Hopper
// and later; the host launches so only where the build has this
// (ring_kernels_wait_for_pdl).
__device__ __forceinline__ void dev_pdl_wait(const dev_work &w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (w.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// ...and once its steps are done, lets the stream's next kernel be
// scheduled while it finishes. Not sooner: a next kernel of another
// library, a whole grid waiting for this one, could fill the SMs before a
// peer's ring kernel (ranks sharing the GPU) is resident, which this one
// would then wait for forever; with every step done it waits for no one.
__device__ __forceinline__ void dev_pdl_release(const dev_work &w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (w.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A block that gives up (whatever the reason: the comm is broken either
// way) poisons every channel of the comm, not only its own, so that every
// peer's blocks hear it on every channel, also on those that this rank's
// launch does not run (counts that differ split into different channel
// counts). Thread 0.
__device__ __forceinline__ void dev_ring_poison_all(const dev_work &w, const dev_watch &watch) {
  if (threadIdx.x == 0)
    for (int c = 0; c < w.comm_nchannels; c++) dev_channel_poison(&w.channels[c], watch);
}

// The watch of block blockIdx.x of launch w.
__device__ __forceinline__ dev_watch dev_watch_of(const dev_work &w) {
  dev_watch watch = {w.abort_flag, w.timeout_ns, w.error,
                     w.mismatch != NULL ? w.mismatch + blockIdx.x : NULL,
                     w.stall != NULL ? w.stall + blockIdx.x : NULL};
  return watch;
}

// One block's share of the launch. Every link's first slot carries the
// call's signature, compared by its receiver (prims_device.cuh), before any
// of its data is used or passed on; so a rank whose all-reduce, all-gather
// or reduce-scatter ends has data that passed every link's comparison. A
// broadcast or reduce is a chain that sends no data over one link of the
// ring (into the broadcast's root, out of the reduce's root), and a rank's
// data there depends on the links upstream only: the chain ends with the
// agreement of ring_chain_index (slots of no data, the first of them over
// that link), so that no rank ends before every link has compared. A block
// that gives up poisons every channel of the comm (dev_ring_poison_all).
template <class R, int PROTO>
__device__ __forceinline__ void ring_kernel_run(const dev_work &w) {
  typedef typename R::T T;
  dev_channel *ch = &w.channels[blockIdx.x];
  size_t offset, count;
  ring_channel_share(w.count, w.nchannels, sizeof(T), blockIdx.x, &offset, &count);
  if (count == 0) return; // as the host: channels past the end do not run
  int root_pos = -1;
  if (w.coll == RING_BROADCAST || w.coll == RING_REDUCE)
    for (int i = 0; i < ch->nranks; i++)
      if (ch->ring[i] == w.root) root_pos = i;

  const int k = ch->nranks;
  dev_prims<R, PROTO> p;
  p.init(ch, dev_watch_of(w), w.divisor, dev_premul_scalar<T>(w));
  if (p.poisoned()) { // an earlier kernel gave up here: the counters are not to be trusted
    p.give_up();        // the rest of the channel learns it too (a network hop's proxy as well)
    dev_ring_poison_all(w, p.watch);
    return;
  }
  p.sign(w.sig, ch->ring[(ch->ring_pos + k - 1) % k], ch->ring[(ch->ring_pos + 1) % k]);
  struct ring_geom g;
  ring_geom_init(&g, w.coll, ch->nranks, ch->ring_pos, root_pos, w.count, offset, count,
                 p.slot_count(), sizeof(T));
  const T *src = static_cast<const T *>(w.sendbuf);
  T *dst = static_cast<T *>(w.recvbuf);
  // w.interleave loops at a time, step by step, as every rank of the ring,
  // with a chain's agreement around them (ring_kernel_iter): its slots of
  // no data run with no buffers. c[k-1]'s first one goes before its steps,
  // so that its head is compared even where every rank takes itself for
  // c[k-1] (and so receives first).
  struct ring_kernel_iter order;
  ring_kernel_iter_init(&order, &g, w.interleave);
  struct ring_step st;
  int agree;
  bool ok = true;
  while (ok && ring_kernel_iter_next(&order, &g, ch->ring, &st, &agree)) {
    if (agree) {
      ok = p.run_step(st.prim, src, NULL, 0, false, false);
      continue;
    }
    const T *sp = ring_prim_has_src(st.prim) ? src + st.src_elem : NULL;
    T *dp = ring_prim_has_dst(st.prim) ? dst + st.dst_elem : NULL;
    ok = p.run(st.prim, sp, dp, st.count);
  }
  if (!ok) { // error says why; the host reports it
    p.give_up();
    dev_ring_poison_all(w, p.watch);
    return;
  }
  dev_pdl_release(w);
  p.finish();
}

template <class R, int PROTO>
__global__ void __launch_bounds__(DEV_NTHREADS) weft_ring_kernel(dev_work w) {
  dev_pdl_wait(w); // before anything an earlier kernel may have written
  ring_kernel_run<R, PROTO>(w);
  dev_done_report(w.done);
}

// --- the tree all-reduce -------------------------------------------------------

// Where a tree block stopped: every FIFO of its channel poisoned (both
// protocols), so its neighbours and later kernels stop at once. Thread 0.
__device__ __forceinline__ void tree_poison(dev_tree_channel *tc, const dev_watch &watch) {
  uint32_t why = *(volatile uint32_t *)watch.error;
  __threadfence_system(); // our reason is recorded before a peer can see the poison
  for (int i = 0; i < tc->npeers; i++)
    for (int p = 0; p < DEV_NPROTOS; p++) {
      if (tc->send[i][p].ctrl) *(volatile uint32_t *)&tc->send[i][p].ctrl->poison = why ? why : 1;
      if (tc->recv[i][p].ctrl) *(volatile uint32_t *)&tc->recv[i][p].ctrl->poison = why ? why : 1;
    }
  __threadfence_system();
}

// --- LL on a tree channel: a step's primitives as one -------------------------
//
// Under LL (small messages, where latency is all) each (key, part) step of
// tree_steps.h runs whole: up(i) at a rank with two children is one pass
// that awaits both children's lines at once, reduces them into the input in
// the steps' order ((input op c0) op c1, as every executor does) and sends
// to the parent; down(i) takes the parent's line and sends it to every
// child in the same pass. Primitive by primitive, each child's line, the
// partial result in dst and each child's send were a step, a barrier and a
// dependent load of their own. The FIFO traffic is the steps': a slot per
// primitive on its link, in the same order, with the same credits and
// signatures, so a peer running either form meets the same slots.

// A group's primitives at most: a root's up(i) and down(i) together.
#define TREE_LL_MAX_PRIMS (2 * TREE_MAX_CHILDREN)

struct tree_ll_links {
  int nrecv, nsend;
  int recv[TREE_LL_MAX_PRIMS]; // the channel's links the group receives on, in step order
  int send[TREE_LL_MAX_PRIMS];
  int recv_of[TREE_LL_MAX_PRIMS]; // per step: its index in recv / send, -1: none
  int send_of[TREE_LL_MAX_PRIMS];
};

// Thread 0, before the group moves a line: a credit on every link it sends
// on, the signature in the call's first slot of each, and the signature of
// every link's first slot it receives (compared). The first data line of
// each link received is loaded with the signature's lines, so the common
// small case (one line) needs no second look after the barrier: pre[k]
// holds it where pre_ok[k]. False when the block must give up.
template <int PROTO>
__device__ __forceinline__ bool tree_ll_begin(dev_tree_channel *tc, const dev_watch &watch,
                                              const tree_ll_links &k, const uint64_t sig[2],
                                              const uint64_t *send_step, uint64_t *head_seen,
                                              const uint64_t *send_first,
                                              const uint64_t *recv_step,
                                              const uint64_t *recv_first, uint4 *pre,
                                              bool *pre_ok) {
  for (int i = 0; i < k.nsend; i++) {
    const int j = k.send[i];
    dev_fifo *f = &tc->send[j][PROTO];
    if (send_step[j] - head_seen[j] >= f->nslots) {
      const uint64_t start = dev_clock_ns();
      uint32_t spins = 0;
      for (;;) { // an acquire lets the step go; the spins between are volatile
        head_seen[j] = dev_ld_acquire_u64(&f->ctrl->head);
        if (send_step[j] - head_seen[j] < f->nslots) break;
        while (send_step[j] - dev_ld_volatile_u64(&f->ctrl->head) >= f->nslots)
          if (dev_watch_expired(watch, start, &spins, f,
                                k.nrecv > 0 ? &tc->recv[k.recv[0]][PROTO] : NULL, tc->peer[j],
                                DEV_STALL_SEND, send_step[j]))
            return false;
      }
    }
    if (send_step[j] == send_first[j]) { // the call's first slot here: its head
      dev_ll_sig_put(*f, send_step[j], sig);
    }
  }
  // every first slot's head and every first data line, loaded together
  uint4 head[TREE_LL_MAX_PRIMS][2];
  bool head_ok[TREE_LL_MAX_PRIMS];
  int waiting = 0;
  for (int i = 0; i < k.nrecv; i++) {
    const int j = k.recv[i];
    head_ok[i] = recv_step[j] != recv_first[j];
    pre_ok[i] = false;
    waiting += !head_ok[i];
  }
  if (waiting == 0) return true;
  const uint64_t start = dev_clock_ns();
  uint32_t spins = 0;
  for (;;) {
    int left = 0, stalled = -1, also = -1; // the first two pending links, in step order
    for (int i = 0; i < k.nrecv; i++) {
      const int j = k.recv[i];
      if (head_ok[i] && pre_ok[i]) continue;
      const dev_fifo &f = tc->recv[j][PROTO];
      const char *slot = f.slots + (recv_step[j] % f.nslots) * f.slot_nbytes;
      const uint4 *h = reinterpret_cast<const uint4 *>(slot);
      const uint32_t flag = ll_flag(recv_step[j]);
      if (!head_ok[i]) {
        head[i][0] = dev_ld_volatile_line(h);
        head[i][1] = dev_ld_volatile_line(h + 1);
      }
      pre[i] = dev_ld_volatile_line(reinterpret_cast<const uint4 *>(slot + DEV_SLOT_HEADER_NBYTES));
      pre_ok[i] = ll_line_ready(reinterpret_cast<const uint32_t *>(&pre[i]), flag);
      if (!head_ok[i] &&
          ll_line_ready(reinterpret_cast<const uint32_t *>(&head[i][0]), flag) &&
          ll_line_ready(reinterpret_cast<const uint32_t *>(&head[i][1]), flag)) {
        head_ok[i] = true;
        const uint64_t theirs[2] = {ll_line_data(reinterpret_cast<const uint32_t *>(&head[i][0])),
                                    ll_line_data(reinterpret_cast<const uint32_t *>(&head[i][1]))};
        uint64_t keyed[2];
        dev_sig_keyed(sig, recv_step[j], keyed);
        if (theirs[0] != keyed[0] || theirs[1] != keyed[1]) {
          dev_mismatch_record(watch.mismatch, watch.error, DEV_MISMATCH_CALL, tc->peer[j],
                              recv_step[j], recv_step[j], sig, theirs);
          return false;
        }
      }
      // the data line may come later than the head (a slot of several
      // lines): the pass after the barrier waits for it then
      if (!head_ok[i]) {
        left++;
        if (stalled < 0) stalled = i;
        else if (also < 0) also = i;
      }
    }
    if (left == 0) return true;
    const int j = k.recv[stalled];
    if (dev_watch_expired(watch, start, &spins, &tc->recv[j][PROTO],
                          also >= 0 ? &tc->recv[k.recv[also]][PROTO] : NULL, tc->peer[j],
                          DEV_STALL_RECV, recv_step[j]))
      return false;
  }
}

// One (key, part) step of a tree channel under LL: its primitives st[0..n)
// (of one piece: the same elements), link[] the channel's link of each
// geometry peer. src and dst are the call's buffers. False when the block
// gave up.
template <class R>
__device__ bool tree_ll_group(dev_tree_channel *tc, const dev_watch &watch, const uint64_t sig[2],
                              const tree_step *st, int n, const int *link, uint64_t *send_step,
                              uint64_t *recv_step, const uint64_t *send_first,
                              const uint64_t *recv_first, uint64_t *head_seen,
                              const typename R::T *src, typename R::T *dst, int divisor,
                              typename R::T scalar) {
  typedef typename R::T T;
  const int PROTO = DEV_PROTO_LL;
  tree_ll_links k;
  k.nrecv = k.nsend = 0;
  for (int i = 0; i < n; i++) {
    k.recv_of[i] = st[i].recv_peer >= 0 ? k.nrecv : -1;
    if (st[i].recv_peer >= 0) k.recv[k.nrecv++] = link[st[i].recv_peer];
    k.send_of[i] = st[i].send_peer >= 0 ? k.nsend : -1;
    if (st[i].send_peer >= 0) k.send[k.nsend++] = link[st[i].send_peer];
  }
  uint4 pre[TREE_LL_MAX_PRIMS];
  bool pre_ok[TREE_LL_MAX_PRIMS];
  int bad = 0;
  if (threadIdx.x == 0)
    bad = !tree_ll_begin<PROTO>(tc, watch, k, sig, send_step, head_seen, send_first, recv_step,
                                recv_first, pre, pre_ok);
  if (__syncthreads_or(bad) != 0) return false;

  const size_t elem = st[0].elem, nbytes = st[0].count * sizeof(T);
  size_t nlines = (nbytes + DEV_LL_LINE_DATA_NBYTES - 1) / DEV_LL_LINE_DATA_NBYTES;
  if (nlines == 0) nlines = 1; // an empty payload still moves a line
  const T *in = src + elem;
  T *out = dst + elem;
  const uint64_t start = dev_clock_ns();
  bool gave_up = false;
  for (size_t l = threadIdx.x; l < nlines && !gave_up; l += blockDim.x) {
    typedef union {
      uint64_t w;
      T e[8 / sizeof(T)];
    } word;
    // this rank's own input first: its load is under way while the
    // peers' lines are awaited; then every received line, looked at together
    word own, got[TREE_LL_MAX_PRIMS];
    own.w = dev_prims<R, PROTO>::ll_load(in, l * 8, nbytes);
    if (R::premul) {
#pragma unroll
      for (int e = 0; e < (int)(8 / sizeof(T)); e++) own.e[e] = R::mul(own.e[e], scalar);
    }
    uint32_t ready = 0, spins = 0;
    const uint32_t all = (1u << k.nrecv) - 1;
    if (l == 0 && threadIdx.x == 0)
      for (int i = 0; i < k.nrecv; i++)
        if (pre_ok[i]) {
          got[i].w = ll_line_data(reinterpret_cast<const uint32_t *>(&pre[i]));
          ready |= 1u << i;
        }
    while (ready != all) {
      int stalled = -1, also = -1; // the first two pending links, in step order
      for (int i = 0; i < k.nrecv; i++) {
        if (ready & (1u << i)) continue;
        const int j = k.recv[i];
        const dev_fifo &f = tc->recv[j][PROTO];
        const uint4 *lines = reinterpret_cast<const uint4 *>(
            f.slots + (recv_step[j] % f.nslots) * f.slot_nbytes + DEV_SLOT_HEADER_NBYTES);
        const uint4 line = dev_ld_volatile_line(lines + l);
        if (ll_line_ready(reinterpret_cast<const uint32_t *>(&line), ll_flag(recv_step[j]))) {
          got[i].w = ll_line_data(reinterpret_cast<const uint32_t *>(&line));
          ready |= 1u << i;
        } else if (stalled < 0) {
          stalled = i;
        } else if (also < 0) {
          also = i;
        }
      }
      if (ready == all) break;
      // the stall record names the first link still awaited (the same in
      // every thread whose line waits on it); poison on the next is seen too
      const int j = k.recv[stalled];
      if (dev_watch_expired(watch, start, &spins, &tc->recv[j][PROTO],
                            also >= 0 ? &tc->recv[k.recv[also]][PROTO] : NULL, tc->peer[j],
                            DEV_STALL_RECV, recv_step[j])) {
        gave_up = true; // the block's other threads learn it below
        break;
      }
    }
    if (gave_up) break;
    // the steps in order, as the primitives would run them
    word acc;
    acc.w = 0;
    bool held = false; // acc holds what the group wrote to dst so far
    for (int i = 0; i < n; i++) {
      const int prim = st[i].prim;
      word v, b;
      const bool recv = k.recv_of[i] >= 0, has_src = ring_prim_has_src(prim);
      if (has_src) {
        if (st[i].src_own) b.w = own.w;
        else if (held) b.w = acc.w;
        else b.w = dev_prims<R, PROTO>::ll_load(out, l * 8, nbytes);
      }
      if (recv) {
        v.w = got[k.recv_of[i]].w;
        if (has_src) {
#pragma unroll
          for (int e = 0; e < (int)(8 / sizeof(T)); e++) v.e[e] = R::op(v.e[e], b.e[e]);
        }
      } else {
        v.w = b.w;
      }
      if (st[i].divide && divisor > 1) {
#pragma unroll
        for (int e = 0; e < (int)(8 / sizeof(T)); e++) v.e[e] = R::div(v.e[e], divisor);
      }
      if (ring_prim_has_dst(prim)) {
        acc.w = v.w;
        held = true;
      }
      if (k.send_of[i] >= 0) {
        const int j = k.send[k.send_of[i]];
        const dev_fifo &f = tc->send[j][PROTO];
        uint4 *lines = reinterpret_cast<uint4 *>(f.slots + (send_step[j] % f.nslots) * f.slot_nbytes +
                                                 DEV_SLOT_HEADER_NBYTES);
        uint4 line;
        ll_line_pack(v.w, ll_flag(send_step[j]), reinterpret_cast<uint32_t *>(&line));
        dev_st_volatile_line(lines + l, line);
      }
    }
    if (held && l * 8 < nbytes) dev_prims<R, PROTO>::ll_store(out, l * 8, nbytes, acc.w);
  }
  // one barrier: the block agrees, and every thread's loads of the slots
  // are done before their credits go back
  if (__syncthreads_or(gave_up) != 0) return false;
  for (int i = 0; i < k.nrecv; i++) {
    const int j = k.recv[i];
    if (threadIdx.x == 0) dev_st_volatile_u64(&tc->recv[j][PROTO].ctrl->head, recv_step[j] + 1);
    recv_step[j]++;
  }
  for (int i = 0; i < k.nsend; i++) send_step[k.send[i]]++;
  return true;
}

// One block's part of a tree all-reduce: channel blockIdx.x's tree part (both
// trees when the launch has one channel), as tree_steps.h orders it. The
// primitives are bound, step by step, to the FIFOs of the step's links; each
// link's steps (and what thread 0 saw of its peer's counters) are kept here
// between the steps that use it and written back for the next launch.
template <class R, int PROTO>
__device__ __forceinline__ void tree_kernel_run(const dev_work &w) {
  typedef typename R::T T;
  dev_tree_channel *tc = &w.trees[blockIdx.x];
  const int np = tc->npeers;
  const dev_watch watch = dev_watch_of(w);
  int any = 0;
  if (threadIdx.x == 0) {
    // every link's pair loaded at once, then the first poison in link order
    // taken: loads chained by a short-circuit would add a round trip per
    // FIFO (a pointer, then its word) to every launch's start
    uint32_t ps[TREE_MAX_PEERS], pr[TREE_MAX_PEERS];
#pragma unroll
    for (int i = 0; i < TREE_MAX_PEERS; i++) {
      ps[i] = i < np ? dev_fifo_poison(tc->send[i][PROTO]) : 0;
      pr[i] = i < np ? dev_fifo_poison(tc->recv[i][PROTO]) : 0;
    }
    uint32_t poison = 0;
#pragma unroll
    for (int i = TREE_MAX_PEERS - 1; i >= 0; i--)
      if (ps[i] != 0 || pr[i] != 0) poison = ps[i] != 0 ? ps[i] : pr[i];
    any = poison != 0;
    if (any && *(volatile uint32_t *)watch.error == 0)
      *(volatile uint32_t *)watch.error = dev_poison_why(poison);
    if (any) // an earlier kernel gave up here: every tree channel (as dev_ring_poison_all)
      for (int c = 0; c < w.comm_nchannels; c++) tree_poison(&w.trees[c], watch);
  }
  if (__syncthreads_or(any) != 0) return;

  // each link's steps where the launch began: its first slots each way
  // carry and check the signature (every link carries data both ways)
  uint64_t send_step[TREE_MAX_PEERS], recv_step[TREE_MAX_PEERS];
  uint64_t send_first[TREE_MAX_PEERS], recv_first[TREE_MAX_PEERS];
  uint64_t head_seen[TREE_MAX_PEERS], tail_seen[TREE_MAX_PEERS];
  for (int i = 0; i < np; i++) {
    send_step[i] = send_first[i] = tc->send[i][PROTO].step;
    recv_step[i] = recv_first[i] = tc->recv[i][PROTO].step;
    head_seen[i] = tc->send[i][PROTO].seen;
    tail_seen[i] = tc->recv[i][PROTO].seen;
  }
  dev_prims<R, PROTO> p;
  p.init_fifos(&tc->send[0][PROTO], &tc->recv[0][PROTO], watch, w.divisor,
               dev_premul_scalar<T>(w));
  p.sign(w.sig, tc->peer[0], tc->peer[0]);
  int bound_send = 0, bound_recv = 0;

  struct tree_geom g;
  if (w.tree_small) // the tree of small calls, whole
    tree_geom_init_trees(&g, &tc->link_small, 1, w.nchannels, blockIdx.x, w.count, sizeof(T),
                         p.slot_count());
  else
    tree_geom_init(&g, tc->links, w.nchannels, blockIdx.x, w.count, sizeof(T), p.slot_count());
  int link[TREE_MAX_PEERS]; // the geometry's peer i is the channel's link link[i]
  for (int i = 0; i < g.npeers; i++) {
    link[i] = 0;
    for (int j = 0; j < np; j++)
      if (tc->peer[j] == g.peer[i]) link[i] = j;
  }
  const T *src = static_cast<const T *>(w.sendbuf);
  T *dst = static_cast<T *>(w.recvbuf);
  struct tree_iter order;
  struct tree_step st;
  bool ok = true;
  tree_iter_init(&order, &g);
  if (PROTO == DEV_PROTO_LL) { // a step's primitives as one (tree_ll_group)
    struct tree_step group[TREE_LL_MAX_PRIMS];
    int n = 0;
    while (ok && tree_iter_next(&g, &order, &group[n])) {
      if (++n < order.nsteps) continue; // the step's next primitive
      // a root's up(i) and, next in its order, its down(i): one pass too
      // (the result goes down as soon as it is reduced)
      if (order.up && g.part[order.part].links.parent == TREE_NONE) {
        struct tree_iter next = order;
        struct tree_step more[TREE_MAX_CHILDREN];
        int m = 0;
        while (m < TREE_MAX_CHILDREN && tree_iter_next(&g, &next, &more[m])) {
          m++;
          if (next.j >= next.nsteps) break;
        }
        if (m > 0 && !next.up && next.part == order.part && next.piece == order.piece) {
          for (int i = 0; i < m; i++) group[n++] = more[i];
          order = next;
        }
      }
      ok = tree_ll_group<R>(tc, watch, w.sig, group, n, link, send_step, recv_step, send_first,
                            recv_first, head_seen, src, dst, w.divisor, p.scalar);
      n = 0;
    }
  }
  while (PROTO != DEV_PROTO_LL && ok && tree_iter_next(&g, &order, &st)) {
    if (st.send_peer >= 0 && link[st.send_peer] != bound_send) {
      send_step[bound_send] = p.send.step;
      head_seen[bound_send] = p.head_seen;
      bound_send = link[st.send_peer];
      p.send = tc->send[bound_send][PROTO];
      p.send.step = send_step[bound_send];
      p.head_seen = head_seen[bound_send];
      p.sig_send_at = send_first[bound_send];
      p.send_peer = tc->peer[bound_send];
    }
    if (st.recv_peer >= 0 && link[st.recv_peer] != bound_recv) {
      recv_step[bound_recv] = p.recv.step;
      tail_seen[bound_recv] = p.tail_seen;
      bound_recv = link[st.recv_peer];
      p.recv = tc->recv[bound_recv][PROTO];
      p.recv.step = recv_step[bound_recv];
      p.tail_seen = tail_seen[bound_recv];
      p.sig_recv_at = recv_first[bound_recv];
      p.sig_peer = tc->peer[bound_recv];
    }
    const T *sp = ring_prim_has_src(st.prim) ? (st.src_own ? src : dst) + st.elem : NULL;
    T *dp = ring_prim_has_dst(st.prim) ? dst + st.elem : NULL;
    ok = p.run_step(st.prim, sp, dp, st.count, st.src_own != 0, st.divide != 0);
  }
  if (PROTO != DEV_PROTO_LL) { // the bound links' counters, where p kept them
    send_step[bound_send] = p.send.step;
    head_seen[bound_send] = p.head_seen;
    recv_step[bound_recv] = p.recv.step;
    tail_seen[bound_recv] = p.tail_seen;
  }
  if (ok) dev_pdl_release(w);
  if (threadIdx.x == 0) { // error says why a block gave up; the host reports it
    if (!ok) // every tree channel, this one among them (as dev_ring_poison_all)
      for (int c = 0; c < w.comm_nchannels; c++) tree_poison(&w.trees[c], watch);
    for (int i = 0; i < np; i++) {
      tc->send[i][PROTO].step = send_step[i];
      tc->recv[i][PROTO].step = recv_step[i];
      tc->send[i][PROTO].seen = head_seen[i];
      tc->recv[i][PROTO].seen = tail_seen[i];
    }
  }
}

template <class R, int PROTO>
__global__ void __launch_bounds__(DEV_NTHREADS) weft_tree_kernel(dev_work w) {
  dev_pdl_wait(w); // before anything an earlier kernel may have written
  tree_kernel_run<R, PROTO>(w);
  dev_done_report(w.done);
}

#endif
