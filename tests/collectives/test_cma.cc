// Single-copy collectives (cross-memory attach) over forked ranks: all-reduce,
// all-gather, reduce-scatter, broadcast and reduce (every root in turn) with
// every datatype and op, odd counts and
// counts of several pieces, in place and out of place; the tuner's choice;
// the fall-back to the ring when a rank may not be read; and calls that differ
// between ranks, refused on every rank without a byte written.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "coll_ref.h"
#include "harness.h"
extern "C" {
#include "collectives/algo/cma.h"
#include "collectives/core/comm.h"
#include "collectives/core/plan.h"
#include "collectives/tune/tuner.h"
}

using namespace weft_test;

namespace {

const uint8_t kPoison = 0x5a;

int cma_allgather(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, size_t count,
                  bool in_place, uint64_t seed) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, weftSum, count, seed, r));
  std::vector<uint8_t> out(n * block + 64, kPoison);
  if (in_place) memcpy(out.data() + me * block, in[me].data(), block);
  const void *src = in_place ? out.data() + me * block : in[me].data();
  weftResult_t res = weftAllGather(src, out.data(), count, t, comm, nullptr);
  FAIL_IF(res != weftSuccess, "allgather: %s", weftGetLastError(comm));
  for (int r = 0; r < n; r++)
    FAIL_IF(memcmp(out.data() + r * block, in[r].data(), block) != 0,
            "allgather %s count %zu %s: block of rank %d differs", type_name(t), count,
            in_place ? "in place" : "out of place", r);
  for (size_t i = n * block; i < out.size(); i++)
    FAIL_IF(out[i] != kPoison, "allgather wrote past the end");
  return 0;
}

int cma_reducescatter(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, weftRedOp_t op,
                      size_t count, bool in_place, uint64_t seed) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, op, count * n, seed, r));
  std::vector<uint8_t> send = in[me], out(block + 64, kPoison);
  void *dst = in_place ? send.data() + me * block : out.data();
  weftResult_t res = weftReduceScatter(send.data(), dst, count, t, op, comm, nullptr);
  FAIL_IF(res != weftSuccess, "reducescatter: %s", weftGetLastError(comm));
  std::vector<std::vector<uint8_t>> mine;
  for (int r = 0; r < n; r++)
    mine.emplace_back(in[r].begin() + me * block, in[r].begin() + (me + 1) * block);
  std::string why;
  FAIL_IF(!check_reduction(t, op, mine, dst, count, &why), "reducescatter %s %s count %zu %s: %s",
          type_name(t), op_name(op), count, in_place ? "in place" : "out of place", why.c_str());
  if (!in_place) {
    FAIL_IF(send != in[me], "reducescatter modified sendbuff");
    for (size_t i = block; i < out.size(); i++)
      FAIL_IF(out[i] != kPoison, "reducescatter wrote past the end");
  }
  return 0;
}

