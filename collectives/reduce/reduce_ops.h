/* Reduction arithmetic shared by the host executor and the device kernels:
 * bit-exact conversions between float and the low-precision types, and one
 * scalar function per (type, op). Compiles as C11, C++ and CUDA (host and
 * device). Uses only integer bit manipulation, so results do not depend on
 * the FPU's flush-to-zero mode or on hardware conversion instructions.
 *
 * Type tags: i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16 e4m3 e5m2. fp16, bf16 and
 * fp8 values travel as their bit patterns (uint16_t, uint8_t).
 *
 * Semantics:
 *  - integer sum/prod wrap modulo 2^bits (signed types too);
 *  - low-precision types are converted to float, combined, and rounded back
 *    to nearest-even;
 *  - float max/min: NaN if either operand is NaN (the NaN operand; of two,
 *    the one whose bits are larger as an unsigned integer); max(-0, +0) = +0
 *    and min(-0, +0) = -0 whatever the order, so max and min are commutative
 *    bit for bit; so are integer sum and prod, and float sum and prod but for
 *    the payload of a NaN made of two NaN operands (the processor's choice);
 *  - weftAvg = sum, then weft_<tag>_div(sum, nranks) once at the end:
 *    truncating division for integers (signed types as signed), float
 *    division for floats (double for f64). divisor must be >= 1. */
#ifndef WEFT_REDUCE_OPS_H
#define WEFT_REDUCE_OPS_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define WEFT_HD static __host__ __device__ __forceinline__
#else
#define WEFT_HD static inline
#endif

/* --- bit access ---------------------------------------------------------- */

WEFT_HD uint32_t weft_fp_f32_bits(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

WEFT_HD float weft_fp_f32_from_bits(uint32_t u)
{
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

WEFT_HD uint64_t weft_fp_f64_bits(double d)
{
  uint64_t u;
  memcpy(&u, &d, sizeof(u));
  return u;
}

/* --- conversion cores ---------------------------------------------------- */

/* Rounds |x| (abs_bits: float bits without the sign; finite or infinite, not
 * NaN) to nearest-even in a format with man_bits mantissa bits and exponent
 * bias `bias`. Returns (exponent field << man_bits) | mantissa. The result may
 * exceed the format's largest finite encoding: the caller maps that to
 * infinity or saturates. */
WEFT_HD uint32_t weft_fp_round_mag(uint32_t abs_bits, int man_bits, int bias)
{
  int exp32 = (int)(abs_bits >> 23);
  uint32_t v;
  int shift;
  if (exp32 - 127 + bias >= 1) {
    /* normal in the target: rebias the exponent, drop low mantissa bits */
    v = abs_bits - ((uint32_t)(127 - bias) << 23);
    shift = 23 - man_bits;
  } else {
    /* subnormal or zero in the target: shift the full significand */
    v = abs_bits & 0x7fffffu;
    if (exp32 != 0)
      v |= 0x800000u;
    else
      exp32 = 1;
    shift = 151 - bias - man_bits - exp32; /* >= 24 - man_bits */
    if (shift > 25) return 0; /* below half the smallest subnormal */
  }
  uint32_t mag = v >> shift;
  uint32_t rem = v & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  /* a carry out of the mantissa bumps the exponent field, as it should */
  if (rem > half || (rem == half && (mag & 1u))) mag++;
  return mag;
}

/* Float bits of the finite encoding `mag` (no sign) of a format with man_bits
 * mantissa bits and bias `bias` whose values are all normal floats (fp16,
 * fp8; not bf16, whose subnormals are float subnormals). */
WEFT_HD uint32_t weft_fp_decode_mag(uint32_t mag, int man_bits, int bias)
{
  uint32_t man_mask = (1u << man_bits) - 1;
  int exp = (int)(mag >> man_bits);
  uint32_t man = mag & man_mask;
  if (exp == 0) {
    if (man == 0) return 0;
    /* subnormal: normalise */
    exp = 1;
    while (!(man & (man_mask + 1))) {
      man <<= 1;
      exp--;
    }
    man &= man_mask;
  }
  return ((uint32_t)(exp - bias + 127) << 23) | (man << (23 - man_bits));
}

/* --- fp16 (IEEE binary16) ------------------------------------------------ */

WEFT_HD float weft_f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t mag = h & 0x7fffu;
  if (mag >= 0x7c00u) /* inf or NaN; the payload is kept */
    return weft_fp_f32_from_bits(sign | 0x7f800000u | ((mag & 0x3ffu) << 13));
  return weft_fp_f32_from_bits(sign | weft_fp_decode_mag(mag, 10, 15));
}

/* overflow goes to infinity, as IEEE round-to-nearest does */
WEFT_HD uint16_t weft_f32_to_f16(float f)
{
  uint32_t bits = weft_fp_f32_bits(f);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) /* NaN: quiet, keep the top payload bits */
    return (uint16_t)(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu));
  uint32_t mag = weft_fp_round_mag(abs_bits, 10, 15);
  if (mag > 0x7c00u) mag = 0x7c00u;
  return (uint16_t)(sign | mag);
}

