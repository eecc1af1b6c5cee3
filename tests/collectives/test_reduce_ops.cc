// Reduction arithmetic: every (datatype, op) host loop against a scalar
// reference in double or exact integer arithmetic, max and min on NaNs and
// signed zeros, and the streaming copy and reduction loops. Random data comes
// from one seed, printed once; WEFT_TEST_SEED repeats a run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives/reduce/reduce_ops.h"
#include "collectives/reduce/reduce_host.h"
#include "reduce_ref.h"

namespace {

// --- host loops --------------------------------------------------------------

const char *const kTypeTags[weftNumTypes] = {"i8",  "u8",  "i32", "u32",  "i64",  "u64",
                                             "f16", "f32", "f64", "bf16", "e4m3", "e5m2"};
const char *const kOpNames[weftNumOps] = {"sum", "prod", "max", "min", "avg"};

template <typename T>
T RefInt(T a, T b, weftRedOp_t op, int divisor) {
  using Wide = typename std::conditional<std::is_signed<T>::value, __int128,
                                         unsigned __int128>::type;
  using U = typename std::make_unsigned<T>::type;
  Wide exact;
  T r;
  switch (op) {
    case weftSum:
    case weftAvg:
      exact = (Wide)a + (Wide)b;
      r = (T)(U)exact;  // modulo 2^bits
      break;
    case weftProd:
      exact = (Wide)a * (Wide)b;
      r = (T)(U)exact;
      break;
    case weftMax: r = std::max(a, b); break;
    default: r = std::min(a, b); break;
  }
  if (divisor > 1) r = (T)((Wide)r / (Wide)divisor);  // truncates toward zero
  return r;
}

// float max/min: NaN wins, then +0 > -0
template <typename F>
F RefMaxMin(F a, F b, bool is_max) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  if (a == b) {
    bool neg = is_max ? (std::signbit(a) && std::signbit(b)) : (std::signbit(a) || std::signbit(b));
    return a == 0 ? (neg ? (F)-0.0 : (F)0.0) : a;
  }
  return is_max ? std::max(a, b) : std::min(a, b);
}

// float32 through double: the double result is exact or double rounding is
// innocuous (53 >= 2 * 24 + 2)
float RefF32(float a, float b, weftRedOp_t op, int divisor) {
  float r;
  switch (op) {
    case weftSum:
    case weftAvg: r = (float)((double)a + (double)b); break;
    case weftProd: r = (float)((double)a * (double)b); break;
    default: r = RefMaxMin(a, b, op == weftMax); break;
  }
  if (divisor > 1) r = (float)((double)r / divisor);
  return r;
}

double RefF64(double a, double b, weftRedOp_t op, int divisor) {
  double r;
  switch (op) {
    case weftSum:
    case weftAvg: r = a + b; break;
    case weftProd: r = a * b; break;
    default: r = RefMaxMin(a, b, op == weftMax); break;
  }
  if (divisor > 1) r = r / divisor;
  return r;
}

// low precision: exact in double, then one nearest-even rounding; equal to
// computing in float first because float has 2p+2 bits of these formats
uint32_t RefLowp(const LowpFormat &f, uint32_t a, uint32_t b, weftRedOp_t op, int divisor,
                 bool *nan_out) {
  double x = RefDecode(f, a), y = RefDecode(f, b), r;
  switch (op) {
    case weftSum:
    case weftAvg: r = x + y; break;
    case weftProd: r = x * y; break;
    default: r = RefMaxMin(x, y, op == weftMax); break;
  }
  uint32_t p = std::isnan(r) ? 0 : RefEncode(f, r);
  // max and min pick an input, its bits as they were (e5m2's infinities
  // too, which encoding a value would saturate)
  if (!std::isnan(r) && (op == weftMax || op == weftMin))
    p = r == x && std::signbit(r) == std::signbit(x) ? a : b;
  if (!std::isnan(r) && divisor > 1) {
    r = RefDecode(f, p) / divisor;
    p = RefEncode(f, r);
  }
  *nan_out = std::isnan(r);
  return p;
}

