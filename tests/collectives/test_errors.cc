// Bad input gets a clear code and message and never crashes or writes.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <unistd.h>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

extern "C" {
#include "transport/bootstrap/bootstrap.h"
}

using namespace weft_test;

namespace {

// A one-rank communicator serves the argument checks.
class Errors : public testing::Test {
 protected:
  void SetUp() override {
    weftUniqueId id;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess) << weftGetLastError(nullptr);
    ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess) << weftGetLastError(nullptr);
  }
  void TearDown() override { EXPECT_EQ(weftCommDestroy(comm), weftSuccess); }

  // Calls all-reduce and expects code, a message containing needle, and an
  // untouched output.
  void expect_rejected(const void *send, size_t count, weftDataType_t t, weftRedOp_t op,
                       weftStream_t stream, weftResult_t code, const char *needle) {
    std::vector<uint8_t> out(64, 0x5a);
    weftResult_t res = weftAllReduce(send, out.data(), count, t, op, comm, stream);
    EXPECT_EQ(res, code) << weftGetErrorString(res);
    EXPECT_NE(std::string(weftGetLastError(comm)).find(needle), std::string::npos)
        << "message: " << weftGetLastError(comm);
    for (uint8_t b : out) ASSERT_EQ(b, 0x5a) << "output written on a rejected call";
  }

  weftComm_t comm = nullptr;
};

