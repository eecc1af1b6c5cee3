// Checked checkpoints: a checkpoint saved on 3 ranks (stage 1, two AdamW
// steps taken, so moments are not zero) is damaged in each way below, then
// loaded on 2 ranks at stage 2 and consolidated. Each damage is refused on
// every rank with a message that names it, and a refused load leaves the
// context's parameters as they were; the intact checkpoint loads bit for bit.
// A read failing on one rank after the checks leaves every context as it was.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
extern "C" {
#include "zero/zero_internal.h"  // zero_ops_host, to fail one rank's read
#include "zero/zero_test_hooks.h"  // zero_test_save_crash_rank
}

extern "C" uint32_t zero_crc32c(uint32_t crc, const void *buf, size_t nbytes);
extern "C" uint32_t zero_crc32c_sw(uint32_t crc, const void *buf, size_t nbytes);

using namespace weft_test;

namespace {

// Layers of odd sizes; the last is smaller than the rank count, so some
// ranks hold nothing of it.
const std::vector<size_t> kLayers = {1001, 37, 2};
constexpr int kHeader = 64;          // shard header bytes
constexpr int kPayloadCrcAt = 56;    // its payload CRC
constexpr int kHeaderCrcAt = 60;     // its own CRC, of the 60 bytes before

// CRC-32C bit by bit: the reference the library's table version must match.
uint32_t crc32c_ref(uint32_t crc, const void *buf, size_t n) {
  const unsigned char *p = static_cast<const unsigned char *>(buf);
  crc = ~crc;
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
  }
  return ~crc;
}

// weftZeroShardOf's count, written out.
uint64_t shard_count(uint64_t count, uint64_t n, uint64_t r) {
  uint64_t s = (count + n - 1) / n, off = r * s;
  return off >= count ? 0 : (count - off < s ? count - off : s);
}

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const std::string &path, const std::string &data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

int sh(const std::string &cmd) { return system(cmd.c_str()); }

std::string temp_dir(const char *tag) {
  char templ[256];
  snprintf(templ, sizeof templ, "/tmp/weft_ckpt_%s_XXXXXX", tag);
  const char *d = mkdtemp(templ);
  return d ? d : "";
}

int init(const RankCtx &ctx, weftComm_t *comm) {
  if (weftCommInitRank(comm, ctx.nranks, ctx.id, ctx.rank) != weftSuccess)
    return rank_fail(ctx, "init: %s", weftGetLastError(nullptr));
  return 0;
}

// A context over kLayers (one parameter per layer) initialised from seed.
int make_ctx(const RankCtx &ctx, weftComm_t comm, int stage, int allow_non_finite, uint64_t seed,
             weftZero_t *out) {
  weftZeroConfig_t cfg;
  weftZeroConfigDefaults(&cfg);
  cfg.stage = stage;
  cfg.allowNonFinite = allow_non_finite;
  if (weftZeroCreate(out, comm, &cfg) != weftSuccess)
    return rank_fail(ctx, "create: %s", weftZeroLastError());
  Rng rng(seed);
  for (size_t l = 0; l < kLayers.size(); l++) {
    std::vector<float> init(kLayers[l]);
    for (float &v : init) v = (float)(rng.uniform() - 0.5);
    int id;
    if (weftZeroAddParam(*out, (int)l, init.size(), init.data(), &id) != weftSuccess)
      return rank_fail(ctx, "add: %s", weftZeroLastError());
  }
  if (weftZeroFinalize(*out) != weftSuccess)
    return rank_fail(ctx, "finalize: %s", weftZeroLastError());
  return 0;
}

size_t psi() {
  size_t n = 0;
  for (size_t c : kLayers) n += c;
  return n;
}

// AdamW steps with seeded gradients (the same on every rank).
int train_steps(const RankCtx &ctx, weftZero_t z, uint64_t seed, int steps) {
  Rng rng(seed ^ 0x5eed);
  for (int step = 0; step < steps; step++) {
    for (size_t l = 0; l < kLayers.size(); l++) {
      void *g;
      if (weftZeroGrad(z, (int)l, &g) != weftSuccess)
        return rank_fail(ctx, "grad: %s", weftZeroLastError());
      std::vector<float> grad(kLayers[l]);
      for (float &v : grad) v = (float)(rng.uniform() - 0.5);
      weftZeroAccumulate(g, weftFloat32, grad.data(), grad.size());
      if (weftZeroGradReady(z, (int)l, nullptr) != weftSuccess)
        return rank_fail(ctx, "ready: %s", weftZeroLastError());
    }
    if (weftZeroStep(z, nullptr, nullptr) != weftSuccess)
      return rank_fail(ctx, "step: %s", weftZeroLastError());
  }
  return 0;
}

int train_two_steps(const RankCtx &ctx, weftZero_t z, uint64_t seed) {
  return train_steps(ctx, z, seed, 2);
}

