// WEFT_DETERMINISTIC on device memory: one rank's block reduced from the n
// ranks' contributions in rank order (det_elem.h, the host executor's
// arithmetic), one thread per element, the grid striding over the block.
#include "collectives/exec/device/det_elem.h"

extern "C" __global__ void weft_det_reduce_kernel(struct dev_det_work w) {
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < w.count;
       i += (uint64_t)gridDim.x * blockDim.x)
    det_reduce_elem(w, i);
}

#ifdef WEFT_CUDA_EMU // the host build for tests (tests/device/cuda_emu)
CUDA_EMU_KERNEL(&weft_det_reduce_kernel)
#endif
