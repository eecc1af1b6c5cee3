/* Every module's parameter table (collectives/api/config.c). */
#ifndef WEFT_CONFIG_H
#define WEFT_CONFIG_H

#include "../../transport/base/param.h"
#include "../../transport/base/peer_info.h"
#include "../../transport/bootstrap/bootstrap.h"

/* Every table of every module, NULL-terminated, in layer order. */
extern struct weft_param *const weft_param_tables[];

/* Forgets every cached value (tests change the environment between runs). */
void weft_params_reset(void);

/* What a communicator's ranks must share, as this rank has it: its channels
 * and the digest of its settings marked .agree into self, the settings
 * themselves into *mine (WEFT_ALGO and WEFT_PROTO as keys of what they
 * allow, so that equal meanings agree however written). */
void config_agreement_fill(struct peer_info *self, int nchannels, struct param_agreement *mine);

/* Whether every rank of peers (exchanged at set-up) has the same channels and
 * digest, and none refused: weftSuccess, else, after one exchange of the
 * settings over bs (every rank sees the same peers, so all take part),
 * weftRemoteError naming the ranks that refused and why (refusal: this
 * rank's reason, "" when it did not), or weftInvalidUsage naming each
 * setting that differs and which ranks have which value: the same text on
 * every rank, which all refuse the communicator. */
weftResult_t config_agreement_check(struct bootstrap *bs, const struct peer_info *peers,
                                    int nranks, int rank, const struct param_agreement *mine,
                                    const char *refusal);

#endif
