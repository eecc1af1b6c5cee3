// sendrecv_steps.h compiled by the host C compiler.
#include <stdlib.h>

#include "sendrecv_steps_dump.h"

#define SENDRECV_DUMP_FN dump
#include "sendrecv_steps_dump_body.h"

size_t sendrecv_steps_dump_c(const struct sendrecv_op *ops, int nops, uint64_t chunk_nbytes,
                             int nlanes, int nblocks, int b, struct sendrecv_move *out,
                             size_t max) {
  struct sendrecv_block *blk = malloc(sizeof *blk);
  if (blk == NULL) return (size_t)-1;
  size_t n = dump(ops, nops, chunk_nbytes, nlanes, nblocks, b, blk, out, max);
  free(blk);
  return n;
}
