/* Environment parameters: each module declares one table of WEFT_* variables
 * (name, type, default, range, one-line doc) in its own header, and the
 * library's one ordered list of tables (collectives/api/config.c) names
 * every table. A value is read once, on first use, and cached;
 * param_tables_reset() forgets the cache (tests). */
#ifndef WEFT_PARAM_H
#define WEFT_PARAM_H

#include <stdint.h>
#include <stdio.h>

#include "param_load.h"
#include "status.h"

/* The first read of p (and the first after param_tables_reset): loads it,
 * warning once about a value that is not an integer. */
void param_load_warn(struct weft_param *p);

/* Cached values; an ignored value is warned about once. Inline: a loaded
 * value is one acquire load (a plain load on x86) and the value, so that
 * the paths every call takes can afford to read their settings. */
static inline int64_t param_int(struct weft_param *p) {
  if (__builtin_expect(!__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE), 0)) param_load_warn(p);
  return p->ival;
}
/* NULL when unset and without default. */
static inline const char *param_str(struct weft_param *p) {
  if (__builtin_expect(!__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE), 0)) param_load_warn(p);
  return p->sval;
}
/* Counts the events after which a call's memo (collectives/api/enqueue.c)
 * no longer holds: a reset of the cached values (param_tables_reset) and a
 * communicator freed (its address may come back as another's). */
extern uint64_t weft_memo_epoch;
static inline uint64_t weft_memo_epoch_get(void) {
  return __atomic_load_n(&weft_memo_epoch, __ATOMIC_ACQUIRE);
}
static inline void weft_memo_invalidate(void) {
  __atomic_add_fetch(&weft_memo_epoch, 1, __ATOMIC_ACQ_REL);
}

/* param_int, refused when out of p's range (PARAM_RANGE_ERROR): returns
 * weftInvalidArgument and the message "NAME=VALUE: must be MIN to MAX". */
weftResult_t param_int_checked(struct weft_param *p, int64_t *value_out);

/* param_int_checked of every integer param of the NULL-terminated list of
 * tables that has a range and refuses values out of it: the first refusal. */
weftResult_t param_tables_check(struct weft_param *const *tables);

/* For variables that may change between calls of one process (a launcher's):
 * the environment's value now, uncached, the default ignored. NULL when
 * unset or empty. */
const char *param_env_str(const struct weft_param *p);
/* As param_env_str, a decimal integer in p's range: 1 and *value_out set, 0
 * when unset or empty, -1 when it is not such an integer. */
int param_env_int(const struct weft_param *p, int64_t *value_out);

/* This process's values of the params marked .agree in the NULL-terminated
 * list of tables (param_load.h's struct param_agreement), loading them. */
void param_agreement_fill(struct weft_param *const *tables, struct param_agreement *out);
/* The i-th param marked .agree in the tables, or NULL past the last. */
const struct weft_param *param_agreed(struct weft_param *const *tables, int i);
/* A 64-bit hash (FNV-1a) of nbytes at data. */
uint64_t param_hash(const void *data, size_t nbytes);
/* A hash of a's values, which ranks compare first. */
uint64_t param_agreement_digest(const struct param_agreement *a);
/* Entry i of a (which may come from another rank) as text: the integer, or the
 * string quoted, with its hash where it was cut ("it unset" when unset). */
void param_agreement_format(struct weft_param *const *tables, const struct param_agreement *a,
                            int i, char *buf, size_t n);

/* Forgets cached values of every param in the NULL-terminated list of tables. */
void param_tables_reset(struct weft_param *const *tables);
/* Prints name, value, default and doc of each param. */
void param_tables_print(struct weft_param *const *tables, FILE *out);
/* Prints one markdown table of every param: name, default, range, doc (and
 * a link to its page of docs/). The values are not read. */
void param_tables_markdown(struct weft_param *const *tables, FILE *out);



#endif
