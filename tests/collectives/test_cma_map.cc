// Single-copy collectives on buffers from weftMemAllocHost, which peers map
// (collectives/core/mem.c): every collective, datatype and op on mapped buffers
// at offsets that are not cache-line aligned, in place and out of place, on
// 2 to 4 ranks; with streaming stores; ranks mixing mapped and private
// buffers; buffers freed and allocated again; WEFT_CMA_MAP=0; and the
// allocator's table.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll_ref.h"
#include "harness.h"
extern "C" {
#include "collectives/core/comm.h"
#include "collectives/core/mem.h"
}

using namespace weft_test;

namespace {

int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

int mapped_count(weftComm_t comm) { return mem_peer_map_count(reinterpret_cast<weftComm *>(comm)); }

// Every datatype x op for all-reduce, reduce-scatter and reduce, every
// datatype for all-gather and broadcast, in place and out of place, all
// buffers from weft; the count of each case drawn from {1, 1009, 70001}
// (70001 floats span two 256 KiB pieces) and the root of each rooted one,
// seeded.
int mapped_everything(const RankCtx &ctx, weftComm_t comm, uint64_t seed) {
  Rng rng(seed);
  const size_t counts[] = {1, 1009, 70001};
  const int n = ctx.nranks;
  int rc = 0;
  for (int t = 0; t < weftNumTypes && rc == 0; t++)
    for (int ip = 0; ip < 2 && rc == 0; ip++) {
      auto ty = static_cast<weftDataType_t>(t);
      rc = check_coll(ctx, comm, kAllGather, ty, weftSum, counts[rng.next() % 3], ip, true, true,
                      rng.next());
      if (rc == 0)
        rc = check_coll(ctx, comm, kBroadcast, ty, weftSum, counts[rng.next() % 3], ip, true, true,
                        rng.next(), (int)(rng.next() % n));
      for (int op = 0; op < weftNumOps && rc == 0; op++) {
        auto o = static_cast<weftRedOp_t>(op);
        rc = check_coll(ctx, comm, kAllReduce, ty, o, counts[rng.next() % 3], ip, true, true,
                        rng.next());
        if (rc == 0)
          rc = check_coll(ctx, comm, kReduceScatter, ty, o, counts[rng.next() % 3], ip, true,
                          true, rng.next());
        if (rc == 0)
          rc = check_coll(ctx, comm, kReduce, ty, o, counts[rng.next() % 3], ip, true, true,
                          rng.next(), (int)(rng.next() % n));
      }
    }
  return rc;
}

struct MapCase {
  int nranks;
  bool stream;  // WEFT_CMA_STREAM_NBYTES=64K: every copy into a mapped buffer streams
};

class CmaMap : public testing::TestWithParam<MapCase> {};

TEST_P(CmaMap, EveryCollectiveTypeOpOnMappedBuffers) {
  const MapCase mc = GetParam();
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_TIMEOUT", "60"}};
  if (mc.stream) opts.env.push_back({"WEFT_CMA_STREAM_NBYTES", "64K"});
  auto status = run_ranks(mc.nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    int rc = mapped_everything(ctx, comm, seed + mc.nranks);
    // each peer's send and receive buffers were mapped (the count stays
    // within the cache's bound)
    if (rc == 0 && mapped_count(comm) < ctx.nranks - 1)
      rc = rank_fail(ctx, "only %d peer buffers mapped", mapped_count(comm));
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < mc.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Cases, CmaMap,
                         testing::Values(MapCase{2, false}, MapCase{3, false}, MapCase{4, false},
                                         MapCase{2, true}, MapCase{3, true}),
                         [](const testing::TestParamInfo<MapCase> &i) {
                           return "ranks" + std::to_string(i.param.nranks) +
                                  (i.param.stream ? "_stream" : "");
                         });

// Rank 0 keeps to malloc, rank 1 to weft, rank 2 draws per buffer: each
// peer is read or written through the kernel or a mapping as its buffers
// allow, and every result is right. Rank 0 maps rank 1's buffers. Reduces
// run the ring (rank 0's buffers are not mapped) or, with
// WEFT_CMA_REDUCE_KERNEL=1, single-copy through both; the second case also
// streams every copy into a mapped buffer.
class CmaMapMixed : public testing::TestWithParam<bool> {};

TEST_P(CmaMapMixed, PrivateAndMappedBuffersTogether) {
  const uint64_t seed = test_seed();
  const bool kernel = GetParam();
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_TIMEOUT", "60"}};
  if (kernel) {
    opts.env.push_back({"WEFT_CMA_REDUCE_KERNEL", "1"});
    opts.env.push_back({"WEFT_CMA_STREAM_NBYTES", "64K"});
  }
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    Rng shared(seed), own(seed * 31 + ctx.rank);
    int rc = 0;
    for (int i = 0; i < 50 && rc == 0; i++) {
      // the case is the same on every rank; the buffers' origin is not
      const Coll c = static_cast<Coll>(i % 5);
      const auto t = static_cast<weftDataType_t>(shared.next() % weftNumTypes);
      const auto op = static_cast<weftRedOp_t>(shared.next() % weftNumOps);
      const size_t count = 1 + shared.next() % 90000;
      const bool ip = shared.next() % 2;
      const uint64_t s = shared.next();
      bool ws = ctx.rank == 1, wr = ctx.rank == 1;
      if (ctx.rank == 2) ws = own.next() % 2, wr = own.next() % 2;
      rc = check_coll(ctx, comm, c, t, op, count, ip, ws, wr, s, i % 3);
    }
    if (rc == 0 && ctx.rank == 0 && mapped_count(comm) == 0)
      rc = rank_fail(ctx, "rank 0 mapped none of rank 1's buffers");
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(ReduceKernel, CmaMapMixed, testing::Values(false, true),
                         [](const testing::TestParamInfo<bool> &i) {
                           return i.param ? std::string("kernel_stream") : std::string("ring");
                         });

// Buffers freed and allocated again, often at the same addresses: every
// result is right, and the mappings of freed buffers are dropped (the count
// kept stays within its bound).
TEST(CmaMapChurn, MappingsOfFreedBuffersAreDropped) {
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    Rng rng(seed);
    int rc = 0;
    for (int i = 0; i < 40 && rc == 0; i++) {
      const size_t count = 1000 + rng.next() % (3 * 65536);
      rc = check_coll(ctx, comm, static_cast<Coll>(i % 5), weftInt32, weftSum, count, i % 2 == 1,
                      true, true, rng.next(), i % 2);
      if (rc == 0 && mapped_count(comm) > 4 * ctx.nranks + 16)
        rc = rank_fail(ctx, "%d mappings kept after %d calls", mapped_count(comm), i + 1);
    }
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// WEFT_CMA_MAP=0: weft's buffers go through the kernel like any other (a
// reduce too, with WEFT_CMA_REDUCE_KERNEL=1).
TEST(CmaMapOff, NothingMappedAndResultsRight) {
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_CMA_MAP", "0"}, {"WEFT_CMA_REDUCE_KERNEL", "1"},
              {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    int rc = 0;
    for (int c = 0; c < 5 && rc == 0; c++)
      rc = check_coll(ctx, comm, static_cast<Coll>(c), weftFloat32, weftSum, 70001, c % 2 == 1,
                      true, true, seed + c, c % 2);
    if (rc == 0 && mapped_count(comm) != 0)
      rc = rank_fail(ctx, "%d buffers mapped with WEFT_CMA_MAP=0", mapped_count(comm));
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// The allocator: alignment, shareable from 64 KiB, the table's view of each
// range, and frees that take the buffer out of it.
TEST(MemAllocHost, SharesFrom64KiBAndForgetsFreedBuffers) {
  const size_t sizes[] = {1, 4095, 65535, 65536, 100001, 3u << 20};
  for (size_t nbytes : sizes) {
    void *p = nullptr;
    ASSERT_EQ(weftMemAllocHost(&p, nbytes), weftSuccess) << nbytes;
    const uintptr_t align = nbytes >= (2u << 20) ? (2u << 20) : 4096;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % align, 0u) << nbytes;
    memset(p, 0xab, nbytes);
    mem_shared_ref ref;
    mem_shared_find(p, nbytes, &ref);
    if (nbytes >= kMemSharedMinNbytes) {
      EXPECT_GE(ref.fd, 0) << nbytes;
      EXPECT_EQ(ref.base, reinterpret_cast<uintptr_t>(p));
      EXPECT_GE(ref.nbytes, nbytes);
      mem_shared_ref inner;
      mem_shared_find(static_cast<char *>(p) + 100, nbytes - 100, &inner);
      EXPECT_EQ(inner.id, ref.id) << "a range inside the buffer";
      mem_shared_find(static_cast<char *>(p) + 100, ref.nbytes, &inner);
      EXPECT_EQ(inner.fd, -1) << "a range running past the buffer's end";
    } else {
      EXPECT_EQ(ref.fd, -1) << nbytes;
    }
    ASSERT_EQ(weftMemFree(p), weftSuccess);
    mem_shared_find(p, 1, &ref);
    EXPECT_EQ(ref.fd, -1) << "freed buffer still listed, " << nbytes;
  }
  EXPECT_EQ(weftMemFree(nullptr), weftSuccess);
}

// The table of shareable allocations with many at once (a framework's every
// large tensor): random sizes, each found from any range inside it and by
// no range running past it, freed in random order while the rest stay
// found; seeded.
TEST(MemAllocHost, ManyBuffersFoundAndFreedInAnyOrder) {
  Rng rng(20261127);
  struct Buf {
    char *p;
    size_t nbytes;
    uint64_t id;
  };
  std::vector<Buf> bufs(300);
  for (Buf &b : bufs) {
    b.nbytes = kMemSharedMinNbytes + rng.next() % (1u << 20);
    void *p = nullptr;
    ASSERT_EQ(weftMemAllocHost(&p, b.nbytes), weftSuccess);
    b.p = static_cast<char *>(p);
    mem_shared_ref ref;
    mem_shared_find(b.p, b.nbytes, &ref);
    ASSERT_GE(ref.fd, 0) << b.nbytes;
    b.id = ref.id;
  }
  while (!bufs.empty()) {
    for (const Buf &b : bufs) {
      const size_t off = rng.next() % b.nbytes;
      mem_shared_ref ref;
      mem_shared_find(b.p + off, b.nbytes - off, &ref);
      ASSERT_EQ(ref.id, b.id) << "offset " << off << " of " << b.nbytes;
      ASSERT_EQ(ref.base, reinterpret_cast<uintptr_t>(b.p));
      mem_shared_find(b.p + off, ref.nbytes - off + 1, &ref);
      ASSERT_EQ(ref.fd, -1) << "a range past the end of " << b.nbytes;
    }
    const size_t victim = rng.next() % bufs.size();
    ASSERT_EQ(weftMemFree(bufs[victim].p), weftSuccess);
    mem_shared_ref ref;
    mem_shared_find(bufs[victim].p, 1, &ref);
    ASSERT_NE(ref.id, bufs[victim].id) << "a freed buffer is still listed";
    bufs.erase(bufs.begin() + static_cast<ptrdiff_t>(victim));
  }
}

// Forks while another thread allocates and frees small buffers (listed,
// under the allocator's lock): each child allocates too, and none may find
// the lock held by a thread it does not have. Run in a process of its own
// (below), where no earlier call has set anything up.
TEST(MemAllocHost, DISABLED_ForkWhileAnotherThreadAllocatesBody) {
  static volatile int stop = 0;
  pthread_t spinner;
  ASSERT_EQ(pthread_create(&spinner, nullptr, [](void *) -> void * {
    while (!stop) {
      void *p = nullptr;
      if (weftMemAllocHost(&p, 100) == weftSuccess) weftMemFree(p);
    }
    return nullptr;
  }, nullptr), 0);
  int hung = 0;
  const int forks = 300;
  for (int i = 0; i < forks; i++) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(2);
      void *p = nullptr;
      _exit(weftMemAllocHost(&p, 100) == weftSuccess && weftMemFree(p) == weftSuccess ? 0 : 1);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    hung += WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM;
    EXPECT_TRUE(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == 0)) << "child " << i;
  }
  stop = 1;
  pthread_join(spinner, nullptr);
  EXPECT_EQ(hung, 0) << "of " << forks << " children, " << hung << " hung in weftMemAllocHost";
}

TEST(MemAllocHost, ForkWhileAnotherThreadAllocates) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator may be held by the allocating thread at the fork "
                  "(its own lock, not weft's): a child then hangs in malloc";
#endif
  std::string out;
  EXPECT_TRUE(run_test_alone("MemAllocHost.DISABLED_ForkWhileAnotherThreadAllocatesBody", "", 120,
                             &out)) << out;
}

// A forked child gets the buffers as it gets malloc's memory: it reads what
// the parent wrote, its writes stay its own, it offers none of them to peers
// (their pages are the parent's) and frees them; its own new buffers are
// shareable. The parent's buffers are untouched and still shareable.
TEST(MemAllocHost, ForkedChildWritesItsOwnCopy) {
  const size_t sizes[] = {256u << 10, 3u << 20};
  std::vector<unsigned char *> bufs;
  for (size_t nbytes : sizes) {
    void *p = nullptr;
    ASSERT_EQ(weftMemAllocHost(&p, nbytes), weftSuccess);
    memset(p, 0x5a, nbytes);
    bufs.push_back(static_cast<unsigned char *>(p));
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int bad = 0;
    for (size_t i = 0; i < bufs.size(); i++) {
      mem_shared_ref ref;
      mem_shared_find(bufs[i], sizes[i], &ref);
      if (ref.fd != -1) bad |= 1;
      for (size_t k = 0; k < sizes[i]; k += 4093)
        if (bufs[i][k] != 0x5a) bad |= 2;
      memset(bufs[i], 0xc3, sizes[i]);
      if (bufs[i][sizes[i] - 1] != 0xc3) bad |= 4;
    }
    if (weftMemFree(bufs[0]) != weftSuccess) bad |= 8;
    void *fresh = nullptr;
    if (weftMemAllocHost(&fresh, 1u << 20) != weftSuccess) bad |= 16;
    mem_shared_ref ref;
    mem_shared_find(fresh, 1u << 20, &ref);
    if (ref.fd < 0) bad |= 32;
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "child: 1 offered an inherited buffer, 2 read the wrong bytes, 4 could not write, "
         "8 could not free, 16/32 no shareable buffer of its own";
  for (size_t i = 0; i < bufs.size(); i++) {
    size_t wrong = 0;
    for (size_t k = 0; k < sizes[i]; k++) wrong += bufs[i][k] != 0x5a;
    EXPECT_EQ(wrong, 0u) << "bytes of the parent's " << sizes[i] << "-byte buffer the child changed";
    mem_shared_ref ref;
    mem_shared_find(bufs[i], sizes[i], &ref);
    EXPECT_GE(ref.fd, 0) << "the parent's buffer is no longer shareable";
    EXPECT_EQ(weftMemFree(bufs[i]), weftSuccess);
  }
}

// Shareable buffers keep a file descriptor each: they take at most half of
// the process's descriptors (RLIMIT_NOFILE), and past that a buffer is
// private memory, so that the process's own opens still work. In a child
// with a limit of 64.
TEST(MemAllocHost, SharesAtMostHalfTheFileDescriptors) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct rlimit lim = {64, 64};
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) _exit(1);
    int shared = 0, bad = 0;
    std::vector<void *> bufs;
    for (int i = 0; i < 80; i++) {
      void *p = nullptr;
      if (weftMemAllocHost(&p, 64u << 10) != weftSuccess) {
        bad |= 2;
        break;
      }
      memset(p, 0x11, 64u << 10);
      bufs.push_back(p);
      mem_shared_ref ref;
      mem_shared_find(p, 64u << 10, &ref);
      shared += ref.fd >= 0;
    }
    if (shared == 0 || shared > 32) bad |= 4;
    int fd = open("/dev/null", O_RDONLY);
    if (fd < 0) bad |= 8;
    else close(fd);
    for (void *p : bufs) weftMemFree(p);
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child: 1 setrlimit failed, 2 an allocation failed, "
                                       "4 no buffer or more than 32 shareable, 8 no descriptor "
                                       "left for open()";
}

}  // namespace
