// The always-on signature on every path: ranks that disagree on a
// collective (count, a count of 0 against others, datatype of the same or
// another size, op, root) get an error on every rank, never success, within
// a second with WEFT_TIMEOUT=30, and nothing is written past an output
// buffer. Every algorithm and protocol is forced in turn, and the tuner's
// own choice, over shared memory, sockets, a host per rank (over sockets)
// and UCX where weft is built with it (forced on one host: its
// shared-memory transports, whose rendezvous the receiver reads from the
// sender's memory, so that a refused call's chunks must never leave the
// user's buffers in UCX's hands); the cross product with rank counts, sizes and collectives is sampled (seeded, the
// seed printed: WEFT_TEST_SEED repeats a run).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "split_signature.h"
#include "weft_build_config.h"

using namespace weft_test;

namespace {

enum class Kind { Count, ZeroCount, TypeSameSize, TypeOtherSize, Op, Root };
const char *kind_name(Kind k) {
  switch (k) {
    case Kind::Count: return "count";
    case Kind::ZeroCount: return "count (0)";
    case Kind::TypeSameSize: return "datatype of one size";
    case Kind::TypeOtherSize: return "datatype of another size";
    case Kind::Op: return "op";
    default: return "root";
  }
}

enum class Coll { AllReduce, AllGather, ReduceScatter, Broadcast, Reduce };
const char *coll_name(Coll c) {
  static const char *const names[] = {"all-reduce", "all-gather", "reduce-scatter", "broadcast",
                                      "reduce"};
  return names[(int)c];
}
bool coll_has_op(Coll c) {
  return c == Coll::AllReduce || c == Coll::ReduceScatter || c == Coll::Reduce;
}
bool coll_has_root(Coll c) { return c == Coll::Broadcast || c == Coll::Reduce; }

struct Path {
  const char *algo;   // WEFT_ALGO, "" for the tuner's choice
  const char *proto;  // WEFT_PROTO, "" for the tuner's choice
};
const Path kPaths[] = {{"", ""},        {"ring", "simple"}, {"ring", "ll"}, {"tree", ""},
                       {"rd", ""},      {"direct", ""},     {"cma", ""},    {"bulk", ""}};

struct Case {
  Path path;
  const char *transport;  // WEFT_TRANSPORT, "" for shared memory, "hosts": a host per rank
  int nranks;
  Coll coll;
  Kind kind;
  size_t count;  // the agreeing ranks' count
  int odd_rank;
};

std::string case_name(const Case &c) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s over %s, %d ranks, %zu elements, rank %d's %s differs, algo %s proto %s%s",
           coll_name(c.coll), c.transport[0] ? c.transport : "shm", c.nranks, c.count,
           c.odd_rank, kind_name(c.kind), c.path.algo[0] ? c.path.algo : "(tuner)",
           c.path.proto[0] ? c.path.proto : "(tuner)", "");
  return buf;
}

// Shared between the ranks of one case: how many returned success, refused
// (named the difference), and the slowest error.
struct Tally {
  int succeeded;
  int refused;
  int failed;
  int slowest_ms;
};