size_t TypeNbytes(weftDataType_t t) {
  static const size_t nbytes[weftNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return nbytes[t];
}

template <typename T>
T Load(const unsigned char *p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// checks got[i] against the reference for inputs a[i], b[i]
void ExpectElement(weftDataType_t t, weftRedOp_t op, int divisor, const unsigned char *a,
                   const unsigned char *b, const unsigned char *got, size_t i,
                   const std::string &where) {
  auto lowp = [&](const LowpFormat &f, uint32_t pa, uint32_t pb, uint32_t pg) {
    bool nan;
    uint32_t want = RefLowp(f, pa, pb, op, divisor, &nan);
    if (nan)
      EXPECT_TRUE(RefIsNan(f, pg)) << where << " i=" << i << " got 0x" << std::hex << pg;
    else
      EXPECT_EQ(pg, want) << where << " i=" << i << std::hex << " a=0x" << pa << " b=0x" << pb;
  };
  switch (t) {
#define INT_CASE(dt, T)                                                                    \
  case dt:                                                                                 \
    EXPECT_EQ(Load<T>(got, i), RefInt<T>(Load<T>(a, i), Load<T>(b, i), op, divisor))       \
        << where << " i=" << i << " a=" << +Load<T>(a, i) << " b=" << +Load<T>(b, i);      \
    break;
    INT_CASE(weftInt8, int8_t)
    INT_CASE(weftUint8, uint8_t)
    INT_CASE(weftInt32, int32_t)
    INT_CASE(weftUint32, uint32_t)
    INT_CASE(weftInt64, int64_t)
    INT_CASE(weftUint64, uint64_t)
#undef INT_CASE
    case weftFloat32: {
      float want = RefF32(Load<float>(a, i), Load<float>(b, i), op, divisor);
      float g = Load<float>(got, i);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(g)) << where << " i=" << i;
      else
        EXPECT_EQ(FloatBits(g), FloatBits(want)) << where << " i=" << i << " got " << g
                                                 << " want " << want;
      break;
    }
    case weftFloat64: {
      double want = RefF64(Load<double>(a, i), Load<double>(b, i), op, divisor);
      double g = Load<double>(got, i);
      uint64_t gb, wb;
      std::memcpy(&gb, &g, 8);
      std::memcpy(&wb, &want, 8);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(g)) << where << " i=" << i;
      else
        EXPECT_EQ(gb, wb) << where << " i=" << i << " got " << g << " want " << want;
      break;
    }
    case weftFloat16:
      lowp(kF16, Load<uint16_t>(a, i), Load<uint16_t>(b, i), Load<uint16_t>(got, i));
      break;
    case weftBfloat16:
      lowp(kBf16, Load<uint16_t>(a, i), Load<uint16_t>(b, i), Load<uint16_t>(got, i));
      break;
    case weftFloat8e4m3:
      lowp(kE4m3, Load<uint8_t>(a, i), Load<uint8_t>(b, i), Load<uint8_t>(got, i));
      break;
    default:
      lowp(kE5m2, Load<uint8_t>(a, i), Load<uint8_t>(b, i), Load<uint8_t>(got, i));
      break;
  }
}

// random elements: integers and low-precision types take any bit pattern;
// floats mix any pattern with moderate values and signed zeros
void FillRandom(weftDataType_t t, unsigned char *p, size_t count, std::mt19937_64 &rng) {
  std::uniform_real_distribution<double> val(-4.0, 4.0);
  for (size_t i = 0; i < count; i++) {
    uint64_t bits = rng();
    unsigned kind = (unsigned)(rng() % 16);
    if (t == weftFloat32) {
      float f = kind < 6 ? FloatFromBits((uint32_t)bits) : kind == 6 ? 0.0f : kind == 7 ? -0.0f
                                                                     : (float)val(rng);
      std::memcpy(p + i * 4, &f, 4);
    } else if (t == weftFloat64) {
      double d;
      if (kind < 6)
        std::memcpy(&d, &bits, 8);
      else
        d = kind == 6 ? 0.0 : kind == 7 ? -0.0 : val(rng);
      std::memcpy(p + i * 8, &d, 8);
    } else if ((t == weftFloat16 || t == weftBfloat16) && kind >= 12) {
      uint16_t z = kind == 12 ? 0x0000 : kind == 13 ? 0x8000 : (uint16_t)(bits & 0x8fff);
      std::memcpy(p + i * 2, &z, 2);  // zeros and small magnitudes
    } else {
      std::memcpy(p + i * TypeNbytes(t), &bits, TypeNbytes(t));
    }
  }
}

struct LoopParam {
  weftDataType_t datatype;
  weftRedOp_t op;
};

void PrintTo(const LoopParam &p, std::ostream *os) {
  *os << kTypeTags[p.datatype] << "_" << kOpNames[p.op];
}

std::string LoopParamName(const testing::TestParamInfo<LoopParam> &info) {
  return std::string(kTypeTags[info.param.datatype]) + "_" + kOpNames[info.param.op];
}

std::vector<LoopParam> AllLoopParams() {
  std::vector<LoopParam> params;
  for (int t = 0; t < weftNumTypes; t++)
    for (int op = 0; op < weftNumOps; op++)
      params.push_back({(weftDataType_t)t, (weftRedOp_t)op});
  return params;
}