// Every type and op at small odd counts, then counts of several 256 KiB
// pieces for a few types. The rooted collectives' root turns with each case.
int cma_everything(const RankCtx &ctx, weftComm_t comm, uint64_t seed) {
  const size_t small[] = {1, 3, 1009};
  int rc = 0, turn = 0;
  for (int t = 0; t < weftNumTypes && rc == 0; t++)
    for (size_t count : small)
      for (int ip = 0; ip < 2 && rc == 0; ip++) {
        const auto ty = (weftDataType_t)t;
        rc = cma_allgather(ctx, comm, ty, count, ip, seed + t * 10 + ip);
        if (rc == 0)
          rc = check_coll(ctx, comm, kBroadcast, ty, weftSum, count, ip, false, false,
                          seed + t * 10 + ip + 5, turn++ % ctx.nranks);
        for (int op = 0; op < weftNumOps && rc == 0; op++) {
          uint64_t s = seed + t * 1000 + op * 100 + count + ip;
          rc = check_allreduce(ctx, comm, ty, (weftRedOp_t)op, count, ip, s);
          if (rc == 0) rc = cma_reducescatter(ctx, comm, ty, (weftRedOp_t)op, count, ip, s);
          if (rc == 0)
            rc = check_coll(ctx, comm, kReduce, ty, (weftRedOp_t)op, count, ip, false, false,
                            s + 1, turn++ % ctx.nranks);
        }
      }
  const weftDataType_t large_types[] = {weftFloat32, weftBfloat16, weftInt64};
  for (weftDataType_t t : large_types)
    for (int ip = 0; ip < 2 && rc == 0; ip++) {
      const size_t count = 150001;  // several pieces, not a multiple of anything
      rc = check_allreduce(ctx, comm, t, weftSum, count, ip, seed + 7 + ip);
      if (rc == 0) rc = check_allreduce(ctx, comm, t, weftAvg, count, ip, seed + 9 + ip);
      if (rc == 0) rc = cma_reducescatter(ctx, comm, t, weftMax, count / 3, ip, seed + 11 + ip);
      if (rc == 0) rc = cma_allgather(ctx, comm, t, count / 2, ip, seed + 13 + ip);
      if (rc == 0)
        rc = check_coll(ctx, comm, kBroadcast, t, weftSum, count, ip, false, false, seed + 15 + ip,
                        turn++ % ctx.nranks);
      if (rc == 0)
        rc = check_coll(ctx, comm, kReduce, t, ip ? weftAvg : weftSum, count, ip, false, false,
                        seed + 17 + ip, turn++ % ctx.nranks);
    }
  return rc;
}

class Cma : public testing::TestWithParam<int> {};

TEST_P(Cma, EveryCollectiveTypeOpCountPlacement) {
  const int nranks = GetParam();
  const uint64_t seed = test_seed();
  RunOptions opts;
  // a reduce through the kernel's copies too, where it would take the ring
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_CMA_REDUCE_KERNEL", "1"}, {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = cma_everything(ctx, comm, seed);
    if (rc == 0 && cma_comm_usable((weftComm *)comm) != 1)
      rc = rank_fail(ctx, "cross-memory attach was not used (state %d)",
                     cma_comm_usable((weftComm *)comm));
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Cma, testing::Values(2, 3, 4),
                         [](const testing::TestParamInfo<int> &i) {
                           return "ranks" + std::to_string(i.param);
                         });

// The tuner takes cma from WEFT_CMA_MIN_NBYTES up on one host, and never
// where WEFT_ALGO excludes it.
TEST(CmaTuner, PicksFromThresholdUnlessExcluded) {
  for (const char *algo : {"", "^cma"}) {
    RunOptions opts;
    opts.env = {{"WEFT_ALGO", algo}, {"WEFT_CMA_MIN_NBYTES", "1M"}};
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      const bool allowed = algo[0] == '\0';
      int rc = 0;
      for (enum coll_kind c :
           {COLL_ALLREDUCE, COLL_ALLGATHER, COLL_REDUCESCATTER, COLL_BROADCAST, COLL_REDUCE})
        for (size_t count : {size_t(1000), size_t(1) << 20}) {
          weft_plan p;
          memset(&p, 0, sizeof p);
          p.coll = c;
          p.count = count;
          p.datatype = weftFloat32;
          p.op = weftSum;
          plan_tune((weftComm *)comm, &p);
          const bool want = allowed && count > 1000;
          if ((p.algo == ALGO_CMA) != want)
            rc = rank_fail(ctx, "WEFT_ALGO='%s' %s count %zu: algo %s", algo, coll_kind_name(c),
                           count, tuner_algo_name(p.algo));
        }
      weftCommDestroy(comm);
      return rc;
    }, opts);
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r << " WEFT_ALGO=" << algo;
  }
}

