#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "param_load.h"

struct weft_param log_params[] = {
    {.name = "WEFT_DEBUG", .type = PARAM_STR, .default_str = "WARN",
     .doc = "log level: `NONE`, `WARN`, `INFO` or `TRACE` (TRACE adds file:line and a frame "
            "per propagated error)"},
    {.name = "WEFT_DEBUG_SUBSYS", .type = PARAM_STR, .default_str = "ALL",
     .doc = "subsystems to log at `INFO` and `TRACE`: `INIT,BOOTSTRAP,SHM,NET,COLL,ALL`; a "
            "leading `^` excludes the list; warnings are logged whatever their subsystem"},
    {.name = "WEFT_DEBUG_FILE", .type = PARAM_STR,
     .doc = "log file instead of stderr; `%h` becomes the host name, `%p` the pid, `%%` a `%` "
            "(any other `%` stays as it is)"},
    PARAM_END,
};
enum { P_DEBUG, P_SUBSYS, P_FILE };

/* Through param_load, which never logs: param.c's accessors log. These are
 * strings, never ignored. */
static const char *log_param(int which) {
  param_load(&log_params[which]);
  return log_params[which].sval;
}

int weft_log_level_now = -1;
static unsigned log_subsys_mask = LOG_ALL;
static FILE *log_file;
static weft_log_sink_fn log_sink;
static void *log_sink_ctx;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const struct {
  const char *name;
  unsigned bit;
} subsys_names[] = {{"INIT", LOG_INIT}, {"BOOTSTRAP", LOG_BOOTSTRAP}, {"SHM", LOG_SHM},
                    {"NET", LOG_NET},   {"COLL", LOG_COLL},           {"ALL", LOG_ALL}};

/* The subsystems spec names; *unknown set where it names one that is not. */
static unsigned parse_subsys(const char *spec, int *unknown) {
  int exclude = spec[0] == '^';
  unsigned mask = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", spec + exclude);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int known = 0;
    for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
      if (strcasecmp(tok, subsys_names[i].name) == 0) {
        mask |= subsys_names[i].bit;
        known = 1;
      }
    if (!known) *unknown = 1;
  }
  return exclude ? (LOG_ALL & ~mask) : mask;
}

static const char *subsys_name(unsigned subsys) {
  for (size_t i = 0; i < sizeof subsys_names / sizeof subsys_names[0]; i++)
    if (subsys_names[i].bit == subsys) return subsys_names[i].name;
  return "ALL";
}

static void log_open_file(void) {
  const char *pattern = log_param(P_FILE);
  if (pattern == NULL) return;
  char path[512], host[64] = "";
  gethostname(host, sizeof host - 1);
  size_t o = 0;
  for (const char *c = pattern; *c && o + 32 < sizeof path; c++) {
    if (c[0] == '%' && c[1] == 'h') { o += snprintf(path + o, sizeof path - o, "%s", host); c++; }
    else if (c[0] == '%' && c[1] == 'p') { o += snprintf(path + o, sizeof path - o, "%d", (int)getpid()); c++; }
    else if (c[0] == '%' && c[1] == '%') { path[o++] = '%'; c++; }
    else path[o++] = *c;
  }
  path[o] = '\0';
  log_file = fopen(path, "a");
}

int weft_log_level(void) {
  int lvl = __atomic_load_n(&weft_log_level_now, __ATOMIC_ACQUIRE);
  if (lvl >= 0) return lvl;
  pthread_mutex_lock(&log_lock);
  const char *s = log_param(P_DEBUG);
  lvl = LOG_WARN;
  int bad_level = 0, bad_subsys = 0, bad_file = 0, file_errno = 0;
  if (strcasecmp(s, "NONE") == 0) lvl = LOG_NONE;
  else if (strcasecmp(s, "INFO") == 0) lvl = LOG_INFO;
  else if (strcasecmp(s, "TRACE") == 0) lvl = LOG_TRACE;
  else bad_level = strcasecmp(s, "WARN") != 0;
  const char *subsys = log_param(P_SUBSYS);
  log_subsys_mask = parse_subsys(subsys, &bad_subsys);
  if (log_file == NULL) {
    log_open_file();
    file_errno = errno;
    bad_file = log_file == NULL && log_param(P_FILE) != NULL;
  }
  __atomic_store_n(&weft_log_level_now, lvl, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&log_lock);
  /* said once per reading, the level now set (no recursion) */
  if (bad_level) WEFT_WARN(LOG_ALL, "WEFT_DEBUG=%s: not NONE, WARN, INFO or TRACE: WARN", s);
  if (bad_subsys)
    WEFT_WARN(LOG_ALL, "WEFT_DEBUG_SUBSYS=%s: unknown names ignored (INIT, BOOTSTRAP, SHM, NET, "
              "COLL, ALL)", subsys);
  if (bad_file)
    WEFT_WARN(LOG_ALL, "WEFT_DEBUG_FILE=%s: cannot open it (%s): logging to stderr",
              log_param(P_FILE), strerror(file_errno));
  return lvl;
}

void weft_log_set_sink(weft_log_sink_fn fn, void *ctx) {
  pthread_mutex_lock(&log_lock);
  log_sink = fn;
  log_sink_ctx = ctx;
  pthread_mutex_unlock(&log_lock);
}

void weft_log(enum weft_log_level level, unsigned subsys, const char *file, int line,
              const char *fmt, ...) {
  /* the subsystems filter INFO and TRACE lines; warnings always pass */
  if (weft_log_level() < (int)level || (level > LOG_WARN && !(log_subsys_mask & subsys))) return;
  static const char *level_names[] = {"NONE", "WARN", "INFO", "TRACE"};
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  char msg[1024];
  int o = snprintf(msg, sizeof msg, "%s:%d:%ld weft %s %s ", host, (int)getpid(),
                   (long)syscall(SYS_gettid), level_names[level], subsys_name(subsys));
  if (level == LOG_TRACE) {
    const char *base = strrchr(file, '/');
    o += snprintf(msg + o, sizeof msg - o, "%s:%d ", base ? base + 1 : file, line);
  }
  va_list ap;
  va_start(ap, fmt);
  if (o < (int)sizeof msg) vsnprintf(msg + o, sizeof msg - o, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&log_lock);
  if (log_sink != NULL) {
    log_sink(level, msg, log_sink_ctx);
  } else {
    FILE *out = log_file ? log_file : stderr;
    fprintf(out, "%s\n", msg);
    fflush(out);
  }
  pthread_mutex_unlock(&log_lock);
}
