// Point-to-point on device memory (a GPU; skips without one): all-to-all,
// gather, scatter and groups of sends and receives of random uneven sizes,
// 2 to 4 ranks sharing GPU 0 in one process (CommInitAll, the p2p
// transport), every byte checked against what was sent into poisoned
// buffers, messages between a pair arriving in posting order, lanes carrying
// on from one launch to the next, messages of no elements (NULL buffers)
// among them, and a captured all-to-all replayed.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <tuple>
#include <string>
#include <vector>

#include "harness.h"
#include "tests/device/dev_ranks.h"
#include "weft.h"

namespace {

// A device buffer of nbytes (+ 64 poisoned bytes after it), filled from host.
struct DevBuf {
  char *d = nullptr;
  size_t nbytes;
  DevBuf(size_t n, const std::vector<char> *init) : nbytes(n) {
    EXPECT_EQ(cudaMalloc((void **)&d, n + 64), cudaSuccess);
    EXPECT_EQ(cudaMemset(d, 0xa5, n + 64), cudaSuccess);
    if (init != nullptr) {
      EXPECT_EQ(cudaMemcpy(d, init->data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DevBuf() { cudaFree(d); }
  std::vector<char> get() const {
    std::vector<char> h(nbytes + 64);
    EXPECT_EQ(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

std::vector<char> random_bytes(size_t n, uint64_t seed) {
  weft_test::Rng rng(seed);
  std::vector<char> v(n);
  for (auto &c : v) c = (char)rng.next();
  return v;
}

void expect_block(const std::vector<char> &got, size_t at, const std::vector<char> &want,
                  const std::string &what) {
  ASSERT_GE(got.size(), at + want.size());
  EXPECT_EQ(memcmp(got.data() + at, want.data(), want.size()), 0) << what;
}

void expect_tail_poisoned(const std::vector<char> &got, size_t from, const std::string &what) {
  for (size_t i = from; i < got.size(); i++)
    ASSERT_EQ((unsigned char)got[i], 0xa5u) << what << ": written past the end at " << i;
}

// Rank r's all-to-all output got: block q is block r of in[q], for every q.
void expect_alltoall_blocks(const std::vector<char> &got, const std::vector<std::vector<char>> &in,
                            int r, size_t block, const std::string &what) {
  for (size_t q = 0; q < in.size(); q++)
    expect_block(got, q * block,
                 std::vector<char>(in[q].begin() + (long)(r * block),
                                   in[q].begin() + (long)((r + 1) * block)),
                 what + "rank " + std::to_string(r) + " block from " + std::to_string(q));
}

class DeviceAlltoAll : public testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(DeviceAlltoAll, EveryBlockArrives) {
  REQUIRE_GPU();
  const int k = std::get<0>(GetParam());
  const size_t count = std::get<1>(GetParam()); // int32 elements per peer
  const size_t block = count * 4;
  Ranks ranks(k);
  std::vector<std::vector<char>> in(k);
  std::vector<std::unique_ptr<DevBuf>> send(k), recv(k);
  for (int r = 0; r < k; r++) {
    in[r] = random_bytes(block * k, 100 + r);
    send[r].reset(new DevBuf(block * k, &in[r]));
    recv[r].reset(new DevBuf(block * k, nullptr));
  }
  for (int round = 0; round < 2; round++) { // the second carries on from the first's steps
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++)
      ASSERT_EQ(weftAlltoAll(send[r]->d, recv[r]->d, count, weftInt32, ranks.comms[r],
                             ranks.streams[r]), weftSuccess)
          << weftGetLastError(ranks.comms[r]);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    ranks.sync();
    for (int r = 0; r < k; r++) {
      std::vector<char> got = recv[r]->get();
      expect_alltoall_blocks(got, in, r, block, "");
      expect_tail_poisoned(got, block * k, "rank " + std::to_string(r));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, DeviceAlltoAll,
                         testing::Combine(testing::Values(2, 3, 4),
                                          testing::Values(0ul, 1ul, 1000ul, 70001ul, 300001ul)));

// Messages from and into views at odd byte offsets (not 16-byte aligned:
// the byte-wise copy path), one slot and several, both ways at once: every
// byte arrives and nothing is written past the view.
TEST(DeviceSendRecv, ViewsAtOddByteOffsets) {
  REQUIRE_GPU();
  Ranks ranks(2);
  for (size_t n : {1ul, 17ul, 300001ul}) {
    SCOPED_TRACE("n " + std::to_string(n));
    std::vector<std::vector<char>> in = {random_bytes(n + 3, n), random_bytes(n + 3, n + 1)};
    std::vector<std::unique_ptr<DevBuf>> src, dst;
    for (int r = 0; r < 2; r++) {
      src.emplace_back(new DevBuf(n + 3, &in[r]));
      dst.emplace_back(new DevBuf(n + 5, nullptr));
    }
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < 2; r++) {
      ASSERT_EQ(weftRecv(dst[r]->d + 5, n, weftUint8, 1 - r, ranks.comms[r], ranks.streams[r]),
                weftSuccess);
      ASSERT_EQ(weftSend(src[r]->d + 3, n, weftUint8, 1 - r, ranks.comms[r], ranks.streams[r]),
                weftSuccess);
    }
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    ranks.sync();
    for (int r = 0; r < 2; r++) {
      std::vector<char> got = dst[r]->get();
      std::vector<char> want(in[1 - r].begin() + 3, in[1 - r].end());
      expect_block(got, 5, want, "rank " + std::to_string(r));
      expect_tail_poisoned(got, 5 + n, "rank " + std::to_string(r));
      for (size_t i = 0; i < 5; i++) ASSERT_EQ((unsigned char)got[i], 0xa5u) << "before the view";
    }
  }
}

// Several messages of random uneven sizes from every rank to every other (and
// itself), posted in a shuffled order in one group: each arrives whole, in
// its pair's posting order.
TEST(DeviceSendRecv, UnevenBatchesKeepPairOrder) {
  REQUIRE_GPU();
  for (int k : {2, 3, 4}) {
    Ranks ranks(k);
    weft_test::Rng rng(7 + k);
    struct Msg {
      int from, to;
      std::vector<char> data;
      std::unique_ptr<DevBuf> src, dst;
    };
    std::vector<Msg> msgs;
    for (int a = 0; a < k; a++)
      for (int b = 0; b < k; b++)
        for (int m = 0; m < 3; m++) {
          size_t n = m == 0 ? 1 + rng.next() % 100 : rng.next() % (700u << 10);
          Msg x{a, b, random_bytes(n, rng.next()), nullptr, nullptr};
          x.src.reset(new DevBuf(n, &x.data));
          x.dst.reset(new DevBuf(n, nullptr));
          msgs.push_back(std::move(x));
        }
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    // each rank posts its receives before its sends, so order within a pair
    // is what the lanes keep, not what the calls happen to interleave
    for (int r = 0; r < k; r++) {
      for (auto &m : msgs)
        if (m.to == r) {
          ASSERT_EQ(weftRecv(m.dst->d, m.data.size(), weftUint8, m.from, ranks.comms[r],
                             ranks.streams[r]), weftSuccess);
        }
      for (auto &m : msgs)
        if (m.from == r) {
          ASSERT_EQ(weftSend(m.src->d, m.data.size(), weftUint8, m.to, ranks.comms[r],
                             ranks.streams[r]), weftSuccess);
        }
    }
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    ranks.sync();
    for (auto &m : msgs) {
      std::string what = std::to_string(m.from) + "->" + std::to_string(m.to) + " " +
                         std::to_string(m.data.size()) + " bytes";
      std::vector<char> got = m.dst->get();
      expect_block(got, 0, m.data, what);
      expect_tail_poisoned(got, m.data.size(), what);
    }
  }
}

// Messages of no elements between others of every pair, in one group and
// alone, with the buffers an empty tensor gives (NULL, or one past the end
// of the message before it on the same buffer): they succeed and move
// nothing, the others arrive whole and in order, nothing past them written.
TEST(DeviceSendRecv, EmptyMessagesAnyPointerMixedIn) {
  REQUIRE_GPU();
  for (int k : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(k) + " ranks");
    Ranks ranks(k);
    weft_test::Rng rng(31 + k);
    struct Pair {
      int from, to;
      std::vector<char> a, b;  // the two messages with data
      std::unique_ptr<DevBuf> src, dst;
    };
    std::vector<Pair> pairs;
    for (int x = 0; x < k; x++)
      for (int y = 0; y < k; y++) {
        Pair p{x, y, random_bytes(1 + rng.next() % 5000, rng.next()),
               random_bytes(1 + rng.next() % (600u << 10), rng.next()), nullptr, nullptr};
        std::vector<char> both(p.a);
        both.insert(both.end(), p.b.begin(), p.b.end());
        p.src.reset(new DevBuf(both.size(), &both));
        p.dst.reset(new DevBuf(both.size(), nullptr));
        pairs.push_back(std::move(p));
      }
    // per pair: empty (NULL), a, empty (just past a), b, empty (just past b)
    auto post = [&](int r, bool send) {
      for (auto &p : pairs) {
        if ((send ? p.from : p.to) != r) continue;
        char *buf = send ? p.src->d : p.dst->d;
        const int peer = send ? p.to : p.from;
        const size_t na = p.a.size(), nb = p.b.size();
        char *ptrs[] = {nullptr, buf, buf + na, buf + na, buf + na + nb};
        const size_t counts[] = {0, na, 0, nb, 0};
        for (int m = 0; m < 5; m++) {
          weftResult_t res = send ? weftSend(ptrs[m], counts[m], weftUint8, peer, ranks.comms[r],
                                             ranks.streams[r])
                                  : weftRecv(ptrs[m], counts[m], weftUint8, peer, ranks.comms[r],
                                             ranks.streams[r]);
          ASSERT_EQ(res, weftSuccess) << weftGetLastError(ranks.comms[r]);
        }
      }
    };
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++) {
      post(r, false);
      post(r, true);
    }
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
    // alone, outside a group, on the caller's stream and the legacy one
    for (int r = 0; r < k; r++) {
      ASSERT_EQ(weftSend(nullptr, 0, weftFloat32, (r + 1) % k, ranks.comms[r], ranks.streams[r]),
                weftSuccess) << weftGetLastError(ranks.comms[r]);
      ASSERT_EQ(weftRecv(nullptr, 0, weftFloat32, (r + k - 1) % k, ranks.comms[r], nullptr),
                weftSuccess) << weftGetLastError(ranks.comms[r]);
    }
    ranks.sync();
    for (auto &p : pairs) {
      std::string what = std::to_string(p.from) + "->" + std::to_string(p.to);
      std::vector<char> got = p.dst->get();
      expect_block(got, 0, p.a, what + " first");
      expect_block(got, p.a.size(), p.b, what + " second");
      expect_tail_poisoned(got, p.a.size() + p.b.size(), what);
    }
  }
}

TEST(DeviceGatherScatter, RootGetsAndGivesEveryBlock) {
  REQUIRE_GPU();
  const int k = 3, root = 1;
  const size_t count = 50001, block = count * 8;
  Ranks ranks(k);
  std::vector<std::vector<char>> in(k);
  std::vector<std::unique_ptr<DevBuf>> send(k), gathered(k), scattered(k);
  std::vector<char> root_all = random_bytes(block * k, 9);
  for (int r = 0; r < k; r++) {
    in[r] = random_bytes(block, 200 + r);
    send[r].reset(new DevBuf(block, &in[r]));
    gathered[r].reset(new DevBuf(block * k, nullptr));
    scattered[r].reset(new DevBuf(block, nullptr));
  }
  DevBuf scatter_src(block * k, &root_all);
  ASSERT_EQ(weftGroupStart(), weftSuccess);
  for (int r = 0; r < k; r++) {
    ASSERT_EQ(weftGather(send[r]->d, gathered[r]->d, count, weftFloat64, root, ranks.comms[r],
                         ranks.streams[r]), weftSuccess);
    ASSERT_EQ(weftScatter(scatter_src.d, scattered[r]->d, count, weftFloat64, root,
                          ranks.comms[r], ranks.streams[r]), weftSuccess);
  }
  ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  ranks.sync();
  std::vector<char> g = gathered[root]->get();
  for (int q = 0; q < k; q++) expect_block(g, (size_t)q * block, in[q], "gathered " + std::to_string(q));
  for (int r = 0; r < k; r++)
    expect_block(scattered[r]->get(), 0,
                 std::vector<char>(root_all.begin() + (long)(r * block),
                                   root_all.begin() + (long)((r + 1) * block)),
                 "scattered to " + std::to_string(r));
}

// An all-to-all captured in a graph per rank and replayed with new inputs.
TEST(DeviceSendrecvGraph, CapturedAlltoAllReplays) {
  REQUIRE_GPU();
  const int k = 3;
  const size_t count = 40001, block = count * 4;
  Ranks ranks(k);
  std::vector<std::unique_ptr<DevBuf>> send(k), recv(k);
  for (int r = 0; r < k; r++) {
    send[r].reset(new DevBuf(block * k, nullptr));
    recv[r].reset(new DevBuf(block * k, nullptr));
  }
  auto alltoall = [&] {
    ASSERT_EQ(weftGroupStart(), weftSuccess);
    for (int r = 0; r < k; r++)
      ASSERT_EQ(weftAlltoAll(send[r]->d, recv[r]->d, count, weftFloat32, ranks.comms[r],
                             ranks.streams[r]), weftSuccess);
    ASSERT_EQ(weftGroupEnd(), weftSuccess) << weftGetLastError(nullptr);
  };
  alltoall(); // connects outside capture
  ranks.sync();
  std::vector<cudaGraph_t> graphs(k);
  std::vector<cudaGraphExec_t> execs(k);
  for (int r = 0; r < k; r++)
    ASSERT_EQ(cudaStreamBeginCapture(ranks.streams[r], cudaStreamCaptureModeThreadLocal),
              cudaSuccess);
  alltoall();
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaStreamEndCapture(ranks.streams[r], &graphs[r]), cudaSuccess);
  for (int r = 0; r < k; r++) ASSERT_EQ(cudaGraphInstantiate(&execs[r], graphs[r], 0), cudaSuccess);
  for (int rep = 0; rep < 3; rep++) {
    std::vector<std::vector<char>> in(k);
    for (int r = 0; r < k; r++) {
      in[r] = random_bytes(block * k, 1000 * rep + r);
      ASSERT_EQ(cudaMemcpy(send[r]->d, in[r].data(), block * k, cudaMemcpyHostToDevice), cudaSuccess);
    }
    for (int r = 0; r < k; r++) ASSERT_EQ(cudaGraphLaunch(execs[r], ranks.streams[r]), cudaSuccess);
    ranks.sync();
    for (int r = 0; r < k; r++)
      expect_alltoall_blocks(recv[r]->get(), in, r, block, "replay " + std::to_string(rep) + " ");
  }
  for (int r = 0; r < k; r++) {
    cudaGraphExecDestroy(execs[r]);
    cudaGraphDestroy(graphs[r]);
  }
}

}  // namespace