// Saves seed's model after two steps on 3 ranks into dir; its parameters
// go to params_out.
void save_run(const std::string &dir, uint64_t seed, std::vector<float> *params_out) {
  std::string params_path = dir + ".params";
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftZero_t z;
    if (int rc = make_ctx(ctx, comm, 1, 0, seed, &z)) return rc;
    if (int rc = train_two_steps(ctx, z, seed)) return rc;
    std::vector<float> p(psi());
    if (weftZeroGetParams(z, p.data(), nullptr) != weftSuccess)
      return rank_fail(ctx, "get: %s", weftZeroLastError());
    if (weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess)
      return rank_fail(ctx, "save: %s", weftZeroLastError());
    if (ctx.rank == 0) spit(params_path, std::string((char *)p.data(), p.size() * sizeof(float)));
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  for (int s : status) ASSERT_EQ(s, 0);
  std::string raw = slurp(params_path);
  params_out->resize(raw.size() / sizeof(float));
  memcpy(params_out->data(), raw.data(), raw.size());
  unlink(params_path.c_str());
}

struct LoadOutcome {
  std::vector<int> status;          // per rank: 0 when the body ran to its end
  std::vector<int> code;            // weftZeroLoad's result per rank
  std::vector<std::string> message; // weftZeroLastError per rank
  std::vector<float> params;        // rank 0's parameters after the load
  bool unchanged = true;            // a refused load left every rank's parameters as they were
  long step = -1;
};

// Loads dir on 2 ranks at stage 2 into a context of another seed.
LoadOutcome load_on_two(const std::string &dir, int allow_non_finite = 0) {
  std::string out = dir + ".outcome";
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    weftZero_t z;
    if (int rc = make_ctx(ctx, comm, 2, allow_non_finite, 777, &z)) return rc;
    std::vector<float> before(psi()), after(psi());
    if (weftZeroGetParams(z, before.data(), nullptr) != weftSuccess)
      return rank_fail(ctx, "get: %s", weftZeroLastError());
    weftResult_t res = weftZeroLoad(z, dir.c_str(), nullptr);
    std::string msg = weftZeroLastError();
    if (weftZeroGetParams(z, after.data(), nullptr) != weftSuccess)
      return rank_fail(ctx, "get after load: %s", weftZeroLastError());
    int same = memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0;
    std::string rec = std::to_string((int)res) + "\n" + std::to_string(same) + "\n" +
                      std::to_string(weftZeroStepCount(z)) + "\n" + msg + "\n";
    spit(out + "." + std::to_string(ctx.rank), rec);
    if (ctx.rank == 0)
      spit(out + ".params", std::string((char *)after.data(), after.size() * sizeof(float)));
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  }, [] {
    RunOptions o;
    o.allow_warnings = true;
    return o;
  }());
  LoadOutcome r;
  r.status = status;
  for (int q = 0; q < 2; q++) {
    std::istringstream in(slurp(out + "." + std::to_string(q)));
    int code = -1, same = 0;
    long step = -1;
    std::string msg;
    in >> code >> same >> step;
    in.ignore();
    std::getline(in, msg);
    r.code.push_back(code);
    r.message.push_back(msg);
    if (code != weftSuccess && !same) r.unchanged = false;
    if (q == 0) r.step = step;
    unlink((out + "." + std::to_string(q)).c_str());
  }
  std::string raw = slurp(out + ".params");
  r.params.resize(raw.size() / sizeof(float));
  memcpy(r.params.data(), raw.data(), raw.size());
  unlink((out + ".params").c_str());
  return r;
}

// Recomputes every checksum of a version directory after a deliberate
// change, as a careless tool (or an attacker) would: shard payload and
// header CRCs, the manifest's shard lines, and its last line. edit may
// change the manifest's lines first.
void resign(const std::string &ver, int nranks,
            const std::function<void(std::vector<std::string> &)> &edit = nullptr) {
  std::vector<std::string> lines;
  std::istringstream in(slurp(ver + "/manifest"));
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  lines.pop_back();  // the old checksum
  for (int q = 0; q < nranks; q++) {
    char name[64];
    snprintf(name, sizeof name, "/rank-%05d.bin", q);
    std::string shard = slurp(ver + name);
    uint32_t crc = crc32c_ref(0, shard.data() + kHeader, shard.size() - kHeader);
    memcpy(&shard[kPayloadCrcAt], &crc, 4);
    uint32_t hcrc = crc32c_ref(0, shard.data(), kHeaderCrcAt);
    memcpy(&shard[kHeaderCrcAt], &hcrc, 4);
    spit(ver + name, shard);
    for (std::string &l : lines)
      if (l.rfind("shard " + std::to_string(q) + " ", 0) == 0) {
        char buf[128];
        snprintf(buf, sizeof buf, "shard %d %zu %08x", q, shard.size() - kHeader, crc);
        l = buf;
      }
  }
  if (edit) edit(lines);
  std::string text;
  for (const std::string &l : lines) text += l + "\n";
  char last[32];
  snprintf(last, sizeof last, "crc32c %08x\n", crc32c_ref(0, text.data(), text.size()));
  spit(ver + "/manifest", text + last);
}

