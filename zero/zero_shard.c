/* Shard arithmetic: pure functions of counts and ranks. */
#include <stdint.h>

#include "weft_zero.h"

/* ceil(count / n), which does not wrap where count + n - 1 would */
static size_t per_rank_of(size_t count, size_t n) { return count / n + (count % n != 0); }

size_t weftZeroPadded(size_t count, int nranks) {
  if (nranks <= 0) return 0;
  size_t n = (size_t)nranks, per_rank = per_rank_of(count, n);
  if (per_rank > SIZE_MAX / n) return 0; /* the padded count does not fit size_t */
  return per_rank * n;
}

weftZeroShard_t weftZeroShardOf(size_t count, int nranks, int rank) {
  weftZeroShard_t shard = {0, 0};
  if (nranks <= 0 || rank < 0 || rank >= nranks) return shard;
  size_t per_rank = per_rank_of(count, (size_t)nranks);
  /* (nranks - 1) * ceil(count / nranks) is at most count, or below
   * nranks^2 where count is smaller: no wrap. Past count on ranks that hold
   * padding alone; the end is cut to count without forming begin + per_rank */
  size_t begin = (size_t)rank * per_rank;
  if (begin > count) begin = count;
  shard.offset = begin;
  shard.count = per_rank < count - begin ? per_rank : count - begin;
  return shard;
}

weftZeroShard_t weftZeroShardIntersect(weftZeroShard_t shard, size_t param_offset,
                                       size_t param_count) {
  weftZeroShard_t part = {0, 0};
  size_t begin = shard.offset > param_offset ? shard.offset : param_offset;
  size_t shard_end = shard.offset + shard.count;
  size_t param_end = param_offset + param_count;
  size_t end = shard_end < param_end ? shard_end : param_end;
  if (end <= begin) return part;
  part.offset = begin - param_offset;
  part.count = end - begin;
  return part;
}
