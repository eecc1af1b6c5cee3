/* The parameters' accessors, which warn about ignored values and refuse
 * values out of range, and the tables' reset and listings. Loading into the
 * cache is param_load.c's. */
#include "param.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

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

/* A string param's value among its choices, or unset. */
static weftResult_t param_choice_checked(struct weft_param *p) {
  const char *v = param_str(p);
  if (v == NULL || p->choices == NULL) return weftSuccess;
  char known[128] = "";
  size_t len = 0;
  for (const char *const *c = p->choices; *c != NULL; c++) {
    if (strcasecmp(v, *c) == 0) return weftSuccess;
    if (len < sizeof known)
      len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", len ? ", " : "", *c);
  }
  return weft_error_set(weftInvalidArgument, "%s=%s: unknown; must be one of %s", p->name, v,
                        known);
}

weftResult_t param_tables_check(struct weft_param *const *tables) {
  for (; *tables != NULL; tables++)
    for (struct weft_param *p = *tables; p->name != NULL; p++)
      if (p->type == PARAM_INT && param_has_range(p) && p->out_of_range == PARAM_RANGE_ERROR) {
        int64_t v;
        WEFT_TRY(param_int_checked(p, &v));
      } else if (p->type == PARAM_STR) {
        WEFT_TRY(param_choice_checked(p));
      }
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

/* What p's value is, as weft uses it: an integer's value once parsed (64K
 * as 65536), and what became of a value set that is not taken as written. */
static void param_effective(struct weft_param *p, char *buf, size_t n) {
  const char *v = param_str(p);
  if (p->type == PARAM_STR) {
    snprintf(buf, n, "%s", v != NULL ? v : "(unset)");
    return;
  }
  const int64_t iv = param_int(p);
  const char *env = param_env_str(p);
  int64_t parsed = 0;
  if (env == NULL) {
    snprintf(buf, n, "%lld", (long long)iv);
    if (v == NULL && p->default_str == NULL) snprintf(buf, n, "(unset)");
  } else if (param_parse_int(env, &parsed) != 0) {
    snprintf(buf, n, "%lld (set to \"%s\": not an integer, the default taken)", (long long)iv,
             env);
  } else if (param_has_range(p) && (parsed < p->min || parsed > p->max)) {
    if (p->out_of_range == PARAM_RANGE_ERROR)
      snprintf(buf, n, "%s (out of %lld to %lld: a communicator refuses to form)", env,
               (long long)p->min, (long long)p->max);
    else
      snprintf(buf, n, "%lld (set to %s, out of %lld to %lld: the nearest end taken)",
               (long long)iv, env, (long long)p->min, (long long)p->max);
  } else {
    char dec[32];
    snprintf(dec, sizeof dec, "%lld", (long long)iv);
    if (strcmp(dec, env) == 0) snprintf(buf, n, "%s", dec);
    else snprintf(buf, n, "%s (set to %s)", dec, env);
  }
}

void param_tables_print(struct weft_param *const *tables, FILE *out) {
  for (; *tables != NULL; tables++) {
    for (struct weft_param *p = *tables; p->name != NULL; p++) {
      char v[384];
      param_effective(p, v, sizeof v);
      fprintf(out, "%-24s = %-12s (default %s)  %s\n", p->name, v,
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
      else if (p->choices != NULL)
        for (const char *const *c = p->choices; *c != NULL; c++)
          fprintf(out, "%s`%s`", c == p->choices ? " | " : ", ", *c);
      else fprintf(out, " | ");
      fprintf(out, " | %s", p->doc);
      if (p->agree) fprintf(out, ". The same on every rank: a communicator whose ranks differ "
                                 "refuses to form, naming it and the ranks");
      if (p->see != NULL) fprintf(out, " ([%s](%s))", p->see, p->see);
      fprintf(out, " |\n");
    }
  }
}

uint64_t param_hash(const void *data, size_t nbytes) {
  const unsigned char *b = data;
  uint64_t h = 14695981039346656037ull; /* FNV-1a */
  for (size_t i = 0; i < nbytes; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* The string's hash, never 0, which stands for unset. */
static int64_t text_hash(const char *s) {
  const uint64_t h = param_hash(s, strlen(s));
  return (int64_t)(h == 0 ? 1 : h);
}

const struct weft_param *param_agreed(struct weft_param *const *tables, int i) {
  for (; *tables != NULL; tables++)
    for (const struct weft_param *p = *tables; p->name != NULL; p++)
      if (p->agree && i-- == 0) return p;
  return NULL;
}

void param_agreement_fill(struct weft_param *const *tables, struct param_agreement *out) {
  memset(out, 0, sizeof *out);
  for (; *tables != NULL; tables++) {
    for (struct weft_param *p = *tables; p->name != NULL; p++) {
      if (!p->agree) continue;
      if (out->count == PARAM_AGREE_MAX) {
        WEFT_WARN(LOG_INIT, "%s is not compared between ranks: more than %d settings are marked "
                  "so", p->name, PARAM_AGREE_MAX);
        continue;
      }
      const int i = out->count++;
      if (p->type == PARAM_INT) {
        out->value[i] = param_int(p);
        continue;
      }
      const char *s = param_str(p);
      if (s == NULL || *s == '\0') continue; /* unset, and empty as unset */
      out->value[i] = text_hash(s);
      if (strlen(s) < PARAM_AGREE_TEXT) snprintf(out->text[i], PARAM_AGREE_TEXT, "%s", s);
      else snprintf(out->text[i], PARAM_AGREE_TEXT, "%.*s...", PARAM_AGREE_TEXT - 4, s);
    }
  }
}

uint64_t param_agreement_digest(const struct param_agreement *a) {
  const int n = a->count < 0 ? 0 : a->count < PARAM_AGREE_MAX ? a->count : PARAM_AGREE_MAX;
  return param_hash(a->value, sizeof a->value[0] * (size_t)n) ^ (uint64_t)n;
}

void param_agreement_format(struct weft_param *const *tables, const struct param_agreement *a,
                            int i, char *buf, size_t n) {
  const struct weft_param *p = param_agreed(tables, i);
  if (p == NULL || i < 0 || i >= a->count || i >= PARAM_AGREE_MAX) {
    snprintf(buf, n, "?");
    return;
  }
  if (p->type == PARAM_INT) {
    snprintf(buf, n, "%lld", (long long)a->value[i]);
    return;
  }
  /* the text came from another rank: bounded, whatever it holds */
  const int len = (int)strnlen(a->text[i], PARAM_AGREE_TEXT - 1);
  if (len == 0) snprintf(buf, n, "it unset");
  else if (len < PARAM_AGREE_TEXT - 1) snprintf(buf, n, "\"%.*s\"", len, a->text[i]);
  else snprintf(buf, n, "\"%.*s\" (hash %016llx)", len, a->text[i],
                (unsigned long long)a->value[i]); /* cut: two may read alike */
}
