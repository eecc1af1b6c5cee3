// Send/recv, groups, all-to-all, gather and scatter over forked ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <chrono>
#include <thread>

#include "coll_ref.h"
#include "harness.h"
#include "weft_build_config.h"

extern "C" {
#include "collectives/core/comm.h"
#include "collectives/exec/host/prims_peer.h"
}

using namespace weft_test;

namespace {

// A message's content: unique per (sender, receiver, index), checkable bytes.
std::vector<uint8_t> message(int from, int to, int index, size_t nbytes) {
  std::vector<uint8_t> m(nbytes);
  Rng rng((uint64_t)from * 1000003u + (uint64_t)to * 1009u + (uint64_t)index);
  for (auto &b : m) b = (uint8_t)rng.next();
  return m;
}

// Elements each ordered pair exchanges: 0, small, and several slots' worth.
size_t pair_count(int from, int to) {
  static const size_t sizes[] = {0, 1, 77, 1000, 5003};
  return sizes[(from * 3 + to * 5) % 5];
}

RunOptions small_slots() {
  RunOptions o;
  o.timeout_s = 120;
  o.env = {{"WEFT_SLOT_BYTES", "256"}, {"WEFT_NSLOTS", "2"}, {"WEFT_TIMEOUT", "30"}};
  return o;
}

int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

// 8 ranks: every rank sends to and receives from every rank (itself too) in a
// random order inside one group, with messages far larger than the FIFOs.
TEST(Sendrecv, AllToAllRandomOrderInGroup) {
  const uint64_t seed = test_seed();
  for (int nranks : {2, 5, 8}) {
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      const int n = ctx.nranks, me = ctx.rank;
      std::vector<std::vector<uint8_t>> out(n), in(n);
      struct Op { bool send; int peer; };
      std::vector<Op> ops;
      for (int p = 0; p < n; p++) {
        out[p] = message(me, p, 0, pair_count(me, p) * 4);
        in[p].assign(pair_count(p, me) * 4, 0xa5);
        ops.push_back({true, p});
        ops.push_back({false, p});
      }
      std::mt19937_64 shuffle(seed + (uint64_t)me);
      std::shuffle(ops.begin(), ops.end(), shuffle);
      weftGroupStart();
      for (const Op &op : ops) {
        weftResult_t res = op.send ? weftSend(out[op.peer].data(), out[op.peer].size() / 4,
                                              weftFloat32, op.peer, comm, nullptr)
                                   : weftRecv(in[op.peer].data(), in[op.peer].size() / 4,
                                              weftFloat32, op.peer, comm, nullptr);
        if (res != weftSuccess) return rank_fail(ctx, "recording: %s", weftGetLastError(comm));
      }
      if (weftGroupEnd() != weftSuccess)
        return rank_fail(ctx, "group: %s", weftGetLastError(comm));
      for (int p = 0; p < n; p++)
        if (in[p] != message(p, me, 0, pair_count(p, me) * 4))
          return rank_fail(ctx, "message from rank %d is wrong", p);
      weftCommDestroy(comm);
      return 0;
    }, small_slots());
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// Several messages to one peer in a group arrive in order; outside a group a
// send larger than the FIFO completes once the peer receives.
TEST(Sendrecv, OrderPerPeerAndBlockingCalls) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const int peer = 1 - ctx.rank;
    const size_t sizes[] = {3000, 0, 17, 4096};
    std::vector<std::vector<uint8_t>> got(4);
    weftGroupStart();
    for (int i = 0; i < 4; i++) {
      if (ctx.rank == 0) {
        static std::vector<uint8_t> m[4];
        m[i] = message(0, 1, i, sizes[i]);
        weftSend(m[i].data(), sizes[i], weftUint8, peer, comm, nullptr);
      } else {
        got[i].assign(sizes[i], 0);
        weftRecv(got[i].data(), sizes[i], weftUint8, peer, comm, nullptr);
      }
    }
    if (weftGroupEnd() != weftSuccess) return rank_fail(ctx, "group: %s", weftGetLastError(comm));
    for (int i = 0; ctx.rank == 1 && i < 4; i++)
      if (got[i] != message(0, 1, i, sizes[i])) return rank_fail(ctx, "message %d out of order", i);
    // ping-pong without groups, 64 KiB each way through 512-byte FIFOs
    std::vector<uint8_t> ping = message(ctx.rank, peer, 9, 65536), pong(65536);
    weftResult_t a, b;
    if (ctx.rank == 0) {
      a = weftSend(ping.data(), ping.size(), weftUint8, 1, comm, nullptr);
      b = weftRecv(pong.data(), pong.size(), weftUint8, 1, comm, nullptr);
    } else {
      a = weftRecv(pong.data(), pong.size(), weftUint8, 0, comm, nullptr);
      b = weftSend(ping.data(), ping.size(), weftUint8, 0, comm, nullptr);
    }
    if (a != weftSuccess || b != weftSuccess) return rank_fail(ctx, "ping-pong: %s", weftGetLastError(comm));
    if (pong != message(peer, ctx.rank, 9, 65536)) return rank_fail(ctx, "ping-pong data");
    weftCommDestroy(comm);
    return 0;
  }, small_slots());
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A receive whose count differs from the send is an error, not junk.
TEST(Sendrecv, SizeMismatchIsAnError) {
  for (size_t recv_count : {100, 5000}) {
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      std::vector<float> buf(5000, 1.0f);
      if (ctx.rank == 0) {
        weftSend(buf.data(), 1000, weftFloat32, 1, comm, nullptr);
      } else {
        weftResult_t res = weftRecv(buf.data(), recv_count, weftFloat32, 0, comm, nullptr);
        std::string msg = weftGetLastError(comm);
        if (res != weftInvalidUsage || msg.find("rank 0") == std::string::npos)
          return rank_fail(ctx, "count %zu: got %d: %s", recv_count, res, msg.c_str());
      }
      weftCommAbort(comm);
      return 0;
    }, small_slots());
    EXPECT_EQ(status[0], 0);
    EXPECT_EQ(status[1], 0) << "recv count " << recv_count;
  }
}

