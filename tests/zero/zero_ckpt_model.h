// Helpers of the checkpoint suites (test_zero_ckpt.cc,
// test_zero_ckpt_ranks.cc, test_zero_ckpt_params.cc): the model they save
// and load (its layers, a context of it, AdamW steps), files read and
// written whole, and a version directory's checksums recomputed after an
// edit.
#ifndef WEFT_TEST_ZERO_CKPT_MODEL_H
#define WEFT_TEST_ZERO_CKPT_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "weft_zero.h"

namespace weft_test {

// Layers of odd sizes; the last is smaller than the rank count, so some
// ranks hold nothing of it.
inline const std::vector<size_t> kLayers = {1001, 37, 2};
inline constexpr int kHeader = 64;          // shard header bytes
inline constexpr int kPayloadCrcAt = 56;    // its payload CRC
inline constexpr int kHeaderCrcAt = 60;     // its own CRC, of the 60 bytes before

// CRC-32C bit by bit: the reference the library's table version must match.
inline uint32_t crc32c_ref(uint32_t crc, const void *buf, size_t n) {
  const unsigned char *p = static_cast<const unsigned char *>(buf);
  crc = ~crc;
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
  }
  return ~crc;
}

inline std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline void spit(const std::string &path, const std::string &data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << data;
}

inline int sh(const std::string &cmd) { return system(cmd.c_str()); }

inline std::string temp_dir(const char *tag) {
  char templ[256];
  snprintf(templ, sizeof templ, "/tmp/weft_ckpt_%s_XXXXXX", tag);
  const char *d = mkdtemp(templ);
  return d ? d : "";
}

// A context over kLayers (one parameter per layer) initialised from seed.
inline int make_ctx(const RankCtx &ctx, weftComm_t comm, int stage, int allow_non_finite,
                    uint64_t seed, weftZero_t *out) {
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

inline size_t psi() {
  size_t n = 0;
  for (size_t c : kLayers) n += c;
  return n;
}

// AdamW steps with seeded gradients (the same on every rank).
inline int train_steps(const RankCtx &ctx, weftZero_t z, uint64_t seed, int steps) {
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

inline int train_two_steps(const RankCtx &ctx, weftZero_t z, uint64_t seed) {
  return train_steps(ctx, z, seed, 2);
}

// A manifest line that format 4 added (the hyperparameters, the parameter
// count and the parameters) or format 5 (the client state), which formats 2
// and 3 lack.
inline bool format4_only(const std::string &line) {
  for (const char *key : {"lr ", "beta1 ", "beta2 ", "eps ", "momentum ", "weight_decay ",
                          "max_grad_norm ", "accum_steps ", "params ", "param ", "state "})
    if (line.rfind(key, 0) == 0) return true;
  return false;
}

// Recomputes every checksum of a version directory after a deliberate
// change, as a careless tool (or an attacker) would: shard payload and
// header CRCs, the manifest's shard lines, and its last line. edit may
// change the manifest's lines first.
inline void resign(const std::string &ver, int nranks,
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

}  // namespace weft_test

#endif
