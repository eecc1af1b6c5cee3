// p2p_steps.h compiled by the host C compiler.
#include <stdlib.h>

#include "p2p_steps_dump.h"

#define P2P_DUMP_FN dump
#include "p2p_steps_dump_body.h"

size_t p2p_steps_dump_c(const struct p2p_op *ops, int nops, uint64_t chunk_nbytes, int nlanes,
                        int nblocks, int b, struct p2p_move *out, size_t max) {
  struct p2p_block *blk = malloc(sizeof *blk);
  if (blk == NULL) return (size_t)-1;
  size_t n = dump(ops, nops, chunk_nbytes, nlanes, nblocks, b, blk, out, max);
  free(blk);
  return n;
}
