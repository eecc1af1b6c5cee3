/* Elements of every datatype for the NCCL-API test program: access, inputs
 * whose reductions are exact, expected results, poisoned buffers with a
 * guard, and the test's reduction ops (nccl_elems.h). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_elems.h"

/* --- Element access in every datatype ------------------------------------ */

const char *const type_names[ncclNumTypes] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
const size_t type_sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

int type_is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
         t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}
int type_is_unsigned(ncclDataType_t t) {
  return t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
}

/* Small binary floats: ebits of exponent, mbits of mantissa, bias. */
struct minifloat {
  int ebits, mbits, bias;
};
static const struct minifloat half_fmt = {5, 10, 15}, e4m3_fmt = {4, 3, 7}, e5m2_fmt = {5, 2, 15};

/* Encodes v, which must be representable (the inputs here are small integers). */
static unsigned mini_encode(double v, struct minifloat f) {
  if (v == 0) return 0;
  unsigned sign = v < 0;
  double a = fabs(v);
  int e = (int)floor(log2(a));
  unsigned mant = (unsigned)lround((a / ldexp(1.0, e) - 1.0) * (1 << f.mbits));
  return sign << (f.ebits + f.mbits) | (unsigned)(e + f.bias) << f.mbits | mant;
}

static double mini_decode(unsigned bits, struct minifloat f) {
  unsigned mant = bits & ((1u << f.mbits) - 1);
  unsigned exp = (bits >> f.mbits) & ((1u << f.ebits) - 1);
  double sign = bits >> (f.ebits + f.mbits) & 1 ? -1.0 : 1.0;
  if (exp == 0) return sign * ldexp(mant, 1 - f.bias - f.mbits);
  return sign * ldexp(1.0 + (double)mant / (1 << f.mbits), (int)exp - f.bias);
}

void elem_set(void *buf, ncclDataType_t t, size_t i, double v) {
  char *p = (char *)buf + i * type_sizes[t];
  switch (t) {
    case ncclInt8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
    case ncclUint8: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case ncclInt32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case ncclUint32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case ncclInt64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case ncclUint64: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case ncclFloat16: { uint16_t x = (uint16_t)mini_encode(v, half_fmt); memcpy(p, &x, 2); break; }
    case ncclFloat32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case ncclFloat64: memcpy(p, &v, 8); break;
    case ncclBfloat16: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      uint16_t x = (uint16_t)(u >> 16); /* exact for the small integers used */
      memcpy(p, &x, 2);
      break;
    }
    case ncclFloat8e4m3: *(uint8_t *)p = (uint8_t)mini_encode(v, e4m3_fmt); break;
    case ncclFloat8e5m2: *(uint8_t *)p = (uint8_t)mini_encode(v, e5m2_fmt); break;
    default: break;
  }
}

double elem_get(const void *buf, ncclDataType_t t, size_t i) {
  const char *p = (const char *)buf + i * type_sizes[t];
  switch (t) {
    case ncclInt8: return *(const int8_t *)p;
    case ncclUint8: return *(const uint8_t *)p;
    case ncclInt32: { int32_t x; memcpy(&x, p, 4); return x; }
    case ncclUint32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case ncclInt64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case ncclUint64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    case ncclFloat16: { uint16_t x; memcpy(&x, p, 2); return mini_decode(x, half_fmt); }
    case ncclFloat32: { float x; memcpy(&x, p, 4); return x; }
    case ncclFloat64: { double x; memcpy(&x, p, 8); return x; }
    case ncclBfloat16: {
      uint16_t x;
      memcpy(&x, p, 2);
      uint32_t u = (uint32_t)x << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case ncclFloat8e4m3: return mini_decode(*(const uint8_t *)p, e4m3_fmt);
    case ncclFloat8e5m2: return mini_decode(*(const uint8_t *)p, e5m2_fmt);
    default: return NAN;
  }
}

/* How far a result may be from the exact one, relative to max(1, |exact|):
 * the inputs are small integers, so only averages round. */
static double type_tolerance(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return 1e-3;
    case ncclFloat32: return 1e-6;
    case ncclFloat64: return 1e-12;
    case ncclBfloat16: return 8e-3;
    case ncclFloat8e4m3: return 0.07;
    case ncclFloat8e5m2: return 0.13;
    default: return 0;
  }
}

/* --- Inputs and expected results ------------------------------------------ */

const char *const op_names[NUM_TEST_OPS] = {"sum", "prod", "max", "min", "avg",
                                                    "premul(host)", "premul(device)"};

/* Rank r's input element i for op: small integers whose reductions over up
 * to 4 ranks are exact in every datatype, fp8 included. */
double input_value(int r, size_t i, ncclDataType_t t, int op, unsigned salt) {
  unsigned h = (unsigned)r * 5u + (unsigned)i * 3u + salt;
  static const double signed_factors[3] = {-1, 1, 2};
  if (op == ncclProd) return type_is_unsigned(t) ? 1 + h % 2 : signed_factors[h % 3];
  return type_is_unsigned(t) ? h % 3 : (double)((int)(h % 3) - 1);
}

double expected_reduce(size_t i, ncclDataType_t t, int op, unsigned salt) {
  double acc = input_value(0, i, t, op, salt);
  if (op == OP_PREMUL_HOST || op == OP_PREMUL_DEVICE) acc *= PREMUL_SCALAR;
  for (int r = 1; r < g_nranks; r++) {
    double v = input_value(r, i, t, op, salt);
    switch (op) {
      case ncclSum: case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
      default: acc += v * PREMUL_SCALAR; break;
    }
  }
  if (op == ncclAvg) acc = type_is_float(t) ? acc / g_nranks : trunc(acc / g_nranks);
  return acc;
}

int close_enough(double got, double want, ncclDataType_t t) {
  double tol = type_tolerance(t) * (fabs(want) > 1 ? fabs(want) : 1);
  return fabs(got - want) <= tol;
}


void *buf_alloc(size_t count, ncclDataType_t t) {
  size_t n = (count + GUARD) * type_sizes[t];
  void *p = malloc(n);
  if (p == NULL) exit(2);
  memset(p, POISON, n);
  return p;
}

void check_guard(const void *buf, size_t count, ncclDataType_t t, const char *what) {
  const unsigned char *g = (const unsigned char *)buf + count * type_sizes[t];
  for (size_t b = 0; b < GUARD * type_sizes[t]; b++)
    if (g[b] != POISON) {
      FAIL("%s %s: wrote past the end of the output (byte %zu)", what, type_names[t], b);
      return;
    }
}

ncclRedOp_t make_op(int op, ncclDataType_t t, ncclComm_t comm, void **scalar_p) {
  if (op < ncclNumOps) return (ncclRedOp_t)op;
  ncclRedOp_t made;
  *scalar_p = buf_alloc(1, t);
  elem_set(*scalar_p, t, 0, PREMUL_SCALAR);
  NCCL_OK(ncclRedOpCreatePreMulSum(&made, *scalar_p, t,
                                   op == OP_PREMUL_HOST ? ncclScalarHostImmediate : ncclScalarDevice,
                                   comm));
  if (op == OP_PREMUL_HOST) elem_set(*scalar_p, t, 0, 0); /* copied already: must not matter */
  return made;
}
