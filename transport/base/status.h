/* Status propagation and last-error text, shared by every layer. */
#ifndef WEFT_STATUS_H
#define WEFT_STATUS_H

#include "../../include/weft.h"
#include "log.h"

/* Records the thread's last error text and returns code. The text is what
 * weftGetLastError shows; it is also logged at WARN unless quiet. */
weftResult_t weft_error_set(weftResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Like weft_error_set, for a failed system call: appends strerror(errno). */
weftResult_t weft_error_errno(weftResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The calling thread's last error text ("" if none). */
const char *weft_error_text(void);
/* Records text as the process's last failure returned to a caller (an
 * error set and then recovered from is not one). */
void weft_error_publish(const char *text);
/* The process's last failure on any thread ("" if none), copied for the
 * calling thread: valid until its next call here. */
const char *weft_error_text_process(void);
/* The calling thread's last error text (status.c's; weft_error_text). */
#define WEFT_ERROR_TEXT_NBYTES 1024
extern __thread char weft_error_text_buf[WEFT_ERROR_TEXT_NBYTES];
/* Forgets the calling thread's last error text (every API call begins so). */
static inline void weft_error_clear(void) { weft_error_text_buf[0] = '\0'; }

/* Logs "-> <code's text>" at file:line at WEFT_DEBUG=TRACE: a frame of the
 * backtrace WEFT_TRY leaves. */
void weft_log_trace_frame(const char *file, int line, weftResult_t res);

/* Propagates a failure, logging file:line at each frame (a free backtrace
 * at WEFT_DEBUG=TRACE). weftInProgress passes through silently. */
#define WEFT_TRY(call)                                                          \
  do {                                                                          \
    weftResult_t try_res_ = (call);                                             \
    if (try_res_ != weftSuccess) {                                              \
      if (try_res_ != weftInProgress)                                           \
        weft_log_trace_frame(__FILE__, __LINE__, try_res_);                     \
      return try_res_;                                                          \
    }                                                                           \
  } while (0)

/* As WEFT_TRY, but stores the code in res and jumps to a cleanup label. */
#define WEFT_TRY_GOTO(call, res, label)                                         \
  do {                                                                          \
    (res) = (call);                                                             \
    if ((res) != weftSuccess) {                                                 \
      weft_log_trace_frame(__FILE__, __LINE__, (res));                          \
      goto label;                                                               \
    }                                                                           \
  } while (0)

#endif
