/* NCCL 2.30's parameter access over weft's parameter tables.
 *
 * A key is a weft variable (WEFT_TIMEOUT, as weftConfigPrint lists them) or
 * an NCCL_* variable that weft maps onto one (NCCL_DEBUG -> WEFT_DEBUG). A
 * handle is the table entry itself. Integer parameters read as I64, or as
 * a narrower type when the value fits; string parameters as Str. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_shim.h"

#define PARAM(h) ((struct weft_param *)(h))

static struct weft_param *param_find(const char *key) {
  const char *name = nccl_env_alias(key);
  return compat_param_find(name != NULL ? name : key);
}

NCCL_EXPORT ncclResult_t ncclParamBind(ncclParamHandle_t *out, const char *key) {
  weft_error_clear();
  if (out == NULL || key == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclParamBind: %s is NULL",
                              out == NULL ? "out" : "key"));
  struct weft_param *p = param_find(key);
  if (p == NULL)
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclParamBind: no parameter '%s' (weftConfigPrint lists them)", key));
  *out = (ncclParamHandle_t)p;
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclParamBind);

/* The integer value of h, when it lies in [lo, hi]. */
static ncclResult_t param_get_int(ncclParamHandle_t h, const char *fn, int64_t lo, uint64_t hi,
                                  int64_t *value_out) {
  weft_error_clear();
  struct weft_param *p = PARAM(h);
  if (p == NULL) return RES(weft_error_set(weftInvalidArgument, "%s: handle is NULL", fn));
  if (compat_param_is_text(p))
    return RES(weft_error_set(weftInvalidArgument, "%s: %s is a string (ncclParamGetStr reads it)",
                              fn, compat_param_name(p)));
  int64_t v = compat_param_int(p);
  if (v < lo || (v >= 0 && (uint64_t)v > hi))
    return RES(weft_error_set(weftInvalidArgument, "%s: %s = %lld does not fit", fn,
                              compat_param_name(p), (long long)v));
  *value_out = v;
  return ncclSuccess;
}