// how the four pointers alias
enum class Layout { kOutOfPlace, kDstIsA, kDstIsB, kAIsB, kAllSame, kDst1, kDst1IsA, kDst1IsDst0 };
const Layout kLayouts[] = {Layout::kOutOfPlace, Layout::kDstIsA, Layout::kDstIsB,
                           Layout::kAIsB,       Layout::kAllSame, Layout::kDst1,
                           Layout::kDst1IsA,    Layout::kDst1IsDst0};
const char *const kLayoutNames[] = {"out-of-place", "dst0==a", "dst0==b",   "a==b",
                                    "all same",     "dst1",    "dst1==a", "dst1==dst0"};

class ReduceHostLoop : public testing::TestWithParam<LoopParam> {};

TEST_P(ReduceHostLoop, MatchesReference) {
  const LoopParam prm = GetParam();
  weft_reduce_fn fn = reduce_host_fn(prm.datatype, prm.op);
  ASSERT_NE(fn, nullptr);
  if (prm.op == weftAvg) {
    EXPECT_EQ(fn, reduce_host_fn(prm.datatype, weftSum));
  }
  const size_t esize = TypeNbytes(prm.datatype);
  std::mt19937_64 rng(TestSeed() * 131 + (uint64_t)prm.datatype * 7 + (uint64_t)prm.op);

  std::vector<int> divisors = {1};
  if (prm.op == weftAvg) divisors = {2, 3, 7};
  else divisors.push_back(5);  // the final-step division works for any op
  // 20011 elements span several 8 KiB blocks of the dst1 path for every type
  for (size_t count : {(size_t)0, (size_t)1, (size_t)7, (size_t)1001, (size_t)20011}) {
    for (Layout layout : kLayouts) {
      for (int divisor : divisors) {
        // one element of offset on odd counts, so vector loops start unaligned
        size_t off = (count & 1) * esize;
        size_t nbytes = count * esize + off;
        std::vector<unsigned char> a(nbytes + 1), b(nbytes + 1), d0(nbytes + 1), d1(nbytes + 1);
        FillRandom(prm.datatype, a.data() + off, count, rng);
        FillRandom(prm.datatype, b.data() + off, count, rng);
        FillRandom(prm.datatype, d0.data() + off, count, rng);
        const std::vector<unsigned char> a_in = a, b_in = b;

        unsigned char *pa = a.data() + off, *pb = b.data() + off;
        unsigned char *p0 = d0.data() + off, *p1 = nullptr;
        switch (layout) {
          case Layout::kOutOfPlace: break;
          case Layout::kDstIsA: p0 = pa; break;
          case Layout::kDstIsB: p0 = pb; break;
          case Layout::kAIsB: pb = pa; break;
          case Layout::kAllSame: pb = pa; p0 = pa; break;
          case Layout::kDst1: p1 = d1.data() + off; break;
          case Layout::kDst1IsA: p1 = pa; break;
          case Layout::kDst1IsDst0: p1 = p0; break;
        }
        const unsigned char *ref_b = layout == Layout::kAIsB || layout == Layout::kAllSame
                                         ? a_in.data() + off
                                         : b_in.data() + off;
        fn(p0, p1, pa, pb, count, divisor);

        std::string where = std::string(kTypeTags[prm.datatype]) + "_" + kOpNames[prm.op] +
                            " count=" + std::to_string(count) + " " +
                            kLayoutNames[(int)layout] + " divisor=" + std::to_string(divisor);
        for (size_t i = 0; i < count; i++) {
          ExpectElement(prm.datatype, prm.op, divisor, a_in.data() + off, ref_b, p0, i, where);
          if (HasFailure()) return;
        }
        if (p1) {
          ASSERT_EQ(std::memcmp(p0, p1, count * esize), 0) << where << " dst1 differs";
        }
        // nothing outside [0, count) written
        EXPECT_EQ(d0.back(), 0) << where;
        if (layout == Layout::kDst1) {
          EXPECT_EQ(d1.back(), 0) << where;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesOps, ReduceHostLoop, testing::ValuesIn(AllLoopParams()),
                         LoopParamName);

TEST(ReduceHost, InvalidArguments) {
  EXPECT_EQ(reduce_host_fn((weftDataType_t)weftNumTypes, weftSum), nullptr);
  EXPECT_EQ(reduce_host_fn((weftDataType_t)-1, weftSum), nullptr);
  EXPECT_EQ(reduce_host_fn(weftFloat32, (weftRedOp_t)weftNumOps), nullptr);
  EXPECT_EQ(reduce_host_fn(weftFloat32, (weftRedOp_t)-1), nullptr);
  for (int t = 0; t < weftNumTypes; t++)
    for (int op = 0; op < weftNumOps; op++)
      EXPECT_NE(reduce_host_fn((weftDataType_t)t, (weftRedOp_t)op), nullptr) << t << " " << op;
  unsigned char buf[4] = {1, 2, 3, 4};
  reduce_host_divide((weftDataType_t)weftNumTypes, buf, buf, 4, 2);  // ignored
  EXPECT_EQ(buf[3], 4);
}

// reduce_host_divide against the reference's final step, every type
TEST(ReduceHost, DivideMatchesReference) {
  std::mt19937_64 rng(TestSeed() + 99);
  for (int t = 0; t < weftNumTypes; t++) {
    weftDataType_t dt = (weftDataType_t)t;
    size_t esize = TypeNbytes(dt);
    for (size_t count : {(size_t)0, (size_t)1, (size_t)7, (size_t)1003}) {
      for (int divisor : {1, 2, 3, 7, 16}) {
        for (bool in_place : {false, true}) {
          std::vector<unsigned char> src(count * esize + 1), dst(count * esize + 1);
          FillRandom(dt, src.data(), count, rng);
          const std::vector<unsigned char> src_in = src;
          // integers and floats: the reference of (x + 0) / d
          std::vector<unsigned char> zero(count * esize + 1, 0);
          unsigned char *out = in_place ? src.data() : dst.data();
          reduce_host_divide(dt, out, src.data(), count, divisor);
          std::string where = std::string("divide ") + kTypeTags[t] +
                              " count=" + std::to_string(count) +
                              " divisor=" + std::to_string(divisor) +
                              (in_place ? " in-place" : "");
          for (size_t i = 0; i < count; i++) {
            bool x_is_neg_zero = false;
            if (dt == weftFloat32) x_is_neg_zero = FloatBits(Load<float>(src_in.data(), i)) == 0x80000000u;
            if (dt == weftFloat64) x_is_neg_zero = std::signbit(Load<double>(src_in.data(), i)) && Load<double>(src_in.data(), i) == 0;
            if (x_is_neg_zero) {
              // -0 + 0 = +0 would spoil the sum-based reference; -0 / d = -0
              EXPECT_TRUE(std::signbit(dt == weftFloat32 ? (double)Load<float>(out, i)
                                                         : Load<double>(out, i)))
                  << where;
              continue;
            }
            if (dt >= weftFloat16 && dt != weftFloat32 && dt != weftFloat64) {
              // low precision: compare with the reference division directly
              const LowpFormat &f = dt == weftFloat16 ? kF16 : dt == weftBfloat16 ? kBf16
                                    : dt == weftFloat8e4m3 ? kE4m3 : kE5m2;
              uint32_t x = esize == 2 ? Load<uint16_t>(src_in.data(), i) : Load<uint8_t>(src_in.data(), i);
              uint32_t g = esize == 2 ? Load<uint16_t>(out, i) : Load<uint8_t>(out, i);
              double q = RefDecode(f, x) / (divisor > 1 ? divisor : 1);
              if (std::isnan(q)) {
                EXPECT_TRUE(RefIsNan(f, g)) << where;
              } else if (divisor <= 1) {
                EXPECT_EQ(g, x) << where;  // a plain copy
              } else {
                EXPECT_EQ(g, RefEncode(f, q)) << where << std::hex << " x=0x" << x;
              }
              continue;
            }
            ExpectElement(dt, weftAvg, divisor, src_in.data(), zero.data(), out, i, where);
          }
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST(ReduceHost, AvgKnownValues) {
  // integers: truncating division of the wrapped sum, signed as signed
  int8_t a8[] = {100, -7, -128, 3}, b8[] = {100, 0, -1, -4}, o8[4];
  reduce_host_fn(weftInt8, weftAvg)(o8, nullptr, a8, b8, 4, 2);
  EXPECT_EQ(o8[0], -28);  // 200 wraps to -56
  EXPECT_EQ(o8[1], -3);   // toward zero, not -4
  EXPECT_EQ(o8[2], 63);   // -129 wraps to 127
  EXPECT_EQ(o8[3], 0);
  uint8_t ua[] = {200, 7}, ub[] = {100, 0}, uo[2];
  reduce_host_fn(weftUint8, weftAvg)(uo, nullptr, ua, ub, 2, 2);
  EXPECT_EQ(uo[0], 22);  // 300 wraps to 44
  EXPECT_EQ(uo[1], 3);
  int32_t a32[] = {-9, INT32_MAX, -1}, b32[] = {0, 1, 0}, o32[3];
  reduce_host_fn(weftInt32, weftAvg)(o32, nullptr, a32, b32, 3, 4);
  EXPECT_EQ(o32[0], -2);
  EXPECT_EQ(o32[1], INT32_MIN / 4);
  EXPECT_EQ(o32[2], 0);
  int64_t a64[] = {INT64_MIN, -10}, b64[] = {0, -1}, o64[2];
  reduce_host_fn(weftInt64, weftAvg)(o64, nullptr, a64, b64, 2, 3);
  EXPECT_EQ(o64[0], INT64_MIN / 3);
  EXPECT_EQ(o64[1], -3);
  uint64_t au[] = {UINT64_MAX}, bu[] = {2}, ou[1];
  reduce_host_fn(weftUint64, weftAvg)(ou, nullptr, au, bu, 1, 3);
  EXPECT_EQ(ou[0], 0u);  // wraps to 1
  int32_t d32[] = {-7, 7, -1};
  reduce_host_divide(weftInt32, d32, d32, 3, 2);
  EXPECT_EQ(d32[0], -3);
  EXPECT_EQ(d32[1], 3);
  EXPECT_EQ(d32[2], 0);

  // floats
  float fa[] = {1.0f, -3.0f}, fb[] = {2.0f, 0.0f}, fo[2];
  reduce_host_fn(weftFloat32, weftAvg)(fo, nullptr, fa, fb, 2, 2);
  EXPECT_EQ(fo[0], 1.5f);
  EXPECT_EQ(fo[1], -1.5f);
  double da[] = {1.0}, db[] = {0.0}, dout[1];
  reduce_host_fn(weftFloat64, weftAvg)(dout, nullptr, da, db, 1, 3);
  EXPECT_EQ(dout[0], 1.0 / 3.0);
  uint16_t ha[] = {0x3c00}, hb[] = {0x4000}, ho[1];  // fp16 1 and 2
  reduce_host_fn(weftFloat16, weftAvg)(ho, nullptr, ha, hb, 1, 2);
  EXPECT_EQ(ho[0], 0x3e00u);  // 1.5
  uint16_t h3[] = {0x3c00};
  reduce_host_divide(weftFloat16, h3, h3, 1, 3);
  EXPECT_EQ(h3[0], 0x3555u);  // 1/3 rounded to nearest
  uint8_t e4[] = {0x38}, e4o[1];  // e4m3 1.0
  reduce_host_divide(weftFloat8e4m3, e4o, e4, 1, 3);
  EXPECT_EQ(e4o[0], 0x2bu);  // 1/3 -> 0.34375 (nearest of 0.3125, 0.34375)
}

TEST(ReduceOps, MaxMinNanAndSignedZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(weft_f32_max(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(weft_f32_max(1.0f, nan)));
  EXPECT_TRUE(std::isnan(weft_f32_min(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(weft_f64_min(2.0, (double)nan)));
  EXPECT_FALSE(std::signbit(weft_f32_max(-0.0f, 0.0f)));
  EXPECT_FALSE(std::signbit(weft_f32_max(0.0f, -0.0f)));
  EXPECT_TRUE(std::signbit(weft_f32_min(-0.0f, 0.0f)));
  EXPECT_TRUE(std::signbit(weft_f32_min(0.0f, -0.0f)));
  EXPECT_FALSE(std::signbit(weft_f64_max(-0.0, 0.0)));
  EXPECT_TRUE(std::signbit(weft_f64_min(0.0, -0.0)));
  EXPECT_EQ(weft_f16_max(0x7e00, 0x3c00) & 0x7c00, 0x7c00);  // NaN in, NaN out
  EXPECT_NE(weft_f16_max(0x7e00, 0x3c00) & 0x3ff, 0);
  EXPECT_EQ(weft_e4m3_min(0x38, 0x7f) & 0x7f, 0x7f);
  EXPECT_EQ(weft_bf16_max(0x8000, 0x0000), 0x0000);
  EXPECT_EQ(weft_bf16_min(0x0000, 0x8000), 0x8000);
  EXPECT_EQ(weft_i8_sum(127, 1), -128);
  EXPECT_EQ(weft_i8_prod(-128, -1), -128);
  EXPECT_EQ(weft_i32_prod(INT32_MIN, -1), INT32_MIN);
  EXPECT_EQ(weft_i64_sum(INT64_MAX, 1), INT64_MIN);
  EXPECT_EQ(weft_u32_sum(UINT32_MAX, 2), 1u);
}

// max and min are commutative bit for bit, NaNs included: a ring's ranks
// (the device's two-rank exchange among them) reduce the same two values in
// either order and must hold the same bits. Every pair of fp8 patterns;
// NaNs of every payload and sign against each other and against numbers,
// zeros and infinities for the 16-, 32- and 64-bit types (seeded, sampled);
// through the host loops too (the vectorised body and the scalar tail).
TEST(ReduceOps, MaxMinCommutativeBitForBit) {
  std::mt19937_64 rng(TestSeed() ^ 0x6d61786d696eull);
  auto bits_of = [](weftDataType_t t, std::mt19937_64 &g) -> uint64_t {
    const int width = t == weftFloat64 ? 64 : t == weftFloat32 ? 32 : 16;
    const uint64_t sign = (g() & 1) << (width - 1);
    const int kind = (int)(g() % 4);
    const uint64_t exp_all = width == 64 ? 0x7ff0000000000000ull
                             : width == 32 ? 0x7f800000ull
                             : t == weftBfloat16 ? 0x7f80ull : 0x7c00ull;
    const uint64_t frac_mask = exp_all == 0x7ff0000000000000ull ? 0xfffffffffffffull
                               : exp_all == 0x7f800000ull ? 0x7fffffull
                               : exp_all == 0x7f80ull ? 0x7full : 0x3ffull;
    if (kind <= 1) return sign | exp_all | ((g() & frac_mask) | 1); // a NaN
    if (kind == 2) return sign | (g() % 3 == 0 ? exp_all : 0);       // inf or zero
    return g() & ((width == 64 ? ~0ull : (1ull << width) - 1));
  };
  size_t bad = 0;
  std::string first;
  auto note = [&](const char *what, uint64_t a, uint64_t b, uint64_t ab, uint64_t ba) {
    if (bad++ == 0) {
      char buf[200];
      snprintf(buf, sizeof buf, "%s(%#llx, %#llx) = %#llx, reversed %#llx", what,
               (unsigned long long)a, (unsigned long long)b, (unsigned long long)ab,
               (unsigned long long)ba);
      first = buf;
    }
  };
  for (unsigned a = 0; a < 256; a++)
    for (unsigned b = 0; b < 256; b++) {
      const uint8_t x = (uint8_t)a, y = (uint8_t)b;
      if (weft_e4m3_max(x, y) != weft_e4m3_max(y, x)) note("e4m3 max", a, b, weft_e4m3_max(x, y), weft_e4m3_max(y, x));
      if (weft_e4m3_min(x, y) != weft_e4m3_min(y, x)) note("e4m3 min", a, b, weft_e4m3_min(x, y), weft_e4m3_min(y, x));
      if (weft_e5m2_max(x, y) != weft_e5m2_max(y, x)) note("e5m2 max", a, b, weft_e5m2_max(x, y), weft_e5m2_max(y, x));
      if (weft_e5m2_min(x, y) != weft_e5m2_min(y, x)) note("e5m2 min", a, b, weft_e5m2_min(x, y), weft_e5m2_min(y, x));
    }
  for (int i = 0; i < 200000; i++) {
    const uint16_t h1 = (uint16_t)bits_of(weftFloat16, rng), h2 = (uint16_t)bits_of(weftFloat16, rng);
    if (weft_f16_max(h1, h2) != weft_f16_max(h2, h1)) note("f16 max", h1, h2, weft_f16_max(h1, h2), weft_f16_max(h2, h1));
    if (weft_f16_min(h1, h2) != weft_f16_min(h2, h1)) note("f16 min", h1, h2, weft_f16_min(h1, h2), weft_f16_min(h2, h1));
    const uint16_t b1 = (uint16_t)bits_of(weftBfloat16, rng), b2 = (uint16_t)bits_of(weftBfloat16, rng);
    if (weft_bf16_max(b1, b2) != weft_bf16_max(b2, b1)) note("bf16 max", b1, b2, weft_bf16_max(b1, b2), weft_bf16_max(b2, b1));
    if (weft_bf16_min(b1, b2) != weft_bf16_min(b2, b1)) note("bf16 min", b1, b2, weft_bf16_min(b1, b2), weft_bf16_min(b2, b1));
    const uint32_t f1 = (uint32_t)bits_of(weftFloat32, rng), f2 = (uint32_t)bits_of(weftFloat32, rng);
    float x, y;
    memcpy(&x, &f1, 4);
    memcpy(&y, &f2, 4);
    if (FloatBits(weft_f32_max(x, y)) != FloatBits(weft_f32_max(y, x)))
      note("f32 max", f1, f2, FloatBits(weft_f32_max(x, y)), FloatBits(weft_f32_max(y, x)));
    if (FloatBits(weft_f32_min(x, y)) != FloatBits(weft_f32_min(y, x)))
      note("f32 min", f1, f2, FloatBits(weft_f32_min(x, y)), FloatBits(weft_f32_min(y, x)));
    const uint64_t d1 = bits_of(weftFloat64, rng), d2 = bits_of(weftFloat64, rng);
    double u, v, r1, r2;
    memcpy(&u, &d1, 8);
    memcpy(&v, &d2, 8);
    uint64_t o1, o2;
    r1 = weft_f64_max(u, v), r2 = weft_f64_max(v, u);
    memcpy(&o1, &r1, 8), memcpy(&o2, &r2, 8);
    if (o1 != o2) note("f64 max", d1, d2, o1, o2);
    r1 = weft_f64_min(u, v), r2 = weft_f64_min(v, u);
    memcpy(&o1, &r1, 8), memcpy(&o2, &r2, 8);
    if (o1 != o2) note("f64 min", d1, d2, o1, o2);
  }
  EXPECT_EQ(bad, 0u) << "first: " << first;
  // the host loops, 1001 elements (vector body and scalar tail), both orders
  for (weftDataType_t t : {weftFloat16, weftBfloat16, weftFloat32, weftFloat64}) {
    const size_t n = 1001, es = weftTypeSize(t);
    std::vector<uint8_t> a(n * es), b(n * es), ab(n * es), ba(n * es);
    for (size_t i = 0; i < n; i++) {
      const uint64_t x = bits_of(t, rng), y = bits_of(t, rng);
      memcpy(&a[i * es], &x, es);
      memcpy(&b[i * es], &y, es);
    }
    for (weftRedOp_t op : {weftMax, weftMin}) {
      reduce_host_fn(t, op)(ab.data(), nullptr, a.data(), b.data(), n, 1);
      reduce_host_fn(t, op)(ba.data(), nullptr, b.data(), a.data(), n, 1);
      EXPECT_EQ(memcmp(ab.data(), ba.data(), n * es), 0)
          << "datatype " << (int)t << (op == weftMax ? " max" : " min");
    }
  }
}

// The streaming copy of large local blocks: every alignment of source and
// destination, sizes around its 16- and 64-byte steps and up to 3 MiB, bytes
// on both sides of the destination untouched.
TEST(CopyHostStream, EqualsMemcpyAtEveryAlignment) {
  std::mt19937_64 rng(20261123);
  std::vector<unsigned char> src((3u << 20) + 256), dst(src.size() + 256);
  for (auto &b : src) b = (unsigned char)rng();
  std::vector<size_t> sizes = {0, 1, 15, 16, 17, 63, 64, 65, 127, 1000, 4099, (1u << 20) + 13,
                               3u << 20};
  for (size_t nbytes : sizes)
    for (size_t so = 0; so < 16; so += 3)
      for (size_t d_off = 0; d_off < 16; d_off += (nbytes > 100000 ? 5 : 1)) {
        std::fill(dst.begin(), dst.end(), 0xa5);
        copy_host_stream(dst.data() + 64 + d_off, src.data() + so, nbytes);
        ASSERT_EQ(0, memcmp(dst.data() + 64 + d_off, src.data() + so, nbytes))
            << nbytes << " bytes, src offset " << so << ", dst offset " << d_off;
        for (size_t i = 0; i < 64 + d_off; i++) ASSERT_EQ(dst[i], 0xa5) << "before, " << i;
        for (size_t i = 64 + d_off + nbytes; i < dst.size(); i++)
          ASSERT_EQ(dst[i], 0xa5) << "after, " << nbytes << " bytes, at " << i;
      }
}

// The same copy to several destinations at once: 1 to 19 of them (more
// than the 16 taken per pass), sharing their offset within a 64-byte line or
// not (then one after another), every size around the line, each
// destination equal to the source and nothing around it written; with each
// vector width this CPU has (SSE2, AVX2, AVX-512).
TEST(CopyHostStream, SeveralDestinationsAtEveryOffset) {
  std::mt19937_64 rng(TestSeed() + 7);
  std::vector<unsigned char> src(70000);
  for (auto &b : src) b = (unsigned char)rng();
  for (int isa = STREAM_ISA_SSE2; isa <= stream_isa_best(); isa++)
  for (int ndsts : {1, 2, 3, 17, 19})
    for (size_t nbytes : {(size_t)0, (size_t)1, (size_t)63, (size_t)64, (size_t)65,
                          (size_t)1000, (size_t)65537})
      for (int shared : {1, 0})
        for (size_t d_off = 0; d_off < 64; d_off += 9) {
          const size_t room = nbytes + 256;
          std::vector<unsigned char> dst(room * (size_t)ndsts + 64, 0xa5);
          // 64-byte aligned bases; offsets the same or each its own
          unsigned char *base = dst.data() + ((64 - ((uintptr_t)dst.data() & 63)) & 63);
          std::vector<void *> dsts(ndsts);
          std::vector<size_t> at(ndsts);
          for (int k = 0; k < ndsts; k++) {
            at[k] = (size_t)k * room / 64 * 64 + 64 + (shared ? d_off : (d_off + 5 * k) % 64);
            dsts[k] = base + at[k];
          }
          const size_t so = d_off % 13;
          copy_host_stream_to_isa(dsts.data(), ndsts, src.data() + so, nbytes, (stream_isa)isa);
          copy_host_stream_fence();
          std::vector<unsigned char> want(dst.size(), 0xa5);
          for (int k = 0; k < ndsts; k++)
            std::memcpy(want.data() + (base - dst.data()) + at[k], src.data() + so, nbytes);
          ASSERT_EQ(0, std::memcmp(want.data(), dst.data(), dst.size()))
              << ndsts << " destinations, " << nbytes << " bytes, offset " << d_off
              << (shared ? " shared" : " each its own") << ", isa " << isa;
        }
}

// The loops that reduce straight to several outputs past the caches give the
// plain loop's bits: float32 and float64 sum, prod and avg (divisors 1, 3),
// 1 to 3 outputs at a shared offset or not, in place (output 0 is a), counts
// around the vector width, and nothing past the outputs written; with each
// vector width this CPU has a loop for (AVX2, AVX-512). Where the CPU has
// none the test says so and skips.
TEST(ReduceHostStream, SameBitsAsThePlainLoop) {
  std::mt19937_64 rng(TestSeed() + 11);
  int ran = 0;
  for (int isa = STREAM_ISA_AVX2; isa <= stream_isa_best(); isa++)
  for (weftDataType_t dt : {weftFloat32, weftFloat64})
    for (weftRedOp_t op : {weftSum, weftProd, weftAvg}) {
      weft_reduce_stream_fn fused = reduce_host_stream_fn_isa(dt, op, (stream_isa)isa);
      if (fused == nullptr) continue;
      if (isa == stream_isa_best()) {
        EXPECT_EQ(fused, reduce_host_stream_fn(dt, op));
      }
      ran++;
      weft_reduce_fn plain = reduce_host_fn(dt, op);
      const size_t esize = TypeNbytes(dt);
      for (size_t count : {(size_t)0, (size_t)1, (size_t)15, (size_t)16, (size_t)17,
                           (size_t)1001, (size_t)20011})
        for (int ndsts : {1, 2, 3})
          for (int layout = 0; layout < 3; layout++)  // 0 shared offset, 1 own offsets, 2 in place
            for (int divisor : {1, 3}) {
              if (op != weftAvg && divisor != 1) continue;
              const size_t nbytes = count * esize, room = nbytes + 192;
              std::vector<unsigned char> a(room), b(room), want(room),
                  out(room * (size_t)ndsts + 64, 0x5a);
              const size_t off = esize * (count % 5);
              FillRandom(dt, a.data() + off, count, rng);
              FillRandom(dt, b.data() + off, count, rng);
              plain(want.data() + off, nullptr, a.data() + off, b.data() + off, count, divisor);
              std::vector<unsigned char> a_in = a;
              std::vector<void *> dsts(ndsts);
              for (int k = 0; k < ndsts; k++)
                dsts[k] = out.data() + (size_t)k * room + off + (layout == 1 ? esize * k : 0);
              if (layout == 2) dsts[0] = a.data() + off;
              fused(dsts.data(), ndsts, a.data() + off, b.data() + off, count, divisor);
              copy_host_stream_fence();
              const std::string where = "isa " + std::to_string(isa) + ", " +
                                        std::string(kTypeTags[dt]) + "_" + kOpNames[op] +
                                        " count " + std::to_string(count) + ", " +
                                        std::to_string(ndsts) + " outputs, layout " +
                                        std::to_string(layout) + ", divisor " +
                                        std::to_string(divisor);
              for (int k = 0; k < ndsts; k++) {
                for (size_t i = 0; i < nbytes; i += esize) {
                  const unsigned char *g = (const unsigned char *)dsts[k] + i,
                                      *w = want.data() + off + i;
                  const bool both_nan = dt == weftFloat32
                                            ? std::isnan(*(const float *)g) && std::isnan(*(const float *)w)
                                            : std::isnan(*(const double *)g) && std::isnan(*(const double *)w);
                  if (both_nan) continue;  // which input's NaN comes out is the compiler's choice
                  ASSERT_EQ(0, std::memcmp(g, w, esize))
                      << where << ", output " << k << ", element " << i / esize;
                }
                unsigned char *end = (unsigned char *)dsts[k] + nbytes;
                if (end != a.data() + off + nbytes) {
                  ASSERT_EQ(*end, 0x5a) << where << ", past output " << k;
                }
              }
              if (layout != 2) {
                ASSERT_EQ(0, std::memcmp(a.data(), a_in.data(), room)) << where;
              }
            }
    }
  if (ran == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: no fused streaming reduction to test";
}

}  // namespace
