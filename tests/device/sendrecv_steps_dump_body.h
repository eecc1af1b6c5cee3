// The body of every sendrecv_steps_dump_*: one compile per compiler (SENDRECV_DUMP_FN
// marks it host, or host and device, code).
static size_t SENDRECV_DUMP_FN(const struct sendrecv_op *ops, int nops, uint64_t chunk_nbytes,
                               int nlanes, int nblocks, int b, struct sendrecv_block *blk,
                               struct sendrecv_move *out, size_t max) {
  sendrecv_block_init(blk, ops, nops, chunk_nbytes, nlanes, nblocks, b);
  size_t n = 0;
  while (!sendrecv_block_finished(blk, ops, chunk_nbytes)) {
    int k = -1;
    for (int t = 0; t < blk->nitems && k < 0; t++) {
      int c = (blk->next + t) % blk->nitems;
      if (sendrecv_item_eligible(blk, ops, chunk_nbytes, c)) k = c;
    }
    if (k < 0) return (size_t)-1; /* unfinished yet nothing eligible: a stuck block */
    if (n < max) {
      out[n].op = blk->op[k];
      out[n].lane = blk->lane[k];
      out[n].chunk = blk->done[k];
    }
    n++;
    blk->done[k]++;
    blk->next = k + 1;
  }
  return n;
}
