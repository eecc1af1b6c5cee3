/* Reading the environment at each call, with range-checked integers. */
#include "env.h"

#include <errno.h>
#include <stdlib.h>

const char *env_str(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

int env_parse_int(const char *text, int64_t min, int64_t max, int64_t *value_out) {
  char *end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < min || v > max) return -1;
  *value_out = v;
  return 0;
}

int env_int(const char *name, int64_t min, int64_t max, int64_t *value_out) {
  const char *text = env_str(name);
  if (text == NULL) return 0;
  return env_parse_int(text, min, max, value_out) == 0 ? 1 : -1;
}
