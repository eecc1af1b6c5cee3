// WEFT_DETERMINISTIC's reduction kernel on device memory (kernels_det.cu)
// runs det_elem.h's body per element; here that body runs on the host, for
// every datatype and op, a pre-multiply sum (scalar by value and by pointer)
// and 2-5 ranks, against the host executor's own reduction
// (collectives/algo/deterministic.c's det_reduce, the inputs scaled first as
// the host scales them): the same bits, so the two executors agree. Runs on
// every machine (the GPU's own run is test_device's DeviceDeterministic).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "tests/collectives/coll_ref.h"
#include "collectives/exec/device/det_elem.h"
extern "C" {
#include "collectives/algo/deterministic.h"
}

using namespace weft_test;

namespace {

// x * s in t's own arithmetic (what the host's pre-multiply sum does to each
// input element before reducing).
void scale(weftDataType_t t, uint8_t *x, const uint8_t *s) {
#define SCALE(tag, T)                               \
  {                                                 \
    T a, b;                                         \
    memcpy(&a, x, sizeof a);                        \
    memcpy(&b, s, sizeof b);                        \
    a = weft_##tag##_prod(a, b);                    \
    memcpy(x, &a, sizeof a);                        \
    return;                                         \
  }
  switch (t) {
    case weftInt8: SCALE(i8, int8_t)
    case weftUint8: SCALE(u8, uint8_t)
    case weftInt32: SCALE(i32, int32_t)
    case weftUint32: SCALE(u32, uint32_t)
    case weftInt64: SCALE(i64, int64_t)
    case weftUint64: SCALE(u64, uint64_t)
    case weftFloat16: SCALE(f16, uint16_t)
    case weftFloat32: SCALE(f32, float)
    case weftFloat64: SCALE(f64, double)
    case weftBfloat16: SCALE(bf16, uint16_t)
    case weftFloat8e4m3: SCALE(e4m3, uint8_t)
    default: SCALE(e5m2, uint8_t)
  }
#undef SCALE
}

TEST(DetElem, EveryDatatypeAndOpGivesTheHostExecutorsBits) {
  const uint64_t seed = test_seed();
  printf("seed %llu\n", (unsigned long long)seed);
  const size_t count = 777;
  int cases = 0;
  for (int n = 2; n <= 5; n++)
    for (int ti = 0; ti < weftNumTypes; ti++)
      for (int oi = 0; oi < weftNumOps + 2; oi++) { // + a pre-multiply sum by value, by pointer
        const auto t = (weftDataType_t)ti;
        const int premul = oi >= weftNumOps ? 1 + (oi - weftNumOps) : 0;
        const auto op = premul ? weftSum : (weftRedOp_t)oi;
        SCOPED_TRACE(std::string(type_name(t)) + " " + (premul ? "premulsum" : op_name(op)) +
                     ", " + std::to_string(n) + " ranks");
        const size_t es = weftTypeSize(t);
        // the contributions stride bytes apart, as the kernel reads them
        std::vector<uint8_t> in(n * count * es), got(count * es + 16, 0x5a),
            want(count * es + 16, 0x5a);
        for (int r = 0; r < n; r++) {
          std::vector<uint8_t> x = make_input(t, op, count, seed + ti * 64 + oi, r);
          memcpy(&in[r * count * es], x.data(), count * es);
        }
        uint8_t scalar[8] = {0};
        {
          std::vector<uint8_t> s = make_input(t, weftProd, 1, seed + 7, 99);
          memcpy(scalar, s.data(), es);
        }
        dev_det_work w = {};
        w.in = in.data();
        w.stride = count * es;
        w.out = got.data();
        w.count = count;
        w.n = n;
        w.datatype = t;
        w.op = op;
        w.divisor = op == weftAvg ? n : 1;
        w.premul = premul != 0;
        if (premul == 1) memcpy(&w.scalar_bits, scalar, es);
        else if (premul == 2) w.scalar_ptr = scalar;
        for (uint64_t i = 0; i < count; i++) det_reduce_elem(w, i);
        // the host executor: inputs scaled first, then its fixed order
        std::vector<uint8_t> scaled = in;
        if (premul)
          for (size_t e = 0; e < (size_t)n * count; e++) scale(t, &scaled[e * es], scalar);
        std::vector<const void *> ins(n);
        for (int r = 0; r < n; r++) ins[r] = &scaled[r * count * es];
        det_reduce(t, op, n, want.data(), ins.data(), count);
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < count; i++)
          if (memcmp(&got[i * es], &want[i * es], es) != 0 && wrong++ == 0) first = i;
        EXPECT_EQ(wrong, 0u) << wrong << " of " << count << " elements differ (first " << first
                             << ")";
        for (size_t b = count * es; b < got.size(); b++)
          ASSERT_EQ(got[b], 0x5a) << "byte " << b - count * es << " past the block written";
        cases++;
      }
  EXPECT_EQ(cases, 4 * weftNumTypes * (weftNumOps + 2));
}

// n = 1 with the scalar: how the device scales a pre-multiply sum's input
// before its exchanges (device_det.c), each element times the rank's own
// scalar in its type, as the host scales its input (redop_premul).
TEST(DetElem, ScalingIsTheHostsPreMultiply) {
  const uint64_t seed = test_seed();
  const size_t count = 501;
  for (int ti = 0; ti < weftNumTypes; ti++)
    for (int by_pointer = 0; by_pointer < 2; by_pointer++) {
      const auto t = (weftDataType_t)ti;
      SCOPED_TRACE(std::string(type_name(t)) + (by_pointer ? ", scalar by pointer" : ""));
      const size_t es = weftTypeSize(t);
      std::vector<uint8_t> in = make_input(t, weftSum, count, seed + ti, 0);
      std::vector<uint8_t> got(count * es + 16, 0x5a), want = in;
      uint8_t scalar[8] = {0};
      std::vector<uint8_t> s = make_input(t, weftProd, 1, seed + 11 + ti, 3);
      memcpy(scalar, s.data(), es);
      dev_det_work w = {};
      w.in = in.data();
      w.out = got.data();
      w.count = count;
      w.n = 1;
      w.datatype = t;
      w.op = weftSum;
      w.divisor = 1;
      w.premul = 1;
      if (by_pointer) w.scalar_ptr = scalar;
      else memcpy(&w.scalar_bits, scalar, es);
      for (uint64_t i = 0; i < count; i++) det_reduce_elem(w, i);
      for (size_t i = 0; i < count; i++) scale(t, &want[i * es], scalar);
      size_t wrong = 0;
      for (size_t i = 0; i < count; i++) wrong += memcmp(&got[i * es], &want[i * es], es) != 0;
      EXPECT_EQ(wrong, 0u) << wrong << " of " << count << " elements scaled otherwise";
      for (size_t b = count * es; b < got.size(); b++)
        ASSERT_EQ(got[b], 0x5a) << "byte " << b - count * es << " past the block written";
    }
}

}  // namespace
