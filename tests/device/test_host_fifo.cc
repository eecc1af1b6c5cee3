// The host_fifo transport without a GPU: ranks of one host, each a process,
// connect a ring both ways through FIFOs in shared host memory in the
// kernels' layout (the device emulated: net_dev_mem_host maps a page to
// itself), and a host thread playing the kernel's slot protocol (dev_emu.h)
// moves random data of odd sizes through them, every byte checked and
// nothing written past a message. Then a rank whose kernel gives up poisons
// its FIFOs and its neighbours' emulated kernels see the poison word; an
// end whose set-up never completed sweeps the segments dead ranks left.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"
#include "transport/dev_emu.h"

extern "C" {
#include "transport/bootstrap/bootstrap.h"
#include "transport/base/shm_segment.h"
#include "transport/cuda_ipc/cuda_fifo.h"
#include "transport/host_fifo/host_fifo.h"
#include "transport/base/status.h"
}

using namespace weft_test;

namespace {

const int kDirs = 2;  // forward and backward around the ring

struct Ring {
  bootstrap *bs = nullptr;
  weft_conn send[kDirs] = {}, recv[kDirs] = {};

  ~Ring() {
    for (int d = 0; d < kDirs; d++) {
      if (send[d].transport != nullptr) send[d].transport->close(&send[d]);
      if (recv[d].transport != nullptr) recv[d].transport->close(&recv[d]);
    }
    if (bs != nullptr) bootstrap_close(bs);
  }

  static int neighbour(const RankCtx &ctx, int dir, int ahead) {
    int step = (dir == 0) == (ahead > 0) ? 1 : -1;
    return (ctx.rank + step + ctx.nranks) % ctx.nranks;
  }

  static void shape(weft_conn *c, int peer, uint32_t nslots, size_t slot_nbytes) {
    memset(c, 0, sizeof *c);
    c->nslots = nslots;
    c->slot_nbytes = slot_nbytes;
    c->peer_rank = peer;
    c->fifo_mem = &net_dev_mem_host;
  }

  int connect(const RankCtx &ctx, uint32_t nslots, size_t slot_nbytes) {
    const weft_transport *t = &host_fifo_transport;
    bootstrap_id id;
    memcpy(&id, ctx.id.internal, sizeof id);
    peer_info self = {};
    bootstrap_peer_info_local(&self);
    self.rank = ctx.rank;
    self.cuda_dev = 0;
    std::vector<peer_info> peers(ctx.nranks);
    if (bootstrap_init(&id, ctx.rank, ctx.nranks, &self, 30000000000ull, &bs, peers.data()) !=
        weftSuccess)
      return rank_fail(ctx, "bootstrap: %s", weft_error_text());
    transport_need need = {};
    need.mem = TRANSPORT_MEM_DEVICE;
    char why[160] = "";
    if (!t->can_connect(&peers[(ctx.rank + 1) % ctx.nranks], &self, &need, why, sizeof why))
      return rank_fail(ctx, "host_fifo cannot connect ranks of one host: %s", why);
    std::vector<conn_blob> blobs((size_t)ctx.nranks * kDirs);
    for (int d = 0; d < kDirs; d++) {
      shape(&recv[d], neighbour(ctx, d, -1), nslots, slot_nbytes);
      if (t->recv_setup(&recv[d], &blobs[(size_t)ctx.rank * kDirs + d]) != weftSuccess)
        return rank_fail(ctx, "recv_setup: %s", weft_error_text());
      recv[d].transport = t;
    }
    if (bootstrap_allgather(bs, blobs.data(), sizeof(conn_blob) * kDirs) != weftSuccess)
      return rank_fail(ctx, "allgather: %s", weft_error_text());
    for (int d = 0; d < kDirs; d++) {
      int next = neighbour(ctx, d, 1);
      shape(&send[d], next, nslots, slot_nbytes);
      if (t->send_connect(&send[d], &blobs[(size_t)next * kDirs + d]) != weftSuccess)
        return rank_fail(ctx, "send_connect: %s", weft_error_text());
      send[d].transport = t;
    }
    if (bootstrap_barrier(bs) != weftSuccess) return rank_fail(ctx, "barrier");
    for (int d = 0; d < kDirs; d++)
      if (t->recv_connect(&recv[d]) != weftSuccess) return rank_fail(ctx, "recv_connect");
    return 0;
  }