class ZeroCkptDamage : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(temp_dir("damage"));
    ASSERT_FALSE(root_->empty());
    saved_ = new std::vector<float>();
    other_ = new std::vector<float>();
    save_run(*root_ + "/pristine", test_seed(), saved_);
    save_run(*root_ + "/other", test_seed() + 1, other_);
  }
  static void TearDownTestSuite() {
    sh("rm -rf " + *root_);
    delete root_;
    delete saved_;
    delete other_;
  }

  // A fresh copy of the pristine checkpoint; ver_ is its version directory.
  void SetUp() override {
    const testing::TestInfo *t = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = *root_ + "/" + t->name();
    ASSERT_EQ(sh("cp -a " + *root_ + "/pristine " + dir_), 0);
    ver_ = dir_ + "/step-2";
  }

  std::string shard(int q) {
    char name[64];
    snprintf(name, sizeof name, "/rank-%05d.bin", q);
    return ver_ + name;
  }

  // The load fails on both ranks, at least one names the fault (needle),
  // nothing changed; consolidation fails with the needle (or its own) too
  // and writes nothing.
  void expect_refused(const char *needle, bool consolidate_too = true,
                      const char *consolidate_needle = nullptr) {
    LoadOutcome r = load_on_two(dir_);
    bool named = false;
    for (int q = 0; q < 2; q++) {
      EXPECT_EQ(r.status[q], 0) << "rank " << q;
      EXPECT_TRUE(r.code[q] == weftInvalidUsage || r.code[q] == weftRemoteError ||
                  r.code[q] == weftSystemError)
          << "rank " << q << " loaded it (" << r.code[q] << "): " << r.message[q];
      if (r.message[q].find(needle) != std::string::npos) named = true;
    }
    EXPECT_TRUE(named) << "no rank said \"" << needle << "\": [" << r.message[0] << "] ["
                       << r.message[1] << "]";
    EXPECT_TRUE(r.unchanged) << "a refused load changed the parameters";
    printf("refused: %s\n", r.message[0].c_str());
    if (!consolidate_too) return;
    std::string out = dir_ + ".full";
    EXPECT_NE(weftZeroConsolidate(dir_.c_str(), out.c_str()), weftSuccess);
    if (consolidate_needle == nullptr) consolidate_needle = needle;
    EXPECT_NE(std::string(weftZeroLastError()).find(consolidate_needle), std::string::npos)
        << "consolidate: " << weftZeroLastError();
    EXPECT_NE(access(out.c_str(), F_OK), 0) << "consolidate wrote " << out;
    EXPECT_NE(access((out + ".tmp").c_str(), F_OK), 0) << "consolidate left its temporary file";
  }

  static std::string *root_;
  static std::vector<float> *saved_, *other_;
  std::string dir_, ver_;
};

std::string *ZeroCkptDamage::root_;
std::vector<float> *ZeroCkptDamage::saved_;
std::vector<float> *ZeroCkptDamage::other_;

// Both implementations (the processor's instruction where it has one, and
// the tables) against the bitwise reference, whole and continued, at odd
// lengths and offsets; then their speed on 64 MiB, printed.
TEST(ZeroCkptCrc, MatchesTheReference) {
  for (auto crc : {zero_crc32c, zero_crc32c_sw}) {
    EXPECT_EQ(crc(0, "123456789", 9), 0xe3069283u);  // the standard check value
    EXPECT_EQ(crc(0, "", 0), 0u);
    Rng rng(test_seed());
    std::vector<unsigned char> data(4099 + 3);
    for (auto &b : data) b = (unsigned char)rng.next();
    for (size_t off : {0, 1, 3})
      for (size_t n : {1, 7, 8, 9, 63, 64, 65, 1000, 4099}) {
        const unsigned char *p = data.data() + off;
        EXPECT_EQ(crc(0, p, n), crc32c_ref(0, p, n)) << n << " at " << off;
        for (size_t cut : {size_t{0}, size_t{1}, n / 3, n - 1}) {
          uint32_t c = crc(crc(0, p, cut), p + cut, n - cut);
          EXPECT_EQ(c, crc32c_ref(0, p, n)) << n << " split at " << cut;
        }
      }
  }
  std::vector<unsigned char> big(64u << 20);
  Rng rng(test_seed());
  for (size_t i = 0; i < big.size(); i += 8) {
    uint64_t v = rng.next();
    memcpy(&big[i], &v, 8);
  }
  double t0 = now_s();
  uint32_t a = zero_crc32c(0, big.data(), big.size());
  double t1 = now_s();
  uint32_t b = zero_crc32c_sw(0, big.data(), big.size());
  double t2 = now_s();
  EXPECT_EQ(a, b);
  printf("crc32c of 64 MiB: %.2f GB/s (zero_crc32c), %.2f GB/s (tables)\n",
         big.size() / (t1 - t0) / 1e9, big.size() / (t2 - t1) / 1e9);
}

TEST_F(ZeroCkptDamage, IntactLoadsBitForBitAndConsolidates) {
  LoadOutcome r = load_on_two(dir_);
  for (int q = 0; q < 2; q++) ASSERT_EQ(r.code[q], weftSuccess) << r.message[q];
  EXPECT_EQ(r.step, 2);
  ASSERT_EQ(r.params.size(), saved_->size());
  EXPECT_EQ(memcmp(r.params.data(), saved_->data(), r.params.size() * sizeof(float)), 0);
  std::string out = dir_ + ".full";
  ASSERT_EQ(weftZeroConsolidate(dir_.c_str(), out.c_str()), weftSuccess) << weftZeroLastError();
  std::string full = slurp(out);
  size_t header = 16 + 8 * kLayers.size();
  ASSERT_EQ(full.size(), header + saved_->size() * sizeof(float));
  EXPECT_EQ(memcmp(full.data() + header, saved_->data(), saved_->size() * sizeof(float)), 0);
  // the test's re-signing reproduces the library's checksums exactly
  std::string manifest = slurp(ver_ + "/manifest"), s1 = slurp(shard(1));
  resign(ver_, 3);
  EXPECT_EQ(slurp(ver_ + "/manifest"), manifest);
  EXPECT_EQ(slurp(shard(1)), s1);
}

