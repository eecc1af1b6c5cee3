/* Shard arithmetic: pure functions of counts and ranks. */
#include "weft_zero.h"

size_t weftZeroPadded(size_t count, int nranks) {
  if (nranks <= 0) return 0;
  size_t n = (size_t)nranks;
  return (count + n - 1) / n * n;
}

weftZeroShard_t weftZeroShardOf(size_t count, int nranks, int rank) {
  weftZeroShard_t shard = {0, 0};
  if (nranks <= 0 || rank < 0 || rank >= nranks) return shard;
  size_t per_rank = weftZeroPadded(count, nranks) / (size_t)nranks;
  size_t begin = (size_t)rank * per_rank;
  size_t end = begin + per_rank;
  if (begin > count) begin = count;
  if (end > count) end = count;
  shard.offset = begin;
  shard.count = end - begin;
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