// A reduce takes cma from WEFT_CMA_REDUCE_MIN_NBYTES (1 MiB by default)
// where that is above WEFT_CMA_MIN_NBYTES; the other collectives from
// WEFT_CMA_MIN_NBYTES (64 KiB).
TEST(CmaTuner, ReduceFromItsOwnThreshold) {
  // 32K: below WEFT_CMA_MIN_NBYTES, which then rules
  for (const char *reduce_min : {"", "32K", "64K", "256K"}) {
    RunOptions opts;
    if (reduce_min[0]) opts.env = {{"WEFT_CMA_REDUCE_MIN_NBYTES", reduce_min}};
    const size_t threshold = !strcmp(reduce_min, "32K") || !strcmp(reduce_min, "64K") ? 65536
                             : !strcmp(reduce_min, "256K")                             ? 256u << 10
                                                                                       : 1u << 20;
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      int rc = 0;
      for (enum coll_kind c : {COLL_BROADCAST, COLL_REDUCE, COLL_ALLREDUCE})
        for (size_t nbytes : {size_t(65536) - 4, size_t(65536), size_t(128) << 10,
                              (size_t(256) << 10) - 4, size_t(256) << 10, (size_t(1) << 20) - 4,
                              size_t(1) << 20}) {
          weft_plan p;
          memset(&p, 0, sizeof p);
          p.coll = c;
          p.count = nbytes / 4;
          p.datatype = weftFloat32;
          p.op = weftSum;
          plan_tune((weftComm *)comm, &p);
          const bool want = nbytes >= (c == COLL_REDUCE ? threshold : 65536);
          if ((p.algo == ALGO_CMA) != want)
            rc = rank_fail(ctx, "WEFT_CMA_REDUCE_MIN_NBYTES='%s' %s %zu bytes: algo %s",
                           reduce_min, coll_kind_name(c), nbytes, tuner_algo_name(p.algo));
        }
      weftCommDestroy(comm);
      return rc;
    }, opts);
    for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  }
}

// Which reduces copy single-copy (cma_ran_count): on buffers every rank
// offers for mapping, or where every rank sets WEFT_CMA_REDUCE_KERNEL=1;
// otherwise the ring after the address exchange, on every rank alike (one
// rank's setting alone changes nothing). A broadcast on malloc's buffers
// copies single-copy. Every result right.
TEST(CmaReduce, SingleCopyOnMappedBuffersOrWhereEveryRankAllowsTheKernel) {
  const uint64_t seed = test_seed();
  const size_t count = (2u << 20) / 4;  // 2 MiB of float32: above every threshold
  struct Setting {
    const char *name;
    std::function<EnvList(int)> env_of;
    bool kernel;  // a reduce on malloc's buffers copies through the kernel
  };
  const Setting settings[] = {
      {"default", [](int) { return EnvList{}; }, false},
      {"rank 0 alone allows the kernel",
       [](int r) { return r == 0 ? EnvList{{"WEFT_CMA_REDUCE_KERNEL", "1"}} : EnvList{}; },
       false},
      {"every rank allows the kernel",
       [](int) { return EnvList{{"WEFT_CMA_REDUCE_KERNEL", "1"}}; }, true},
  };
  for (const Setting &st : settings) {
    RunOptions opts;
    opts.env = {{"WEFT_TIMEOUT", "60"}};
    opts.env_of = st.env_of;
    auto status = run_ranks(3, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      weftComm *c = (weftComm *)comm;
      int rc = 0;
      struct Step {
        Coll coll;
        bool weft_buffers;
        bool copies;
      };
      const Step steps[] = {{kReduce, false, st.kernel},
                            {kReduce, true, true},
                            {kBroadcast, false, true},
                            {kReduce, false, st.kernel}};
      int i = 0;
      for (const Step &sp : steps) {
        const uint64_t before = cma_ran_count(c);
        if (rc == 0)
          rc = check_coll(ctx, comm, sp.coll, weftFloat32, weftSum, count, i % 2 == 1,
                          sp.weft_buffers, sp.weft_buffers, seed + i, i % 3);
        if (rc == 0 && cma_ran_count(c) - before != (sp.copies ? 1u : 0u))
          rc = rank_fail(ctx, "%s: step %d (%s, %s buffers) %s single-copy", st.name, i,
                         coll_name(sp.coll), sp.weft_buffers ? "weft's" : "malloc's",
                         sp.copies ? "did not copy" : "copied");
        i++;
      }
      weftCommDestroy(comm);
      return rc;
    }, opts);
    for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << st.name << ", rank " << r;
  }
}

