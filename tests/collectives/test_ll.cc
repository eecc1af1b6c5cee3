// The LL protocol on the host: the ring algorithms called directly with a
// hand-made plan (proto PROTO_LL, one channel; or several through the host
// executor's split, both protocols), over every datatype, op,
// count and placement with small, few slots; SIMPLE and LL calls interleaved
// on one comm, including stale SIMPLE data that reads as an LL flag; and a
// rank killed in the middle of an LL collective.
#include <gtest/gtest.h>

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "coll_ref.h"
#include "harness.h"

extern "C" {
#include "collectives/core/comm.h"
#include "collectives/core/plan.h"
#include "collectives/algo/algo.h"
#include "collectives/exec/host/prims.h"
#include "collectives/exec/host/run.h"
}

using namespace weft_test;

namespace {

struct LLCase {
  int nranks;
  int slot_nbytes;
  int nslots;
  const char *transport;  // WEFT_TRANSPORT
};

std::string case_name(const testing::TestParamInfo<LLCase> &info) {
  const LLCase &c = info.param;
  return "ranks" + std::to_string(c.nranks) + "_slot" + std::to_string(c.slot_nbytes) + "x" +
         std::to_string(c.nslots) + "_" + c.transport;
}

void PrintTo(const LLCase &c, std::ostream *os) {
  *os << c.nranks << " ranks, " << c.nslots << " slots of " << c.slot_nbytes << " bytes, "
      << c.transport;
}

const size_t kCounts[] = {1, 3, 1009, 4099};  // count 0 never reaches the algorithms
const uint8_t kPoison = 0xa5;

// Runs one collective the way the host executor does, but with the protocol
// given: a ring algorithm on channel 0 for the whole buffer. A failure marks
// the comm failed (as the enqueue path does), so that peers stop waiting.
weftResult_t run_ring(weftComm_t comm, coll_kind coll, const void *send, void *recv, size_t count,
                      weftDataType_t t, weftRedOp_t op, int root, coll_proto proto) {
  weft_plan plan = {};
  plan.coll = coll;
  plan.sendbuf = send;
  plan.recvbuf = recv;
  plan.count = count;
  plan.datatype = t;
  plan.op = op;
  plan.root = root;
  plan.algo = ALGO_RING;
  plan.proto = proto;
  plan.nchannels = 1;
  weftResult_t res = comm->nranks == 1  // a ring needs two ranks
                         ? plan_run_host(comm, &plan)
                         : ring_run(comm, &comm->channels[0], &plan, 0, count);
  if (res != weftSuccess) comm_fail(comm, res);
  return res;
}

struct Ctx {
  const RankCtx &rank;
  weftComm_t comm;
  uint64_t seed;
  coll_proto proto;
};

const char *placement(bool in_place) { return in_place ? "in-place" : "out-of-place"; }
const char *proto_name(coll_proto p) { return p == PROTO_LL ? "LL" : "SIMPLE"; }

// Bytes past `used` in out must still be poison.
bool tail_poisoned(const std::vector<uint8_t> &out, size_t used) {
  for (size_t i = used; i < out.size(); i++)
    if (out[i] != kPoison) return false;
  return true;
}

int check_allreduce(const Ctx &x, weftDataType_t t, weftRedOp_t op, size_t count, bool in_place) {
  const int n = x.rank.nranks, me = x.rank.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, op, count, x.seed, r));
  std::vector<uint8_t> send = in[me];
  std::vector<uint8_t> out(block + 64, kPoison);
  if (in_place) memcpy(out.data(), send.data(), block);
  const void *src = in_place ? out.data() : send.data();
  weftResult_t res =
      run_ring(x.comm, COLL_ALLREDUCE, src, out.data(), count, t, op, 0, x.proto);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "%s allreduce %s %s %zu: %s", proto_name(x.proto),
               type_name(t), op_name(op), count, weftGetLastError(x.comm));
  std::string why;
  FAIL_IF_RANK(x.rank, !check_reduction(t, op, in, out.data(), count, &why),
               "%s allreduce %s %s count %zu %s: %s", proto_name(x.proto), type_name(t),
               op_name(op), count, placement(in_place), why.c_str());
  FAIL_IF_RANK(x.rank, !tail_poisoned(out, block), "allreduce wrote past the end");
  FAIL_IF_RANK(x.rank, !in_place && send != in[me], "allreduce modified sendbuff");
  return 0;
}

