// Sizes that overflow: allocations whose rounding would wrap, registrations
// past the end of the address space, counts whose byte size (times the rank
// count) does not fit a size_t. Each is weftInvalidArgument with a message,
// and nothing is written.
#include <gtest/gtest.h>

#include <stdint.h>
#include <string.h>

#include <string>
#include <vector>

#include "harness.h"

using namespace weft_test;

namespace {

constexpr size_t kMiB = 1u << 20;

bool has(const char *text, const char *needle) { return strstr(text, needle) != nullptr; }

// Sizes around every boundary that used to wrap or that no object can have.
std::vector<size_t> huge_sizes() {
  return {SIZE_MAX,
          SIZE_MAX - 1,
          SIZE_MAX - 2 * kMiB + 2,  // rounded up to 2 MiB, this was 0
          SIZE_MAX - 2 * kMiB + 1,
          SIZE_MAX - 4096 + 2,
          SIZE_MAX / 2 + 1,
          (size_t)PTRDIFF_MAX,
          (size_t)PTRDIFF_MAX - 2 * kMiB + 1};
}

TEST(Sizes, MemAllocHostRefusesWhatCannotExist) {
  for (size_t n : huge_sizes()) {
    void *p = reinterpret_cast<void *>(uintptr_t{0x5a5a});
    EXPECT_EQ(weftMemAllocHost(&p, n), weftInvalidArgument) << n;
    EXPECT_EQ(p, reinterpret_cast<void *>(uintptr_t{0x5a5a})) << "ptr written for " << n;
    EXPECT_TRUE(has(weftGetLastError(nullptr), "larger than any object"))
        << n << ": " << weftGetLastError(nullptr);
    p = reinterpret_cast<void *>(uintptr_t{0x5a5a});
    EXPECT_EQ(weftMemAlloc(&p, n), weftInvalidArgument) << n;
    EXPECT_EQ(p, reinterpret_cast<void *>(uintptr_t{0x5a5a})) << "ptr written for " << n;
  }
  // sizes on either side of the 2 MiB and 64 KiB thresholds still work,
  // and the whole block is writable
  for (size_t n : {size_t{1}, size_t{4095}, size_t{64 << 10} + 1, 2 * kMiB - 1, 2 * kMiB + 3}) {
    void *p = nullptr;
    ASSERT_EQ(weftMemAllocHost(&p, n), weftSuccess) << n << ": " << weftGetLastError(nullptr);
    ASSERT_NE(p, nullptr);
    memset(p, 0xa5, n);
    EXPECT_EQ(static_cast<unsigned char *>(p)[n - 1], 0xa5);
    EXPECT_EQ(weftMemFree(p), weftSuccess);
  }
}

class SizesOneRank : public testing::Test {
 protected:
  void SetUp() override {
    weftUniqueId id;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess) << weftGetLastError(nullptr);
    ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess) << weftGetLastError(nullptr);
  }
  void TearDown() override { EXPECT_EQ(weftCommDestroy(comm), weftSuccess); }
  weftComm_t comm = nullptr;
};

TEST_F(SizesOneRank, RegisterRefusesRangesPastTheAddressSpace) {
  std::vector<char> buf(256);
  void *handle = reinterpret_cast<void *>(uintptr_t{0x5a5a});
  for (size_t n : {SIZE_MAX, SIZE_MAX - 1, (size_t)PTRDIFF_MAX + 1,
                   (size_t)(UINTPTR_MAX - (uintptr_t)buf.data()) + 1}) {
    EXPECT_EQ(weftCommRegister(comm, buf.data(), n, &handle), weftInvalidArgument) << n;
    EXPECT_EQ(handle, reinterpret_cast<void *>(uintptr_t{0x5a5a})) << "handle written for " << n;
    EXPECT_TRUE(has(weftGetLastError(nullptr), "CommRegister")) << weftGetLastError(nullptr);
  }
  ASSERT_EQ(weftCommRegister(comm, buf.data(), buf.size(), &handle), weftSuccess)
      << weftGetLastError(nullptr);
  EXPECT_EQ(weftCommDeregister(comm, handle), weftSuccess);
}

RunOptions warnings_allowed() {
  RunOptions o;
  o.allow_warnings = true;  // each refusal is logged
  return o;
}

// Every entry point with a count, on 3 ranks (so that count * size * nranks
// wraps where count * size alone does not): refused on each rank with a
// message, and the output untouched.
TEST(SizesThreeRanks, CountsWhoseBytesOverflow) {
  auto status = run_ranks(3, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<unsigned char> in(64, 0x11), out(64, 0x5a);
    const size_t counts[] = {SIZE_MAX, SIZE_MAX / 2 + 1,  // count * 2 wraps
                             SIZE_MAX / 8 + 1,            // count * 8 wraps
                             SIZE_MAX / (3 * 8) + 1,      // count * 8 * 3 wraps
                             SIZE_MAX / 16 / 3 + 1};      // the first count refused
    for (size_t count : counts) {
      for (weftDataType_t t : {weftFloat64, weftBfloat16, weftInt8}) {
        struct Call {
          const char *name;
          weftResult_t res;
        } calls[] = {
            {"AllReduce", weftAllReduce(in.data(), out.data(), count, t, weftSum, comm, nullptr)},
            {"AllGather", weftAllGather(in.data(), out.data(), count, t, comm, nullptr)},
            {"ReduceScatter",
             weftReduceScatter(in.data(), out.data(), count, t, weftSum, comm, nullptr)},
            {"Broadcast", weftBroadcast(in.data(), out.data(), count, t, 0, comm, nullptr)},
            {"Reduce", weftReduce(in.data(), out.data(), count, t, weftMax, 0, comm, nullptr)},
            {"Send", weftSend(in.data(), count, t, (ctx.rank + 1) % 3, comm, nullptr)},
            {"Recv", weftRecv(out.data(), count, t, (ctx.rank + 2) % 3, comm, nullptr)},
            {"AlltoAll", weftAlltoAll(in.data(), out.data(), count, t, comm, nullptr)},
            {"Gather", weftGather(in.data(), out.data(), count, t, 0, comm, nullptr)},
            {"Scatter", weftScatter(in.data(), out.data(), count, t, 0, comm, nullptr)},
        };
        for (const Call &c : calls) {
          if (c.res != weftInvalidArgument)
            return rank_fail(ctx, "%s of %zu elements of type %d: %s", c.name, count, (int)t,
                             weftGetErrorString(c.res));
          if (!has(weftGetLastError(nullptr), "too large"))
            return rank_fail(ctx, "%s: message \"%s\"", c.name, weftGetLastError(nullptr));
        }
        for (unsigned char b : out)
          if (b != 0x5a) return rank_fail(ctx, "output written by a refused call");
      }
    }
    weftCommDestroy(comm);
    return 0;
  }, warnings_allowed());
  for (size_t r = 0; r < status.size(); r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
