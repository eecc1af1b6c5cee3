// Shard arithmetic and dtype conversion: pure functions, checked against
// brute force.
#include <gtest/gtest.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "weft_zero.h"

namespace {

// For every count and rank count: shards are disjoint, in rank order, cover
// [0, count) exactly, and each has the padded shard size except at the end.
TEST(ZeroShard, CoverEveryElementOnce) {
  for (size_t count : {0ul, 1ul, 2ul, 3ul, 7ul, 16ul, 17ul, 1000ul, 1001ul, 65537ul}) {
    for (int n = 1; n <= 17; n++) {
      size_t padded = weftZeroPadded(count, n);
      ASSERT_EQ(padded % n, 0u);
      ASSERT_GE(padded, count);
      ASSERT_LT(padded - count, (size_t)n);
      size_t per = padded / n;
      std::vector<int> owner(count, -1);
      for (int r = 0; r < n; r++) {
        weftZeroShard_t s = weftZeroShardOf(count, n, r);
        ASSERT_LE(s.count, per);
        ASSERT_LE(s.offset + s.count, count);
        if (s.count > 0) {
          ASSERT_EQ(s.offset, r * per) << "count " << count << " n " << n;
        }
        for (size_t i = s.offset; i < s.offset + s.count; i++) {
          ASSERT_EQ(owner[i], -1) << "element " << i << " owned twice";
          owner[i] = r;
        }
      }
      for (size_t i = 0; i < count; i++)
        ASSERT_EQ(owner[i], (int)(i / per)) << "count " << count << " n " << n << " i " << i;
    }
  }
}

TEST(ZeroShard, BadRanks) {
  weftZeroShard_t s = weftZeroShardOf(10, 0, 0);
  EXPECT_EQ(s.count, 0u);
  s = weftZeroShardOf(10, 4, 4);
  EXPECT_EQ(s.count, 0u);
  s = weftZeroShardOf(10, 4, -1);
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(weftZeroPadded(10, 0), 0u);
}

// Counts near SIZE_MAX: the shards still tile [0, count) in rank order with
// ceil(count / nranks) elements each but the last ones; the padded count is
// 0 (refused) where it does not fit size_t, and exact where it does.
TEST(ZeroShard, HugeCountsDoNotWrap) {
  const int rank_counts[] = {2, 3, 7, 64, 1 << 30, INT_MAX};
  const size_t counts[] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 2, SIZE_MAX / 2 + 1, SIZE_MAX / 3};
  for (int n : rank_counts)
    for (size_t count : counts) {
      SCOPED_TRACE(testing::Message() << "count " << count << ", " << n << " ranks");
      const size_t per_rank = count / (size_t)n + (count % (size_t)n != 0);
      const bool fits = per_rank <= SIZE_MAX / (size_t)n;
      EXPECT_EQ(weftZeroPadded(count, n), fits ? per_rank * (size_t)n : 0u);
      size_t next = 0;
      // every rank of a small communicator; the first two and last two of a large one
      for (int r = 0; r < n; r = (n > 64 && r == 1) ? n - 2 : r + 1) {
        weftZeroShard_t sh = weftZeroShardOf(count, n, r);
        if (n > 64 && r == n - 2) next = sh.offset;  // the ranks skipped are not checked
        ASSERT_EQ(sh.offset, next) << "rank " << r;
        ASSERT_LE(sh.count, per_rank) << "rank " << r;
        ASSERT_LE(sh.count, count - sh.offset) << "rank " << r;
        if (per_rank <= count - next) {
          ASSERT_EQ(sh.count, per_rank) << "rank " << r;
        }
        next += sh.count;
      }
      EXPECT_EQ(next, count);
    }
  EXPECT_EQ(weftZeroPadded(SIZE_MAX, 3), SIZE_MAX);  // 2^64 - 1 is a multiple of 3
  EXPECT_EQ(weftZeroPadded(SIZE_MAX, 2), 0u);
}