// Larger messages leave raw data in a connection's slots. A slot whose first
// word reads as the header of the send that will land there (rank 0 writes
// one through a collective's own send, peer_send, on the sends' connection)
// must not be taken for it: the receive posted before its send waits for the
// real message (it got the raw slot's bytes at once when a header was
// believed at sight in any slot).
TEST(Sendrecv, RawSlotThatReadsAsAHeaderWaitsForTheSend) {
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    uint64_t v = 0x1111;
    if (ctx.rank == 0) weftSend(&v, 1, weftUint64, 1, comm, nullptr);
    else weftRecv(&v, 1, weftUint64, 0, comm, nullptr);
    const uint32_t nslots = comm->nslots;
    if (ctx.rank == 0) {
      struct weft_conn *c = &comm->p2p_send_conns[1];
      // the step nslots on lands in the same slot: its header, last, 8 bytes
      uint32_t raw[4] = {0x80000000u | 0x10000000u | 16u, (uint32_t)(c->step + nslots + 1), 0xdeadbeefu,
                         0xdeadbeefu};
      if (peer_send(comm, c, raw, sizeof raw) != weftSuccess)
        return rank_fail(ctx, "peer_send: %s", weftGetLastError(comm));
    } else {
      uint32_t raw[4];
      if (peer_recv(comm, &comm->p2p_recv_conns[0], raw, sizeof raw) != weftSuccess)
        return rank_fail(ctx, "peer_recv: %s", weftGetLastError(comm));
    }
    for (uint32_t i = 0; i + 1 < nslots; i++) {
      uint64_t m = 100 + i;
      if (ctx.rank == 0) weftSend(&m, 1, weftUint64, 1, comm, nullptr);
      else if (weftRecv(&m, 1, weftUint64, 0, comm, nullptr) != weftSuccess || m != 100 + i)
        return rank_fail(ctx, "message %u: %llu", i, (unsigned long long)m);
    }
    uint64_t last = 0;
    if (ctx.rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      last = 0x0123456789abcdefull;
      weftSend(&last, 1, weftUint64, 1, comm, nullptr);
    } else {
      weftResult_t res = weftRecv(&last, 1, weftUint64, 0, comm, nullptr);
      if (res != weftSuccess || last != 0x0123456789abcdefull)
        return rank_fail(ctx, "the last message: %d, %llx (raw 0xdeadbeefdeadbeef)", res,
                         (unsigned long long)last);
    }
    weftCommDestroy(comm);
    return 0;
  });
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A blocking send that fits the free slots of the FIFO completes before its
// receiver calls, whatever its size and format (one slot with a header, raw
// slots, the whole FIFO): both ranks send first, then receive.
TEST(Sendrecv, SendThatFitsTheFifoCompletesAlone) {
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const int peer = 1 - ctx.rank;
    uint8_t warm_out = 1, warm_in = 0;  // connections are made with both ends calling
    weftGroupStart();
    weftSend(&warm_out, 1, weftUint8, peer, comm, nullptr);
    weftRecv(&warm_in, 1, weftUint8, peer, comm, nullptr);
    if (weftGroupEnd() != weftSuccess) return rank_fail(ctx, "%s", weftGetLastError(comm));
    for (size_t nbytes : {0, 1, 248, 249, 256, 300, 511, 512}) {  // slots of 256 B, 2 of them
      std::vector<uint8_t> out = message(ctx.rank, peer, (int)nbytes, nbytes);
      std::vector<uint8_t> in(nbytes + 1, 0xEE), want = message(peer, ctx.rank, (int)nbytes, nbytes);
      if (weftSend(out.data(), nbytes, weftUint8, peer, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "send of %zu: %s", nbytes, weftGetLastError(comm));
      if (weftRecv(in.data(), nbytes, weftUint8, peer, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "recv of %zu: %s", nbytes, weftGetLastError(comm));
      if (memcmp(in.data(), want.data(), nbytes) != 0 || in[nbytes] != 0xEE)
        return rank_fail(ctx, "recv of %zu: wrong bytes", nbytes);
    }
    // two sends queued before their receives, a slot each: the FIFO holds both
    for (size_t first : {256, 248, 1}) {
      uint8_t a[256], b = (uint8_t)(7 + ctx.rank), a_in[256], b_in = 0;
      memset(a, 0x30 + ctx.rank, sizeof a);
      if (weftSend(a, first, weftUint8, peer, comm, nullptr) != weftSuccess ||
          weftSend(&b, 1, weftUint8, peer, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "queued sends after %zu: %s", first, weftGetLastError(comm));
      if (weftRecv(a_in, first, weftUint8, peer, comm, nullptr) != weftSuccess ||
          weftRecv(&b_in, 1, weftUint8, peer, comm, nullptr) != weftSuccess)
        return rank_fail(ctx, "queued recvs after %zu: %s", first, weftGetLastError(comm));
      if (a_in[0] != 0x30 + peer || a_in[first - 1] != 0x30 + peer || b_in != 7 + peer)
        return rank_fail(ctx, "queued recvs after %zu: wrong bytes", first);
    }
    weftCommDestroy(comm);
    return 0;
  }, small_slots());
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A receive that finds a collective's step where it expects a send fails,
// naming the sender, instead of reading the raw slot as a message.
TEST(Sendrecv, RawStepWhereASendIsExpectedIsAnError) {
  for (const char *slot_bytes : {"256", "65536"}) {
    RunOptions o = small_slots();
    o.env = {{"WEFT_SLOT_BYTES", slot_bytes}, {"WEFT_TIMEOUT", "30"}};
    auto status = run_ranks(2, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      uint64_t v = 7;
      if (ctx.rank == 0) weftSend(&v, 1, weftUint64, 1, comm, nullptr);
      else weftRecv(&v, 1, weftUint64, 0, comm, nullptr);
      if (ctx.rank == 0) {
        uint64_t raw[2] = {0, 0};
        if (peer_send(comm, &comm->p2p_send_conns[1], raw, sizeof raw) != weftSuccess)
          return rank_fail(ctx, "peer_send: %s", weftGetLastError(comm));
        // rank 1's refusal breaks the comm; aborting before it would take the
        // raw step from a socket proxy before it reaches rank 1
        uint8_t b;
        if (weftRecv(&b, 1, weftUint8, 1, comm, nullptr) == weftSuccess)
          return rank_fail(ctx, "a receive from the refusing rank succeeded");
      } else {
        weftResult_t res = weftRecv(&v, 1, weftUint64, 0, comm, nullptr);
        std::string msg = weftGetLastError(comm);
        if (res != weftInvalidUsage || msg.find("rank 0") == std::string::npos ||
            msg.find("not a send") == std::string::npos)
          return rank_fail(ctx, "got %d: %s", res, msg.c_str());
      }
      weftCommAbort(comm);
      return 0;
    }, o);
    EXPECT_EQ(status[0], 0) << slot_bytes;
    EXPECT_EQ(status[1], 0) << slot_bytes;
  }
}

// Sends and receives have connections of their own, apart from the peer
// collectives' (direct, tree, recursive doubling, WEFT_DETERMINISTIC's
// exchanges): a send that fits its FIFO
// completes alone, so a rank may run it and then a collective against a peer
// that runs the collective first, in a group with the receive (which a group
// runs after its collectives) or before its receive. On shared connections
// the collective met the message (one rank failed, the other succeeded).
TEST(Sendrecv, SendThenCollectiveAgainstCollectiveThenReceive) {
  for (const char *algo : {"direct", "tree", "rd", "ring", "cma", "deterministic"}) {
    for (int nranks : {2, 3}) {
      RunOptions o;
      o.env = {{"WEFT_TIMEOUT", "20"}};
      if (strcmp(algo, "deterministic") == 0) o.env.push_back({"WEFT_DETERMINISTIC", "1"});
      else o.env.push_back({"WEFT_ALGO", algo});
      auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
        weftComm_t comm;
        if (int rc = init(ctx, &comm)) return rc;
        // connected first: a first send waits for its receiver to connect
        uint8_t b = 0;
        weftResult_t warm = weftSuccess;
        if (ctx.rank == 0)
          warm = weftSend(&b, 1, weftUint8, 1, comm, nullptr) == weftSuccess
                     ? weftRecv(&b, 1, weftUint8, 1, comm, nullptr)
                     : weftInternalError;
        if (ctx.rank == 1)
          warm = weftRecv(&b, 1, weftUint8, 0, comm, nullptr) == weftSuccess
                     ? weftSend(&b, 1, weftUint8, 0, comm, nullptr)
                     : weftInternalError;
        if (warm != weftSuccess) return rank_fail(ctx, "warm-up: %s", weftGetLastError(comm));
        // up to the FIFO's 8 slots of 128 KiB, header slots and whole ones
        for (size_t n : {(size_t)2, (size_t)3000, (size_t)200000}) {
          for (int grouped = 0; grouped < 2; grouped++) {
            std::vector<float> msg(n), got(n, -1.0f);
            for (size_t i = 0; i < n; i++) msg[i] = (float)(i % 1000) + 0.5f;
            std::vector<float> x(5, 1.0f + (float)ctx.rank);
            weftResult_t res = weftSuccess;
            if (ctx.rank == 0) res = weftSend(msg.data(), n, weftFloat32, 1, comm, nullptr);
            if (ctx.rank == 1 && grouped) {
              res = weftGroupStart();
              if (res == weftSuccess) res = weftRecv(got.data(), n, weftFloat32, 0, comm, nullptr);
            }
            if (res == weftSuccess)
              res = weftAllReduce(x.data(), x.data(), x.size(), weftFloat32, weftSum, comm,
                                  nullptr);
            if (ctx.rank == 1 && res == weftSuccess)
              res = grouped ? weftGroupEnd()
                            : weftRecv(got.data(), n, weftFloat32, 0, comm, nullptr);
            if (res != weftSuccess)
              return rank_fail(ctx, "%s, %zu floats, %s: %s", algo, n,
                               grouped ? "grouped" : "in turn", weftGetLastError(comm));
            const float want = (float)(ctx.nranks * (ctx.nranks + 1) / 2);
            if (x[0] != want || x[4] != want)
              return rank_fail(ctx, "%s, %zu floats: sum %g, want %g", algo, n, x[0], want);
            if (ctx.rank == 1 && memcmp(got.data(), msg.data(), n * sizeof(float)) != 0)
              return rank_fail(ctx, "%s, %zu floats: wrong message", algo, n);
          }
        }
        weftCommDestroy(comm);
        return 0;
      }, o);
      for (int r = 0; r < nranks; r++)
        EXPECT_EQ(status[r], 0) << algo << ", " << nranks << " ranks, rank " << r;
    }
  }
}

