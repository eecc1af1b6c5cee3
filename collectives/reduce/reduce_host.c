/* Host reduction loops, one per (datatype, op), generated below from one
 * type list. The loops are plain indexed loops without restrict: gcc versions
 * them with a runtime alias check whose vector path admits exact aliasing
 * (dst == a), so in-place reductions vectorise too. */
#include <string.h>

#include "reduce_host.h"
#include "reduce_ops.h"

/* with a second destination, work in blocks so that dst0 is still in cache
 * when it is copied to dst1 */
#define REDUCE_HOST_BLOCK_NBYTES 8192

/* gcc's -O2 cost model vectorises no loop of unknown length: ask for the -O3
 * model on the loops; hot float loops also get AVX2/AVX-512 clones, picked at
 * load time (not under ThreadSanitizer: the clones' resolvers run during
 * relocation, before its runtime is up, and crash when instrumented) */
#if defined(__GNUC__) && !defined(__clang__)
#define REDUCE_HOST_PLAIN __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define REDUCE_HOST_PLAIN
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(WEFT_NO_TARGET_CLONES) && !defined(__SANITIZE_THREAD__)
#define REDUCE_HOST_CLONES \
  REDUCE_HOST_PLAIN __attribute__((target_clones("avx2", "avx512f", "default")))
#else
#define REDUCE_HOST_CLONES REDUCE_HOST_PLAIN
#endif

/* datatype enum, type tag, element type, loop attribute */
#define REDUCE_HOST_TYPES(X)                                                      \
  X(weftInt8, i8, int8_t, REDUCE_HOST_PLAIN)                                      \
  X(weftUint8, u8, uint8_t, REDUCE_HOST_PLAIN)                                    \
  X(weftInt32, i32, int32_t, REDUCE_HOST_PLAIN)                                   \
  X(weftUint32, u32, uint32_t, REDUCE_HOST_PLAIN)                                 \
  X(weftInt64, i64, int64_t, REDUCE_HOST_PLAIN)                                   \
  X(weftUint64, u64, uint64_t, REDUCE_HOST_PLAIN)                                 \
  X(weftFloat16, f16, uint16_t, REDUCE_HOST_PLAIN)                                \
  X(weftFloat32, f32, float, REDUCE_HOST_CLONES)                                  \
  X(weftFloat64, f64, double, REDUCE_HOST_CLONES)                                 \
  X(weftBfloat16, bf16, uint16_t, REDUCE_HOST_PLAIN)                              \
  X(weftFloat8e4m3, e4m3, uint8_t, REDUCE_HOST_PLAIN)                             \
  X(weftFloat8e5m2, e5m2, uint8_t, REDUCE_HOST_PLAIN)

/* dst[i] = a[i] op b[i], divided when divisor > 1; count elements */
typedef void (*reduce_host_loop_fn)(void *dst, const void *a, const void *b, size_t count,
                                    int divisor);

static void reduce_host_run(void *dst0, void *dst1, const void *a, const void *b,
                            size_t count, int divisor, size_t elem_nbytes,
                            reduce_host_loop_fn loop)
{
  if (dst1 == NULL || dst1 == dst0) {
    loop(dst0, a, b, count, divisor);
    return;
  }
  size_t block_count = REDUCE_HOST_BLOCK_NBYTES / elem_nbytes;
  for (size_t done = 0; done < count; done += block_count) {
    size_t n = count - done < block_count ? count - done : block_count;
    size_t off_nbytes = done * elem_nbytes;
    char *d0 = (char *)dst0 + off_nbytes;
    /* a block of a or b is fully read before dst1 (which may be a or b)
     * overwrites it */
    loop(d0, (const char *)a + off_nbytes, (const char *)b + off_nbytes, n, divisor);
    memcpy((char *)dst1 + off_nbytes, d0, n * elem_nbytes);
  }
}

/* one (type, op): the element loop and its weft_reduce_fn */
#define REDUCE_HOST_LOOP(tag, type, op, attr)                                     \
  attr static void reduce_host_##tag##_##op##_loop(void *dst, const void *a,      \
                                                   const void *b, size_t count,   \
                                                   int divisor)                   \
  {                                                                               \
    type *d = (type *)dst;                                                        \
    const type *x = (const type *)a;                                              \
    const type *y = (const type *)b;                                              \
    if (divisor > 1) {                                                            \
      for (size_t i = 0; i < count; i++)                                          \
        d[i] = weft_##tag##_div(weft_##tag##_##op(x[i], y[i]), divisor);          \
    } else {                                                                      \
      for (size_t i = 0; i < count; i++) d[i] = weft_##tag##_##op(x[i], y[i]);    \
    }                                                                             \
  }                                                                               \
  static void reduce_host_##tag##_##op(void *dst0, void *dst1, const void *a,     \
                                       const void *b, size_t count, int divisor)  \
  {                                                                               \
    reduce_host_run(dst0, dst1, a, b, count, divisor, sizeof(type),               \
                    reduce_host_##tag##_##op##_loop);                             \
  }

/* one type: its final division (divisor > 1) */
#define REDUCE_HOST_DIVIDE(tag, type, attr)                                       \
  attr static void reduce_host_##tag##_divide(void *dst, const void *src,         \
                                              size_t count, int divisor)          \
  {                                                                               \
    type *d = (type *)dst;                                                        \
    const type *s = (const type *)src;                                            \
    for (size_t i = 0; i < count; i++) d[i] = weft_##tag##_div(s[i], divisor);    \
  }