  // the kernels' view: ctrl right before the slots (cuda_fifo_ctrl)
  static net_dev_fifo view(const weft_conn &c) {
    net_dev_fifo f;
    f.ctrl = cuda_fifo_ctrl(&c);
    f.used_nbytes = nullptr; // the kernel reads the slot in place: no sizes
    f.slots = c.slots;
    f.nslots = c.nslots;
    f.slot_nbytes = c.slot_nbytes;
    return f;
  }
};

size_t msg_nbytes(uint64_t seed, int r, int d, int k, size_t slot_nbytes) {
  Rng rng(seed ^ ((uint64_t)r << 40) ^ ((uint64_t)d << 32) ^ (uint64_t)k);
  uint64_t pick = rng.next() % 8;
  if (pick == 0) return 0;
  if (pick == 1) return 1;
  return (size_t)(rng.next() % (slot_nbytes * 6)) | 1u;
}

void msg_fill(uint64_t seed, int r, int d, int k, std::vector<char> &buf) {
  Rng rng(seed * 131 + (uint64_t)r * 7919 + (uint64_t)d * 104729 + (uint64_t)k);
  for (char &b : buf) b = (char)rng.next();
}

struct FifoCase {
  int nranks;
  uint32_t nslots;
  size_t slot_nbytes;
};

class HostFifo : public testing::TestWithParam<FifoCase> {};

TEST_P(HostFifo, RandomOddSizesBothDirections) {
  const FifoCase c = GetParam();
  const uint64_t seed = test_seed();
  auto status = run_ranks(c.nranks, [&](const RankCtx &ctx) {
    Ring ring;
    if (int rc = ring.connect(ctx, c.nslots, c.slot_nbytes)) return rc;
    std::vector<EmuFifo> fifos;
    fifos.reserve(2 * kDirs);
    for (int d = 0; d < kDirs; d++) {
      fifos.emplace_back(Ring::view(ring.send[d]));
      fifos.emplace_back(Ring::view(ring.recv[d]));
    }
    for (int k = 0; k < 6; k++) {
      std::vector<std::vector<char>> out(kDirs), in(kDirs);
      std::vector<EmuMsg> msgs;
      for (int d = 0; d < kDirs; d++) {
        out[d].resize(msg_nbytes(seed, ctx.rank, d, k, c.slot_nbytes));
        msg_fill(seed, ctx.rank, d, k, out[d]);
        int prev = Ring::neighbour(ctx, d, -1);
        size_t want = msg_nbytes(seed, prev, d, k, c.slot_nbytes);
        in[d].assign(want + 64, (char)0xa5);
        msgs.push_back(EmuMsg{&fifos[2 * d], true, out[d].data(), out[d].size()});
        msgs.push_back(EmuMsg{&fifos[2 * d + 1], false, in[d].data(), want});
      }
      EmuResult r = emu_kernel_run(msgs, [] { return false; }, 20000000000ull);
      if (r != EMU_OK) return rank_fail(ctx, "round %d: emulated kernel gave up (%d)", k, (int)r);
      for (int d = 0; d < kDirs; d++) {
        int prev = Ring::neighbour(ctx, d, -1);
        std::vector<char> expect(msg_nbytes(seed, prev, d, k, c.slot_nbytes));
        msg_fill(seed, prev, d, k, expect);
        if (memcmp(in[d].data(), expect.data(), expect.size()) != 0)
          return rank_fail(ctx, "round %d dir %d: data from rank %d differs", k, d, prev);
        for (size_t i = expect.size(); i < in[d].size(); i++)
          if (in[d][i] != (char)0xa5)
            return rank_fail(ctx, "round %d dir %d: byte %zu past the message written", k, d, i);
      }
    }
    if (bootstrap_barrier(ring.bs) != weftSuccess) return rank_fail(ctx, "barrier");
    return 0;
  });
  for (int r = 0; r < c.nranks; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(DeviceHost, HostFifo,
                         testing::Values(FifoCase{2, 4, 4096}, FifoCase{3, 2, 1000},
                                         FifoCase{5, 3, 4096}),
                         [](const testing::TestParamInfo<FifoCase> &i) {
                           return "ranks" + std::to_string(i.param.nranks) + "_slot" +
                                  std::to_string(i.param.slot_nbytes) + "x" +
                                  std::to_string(i.param.nslots);
                         });

// Rank 0's kernel gives up before sending (it poisons the FIFOs it drives, as
// the kernels do): both neighbours' emulated kernels, waiting on rank 0's
// data or credits, end on the poison word, long before their own timeout.
TEST(HostFifoFailure, GivingUpPoisonsTheNeighboursFifos) {
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    Ring ring;
    if (int rc = ring.connect(ctx, 2, 4096)) return rc;
    if (ctx.rank == 0) {
      for (int d = 0; d < kDirs; d++) {
        conn_poison(&ring.send[d]);
        conn_poison(&ring.recv[d]);
      }
      return bootstrap_barrier(ring.bs) == weftSuccess ? 0 : rank_fail(ctx, "barrier");
    }
    std::vector<EmuFifo> fifos;
    fifos.reserve(2 * kDirs);
    std::vector<char> out(4096 * 8, 1), in(4096 * 8);
    std::vector<EmuMsg> msgs;
    for (int d = 0; d < kDirs; d++) {
      fifos.emplace_back(Ring::view(ring.send[d]));
      fifos.emplace_back(Ring::view(ring.recv[d]));
    }
    for (int d = 0; d < kDirs; d++) {
      msgs.push_back(EmuMsg{&fifos[2 * d], true, out.data(), out.size()});
      msgs.push_back(EmuMsg{&fifos[2 * d + 1], false, in.data(), in.size()});
    }
    double t0 = now_s();
    EmuResult r = emu_kernel_run(msgs, [] { return false; }, 60000000000ull);
    double waited = now_s() - t0;
    if (r != EMU_POISONED) return rank_fail(ctx, "emulated kernel ended with %d", (int)r);
    if (waited > 10) return rank_fail(ctx, "the poison took %.1f s", waited);
    return bootstrap_barrier(ring.bs) == weftSuccess ? 0 : rank_fail(ctx, "barrier");
  });
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
}

// A receiving end whose set-up never completes (its peers died) closes by
// sweeping the segments that dead processes created and nobody attached, as
// shm does: here a process that died right after its recv_setup. This
// process made its first segment before that death, so the sweep at a
// process's first segment is not what removes it.
TEST(HostFifoFailure, UnfinishedSetUpSweepsWhatDeadRanksLeft) {
  RunOptions opts;
  opts.unique_id = false;  // no other thread: this rank forks
  auto status = run_ranks(1, [&](const RankCtx &ctx) {
    const weft_transport *t = &host_fifo_transport;
    weft_conn mine;
    conn_blob blob;
    Ring::shape(&mine, 1, 2, 4096);
    FAIL_IF(t->recv_setup(&mine, &blob) != weftSuccess, "recv_setup: %s", weft_error_text());
    int p[2];
    FAIL_IF(pipe(p) != 0, "pipe: %m");
    pid_t dead = fork();
    if (dead == 0) {  // sets up its end and dies without closing it
      weft_conn c;
      conn_blob b;
      Ring::shape(&c, 0, 2, 4096);
      if (t->recv_setup(&c, &b) != weftSuccess) _exit(1);
      _exit(write(p[1], b.data, SHM_NAME_BYTES) == SHM_NAME_BYTES ? 0 : 1);
    }
    char name[SHM_NAME_BYTES] = {0};
    bool got = read(p[0], name, sizeof name) == (ssize_t)sizeof name;
    int ws = 0;
    waitpid(dead, &ws, 0);
    close(p[0]);
    close(p[1]);
    FAIL_IF(!got || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0, "the dying process failed");
    name[SHM_NAME_BYTES - 1] = '\0';
    const std::string path = std::string("/dev/shm") + name;
    FAIL_IF(access(path.c_str(), F_OK) != 0, "%s: not left behind by its dead creator", name);
    t->close(&mine);  // recv_connect never came
    FAIL_IF(access(path.c_str(), F_OK) == 0, "%s is still there after the close", name);
    return 0;
  }, opts);
  EXPECT_EQ(status[0], 0);
}

}  // namespace