/* --- bf16 ---------------------------------------------------------------- */

WEFT_HD float weft_bf16_to_f32(uint16_t h)
{
  return weft_fp_f32_from_bits((uint32_t)h << 16);
}

WEFT_HD uint16_t weft_f32_to_bf16(float f)
{
  uint32_t bits = weft_fp_f32_bits(f);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
  /* no clamp: the largest float rounds to at most 0x7f80, infinity */
  return (uint16_t)(sign | weft_fp_round_mag(abs_bits, 7, 127));
}

/* --- fp8 E4M3 (OCP): bias 7, no infinities, 0x7f/0xff NaN, max 448 -------- */

WEFT_HD float weft_e4m3_to_f32(uint8_t x)
{
  uint32_t sign = (uint32_t)(x & 0x80u) << 24;
  uint32_t mag = x & 0x7fu;
  if (mag == 0x7fu) return weft_fp_f32_from_bits(sign | 0x7fc00000u);
  return weft_fp_f32_from_bits(sign | weft_fp_decode_mag(mag, 3, 7));
}

/* finite overflow and infinities saturate to +-448 (CUDA's satfinite) */
WEFT_HD uint8_t weft_f32_to_e4m3(float f)
{
  uint32_t bits = weft_fp_f32_bits(f);
  uint32_t sign = (bits >> 24) & 0x80u;
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  uint32_t mag = weft_fp_round_mag(abs_bits, 3, 7);
  if (mag > 0x7eu) mag = 0x7eu;
  return (uint8_t)(sign | mag);
}

/* --- fp8 E5M2 (OCP): bias 15, IEEE-like inf/NaN, max finite 57344 -------- */

WEFT_HD float weft_e5m2_to_f32(uint8_t x)
{
  uint32_t sign = (uint32_t)(x & 0x80u) << 24;
  uint32_t mag = x & 0x7fu;
  if (mag >= 0x7cu) return weft_fp_f32_from_bits(sign | 0x7f800000u | ((mag & 3u) << 21));
  return weft_fp_f32_from_bits(sign | weft_fp_decode_mag(mag, 2, 15));
}

/* finite overflow and infinities saturate to +-57344 (CUDA's satfinite) */
WEFT_HD uint8_t weft_f32_to_e5m2(float f)
{
  uint32_t bits = weft_fp_f32_bits(f);
  uint32_t sign = (bits >> 24) & 0x80u;
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  uint32_t mag = weft_fp_round_mag(abs_bits, 2, 15);
  if (mag > 0x7bu) mag = 0x7bu;
  return (uint8_t)(sign | mag);
}

/* --- integer ops: sum/prod wrap through the unsigned type ----------------- */

#define WEFT_REDUCE_INT_OPS(tag, type, utype)                                     \
  WEFT_HD type weft_##tag##_sum(type a, type b)                                   \
  {                                                                               \
    return (type)(utype)((utype)a + (utype)b);                                    \
  }                                                                               \
  WEFT_HD type weft_##tag##_prod(type a, type b)                                  \
  {                                                                               \
    return (type)(utype)((utype)a * (utype)b);                                    \
  }                                                                               \
  WEFT_HD type weft_##tag##_max(type a, type b) { return a > b ? a : b; }         \
  WEFT_HD type weft_##tag##_min(type a, type b) { return a < b ? a : b; }

/* the product of two promoted 8-bit values fits in int, so no overflow */
WEFT_REDUCE_INT_OPS(i8, int8_t, uint8_t)
WEFT_REDUCE_INT_OPS(u8, uint8_t, uint8_t)
WEFT_REDUCE_INT_OPS(i32, int32_t, uint32_t)
WEFT_REDUCE_INT_OPS(u32, uint32_t, uint32_t)
WEFT_REDUCE_INT_OPS(i64, int64_t, uint64_t)
WEFT_REDUCE_INT_OPS(u64, uint64_t, uint64_t)

WEFT_HD int8_t weft_i8_div(int8_t a, int divisor) { return (int8_t)(a / divisor); }
WEFT_HD uint8_t weft_u8_div(uint8_t a, int divisor) { return (uint8_t)(a / (unsigned)divisor); }
WEFT_HD int32_t weft_i32_div(int32_t a, int divisor) { return a / (int32_t)divisor; }
WEFT_HD uint32_t weft_u32_div(uint32_t a, int divisor) { return a / (uint32_t)divisor; }
WEFT_HD int64_t weft_i64_div(int64_t a, int divisor) { return a / (int64_t)divisor; }
WEFT_HD uint64_t weft_u64_div(uint64_t a, int divisor) { return a / (uint64_t)divisor; }

/* --- float32 / float64 ---------------------------------------------------- */