TEST_F(ZeroCkptDamage, FlippedBitInData) {
  Rng rng(test_seed() + 1);
  int q = (int)(rng.next() % 3);
  std::string s = slurp(shard(q));
  size_t at = kHeader + rng.next() % (s.size() - kHeader);
  s[at] ^= (char)(1 << (rng.next() % 8));
  spit(shard(q), s);
  expect_refused("is damaged: its data's checksum");
}

TEST_F(ZeroCkptDamage, FlippedBitInHeader) {
  std::string s = slurp(shard(2));
  s[24] ^= 0x04;  // the step
  spit(shard(2), s);
  expect_refused("header's checksum");
}

TEST_F(ZeroCkptDamage, SixteenFlippedBytes) {
  Rng rng(test_seed() + 2);
  std::string s = slurp(shard(0));
  size_t at = kHeader + rng.next() % (s.size() - kHeader - 16);
  for (int i = 0; i < 16; i++) s[at + i] ^= (char)(1 + rng.next() % 255);
  spit(shard(0), s);
  expect_refused("is damaged");
}

TEST_F(ZeroCkptDamage, NaNValuesRefusedUnlessAllowed) {
  std::string s = slurp(shard(1));
  float nan = NAN, inf = INFINITY;
  memcpy(&s[kHeader + 4 * 5], &nan, 4);                // a master weight of layer 0
  memcpy(&s[s.size() - 4], &inf, 4);                   // the last moment
  spit(shard(1), s);
  resign(ver_, 3);  // checksums that hold: only the values are wrong
  expect_refused("non-finite values are refused", false);
  std::string out = dir_ + ".full";
  EXPECT_NE(weftZeroConsolidate(dir_.c_str(), out.c_str()), weftSuccess);
  EXPECT_NE(std::string(weftZeroLastError()).find("is nan"), std::string::npos)
      << weftZeroLastError();
  // allowed: both load and consolidate take them; rank 1's first master
  // weight of layer 0 sits at 334 + 5 (1001 on 3 ranks: shards of 334)
  LoadOutcome r = load_on_two(dir_, 1);
  for (int q = 0; q < 2; q++) ASSERT_EQ(r.code[q], weftSuccess) << r.message[q];
  ASSERT_EQ(r.params.size(), saved_->size());
  EXPECT_TRUE(std::isnan(r.params[334 + 5]));
  EXPECT_EQ(weftZeroConsolidateFlags(dir_.c_str(), out.c_str(), weftZeroAllowNonFinite),
            weftSuccess)
      << weftZeroLastError();
  EXPECT_EQ(weftZeroConsolidateFlags(dir_.c_str(), out.c_str(), 8), weftInvalidArgument);
}

TEST_F(ZeroCkptDamage, ZeroShard) {
  std::string s = slurp(shard(1));
  spit(shard(1), std::string(s.size(), '\0'));
  expect_refused("not a weft ZeRO shard");
}

TEST_F(ZeroCkptDamage, ShardSymlinkedToDevZero) {
  ASSERT_EQ(unlink(shard(0).c_str()), 0);
  ASSERT_EQ(symlink("/dev/zero", shard(0).c_str()), 0);
  expect_refused("is not a regular file");
}

TEST_F(ZeroCkptDamage, ShardOfAnotherRun) {
  // same layout, step and rank: only the run tells them apart
  ASSERT_EQ(sh("cp " + *root_ + "/other/step-2/rank-00001.bin " + shard(1)), 0);
  expect_refused("belongs to run");
}

TEST_F(ZeroCkptDamage, EveryShardOfAnotherRun) {
  ASSERT_EQ(sh("cp " + *root_ + "/other/step-2/rank-0000*.bin " + ver_), 0);
  expect_refused("belongs to run");
}

TEST_F(ZeroCkptDamage, GarbageAppendedToAShard) {
  std::string s = slurp(shard(2));
  spit(shard(2), s + "garbage!");
  expect_refused("something appended");
}

TEST_F(ZeroCkptDamage, GarbageAppendedToTheManifest) {
  std::string m = slurp(ver_ + "/manifest");
  spit(ver_ + "/manifest", m + "layer 3 1000\n");
  expect_refused("no checksum line at its end");
}

TEST_F(ZeroCkptDamage, StepMinus1000) {
  auto step = [](std::vector<std::string> &lines) {
    for (std::string &l : lines)
      if (l == "step 2") l = "step -1000";
  };
  // edited by hand: the checksum no longer holds
  std::string m = slurp(ver_ + "/manifest");
  size_t at = m.find("\nstep 2\n");
  ASSERT_NE(at, std::string::npos);
  spit(ver_ + "/manifest", m.replace(at, 8, "\nstep -1000\n"));
  expect_refused("is damaged: its checksum");
  // re-signed: the step itself is refused
  spit(ver_ + "/manifest", slurp(*root_ + "/pristine/step-2/manifest"));
  resign(ver_, 3, step);
  expect_refused("step -1000 is negative");
  // the version's name says another step than its manifest
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines)
      if (l == "step -1000") l = "step 7";
  });
  expect_refused("but the directory is step 2's");
  // LATEST naming a negative step
  spit(dir_ + "/LATEST", "step--1000\n");
  expect_refused("does not name a step");
}

