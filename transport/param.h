/* Environment parameters: each module declares one table of WEFT_* variables
 * (name, type, default, one-line doc). A value is read once, on first use,
 * and cached; param_tables_reset() forgets the cache (tests). */
#ifndef WEFT_PARAM_H
#define WEFT_PARAM_H

#include <stdint.h>
#include <stdio.h>

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

/* Cached values; an ignored value is warned about once. */
int64_t param_int(struct weft_param *p);
/* NULL when unset and without default. */
const char *param_str(struct weft_param *p);
/* Forgets cached values of every param in the NULL-terminated list of tables. */
void param_tables_reset(struct weft_param *const *tables);
/* Prints name, value, default and doc of each param. */
void param_tables_print(struct weft_param *const *tables, FILE *out);

/* The transport layer's tables (log, bootstrap, shm, waits). */
extern struct weft_param log_params[];
extern struct weft_param bootstrap_params[];
extern struct weft_param shm_params[];
extern struct weft_param cuda_params[]; /* cuda_ipc and p2p */
extern struct weft_param socket_params[];
extern struct weft_param ucx_params[]; /* builds with UCX only */
extern struct weft_param wait_params[];
extern struct weft_param transport_params[];
extern struct weft_param topo_params[];

#endif