#define TYPED_GETTER(suffix, ctype, lo, hi)                                            \
  NCCL_EXPORT ncclResult_t ncclParamGet##suffix(ncclParamHandle_t h, ctype *out) {     \
    int64_t v = 0;                                                                     \
    if (out == NULL)                                                                   \
      return RES(weft_error_set(weftInvalidArgument, "ncclParamGet" #suffix ": out is NULL")); \
    ncclResult_t res = param_get_int(h, "ncclParamGet" #suffix, lo, hi, &v);           \
    if (res == ncclSuccess) *out = (ctype)v;                                           \
    return res;                                                                        \
  }                                                                                    \
  NCCL_PROFILING_ALIAS(ncclParamGet##suffix)

TYPED_GETTER(I8, int8_t, INT8_MIN, INT8_MAX);
TYPED_GETTER(I16, int16_t, INT16_MIN, INT16_MAX);
TYPED_GETTER(I32, int32_t, INT32_MIN, INT32_MAX);
TYPED_GETTER(I64, int64_t, INT64_MIN, INT64_MAX);
TYPED_GETTER(U8, uint8_t, 0, UINT8_MAX);
TYPED_GETTER(U16, uint16_t, 0, UINT16_MAX);
TYPED_GETTER(U32, uint32_t, 0, UINT32_MAX);
TYPED_GETTER(U64, uint64_t, 0, UINT64_MAX);

/* The value as text, in buf: each function that hands it out has a
 * thread's buffer of its own, valid until that function's next call (as
 * NCCL says of ncclParamGetStr's). */
#define PARAM_TEXT_NBYTES 4096
static const char *param_text(struct weft_param *p, char *buf) {
  if (!compat_param_is_text(p)) {
    snprintf(buf, PARAM_TEXT_NBYTES, "%lld", (long long)compat_param_int(p));
  } else {
    const char *v = compat_param_text(p);
    snprintf(buf, PARAM_TEXT_NBYTES, "%s", v != NULL ? v : "");
  }
  return buf;
}

NCCL_EXPORT ncclResult_t ncclParamGetStr(ncclParamHandle_t h, const char **out) {
  weft_error_clear();
  struct weft_param *p = PARAM(h);
  if (p == NULL || out == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclParamGetStr: %s is NULL",
                              p == NULL ? "handle" : "out"));
  if (!compat_param_is_text(p))
    return RES(weft_error_set(weftInvalidArgument,
                              "ncclParamGetStr: %s is an integer (ncclParamGetI64 reads it)",
                              compat_param_name(p)));
  static _Thread_local char buf[PARAM_TEXT_NBYTES];
  *out = param_text(p, buf);
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclParamGetStr);

/* The value's bytes: an int64_t for integers, the text and its NUL for
 * strings. *len is what was copied. */
NCCL_EXPORT ncclResult_t ncclParamGet(ncclParamHandle_t h, void *out, int maxLen, int *len) {
  weft_error_clear();
  struct weft_param *p = PARAM(h);
  if (p == NULL || out == NULL || len == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclParamGet: %s is NULL",
                              p == NULL ? "handle" : out == NULL ? "out" : "len"));
  int64_t v = 0;
  const void *src = &v;
  size_t n = sizeof v;
  if (!compat_param_is_text(p)) {
    v = compat_param_int(p);
  } else {
    static _Thread_local char buf[PARAM_TEXT_NBYTES];
    src = param_text(p, buf);
    n = strlen(src) + 1;
  }
  if (maxLen < 0 || (size_t)maxLen < n)
    return RES(weft_error_set(weftInvalidArgument, "ncclParamGet: %s needs %zu bytes, maxLen is %d",
                              compat_param_name(p), n, maxLen));
  memcpy(out, src, n);
  *len = (int)n;
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclParamGet);

NCCL_EXPORT ncclResult_t ncclParamGetParameter(const char *key, const char **value,
                                               int *valueLen) {
  weft_error_clear();
  if (key == NULL || value == NULL || valueLen == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclParamGetParameter: %s is NULL",
                              key == NULL ? "key" : value == NULL ? "value" : "valueLen"));
  *value = NULL;
  *valueLen = 0;
  struct weft_param *p = param_find(key);
  if (p == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclParamGetParameter: no parameter '%s'", key));
  static _Thread_local char buf[PARAM_TEXT_NBYTES];
  *value = param_text(p, buf);
  *valueLen = (int)strlen(*value);
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclParamGetParameter);

/* The table of names: the thread's, valid until its next call. The names
 * themselves are the parameter tables' and live as long as the library. */
NCCL_EXPORT ncclResult_t ncclParamGetAllParameterKeys(const char ***table, int *tableLen) {
  static _Thread_local const char **keys;
  weft_error_clear();
  if (table == NULL || tableLen == NULL)
    return RES(weft_error_set(weftInvalidArgument, "ncclParamGetAllParameterKeys: %s is NULL",
                              table == NULL ? "table" : "tableLen"));
  int n = 0;
  while (compat_param_at(n) != NULL) n++;
  const char **k = realloc(keys, (size_t)(n > 0 ? n : 1) * sizeof *k);
  if (k == NULL)
    return RES(weft_error_set(weftSystemError, "ncclParamGetAllParameterKeys: out of memory"));
  keys = k;
  for (int i = 0; i < n; i++) keys[i] = compat_param_name(compat_param_at(i));
  *table = keys;
  *tableLen = n;
  return ncclSuccess;
}
NCCL_PROFILING_ALIAS(ncclParamGetAllParameterKeys);

NCCL_EXPORT void ncclParamDumpAll(void) { weftConfigPrint(stdout); }
NCCL_PROFILING_ALIAS(ncclParamDumpAll);