TEST_F(ZeroCkptDamage, ManifestAskingForAHugeAllocation) {
  // 11e12 parameters in layer 0 (44 TB of floats), checksums re-signed: the
  // shard sizes the manifest states do not match, and nothing is allocated
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines)
      if (l == "layer 0 1001") l = "layer 0 11000000000000";
  });
  expect_refused("its layers make");
  // and the shard sizes raised to match: the files' lengths refuse it
  spit(ver_ + "/manifest", slurp(*root_ + "/pristine/step-2/manifest"));
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines) {
      if (l == "layer 0 1001") l = "layer 0 11000000000000";
      for (int q = 0; q < 3; q++)
        if (l.rfind("shard " + std::to_string(q) + " ", 0) == 0) {
          uint64_t floats = 0;  // 3 arrays of each layer's part
          for (uint64_t c : {uint64_t{11000000000000}, uint64_t{37}, uint64_t{2}})
            floats += 3 * shard_count(c, 3, q);
          char buf[128];
          snprintf(buf, sizeof buf, "shard %d %llu 00000000", q,
                   (unsigned long long)(4 * floats));
          l = buf;
        }
    }
  });
  // (a load compares the layout with its model first; consolidation has
  // only the files)
  expect_refused("layer 0 has 11000000000000 parameters, this model 1001", true,
                 "(truncated, or something appended)");
  // a layer count no manifest of this length can hold
  spit(ver_ + "/manifest", slurp(*root_ + "/pristine/step-2/manifest"));
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines)
      if (l == "layers 3") l = "layers 999999";
  });
  expect_refused("layers do not fit");
  // size overflow
  spit(ver_ + "/manifest", slurp(*root_ + "/pristine/step-2/manifest"));
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines)
      if (l == "layer 0 1001") l = "layer 0 18446744073709551615";
  });
  expect_refused("layer sizes overflow");
}

TEST_F(ZeroCkptDamage, FormatOneIsRefusedWithAReason) {
  spit(ver_ + "/manifest",
       "weft-zero-checkpoint 1\nnranks 3\nstage 1\noptimizer adamw\nstep 2\nloss_scale 1\n"
       "updates 2\ngood_steps 0\nlayers 3\nlayer 0 1001\nlayer 1 37\nlayer 2 2\n");
  expect_refused("format 1 checkpoint, written without checksums");
}

// Seeded random damage to the manifest (bytes, lines, numbers replaced by
// extremes; its checksum recomputed half of the time), to shard headers
// (their checksum recomputed half of the time) and to shard lengths:
// consolidation either refuses with a message and writes nothing, or, where
// the change means nothing (a loss scale of another valid value), writes
// exactly the intact checkpoint's parameters. Never a crash.
TEST_F(ZeroCkptDamage, RandomDamageIsRefusedOrHarmless) {
  std::string out = dir_ + ".full", ref_out = dir_ + ".ref";
  ASSERT_EQ(weftZeroConsolidate(dir_.c_str(), ref_out.c_str()), weftSuccess);
  const std::string ref = slurp(ref_out), manifest = slurp(ver_ + "/manifest");
  std::vector<std::string> shards;
  for (int q = 0; q < 3; q++) shards.push_back(slurp(shard(q)));
  std::vector<std::string> lines;
  {
    std::istringstream in(manifest);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    lines.pop_back();  // the checksum
  }
  const char *extremes[] = {"0", "-1", "2147483648", "-2147483649", "9223372036854775807",
                            "18446744073709551615", "18446744073709551616", "99999999999",
                            "nan", "inf", "1e308", "", "x", "007", "+3", " 3"};
  Rng rng(test_seed() + 3);
  int refused = 0, harmless = 0;
  for (int iter = 0; iter < 1500; iter++) {
    int kind = (int)(rng.next() % 4), q = (int)(rng.next() % 3);
    std::string m = manifest;
    std::vector<std::string> sh = shards;
    if (kind <= 1) {
      std::vector<std::string> l = lines;
      size_t i = rng.next() % l.size();
      switch (rng.next() % 4) {
        case 0: if (!l[i].empty()) l[i][rng.next() % l[i].size()] = (char)(rng.next() % 256); break;
        case 1: l.erase(l.begin() + (long)i); break;
        case 2: l.insert(l.begin() + (long)i, l[rng.next() % l.size()]); break;
        default: {
          size_t sp = l[i].rfind(' ');
          if (sp != std::string::npos)
            l[i] = l[i].substr(0, sp + 1) +
                   extremes[rng.next() % (sizeof extremes / sizeof *extremes)];
        }
      }
      std::string text;
      for (const std::string &x : l) text += x + "\n";
      uint32_t crc = kind == 0 ? crc32c_ref(0, text.data(), text.size()) : (uint32_t)rng.next();
      char last[32];
      snprintf(last, sizeof last, "crc32c %08x\n", crc);
      m = text + last;
    } else if (kind == 2) {
      std::string &x = sh[q];
      x[rng.next() % kHeader] ^= (char)(1 + rng.next() % 255);
      if (rng.next() % 2) {
        uint32_t hcrc = crc32c_ref(0, x.data(), kHeaderCrcAt);
        memcpy(&x[kHeaderCrcAt], &hcrc, 4);
      }
    } else {
      sh[q].resize(rng.next() % (sh[q].size() + 64), '\0');
    }
    spit(ver_ + "/manifest", m);
    for (int r = 0; r < 3; r++) spit(shard(r), sh[r]);
    weftResult_t res = weftZeroConsolidate(dir_.c_str(), out.c_str());
    if (res == weftSuccess) {
      harmless++;
      ASSERT_EQ(slurp(out), ref) << "iteration " << iter << " (kind " << kind
                                 << ") wrote other parameters";
      unlink(out.c_str());
    } else {
      refused++;
      ASSERT_GT(strlen(weftZeroLastError()), 10u) << "iteration " << iter;
      ASSERT_NE(access(out.c_str(), F_OK), 0) << "iteration " << iter << " wrote " << out;
    }
  }
  printf("1500 random damages: %d refused, %d harmless\n", refused, harmless);
  EXPECT_GT(refused, 1200);
}