// A parameter straddling ranks: its parts over all shards tile it.
TEST(ZeroShard, ParametersStraddleRanks) {
  const size_t sizes[] = {5, 1, 13, 2, 40, 3};  // one layer of 64 parameters
  size_t layer = 0;
  for (size_t s : sizes) layer += s;
  for (int n = 1; n <= 9; n++) {
    size_t at = 0;
    int straddling = 0;
    for (size_t s : sizes) {
      std::vector<int> seen(s, 0);
      int parts = 0;
      for (int r = 0; r < n; r++) {
        weftZeroShard_t part = weftZeroShardIntersect(weftZeroShardOf(layer, n, r), at, s);
        if (part.count == 0) continue;
        parts++;
        ASSERT_LE(part.offset + part.count, s);
        for (size_t i = part.offset; i < part.offset + part.count; i++) seen[i]++;
      }
      for (size_t i = 0; i < s; i++) ASSERT_EQ(seen[i], 1) << "n " << n << " param at " << at;
      straddling += parts > 1;
      at += s;
    }
    if (n > 1) {
      EXPECT_GT(straddling, 0) << "no parameter straddles " << n << " ranks";
    }
  }
}

float bf16_round_ref(float f) {  // nearest even at 16 bits of mantissa, by integers
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t lower = u & 0xffff, upper = u & 0xffff0000u;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 0x10000))) upper += 0x10000;
  float r;
  memcpy(&r, &upper, 4);
  return r;
}

TEST(ZeroDtype, RoundTrips) {
  std::vector<float> src, back(4), tmp32(4);
  uint16_t half[4];
  // bf16: exact for values with 8 significant bits, nearest even otherwise
  for (float v : {1.0f, -2.5f, 0.0f, 3.0f, 1.00390625f, 1.005859375f, 1e-30f, -65504.f, 3.4e38f}) {
    float in[1] = {v}, out[1];
    ASSERT_EQ(weftZeroFromFloat(in, weftBfloat16, half, 1), weftSuccess);
    ASSERT_EQ(weftZeroToFloat(half, weftBfloat16, out, 1), weftSuccess);
    EXPECT_EQ(out[0], bf16_round_ref(v)) << v;
  }
  // fp16: exact values, ties to even, subnormals, overflow to infinity
  struct Case {
    float in, want;
  } cases[] = {{1.0f, 1.0f},           {65504.f, 65504.f},  {65520.f, INFINITY},
               {1.0009765625f, 1.0009765625f}, {1.00048828125f, 1.0f}, {1.00146484375f, 1.001953125f},
               {5.960464477539063e-08f, 5.960464477539063e-08f}, {2.9802322387695312e-08f, 0.0f},
               {-6.103515625e-05f, -6.103515625e-05f}, {1e-10f, 0.0f}, {-3.0f, -3.0f}};
  for (const Case &c : cases) {
    float out[1];
    ASSERT_EQ(weftZeroFromFloat(&c.in, weftFloat16, half, 1), weftSuccess);
    ASSERT_EQ(weftZeroToFloat(half, weftFloat16, out, 1), weftSuccess);
    EXPECT_EQ(out[0], c.want) << c.in;
  }
  float nan_in = NAN, out;
  weftZeroFromFloat(&nan_in, weftFloat16, half, 1);
  weftZeroToFloat(half, weftFloat16, &out, 1);
  EXPECT_TRUE(isnan(out));
  weftZeroFromFloat(&nan_in, weftBfloat16, half, 1);
  weftZeroToFloat(half, weftBfloat16, &out, 1);
  EXPECT_TRUE(isnan(out));
  // accumulate adds in fp32 and rounds once
  float acc_in[2] = {0.5f, 0.25f};
  float start[2] = {1.0f, 2.0f};
  weftZeroFromFloat(start, weftBfloat16, half, 2);
  ASSERT_EQ(weftZeroAccumulate(half, weftBfloat16, acc_in, 2), weftSuccess);
  weftZeroToFloat(half, weftBfloat16, back.data(), 2);
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[1], 2.25f);
  EXPECT_EQ(weftZeroToFloat(half, weftInt32, back.data(), 1), weftInvalidArgument);
  EXPECT_STRNE(weftZeroLastError(), "");
}

}  // namespace
