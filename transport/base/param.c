/* The parameters' accessors, which warn about ignored values, and the tables'
 * reset and listing. Loading into the cache is param_load.c's. */
#include "param.h"

#include "log.h"

/* A value found not to be an integer is said once, on the load that found it. */
static void param_warn_ignored(const struct weft_param *p, const char *ignored) {
  if (ignored != NULL) WEFT_WARN(LOG_INIT, "ignoring %s=%s: not an integer", p->name, ignored);
}

int64_t param_int(struct weft_param *p) {
  param_warn_ignored(p, param_load(p));
  return p->ival;
}

const char *param_str(struct weft_param *p) {
  param_warn_ignored(p, param_load(p));
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