TEST_F(ZeroCkptDamage, MissingShard) {
  ASSERT_EQ(unlink(shard(2).c_str()), 0);
  expect_refused("cannot open");
}

// A load that fails on one rank after every rank checked the checkpoint,
// through a table with the device path's copies on the last rank: a read
// (its first copy truncates its own shard, which no other rank reads), or
// the installation (the copy into moment1 fails, after the master weights
// went in). Every rank fails, and every context is as it was: gradients
// accumulated before the attempt and the state give the step that follows
// without it, bit for bit.
enum class Attempt { kNone, kReadFails, kInstallFails };
std::string truncate_path;
weftResult_t copy_truncating(void *dst, const void *src, size_t n, weftStream_t s) {
  if (!truncate_path.empty() && truncate(truncate_path.c_str(), 100) == 0) truncate_path.clear();
  return zero_ops_host.copy(dst, src, n, s);
}
void *fail_dst;  // the copy into it fails, once
weftResult_t copy_failing_into(void *dst, const void *src, size_t n, weftStream_t s) {
  if (dst != nullptr && dst == fail_dst) {
    fail_dst = nullptr;
    return weftUnhandledCudaError;
  }
  return zero_ops_host.copy(dst, src, n, s);
}

std::string failed_load_run(int nranks, int stage, Attempt attempt, const std::string &dir) {
  std::string out = dir + (attempt != Attempt::kNone ? ".tried" : ".plain");
  auto status = run_ranks(nranks, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = make_ctx(ctx, comm, stage, 0, 99, &z)) return rc;
    if (int rc = train_two_steps(ctx, z, 99)) return rc;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "save: %s", weftZeroLastError());
    if (int rc = train_two_steps(ctx, z, 5)) return rc;
    for (size_t l = 0; l < kLayers.size(); l++) {  // a gradient waiting for the next step
      void *g;
      std::vector<float> grad(kLayers[l], 0.125f * (float)(l + 1));
      FAIL_IF(weftZeroGrad(z, (int)l, &g) != weftSuccess, "grad: %s", weftZeroLastError());
      weftZeroAccumulate(g, weftFloat32, grad.data(), grad.size());
    }
    static struct zero_ops hooked = zero_ops_host;
    hooked.device = 1;
    hooked.copy = attempt == Attempt::kReadFails ? copy_truncating : copy_failing_into;
    if (const int last = ctx.nranks - 1; attempt != Attempt::kNone) {
      char path[64];
      snprintf(path, sizeof path, "/step-2/rank-%05d.bin", ctx.rank);
      if (ctx.rank == last) {
        z->ops = &hooked;
        if (attempt == Attempt::kReadFails) truncate_path = dir + path;
        else fail_dst = z->moment1;
      }
      weftResult_t res = weftZeroLoad(z, dir.c_str(), nullptr);
      z->ops = &zero_ops_host;
      FAIL_IF(ctx.rank == last && attempt == Attempt::kReadFails &&
                  (res != weftSystemError || !truncate_path.empty() ||
                   strstr(weftZeroLastError(), "short or unreadable") == nullptr),
              "the failing rank: %d, %s", res, weftZeroLastError());
      FAIL_IF(ctx.rank == last && attempt == Attempt::kInstallFails &&
                  (res != weftUnhandledCudaError || fail_dst != nullptr),
              "the failing rank: %d, %s", res, weftZeroLastError());
      FAIL_IF(weftZeroStepCount(z) != 4, "the step count changed to %ld", weftZeroStepCount(z));
      FAIL_IF(ctx.rank != last && res != weftRemoteError, "load: %d, %s", res,
              weftZeroLastError());
    }
    for (size_t l = 0; l < kLayers.size(); l++)
      FAIL_IF(weftZeroGradReady(z, (int)l, nullptr) != weftSuccess, "ready: %s",
              weftZeroLastError());
    std::vector<float> p(psi());
    FAIL_IF(weftZeroStep(z, nullptr, nullptr) != weftSuccess ||
                weftZeroGetParams(z, p.data(), nullptr) != weftSuccess,
            "step: %s", weftZeroLastError());
    spit(out + "." + std::to_string(ctx.rank), std::string((char *)p.data(), p.size() * 4));
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  });
  std::string all;
  for (int r = 0; r < nranks; r++) {
    EXPECT_EQ(status[r], 0) << "rank " << r;
    all += slurp(out + "." + std::to_string(r));
    unlink((out + "." + std::to_string(r)).c_str());
  }
  sh("rm -rf " + dir);
  return all;
}
// Each of 2 and 3 ranks, stages 1 and 3: after the failed attempt every
// rank's next step gives what it gives with no attempt before it.
void expect_attempt_changes_nothing(Attempt attempt, const char *dir_name) {
  for (int n : {2, 3})
    for (int stage : {1, 3}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, stage " + std::to_string(stage));
      std::string dir = temp_dir(dir_name);
      std::string want = failed_load_run(n, stage, Attempt::kNone, dir);
      std::string got = failed_load_run(n, stage, attempt, dir);
      EXPECT_EQ(want.size(), n * psi() * sizeof(float));
      EXPECT_TRUE(got == want) << "a failed load changed a context";
    }
}

