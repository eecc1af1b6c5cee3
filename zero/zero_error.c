/* The thread's last ZeRO error text (weftZeroLastError), the conversion of
 * weft's failures at the boundary, and an engine's incomplete state. A leaf:
 * calls nothing else in zero/. */
#include <stdarg.h>
#include <stdio.h>

#include "zero_internal.h"

static __thread char zero_error_text[1024];

weftResult_t zero_fail(weftResult_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(zero_error_text, sizeof zero_error_text, fmt, ap);
  va_end(ap);
  return code;
}

weftResult_t zero_break(struct weftZero *z, weftResult_t code, const char *fmt, ...) {
  char what[128], why[sizeof zero_error_text];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(why, sizeof why, "%s", zero_error_text);
  snprintf(z->broken, sizeof z->broken, "%s failed (%.240s)", what, why);
  return zero_fail(code,
                   "%s: %s; the training state is incomplete: load a checkpoint (weftZeroLoad) "
                   "or destroy the engine",
                   what, why);
}

weftResult_t zero_sound(const struct weftZero *z) {
  if (z->broken[0] == '\0') return weftSuccess;
  return zero_fail(weftInvalidUsage,
                   "the training state is incomplete since %s: load a checkpoint (weftZeroLoad) "
                   "or destroy the engine",
                   z->broken);
}

weftResult_t zero_fail_weft(weftResult_t code, weftComm_t comm, const char *what) {
  const char *text = weftGetLastError(NULL);
  if (text[0] == '\0' && comm != NULL) text = weftGetLastError(comm);
  return zero_fail(code, "%s: %s (%s)", what, text, weftGetErrorString(code));
}

weftResult_t zero_weft(const struct weftZero *z, weftResult_t res, const char *what) {
  return res == weftSuccess ? weftSuccess : zero_fail_weft(res, z->comm, what);
}

const char *weftZeroLastError(void) { return zero_error_text; }
