// The send/recv schedule of sendrecv_steps.h as each compiler built it: the host C
// compiler, nvcc's host pass and nvcc's device pass (a one-thread kernel).
// Each writes, for block b of a launch with every lane always ready, the
// order in which the block moves chunks (op index, lane, chunk on the lane),
// up to max, and returns how many chunks the block moves.
#ifndef WEFT_TESTS_SENDRECV_STEPS_DUMP_H
#define WEFT_TESTS_SENDRECV_STEPS_DUMP_H

#include <stddef.h>

#include "collectives/algo/sendrecv_steps.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sendrecv_move {
  int op;
  int lane;
  uint64_t chunk;
};

size_t sendrecv_steps_dump_c(const struct sendrecv_op *ops, int nops, uint64_t chunk_nbytes,
                             int nlanes, int nblocks, int b, struct sendrecv_move *out,
                             size_t max);
size_t sendrecv_steps_dump_nvcc_host(const struct sendrecv_op *ops, int nops,
                                     uint64_t chunk_nbytes, int nlanes, int nblocks, int b,
                                     struct sendrecv_move *out, size_t max);
// -1 without a usable GPU, else the count as above.
long sendrecv_steps_dump_nvcc_device(const struct sendrecv_op *ops, int nops,
                                     uint64_t chunk_nbytes, int nlanes, int nblocks, int b,
                                     struct sendrecv_move *out, size_t max);

#ifdef __cplusplus
}
#endif
#endif
