// The p2p schedule of p2p_steps.h as each compiler built it: the host C
// compiler, nvcc's host pass and nvcc's device pass (a one-thread kernel).
// Each writes, for block b of a launch with every lane always ready, the
// order in which the block moves chunks (op index, lane, chunk on the lane),
// up to max, and returns how many chunks the block moves.
#ifndef WEFT_TESTS_P2P_STEPS_DUMP_H
#define WEFT_TESTS_P2P_STEPS_DUMP_H

#include <stddef.h>

#include "collectives/algo/p2p_steps.h"

#ifdef __cplusplus
extern "C" {
#endif

struct p2p_move {
  int op;
  int lane;
  uint64_t chunk;
};

size_t p2p_steps_dump_c(const struct p2p_op *ops, int nops, uint64_t chunk_nbytes, int nlanes,
                        int nblocks, int b, struct p2p_move *out, size_t max);
size_t p2p_steps_dump_nvcc_host(const struct p2p_op *ops, int nops, uint64_t chunk_nbytes,
                                int nlanes, int nblocks, int b, struct p2p_move *out, size_t max);
// -1 without a usable GPU, else the count as above.
long p2p_steps_dump_nvcc_device(const struct p2p_op *ops, int nops, uint64_t chunk_nbytes,
                                int nlanes, int nblocks, int b, struct p2p_move *out, size_t max);

#ifdef __cplusplus
}
#endif
#endif
