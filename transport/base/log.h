/* Leveled, per-subsystem logging: WEFT_DEBUG=WARN|INFO|TRACE, WEFT_DEBUG_SUBSYS=
 * INIT,BOOTSTRAP,SHM,NET,COLL,ALL (a leading ^ excludes). Lines carry a
 * host:pid:tid prefix and go to stderr, WEFT_DEBUG_FILE, or a sink set by
 * tests. */
#ifndef WEFT_LOG_H
#define WEFT_LOG_H

#include <stdarg.h>
#include "../../include/weft.h"
#include "param_load.h"

/* The log's settings: WEFT_DEBUG, WEFT_DEBUG_SUBSYS, WEFT_DEBUG_FILE. */
extern struct weft_param log_params[];

enum weft_log_level { LOG_NONE = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_TRACE = 3 };

enum weft_log_subsys {
  LOG_INIT = 1u << 0,
  LOG_BOOTSTRAP = 1u << 1,
  LOG_SHM = 1u << 2,
  LOG_NET = 1u << 3,
  LOG_COLL = 1u << 4,
  LOG_ALL = 0xffffu
};

extern int weft_log_level_now; /* -1 until first read */

int weft_log_level(void);
void weft_log(enum weft_log_level level, unsigned subsys, const char *file, int line,
              const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A sink receives each formatted line (without trailing newline) instead of
 * the file; NULL restores the default. For tests. */
typedef void (*weft_log_sink_fn)(int level, const char *line, void *ctx);
void weft_log_set_sink(weft_log_sink_fn fn, void *ctx);

#define WEFT_LOG_(lvl, sub, ...)                                                \
  do {                                                                          \
    if (weft_log_level() >= (lvl)) weft_log((lvl), (sub), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define WEFT_WARN(sub, ...) WEFT_LOG_(LOG_WARN, sub, __VA_ARGS__)
#define WEFT_INFO(sub, ...) WEFT_LOG_(LOG_INFO, sub, __VA_ARGS__)
#define WEFT_TRACE(sub, ...) WEFT_LOG_(LOG_TRACE, sub, __VA_ARGS__)

#endif
