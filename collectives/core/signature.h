/* A collective's signature: what every rank of a call must agree on. WEFT_CHECK=1
 * allgathers it before each collective (collectives/core/signature.c). The always-on
 * comparison carries it, packed in 16 bytes, in the first message of the call
 * on every connection a path uses: the single-copy path's address exchange
 * (collectives/algo/cma.c), the first slots of recursive doubling, the trees
 * and the ring (SIMPLE and LL), and a slot of its own on the ring connections
 * that a rooted collective sends no data over (docs/signature.md). */
#ifndef WEFT_SIGNATURE_H
#define WEFT_SIGNATURE_H

#include <assert.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "../../include/weft.h"
#include "../../transport/base/param.h"
#include "params.h"
#include "plan.h"

#define SIGNATURE_MAGIC 0x77636b73u /* "wcks" */

/* 1: recursive doubling and the ring carry the signature in their first
 * slots (the always-on comparison). 0 only to measure what that costs: they then
 * carry none, and a mismatch there goes unseen without WEFT_CHECK=1
 * (meson setup -Dc_args=-DWEFT_SLOT_SIGNATURE=0 -Dtests=false). The
 * single-copy path's comparison (sizes included) is never compiled out. */
#ifndef WEFT_SLOT_SIGNATURE
#define WEFT_SLOT_SIGNATURE 1
#endif

/* Fixed size and no padding, so that it travels as bytes. */
struct signature {
  uint32_t magic;
  int32_t coll;
  uint64_t seq; /* the call's number among those compared on the comm, from 1; 0: not counted */
  uint64_t count;
  int32_t datatype;
  int32_t op;
  int32_t root;
  int32_t seq_modulo; /* 0: seq is whole; SIGNATURE_SEQ_MODULO: seq is its remainder, as packed */
};
static_assert(sizeof(struct signature) == 40, "signature must have no hidden padding");

/* The signature of plan's call, numbered seq. */
void signature_init(struct signature *sig, const struct weft_plan *plan, uint64_t seq);

#define SIGNATURE_PACKED_MAGIC 0xa5u
/* What a packed signature keeps of the call's number: its remainder. */
#define SIGNATURE_SEQ_MODULO 256
/* Roots fit the packed signature's 24 bits; comms are no larger. */
#define SIGNATURE_MAX_RANKS (1 << 23)

/* The signature as a message carries it: 16 bytes, stored with the data it
 * follows and compared with one 128-bit comparison. Every field is whole (an
 * exact comparison, no hash) but the call's number, of which it keeps the
 * remainder modulo 256: coll, datatype and op fit a byte each (an op of
 * weftRedOpCreatePreMulSum runs as a sum, so no algorithm sees an op at or
 * above weftNumOps), the root 24 bits. So a call that one rank skipped (one
 * it refused alone, say) differs from the peers' pending one by its number
 * even where every other field agrees, rather than pairing with it. The
 * magic byte tells a signature from data only when naming a mismatch. */
struct signature_packed {
  uint64_t count;
  uint32_t root_seq; /* the root, two's complement in the low 24 bits; above, seq % 256 */
  uint8_t coll;
  uint8_t datatype;
  uint8_t op;
  uint8_t magic; /* SIGNATURE_PACKED_MAGIC */
};
static_assert(sizeof(struct signature_packed) == 16, "signature_packed is one 128-bit word");
static_assert(weftNumTypes <= 256 && weftNumOps <= 256, "datatype and op fit a byte");

/* The collectives whose signatures must match on every rank, and which take
 * a number; sends and receives differ between peers by design. */
static inline int coll_is_compared(enum coll_kind c) {
  return c != COLL_SEND && c != COLL_RECV && (unsigned)c < COLL_NUM;
}

/* Gives plan's call its number from the comm's count (*counter): every
 * compared collective issued takes the next, where it is issued (or, in a
 * group, at the group's end; signature_skipped for one that never runs), so
 * that ranks issuing the same calls number them alike. */
static inline void signature_number(uint64_t *counter, struct weft_plan *plan) {
  if (coll_is_compared(plan->coll)) plan->sig_seq = (uint32_t)++*counter;
}