TEST(Sendrecv, BadArguments) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess);
  float x[4];
  EXPECT_EQ(weftSend(x, 4, weftFloat32, 1, comm, nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("peer 1 out of range"), std::string::npos);
  EXPECT_EQ(weftRecv(nullptr, 4, weftFloat32, 0, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftSend(x, 4, (weftDataType_t)42, 0, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftGather(x, x, 1, weftFloat32, 3, comm, nullptr), weftInvalidArgument);
  EXPECT_EQ(weftAlltoAll(x, x + 1, 2, weftFloat32, comm, nullptr), weftInvalidArgument);
  // a send to self outside a group has no receive to pair with
  EXPECT_EQ(weftSend(x, 4, weftFloat32, 0, comm, nullptr), weftInvalidUsage);
  EXPECT_EQ(weftSend(x, 0, weftFloat32, 0, comm, nullptr), weftSuccess);  // nothing to pair
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// A stream weft does not know, as a CUDA stream is to it (never used: an
// empty send or receive does nothing).
weftStream_t foreign_stream() {
  static int token;
  return (weftStream_t)&token;
}

// Whether this build takes streams other than its own (CUDA streams).
constexpr bool kCudaBuild = WEFT_HAVE_CUDA;  // weft_build_config.h: 0 or 1

// The buffer of an empty message: NULL, one past the end of the rank's
// buffer, its guard, or an address that faults if touched.
void *empty_ptr(uint64_t pick, std::vector<uint8_t> &buf) {
  switch (pick % 4) {
    case 0: return nullptr;
    case 1: return buf.data() + buf.size();
    case 2: return buf.data() + buf.size() - 8;
    default: return (void *)(uintptr_t)16;
  }
}

// The stream of an empty message: the group's, none, the comm's host stream,
// or, in a CUDA build, a stream weft does not know.
weftStream_t empty_stream(uint64_t pick, weftStream_t group_stream, weftStream_t hs) {
  switch (pick % 4) {
    case 0: return group_stream;
    case 1: return nullptr;
    case 2: return hs;
    default: return kCudaBuild ? foreign_stream() : group_stream;
  }
}

constexpr int kMsgs = 5;  // messages per ordered pair and round

// Elements of message k from `from` to `to` in round r: empty ones often.
size_t empty_mix_count(uint64_t seed, int r, int from, int to, int k) {
  static const size_t counts[] = {0, 0, 1, 3, 700};
  Rng rng(seed * 31u + (uint64_t)r * 7919u + (uint64_t)from * 131u + (uint64_t)to * 17u + (uint64_t)k);
  return counts[rng.next() % 5];
}

// One round: every rank sends kMsgs messages to every rank (itself too) and
// receives as many, in one group in a random order that keeps each pair's
// posting order; the empty ones name any pointer and any stream. Checks
// every message, in order, and the poisoned guard after them.
int empty_mix_round(const RankCtx &ctx, weftComm_t comm, uint64_t seed, int round,
                    weftStream_t group_stream, weftStream_t hs) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t guard = 64;
  std::vector<std::vector<uint8_t>> out(n), in(n);
  std::vector<std::vector<size_t>> out_off(n), in_off(n);
  for (int p = 0; p < n; p++) {
    size_t so = 0, ro = 0;
    for (int k = 0; k < kMsgs; k++) {
      out_off[p].push_back(so);
      in_off[p].push_back(ro);
      so += empty_mix_count(seed, round, me, p, k) * 4;
      ro += empty_mix_count(seed, round, p, me, k) * 4;
    }
    out[p].resize(so + guard);
    for (int k = 0; k < kMsgs; k++) {
      std::vector<uint8_t> m = message(me, p, round * 100 + k, empty_mix_count(seed, round, me, p, k) * 4);
      std::copy(m.begin(), m.end(), out[p].begin() + (ptrdiff_t)out_off[p][k]);
    }
    in[p].assign(ro + guard, 0xa5);
  }
  std::vector<int> tokens;  // 2p: the next send to p; 2p+1: the next receive from p
  for (int p = 0; p < n; p++)
    for (int k = 0; k < kMsgs; k++) tokens.insert(tokens.end(), {2 * p, 2 * p + 1});
  std::mt19937_64 shuffle(seed + (uint64_t)me * 977u + (uint64_t)round);
  std::shuffle(tokens.begin(), tokens.end(), shuffle);
  Rng pick(seed + (uint64_t)me * 13u + (uint64_t)round);
  std::vector<int> next(2 * n, 0);
  FAIL_IF(weftGroupStart() != weftSuccess, "group start");
  for (int tok : tokens) {
    const int p = tok / 2, k = next[tok]++;
    const bool send = tok % 2 == 0;
    const size_t count = send ? empty_mix_count(seed, round, me, p, k) : empty_mix_count(seed, round, p, me, k);
    std::vector<uint8_t> &buf = send ? out[p] : in[p];
    void *ptr = buf.data() + (send ? out_off[p][k] : in_off[p][k]);
    weftStream_t stream = group_stream;
    if (count == 0) {
      ptr = empty_ptr(pick.next(), buf);
      stream = empty_stream(pick.next(), group_stream, hs);
    }
    weftResult_t res = send ? weftSend(ptr, count, weftFloat32, p, comm, stream)
                            : weftRecv(ptr, count, weftFloat32, p, comm, stream);
    FAIL_IF(res != weftSuccess, "round %d: %s %zu elements %s rank %d: %s", round,
            send ? "send of" : "receive of", count, send ? "to" : "from", p, weftGetLastError(comm));
  }
  FAIL_IF(weftGroupEnd() != weftSuccess, "round %d: group: %s", round, weftGetLastError(comm));
  FAIL_IF(group_stream != nullptr && weftStreamSynchronize(group_stream) != weftSuccess,
          "round %d: stream: %s", round, weftGetLastError(nullptr));
  for (int p = 0; p < n; p++) {
    for (int k = 0; k < kMsgs; k++) {
      const size_t nbytes = empty_mix_count(seed, round, p, me, k) * 4;
      FAIL_IF(memcmp(in[p].data() + in_off[p][k], message(p, me, round * 100 + k, nbytes).data(),
                     nbytes) != 0,
              "round %d: message %d from rank %d (%zu bytes) wrong", round, k, p, nbytes);
    }
    for (size_t i = in[p].size() - guard; i < in[p].size(); i++)
      FAIL_IF(in[p][i] != 0xa5, "round %d: guard byte after rank %d's messages written", round, p);
  }
  return 0;
}

// Sends and receives of no elements, mixed with others in groups on 2-4
// ranks: whatever their buffer (NULL, past the end, an address that faults)
// and stream (a CUDA stream in a CUDA build, a host stream, none), they
// succeed and move nothing, and the pairs' other messages keep their order.
TEST(Sendrecv, EmptyMessagesMixedInGroups) {
  const uint64_t seed = test_seed();
  for (int nranks : {2, 3, 4}) {
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      weftStream_t hs;
      FAIL_IF(weftStreamCreate(&hs) != weftSuccess, "stream create");
      for (int round = 0; round < 4; round++)
        if (int rc = empty_mix_round(ctx, comm, seed, round, round % 2 ? hs : nullptr, hs)) return rc;
      // the collectives made of sends and receives, with nothing to move
      weftStream_t s = kCudaBuild ? foreign_stream() : nullptr;
      FAIL_IF(weftAlltoAll(nullptr, nullptr, 0, weftFloat32, comm, s) != weftSuccess ||
                  weftGather(nullptr, nullptr, 0, weftInt8, ctx.nranks - 1, comm, s) != weftSuccess ||
                  weftScatter(nullptr, nullptr, 0, weftFloat64, 0, comm, hs) != weftSuccess,
              "empty all-to-all, gather or scatter: %s", weftGetLastError(comm));
      FAIL_IF(empty_mix_round(ctx, comm, seed, 4, nullptr, hs) != 0, "after the empty collectives");
      weftStreamDestroy(hs);
      weftCommDestroy(comm);
      return 0;
    }, small_slots());
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// Outside a group, the two ends of an empty message may name different
// buffers and streams (an empty CUDA tensor's NULL on one rank, device
// memory and a CUDA stream on the other): both do nothing, and the next
// message between them is the next one sent.
TEST(Sendrecv, EmptyMessageEndsMayDiffer) {
  auto status = run_ranks(2, [](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    std::vector<uint8_t> buf(4096, 0xa5);
    const std::vector<uint8_t> m = message(0, 1, 7, 1000);
    weftStream_t other = kCudaBuild ? foreign_stream() : nullptr;
    for (int i = 0; i < 3; i++) {
      weftResult_t res =
          ctx.rank == 0 ? weftSend(nullptr, 0, weftInt32, 1, comm, nullptr)
                        : weftRecv(buf.data() + buf.size(), 0, weftInt32, 0, comm, other);
      FAIL_IF(res != weftSuccess, "empty message %d: %s", i, weftGetLastError(comm));
      // to itself, outside a group: nothing to pair with, nothing to move
      FAIL_IF(weftSend(nullptr, 0, weftInt32, ctx.rank, comm, other) != weftSuccess,
              "empty send to self: %s", weftGetLastError(comm));
    }
    weftResult_t res = ctx.rank == 0 ? weftSend(m.data(), m.size(), weftUint8, 1, comm, nullptr)
                                     : weftRecv(buf.data(), m.size(), weftUint8, 0, comm, nullptr);
    FAIL_IF(res != weftSuccess, "message: %s", weftGetLastError(comm));
    FAIL_IF(ctx.rank == 1 && memcmp(buf.data(), m.data(), m.size()) != 0, "the message is wrong");
    for (size_t i = m.size(); ctx.rank == 1 && i < buf.size(); i++)
      FAIL_IF(buf[i] != 0xa5, "byte %zu past the message written", i);
    weftCommDestroy(comm);
    return 0;
  }, small_slots());
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
}

// A NULL buffer with elements to move is refused, in and out of a group,
// with a message naming the buffer and the count; a build without CUDA
// refuses a stream it does not know even for an empty message.
TEST(Sendrecv, NullBufferWithElementsIsAnError) {
  weftUniqueId id;
  ASSERT_EQ(weftGetUniqueId(&id), weftSuccess);
  weftComm_t comm;
  ASSERT_EQ(weftCommInitRank(&comm, 1, id, 0), weftSuccess);
  EXPECT_EQ(weftSend(nullptr, 3, weftFloat32, 0, comm, nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("sendbuff is NULL with count 3"),
            std::string::npos) << weftGetLastError(comm);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  EXPECT_EQ(weftRecv(nullptr, 0, weftFloat32, 0, comm, nullptr), weftSuccess);
  EXPECT_EQ(weftRecv(nullptr, 5, weftFloat32, 0, comm, nullptr), weftInvalidArgument);
  EXPECT_NE(std::string(weftGetLastError(comm)).find("recvbuff is NULL with count 5"),
            std::string::npos) << weftGetLastError(comm);
  EXPECT_EQ(weftGroupEnd(), weftInvalidArgument);
  EXPECT_EQ(weftSend(nullptr, 0, weftFloat32, 0, comm, foreign_stream()),
            kCudaBuild ? weftSuccess : weftInvalidArgument);
  EXPECT_EQ(weftCommDestroy(comm), weftSuccess);
}

// AlltoAll, Gather and Scatter entry points, every datatype, moving roots.
TEST(Sendrecv, AlltoAllGatherScatter) {
  const uint64_t seed = test_seed();
  for (int nranks : {1, 3, 4}) {
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      const int n = ctx.nranks, me = ctx.rank;
      for (int t = 0; t < weftNumTypes; t++) {
        weftDataType_t dt = (weftDataType_t)t;
        const size_t count = 1 + (size_t)t * 97, es = weftTypeSize(dt), block = count * es;
        std::vector<std::vector<uint8_t>> inputs;  // rank r's n blocks
        for (int r = 0; r < n; r++) inputs.push_back(make_input(dt, weftSum, count * n, seed + t, r));
        std::vector<uint8_t> out(block * n, 0xa5);
        if (weftAlltoAll(inputs[me].data(), out.data(), count, dt, comm, nullptr) != weftSuccess)
          return rank_fail(ctx, "alltoall: %s", weftGetLastError(comm));
        for (int p = 0; p < n; p++)
          if (memcmp(out.data() + p * block, inputs[p].data() + me * block, block) != 0)
            return rank_fail(ctx, "alltoall %s: block from rank %d wrong", type_name(dt), p);
        int root = t % n;
        std::fill(out.begin(), out.end(), 0xa5);
        if (weftGather(inputs[me].data(), me == root ? out.data() : nullptr, count, dt, root, comm,
                       nullptr) != weftSuccess)
          return rank_fail(ctx, "gather: %s", weftGetLastError(comm));
        for (int p = 0; me == root && p < n; p++)
          if (memcmp(out.data() + p * block, inputs[p].data(), block) != 0)
            return rank_fail(ctx, "gather %s root %d: block of rank %d wrong", type_name(dt), root, p);
        std::vector<uint8_t> mine(block + 16, 0xa5);
        if (weftScatter(me == root ? inputs[me].data() : nullptr, mine.data(), count, dt, root, comm,
                        nullptr) != weftSuccess)
          return rank_fail(ctx, "scatter: %s", weftGetLastError(comm));
        if (memcmp(mine.data(), inputs[root].data() + me * block, block) != 0 || mine[block] != 0xa5)
          return rank_fail(ctx, "scatter %s root %d wrong", type_name(dt), root);
      }
      weftCommDestroy(comm);
      return 0;
    }, small_slots());
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// A gather's or a scatter's root works in place where its own block is at
// its rank's offset of the large buffer (NCCL's and MPI_IN_PLACE's meaning),
// and refuses buffers that overlap otherwise, writing nothing: a scatter so
// called copied its own block first, over blocks it then sent (rank 1 got
// 1 2 3 7 of 0..7 with recvbuff = sendbuff + 3).
TEST(Sendrecv, GatherScatterInPlaceOnlyAtTheRootsBlock) {
  const uint64_t seed = test_seed();
  for (int nranks : {1, 3}) {
    auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
      weftComm_t comm;
      if (int rc = init(ctx, &comm)) return rc;
      const int n = ctx.nranks, me = ctx.rank, root = n - 1;
      const size_t count = 37;
      Rng rng(seed + 17);
      std::vector<std::vector<float>> inputs(n, std::vector<float>(count * n));
      for (auto &in : inputs)
        for (float &v : in) v = (float)(rng.next() % 100000);
      // in place: the root's block at offset root * count
      // rank r gathers block root of its input: the root's sits in place
      std::vector<float> buf = inputs[me];
      const float *send = me == root ? buf.data() + root * count : inputs[me].data() + root * count;
      FAIL_IF(weftGather(send, me == root ? buf.data() : nullptr, count, weftFloat32, root, comm,
                         nullptr) != weftSuccess, "gather in place: %s", weftGetLastError(comm));
      for (int p = 0; me == root && p < n; p++)
        FAIL_IF(memcmp(buf.data() + p * count, inputs[p].data() + root * count,
                       count * sizeof(float)) != 0,
                "gather in place: block of rank %d wrong", p);
      buf = inputs[me];
      std::vector<float> mine(count, -1.0f);
      float *recv = me == root ? buf.data() + root * count : mine.data();
      FAIL_IF(weftScatter(me == root ? buf.data() : nullptr, recv, count, weftFloat32, root, comm,
                          nullptr) != weftSuccess, "scatter in place: %s", weftGetLastError(comm));
      FAIL_IF(memcmp(recv, inputs[root].data() + me * count, count * sizeof(float)) != 0,
              "scatter in place: rank %d's block wrong", me);
      if (me == root) {
        // overlapping at any other offset: refused, nothing written; the
        // peers are not asked (the refusal is the root's alone)
        for (size_t shift : {(size_t)1, (size_t)3, count * n - 1}) {
          if (shift == root * count) continue;
          std::vector<float> big(count * n + count, 0), before;
          for (float &v : big) v = (float)(rng.next() % 100000);
          before = big;
          FAIL_IF(weftScatter(big.data(), big.data() + shift, count, weftFloat32, root, comm,
                              nullptr) != weftInvalidArgument, "scatter shifted %zu accepted", shift);
          FAIL_IF(!strstr(weftGetLastError(comm), "overlap"), "scatter refusal says: %s",
                  weftGetLastError(comm));
          FAIL_IF(weftGather(big.data() + shift, big.data(), count, weftFloat32, root, comm,
                             nullptr) != weftInvalidArgument, "gather shifted %zu accepted", shift);
          FAIL_IF(!strstr(weftGetLastError(comm), "overlap"), "gather refusal says: %s",
                  weftGetLastError(comm));
          FAIL_IF(big != before, "a refused call wrote its buffers (shift %zu)", shift);
        }
      }
      weftCommDestroy(comm);
      return 0;
    }, small_slots());
    for (int r = 0; r < nranks; r++) EXPECT_EQ(status[r], 0) << nranks << " ranks, rank " << r;
  }
}

// Collectives fused in one group give what they give one by one.
TEST(Group, FusedCollectivesMatchSeparateOnes) {
  const uint64_t seed = test_seed();
  auto status = run_ranks(4, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    const size_t count = 3001;
    std::vector<uint8_t> a = make_input(weftFloat32, weftSum, count, seed, ctx.rank);
    std::vector<uint8_t> b = make_input(weftInt32, weftMax, count, seed, ctx.rank);
    std::vector<uint8_t> c = make_input(weftBfloat16, weftSum, count, seed, 2);
    std::vector<uint8_t> a1(count * 4), b1(count * 4 * 4), c1(count * 2);
    std::vector<uint8_t> a2(count * 4), b2(count * 4 * 4), c2(count * 2);
    auto issue = [&](std::vector<uint8_t> &ao, std::vector<uint8_t> &bo, std::vector<uint8_t> &co) {
      weftResult_t r1 = weftAllReduce(a.data(), ao.data(), count, weftFloat32, weftSum, comm, nullptr);
      weftResult_t r2 = weftAllGather(b.data(), bo.data(), count, weftInt32, comm, nullptr);
      weftResult_t r3 = weftBroadcast(c.data(), co.data(), count, weftBfloat16, 2, comm, nullptr);
      return r1 == weftSuccess && r2 == weftSuccess && r3 == weftSuccess;
    };
    if (!issue(a1, b1, c1)) return rank_fail(ctx, "one by one: %s", weftGetLastError(comm));
    weftGroupStart();
    bool ok = issue(a2, b2, c2);
    if (weftGroupEnd() != weftSuccess || !ok) return rank_fail(ctx, "group: %s", weftGetLastError(comm));
    if (a1 != a2 || b1 != b2 || c1 != c2) return rank_fail(ctx, "fused results differ");
    weftCommDestroy(comm);
    return 0;
  }, small_slots());
  for (int r = 0; r < 4; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

}  // namespace
