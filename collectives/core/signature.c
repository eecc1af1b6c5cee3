/* WEFT_CHECK=1: before each collective, ranks allgather its signature over
 * the bootstrap and refuse to run it when they disagree. A mismatch (a count,
 * a datatype, a root, or a different collective altogether) otherwise ends in
 * a hang or in wrong data; here every rank returns weftInvalidUsage with the
 * same message, naming the ranks and what differs. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../../transport/base/wait.h"
#include "signature.h"
#include "params.h"
#include "plan.h"
#include "text.h"

enum signature_field { F_COLL, F_SEQ, F_COUNT, F_DATATYPE, F_OP, F_ROOT, F_NUM };
static const char *const field_names[F_NUM] = {"collective", "sequence number", "count",
                                               "datatype", "op", "root"};

static const char *type_name(int32_t t) {
  static const char *const names[weftNumTypes] = {
      "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
      "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
  return t >= 0 && t < weftNumTypes ? names[t] : "?";
}

static const char *op_name(int32_t op) {
  static const char *const names[weftNumOps] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < weftNumOps ? names[op] : "?";
}

static int coll_has_op(int32_t c) {
  return c == COLL_ALLREDUCE || c == COLL_REDUCESCATTER || c == COLL_REDUCE;
}

static uint64_t field_value(const struct signature *s, enum signature_field f) {
  switch (f) {
    case F_COLL: return (uint64_t)(int64_t)s->coll;
    case F_SEQ: return s->seq;
    case F_COUNT: return s->count;
    case F_DATATYPE: return (uint64_t)(int64_t)s->datatype;
    case F_OP: return (uint64_t)(int64_t)s->op;
    case F_ROOT: return (uint64_t)(int64_t)s->root;
    default: return 0;
  }
}

static void field_format(const struct signature *s, enum signature_field f, char *buf, size_t n) {
  switch (f) {
    case F_COLL: snprintf(buf, n, "%s", coll_kind_name((enum coll_kind)s->coll)); break;
    case F_SEQ: snprintf(buf, n, "%" PRIu64, s->seq); break;
    case F_COUNT: snprintf(buf, n, "%" PRIu64, s->count); break;
    case F_DATATYPE: snprintf(buf, n, "%s", type_name(s->datatype)); break;
    case F_OP: snprintf(buf, n, "%s", op_name(s->op)); break;
    case F_ROOT: snprintf(buf, n, "%d", (int)s->root); break;
    default: buf[0] = '\0';
  }
}

/* text_groups' view of one field of the signatures */
struct field_of {
  const struct signature *sigs;
  enum signature_field f;
};
static int64_t field_group_value(const void *ctx, int i) {
  const struct field_of *c = ctx;
  return (int64_t)field_value(&c->sigs[i], c->f);
}
static void field_group_format(const void *ctx, int i, char *buf, size_t n) {
  const struct field_of *c = ctx;
  field_format(&c->sigs[i], c->f, buf, n);
}

/* Appends "rank 3 has X" or "ranks 0-2,5 have X" for each group of ranks that
 * share a value of f. sigs[i] is rank ranks[i]'s (ranks NULL: rank i's). */
static void describe_field(struct text *t, const struct signature *sigs, const int *ranks,
                           int nranks, enum signature_field f, int *members) {
  const struct field_of c = {sigs, f};
  text_groups(t, nranks, ranks, field_group_value, field_group_format, &c, f != F_COLL,
              members);
}

static int field_differs(const struct signature *sigs, int nranks, enum signature_field f) {
  for (int r = 1; r < nranks; r++)
    if (field_value(&sigs[r], f) != field_value(&sigs[0], f)) return 1;
  return 0;
}

