/* A parameter (one WEFT_* variable) and its loading from the environment into
 * its cache: a leaf that logs nothing, so that log.c can read its own
 * parameters through it. The accessors that warn are param.h's. */
#ifndef WEFT_PARAM_LOAD_H
#define WEFT_PARAM_LOAD_H

#include <stdint.h>

enum param_type { PARAM_INT, PARAM_STR };

/* What a PARAM_INT value outside [min, max] becomes. A value that is not an
 * integer at all is warned about and the default taken, whatever this says. */
enum param_out_of_range {
  PARAM_RANGE_ERROR, /* kept as it is; param_int_checked refuses it, naming the range */
  PARAM_RANGE_CLAMP, /* the nearest end of the range, silently */
};

/* The first seven fields are positional (name, type, default, doc and the
 * cache); tables name the rest, e.g.
 *   {.name = "WEFT_NSLOTS", .type = PARAM_INT, .default_str = "8", .min = 2,
 *    .max = 64, .doc = "FIFO slots per connection"} */
struct weft_param {
  const char *name;        /* full variable name, e.g. "WEFT_TIMEOUT" */
  enum param_type type;
  const char *default_str; /* default as text (NULL: unset) */
  const char *doc;         /* what it means; markdown's backticks allowed */
  /* cache, filled on first read */
  int loaded;
  int64_t ival;
  const char *sval;
  /* PARAM_INT: the values accepted, min to max; min == max == 0: any */
  int64_t min, max;
  enum param_out_of_range out_of_range;
  /* PARAM_STR: the values accepted, NULL-terminated (matched ignoring case;
   * param_tables_check refuses any other); NULL: any */
  const char *const *choices;
  const char *see; /* a page of docs/ that says more (e.g. "cuda.md"), or NULL */
  int agree;       /* 1: the same on every rank of a communicator, which refuses to form
                      where it differs (struct param_agreement) */
};

/* The values of the params marked .agree as one rank has them, in the
 * tables' order. A communicator's ranks exchange a digest of them when it
 * forms, and the whole only where digests differ, to name what differs.
 * Integers as loaded; strings as a hash of their text (0 unset, or a key
 * of their meaning: config_agreement_fill), with the text to name them by,
 * cut to fit and then ending in "...". */
#define PARAM_AGREE_MAX 16
#define PARAM_AGREE_TEXT 64
struct param_agreement {
  int32_t count;
  int32_t unused;
  int64_t value[PARAM_AGREE_MAX];
  char text[PARAM_AGREE_MAX][PARAM_AGREE_TEXT]; /* strings only; "" unset */
};

#define PARAM_END {NULL, PARAM_INT, NULL, NULL, 0, 0, NULL}

/* 1 when p has a range (min..max). */
static inline int param_has_range(const struct weft_param *p) {
  return p->type == PARAM_INT && (p->min != 0 || p->max != 0);
}

/* Parses an integer with an optional K/M/G suffix (powers of 1024): 0, or -1
 * when s is not one or does not fit 64 bits once scaled. */
int param_parse_int(const char *s, int64_t *out);

/* Fills p's cache from the environment on first use; logs nothing, so that
 * log.c can read its own parameters with it. Returns the environment's text
 * when it was not an integer and the default was taken instead (on the load
 * that found it only), else NULL. */
const char *param_load(struct weft_param *p);

#endif
