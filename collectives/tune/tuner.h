/* The tuner: a cost model of the comm and the call picks algorithm, protocol
 * and channels (collectives/tune/tuner.c; the model: docs/design.md). */
#ifndef WEFT_TUNER_H
#define WEFT_TUNER_H

#include <stdint.h>

#include "../core/plan.h"

/* Chooses algorithm, protocol and channels for plan (its call fields set),
 * within what WEFT_ALGO and WEFT_PROTO allow. Returns 1 when the pick is a
 * pipelined algorithm on host memory: a call of the same arguments on comm
 * then gets the same pick until weft_memo_epoch moves (single copy and bulk,
 * where they were not refused by size or setting, were impossible, which a
 * live comm's transports never undo: its connections stay as made, and a
 * kernel that refused cross-memory attach refuses for good); 0 for single
 * copy, bulk and device memory. */
int plan_tune(const struct weftComm *comm, struct weft_plan *plan);
/* The cost model's time for a tuned plan, in microseconds (weftGroupSimulateEnd). */
double plan_estimate_us(const struct weftComm *comm, const struct weft_plan *plan);
const char *tuner_algo_name(int algo);
/* Whether WEFT_ALGO, as now set, leaves algo to coll (parsed once per
 * value, as plan_tune's rules). */
int tuner_algo_allowed(enum coll_kind coll, enum coll_algo algo);
/* What WEFT_ALGO and WEFT_PROTO allow, each as a key of its meaning (equal
 * for "ring,tree" and "TREE,ring", for unset and every name listed), which
 * ranks compare (config_agreement_fill). */
void tuner_rules_keys(int64_t *algo_key, int64_t *proto_key);
/* Parses a WEFT_ALGO/WEFT_PROTO list into allowed[collective][name index];
 * returns -1 when it met an unknown name (those are ignored). */
int tuner_parse(const char *spec, const char *const *names, int nnames,
                uint8_t allowed[COLL_NUM_RING][8]);

#endif