weftResult_t signature_compare_ranks(const struct signature *sigs, const int *ranks, int nranks,
                                     const char *who) {
  int first = 0; /* the lowest rank that sent a signature names the call */
  while (first < nranks - 1 && sigs[first].magic != SIGNATURE_MAGIC) first++;
  const char *name = coll_kind_name((enum coll_kind)sigs[first].coll);
  const uint64_t seq = sigs[first].seq;
  char number[32] = ""; /* a whole number names the call */
  if (seq != 0 && sigs[first].seq_modulo == 0) snprintf(number, sizeof number, " #%" PRIu64, seq);
  for (int r = 0; r < nranks; r++)
    if (sigs[r].magic != SIGNATURE_MAGIC)
      return weft_error_set(weftInvalidUsage,
                            "%s: %s%s: rank %d sent no signature: it is in another call on this "
                            "communicator",
                            who, name, number, ranks != NULL ? ranks[r] : r);
  int members_fixed[64];
  int *members = nranks <= 64 ? members_fixed : malloc(sizeof *members * (size_t)nranks);
  if (members == NULL) return weft_error_set(weftSystemError, "%s: out of memory", who);
  char buf[1024] = "";
  struct text t = {.buf = buf, .n = sizeof buf, .len = 0};
  weftResult_t res = weftSuccess;
  if (field_differs(sigs, nranks, F_COLL)) {
    /* the other fields mean different things in different collectives */
    text_add(&t, "%s%s%s: collective differs: ", who, number[0] != '\0' ? ":" : "", number);
    describe_field(&t, sigs, ranks, nranks, F_COLL, members);
    res = weftInvalidUsage;
  } else {
    text_add(&t, "%s: %s%s: ", who, name, number);
    const char *sep = "";
    for (int f = F_SEQ; f < F_NUM; f++) {
      if (f == F_OP && !coll_has_op(sigs[0].coll)) continue;
      if (f == F_ROOT && !coll_has_root(sigs[0].coll)) continue;
      if (!field_differs(sigs, nranks, (enum signature_field)f)) continue;
      if (f == F_SEQ && sigs[first].seq_modulo != 0)
        text_add(&t, "%s%s (modulo %d) differs: ", sep, field_names[f],
                 (int)sigs[first].seq_modulo);
      else
        text_add(&t, "%s%s differs: ", sep, field_names[f]);
      describe_field(&t, sigs, ranks, nranks, (enum signature_field)f, members);
      sep = "; ";
      res = weftInvalidUsage;
    }
  }
  if (members != members_fixed) free(members);
  if (res != weftSuccess) weft_error_set(res, "%s", t.buf);
  return res;
}

weftResult_t signature_compare(const struct signature *sigs, int nranks, const char *who) {
  return signature_compare_ranks(sigs, NULL, nranks, who);
}

int signature_out_of_step(const struct signature *sigs, int nranks) {
  return field_differs(sigs, nranks, F_SEQ);
}

void signature_init(struct signature *sig, const struct weft_plan *plan, uint64_t seq) {
  /* a pre-multiplied sum is a sum, whatever each rank's scalar (a handle of
   * the rank's own, as NCCL's): as the data paths sign it (run_premul) */
  const int32_t op = plan->op < weftNumOps ? (int32_t)plan->op : (int32_t)weftSum;
  *sig = (struct signature){.magic = SIGNATURE_MAGIC, .coll = (int32_t)plan->coll, .seq = seq,
                            .count = (uint64_t)plan->count, .datatype = (int32_t)plan->datatype,
                            .op = op, .root = (int32_t)plan->root};
}

void signature_unpack(struct signature *out, const struct signature_packed *in) {
  /* the root's 24 bits, sign extended (a root of -1: none) */
  const int32_t root = (int32_t)((in->root_seq & 0xffffffu) ^ 0x800000u) - 0x800000;
  *out = (struct signature){
      .magic = in->magic == SIGNATURE_PACKED_MAGIC ? SIGNATURE_MAGIC : 0, .coll = in->coll,
      .seq = in->root_seq >> 24, .count = in->count, .datatype = in->datatype, .op = in->op,
      .root = root, .seq_modulo = SIGNATURE_SEQ_MODULO};
}

void signature_skipped(struct weftComm *comm, const struct weft_plan *plan) {
  if (coll_is_compared(plan->coll)) comm->signature_seq++;
}

weftResult_t signature_agree_checked(struct weftComm *comm, const struct weft_plan *plan) {
  if (!coll_is_compared(plan->coll)) return weftSuccess;
  const uint64_t seq = plan->sig_seq; /* signature_number's */
  if (comm->nranks == 1) return weftSuccess;
  const int n = comm->nranks;
  const char *name = coll_kind_name(plan->coll);
  struct signature *sigs = calloc((size_t)n, sizeof *sigs);
  if (sigs == NULL) return weft_error_set(weftSystemError, "WEFT_CHECK: out of memory");
  signature_init(&sigs[comm->rank], plan, seq);
  /* the exchange is the call's first wait: the call's record and watch
   * start now (the thread's prelude, hang_watch_record's), so that a peer
   * that asks where this rank is finds it in the call, not before it */
  wait_prelude_run();
  weftResult_t res = bootstrap_allgather(comm->bs, sigs, sizeof *sigs);
  if (res != weftSuccess) {
    char cause[768];
    snprintf(cause, sizeof cause, "%s", weft_error_text());
    weft_error_set(res, "WEFT_CHECK: %s #%" PRIu64 ": exchanging signatures: %s", name, seq,
                   cause);
  } else {
    res = signature_compare(sigs, n, "WEFT_CHECK");
  }
  free(sigs);
  return res;
}
