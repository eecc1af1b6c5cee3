/* Every module's parameter table (collectives/api/config.c). */
#ifndef WEFT_CONFIG_H
#define WEFT_CONFIG_H

#include "../../transport/base/param.h"
#include "../../transport/base/peer_info.h"

/* Every table of every module, NULL-terminated, in layer order. */
extern struct weft_param *const weft_param_tables[];

/* Forgets every cached value (tests change the environment between runs). */
void weft_params_reset(void);

/* What a communicator's ranks must share, as this rank has it, into self:
 * its channels and the settings marked .agree (param_agreement_fill). */
void config_agreement_fill(struct peer_info *self, int nchannels);

/* Whether every rank of peers (exchanged at set-up) has what
 * config_agreement_fill put there: weftSuccess, else weftInvalidUsage
 * naming each setting that differs and which ranks have which value (the
 * same text on every rank, which all refuse the communicator). */
weftResult_t config_agreement_check(const struct peer_info *peers, int nranks);

#endif
