/* The device side's argument checks and error texts (zero_device.h); the
 * kernels are zero_device_kernels.cu. Without CUDA (ZERO_HAVE_CUDA 0) every
 * call is refused, saying so. */
#include "zero_device.h"

#include "zero_internal.h"

#ifndef ZERO_HAVE_CUDA
#define ZERO_HAVE_CUDA 0
#endif

#define ZERO_NO_CUDA "weft_zero was built without CUDA: device buffers are refused"

/* The checks every call makes before it launches. */
static weftResult_t zero_dev_check(const char *what, size_t count, const void *a, const void *b,
                                   const void *c) {
  if (!ZERO_HAVE_CUDA) return zero_fail(weftInvalidUsage, "%s: " ZERO_NO_CUDA, what);
  if (count > 0 && (a == NULL || b == NULL || c == NULL))
    return zero_fail(weftInvalidArgument, "%s: NULL buffer with %zu elements", what, count);
  return weftSuccess;
}

static weftResult_t zero_dev_type(const char *what, weftDataType_t type) {
  if (!zero_type_ok(type))
    return zero_fail(weftInvalidArgument, "%s: type %d is not fp32, bf16 or fp16", what, type);
  return weftSuccess;
}

/* kind for zero_kern_*: 0 fp32, 1 bf16, 2 fp16 */
static int zero_dev_kind(weftDataType_t type) {
  return type == weftBfloat16 ? 1 : type == weftFloat16 ? 2 : 0;
}

#if ZERO_HAVE_CUDA
static weftResult_t zero_dev_launched(const char *what, int err) {
  if (err == 0) return weftSuccess;
  return zero_fail(weftUnhandledCudaError, "%s: %s", what, zero_kern_error(err));
}
#define ZERO_LAUNCH(what, call) zero_dev_launched(what, call)
#else
/* the call is not made (sizeof does not evaluate it) and needs no kernels */
#define ZERO_LAUNCH(what, call)                                                 \
  (sizeof(call) ? zero_fail(weftInvalidUsage, "%s: " ZERO_NO_CUDA, what) : weftSuccess)
#endif

int zero_dev_available(void) {
#if ZERO_HAVE_CUDA
  return zero_kern_device_count() > 0;
#else
  return 0;
#endif
}

weftResult_t zero_dev_load_scaled(const void *src, weftDataType_t type, float *dst, size_t count,
                                  double scale, double *stats, void *stream) {
  static const char what[] = "loading gradients on the device";
  WEFT_TRY(zero_dev_check(what, count, src, dst, stats));
  WEFT_TRY(zero_dev_type(what, type));
  return ZERO_LAUNCH(what, zero_kern_load_scaled(src, zero_dev_kind(type), dst, count, scale,
                                                 stats, stream));
}

weftResult_t zero_dev_store(const float *src, weftDataType_t type, void *dst, size_t count,
                            void *stream) {
  static const char what[] = "converting on the device";
  WEFT_TRY(zero_dev_check(what, count, src, dst, dst));
  WEFT_TRY(zero_dev_type(what, type));
  return ZERO_LAUNCH(what, zero_kern_store(src, zero_dev_kind(type), dst, count, stream));
}

weftResult_t zero_dev_accumulate(void *dst, weftDataType_t type, const float *src, size_t count,
                                 void *stream) {
  static const char what[] = "accumulating on the device";
  WEFT_TRY(zero_dev_check(what, count, src, dst, dst));
  WEFT_TRY(zero_dev_type(what, type));
  return ZERO_LAUNCH(what, zero_kern_accumulate(dst, zero_dev_kind(type), src, count, stream));
}

weftResult_t zero_dev_add(void *dst, const void *src, weftDataType_t type, size_t count,
                          void *stream) {
  static const char what[] = "adding gradients on the device";
  WEFT_TRY(zero_dev_check(what, count, src, dst, dst));
  WEFT_TRY(zero_dev_type(what, type));
  return ZERO_LAUNCH(what, zero_kern_add(dst, zero_dev_kind(type), src, count, stream));
}

weftResult_t zero_dev_scale(float *g, size_t count, float factor, void *stream) {
  static const char what[] = "scaling gradients on the device";
  WEFT_TRY(zero_dev_check(what, count, g, g, g));
  return ZERO_LAUNCH(what, zero_kern_scale(g, count, factor, stream));
}

weftResult_t zero_dev_adamw(float *p, float *m, float *v, const float *g, size_t count,
                            const struct zero_adamw_coef *coef, void *stream) {
  static const char what[] = "AdamW on the device";
  WEFT_TRY(zero_dev_check(what, count, p, m, v));
  WEFT_TRY(zero_dev_check(what, count, g, g, g));
  if (coef == NULL) return zero_fail(weftInvalidArgument, "%s: coefficients are NULL", what);
  return ZERO_LAUNCH(what, zero_kern_adamw(p, m, v, g, count, coef, stream));
}

weftResult_t zero_dev_sgd(float *p, float *m, const float *g, size_t count, float mu, float lr,
                          float wd, void *stream) {
  static const char what[] = "SGD on the device";
  WEFT_TRY(zero_dev_check(what, count, p, m, g));
  return ZERO_LAUNCH(what, zero_kern_sgd(p, m, g, count, mu, lr, wd, stream));
}
