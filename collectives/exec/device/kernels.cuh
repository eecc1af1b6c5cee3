// The ring kernel: one block per channel runs the channel's share of a ring
// collective, step by step as ring_steps.h says (the host executor runs the
// same steps), with the device primitives of prims_device.cuh. Instantiated
// for every (datatype, op, protocol) by the files gen_kernels.py writes.
#ifndef WEFT_KERNELS_CUH
#define WEFT_KERNELS_CUH

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

// One block's share of the launch.
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

  dev_prims<R, PROTO> p;
  dev_watch watch = {w.abort_flag, w.timeout_ns, w.error};
  p.init(ch, watch, w.divisor, dev_premul_scalar<T>(w));
  if (p.poisoned()) { // an earlier kernel gave up here: the counters are not to be trusted
    p.give_up();        // the rest of the channel learns it too (a network hop's proxy as well)
    return;
  }
  struct ring_geom g;
  ring_geom_init(&g, w.coll, ch->nranks, ch->ring_pos, root_pos, w.count, offset, count,
                 p.slot_count(), sizeof(T));
  const T *src = static_cast<const T *>(w.sendbuf);
  T *dst = static_cast<T *>(w.recvbuf);
  // w.interleave loops at a time, step by step, as every rank of the ring
  struct ring_iter order;
  ring_iter_init(&order, &g, w.interleave);
  size_t base;
  int s;
  while (ring_iter_next(&order, &base, &s)) {
    struct ring_step st;
    ring_step_at(&g, ch->ring, base, s, &st);
    const T *sp = ring_prim_has_src(st.prim) ? src + st.src_elem : NULL;
    T *dp = ring_prim_has_dst(st.prim) ? dst + st.dst_elem : NULL;
    if (!p.run(st.prim, sp, dp, st.count)) { // error says why; the host reports it
      p.give_up();
      return;
    }
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

#endif