int check_allgather(const Ctx &x, weftDataType_t t, size_t count, bool in_place) {
  const int n = x.rank.nranks, me = x.rank.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, weftSum, count, x.seed, r));
  std::vector<uint8_t> out(n * block + 64, kPoison);
  if (in_place) memcpy(out.data() + me * block, in[me].data(), block);
  const void *src = in_place ? out.data() + me * block : in[me].data();
  weftResult_t res =
      run_ring(x.comm, COLL_ALLGATHER, src, out.data(), count, t, weftSum, 0, x.proto);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "%s allgather %s %zu: %s", proto_name(x.proto),
               type_name(t), count, weftGetLastError(x.comm));
  for (int r = 0; r < n; r++)
    FAIL_IF_RANK(x.rank, memcmp(out.data() + r * block, in[r].data(), block) != 0,
                 "%s allgather %s count %zu %s: block of rank %d differs", proto_name(x.proto),
                 type_name(t), count, placement(in_place), r);
  FAIL_IF_RANK(x.rank, !tail_poisoned(out, n * block), "allgather wrote past the end");
  return 0;
}

int check_reducescatter(const Ctx &x, weftDataType_t t, weftRedOp_t op, size_t count,
                        bool in_place) {
  const int n = x.rank.nranks, me = x.rank.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, op, count * n, x.seed, r));
  std::vector<uint8_t> send = in[me];
  std::vector<uint8_t> out(block + 64, kPoison);
  void *dst = in_place ? send.data() + me * block : out.data();
  weftResult_t res =
      run_ring(x.comm, COLL_REDUCESCATTER, send.data(), dst, count, t, op, 0, x.proto);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "%s reducescatter %s %s %zu: %s", proto_name(x.proto),
               type_name(t), op_name(op), count, weftGetLastError(x.comm));
  std::vector<std::vector<uint8_t>> mine;  // every rank's block for us
  for (int r = 0; r < n; r++)
    mine.emplace_back(in[r].begin() + me * block, in[r].begin() + (me + 1) * block);
  std::string why;
  FAIL_IF_RANK(x.rank, !check_reduction(t, op, mine, dst, count, &why),
               "%s reducescatter %s %s count %zu %s: %s", proto_name(x.proto), type_name(t),
               op_name(op), count, placement(in_place), why.c_str());
  if (!in_place) {
    FAIL_IF_RANK(x.rank, !tail_poisoned(out, block), "reducescatter wrote past the end");
    FAIL_IF_RANK(x.rank, send != in[me], "reducescatter modified sendbuff");
  }
  return 0;
}

int check_broadcast(const Ctx &x, weftDataType_t t, size_t count, int root, bool in_place) {
  const int me = x.rank.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<uint8_t> data = make_input(t, weftSum, count, x.seed, root);
  std::vector<uint8_t> out(block + 64, kPoison);
  std::vector<uint8_t> send = data;
  const void *src = me == root ? send.data() : nullptr;  // non-roots pass no input
  if (in_place && me == root) {
    memcpy(out.data(), data.data(), block);
    src = out.data();
  }
  weftResult_t res =
      run_ring(x.comm, COLL_BROADCAST, src, out.data(), count, t, weftSum, root, x.proto);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "%s broadcast %s %zu root %d: %s", proto_name(x.proto),
               type_name(t), count, root, weftGetLastError(x.comm));
  FAIL_IF_RANK(x.rank, memcmp(out.data(), data.data(), block) != 0,
               "%s broadcast %s count %zu root %d %s: wrong data", proto_name(x.proto),
               type_name(t), count, root, placement(in_place));
  FAIL_IF_RANK(x.rank, !tail_poisoned(out, block), "broadcast wrote past the end");
  return 0;
}