/* NaN tests on the bits, so that -ffast-math cannot drop them */
WEFT_HD int weft_fp_f32_isnan(float a) { return (weft_fp_f32_bits(a) & 0x7fffffffu) > 0x7f800000u; }
WEFT_HD int weft_fp_f64_isnan(double a)
{
  return (weft_fp_f64_bits(a) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}

WEFT_HD float weft_f32_sum(float a, float b) { return a + b; }
WEFT_HD float weft_f32_prod(float a, float b) { return a * b; }
/* A NaN wins over a number. Of two NaNs, the one whose bits are larger as
 * an unsigned integer: whichever operand holds it (a ring's ranks reduce
 * the same two values in either order, and every rank must hold the same
 * bits). */
WEFT_HD float weft_f32_max(float a, float b)
{
  if (weft_fp_f32_isnan(a))
    return weft_fp_f32_isnan(b) && weft_fp_f32_bits(b) > weft_fp_f32_bits(a) ? b : a;
  if (weft_fp_f32_isnan(b)) return b;
  if (a == b) return (weft_fp_f32_bits(a) >> 31) ? b : a; /* +0 beats -0 */
  return a > b ? a : b;
}
WEFT_HD float weft_f32_min(float a, float b)
{
  if (weft_fp_f32_isnan(a))
    return weft_fp_f32_isnan(b) && weft_fp_f32_bits(b) > weft_fp_f32_bits(a) ? b : a;
  if (weft_fp_f32_isnan(b)) return b;
  if (a == b) return (weft_fp_f32_bits(a) >> 31) ? a : b; /* -0 beats +0 */
  return a < b ? a : b;
}
WEFT_HD float weft_f32_div(float a, int divisor) { return a / (float)divisor; }

WEFT_HD double weft_f64_sum(double a, double b) { return a + b; }
WEFT_HD double weft_f64_prod(double a, double b) { return a * b; }
WEFT_HD double weft_f64_max(double a, double b)
{
  if (weft_fp_f64_isnan(a))
    return weft_fp_f64_isnan(b) && weft_fp_f64_bits(b) > weft_fp_f64_bits(a) ? b : a;
  if (weft_fp_f64_isnan(b)) return b;
  if (a == b) return (weft_fp_f64_bits(a) >> 63) ? b : a;
  return a > b ? a : b;
}
WEFT_HD double weft_f64_min(double a, double b)
{
  if (weft_fp_f64_isnan(a))
    return weft_fp_f64_isnan(b) && weft_fp_f64_bits(b) > weft_fp_f64_bits(a) ? b : a;
  if (weft_fp_f64_isnan(b)) return b;
  if (a == b) return (weft_fp_f64_bits(a) >> 63) ? a : b;
  return a < b ? a : b;
}
WEFT_HD double weft_f64_div(double a, int divisor) { return a / (double)divisor; }

/* --- low precision: through float, rounded back --------------------------- */

#define WEFT_REDUCE_LOWP_OPS(tag, type)                                           \
  WEFT_HD type weft_##tag##_sum(type a, type b)                                   \
  {                                                                               \
    return weft_f32_to_##tag(weft_##tag##_to_f32(a) + weft_##tag##_to_f32(b));    \
  }                                                                               \
  WEFT_HD type weft_##tag##_prod(type a, type b)                                  \
  {                                                                               \
    return weft_f32_to_##tag(weft_##tag##_to_f32(a) * weft_##tag##_to_f32(b));    \
  }                                                                               \
  /* max and min pick an input, bits and all: a round trip through float     \
   * would saturate e5m2's infinities to +-57344; of two NaNs, the larger     \
   * bits, as an unsigned integer */                                           \
  WEFT_HD type weft_##tag##_max(type a, type b)                                   \
  {                                                                               \
    const float fa = weft_##tag##_to_f32(a), fb = weft_##tag##_to_f32(b);         \
    if (weft_fp_f32_isnan(fa)) return weft_fp_f32_isnan(fb) && b > a ? b : a;     \
    if (weft_fp_f32_isnan(fb)) return b;                                          \
    if (fa == fb) return (weft_fp_f32_bits(fa) >> 31) ? b : a; /* +0 beats -0 */  \
    return fa > fb ? a : b;                                                       \
  }                                                                               \
  WEFT_HD type weft_##tag##_min(type a, type b)                                   \
  {                                                                               \
    const float fa = weft_##tag##_to_f32(a), fb = weft_##tag##_to_f32(b);         \
    if (weft_fp_f32_isnan(fa)) return weft_fp_f32_isnan(fb) && b > a ? b : a;     \
    if (weft_fp_f32_isnan(fb)) return b;                                          \
    if (fa == fb) return (weft_fp_f32_bits(fa) >> 31) ? a : b; /* -0 beats +0 */  \
    return fa < fb ? a : b;                                                       \
  }                                                                               \
  WEFT_HD type weft_##tag##_div(type a, int divisor)                              \
  {                                                                               \
    return weft_f32_to_##tag(weft_##tag##_to_f32(a) / (float)divisor);           \
  }

WEFT_REDUCE_LOWP_OPS(f16, uint16_t)
WEFT_REDUCE_LOWP_OPS(bf16, uint16_t)
WEFT_REDUCE_LOWP_OPS(e4m3, uint8_t)
WEFT_REDUCE_LOWP_OPS(e5m2, uint8_t)

#endif /* WEFT_REDUCE_OPS_H */