TEST_F(Errors, NullComm) {
  float x[4] = {0};
  EXPECT_EQ(weftAllReduce(x, x, 4, weftFloat32, weftSum, nullptr, nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("comm is NULL"), std::string::npos);
  int v;
  EXPECT_EQ(weftCommCount(nullptr, &v), weftInvalidArgument);
  EXPECT_EQ(weftCommUserRank(nullptr, &v), weftInvalidArgument);
  EXPECT_EQ(weftCommCuDevice(nullptr, &v), weftInvalidArgument);
  EXPECT_EQ(weftCommDestroy(nullptr), weftInvalidArgument);
  EXPECT_EQ(weftCommAbort(nullptr), weftInvalidArgument);
  EXPECT_EQ(weftCommFinalize(nullptr), weftInvalidArgument);
  weftResult_t async;
  EXPECT_EQ(weftCommGetAsyncError(nullptr, &async), weftInvalidArgument);
}

TEST_F(Errors, NullBuffers) {
  float x[4] = {1, 2, 3, 4};
  expect_rejected(nullptr, 4, weftFloat32, weftSum, nullptr, weftInvalidArgument, "sendbuff is NULL");
  std::vector<uint8_t> before(x, x + 4);
  EXPECT_EQ(weftAllReduce(x, nullptr, 4, weftFloat32, weftSum, comm, nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("recvbuff is NULL"), std::string::npos);
  // count 0 needs no buffers
  EXPECT_EQ(weftAllReduce(nullptr, nullptr, 0, weftFloat32, weftSum, comm, nullptr), weftSuccess);
}

TEST_F(Errors, BadDatatypeAndOp) {
  float x[4] = {0};
  expect_rejected(x, 4, (weftDataType_t)weftNumTypes, weftSum, nullptr, weftInvalidArgument,
                  "invalid datatype");
  expect_rejected(x, 4, (weftDataType_t)-1, weftSum, nullptr, weftInvalidArgument,
                  "invalid datatype");
  expect_rejected(x, 4, weftFloat32, (weftRedOp_t)weftNumOps, nullptr, weftInvalidArgument,
                  "invalid reduction op");
  expect_rejected(x, 4, weftFloat32, (weftRedOp_t)-3, nullptr, weftInvalidArgument,
                  "invalid reduction op");
  EXPECT_EQ(weftTypeSize((weftDataType_t)99), 0u);
}

TEST_F(Errors, OverlapAndStream) {
  std::vector<float> buf(64, 1.0f);
  EXPECT_EQ(weftAllReduce(buf.data(), buf.data() + 1, 8, weftFloat32, weftSum, comm, nullptr),
            weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("overlap"), std::string::npos);
  float x[4] = {0};
  int fake_stream;
  expect_rejected(x, 4, weftFloat32, weftSum, &fake_stream, weftInvalidArgument, "stream");
}

TEST_F(Errors, NullOutputsOfQueries) {
  EXPECT_EQ(weftCommCount(comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftCommUserRank(comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftCommCuDevice(comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftCommGetAsyncError(comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftGetVersion(nullptr), weftInvalidArgument);
  int v = 0;
  EXPECT_EQ(weftGetVersion(&v), weftSuccess);
  EXPECT_EQ(v, WEFT_VERSION_CODE);
  weftResult_t async = weftInternalError;
  EXPECT_EQ(weftCommGetAsyncError(comm, &async), weftSuccess);
  EXPECT_EQ(async, weftSuccess);
}

TEST_F(Errors, FinalizedCommRefusesWork) {
  float x[4] = {0};
  // recorded in a group before the finalize, run after it: refused when it
  // starts, the buffer untouched
  float y[4] = {1, 2, 3, 4}, z[4] = {9, 9, 9, 9};
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  EXPECT_EQ(weftAllReduce(y, z, 4, weftFloat32, weftSum, comm, nullptr), weftSuccess);
  EXPECT_EQ(weftCommFinalize(comm), weftSuccess);
  EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("finalized"), std::string::npos)
      << weftGetLastError(nullptr);
  EXPECT_EQ(z[0], 9.0f);
  EXPECT_EQ(weftAllReduce(x, x, 4, weftFloat32, weftSum, comm, nullptr), weftInvalidUsage);
  // the state is asked before the arguments: after the finalize a bad
  // argument is the same weftInvalidUsage, saying why
  EXPECT_EQ(weftAllReduce(x, x, 4, (weftDataType_t)40, weftSum, comm, nullptr), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("finalized"), std::string::npos)
      << weftGetLastError(comm);
  EXPECT_EQ(weftBroadcast(x, x, 4, weftFloat32, 5, comm, nullptr), weftInvalidUsage);
  EXPECT_EQ(weftSend(x, 4, weftFloat32, 9, comm, nullptr), weftInvalidUsage);
  EXPECT_EQ(weftGather(x, x, 1, (weftDataType_t)40, 0, comm, nullptr), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("finalized"), std::string::npos)
      << weftGetLastError(comm);
  EXPECT_EQ(weftScatter(x, x, 1, weftFloat32, 7, comm, nullptr), weftInvalidUsage);
  EXPECT_EQ(weftAlltoAll(x, x, 1, weftFloat32, comm, nullptr), weftInvalidUsage);
  // only destroy may follow: no new reduction op either
  weftRedOp_t op;
  float scale = 0.5f;
  EXPECT_EQ(weftRedOpCreatePreMulSum(&op, &scale, weftFloat32, weftScalarHostImmediate, comm),
            weftInvalidUsage);
}

// Every refusal of a call that names a comm becomes that comm's last error,
// whatever refused it (the collectives' checks, the gather's and
// all-to-all's own, the queries, the setters), never an older failure's.
TEST_F(Errors, EveryRefusalIsTheCommsLastError) {
  float x[8] = {0};
  int v = 0;
  weftResult_t async;
  struct Refusal {
    const char *what;
    std::function<weftResult_t()> call;
    const char *needle;
  };
  const Refusal refusals[] = {
      {"gather root", [&] { return weftGather(x, x + 4, 1, weftFloat32, 7, comm, nullptr); },
       "root 7"},
      {"gather negative root", [&] { return weftGather(x, x + 4, 1, weftFloat32, -7, comm, nullptr); },
       "root -7"},
      {"scatter root -1", [&] { return weftScatter(x, x + 4, 1, weftFloat32, -1, comm, nullptr); },
       "root -1 out of range"},
      {"scatter type", [&] { return weftScatter(x, x + 4, 1, (weftDataType_t)77, 0, comm, nullptr); },
       "datatype 77"},
      {"all-to-all overlap", [&] { return weftAlltoAll(x, x, 1, weftFloat32, comm, nullptr); },
       "overlap"},
      {"set timeout", [&] { return weftCommSetTimeout(comm, -5); }, "timeoutMs -5"},
      {"count", [&] { return weftCommCount(comm, nullptr); }, "count is NULL"},
      {"user rank", [&] { return weftCommUserRank(comm, nullptr); }, "rank is NULL"},
      {"device", [&] { return weftCommCuDevice(comm, nullptr); }, "device is NULL"},
      {"async error", [&] { return weftCommGetAsyncError(comm, nullptr); }, "asyncError is NULL"},
      {"revoke flags", [&] { return weftCommRevoke(comm, 4); }, "flags 0x4"},
  };
  for (const Refusal &r : refusals) {
    // an earlier failure of another kind first, whose text must not stay
    ASSERT_EQ(weftAllReduce(x, x, 4, (weftDataType_t)99, weftSum, comm, nullptr),
              weftInvalidArgument);
    EXPECT_EQ(r.call(), weftInvalidArgument) << r.what;
    EXPECT_NE(std::string(weftGetLastError(comm)).find(r.needle), std::string::npos)
        << r.what << ": the comm's last error is \"" << weftGetLastError(comm) << "\"";
    EXPECT_STREQ(weftGetLastError(comm), weftGetLastError(nullptr)) << r.what;
  }
  EXPECT_EQ(weftCommCount(comm, &v), weftSuccess);
  EXPECT_EQ(weftCommGetAsyncError(comm, &async), weftSuccess);
  EXPECT_EQ(async, weftSuccess);
}

TEST(ErrorsNoComm, InitArguments) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  EXPECT_EQ(weftCommInitRank(&comm, 0, id, 0), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("nranks"), std::string::npos);
  EXPECT_EQ(weftCommInitRank(&comm, 2, id, 2), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("out of range"), std::string::npos);
  EXPECT_EQ(weftCommInitRank(&comm, 2, id, -1), weftInvalidArgument);
  EXPECT_EQ(weftCommInitRank(nullptr, 1, id, 0), weftInvalidArgument);
  EXPECT_EQ(weftGetUniqueId(nullptr), weftInvalidArgument);
  EXPECT_EQ(weftCommInitAll(nullptr, 2, nullptr), weftInvalidArgument);
  weftComm_t comms[1];
  EXPECT_EQ(weftCommInitAll(comms, 0, nullptr), weftInvalidArgument);
  weftUniqueId garbage;
  memset(&garbage, 0x42, sizeof garbage);
  EXPECT_EQ(weftCommInitRank(&comm, 1, garbage, 0), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("not a weft id"), std::string::npos);
}

TEST(ErrorsNoComm, ConfigMagicAndSize) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.magic = 0;
  EXPECT_EQ(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("WEFT_CONFIG_INITIALIZER"),
            std::string::npos);
  config = WEFT_CONFIG_INITIALIZER;
  config.size = 1u << 20;
  EXPECT_EQ(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument);
  // an older, shorter config is read up to its size
  config = WEFT_CONFIG_INITIALIZER;
  config.size = offsetof(weftConfig_t, timeoutMs);
  ASSERT_EQ(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftSuccess)
      << weftGetLastError(nullptr);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// Each field of the config out of the range NCCL gives its own (blocking 0
// or 1, channel bounds 1 and up, the least at most the most; a timeout is
// positive) is refused, naming the field; WEFT_CONFIG_UNDEF_INT is the
// default; blocking = 0 is accepted and init completes apart
// (weftInProgress until weftCommGetAsyncError says weftSuccess).
TEST(ErrorsNoComm, ConfigRanges) {
  struct Bad {
    const char *field;
    std::function<void(weftConfig_t &)> set;
  };
  const Bad bads[] = {
      {"maxChannels", [](weftConfig_t &c) { c.maxChannels = 0; }},
      {"maxChannels", [](weftConfig_t &c) { c.maxChannels = -4; }},
      {"minChannels", [](weftConfig_t &c) { c.minChannels = 0; }},
      {"minChannels", [](weftConfig_t &c) { c.minChannels = -1; }},
      {"minChannels", [](weftConfig_t &c) { c.minChannels = 5, c.maxChannels = 2; }},
      {"timeoutMs", [](weftConfig_t &c) { c.timeoutMs = -3; }},
      {"timeoutMs", [](weftConfig_t &c) { c.timeoutMs = 0; }},
      {"blocking", [](weftConfig_t &c) { c.blocking = 2; }},
      {"blocking", [](weftConfig_t &c) { c.blocking = -1; }},
  };
  for (const Bad &b : bads) {
    weftUniqueId id;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
    weftComm_t comm = nullptr;
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    b.set(config);
    EXPECT_EQ(weftCommInitRankConfig(&comm, 1, id, 0, &config), weftInvalidArgument) << b.field;
    EXPECT_NE(std::string(weftGetLastError(nullptr)).find(std::string("config ") + b.field),
              std::string::npos) << weftGetLastError(nullptr);
    EXPECT_EQ(comm, nullptr);
    if (comm != nullptr) weftCommDestroy(comm);
  }
  // in range, the defaults, blocking 0 and a bound above the executors'
  // (lowered to it, as NCCL lowers its CTA counts): all make a working comm
  const std::function<void(weftConfig_t &)> goods[] = {
      [](weftConfig_t &) {},
      [](weftConfig_t &c) { c.blocking = 0; },
      [](weftConfig_t &c) { c.minChannels = 1, c.maxChannels = 1, c.timeoutMs = 5000; },
      [](weftConfig_t &c) { c.minChannels = 100; },
  };
  for (const auto &set : goods) {
    weftUniqueId id;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
    weftComm_t comm = nullptr;
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    set(config);
    const weftResult_t res = weftCommInitRankConfig(&comm, 1, id, 0, &config);
    ASSERT_EQ(res, config.blocking == 0 ? weftInProgress : weftSuccess)
        << weftGetLastError(nullptr);
    for (weftResult_t state = weftInProgress; state == weftInProgress;)
      ASSERT_EQ(weftCommGetAsyncError(comm, &state), weftSuccess);
    float x[3] = {1, 2, 3};
    EXPECT_EQ(weftAllReduce(x, x, 3, weftFloat32, weftSum, comm, nullptr), weftSuccess);
    EXPECT_EQ(x[2], 3.0f);
    EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
  }
}

// blocking = 0: one thread makes three ranks one after another (each call
// returns at once with weftInProgress and the comm), outside a group and
// inside one (weft's own inits run at the call there too); a call on a comm
// still being created is refused saying so; once every comm's async error
// is weftSuccess they all-reduce right.
TEST(ErrorsNoComm, NonblockingInitFromOneThread) {
  for (int grouped = 0; grouped < 2; grouped++) {
    weftUniqueId id;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
    weftConfig_t config = WEFT_CONFIG_INITIALIZER;
    config.blocking = 0;
    weftComm_t comm[3] = {};
    if (grouped) {
      ASSERT_EQ(weftGroupStart(), weftSuccess);
    }
    for (int r = 0; r < 3; r++) {
      const weftResult_t res = weftCommInitRankConfig(&comm[r], 3, id, r, &config);
      ASSERT_EQ(res, weftInProgress) << weftGetLastError(nullptr);
      ASSERT_NE(comm[r], nullptr);
      if (r == 0) {
        int n = 0;
        EXPECT_EQ(weftCommCount(comm[0], &n), weftInvalidArgument);
        EXPECT_NE(std::string(weftGetLastError(nullptr)).find("being created"),
                  std::string::npos) << weftGetLastError(nullptr);
        weftResult_t state = weftSuccess;
        ASSERT_EQ(weftCommGetAsyncError(comm[0], &state), weftSuccess);
        EXPECT_EQ(state, weftInProgress);
      }
    }
    if (grouped) {
      ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    }
    for (int r = 0; r < 3; r++)
      for (weftResult_t state = weftInProgress; state != weftSuccess;) {
        ASSERT_EQ(weftCommGetAsyncError(comm[r], &state), weftSuccess);
        ASSERT_TRUE(state == weftSuccess || state == weftInProgress)
            << state << ": " << weftGetLastError(comm[r]);
      }
    std::vector<int64_t> buf[3];
    for (int r = 0; r < 3; r++) buf[r].assign(1001, int64_t{r + 1} * 1000003);
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < 3; r++)
      ASSERT_EQ(weftAllReduce(buf[r].data(), buf[r].data(), buf[r].size(), weftInt64, weftSum,
                              comm[r], nullptr),
                weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    for (int r = 0; r < 3; r++) {
      for (int64_t v : buf[r]) ASSERT_EQ(v, 6 * 1000003) << "rank " << r;
      EXPECT_EQ(weftCommDestroy(comm[r]), weftSuccess);
    }
  }
}

// A nonblocking init reads a config only as far as its size goes (one
// compiled against an older, shorter weftConfig_t): what lies after it is
// not read (a pointer-sized word there, not a name).
TEST(ErrorsNoComm, NonblockingInitReadsAShortConfig) {
  struct {
    weftConfig_t config;
    char after[64];
  } mem;
  memset(&mem, 0x5a, sizeof mem);
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.size = offsetof(weftConfig_t, commName);
  config.blocking = 0;
  memcpy(&mem.config, &config, config.size);
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm = nullptr;
  ASSERT_EQ(weftCommInitRankConfig(&comm, 1, id, 0, &mem.config), weftInProgress)
      << weftGetLastError(nullptr);
  weftResult_t state = weftInProgress;
  while (state == weftInProgress) ASSERT_EQ(weftCommGetAsyncError(comm, &state), weftSuccess);
  EXPECT_EQ(state, weftSuccess) << weftGetLastError(comm);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// A destroy that waits for a creation whose peer never comes, and an abort
// of the same comm from another thread meanwhile: both return (the abort at
// once, leaving the comm to the destroy), nothing is freed twice.
TEST(ErrorsNoComm, NonblockingDestroyWhileAnotherThreadAborts) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.timeoutMs = 1500;
  weftComm_t comm = nullptr;
  ASSERT_EQ(weftCommInitRankConfig(&comm, 2, id, 0, &config), weftInProgress);
  std::thread destroyer([comm] { EXPECT_EQ(weftCommDestroy(comm), weftSuccess); });
  usleep(200000);
  const double t0 = now_s();
  EXPECT_EQ(weftCommAbort(comm), weftSuccess);
  EXPECT_LT(now_s() - t0, 0.5) << "the abort waited";
  destroyer.join();
}

TEST(ErrorsNoComm, GroupEndWithoutStart) {
  EXPECT_EQ(weftGroupEnd(), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("without weftGroupStart"),
            std::string::npos);
}

TEST(ErrorsNoComm, ErrorStrings) {
  for (int r = 0; r <= weftNumResults; r++) {
    const char *s = weftGetErrorString((weftResult_t)r);
    ASSERT_NE(s, nullptr);
    EXPECT_GT(strlen(s), 3u);
  }
}

// A group whose recording failed runs nothing and reports the failure.
TEST(ErrorsNoComm, GroupWithBadCallRunsNothing) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess);
  float in[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  EXPECT_EQ(weftAllReduce(in, out, 4, weftFloat32, weftSum, comm, nullptr), weftSuccess);
  EXPECT_EQ(weftAllReduce(in, out, 4, (weftDataType_t)77, weftSum, comm, nullptr),
            weftInvalidArgument);
  EXPECT_EQ(weftGroupEnd(), weftInvalidArgument);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// A handle is looked up, never read: one the comm did not hand out, one
// deregistered already and another comm's are refused (weftInvalidUsage, as
// NCCL's), and registrations left at destroy are the comm's to free.
TEST_F(Errors, DeregisterUnknownHandle) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t other;
  ASSERT_EQ(weftCommInitRank(&other, 1, id, 0), weftSuccess);
  std::vector<float> buf(64);
  uint64_t not_a_handle[8] = {0};
  EXPECT_EQ(weftCommDeregister(comm, not_a_handle), weftInvalidUsage);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("not registered with"), std::string::npos)
      << weftGetLastError(nullptr);
  void *handle = nullptr, *theirs = nullptr, *kept = nullptr;
  ASSERT_EQ(weftCommRegister(comm, buf.data(), 64 * sizeof(float), &handle), weftSuccess);
  ASSERT_EQ(weftCommRegister(other, buf.data(), 64 * sizeof(float), &theirs), weftSuccess);
  EXPECT_EQ(weftCommDeregister(comm, theirs), weftInvalidUsage);
  EXPECT_EQ(weftCommDeregister(comm, handle), weftSuccess);
  EXPECT_EQ(weftCommDeregister(comm, handle), weftInvalidUsage);
  EXPECT_EQ(weftCommDeregister(comm, nullptr), weftInvalidArgument);
  // left registered: freed with their comm
  ASSERT_EQ(weftCommRegister(comm, buf.data(), 16, &kept), weftSuccess);
  EXPECT_EQ(weftCommDestroy(other), weftSuccess);
}

// weftMemFree frees what weftMemAlloc and weftMemAllocHost handed out, small
// (the heap) and large (shareable), once; anything else is refused.
TEST(ErrorsNoComm, MemFreeOfUnknownPointer) {
  int local = 0;
  EXPECT_EQ(weftMemFree(&local), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(nullptr)).find("MemFree"), std::string::npos);
  void *heap = malloc(64);
  ASSERT_NE(heap, nullptr);
  EXPECT_EQ(weftMemFree(heap), weftInvalidArgument);
  free(heap);
  for (size_t nbytes : {size_t(100), size_t(1) << 20}) {
    void *p = nullptr;
    ASSERT_EQ(weftMemAlloc(&p, nbytes), weftSuccess);
    EXPECT_EQ(weftMemFree(static_cast<char *>(p) + 8), weftInvalidArgument) << nbytes;
    EXPECT_EQ(weftMemFree(p), weftSuccess) << nbytes;
    EXPECT_EQ(weftMemFree(p), weftInvalidArgument) << nbytes;
  }
  EXPECT_EQ(weftMemFree(nullptr), weftSuccess);
}

// Ranks holding different ids: the impostor is refused by the root, the
// others fail within the timeout instead of waiting forever.
TEST(ErrorsMultiRank, MismatchedUniqueId) {
  RunOptions opts;
  opts.timeout_s = 30;
  opts.allow_warnings = true;  // the root logs the refusal
  opts.env = {{"WEFT_TIMEOUT", "3"}};
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftUniqueId id = ctx.id;
    if (ctx.rank == 1) {
      struct bootstrap_id b;
      memcpy(&b, id.internal, sizeof b);
      b.secret[0] ^= 0xff;  // right address, wrong secret
      memcpy(id.internal, &b, sizeof b);
    }
    weftComm_t comm;
    weftResult_t res = weftCommInitRank(&comm, 2, id, ctx.rank);
    std::string msg = weftGetLastError(nullptr);
    if (ctx.rank == 1) {
      if (res != weftInvalidArgument || msg.find("wrong secret") == std::string::npos)
        return rank_fail(ctx, "impostor got %d: %s", res, msg.c_str());
    } else if (res == weftSuccess) {
      return rank_fail(ctx, "init succeeded without its peer");
    }
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// Ranks that disagree on the size, or two processes that take one rank:
// every rank fails at once with weftInvalidArgument naming the reason, the
// refused one and the others (which joined and waited for WEFT_TIMEOUT
// before: the job could not finish joining).
TEST(ErrorsMultiRank, MismatchedNranks) {
  RunOptions opts;
  opts.timeout_s = 30;
  opts.allow_warnings = true;
  opts.env = {{"WEFT_TIMEOUT", "20"}};
  for (const bool dup : {false, true}) {
    auto status = run_ranks(2, [dup](const RankCtx &ctx) {
      weftComm_t comm;
      if (ctx.rank == 1) usleep(200000);  // rank 0 sets the size first
      const double t0 = now_s();
      weftResult_t res = dup ? weftCommInitRank(&comm, 2, ctx.id, 0)
                             : weftCommInitRank(&comm, ctx.rank == 0 ? 2 : 3, ctx.id, ctx.rank);
      const double took = now_s() - t0;
      const std::string msg = weftGetLastError(nullptr);
      const char *why = dup ? "already joined with this rank" : "nranks differs";
      if (res != weftInvalidArgument || msg.find(why) == std::string::npos)
        return rank_fail(ctx, "got %d: %s", res, msg.c_str());
      if (ctx.rank == 0 && msg.find("refused another process of this job") == std::string::npos)
        return rank_fail(ctx, "the joined rank was not told: %s", msg.c_str());
      if (took > 5) return rank_fail(ctx, "failed after %.1f s, not at once", took);
      return 0;
    }, opts);
    EXPECT_EQ(status[0], 0) << (dup ? "one rank taken twice" : "sizes differ");
    EXPECT_EQ(status[1], 0) << (dup ? "one rank taken twice" : "sizes differ");
  }
}

}  // namespace
