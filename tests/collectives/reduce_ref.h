// The reduction tests' references: the test seed, float bit casts, and the
// low-precision formats (fp16, bf16, fp8 e4m3 and e5m2) decoded with ldexp and
// encoded by a nearest-even search among the representable values.
#ifndef WEFT_TESTS_REDUCE_REF_H
#define WEFT_TESTS_REDUCE_REF_H

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/reduce/reduce_ops.h"

// one seed for the whole binary (an inline function's static is shared)
inline uint64_t TestSeed() {
  static uint64_t seed = [] {
    const char *env = std::getenv("WEFT_TEST_SEED");
    uint64_t s = env ? std::strtoull(env, nullptr, 0) : 20240601u;
    std::printf("reduce_ops seed = %llu (set WEFT_TEST_SEED to repeat)\n",
                (unsigned long long)s);
    return s;
  }();
  return seed;
}

namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// --- low-precision formats and their reference -----------------------------

struct LowpFormat {
  const char *name;
  int nbits;
  int exp_bits;
  int man_bits;
  int bias;
  bool ieee_specials;  // top exponent holds inf/NaN (fp16, bf16, e5m2)
  bool saturates;      // finite overflow and inf encode to +-max (fp8)
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
};

const LowpFormat kF16 = {"f16", 16, 5, 10, 15, true, false,
                         [](uint32_t p) { return weft_f16_to_f32((uint16_t)p); },
                         [](float f) { return (uint32_t)weft_f32_to_f16(f); }};
const LowpFormat kBf16 = {"bf16", 16, 8, 7, 127, true, false,
                          [](uint32_t p) { return weft_bf16_to_f32((uint16_t)p); },
                          [](float f) { return (uint32_t)weft_f32_to_bf16(f); }};
const LowpFormat kE4m3 = {"e4m3", 8, 4, 3, 7, false, true,
                          [](uint32_t p) { return weft_e4m3_to_f32((uint8_t)p); },
                          [](float f) { return (uint32_t)weft_f32_to_e4m3(f); }};
const LowpFormat kE5m2 = {"e5m2", 8, 5, 2, 15, true, true,
                          [](uint32_t p) { return weft_e5m2_to_f32((uint8_t)p); },
                          [](float f) { return (uint32_t)weft_f32_to_e5m2(f); }};
const LowpFormat *const kFormats[] = {&kF16, &kBf16, &kE4m3, &kE5m2};

uint32_t SignBit(const LowpFormat &f) { return 1u << (f.nbits - 1); }

double RefDecode(const LowpFormat &f, uint32_t p) {
  uint32_t mag = p & (SignBit(f) - 1);
  uint32_t e = mag >> f.man_bits;
  uint32_t m = mag & ((1u << f.man_bits) - 1);
  uint32_t e_top = (1u << f.exp_bits) - 1;
  double v;
  if (f.ieee_specials && e == e_top)
    v = m ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (!f.ieee_specials && mag == SignBit(f) - 1)
    v = std::numeric_limits<double>::quiet_NaN();
  else if (e == 0)
    v = std::ldexp((double)m, 1 - f.bias - f.man_bits);
  else
    v = std::ldexp((double)(m + (1u << f.man_bits)), (int)e - f.bias - f.man_bits);
  return (p & SignBit(f)) ? -v : v;
}

bool RefIsNan(const LowpFormat &f, uint32_t p) { return std::isnan(RefDecode(f, p)); }

// values of the non-negative finite patterns 0..max, in increasing order
const std::vector<double> &FiniteTable(const LowpFormat &f) {
  static std::vector<double> tables[4];
  size_t idx = &f == &kF16 ? 0 : &f == &kBf16 ? 1 : &f == &kE4m3 ? 2 : 3;
  std::vector<double> &t = tables[idx];
  if (t.empty()) {
    for (uint32_t p = 0; p < SignBit(f); p++) {
      double v = RefDecode(f, p);
      if (!std::isfinite(v)) break;
      t.push_back(v);
    }
  }
  return t;
}

// nearest-even rounding by search among the representable values; for IEEE
// formats the value 2^(emax+1) stands for infinity (an even pattern)
uint32_t RefEncode(const LowpFormat &f, double x) {
  const std::vector<double> &t = FiniteTable(f);
  uint32_t sign = std::signbit(x) ? SignBit(f) : 0;
  double a = std::fabs(x);
  uint32_t max_p = (uint32_t)t.size() - 1;
  double lo, hi;
  uint32_t lo_p;
  if (a > t.back()) {
    if (f.saturates) return sign | max_p;
    lo = t.back();
    hi = std::ldexp(1.0, (1 << f.exp_bits) - 1 - f.bias);
    lo_p = max_p;
  } else {
    size_t i = std::upper_bound(t.begin(), t.end(), a) - t.begin() - 1;
    if (t[i] == a) return sign | (uint32_t)i;
    lo = t[i];
    hi = t[i + 1];
    lo_p = (uint32_t)i;
  }
  double mid = (lo + hi) / 2;  // exact: few significant bits
  uint32_t p;
  if (a < mid)
    p = lo_p;
  else if (a > mid)
    p = lo_p + 1;
  else
    p = (lo_p & 1) ? lo_p + 1 : lo_p;
  return sign | p;
}

}  // namespace

#endif