TEST(ZeroCkptFailedRead, EveryRankKeepsItsContext) {
  expect_attempt_changes_nothing(Attempt::kReadFails, "failed-read");
}

TEST(ZeroCkptFailedInstall, EveryRankPutsItsStateBack) {
  expect_attempt_changes_nothing(Attempt::kInstallFails, "failed-install");
}

// A failure of one rank before the first agreement (its stream's sync) is
// that rank's part of it: save and load fail on every rank at once (the
// others weftRemoteError), and the next save and load on the same
// communicator succeed; had the rank returned early, its peers would be
// left in the agreement's all-reduce and the calls would pair up wrongly.
int sync_fails;  // sync calls to fail
weftResult_t sync_failing(weftStream_t stream, weftComm_t comm, const char *what) {
  if (sync_fails > 0) {
    sync_fails--;
    return weftUnhandledCudaError;
  }
  return zero_ops_host.sync(stream, comm, what);
}

TEST(ZeroCkptLocalFailure, EveryRankEntersTheAgreement) {
  std::string dir = temp_dir("local-failure");
  RunOptions o;
  o.env = {{"WEFT_TIMEOUT", "10"}};
  o.timeout_s = 40;
  o.allow_warnings = true;
  double t0 = now_s();
  auto status = run_ranks(3, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = make_ctx(ctx, comm, 2, 0, 11, &z)) return rc;
    if (int rc = train_two_steps(ctx, z, 11)) return rc;
    static struct zero_ops hooked = zero_ops_host;
    hooked.sync = sync_failing;
    const bool failing = ctx.rank == 1;
    const weftResult_t want = failing ? weftUnhandledCudaError : weftRemoteError;
    if (failing) z->ops = &hooked, sync_fails = 1;
    weftResult_t res = weftZeroSave(z, dir.c_str(), nullptr);
    FAIL_IF(res != want, "the save with a failed sync: %d, %s", res, weftZeroLastError());
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "the next save: %s",
            weftZeroLastError());
    if (int rc = train_two_steps(ctx, z, 12)) return rc;
    if (failing) sync_fails = 1;
    res = weftZeroLoad(z, dir.c_str(), nullptr);
    FAIL_IF(res != want, "the load with a failed sync: %d, %s", res, weftZeroLastError());
    FAIL_IF(weftZeroStepCount(z) != 4, "a refused load changed the step to %ld",
            weftZeroStepCount(z));
    FAIL_IF(weftZeroLoad(z, dir.c_str(), nullptr) != weftSuccess, "the next load: %s",
            weftZeroLastError());
    FAIL_IF(weftZeroStepCount(z) != 2, "the load gave step %ld", weftZeroStepCount(z));
    z->ops = &zero_ops_host;
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  }, o);
  for (int r = 0; r < 3; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  EXPECT_LT(now_s() - t0, 8.0) << "a rank waited for the timeout";
  sh("rm -rf " + dir);
}

// The state of a checkpoint directory as rank 0 sees it after a save.
bool exists(const std::string &path) { return access(path.c_str(), F_OK) == 0; }
std::string latest_of(const std::string &dir) { return slurp(dir + "/LATEST"); }