#define REDUCE_HOST_DEFINE_TYPE(dtype, tag, type, attr)                           \
  REDUCE_HOST_LOOP(tag, type, sum, attr)                                          \
  REDUCE_HOST_LOOP(tag, type, prod, attr)                                         \
  REDUCE_HOST_LOOP(tag, type, max, attr)                                          \
  REDUCE_HOST_LOOP(tag, type, min, attr)                                          \
  REDUCE_HOST_DIVIDE(tag, type, attr)

REDUCE_HOST_TYPES(REDUCE_HOST_DEFINE_TYPE)

#define REDUCE_HOST_FN_ROW(dtype, tag, type, attr)                                \
  [dtype] = {                                                                     \
      [weftSum] = reduce_host_##tag##_sum,                                        \
      [weftProd] = reduce_host_##tag##_prod,                                      \
      [weftMax] = reduce_host_##tag##_max,                                        \
      [weftMin] = reduce_host_##tag##_min,                                        \
  },

/* weftAvg has no column: it is the sum loop */
static const weft_reduce_fn reduce_host_fns[weftNumTypes][weftAvg] = {
    REDUCE_HOST_TYPES(REDUCE_HOST_FN_ROW)};

typedef void (*reduce_host_divide_fn)(void *dst, const void *src, size_t count, int divisor);

#define REDUCE_HOST_DIVIDE_ROW(dtype, tag, type, attr) [dtype] = reduce_host_##tag##_divide,

static const reduce_host_divide_fn reduce_host_divide_fns[weftNumTypes] = {
    REDUCE_HOST_TYPES(REDUCE_HOST_DIVIDE_ROW)};

static const size_t reduce_host_elem_nbytes[weftNumTypes] = {
#define REDUCE_HOST_SIZE_ROW(dtype, tag, type, attr) [dtype] = sizeof(type),
    REDUCE_HOST_TYPES(REDUCE_HOST_SIZE_ROW)
#undef REDUCE_HOST_SIZE_ROW
};

weft_reduce_fn reduce_host_fn(weftDataType_t datatype, weftRedOp_t op)
{
  if ((unsigned)datatype >= weftNumTypes || (unsigned)op >= weftNumOps) return NULL;
  if (op == weftAvg) op = weftSum;
  return reduce_host_fns[datatype][op];
}

void reduce_host_divide(weftDataType_t datatype, void *dst, const void *src, size_t count,
                        int divisor)
{
  if ((unsigned)datatype >= weftNumTypes || count == 0) return;
  if (divisor > 1)
    reduce_host_divide_fns[datatype](dst, src, count, divisor);
  else if (dst != src)
    memcpy(dst, src, count * reduce_host_elem_nbytes[datatype]);
}

#if defined(__x86_64__)
#include <immintrin.h>

/* Streaming stores of [s, s + nbytes) to every one of ndsts destinations,
 * which share their offset within a 64-byte line: each line of s is loaded
 * once and stored to every destination, so a copy to several ranks reads its
 * source once and keeps every write stream busy together (copying to one
 * destination after another moved 10-30 % less on an AMD EPYC, 2 ranks).
 * No fence: the caller fences once at the end. */
__attribute__((target("avx512f"))) static void copy_stream_lines_avx512(char *const *dsts, int ndsts,
                                                                        const char *s,
                                                                        size_t nlines) {
  for (size_t i = 0; i < nlines; i++, s += 64) {
    __m512i v = _mm512_loadu_si512((const void *)s);
    for (int k = 0; k < ndsts; k++) _mm512_stream_si512((void *)(dsts[k] + i * 64), v);
  }
}

__attribute__((target("avx2"))) static void copy_stream_lines_avx2(char *const *dsts, int ndsts,
                                                                    const char *s, size_t nlines) {
  for (size_t i = 0; i < nlines; i++, s += 64) {
    __m256i a = _mm256_loadu_si256((const __m256i *)s), b = _mm256_loadu_si256((const __m256i *)s + 1);
    for (int k = 0; k < ndsts; k++) {
      __m256i *d = (__m256i *)(dsts[k] + i * 64);
      _mm256_stream_si256(d, a);
      _mm256_stream_si256(d + 1, b);
    }
  }
}

