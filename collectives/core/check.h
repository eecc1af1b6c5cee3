/* A collective's signature: what every rank of a call must agree on. WEFT_CHECK=1
 * allgathers it before each collective (collectives/core/check.c); the single-copy
 * path (collectives/algo/cma.c) carries it in the address exchange it makes anyway,
 * so there the check is always on. */
#ifndef WEFT_CHECK_H
#define WEFT_CHECK_H

#include <stdint.h>

#include "../../include/weft.h"

struct weft_plan;

#define CHECK_SIG_MAGIC 0x77636b73u /* "wcks" */

/* Fixed size and no padding, so that it travels as bytes. */
struct check_sig {
  uint32_t magic;
  int32_t coll;
  uint64_t seq; /* the call's number among those checked on the comm, from 1; 0: not counted */
  uint64_t count;
  int32_t datatype;
  int32_t op;
  int32_t root;
  int32_t reserved;
};
_Static_assert(sizeof(struct check_sig) == 40, "check_sig must have no hidden padding");

/* The signature of plan's call, numbered seq. */
void check_sig_init(struct check_sig *sig, const struct weft_plan *plan, uint64_t seq);

/* Compares every rank's signature (sigs[nranks], the same array on every
 * rank). On a mismatch returns weftInvalidUsage with a text that starts with
 * who and names the ranks and the fields that differ, the same text on every
 * rank; the op and root count only for collectives that have them. */
weftResult_t check_compare(const struct check_sig *sigs, int nranks, const char *who);
/* The same for signatures of some ranks only: sigs[i] is rank ranks[i]'s. */
weftResult_t check_compare_ranks(const struct check_sig *sigs, const int *ranks, int nranks,
                                 const char *who);

struct weftComm;
/* WEFT_CHECK=1: allgathers plan's signature (collective, count, datatype, op,
 * root, sequence number) over the bootstrap and returns weftInvalidUsage on
 * every rank, with a message naming the ranks and what differs, when they do
 * not all match. Blocks until every rank has called it
 * or the timeout. Otherwise, and for sends and receives, returns weftSuccess
 * at once, with no traffic. */
weftResult_t check_signatures(struct weftComm *comm, const struct weft_plan *plan);

#endif
