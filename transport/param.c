#include "param.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* Parses an integer with an optional K/M/G suffix (powers of 1024); a value
 * that does not fit 64 bits once scaled is not an integer. */
static int parse_int(const char *s, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (errno != 0 || end == s) return -1;
  long long scale = 1;
  switch (*end) {
    case 'k': case 'K': scale = 1024; end++; break;
    case 'm': case 'M': scale = 1024 * 1024; end++; break;
    case 'g': case 'G': scale = 1024LL * 1024 * 1024; end++; break;
    default: break;
  }
  if (*end != '\0' || __builtin_mul_overflow(v, scale, &v)) return -1;
  *out = v;
  return 0;
}

/* Loads are rare (first use, after a reset) and may come from any thread:
 * one at a time, so no thread reads a value while another writes it. */
static pthread_mutex_t param_mutex = PTHREAD_MUTEX_INITIALIZER;

static void param_load(struct weft_param *p) {
  if (__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&param_mutex);
  if (__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE)) {
    pthread_mutex_unlock(&param_mutex);
    return;
  }
  const char *env = getenv(p->name);
  const char *text = env != NULL && env[0] != '\0' ? env : p->default_str;
  int ignored = 0;
  p->sval = text;
  p->ival = 0;
  if (p->type == PARAM_INT && text != NULL && parse_int(text, &p->ival) != 0) {
    ignored = env == text;
    if (p->default_str != NULL) parse_int(p->default_str, &p->ival);
    p->sval = p->default_str;
  }
  __atomic_store_n(&p->loaded, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&param_mutex);
  /* after the unlock: logging reads its own parameters */
  if (ignored) WEFT_WARN(LOG_INIT, "ignoring %s=%s: not an integer", p->name, env);
}

int64_t param_int(struct weft_param *p) {
  param_load(p);
  return p->ival;
}

const char *param_str(struct weft_param *p) {
  param_load(p);
  return p->sval;
}

void param_tables_reset(struct weft_param *const *tables) {
  for (; *tables != NULL; tables++)
    for (struct weft_param *p = *tables; p->name != NULL; p++)
      __atomic_store_n(&p->loaded, 0, __ATOMIC_RELEASE);
  weft_log_level_now = -1;
}

void param_tables_print(struct weft_param *const *tables, FILE *out) {
  for (; *tables != NULL; tables++) {
    for (struct weft_param *p = *tables; p->name != NULL; p++) {
      const char *v = param_str(p);
      fprintf(out, "%-24s = %-12s (default %s)  %s\n", p->name, v ? v : "(unset)",
              p->default_str ? p->default_str : "unset", p->doc);
    }
  }
}
