/* The parameters' accessors, which warn about ignored values and refuse
 * values out of range, and the tables' reset and listings. Loading into the
 * cache is param_load.c's. */
#include "param.h"

#include "env.h"
#include "log.h"

uint64_t weft_memo_epoch;

/* A value found not to be an integer is said once, on the load that found it. */
void param_load_warn(struct weft_param *p) {
  const char *ignored = param_load(p);
  if (ignored != NULL) WEFT_WARN(LOG_INIT, "ignoring %s=%s: not an integer", p->name, ignored);
}

weftResult_t param_int_checked(struct weft_param *p, int64_t *value_out) {
  int64_t v = param_int(p);
  if (param_has_range(p) && (v < p->min || v > p->max))
    return weft_error_set(weftInvalidArgument, "%s=%lld: must be %lld to %lld", p->name,
                          (long long)v, (long long)p->min, (long long)p->max);
  *value_out = v;
  return weftSuccess;
}

const char *param_env_str(const struct weft_param *p) { return env_str(p->name); }

int param_env_int(const struct weft_param *p, int64_t *value_out) {
  return env_int(p->name, param_has_range(p) ? p->min : INT64_MIN,
                 param_has_range(p) ? p->max : INT64_MAX, value_out);
}

void param_tables_reset(struct weft_param *const *tables) {
  for (; *tables != NULL; tables++)
    for (struct weft_param *p = *tables; p->name != NULL; p++)
      __atomic_store_n(&p->loaded, 0, __ATOMIC_RELEASE);
  weft_log_level_now = -1;
  weft_memo_invalidate();
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

void param_tables_markdown(struct weft_param *const *tables, FILE *out) {
  fprintf(out, "| variable | default | range | meaning |\n|---|---|---|---|\n");
  for (; *tables != NULL; tables++) {
    for (const struct weft_param *p = *tables; p->name != NULL; p++) {
      fprintf(out, "| `%s` | ", p->name);
      if (p->default_str != NULL) fprintf(out, "`%s`", p->default_str);
      else fprintf(out, "unset");
      if (param_has_range(p)) fprintf(out, " | %lld to %lld", (long long)p->min, (long long)p->max);
      else fprintf(out, " | ");
      fprintf(out, " | %s", p->doc);
      if (p->see != NULL) fprintf(out, " ([%s](%s))", p->see, p->see);
      fprintf(out, " |\n");
    }
  }
}
