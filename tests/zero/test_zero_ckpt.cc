// Checked checkpoints: CRC-32C against a bitwise reference; a checkpoint
// saved on 3 ranks (stage 1, two AdamW steps taken, so moments are not zero)
// is damaged in each way below, then loaded on 2 ranks at stage 2 and
// consolidated. Each damage is refused on every rank with a message that
// names it, and a refused load leaves the context's parameters as they were;
// the intact checkpoint loads bit for bit (ranks that fail or disagree, and
// what a save keeps: test_zero_ckpt_ranks.cc).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"
#include "zero_ckpt_model.h"
#include "zero_ranks.h"

extern "C" uint32_t zero_crc32c(uint32_t crc, const void *buf, size_t nbytes);
extern "C" uint32_t zero_crc32c_sw(uint32_t crc, const void *buf, size_t nbytes);

using namespace weft_test;

namespace {

// weftZeroShardOf's count, written out.
uint64_t shard_count(uint64_t count, uint64_t n, uint64_t r) {
  uint64_t s = (count + n - 1) / n, off = r * s;
  return off >= count ? 0 : (count - off < s ? count - off : s);
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

// A save into a folder whose parents are missing makes them (os.makedirs,
// as DeepSpeed's save does), and the checkpoint loads bit for bit.
TEST_F(ZeroCkptDamage, SaveMakesMissingFolders) {
  const std::string nested = *root_ + "/made/by/the/save";
  std::vector<float> params;
  save_run(nested, test_seed() + 2, &params);
  LoadOutcome r = load_on_two(nested);
  for (int q = 0; q < 2; q++) ASSERT_EQ(r.code[q], weftSuccess) << r.message[q];
  ASSERT_EQ(r.params.size(), params.size());
  EXPECT_EQ(memcmp(r.params.data(), params.data(), params.size() * sizeof(float)), 0);
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

// AdamW's second moments are never negative (the step takes their square
// root): one that is, with checksums that hold, is refused by a load, even
// one that allows non-finite values, which would otherwise step to NaN.
TEST_F(ZeroCkptDamage, NegativeSecondMomentRefused) {
  std::string s = slurp(shard(1));
  float neg = -1.0f;
  memcpy(&s[s.size() - 4], &neg, 4);  // the last layer's last second moment
  spit(shard(1), s);
  resign(ver_, 3);
  expect_refused("is -1 (never negative", false);
  LoadOutcome r = load_on_two(dir_, 1);
  for (int q = 0; q < 2; q++) {
    EXPECT_NE(r.code[q], weftSuccess) << "rank " << q;
    EXPECT_NE(r.message[q].find("second moment 0 of layer 2 is -1"), std::string::npos)
        << r.message[q];
  }
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
  // (layer 0's one parameter says as much, so that the sizes are what is
  // checked; a parameter line that does not is refused first)
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines)
      if (l == "layer 0 1001") l = "layer 0 11000000000000";
  });
  expect_refused("layer 0's parameters make 1001 elements, the layer 11000000000000");
  spit(ver_ + "/manifest", slurp(*root_ + "/pristine/step-2/manifest"));
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines) {
      if (l == "layer 0 1001") l = "layer 0 11000000000000";
      if (l == "param 0 0 1001 0") l = "param 0 0 11000000000000 0";
    }
  });
  expect_refused("its layers make");
  // and the shard sizes raised to match: the files' lengths refuse it
  spit(ver_ + "/manifest", slurp(*root_ + "/pristine/step-2/manifest"));
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines) {
      if (l == "layer 0 1001") l = "layer 0 11000000000000";
      if (l == "param 0 0 1001 0") l = "param 0 0 11000000000000 0";
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
    for (std::string &l : lines) {
      if (l == "layer 0 1001") l = "layer 0 18446744073709551615";
      if (l == "param 0 0 1001 0") l = "param 0 0 18446744073709551615 0";
    }
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

// Format 2 (without the loss_scaled line, nor format 4's hyperparameter and
// parameter lines, nor format 5's state line) still loads, bit for bit; a loss_scaled other than 0 or 1
// is refused.
TEST_F(ZeroCkptDamage, FormatTwoLoadsAndLossScaledIsChecked) {
  std::string text = slurp(ver_ + "/manifest");
  ASSERT_EQ(text.rfind("weft-zero-checkpoint 5\n", 0), 0u) << text.substr(0, 40);
  ASSERT_NE(text.find("\nloss_scaled 0\n"), std::string::npos);  // an fp32 run's
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    lines[0] = "weft-zero-checkpoint 2";
    for (size_t i = 0; i < lines.size(); i++)
      if (lines[i].rfind("loss_scaled ", 0) == 0 || format4_only(lines[i]))
        lines.erase(lines.begin() + (long)i--);
  });
  LoadOutcome r = load_on_two(dir_);
  for (int q = 0; q < 2; q++) ASSERT_EQ(r.code[q], weftSuccess) << r.message[q];
  ASSERT_EQ(r.params.size(), saved_->size());
  EXPECT_EQ(memcmp(r.params.data(), saved_->data(), r.params.size() * sizeof(float)), 0);
  spit(ver_ + "/manifest", text);
  resign(ver_, 3, [](std::vector<std::string> &lines) {
    for (std::string &l : lines)
      if (l == "loss_scaled 0") l = "loss_scaled 2";
  });
  expect_refused("loss_scaled 2 is not 0 or 1");
}