// A rank that may not be read (not dumpable, and readers without
// CAP_SYS_PTRACE: ptrace rules refuse them): every rank agrees to run the
// ring, and the results are still right.
TEST(CmaFallback, UnreadableRankRunsTheRing) {
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    drop_ptrace_capability();
    if (ctx.rank == 1) prctl(PR_SET_DUMPABLE, 0);
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    int rc = 0;
    for (int ip = 0; ip < 2 && rc == 0; ip++) {
      rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 100003, ip, seed + ip);
      if (rc == 0) rc = cma_allgather(ctx, comm, weftInt32, 5001, ip, seed + 2 + ip);
      if (rc == 0) rc = cma_reducescatter(ctx, comm, weftFloat64, weftMin, 777, ip, seed + 4 + ip);
      if (rc == 0)
        rc = check_coll(ctx, comm, kBroadcast, weftInt8, weftSum, 70001, ip, false, false,
                        seed + 6 + ip, 1);
      if (rc == 0)
        rc = check_coll(ctx, comm, kReduce, weftFloat32, weftProd, 30001, ip, false, false,
                        seed + 8 + ip, 2);
    }
    if (rc == 0 && cma_comm_usable((weftComm *)comm) != -1)
      rc = rank_fail(ctx, "cma state %d, want -1 (refused)", cma_comm_usable((weftComm *)comm));
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// --- calls that differ between ranks ---------------------------------------

// A buffer between canary bytes, each side: from weftMemAllocHost (peers map
// it) or from mmap with a guard page (PROT_NONE) beyond each canary, so that
// a stray access faults or shows.
class Guarded {
 public:
  static constexpr size_t kCanary = 8192;
  static constexpr uint8_t kCanaryByte = 0xc5;

