/* The process environment read at each call, not cached: the variables of
 * launchers and of other programs (RANK, WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT, OMPI_COMM_WORLD_*, SLURM_*, TORCHELASTIC_*). weft's own
 * WEFT_* variables are settings, read through param.h. */
#ifndef WEFT_ENV_H
#define WEFT_ENV_H

#include <stdint.h>

/* name's value, NULL when unset or empty. */
const char *env_str(const char *name);

/* Parses text as a decimal integer in [min, max]: 0 and *value_out set,
 * else -1 (not an integer, trailing text, or out of the range). */
int env_parse_int(const char *text, int64_t min, int64_t max, int64_t *value_out);

/* name's value as a decimal integer in [min, max]: 1 and *value_out set;
 * 0 when unset or empty; -1 when it is not such an integer. */
int env_int(const char *name, int64_t min, int64_t max, int64_t *value_out);

#endif