// fp16's dynamic loss scale across checkpoints: an fp16 run's goes on from
// where it was; a run that trained unscaled (bf16, fp32: the checkpoint's
// scale is 1) gives an fp16 context its configured scale, not 1.
TEST(ZeroCkptLossScale, FromAnUnscaledRunFp16StartsAtItsOwn) {
  std::string root = temp_dir("scale");
  ASSERT_FALSE(root.empty());
  std::string out = root + "/scales";
  auto status = run_ranks(2, [&](const RankCtx &ctx) {
    weftComm_t comm;
    if (int rc = init(ctx, &comm)) return rc;
    auto make = [&](weftDataType_t type, double scale, weftZero_t *z) {
      weftZeroConfig_t cfg;
      weftZeroConfigDefaults(&cfg);
      cfg.stage = 2;
      cfg.paramType = cfg.reduceType = type;
      cfg.lossScale = scale;
      if (weftZeroCreate(z, comm, &cfg) != weftSuccess) return -1;
      std::vector<float> init(kLayers[0], 0.25f);
      int id;
      if (weftZeroAddParam(*z, 0, init.size(), init.data(), &id) != weftSuccess) return -1;
      return weftZeroFinalize(*z) == weftSuccess ? 0 : -1;
    };
    std::string got;
    for (weftDataType_t saver : {weftBfloat16, weftFloat32, weftFloat16}) {
      const std::string dir = root + "/from" + std::to_string((int)saver);
      weftZero_t a, b;
      if (make(saver, 512, &a) != 0) return rank_fail(ctx, "make: %s", weftZeroLastError());
      if (weftZeroSave(a, dir.c_str(), nullptr) != weftSuccess)
        return rank_fail(ctx, "save: %s", weftZeroLastError());
      if (make(weftFloat16, 4096, &b) != 0) return rank_fail(ctx, "make: %s", weftZeroLastError());
      if (weftZeroLoad(b, dir.c_str(), nullptr) != weftSuccess)
        return rank_fail(ctx, "load: %s", weftZeroLastError());
      got += std::to_string((long)weftZeroLossScale(b)) + " ";
      weftZeroDestroy(a);
      weftZeroDestroy(b);
    }
    if (ctx.rank == 0) spit(out, got);
    weftCommDestroy(comm);
    return 0;
  });
  for (int st : status) ASSERT_EQ(st, 0);
  // bf16 and fp32 runs: the loading context's 4096; an fp16 run: its 512
  EXPECT_EQ(slurp(out), "4096 4096 512 ");
  sh("rm -rf " + root);
}

TEST_F(ZeroCkptDamage, MissingShard) {
  ASSERT_EQ(unlink(shard(2).c_str()), 0);
  expect_refused("cannot open");
}

}  // namespace