int check_reduce(const Ctx &x, weftDataType_t t, weftRedOp_t op, size_t count, int root,
                 bool in_place) {
  const int n = x.rank.nranks, me = x.rank.rank;
  const size_t block = count * weftTypeSize(t);
  std::vector<std::vector<uint8_t>> in;
  for (int r = 0; r < n; r++) in.push_back(make_input(t, op, count, x.seed, r));
  std::vector<uint8_t> out(block + 64, kPoison);
  if (in_place) memcpy(out.data(), in[me].data(), block);
  const void *src = in_place ? out.data() : in[me].data();
  void *dst = me == root || in_place ? out.data() : nullptr;  // non-roots pass no output
  weftResult_t res = run_ring(x.comm, COLL_REDUCE, src, dst, count, t, op, root, x.proto);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "%s reduce %s %s %zu root %d: %s", proto_name(x.proto),
               type_name(t), op_name(op), count, root, weftGetLastError(x.comm));
  if (me == root) {
    std::string why;
    FAIL_IF_RANK(x.rank, !check_reduction(t, op, in, out.data(), count, &why),
                 "%s reduce %s %s count %zu root %d %s: %s", proto_name(x.proto), type_name(t),
                 op_name(op), count, root, placement(in_place), why.c_str());
  } else if (!in_place) {
    FAIL_IF_RANK(x.rank, !tail_poisoned(out, 0), "reduce wrote on a non-root rank");
  }
  FAIL_IF_RANK(x.rank, !tail_poisoned(out, block), "reduce wrote past the end");
  return 0;
}

// Runs body on every rank of a fresh communicator shaped by the case.
void run_case(const LLCase &c, const std::function<int(const RankCtx &, weftComm_t)> &body,
              int timeout_s = 300) {
  RunOptions opts;
  opts.timeout_s = timeout_s;
  opts.env = {{"WEFT_SLOT_BYTES", std::to_string(c.slot_nbytes)},
              {"WEFT_NSLOTS", std::to_string(c.nslots)},
              {"WEFT_TRANSPORT", c.transport},
              {"WEFT_TIMEOUT", "60"}};
  auto status = run_ranks(c.nranks, [&](const RankCtx &rank) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, rank.nranks, rank.id, rank.rank) != weftSuccess)
      return rank_fail(rank, "init: %s", weftGetLastError(nullptr));
    int rc = body(rank, comm);
    weftCommDestroy(comm);
    return rc;
  }, opts);
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

class LL : public testing::TestWithParam<LLCase> {};

// Every collective x datatype x count x placement, and every op where there
// is one (above 5 ranks, TypeOpPairs' sample of the datatype x op pairs);
// roots cycle with the other parameters so each meets each.
TEST_P(LL, EveryCollectiveTypeOpCountPlacement) {
  const uint64_t seed = test_seed();
  const TypeOpPairs pairs(seed, GetParam().nranks, 5);
  printf("%s\n", pairs.describe().c_str());
  run_case(GetParam(), [&](const RankCtx &rank, weftComm_t comm) {
    const Ctx x{rank, comm, seed, PROTO_LL};
    const int n = rank.nranks;
    for (int t = 0; t < weftNumTypes; t++)
      for (size_t ci = 0; ci < 4; ci++)
        for (int ip = 0; ip < 2; ip++) {
          const weftDataType_t dt = (weftDataType_t)t;
          const size_t count = kCounts[ci];
          const int root = (t + (int)ci + ip) % n;
          if (int rc = check_allgather(x, dt, count, ip)) return rc;
          if (int rc = check_broadcast(x, dt, count, root, ip)) return rc;
          for (int op = 0; op < weftNumOps; op++) {
            if (!pairs(t, op)) continue;
            const weftRedOp_t o = (weftRedOp_t)op;
            if (int rc = check_allreduce(x, dt, o, count, ip)) return rc;
            if (int rc = check_reducescatter(x, dt, o, count, ip)) return rc;
            if (int rc = check_reduce(x, dt, o, count, (root + op) % n, ip)) return rc;
          }
        }
    return 0;
  });
}

// prims_step refuses flags that are no step before it touches p or a
// connection (here there are none: p is zeroed).
TEST(PrimsStep, FlagsThatAreNoStepAreRefused) {
  const unsigned R = PRIMS_RECV, X = PRIMS_REDUCE, S = PRIMS_SEND, C = PRIMS_COPY;
  const unsigned bad[] = {0, C, X, X | C, X | S, X | S | C, R, R | X, 1u << 4, S | (1u << 7)};
  prims p;
  memset(&p, 0, sizeof p);
  char buf[8] = {};
  for (unsigned flags : bad) {
    EXPECT_EQ(prims_step(&p, flags, buf, buf, 1), weftInternalError) << "flags " << flags;
    EXPECT_NE(strstr(weftGetLastError(nullptr), "no such step"), nullptr)
        << weftGetLastError(nullptr);
  }
}