/* The signature as the ring's SIMPLE slots carry it: sig with its count
 * mixed with the connection's step (the slot's number). A slot is written
 * over and over; bytes an earlier call left where this call's signature is
 * looked for never read as it, since they were mixed with another step. */
static inline void signature_packed_keyed(struct signature_packed *out,
                                          const struct signature_packed *sig, uint64_t step) {
  *out = *sig;
  out->count ^= (step + 1) * 0x9e3779b97f4a7c15ull;
}

/* The packed signature of plan's call. */
static inline void signature_pack(struct signature_packed *out, const struct weft_plan *plan) {
  *out = (struct signature_packed){.count = (uint64_t)plan->count,
                                   .root_seq = ((uint32_t)plan->root & 0xffffffu) |
                                               (uint32_t)(plan->sig_seq % SIGNATURE_SEQ_MODULO)
                                                   << 24,
                                   .coll = (uint8_t)plan->coll,
                                   .datatype = (uint8_t)plan->datatype,
                                   .op = (uint8_t)(plan->avg_prescaled ? weftAvg : plan->op),
                                   .magic = SIGNATURE_PACKED_MAGIC};
}
/* The full form of a packed signature (its seq the remainder, seq_modulo
 * SIGNATURE_SEQ_MODULO), for signature_compare_ranks; magic is
 * SIGNATURE_MAGIC only where the packed one's is SIGNATURE_PACKED_MAGIC. */
void signature_unpack(struct signature *out, const struct signature_packed *in);

/* Whether the 16 bytes at theirs (any alignment) are the signature mine. */
static inline int signature_packed_same(const void *theirs, const struct signature_packed *mine) {
#if defined(__SSE2__)
  const __m128i a = _mm_loadu_si128((const __m128i *)theirs);
  const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)mine);
  return _mm_movemask_epi8(_mm_cmpeq_epi8(a, b)) == 0xffff;
#else
  uint64_t a[2], b[2];
  memcpy(a, theirs, sizeof a);
  memcpy(b, mine, sizeof b);
  return ((a[0] ^ b[0]) | (a[1] ^ b[1])) == 0;
#endif
}

/* Compares every rank's signature (sigs[nranks], the same array on every
 * rank). On a mismatch returns weftInvalidUsage with a text that starts with
 * who and names the ranks and the fields that differ, the same text on every
 * rank; the op and root count only for collectives that have them. */
weftResult_t signature_compare(const struct signature *sigs, int nranks, const char *who);
/* The same for signatures of some ranks only: sigs[i] is rank ranks[i]'s. */
weftResult_t signature_compare_ranks(const struct signature *sigs, const int *ranks, int nranks,
                                     const char *who);

/* Whether sigs[nranks] number their calls differently: ranks out of step (one
 * skipped a call the others made), which no later call mends, so that a path
 * whose comparison otherwise leaves the comm working breaks it. */
int signature_out_of_step(const struct signature *sigs, int nranks);

struct weftComm;
/* WEFT_CHECK=1: allgathers plan's signature (collective, count, datatype, op,
 * root, sequence number) over the bootstrap and returns weftInvalidUsage on
 * every rank, with a message naming the ranks and what differs, when they do
 * not all match. Blocks until every rank has called it
 * or the timeout. Otherwise, and for sends and receives, returns weftSuccess
 * at once, with no traffic. */
weftResult_t signature_agree_checked(struct weftComm *comm, const struct weft_plan *plan);
/* A collective that this rank does not issue (refused before it ran, or of
 * no elements where nothing runs) still takes its number, so that a rank
 * that skipped a call its peers made differs from them by the number at its
 * next call rather than pairing that call with the peers' pending one. */
void signature_skipped(struct weftComm *comm, const struct weft_plan *plan);
/* Whether WEFT_CHECK=1 compares every collective over the bootstrap: one load. */
static inline int signature_checking(void) { return param_int(&coll_params[P_CHECK]) != 0; }
/* signature_agree's answer without WEFT_CHECK, inline: one load. */
static inline weftResult_t signature_agree(struct weftComm *comm, const struct weft_plan *plan) {
  if (__builtin_expect(!signature_checking(), 1)) return weftSuccess;
  return signature_agree_checked(comm, plan);
}

#endif