int run_rank(const RankCtx &ctx, weftComm_t comm, const Case &c, Tally *tally) {
  const bool odd = ctx.rank == c.odd_rank;
  size_t count = c.count;
  weftDataType_t type = weftFloat32;
  weftRedOp_t op = weftSum;
  int root = 0;
  if (odd) switch (c.kind) {
      case Kind::Count: count = c.count + 24; break;
      case Kind::ZeroCount: count = 0; break;
      case Kind::TypeSameSize: type = weftInt32; break;
      case Kind::TypeOtherSize: type = weftFloat64; break;
      case Kind::Op: op = weftMax; break;
      case Kind::Root: root = 1; break;
    }
  // floats agree on both interpretations of their bits
  if (c.kind == Kind::TypeSameSize && !odd) type = weftFloat32;
  const size_t esize = weftTypeSize(type), n = (size_t)ctx.nranks;
  const size_t send_count = c.coll == Coll::ReduceScatter ? count * n : count;
  const size_t recv_count = c.coll == Coll::AllGather ? count * n : count;
  const size_t guard = 4096;
  std::vector<uint8_t> in(send_count * esize, 0x11), out(recv_count * esize + guard, 0x5a);
  for (size_t i = 0; i < send_count * esize; i += 4) in[i] = (uint8_t)(ctx.rank + i);
  double t0 = now_s();
  weftResult_t res = weftInternalError;
  switch (c.coll) {
    case Coll::AllReduce:
      res = weftAllReduce(in.data(), out.data(), count, type, op, comm, nullptr);
      break;
    case Coll::AllGather:
      res = weftAllGather(in.data(), out.data(), count, type, comm, nullptr);
      break;
    case Coll::ReduceScatter:
      res = weftReduceScatter(in.data(), out.data(), count, type, op, comm, nullptr);
      break;
    case Coll::Broadcast:
      res = weftBroadcast(in.data(), out.data(), count, type, root, comm, nullptr);
      break;
    case Coll::Reduce:
      res = weftReduce(in.data(), out.data(), count, type, op, root, comm, nullptr);
      break;
  }
  const double took = now_s() - t0;
  const std::string msg = weftGetLastError(comm);
  printf("  rank %d: %s after %.3f s: %s\n", ctx.rank, weftGetErrorString(res), took,
         res == weftSuccess ? "" : msg.c_str());
  size_t past = 0;
  for (size_t i = recv_count * esize; i < out.size(); i++) past += out[i] != 0x5a;
  FAIL_IF(past != 0, "%zu bytes past the output written", past);
  if (res == weftSuccess) __atomic_add_fetch(&tally->succeeded, 1, __ATOMIC_SEQ_CST);
  else if (res == weftInvalidUsage && msg.find("differs") != std::string::npos)
    __atomic_add_fetch(&tally->refused, 1, __ATOMIC_SEQ_CST);
  else __atomic_add_fetch(&tally->failed, 1, __ATOMIC_SEQ_CST);
  // the communicator's state (docs/signature.md): broken, and its next call
  // fails at once; or (single copy, WEFT_DETERMINISTIC) working, and its next
  // call, which every rank makes alike, succeeds
  weftResult_t async = weftSuccess;
  FAIL_IF(weftCommGetAsyncError(comm, &async) != weftSuccess, "weftCommGetAsyncError: %s",
          weftGetLastError(comm));
  float x = 1, y = 0;
  t0 = now_s();
  weftResult_t next = weftAllReduce(&x, &y, 1, weftFloat32, weftSum, comm, nullptr);
  const double next_took = now_s() - t0;
  printf("  rank %d: comm %s; its next call: %s after %.3f s\n", ctx.rank,
         async == weftSuccess ? "working" : "broken", weftGetErrorString(next), next_took);
  if (async != weftSuccess || res == weftSuccess) {
    FAIL_IF(next == weftSuccess, "the call after a refused one succeeded");
    FAIL_IF(next_took > 1.0, "the call after a refused one failed after %.1f s", next_took);
  } else {
    FAIL_IF(next != weftSuccess, "the comm is not broken, but its next call failed: %s",
            weftGetLastError(comm));
  }
  const int ms = (int)(took * 1000);
  int seen = __atomic_load_n(&tally->slowest_ms, __ATOMIC_SEQ_CST);
  while (ms > seen && !__atomic_compare_exchange_n(&tally->slowest_ms, &seen, ms, false,
                                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return 0;
}

std::vector<Case> sampled_cases(uint64_t seed, size_t per_path) {
  Rng rng(seed);
  const Kind kinds[] = {Kind::Count,         Kind::ZeroCount, Kind::TypeSameSize,
                        Kind::TypeOtherSize, Kind::Op,        Kind::Root};
  const size_t counts[] = {5, 1000, 70000};
  std::vector<Case> cases;
  // WEFT_TEST_TRANSPORTS (comma-separated, "shm" for shared memory) picks others
  static std::vector<std::string> names;
  std::vector<const char *> transports = {"", "socket", "hosts"};
  if (WEFT_HAVE_UCX) transports.push_back("ucx");
  if (const char *pick = getenv("WEFT_TEST_TRANSPORTS")) {
    names.clear();
    transports.clear();
    for (const char *p = pick; *p;) {
      const char *end = strchr(p, ',');
      std::string name(p, end ? (size_t)(end - p) : strlen(p));
      names.push_back(name == "shm" ? "" : name);
      p = end ? end + 1 : p + strlen(p);
    }
    for (const std::string &n : names) transports.push_back(n.c_str());
  }
  for (const Path &p : kPaths)
    for (const char *transport : transports)
      for (const Kind kind : kinds) {
        // every kind on every path and transport; the collective, rank count
        // and size drawn
        for (size_t k = 0; k < per_path; k++) {
          Case c;
          c.path = p;
          c.transport = transport;
          c.kind = kind;
          c.nranks = 2 + (int)(rng.next() % 4);
          c.count = counts[rng.next() % 3];
          std::vector<Coll> colls;
          for (Coll co : {Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter, Coll::Broadcast,
                          Coll::Reduce}) {
            if (kind == Kind::Op && !coll_has_op(co)) continue;
            if (kind == Kind::Root && !coll_has_root(co)) continue;
            colls.push_back(co);
          }
          // the algorithms of all-reduce only: all-reduce; direct: all-reduce,
          // broadcast and reduce
          const bool allreduce_only = !strcmp(p.algo, "tree") || !strcmp(p.algo, "rd");
          if (allreduce_only) {
            if (kind == Kind::Root) continue;
            colls = {Coll::AllReduce};
          }
          if (!strcmp(p.algo, "direct")) {
            std::vector<Coll> kept;
            for (Coll co : colls)
              if (co == Coll::AllReduce || co == Coll::Broadcast || co == Coll::Reduce)
                kept.push_back(co);
            colls = kept;
          }
          c.coll = colls[rng.next() % colls.size()];
          c.odd_rank = (int)(rng.next() % (uint64_t)c.nranks);
          if (kind == Kind::Root) c.odd_rank = 1 + (int)(rng.next() % (uint64_t)(c.nranks - 1));
          cases.push_back(c);
        }
      }
  return cases;
}

TEST(SignatureEveryPath, MismatchFailsEveryRankQuickly) {
  const uint64_t seed = test_seed();
  const char *full = getenv("WEFT_TEST_FULL");
  const std::vector<Case> cases = sampled_cases(seed, full != nullptr ? 3 : 1);
  printf("seed %llu: %zu cases\n", (unsigned long long)seed, cases.size());
  Tally *tally = (Tally *)mmap(nullptr, sizeof(Tally), PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(tally, MAP_FAILED);
  for (const Case &c : cases) {
    RunOptions opts;
    opts.timeout_s = 90;
    opts.allow_warnings = true;
    opts.env = {{"WEFT_TIMEOUT", "30"}, {"WEFT_SLOT_BYTES", "4096"}, {"WEFT_NCHANNELS", "2"}};
    if (c.path.algo[0]) opts.env.push_back({"WEFT_ALGO", c.path.algo});
    if (c.path.proto[0]) opts.env.push_back({"WEFT_PROTO", c.path.proto});
    if (!strcmp(c.transport, "hosts")) {  // a host per rank, over sockets
      opts.host_of = one_host_per_rank("sig");
      opts.env.push_back({"WEFT_UCX_DISABLE", "1"});
    }
    else if (c.transport[0]) opts.env.push_back({"WEFT_TRANSPORT", c.transport});
    const std::string name = case_name(c);
    printf("%s\n", name.c_str());
    fflush(stdout);
    memset(tally, 0, sizeof *tally);
    run_comm(c.nranks, opts, [&](const RankCtx &ctx, weftComm_t comm) {
      return run_rank(ctx, comm, c, tally);
    });
    // all-reduce (every rank's result depends on every link's check):
    // never success; the chains of the other ring collectives: a rank
    // upstream of the refusing one may finish (its next call fails, above)
    EXPECT_EQ(tally->succeeded, 0) << name << ": ranks returned success";
    EXPECT_GE(tally->refused, 1) << name << ": no rank named the difference";
    EXPECT_LT(tally->slowest_ms, 1000) << name << ": an error took " << tally->slowest_ms
                                       << " ms";
  }
  munmap(tally, sizeof *tally);
}

}  // namespace

namespace {

// Named cases, each with the message every refusing rank gives: one rank's
// count differs under the ring's SIMPLE protocol (the first slots of both
// are the same size, the tails differ); datatypes of one size and ops under
// the ring's two protocols and the tree; ranks naming different roots of a
// broadcast on the tuner's path.
struct Named {
  const char *name;
  const char *algo, *proto;
  int nranks;
  Coll coll;
  size_t count[2];          // rank 0's, the others'
  weftDataType_t type[2];
  weftRedOp_t op[2];
  int root[2];
  const char *differs;      // what the refusals say differs
};

const Named kNamed[] = {
    {"ring SIMPLE, count 1000 against 1024", "ring", "simple", 2, Coll::AllReduce, {1000, 1024},
     {weftFloat32, weftFloat32}, {weftSum, weftSum}, {0, 0},
     "count differs: rank 0 has 1000, rank 1 has 1024"},
    {"ring LL, float64 against int64", "ring", "ll", 2, Coll::AllReduce, {512, 512},
     {weftFloat64, weftInt64}, {weftSum, weftSum}, {0, 0},
     "datatype differs: rank 0 has float64, rank 1 has int64"},
    {"ring SIMPLE, float64 against int64", "ring", "simple", 3, Coll::AllReduce, {512, 512},
     {weftFloat64, weftInt64}, {weftSum, weftSum}, {0, 0}, "datatype differs: "},
    {"tree, float64 against int64", "tree", "", 2, Coll::AllReduce, {512, 512},
     {weftFloat64, weftInt64}, {weftSum, weftSum}, {0, 0},
     "datatype differs: rank 0 has float64, rank 1 has int64"},
    {"ring LL, sum against max", "ring", "ll", 3, Coll::AllReduce, {512, 512},
     {weftFloat32, weftFloat32}, {weftSum, weftMax}, {0, 0}, "op differs: "},
    {"ring SIMPLE, sum against max", "ring", "simple", 2, Coll::AllReduce, {70000, 70000},
     {weftFloat32, weftFloat32}, {weftSum, weftMax}, {0, 0},
     "op differs: rank 0 has sum, rank 1 has max"},
    {"tree, sum against max", "tree", "", 3, Coll::AllReduce, {70000, 70000},
     {weftFloat32, weftFloat32}, {weftSum, weftMax}, {0, 0}, "op differs: "},
    {"broadcast root 0 against 1, the tuner's path", "", "", 3, Coll::Broadcast, {1024, 1024},
     {weftFloat32, weftFloat32}, {weftSum, weftSum}, {0, 1}, "root differs: "},
};

TEST(SignatureEveryPath, NamedCases) {
  for (const Named &c : kNamed) {
    RunOptions opts;
    opts.timeout_s = 90;
    opts.allow_warnings = true;
    opts.env = {{"WEFT_TIMEOUT", "30"}};
    if (c.algo[0]) opts.env.push_back({"WEFT_ALGO", c.algo});
    if (c.proto[0]) opts.env.push_back({"WEFT_PROTO", c.proto});
    SCOPED_TRACE(c.name);
    printf("%s\n", c.name);
    run_comm(c.nranks, opts, [&](const RankCtx &ctx, weftComm_t comm) {
      const int i = ctx.rank == 0 ? 0 : 1;
      const size_t count = c.count[i], esize = weftTypeSize(c.type[i]), guard = 256;
      std::vector<uint8_t> in(count * esize, 0x3f), out(count * esize + guard, 0x5a);
      const double t0 = now_s();
      weftResult_t res =
          c.coll == Coll::AllReduce
              ? weftAllReduce(in.data(), out.data(), count, c.type[i], c.op[i], comm, nullptr)
              : weftBroadcast(in.data(), out.data(), count, c.type[i], c.root[i], comm, nullptr);
      const double took = now_s() - t0;
      const std::string msg = weftGetLastError(comm);
      printf("  rank %d: %s after %.3f s: %s\n", ctx.rank, weftGetErrorString(res), took,
             msg.c_str());
      for (size_t b = count * esize; b < out.size(); b++)
        FAIL_IF(out[b] != 0x5a, "byte %zu past the output written", b - count * esize);
      FAIL_IF(took > 1.0, "the error took %.2f s", took);
      if (res == weftInvalidUsage)
        FAIL_IF(msg.find(c.differs) == std::string::npos, "refused with \"%s\", want \"%s\"",
                msg.c_str(), c.differs);
      // the comm's first call: numbered as the trace and the hang verdicts number it,
      // in the refusal and in the next call's (the comm is broken)
      if (res == weftInvalidUsage) {
        FAIL_IF(msg.find(" #1: ") == std::string::npos, "the refusal \"%s\" has no call number",
                msg.c_str());
        float one = 1, got = 0;
        FAIL_IF(weftAllReduce(&one, &got, 1, weftFloat32, weftSum, comm, nullptr) == weftSuccess,
                "the next call ran on a broken comm");
        const std::string next = weftGetLastError(comm);
        FAIL_IF(next.find("broken") == std::string::npos || next.find(" #1: ") == std::string::npos,
                "the next call's refusal \"%s\" names no numbered cause", next.c_str());
      }
      FAIL_IF(res != weftInvalidUsage && res != weftRemoteError, "returned %s",
              weftGetErrorString(res));
      return 0;
    });
  }
}

}  // namespace
