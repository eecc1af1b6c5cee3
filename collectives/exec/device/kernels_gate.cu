// The gate a comm's launch goes behind on a stream other than the comm's
// last one (launch_done.h): one warp that holds the stream until every
// block of that last launch has ended, so that the comm's kernels run one
// after another (each carries on the FIFO steps the one before left)
// without an event recorded after every launch. One warp takes almost no
// room beside the kernels it waits for, which may themselves wait for a
// peer rank's kernel to become resident on the same GPU. Like a stream
// waiting on an event, it waits for that launch's end and nothing else: it
// has no timeout of its own (the launch it waits for has one, and an abort
// ends it), and it never opens early, which would let the comm's kernels
// overlap and their reports go out of order.
#include "collectives/exec/device/prims_device.cuh"

extern "C" __global__ void weft_done_gate(const uint64_t *ended, uint64_t seq, int nblocks) {
  if (threadIdx.x != 0) return;
  for (int b = 0; b < nblocks; b++)
    while (dev_ld_volatile_u64(&ended[b]) < seq) {
    }
  dev_fence_acq_rel_sys(); // acquire: what those blocks wrote, before the stream goes on
}

#ifdef WEFT_CUDA_EMU // the host build for tests (tests/device/cuda_emu)
CUDA_EMU_KERNEL(&weft_done_gate)
#endif