  Guarded(size_t nbytes, bool shared) : nbytes_(nbytes), shared_(shared) {
    const size_t page = 4096;
    if (shared) {
      region_nbytes_ = nbytes + 2 * kCanary;
      void *p = nullptr;
      if (weftMemAllocHost(&p, region_nbytes_) != weftSuccess) return;
      region_ = (uint8_t *)p;
      data_ = region_ + kCanary;
    } else {
      const size_t inner = (kCanary + nbytes + kCanary + page - 1) / page * page;
      region_nbytes_ = page + inner + page;
      void *p = mmap(nullptr, region_nbytes_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return;
      region_ = (uint8_t *)p;
      mprotect(region_, page, PROT_NONE);
      mprotect(region_ + region_nbytes_ - page, page, PROT_NONE);
      data_ = region_ + page + kCanary;
      lo_ = region_ + page;
      hi_ = region_ + region_nbytes_ - page;
    }
    if (shared) lo_ = region_, hi_ = region_ + region_nbytes_;
    memset(lo_, kCanaryByte, data_ - lo_);
    memset(data_ + nbytes_, kCanaryByte, hi_ - (data_ + nbytes_));
  }
  ~Guarded() {
    if (region_ == nullptr) return;
    if (shared_) weftMemFree(region_);
    else munmap(region_, region_nbytes_);
  }
  Guarded(const Guarded &) = delete;
  Guarded &operator=(const Guarded &) = delete;

  bool ok() const { return data_ != nullptr; }
  uint8_t *data() const { return data_; }
  // The first canary byte that changed, as an offset from the buffer, or 0.
  long canary_damage() const {
    for (const uint8_t *p = lo_; p < data_; p++)
      if (*p != kCanaryByte) return (long)(p - data_);
    for (const uint8_t *p = data_ + nbytes_; p < hi_; p++)
      if (*p != kCanaryByte) return (long)(p - data_);
    return 0;
  }

 private:
  size_t nbytes_;
  bool shared_;
  uint8_t *region_ = nullptr, *data_ = nullptr, *lo_ = nullptr, *hi_ = nullptr;
  size_t region_nbytes_ = 0;
};

// One rank's side of a call.
struct Call {
  enum coll_kind coll;
  size_t count;
  weftDataType_t datatype;
  weftRedOp_t op;
  int root = 0; // broadcast and reduce
};

struct MismatchCase {
  const char *name;
  int nranks;
  std::function<Call(int rank)> call;
  const char *message;  // every rank's error text ("#N": the call's number)
};

// Runs rank's side of c with guarded buffers of the sizes that call covers
// (input random, output poisoned); then both are as they were, and no canary
// changed.
int run_mismatch(const RankCtx &ctx, weftComm_t comm, const MismatchCase &c, bool shared,
                 uint64_t seed) {
  const Call call = c.call(ctx.rank);
  const size_t esize = weftTypeSize(call.datatype), n = (size_t)ctx.nranks;
  const size_t send_nbytes = call.count * esize * (call.coll == COLL_REDUCESCATTER ? n : 1);
  const size_t recv_nbytes = call.count * esize * (call.coll == COLL_ALLGATHER ? n : 1);
  Guarded send(send_nbytes, shared), recv(recv_nbytes, shared);
  FAIL_IF(!send.ok() || !recv.ok(), "%s: cannot allocate the buffers", c.name);
  Rng rng(seed + (uint64_t)ctx.rank);
  for (size_t i = 0; i < send_nbytes; i++) send.data()[i] = (uint8_t)rng.next();
  std::vector<uint8_t> input(send.data(), send.data() + send_nbytes);
  memset(recv.data(), kPoison, recv_nbytes);
  weftResult_t res = weftInternalError;
  switch (call.coll) {
    case COLL_ALLREDUCE:
      res = weftAllReduce(send.data(), recv.data(), call.count, call.datatype, call.op, comm,
                          nullptr);
      break;
    case COLL_ALLGATHER:
      res = weftAllGather(send.data(), recv.data(), call.count, call.datatype, comm, nullptr);
      break;
    case COLL_REDUCESCATTER:
      res = weftReduceScatter(send.data(), recv.data(), call.count, call.datatype, call.op, comm,
                              nullptr);
      break;
    case COLL_BROADCAST:
      res = weftBroadcast(send.data(), recv.data(), call.count, call.datatype, call.root, comm,
                          nullptr);
      break;
    case COLL_REDUCE:
      res = weftReduce(send.data(), recv.data(), call.count, call.datatype, call.op, call.root,
                       comm, nullptr);
      break;
    default: break;
  }
  const char *buffers = shared ? "weftMemAllocHost buffers" : "guarded buffers";
  FAIL_IF(res != weftInvalidUsage, "%s (%s): returned %s, want weftInvalidUsage (%s)", c.name,
          buffers, weftGetErrorString(res), weftGetLastError(comm));
  std::string want = c.message;  // "#N": the call's number on comm, the first or second
  if (want.find("#N") != std::string::npos)
    want.replace(want.find("#N"), 2, "#" + std::to_string(shared ? 2 : 1));
  FAIL_IF(std::string(weftGetLastError(comm)) != want,
          "%s (%s): message\n  \"%s\"\nwant\n  \"%s\"", c.name, buffers, weftGetLastError(comm),
          want.c_str());
  FAIL_IF(memcmp(send.data(), input.data(), send_nbytes) != 0, "%s (%s): the input changed",
          c.name, buffers);
  for (size_t i = 0; i < recv_nbytes; i++)
    FAIL_IF(recv.data()[i] != kPoison, "%s (%s): output byte %zu written", c.name, buffers, i);
  FAIL_IF(send.canary_damage() != 0, "%s (%s): byte %ld around the input written", c.name,
          buffers, send.canary_damage());
  FAIL_IF(recv.canary_damage() != 0, "%s (%s): byte %ld around the output written", c.name,
          buffers, recv.canary_damage());
  weftResult_t async = weftInternalError;
  FAIL_IF(weftCommGetAsyncError(comm, &async) != weftSuccess || async != weftSuccess,
          "%s: the refused call broke the comm", c.name);
  return 0;
}

#define SEEN " (seen in the single-copy address exchange; nothing was copied)"

const MismatchCase kMismatches[] = {
    {"count 1M against 32K", 2,
     [](int r) { return Call{COLL_ALLREDUCE, r == 0 ? 1u << 20 : 32u << 10, weftFloat32, weftSum}; },
     "ranks disagree on a collective: AllReduce #N: count differs: rank 0 has 1048576, rank 1 has "
     "32768" SEEN},
    {"count 1048576 against 1000000", 2,
     [](int r) { return Call{COLL_ALLREDUCE, r == 0 ? 1048576u : 1000000u, weftFloat32, weftSum}; },
     "ranks disagree on a collective: AllReduce #N: count differs: rank 0 has 1048576, rank 1 has "
     "1000000" SEEN},
    {"datatype", 3,
     [](int r) { return Call{COLL_ALLREDUCE, 70001, r == 1 ? weftInt32 : weftFloat32, weftSum}; },
     "ranks disagree on a collective: AllReduce #N: datatype differs: ranks 0,2 have float32, rank 1 "
     "has int32" SEEN},
    {"op", 3,
     [](int r) { return Call{COLL_REDUCESCATTER, 30011, weftFloat64, r == 2 ? weftMax : weftSum}; },
     "ranks disagree on a collective: ReduceScatter #N: op differs: ranks 0,1 have sum, rank 2 has "
     "max" SEEN},
    {"all-gather count", 4,
     [](int r) { return Call{COLL_ALLGATHER, r == 3 ? 30000u : 40000u, weftInt32, weftSum}; },
     "ranks disagree on a collective: AllGather #N: count differs: ranks 0-2 have 40000, rank 3 has "
     "30000" SEEN},
    {"collective", 2,
     [](int r) {
       return r == 0 ? Call{COLL_ALLREDUCE, 1u << 18, weftFloat32, weftSum}
                     : Call{COLL_REDUCESCATTER, 1u << 17, weftFloat32, weftSum};
     },
     "ranks disagree on a collective: #N: collective differs: rank 0 AllReduce, rank 1 "
     "ReduceScatter" SEEN},
    {"broadcast root", 3,
     [](int r) { return Call{COLL_BROADCAST, 70001, weftFloat32, weftSum, r == 2 ? 1 : 0}; },
     "ranks disagree on a collective: Broadcast #N: root differs: ranks 0,1 have 0, rank 2 has 1" SEEN},
    {"reduce op", 2,
     [](int r) { return Call{COLL_REDUCE, 1u << 17, weftInt64, r == 0 ? weftMin : weftMax, 1}; },
     "ranks disagree on a collective: Reduce #N: op differs: rank 0 has min, rank 1 has max" SEEN},
    {"broadcast against reduce", 3,
     [](int r) {
       return Call{r == 1 ? COLL_REDUCE : COLL_BROADCAST, 1u << 16, weftFloat64, weftSum, 2};
     },
     "ranks disagree on a collective: #N: collective differs: ranks 0,2 Broadcast, rank 1 Reduce" SEEN},
    {"broadcast count", 2,
     [](int r) { return Call{COLL_BROADCAST, r == 0 ? 20000u : 20001u, weftInt32, weftSum, 1}; },
     "ranks disagree on a collective: Broadcast #N: count differs: rank 0 has 20000, rank 1 has 20001" SEEN},
};

// Each mismatch fails on every rank with the same message, before a byte
// moves, with plain and with mapped buffers; the comm then still runs
// single-copy collectives right.
TEST(CmaMismatch, RefusedOnEveryRankNothingWritten) {
  const uint64_t seed = test_seed();
  RunOptions opts;
  opts.env = {{"WEFT_ALGO", "cma"}, {"WEFT_TIMEOUT", "60"}};
  for (const MismatchCase &c : kMismatches) {
    double start = now_s();
    auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      int rc = 0;
      for (int shared = 0; shared < 2 && rc == 0; shared++)
        rc = run_mismatch(ctx, comm, c, shared != 0, seed + (uint64_t)shared);
      if (rc == 0) rc = check_allreduce(ctx, comm, weftFloat32, weftSum, 100003, false, seed);
      if (rc == 0 && cma_comm_usable((weftComm *)comm) != 1)
        rc = rank_fail(ctx, "cross-memory attach was not used (state %d)",
                       cma_comm_usable((weftComm *)comm));
      weftCommDestroy(comm);
      return rc;
    }, opts);
    for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << c.name << ", rank " << r;
    EXPECT_LT(now_s() - start, 30.0) << c.name << ": a refusal should not wait for anything";
  }
}

}  // namespace