static void copy_stream_lines_sse2(char *const *dsts, int ndsts, const char *s, size_t nlines) {
  for (size_t i = 0; i < nlines; i++, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)s + 1),
            c = _mm_loadu_si128((const __m128i *)s + 2), e = _mm_loadu_si128((const __m128i *)s + 3);
    for (int k = 0; k < ndsts; k++) {
      __m128i *d = (__m128i *)(dsts[k] + i * 64);
      _mm_stream_si128(d, a);
      _mm_stream_si128(d + 1, b);
      _mm_stream_si128(d + 2, c);
      _mm_stream_si128(d + 3, e);
    }
  }
}

enum stream_isa stream_isa_best(void) {
  static int known; /* 0 unknown; threads that race find the same */
  int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
  if (k == 0) {
    __builtin_cpu_init();
    k = __builtin_cpu_supports("avx512f")  ? STREAM_ISA_AVX512
        : __builtin_cpu_supports("avx2") ? STREAM_ISA_AVX2
                                          : STREAM_ISA_SSE2;
    __atomic_store_n(&known, k, __ATOMIC_RELAXED);
  }
  return (enum stream_isa)k;
}

/* isa as the loops take it: BEST resolved, and never above what the CPU has. */
static enum stream_isa stream_isa_resolve(enum stream_isa isa) {
  const enum stream_isa best = stream_isa_best();
  return isa == STREAM_ISA_BEST || isa > best ? best : isa;
}

void copy_host_stream_to_isa(void *const *dsts, int ndsts, const void *src, size_t nbytes,
                             enum stream_isa isa) {
  if (ndsts <= 0 || nbytes == 0) return;
  isa = stream_isa_resolve(isa);
  const uintptr_t mis = (uintptr_t)dsts[0] & 63;
  for (int k = 1; k < ndsts; k++)
    if (((uintptr_t)dsts[k] & 63) != mis) { /* no common line grid: one at a time */
      for (int j = 0; j < ndsts; j++) copy_host_stream_to_isa(&dsts[j], 1, src, nbytes, isa);
      return;
    }
  enum { max_dsts = 16 };
  char *d[max_dsts];
  const char *s = src;
  size_t head = (64 - mis) & 63;
  if (head > nbytes) head = nbytes;
  for (int k0 = 0; k0 < ndsts; k0 += max_dsts) {
    const int m = ndsts - k0 < max_dsts ? ndsts - k0 : max_dsts;
    for (int k = 0; k < m; k++) {
      d[k] = (char *)dsts[k0 + k];
      memcpy(d[k], s, head); /* up to the first line boundary */
      d[k] += head;
    }
    const size_t nlines = (nbytes - head) / 64, tail = (nbytes - head) % 64;
    if (isa == STREAM_ISA_AVX512) copy_stream_lines_avx512(d, m, s + head, nlines);
    else if (isa == STREAM_ISA_AVX2) copy_stream_lines_avx2(d, m, s + head, nlines);
    else copy_stream_lines_sse2(d, m, s + head, nlines);
    for (int k = 0; k < m; k++) memcpy(d[k] + nlines * 64, s + head + nlines * 64, tail);
  }
}

void copy_host_stream_fence(void) { _mm_sfence(); }

/* Reductions whose results go past the caches to several destinations at
 * once (reduce_host_stream_fn): each line of a and b is loaded once, reduced
 * in registers and stored to every destination. f32 and f64 sum and prod
 * (avg: sum, then the division) with AVX-512 or AVX2 (a line in one or two
 * vectors; once past the scalar head the stores are 64-byte aligned); the
 * element arithmetic is the loops' above (IEEE add, multiply, divide: the
 * same bits). */
#define REDUCE_STREAM_SCALAR(type, expr)                                            \
  for (; i < end; i++) {                                                          \
    type x = ((const type *)a)[i], y = ((const type *)b)[i], v = (expr);          \
    if (divisor > 1) v = v / (type)divisor;                                       \
    for (int k = 0; k < ndsts; k++) ((type *)dsts[k])[i] = v;                     \
  }

