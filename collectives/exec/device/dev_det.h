/* WEFT_DETERMINISTIC on device memory (device_det.c, kernels_det.cu): what
 * the reduction kernel takes. It reduces the n contributions to one rank's
 * block, laid out stride bytes apart from in (rank 0's first), into out,
 * in rank order (collectives/algo/det_ops.h). C and CUDA. */
#ifndef WEFT_DEV_DET_H
#define WEFT_DEV_DET_H

#include <stdint.h>

struct dev_det_work {
  const void *in;
  uint64_t stride;   /* bytes from one rank's contribution to the next */
  void *out;
  uint64_t count;    /* elements of the block */
  int32_t n;         /* ranks */
  int32_t datatype;  /* weftDataType_t */
  int32_t op;        /* weftSum, weftProd, weftMax, weftMin or weftAvg */
  int32_t divisor;   /* weftAvg: n; else 1 */
  int32_t premul;    /* each contribution times the scalar first (a pre-multiply sum) */
  const void *scalar_ptr; /* the scalar in device memory, or NULL: scalar_bits */
  uint64_t scalar_bits;
};

#endif
