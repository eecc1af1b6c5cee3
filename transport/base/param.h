/* Environment parameters: each module declares one table of WEFT_* variables
 * (name, type, default, one-line doc). A value is read once, on first use,
 * and cached; param_tables_reset() forgets the cache (tests). */
#ifndef WEFT_PARAM_H
#define WEFT_PARAM_H

#include <stdint.h>
#include <stdio.h>

#include "param_load.h"

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
extern struct weft_param sock_params[];
extern struct weft_param shm_params[];
extern struct weft_param socket_params[];
extern struct weft_param ucx_params[]; /* builds with UCX only */
extern struct weft_param wait_params[];
extern struct weft_param transport_params[];
extern struct weft_param topo_params[];


#endif