// SIMPLE leaves raw data in the slots; here it is data that reads exactly as
// the flags the next LL steps will use in those slots, and the LL sender comes
// late, so receivers that believed a flag at first sight would take it. Runs
// on a fresh comm: every connection at step 0.
int stale_simple_then_ll(const Ctx &x) {
  const weftComm_t comm = x.comm;
  const int me = x.rank.rank;
  const uint64_t nslots = comm->nslots;
  FAIL_IF_RANK(x.rank, comm->channels[0].recv.step != 0 || comm->channels[0].send.step != 0,
               "a fresh comm's connections are past step 0");
  // SIMPLE: slot j of the chain (step j) full of the flag of step nslots + j
  const size_t simple_count = comm->slot_nbytes / 4, ll_count = comm->slot_nbytes / 8;
  std::vector<uint32_t> decoy(nslots * simple_count), out(decoy.size());
  for (size_t i = 0; i < decoy.size(); i++) decoy[i] = (uint32_t)(nslots + i / simple_count + 1);
  weftResult_t res = run_ring(comm, COLL_BROADCAST, decoy.data(), out.data(), decoy.size(),
                              weftUint32, weftSum, 0, PROTO_SIMPLE);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "SIMPLE broadcast: %s", weftGetLastError(comm));
  FAIL_IF_RANK(x.rank, out != decoy, "SIMPLE broadcast: wrong data");
  // LL over the same slots, the root starting late
  std::vector<uint32_t> data(nslots * ll_count);
  Rng rng(x.seed);
  for (auto &v : data) v = (uint32_t)rng.next();
  std::vector<uint32_t> got(data.size(), 0);
  if (me == 0) usleep(20000);
  res = run_ring(comm, COLL_BROADCAST, data.data(), got.data(), data.size(), weftUint32, weftSum,
                 0, PROTO_LL);
  FAIL_IF_RANK(x.rank, res != weftSuccess, "LL broadcast: %s", weftGetLastError(comm));
  for (size_t i = 0; i < data.size(); i++)
    FAIL_IF_RANK(x.rank, got[i] != data[i], "LL broadcast after SIMPLE: element %zu is %u, want %u",
                 i, got[i], data[i]);
  return 0;
}

// One comm, both protocols: a fixed pattern then a random mix (the same on
// every rank) of collectives, sizes and protocols. If either protocol left
// the step counters, credits or slots out of step, later calls would hang or
// go wrong.
TEST_P(LL, InterleavedWithSimple) {
  const uint64_t seed = test_seed();
  run_case(GetParam(), [&](const RankCtx &rank, weftComm_t comm) {
    Ctx x{rank, comm, seed, PROTO_LL};
    if (rank.nranks > 1)
      if (int rc = stale_simple_then_ll(x)) return rc;
    Rng rng(seed ^ 0x11);
    for (int i = 0; i < 60; i++) {
      x.proto = i < 8 ? (coll_proto)(i / 2 % 2) : (coll_proto)(rng.next() % 2);
      x.seed = seed + (uint64_t)i;
      const weftDataType_t t = (weftDataType_t)(rng.next() % weftNumTypes);
      const weftRedOp_t op = (weftRedOp_t)(rng.next() % weftNumOps);
      const size_t count = kCounts[rng.next() % 4] + rng.next() % 7;
      const int root = (int)(rng.next() % (uint64_t)rank.nranks);
      const bool ip = rng.next() % 2;
      int rc = 0;
      switch (rng.next() % 5) {
        case 0: rc = check_allreduce(x, t, op, count, ip); break;
        case 1: rc = check_allgather(x, t, count, ip); break;
        case 2: rc = check_reducescatter(x, t, op, count, ip); break;
        case 3: rc = check_broadcast(x, t, count, root, ip); break;
        default: rc = check_reduce(x, t, op, count, root, ip); break;
      }
      if (rc) return rank_fail(rank, "call %d failed (%s)", i, proto_name(x.proto));
    }
    // the public API (the tuner's choice) still works after both
    x.seed = seed + 1000;
    std::vector<float> a(1000, 1.0f);
    if (weftAllReduce(a.data(), a.data(), a.size(), weftFloat32, weftSum, comm, nullptr) !=
            weftSuccess ||
        a[999] != (float)rank.nranks)
      return rank_fail(rank, "weftAllReduce after the mix: %s", weftGetLastError(comm));
    return 0;
  });
}

