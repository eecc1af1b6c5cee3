/* Datatype access for the perf tools' data fill and check. The small float
 * formats are decoded generically (sign, exponent, mantissa, bias); encoding
 * only ever sees small integers, which every format holds exactly. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "perf_types.h"

struct minifloat {
  int ebits, mbits;
  int finite_only; /* e4m3: the top exponent holds numbers, all-ones is NaN */
};

static const struct minifloat fmt_f16 = {5, 10, 0}, fmt_bf16 = {8, 7, 0}, fmt_e4m3 = {4, 3, 1},
                              fmt_e5m2 = {5, 2, 0};

static double minifloat_decode(uint32_t bits, const struct minifloat *f) {
  int bias = (1 << (f->ebits - 1)) - 1;
  uint32_t mant = bits & ((1u << f->mbits) - 1);
  uint32_t exp = (bits >> f->mbits) & ((1u << f->ebits) - 1);
  double sign = (bits >> (f->ebits + f->mbits)) & 1 ? -1.0 : 1.0;
  uint32_t exp_max = (1u << f->ebits) - 1;
  if (f->finite_only && exp == exp_max && mant == (1u << f->mbits) - 1) return NAN;
  if (!f->finite_only && exp == exp_max) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * ldexp((double)mant, 1 - bias - f->mbits);
  return sign * ldexp((double)(mant | (1u << f->mbits)), (int)exp - bias - f->mbits);
}

static uint32_t minifloat_encode_exact(double v, const struct minifloat *f) {
  if (v == 0) return 0;
  int bias = (1 << (f->ebits - 1)) - 1;
  uint32_t sign = v < 0 ? 1u << (f->ebits + f->mbits) : 0;
  int e;
  double frac = frexp(fabs(v), &e); /* |v| = frac * 2^e, frac in [0.5, 1) */
  uint32_t mant = (uint32_t)ldexp(frac * 2 - 1, f->mbits);
  return sign | (uint32_t)(e - 1 + bias) << f->mbits | mant;
}

double perf_value_get(const void *buf, size_t i, weftDataType_t datatype) {
  const char *p = (const char *)buf + i * weftTypeSize(datatype);
  union { int8_t i8; uint8_t u8; int32_t i32; uint32_t u32; int64_t i64; uint64_t u64;
          uint16_t h; float f; double d; } v;
  memcpy(&v, p, weftTypeSize(datatype));
  switch (datatype) {
    case weftInt8: return v.i8;
    case weftUint8: return v.u8;
    case weftInt32: return v.i32;
    case weftUint32: return v.u32;
    case weftInt64: return (double)v.i64;
    case weftUint64: return (double)v.u64;
    case weftFloat16: return minifloat_decode(v.h, &fmt_f16);
    case weftBfloat16: return minifloat_decode(v.h, &fmt_bf16);
    case weftFloat8e4m3: return minifloat_decode(v.u8, &fmt_e4m3);
    case weftFloat8e5m2: return minifloat_decode(v.u8, &fmt_e5m2);
    case weftFloat32: return v.f;
    case weftFloat64: return v.d;
    default: return NAN;
  }
}

void perf_value_set(void *buf, size_t i, weftDataType_t datatype, double value) {
  char *p = (char *)buf + i * weftTypeSize(datatype);
  union { int8_t i8; uint8_t u8; int32_t i32; uint32_t u32; int64_t i64; uint64_t u64;
          uint16_t h; float f; double d; } v;
  switch (datatype) {
    case weftInt8: v.i8 = (int8_t)value; break;
    case weftUint8: v.u8 = (uint8_t)value; break;
    case weftInt32: v.i32 = (int32_t)value; break;
    case weftUint32: v.u32 = (uint32_t)value; break;
    case weftInt64: v.i64 = (int64_t)value; break;
    case weftUint64: v.u64 = (uint64_t)value; break;
    case weftFloat16: v.h = (uint16_t)minifloat_encode_exact(value, &fmt_f16); break;
    case weftBfloat16: v.h = (uint16_t)minifloat_encode_exact(value, &fmt_bf16); break;
    case weftFloat8e4m3: v.u8 = (uint8_t)minifloat_encode_exact(value, &fmt_e4m3); break;
    case weftFloat8e5m2: v.u8 = (uint8_t)minifloat_encode_exact(value, &fmt_e5m2); break;
    case weftFloat32: v.f = (float)value; break;
    case weftFloat64: v.d = value; break;
    default: return;
  }
  memcpy(p, &v, weftTypeSize(datatype));
}

double perf_type_eps(weftDataType_t datatype) {
  switch (datatype) {
    case weftFloat16: return ldexp(1, -11);
    case weftBfloat16: return ldexp(1, -8);
    case weftFloat8e4m3: return ldexp(1, -4);
    case weftFloat8e5m2: return ldexp(1, -3);
    case weftFloat32: return ldexp(1, -24);
    case weftFloat64: return ldexp(1, -53);
    default: return 0;
  }
}

double perf_premul_scalar(int rank) { return rank % 2 == 0 ? 1.0 : 2.0; }

/* How far a seed moves one element's input along its cycle of values: a
 * hash of seed, rank and index, so that one round's inputs are not the
 * round before's moved by a rank or an index (which a result taken from the
 * wrong block or a stale round could match). */
static size_t input_shift(int rank, size_t i, unsigned seed) {
  if (seed == 0) return 0;
  uint64_t x = (uint64_t)seed << 40 ^ (uint64_t)(unsigned)rank << 32 ^ (uint64_t)i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x;
}

double perf_input(int rank, size_t i, weftDataType_t datatype, int op, unsigned seed) {
  int is_unsigned = datatype == weftUint8 || datatype == weftUint32 || datatype == weftUint64;
  const size_t shift = input_shift(rank, i, seed) % 21; /* both spans divide 21 */
  if (op == weftProd) return ((size_t)rank + i + shift) % 3 == 0 && !is_unsigned ? -1 : 1;
  int small = datatype == weftFloat8e4m3 || datatype == weftFloat8e5m2;
  int span = small ? 3 : 7; /* values in [-1, 1] or [-3, 3] */
  int v = (int)(((size_t)rank * 131 + i * 17 + 5 + shift) % (size_t)span) - span / 2;
  return is_unsigned ? v + span / 2 : v;
}

void perf_reduced(size_t i, int nranks, weftDataType_t datatype, int op, unsigned seed,
                  double *value_out, double *magnitude_out) {
  double acc = perf_input(0, i, datatype, op, seed), magnitude;
  if (op == PERF_OP_MULSUM) acc *= perf_premul_scalar(0);
  magnitude = fabs(acc);
  for (int r = 1; r < nranks; r++) {
    double v = perf_input(r, i, datatype, op, seed);
    if (op == PERF_OP_MULSUM) v *= perf_premul_scalar(r);
    magnitude += fabs(v);
    switch (op) {
      case weftSum: case weftAvg: case PERF_OP_MULSUM: acc += v; break;
      case weftProd: acc *= v; break;
      case weftMax: acc = v > acc ? v : acc; break;
      case weftMin: acc = v < acc ? v : acc; break;
      default: break;
    }
  }
  if (op == weftAvg) {
    int integer = perf_type_eps(datatype) == 0;
    acc = integer ? trunc(acc / nranks) : acc / nranks;
    magnitude = magnitude / nranks + fabs(acc);
  }
  *value_out = acc;
  *magnitude_out = magnitude;
}