#define REDUCE_STREAM_LOOP(isa, tgt, mm, tag, type, vec, suffix, lanes, op, expr, vop) \
  __attribute__((target(tgt))) static void reduce_stream_##isa##_##tag##_##op(  \
      void *const *dsts, int ndsts, const void *a, const void *b, size_t count,   \
      int divisor) {                                                              \
    size_t i = 0, end = count;                                                    \
    int grid = ((uintptr_t)dsts[0] % sizeof(type)) == 0;                          \
    for (int k = 1; k < ndsts; k++)                                               \
      grid &= ((uintptr_t)dsts[k] & 63) == ((uintptr_t)dsts[0] & 63);             \
    if (grid) { /* scalar up to the first line boundary, then whole lines */      \
      size_t head = ((64 - ((uintptr_t)dsts[0] & 63)) & 63) / sizeof(type);       \
      end = head < count ? head : count;                                          \
      REDUCE_STREAM_SCALAR(type, expr)                                            \
      const vec d = mm##_set1_##suffix((type)divisor);                            \
      for (; i + lanes <= count; i += lanes) {                                    \
        vec v = vop(mm##_loadu_##suffix((const type *)a + i),                     \
                    mm##_loadu_##suffix((const type *)b + i));                    \
        if (divisor > 1) v = mm##_div_##suffix(v, d);                             \
        for (int k = 0; k < ndsts; k++) mm##_stream_##suffix((type *)dsts[k] + i, v); \
      }                                                                           \
    }                                                                             \
    end = count;                                                                  \
    REDUCE_STREAM_SCALAR(type, expr)                                              \
  }

REDUCE_STREAM_LOOP(avx512, "avx512f", _mm512, f32, float, __m512, ps, 16, sum, x + y, _mm512_add_ps)
REDUCE_STREAM_LOOP(avx512, "avx512f", _mm512, f32, float, __m512, ps, 16, prod, x * y, _mm512_mul_ps)
REDUCE_STREAM_LOOP(avx512, "avx512f", _mm512, f64, double, __m512d, pd, 8, sum, x + y, _mm512_add_pd)
REDUCE_STREAM_LOOP(avx512, "avx512f", _mm512, f64, double, __m512d, pd, 8, prod, x * y, _mm512_mul_pd)
REDUCE_STREAM_LOOP(avx2, "avx2", _mm256, f32, float, __m256, ps, 8, sum, x + y, _mm256_add_ps)
REDUCE_STREAM_LOOP(avx2, "avx2", _mm256, f32, float, __m256, ps, 8, prod, x * y, _mm256_mul_ps)
REDUCE_STREAM_LOOP(avx2, "avx2", _mm256, f64, double, __m256d, pd, 4, sum, x + y, _mm256_add_pd)
REDUCE_STREAM_LOOP(avx2, "avx2", _mm256, f64, double, __m256d, pd, 4, prod, x * y, _mm256_mul_pd)

weft_reduce_stream_fn reduce_host_stream_fn_isa(weftDataType_t datatype, weftRedOp_t op,
                                                enum stream_isa isa) {
  if (isa > stream_isa_best()) return NULL;
  isa = stream_isa_resolve(isa);
  if (isa < STREAM_ISA_AVX2) return NULL;
  if (op == weftAvg) op = weftSum;
  const int wide = isa == STREAM_ISA_AVX512;
  if (datatype == weftFloat32 && op == weftSum)
    return wide ? reduce_stream_avx512_f32_sum : reduce_stream_avx2_f32_sum;
  if (datatype == weftFloat32 && op == weftProd)
    return wide ? reduce_stream_avx512_f32_prod : reduce_stream_avx2_f32_prod;
  if (datatype == weftFloat64 && op == weftSum)
    return wide ? reduce_stream_avx512_f64_sum : reduce_stream_avx2_f64_sum;
  if (datatype == weftFloat64 && op == weftProd)
    return wide ? reduce_stream_avx512_f64_prod : reduce_stream_avx2_f64_prod;
  return NULL;
}

#else
enum stream_isa stream_isa_best(void) { return STREAM_ISA_SSE2; }
void copy_host_stream_to_isa(void *const *dsts, int ndsts, const void *src, size_t nbytes,
                             enum stream_isa isa) {
  (void)isa;
  for (int k = 0; k < ndsts; k++) memcpy(dsts[k], src, nbytes);
}
weft_reduce_stream_fn reduce_host_stream_fn_isa(weftDataType_t datatype, weftRedOp_t op,
                                                enum stream_isa isa) {
  (void)datatype;
  (void)op;
  (void)isa;
  return NULL;
}
void copy_host_stream_fence(void) {}
#endif

void copy_host_stream_to(void *const *dsts, int ndsts, const void *src, size_t nbytes) {
  copy_host_stream_to_isa(dsts, ndsts, src, nbytes, STREAM_ISA_BEST);
}

weft_reduce_stream_fn reduce_host_stream_fn(weftDataType_t datatype, weftRedOp_t op) {
  return reduce_host_stream_fn_isa(datatype, op, STREAM_ISA_BEST);
}

void copy_host_stream(void *dst, const void *src, size_t nbytes) {
  copy_host_stream_to(&dst, 1, src, nbytes);
  copy_host_stream_fence(); /* streaming stores are weakly ordered: fence before others look */
}