std::vector<LLCase> all_cases() {
  std::vector<LLCase> cases;
  for (int n : {1, 2, 3, 4, 5, 8})
    for (int slot : {64, 256, 4096})
      for (int nslots : {2, 4}) cases.push_back({n, slot, nslots, "shm"});
  // a proxy-fed FIFO: the receiver waits for tail, then checks the flags
  cases.push_back({2, 64, 2, "socket"});
  cases.push_back({3, 256, 4, "socket"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ranks, LL, testing::ValuesIn(all_cases()), case_name);

// LL all-reduces back to back and one rank is killed: whatever step the
// others are in (polling flags, or waiting for a credit), they get
// weftRemoteError within WEFT_TIMEOUT.
TEST(LLFailure, RankDiesMidCollective) {
  const int timeout_s = 10;
  for (int nranks : {2, 4}) {
    RunOptions opts;
    opts.timeout_s = 60;
    opts.env = {{"WEFT_TIMEOUT", std::to_string(timeout_s)}, {"WEFT_SLOT_BYTES", "4096"},
                {"WEFT_NCHANNELS", "1"}};
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
        return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
      std::vector<float> buf(1 << 18, 1.0f);
      weftResult_t res = weftSuccess;
      double seconds = 0;
      std::thread worker([&] {
        const double start = now_s();
        do {
          const double t0 = now_s();
          res = run_ring(comm, COLL_ALLREDUCE, buf.data(), buf.data(), buf.size(), weftFloat32,
                         weftMax, 0, PROTO_LL);
          seconds = now_s() - t0;
        } while (res == weftSuccess && now_s() - start < 30);
      });
      if (ctx.rank == ctx.nranks - 1) {
        usleep(200000);  // well into the stream of collectives
        raise(SIGKILL);
      }
      worker.join();
      if (res != weftRemoteError)
        return rank_fail(ctx, "got %s, want weftRemoteError", weftGetErrorString(res));
      if (seconds > timeout_s)
        return rank_fail(ctx, "error took %.1f s, beyond WEFT_TIMEOUT", seconds);
      printf("rank %d: error after %.2f s: %s\n", ctx.rank, seconds, weftGetLastError(comm));
      weftCommAbort(comm);
      return 0;
    }, opts);
    for (int r = 0; r < nranks - 1; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
    EXPECT_EQ(status[nranks - 1], 128 + SIGKILL);
  }
}

// Ranks that disagree on the protocol: the LL receiver of a SIMPLE slot finds
// no signature where LL puts it and says so once the slot is complete,
// instead of waiting for flags until the timeout; the root, which checks the
// signature alone that the last rank sends it, refuses too.
TEST(LLFailure, ProtocolMismatchIsReported) {
  RunOptions opts;
  opts.timeout_s = 60;
  opts.env = {{"WEFT_TIMEOUT", "20"}, {"WEFT_NCHANNELS", "1"}};
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (weftCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
      return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
    std::vector<float> buf(16, 1.0f);
    const double t0 = now_s();
    weftResult_t res = run_ring(comm, COLL_BROADCAST, buf.data(), buf.data(), buf.size(),
                                weftFloat32, weftSum, 0, ctx.rank == 0 ? PROTO_SIMPLE : PROTO_LL);
    const double seconds = now_s() - t0;
    const std::string msg = weftGetLastError(comm);
    if (ctx.rank == 0) sleep(1);  // an abort now would end the receiver's wait first
    weftCommAbort(comm);
    if (ctx.rank == 0)
      return res == weftInvalidUsage ? 0 : rank_fail(ctx, "root: %s", msg.c_str());
    if (res != weftInvalidUsage || msg.find("protocol differ") == std::string::npos)
      return rank_fail(ctx, "got %s: %s", weftGetErrorString(res), msg.c_str());
    if (seconds > 5) return rank_fail(ctx, "took %.1f s to notice", seconds);
    return 0;
  }, opts);
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