// A save removes only what it supersedes: the same run's checkpoints at
// lower steps. A run started afresh in the directory of an earlier run
// keeps that run's checkpoint of a higher step, a directory it cannot read
// and a leftover of an interrupted save it cannot attribute; its own step-1
// goes once its step-3 is in. A save that would replace the earlier run's
// step-2 is refused, before anything is written and leaving no step-2.tmp,
// as is a save of the step LATEST names (rank 1 would exit halfway through
// its shard if it wrote one).
TEST(ZeroCkptPrune, OnlyWhatTheSaveSupersedes) {
  std::string dir = temp_dir("prune");
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = make_ctx(ctx, comm, 1, 0, 21, &z)) return rc;
    if (int rc = train_steps(ctx, z, 21, 2)) return rc;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "run A's save: %s",
            weftZeroLastError());
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) == weftSuccess, "step 2 saved twice");
    FAIL_IF(ctx.rank == 0 && strstr(weftZeroLastError(), "already holds") == nullptr,
            "the second save of step 2: %s", weftZeroLastError());
    weftZeroDestroy(z);
    if (ctx.rank == 0) {
      sh("mkdir " + dir + "/step-0 " + dir + "/step-0.tmp");  // unreadable: no manifest, no shard
      spit(dir + "/step-0/manifest", "not a manifest\n");
    }
    // run B, from scratch in the same directory
    if (int rc = make_ctx(ctx, comm, 1, 0, 22, &z)) return rc;
    if (int rc = train_steps(ctx, z, 22, 1)) return rc;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "run B's save of step 1: %s",
            weftZeroLastError());
    FAIL_IF(ctx.rank == 0 && (!exists(dir + "/step-2/manifest") || !exists(dir + "/step-1") ||
                              latest_of(dir) != "step-1\n"),
            "after run B's step 1, LATEST %s, step-2 %d", latest_of(dir).c_str(),
            exists(dir + "/step-2/manifest"));
    if (int rc = train_steps(ctx, z, 23, 1)) return rc;
    zero_test_save_crash_rank = 1;  // from here a shard written is a failure
    weftResult_t res = weftZeroSave(z, dir.c_str(), nullptr);
    FAIL_IF(res != (ctx.rank == 0 ? weftInvalidUsage : weftRemoteError), "run B's step 2: %d",
            res);
    FAIL_IF(ctx.rank == 0 && strstr(weftZeroLastError(), "another run") == nullptr,
            "run B's step 2: %s", weftZeroLastError());
    FAIL_IF(ctx.rank == 0 && exists(dir + "/step-2.tmp"), "the refused save left step-2.tmp");
    zero_test_save_crash_rank = -1;
    if (int rc = train_steps(ctx, z, 24, 1)) return rc;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) != weftSuccess, "run B's save of step 3: %s",
            weftZeroLastError());
    FAIL_IF(ctx.rank == 0 && (exists(dir + "/step-1") || !exists(dir + "/step-2/manifest") ||
                              !exists(dir + "/step-0") || !exists(dir + "/step-0.tmp") ||
                              latest_of(dir) != "step-3\n"),
            "after run B's step 3: step-1 %d, step-2 %d, step-0 %d, step-0.tmp %d, LATEST %s",
            exists(dir + "/step-1"), exists(dir + "/step-2/manifest"), exists(dir + "/step-0"),
            exists(dir + "/step-0.tmp"), latest_of(dir).c_str());
    zero_test_save_crash_rank = 1;
    FAIL_IF(weftZeroSave(z, dir.c_str(), nullptr) == weftSuccess, "step 3 saved twice");
    FAIL_IF(ctx.rank == 0 && exists(dir + "/step-3.tmp"), "the refused save left step-3.tmp");
    zero_test_save_crash_rank = -1;
    weftZeroDestroy(z);
    weftCommDestroy(comm);
    return 0;
  }, [] {
    RunOptions o;
    o.allow_warnings = true;
    return o;
  }());
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  sh("rm -rf " + dir);
}

// Ranks that read different checkpoints (another step, another run of the
// same step, the same step's manifest edited and re-checksummed) refuse on
// every rank with a message naming the difference, and keep their contexts.
TEST(ZeroCkptLoad, RanksReadingDifferentCheckpointsRefuse) {
  std::string root = temp_dir("mixed");
  const std::string a = root + "/a", b = root + "/b", c = root + "/c", e = root + "/e";
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    weftZero_t z, other;
    if (int rc = init(ctx, &comm)) return rc;
    if (int rc = make_ctx(ctx, comm, 1, 0, 31, &z)) return rc;
    if (int rc = make_ctx(ctx, comm, 1, 0, 32, &other)) return rc;
    if (int rc = train_steps(ctx, z, 31, 2)) return rc;
    if (int rc = train_steps(ctx, other, 32, 2)) return rc;
    FAIL_IF(weftZeroSave(z, a.c_str(), nullptr) != weftSuccess ||
                weftZeroSave(other, c.c_str(), nullptr) != weftSuccess,
            "save: %s", weftZeroLastError());
    if (int rc = train_steps(ctx, z, 33, 1)) return rc;
    FAIL_IF(weftZeroSave(z, b.c_str(), nullptr) != weftSuccess, "save: %s", weftZeroLastError());
    weftZeroDestroy(z);
    weftZeroDestroy(other);
    if (ctx.rank == 0) {
      sh("cp -a " + a + " " + e);
      resign(e + "/step-2", 2, [](std::vector<std::string> &lines) {
        for (std::string &l : lines)
          if (l.rfind("good_steps ", 0) == 0) l = "good_steps 1";
      });
    }
    struct Case {
      std::string rank1_dir;
      const char *needle;
    };
    for (const Case &k : {Case{b, "different checkpoints"}, Case{c, "different runs"},
                          Case{e, "different manifests"}}) {
      if (int rc = make_ctx(ctx, comm, 2, 0, 777, &z)) return rc;
      std::vector<float> before(psi()), after(psi());
      FAIL_IF(weftZeroGetParams(z, before.data(), nullptr) != weftSuccess, "get");
      weftResult_t res = weftZeroLoad(z, (ctx.rank == 0 ? a : k.rank1_dir).c_str(), nullptr);
      FAIL_IF(res != weftInvalidUsage || strstr(weftZeroLastError(), k.needle) == nullptr,
              "loading %s beside a: %d, %s", k.rank1_dir.c_str(), res, weftZeroLastError());
      printf("refused: %s\n", weftZeroLastError());
      FAIL_IF(weftZeroGetParams(z, after.data(), nullptr) != weftSuccess, "get");
      FAIL_IF(before != after || weftZeroStepCount(z) != 0, "a refused load changed the context");
      weftZeroDestroy(z);
    }
    weftCommDestroy(comm);
    return 0;
  });
  for (int r = 0; r < 2; r++) EXPECT_EQ(status[r], 0) << "rank " << r;
  sh("rm -rf " + root);
}

}  // namespace
