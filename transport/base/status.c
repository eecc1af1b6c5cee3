#include "status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__thread char weft_error_text_buf[WEFT_ERROR_TEXT_NBYTES];

/* The last failure returned to a caller on any thread (weft_error_publish),
 * for weft_error_text_process: a copy under a spin flag held for a memcpy,
 * the flag holding the holder's pid. A flag held in a parent when it forked
 * is taken over by the child (another pid); bounded spins otherwise. */
static char process_text[sizeof weft_error_text_buf];
static int process_text_owner;
static _Thread_local char process_copy[sizeof weft_error_text_buf];

static int process_text_lock(void) {
  const int me = (int)getpid();
  for (int i = 0; i < 100000; i++) {
    int holder = __atomic_load_n(&process_text_owner, __ATOMIC_RELAXED);
    if (holder != 0 && holder != me) { /* a parent's, inherited across fork */
      if (__atomic_compare_exchange_n(&process_text_owner, &holder, me, 0, __ATOMIC_ACQUIRE,
                                      __ATOMIC_RELAXED))
        return 1;
      continue;
    }
    int free_ = 0;
    if (holder == 0 && __atomic_compare_exchange_n(&process_text_owner, &free_, me, 0,
                                                   __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
      return 1;
  }
  return 0;
}
static void process_text_unlock(void) { __atomic_store_n(&process_text_owner, 0, __ATOMIC_RELEASE); }

/* Formats into a scratch buffer first: callers may pass the current text as
 * an argument ("...: %s", weft_error_text()) to add context to it. */
static weftResult_t error_vset(weftResult_t code, int errnum, const char *fmt, va_list ap) {
  char text[sizeof weft_error_text_buf];
  int o = vsnprintf(text, sizeof text, fmt, ap);
  if (errnum != 0 && o >= 0 && o < (int)sizeof text)
    snprintf(text + o, sizeof text - o, ": %s", strerror(errnum));
  memcpy(weft_error_text_buf, text, sizeof text);
  WEFT_INFO(LOG_ALL, "error %s: %s", weftGetErrorString(code), weft_error_text_buf);
  return code;
}

weftResult_t weft_error_set(weftResult_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  error_vset(code, 0, fmt, ap);
  va_end(ap);
  return code;
}

weftResult_t weft_error_errno(weftResult_t code, const char *fmt, ...) {
  int errnum = errno;
  va_list ap;
  va_start(ap, fmt);
  error_vset(code, errnum, fmt, ap);
  va_end(ap);
  return code;
}

const char *weft_error_text(void) { return weft_error_text_buf; }

void weft_error_publish(const char *text) {
  if (text == NULL || text[0] == '\0' || !process_text_lock()) return;
  snprintf(process_text, sizeof process_text, "%s", text);
  process_text_unlock();
}

const char *weft_error_text_process(void) {
  process_copy[0] = '\0';
  if (process_text_lock()) {
    memcpy(process_copy, process_text, sizeof process_copy);
    process_text_unlock();
  }
  return process_copy;
}


void weft_log_trace_frame(const char *file, int line, weftResult_t res) {
  if (weft_log_level() >= LOG_TRACE)
    weft_log(LOG_TRACE, LOG_ALL, file, line, "-> %s", weftGetErrorString(res));
}

const char *weftGetErrorString(weftResult_t result) {
  switch (result) {
    case weftSuccess: return "no error";
    case weftUnhandledCudaError: return "unhandled cuda error";
    case weftSystemError: return "unhandled system error";
    case weftInternalError: return "internal error";
    case weftInvalidArgument: return "invalid argument";
    case weftInvalidUsage: return "invalid usage";
    case weftRemoteError: return "remote process exited, failed or timed out";
    case weftInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}
