/* A parameter (one WEFT_* variable) and its loading from the environment into
 * its cache: a leaf that logs nothing, so that log.c can read its own
 * parameters through it. The accessors that warn are param.h's. */
#ifndef WEFT_PARAM_LOAD_H
#define WEFT_PARAM_LOAD_H

#include <stdint.h>

enum param_type { PARAM_INT, PARAM_STR };

struct weft_param {
  const char *name;        /* full variable name, e.g. "WEFT_TIMEOUT" */
  enum param_type type;
  const char *default_str; /* default as text (NULL: unset) */
  const char *doc;
  /* cache, filled on first read */
  int loaded;
  int64_t ival;
  const char *sval;
};

#define PARAM_END {NULL, PARAM_INT, NULL, NULL, 0, 0, NULL}

/* Fills p's cache from the environment on first use; logs nothing, so that
 * log.c can read its own parameters with it. Returns the environment's text
 * when it was not an integer and the default was taken instead (on the load
 * that found it only), else NULL. */
const char *param_load(struct weft_param *p);

#endif
