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
    uint32_t poison = 0;
    for (int i = 0; i < np && poison == 0; i++) {
      poison = dev_fifo_poison(tc->send[i][PROTO]);
      if (poison == 0) poison = dev_fifo_poison(tc->recv[i][PROTO]);
    }
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
  while (ok && tree_iter_next(&g, &order, &st)) {
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
  send_step[bound_send] = p.send.step;
  head_seen[bound_send] = p.head_seen;
  recv_step[bound_recv] = p.recv.step;
  tail_seen[bound_recv] = p.tail_seen;
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
