// Low-precision conversions (fp16, bf16, fp8 e4m3 and e5m2) against an
// ldexp-based reference: every pattern decoded and round-tripped, ties to even
// at every midpoint, overflow, subnormals, NaN, and random floats. Random data
// comes from one seed, printed once; WEFT_TEST_SEED repeats a run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "collectives/reduce/reduce_ops.h"
#include "reduce_ref.h"

namespace {

// the pattern expected from encoding x (NaN handled by the caller)
void ExpectEncode(const LowpFormat &f, float x) {
  uint32_t got = f.encode(x);
  if (std::isnan(x)) {
    EXPECT_TRUE(RefIsNan(f, got)) << f.name << " NaN encoded as 0x" << std::hex << got;
    return;
  }
  uint32_t want = RefEncode(f, x);
  EXPECT_EQ(got, want) << f.name << " encode(" << std::hexfloat << x << ") got 0x" << std::hex
                       << got << " want 0x" << want;
}

// --- conversions -------------------------------------------------------------

TEST(ReduceOpsConvert, DecodeEveryPattern) {
  for (const LowpFormat *f : kFormats) {
    size_t nan_count = 0;
    for (uint32_t p = 0; p < (1u << f->nbits); p++) {
      double want = RefDecode(*f, p);
      float got = f->decode(p);
      if (std::isnan(want)) {
        nan_count++;
        EXPECT_TRUE(std::isnan(got)) << f->name << " 0x" << std::hex << p;
        continue;
      }
      ASSERT_EQ((double)got, want) << f->name << " 0x" << std::hex << p;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << f->name << " 0x" << std::hex << p;
    }
    // sanity of the reference itself
    size_t want_nans = f == &kE4m3 ? 2 : 2 * ((1u << f->man_bits) - 1);
    EXPECT_EQ(nan_count, want_nans) << f->name;
  }
  EXPECT_EQ(FiniteTable(kF16).back(), 65504.0);
  EXPECT_EQ(FiniteTable(kE4m3).back(), 448.0);
  EXPECT_EQ(FiniteTable(kE5m2).back(), 57344.0);
  EXPECT_EQ(FiniteTable(kBf16).back(), (double)FloatFromBits(0x7f7f0000u));
}

TEST(ReduceOpsConvert, RoundTripEveryPattern) {
  for (const LowpFormat *f : kFormats) {
    for (uint32_t p = 0; p < (1u << f->nbits); p++) {
      double v = RefDecode(*f, p);
      if (std::isnan(v)) continue;
      uint32_t got = f->encode(f->decode(p));
      if (std::isinf(v) && f->saturates) {
        // e5m2's infinities saturate on the way back
        EXPECT_EQ(got, (p & SignBit(*f)) | 0x7bu) << f->name << " 0x" << std::hex << p;
        continue;
      }
      ASSERT_EQ(got, p) << f->name << " 0x" << std::hex << p;
    }
  }
}

// every midpoint between neighbours, and the floats just below and above it
TEST(ReduceOpsConvert, TiesToEvenAtEveryMidpoint) {
  for (const LowpFormat *f : kFormats) {
    const std::vector<double> &t = FiniteTable(*f);
    size_t n_mid = f->saturates ? t.size() - 1 : t.size();
    for (size_t i = 0; i < n_mid; i++) {
      double lo = t[i];
      double hi = i + 1 < t.size() ? t[i + 1]
                                   : std::ldexp(1.0, (1 << f->exp_bits) - 1 - f->bias);
      double mid = (lo + hi) / 2;
      float mid_f = (float)mid;
      ASSERT_EQ((double)mid_f, mid) << f->name << " midpoint not a float";
      uint32_t even = (i & 1) ? (uint32_t)i + 1 : (uint32_t)i;
      float below = std::nextafter(mid_f, 0.0f);
      float above = std::nextafter(mid_f, INFINITY);
      for (uint32_t sign : {0u, SignBit(*f)}) {
        float s = sign ? -1.0f : 1.0f;
        ASSERT_EQ(f->encode(s * mid_f), sign | even) << f->name << " tie at " << mid;
        ASSERT_EQ(f->encode(s * below), sign | (uint32_t)i) << f->name << " below " << mid;
        ASSERT_EQ(f->encode(s * above), sign | ((uint32_t)i + 1)) << f->name << " above " << mid;
      }
    }
  }
}

TEST(ReduceOpsConvert, OverflowAndSaturation) {
  const float inf = INFINITY;
  const float flt_max = std::numeric_limits<float>::max();
  // fp16: IEEE overflow to infinity from max + half an ulp (65520) up
  EXPECT_EQ(weft_f32_to_f16(65504.0f), 0x7bffu);
  EXPECT_EQ(weft_f32_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bffu);
  EXPECT_EQ(weft_f32_to_f16(65520.0f), 0x7c00u);
  EXPECT_EQ(weft_f32_to_f16(1e10f), 0x7c00u);
  EXPECT_EQ(weft_f32_to_f16(flt_max), 0x7c00u);
  EXPECT_EQ(weft_f32_to_f16(inf), 0x7c00u);
  EXPECT_EQ(weft_f32_to_f16(-inf), 0xfc00u);
  EXPECT_EQ(weft_f32_to_f16(-65520.0f), 0xfc00u);
  // bf16: FLT_MAX is past the last tie, so it rounds to infinity
  EXPECT_EQ(weft_f32_to_bf16(FloatFromBits(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(weft_f32_to_bf16(FloatFromBits(0x7f7f8000u)), 0x7f80u);
  EXPECT_EQ(weft_f32_to_bf16(flt_max), 0x7f80u);
  EXPECT_EQ(weft_f32_to_bf16(inf), 0x7f80u);
  EXPECT_EQ(weft_f32_to_bf16(-inf), 0xff80u);
  // e4m3: everything past 448 saturates, infinities too
  for (float x : {448.0f, 449.0f, 464.0f, 479.0f, 480.0f, 1e6f, flt_max, inf}) {
    EXPECT_EQ(weft_f32_to_e4m3(x), 0x7eu) << x;
    EXPECT_EQ(weft_f32_to_e4m3(-x), 0xfeu) << x;
  }
  // e5m2: past 57344 saturates, infinities too; decode still knows infinity
  for (float x : {57344.0f, 61440.0f, 65536.0f, 1e9f, flt_max, inf}) {
    EXPECT_EQ(weft_f32_to_e5m2(x), 0x7bu) << x;
    EXPECT_EQ(weft_f32_to_e5m2(-x), 0xfbu) << x;
  }
  EXPECT_EQ(weft_e5m2_to_f32(0x7c), inf);
  EXPECT_EQ(weft_e5m2_to_f32(0xfc), -inf);
  EXPECT_EQ(weft_f16_to_f32(0x7c00), inf);
  EXPECT_EQ(weft_bf16_to_f32(0xff80), -inf);
}

TEST(ReduceOpsConvert, Subnormals) {
  // fp16: smallest subnormal 2^-24
  EXPECT_EQ(weft_f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(weft_f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(weft_f16_to_f32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(weft_f32_to_f16(std::ldexp(1.0f, -24)), 0x0001u);
  EXPECT_EQ(weft_f32_to_f16(std::ldexp(1.0f, -25)), 0x0000u);  // tie to even 0
  EXPECT_EQ(weft_f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(weft_f32_to_f16(std::ldexp(3.0f, -25)), 0x0002u);  // tie to even 2
  EXPECT_EQ(weft_f32_to_f16(-std::ldexp(1.0f, -26)), 0x8000u);
  EXPECT_EQ(weft_f32_to_f16(std::ldexp(2047.0f, -25)), 0x0400u);  // rounds up to min normal
  EXPECT_EQ(weft_f32_to_f16(FloatFromBits(1)), 0x0000u);  // float subnormal
  EXPECT_EQ(weft_f32_to_f16(-FloatFromBits(1)), 0x8000u);
  // bf16: its subnormals are the float subnormals' top bits
  EXPECT_EQ(weft_bf16_to_f32(0x0001), FloatFromBits(0x00010000u));
  EXPECT_EQ(weft_f32_to_bf16(FloatFromBits(0x00010000u)), 0x0001u);
  EXPECT_EQ(weft_f32_to_bf16(FloatFromBits(0x00008000u)), 0x0000u);  // tie to even
  EXPECT_EQ(weft_f32_to_bf16(FloatFromBits(0x00018000u)), 0x0002u);  // tie to even
  EXPECT_EQ(weft_f32_to_bf16(FloatFromBits(0x00008001u)), 0x0001u);
  EXPECT_EQ(weft_f32_to_bf16(FloatFromBits(0x007fffffu)), 0x0080u);  // to min normal
  // e4m3: smallest subnormal 2^-9, largest 7 * 2^-9
  EXPECT_EQ(weft_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(weft_e4m3_to_f32(0x07), std::ldexp(7.0f, -9));
  EXPECT_EQ(weft_f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00u);
  EXPECT_EQ(weft_f32_to_e4m3(std::ldexp(1.5f, -10)), 0x01u);
  EXPECT_EQ(weft_f32_to_e4m3(std::ldexp(15.0f, -10)), 0x08u);  // tie: 7 odd -> 8
  // e5m2: smallest subnormal 2^-16
  EXPECT_EQ(weft_e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(weft_e5m2_to_f32(0x83), -std::ldexp(3.0f, -16));
  EXPECT_EQ(weft_f32_to_e5m2(std::ldexp(1.0f, -17)), 0x00u);
  EXPECT_EQ(weft_f32_to_e5m2(std::ldexp(5.0f, -17)), 0x02u);  // tie to even
  EXPECT_EQ(weft_f32_to_e5m2(std::ldexp(7.0f, -17)), 0x04u);  // tie: 3 odd -> 4
}

TEST(ReduceOpsConvert, NanStaysNan) {
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::signaling_NaN(),
                        FloatFromBits(0x7f800001u),  // payload only in the low bits
                        FloatFromBits(0xffffffffu)};
  for (const LowpFormat *f : kFormats) {
    for (float x : nans) {
      uint32_t p = f->encode(x);
      EXPECT_TRUE(RefIsNan(*f, p)) << f->name << " 0x" << std::hex << FloatBits(x) << " -> 0x"
                                   << p;
      EXPECT_TRUE(std::isnan(f->decode(p))) << f->name;
    }
  }
  EXPECT_TRUE(std::isnan(weft_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(weft_e4m3_to_f32(0xff)));
  EXPECT_EQ(weft_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(weft_e4m3_to_f32(0x78), 256.0f);  // exponent 15 is finite in e4m3
}

TEST(ReduceOpsConvert, RandomFloatsMatchReference) {
  std::mt19937_64 rng(TestSeed());
  std::uniform_real_distribution<float> frac(1.0f, 2.0f);
  for (const LowpFormat *f : kFormats) {
    // any float bit pattern
    for (int i = 0; i < 300000; i++) ExpectEncode(*f, FloatFromBits((uint32_t)rng()));
    // values in and around the format's range
    int e_lo = 1 - f->bias - f->man_bits - 3;
    int e_hi = (1 << f->exp_bits) - f->bias + 1;
    std::uniform_int_distribution<int> exp(e_lo, e_hi);
    for (int i = 0; i < 300000; i++) {
      float x = std::ldexp(frac(rng), exp(rng));
      ExpectEncode(*f, (rng() & 1) ? -x : x);
    }
    if (HasFailure()) return;
  }
}

}  // namespace
