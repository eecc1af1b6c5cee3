/* Loading a parameter's value from the environment into its cache. A leaf
 * (it logs nothing): log.c reads its own parameters through it, and
 * param.c's accessors warn about what it ignored. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "param_load.h"

int param_parse_int(const char *s, int64_t *out) {
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

const char *param_load(struct weft_param *p) {
  if (__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE)) return NULL;
  pthread_mutex_lock(&param_mutex);
  if (__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE)) {
    pthread_mutex_unlock(&param_mutex);
    return NULL;
  }
  const char *env = getenv(p->name);
  const char *text = env != NULL && env[0] != '\0' ? env : p->default_str;
  int ignored = 0;
  p->sval = text;
  p->ival = 0;
  if (p->type == PARAM_INT && text != NULL && param_parse_int(text, &p->ival) != 0) {
    ignored = env == text;
    if (p->default_str != NULL) param_parse_int(p->default_str, &p->ival);
    p->sval = p->default_str;
  } else if (text != NULL && param_has_range(p) && p->out_of_range == PARAM_RANGE_CLAMP) {
    p->ival = p->ival < p->min ? p->min : p->ival > p->max ? p->max : p->ival;
  }
  __atomic_store_n(&p->loaded, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&param_mutex);
  return ignored ? env : NULL;
}

