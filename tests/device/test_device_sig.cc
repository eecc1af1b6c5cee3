// The signature the device kernels carry in the head of each link's first
// slot (prims_device.cuh), checked on the host: its keying is the host
// executor's (signature_packed_keyed), the slot's room leaves the head and
// keeps data aligned, a chain's agreement slots make every link carry a
// first slot both ways (so that every link compares) and keep the links'
// steps paired, and the host's report of a block's record names the fields
// that differ. The kernels' own run is DeviceMismatch
// in tests/device/test_device_mismatch.cc (GPU only).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "weft.h"
extern "C" {
#include "collectives/algo/ring_steps.h"
#include "collectives/core/plan.h"
#include "collectives/core/signature.h"
#include "collectives/exec/device/dev_sig.h"
#include "collectives/exec/device/device.h"
#include "collectives/exec/device/device_mismatch.h"
}

namespace {

struct signature_packed packed(enum coll_kind coll, uint64_t count, weftDataType_t t,
                               weftRedOp_t op, int root) {
  struct weft_plan plan;
  memset(&plan, 0, sizeof plan);
  plan.coll = coll;
  plan.count = count;
  plan.datatype = t;
  plan.op = op;
  plan.root = root;
  struct signature_packed s;
  signature_pack(&s, &plan);
  return s;
}

TEST(DeviceSignature, KeyedAsTheHostKeysItsSlots) {
  const unsigned seed = 20261203;
  std::mt19937_64 rng(seed);
  printf("seed %u\n", seed);
  for (int i = 0; i < 1000; i++) {
    struct signature_packed s =
        packed((enum coll_kind)(rng() % 5), rng() >> (rng() % 64), (weftDataType_t)(rng() % 12),
               (weftRedOp_t)(rng() % 5), (int)(rng() % 9) - 1);
    const uint64_t step = i < 10 ? (uint64_t)i : rng();
    struct signature_packed host;
    signature_packed_keyed(&host, &s, step);
    uint64_t words[2], keyed[2], back[2];
    memcpy(words, &s, sizeof words);
    dev_sig_keyed(words, step, keyed);
    ASSERT_EQ(memcmp(keyed, &host, sizeof keyed), 0) << "step " << step;
    dev_sig_unkeyed(keyed, step, back);
    ASSERT_EQ(memcmp(back, &s, sizeof back), 0) << "step " << step;
    // another step's key never reads as this one's
    uint64_t other[2];
    dev_sig_keyed(words, step + 1 + rng() % 7, other);
    ASSERT_NE(memcmp(other, keyed, sizeof other), 0) << "step " << step;
  }
}

TEST(DeviceSignature, SlotRoomLeavesTheHeadAndKeepsDataAligned) {
  for (unsigned slot : {DEV_SIMPLE_SLOT_NBYTES, DEV_LL_SLOT_NBYTES}) {
    const size_t simple = DEV_SLOT_ROOM(DEV_PROTO_SIMPLE, (size_t)slot);
    EXPECT_EQ(simple + DEV_SLOT_HEADER_NBYTES, slot);
    EXPECT_EQ(simple % 64, 0u) << "SIMPLE data after the head stays 64-byte aligned";
    const size_t ll = DEV_SLOT_ROOM(DEV_PROTO_LL, (size_t)slot);
    const size_t ll_lines = ll / DEV_LL_LINE_DATA_NBYTES * DEV_LL_LINE_NBYTES;
    EXPECT_LE(ll_lines + DEV_SLOT_HEADER_NBYTES, slot);
    EXPECT_LT(slot - (ll_lines + DEV_SLOT_HEADER_NBYTES), 64 / DEV_LL_LINE_DATA_NBYTES * DEV_LL_LINE_NBYTES)
        << "LL keeps all but less than 64 payload bytes";
    EXPECT_EQ(ll % 64, 0u) << "the all-reduce's chunks are multiples of 64 bytes";
  }
  // the head holds the signature: two LL lines' payload, or 16 SIMPLE bytes
  EXPECT_GE(DEV_SLOT_HEADER_NBYTES / DEV_LL_LINE_NBYTES * DEV_LL_LINE_DATA_NBYTES,
            sizeof(struct signature_packed));
}

// For every rank count, root and collective: the position that
// ring_free_link_sender names sends no data in the chain and the next one
// receives none; with the agreement's slots (ring_chain_agree_nslots) every
// rank sends and receives on both of its links, each link's sender sends
// exactly the slots its receiver takes, and the free link carries two (the
// signature before the chain, the agreement after its first step). So
// where the ranks agree, every link's first slot is compared and the steps
// stay paired; where they disagree on the root, every rank still sends and
// receives on both links (kernels.cuh says how such calls end).
TEST(DeviceSignature, ChainAgreementPairsEveryLink) {
  int checked = 0;
  for (int k = 2; k <= 9; k++) {
    int ring[16];
    for (int i = 0; i < k; i++) ring[i] = i;
    for (int coll : {(int)RING_BROADCAST, (int)RING_REDUCE, (int)RING_ALLREDUCE}) {
      for (int root = 0; root < k; root++) {
        const int root_pos = coll == RING_ALLREDUCE ? -1 : root;
        const int last = ring_free_link_sender(coll, k, root_pos);
        std::vector<size_t> sends(k), recvs(k);
        for (int pos = 0; pos < k; pos++) {
          struct ring_geom g;
          const size_t count = 1000;
          ring_geom_init(&g, coll, k, pos, root_pos, count, 0, count, 96, 4);
          size_t nsends = 0, nrecvs = 0, agree_sends = 0, agree_recvs = 0;
          ring_channel_nslots(&g, ring, &nsends, &nrecvs);
          ring_chain_agree_nslots(coll, k, root_pos, pos, &agree_sends, &agree_recvs);
          if (coll == RING_ALLREDUCE) {
            EXPECT_EQ(last, -1);
            EXPECT_EQ(ring_chain_index(coll, k, root_pos, pos), -1);
            EXPECT_EQ(agree_sends + agree_recvs, 0u);
          } else {
            if (pos == last) {
              EXPECT_EQ(nsends, 0u) << "k " << k << " root " << root;
            }
            if (pos == (last + 1) % k) {
              EXPECT_EQ(nrecvs, 0u) << "k " << k << " root " << root;
            }
            EXPECT_EQ(ring_chain_index(coll, k, root_pos, (last + 1) % k), 0);
          }
          sends[pos] = nsends + agree_sends;
          recvs[pos] = nrecvs + agree_recvs;
          EXPECT_GT(sends[pos], 0u) << "k " << k << " root " << root << " pos " << pos;
          EXPECT_GT(recvs[pos], 0u) << "k " << k << " root " << root << " pos " << pos;
          checked++;
        }
        for (int pos = 0; pos < k; pos++)
          EXPECT_EQ(sends[pos], recvs[(pos + 1) % k])
              << "link " << pos << "->" << (pos + 1) % k << " k " << k << " root " << root;
        if (last >= 0) {
          EXPECT_EQ(sends[last], 2u) << "the free link: the signature and the agreement";
        }
      }
    }
  }
  printf("%d positions checked\n", checked);
}

struct dev_mismatch record(int peer, uint64_t step, const struct signature_packed &mine,
                           const struct signature_packed &theirs) {
  struct dev_mismatch m;
  memset(&m, 0, sizeof m);
  m.found = 1;
  m.peer = peer;
  m.step = step;
  m.their_step = step;
  memcpy(m.mine, &mine, sizeof m.mine);
  uint64_t words[2];
  memcpy(words, &theirs, sizeof words);
  dev_sig_keyed(words, step, m.theirs);
  return m;
}

TEST(DeviceSignature, ReportNamesTheFieldsThatDiffer) {
  struct dev_mismatch recs[DEV_MAX_CHANNELS];
  memset(recs, 0, sizeof recs);
  const auto f32 = packed(COLL_ALLREDUCE, 1000, weftFloat32, weftSum, -1);
  struct Case {
    struct signature_packed theirs;
    const char *want;
  } cases[] = {
      {packed(COLL_ALLREDUCE, 1024, weftFloat32, weftSum, -1),
       "count differs: rank 1 has 1000, rank 2 has 1024"},
      {packed(COLL_ALLREDUCE, 1000, weftInt32, weftSum, -1),
       "datatype differs: rank 1 has float32, rank 2 has int32"},
      {packed(COLL_ALLREDUCE, 1000, weftFloat32, weftMax, -1),
       "op differs: rank 1 has sum, rank 2 has max"},
      {packed(COLL_ALLGATHER, 1000, weftFloat32, weftSum, -1), "collective differs"},
  };
  for (const auto &c : cases) {
    // the record of block 5 only: the host finds it among the others
    recs[5] = record(2, 77, f32, c.theirs);
    EXPECT_EQ(device_mismatch_error(1, recs, DEV_MAX_CHANNELS), weftInvalidUsage);
    const std::string text = weftGetLastError(nullptr);
    EXPECT_NE(text.find("ranks disagree on a collective"), std::string::npos) << text;
    EXPECT_NE(text.find(c.want), std::string::npos) << text;
  }
  // a root, named with the lower rank first whichever found it
  const auto b0 = packed(COLL_BROADCAST, 64, weftFloat32, weftSum, 0);
  const auto b1 = packed(COLL_BROADCAST, 64, weftFloat32, weftSum, 1);
  recs[5] = record(0, 3, b1, b0);
  EXPECT_EQ(device_mismatch_error(2, recs, DEV_MAX_CHANNELS), weftInvalidUsage);
  std::string text = weftGetLastError(nullptr);
  EXPECT_NE(text.find("root differs: rank 0 has 0, rank 2 has 1"), std::string::npos) << text;

  // a head an earlier step left (the peer is elsewhere): no field named
  recs[5] = record(3, 9, f32, f32);
  recs[5].step = 10;
  EXPECT_EQ(device_mismatch_error(1, recs, DEV_MAX_CHANNELS), weftInvalidUsage);
  text = weftGetLastError(nullptr);
  EXPECT_NE(text.find("first slot from rank 3"), std::string::npos) << text;
  EXPECT_NE(text.find("another call"), std::string::npos) << text;

  // raw data where the head should be, at this step
  recs[5].their_step = 10;
  recs[5].theirs[0] = 0x4142434445464748ull;
  recs[5].theirs[1] = 0x3ff0000000000000ull;
  EXPECT_EQ(device_mismatch_error(1, recs, DEV_MAX_CHANNELS), weftInvalidUsage);
  text = weftGetLastError(nullptr);
  EXPECT_NE(text.find("another call"), std::string::npos) << text;

  // a send/recv chunk's head: both sizes, or steps that no longer pair up
  memset(&recs[5], 0, sizeof recs[5]);
  recs[5].found = 1;
  recs[5].kind = DEV_MISMATCH_P2P;
  recs[5].peer = 0;
  recs[5].step = recs[5].their_step = 12;
  recs[5].mine[0] = 1024;
  recs[5].mine[1] = 3;
  recs[5].theirs[0] = 4096;
  recs[5].theirs[1] = 12;
  EXPECT_EQ(device_mismatch_error(1, recs, DEV_MAX_CHANNELS), weftInvalidUsage);
  text = weftGetLastError(nullptr);
  EXPECT_NE(text.find("sizes differ: rank 1 receives 1024 bytes from rank 0 (operation 3 of its "
                      "group), which sends 4096"),
            std::string::npos)
      << text;
  recs[5].their_step = 8;
  EXPECT_EQ(device_mismatch_error(1, recs, DEV_MAX_CHANNELS), weftInvalidUsage);
  text = weftGetLastError(nullptr);
  EXPECT_NE(text.find("do not pair up"), std::string::npos) << text;

  // no record found: still a refusal, naming the rank
  memset(recs, 0, sizeof recs);
  EXPECT_EQ(device_mismatch_error(4, recs, DEV_MAX_CHANNELS), weftInvalidUsage);
  text = weftGetLastError(nullptr);
  EXPECT_NE(text.find("rank 4"), std::string::npos) << text;
}

// A block that timed out says whom it waited on: the first found record
// names the peer, what it waited for and the step; none found, nothing.
TEST(DeviceSignature, StallNamesThePeerWaitedOn) {
  struct dev_stall recs[DEV_MAX_CHANNELS];
  memset(recs, 0, sizeof recs);
  char buf[160] = "untouched";
  EXPECT_EQ(device_stall_describe(buf, sizeof buf, recs, DEV_MAX_CHANNELS), 0);
  EXPECT_STREQ(buf, "untouched");
  recs[7] = {1, 3, DEV_STALL_RECV, 0, 12};
  recs[9] = {1, 5, DEV_STALL_SEND, 0, 40};
  EXPECT_EQ(device_stall_describe(buf, sizeof buf, recs, DEV_MAX_CHANNELS), 1);
  EXPECT_STREQ(buf, "rank 3 (waiting for its data at step 12 of their connection)");
  recs[7].found = 0;
  EXPECT_EQ(device_stall_describe(buf, sizeof buf, recs, DEV_MAX_CHANNELS), 1);
  EXPECT_STREQ(buf, "rank 5 (waiting for a free slot to send to it at step 40 of their connection)");
}

}  // namespace
