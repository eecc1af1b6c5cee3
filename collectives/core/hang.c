/* Naming a hang (hang.h): the watcher of a call's waits, the answer a rank
 * gives peers that ask where it is, and the verdict's text. */
#include "hang.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/param.h"
#include "../../transport/base/status.h"
#include "signature.h"
#include "text.h"

/* How long the questions to the peers may take: while a wait stalls (the
 * wait goes on after them, so peers that cannot answer, behind a link that
 * is down, must not hold it past its timeout), and for the verdict after a
 * failure (added to the call's time: an error comes within the timeout plus
 * this). Peers on a working bootstrap answer in microseconds. */
#define HANG_STALL_ASK_NS 250000000ull
#define HANG_VERDICT_ASK_NS 500000000ull
#define HANG_EMPTY_ASK_NS 100000000ull /* a call of no elements stalled this long asks */
#define HANG_GONE_ASK_AGAIN_NS 200000000ull /* an awaited peer found gone is asked again after */

#define WHERE_MAGIC 0x77686572u /* "wher" */
#define WHERE_CALLS 10
#define WAITING_AFTER_NS 100000000ull /* a wait this long marks its call as waiting */
#define LONG_CALL_NBYTES 65536 /* a call this large may last a clock tick: its end is read */

/* A rank's answer: its latest calls, oldest first. */
struct where_answer {
  uint32_t magic;
  int32_t rank;
  int64_t now_ns;
  int32_t ncalls;
  int32_t unused;
  struct trace_call calls[WHERE_CALLS];
};
_Static_assert(sizeof(struct where_answer) <= QUERY_ANSWER_MAX_NBYTES, "an answer fits");

static int is_p2p(const struct trace_call *c) { return c->coll == COLL_SEND || c->coll == COLL_RECV; }

void hang_call_name(const struct trace_call *c, char *buf, size_t n) {
  const char *kind = coll_kind_name((enum coll_kind)c->coll);
  const char *type = trace_type_name(c->datatype);
  switch (c->coll) {
    case COLL_ALLREDUCE:
    case COLL_REDUCESCATTER:
      snprintf(buf, n, "%s #%" PRIu64 " (%" PRIu64 " %s %s)", kind, c->seq, c->count, type,
               trace_op_name(c->op));
      break;
    case COLL_REDUCE:
      snprintf(buf, n, "%s #%" PRIu64 " (%" PRIu64 " %s %s, root %d)", kind, c->seq, c->count,
               type, trace_op_name(c->op), c->root);
      break;
    case COLL_BROADCAST:
    case COLL_GATHER:
    case COLL_SCATTER:
      snprintf(buf, n, "%s #%" PRIu64 " (%" PRIu64 " %s, root %d)", kind, c->seq, c->count, type,
               c->root);
      break;
    case COLL_SEND:
    case COLL_RECV:
      snprintf(buf, n, "%s #%" PRIu64 " (%" PRIu64 " %s %s rank %d)", kind, c->seq, c->count,
               type, c->coll == COLL_SEND ? "to" : "from", c->root);
      break;
    default: snprintf(buf, n, "%s #%" PRIu64 " (%" PRIu64 " %s)", kind, c->seq, c->count, type);
  }
}

/* "AllReduce #11, completed 2.0 s ago" / "..., waiting on rank 2 for 3.1 s" */
static void text_call_state(struct text *t, const struct trace_call *c, int64_t now_ns,
                            const char *ago_word) {
  text_add(t, "%s #%" PRIu64, coll_kind_name((enum coll_kind)c->coll), c->seq);
  if (is_p2p(c)) text_add(t, " %s rank %d", c->coll == COLL_SEND ? "to" : "from", c->root);
  const int64_t since = c->t_done_ns ? c->t_done_ns
                        : c->t_started_ns ? c->t_started_ns : c->t_created_ns;
  const double ago = since > 0 && now_ns > since ? (double)(now_ns - since) / 1e9 : 0.0;
  if (c->on_device && c->t_done_ns == 0 && (c->state == TRACE_COMPLETED || c->state == TRACE_FAILED)) {
    /* a kernel's end is not timed: when it was enqueued */
    text_add(t, ", %s (enqueued %.1f s %s)", c->state == TRACE_COMPLETED ? "completed" : "failed",
             ago, ago_word);
    return;
  }
  if (c->on_device && c->state == TRACE_STARTED) {
    text_add(t, ", its kernel running (enqueued %.1f s %s)", ago, ago_word);
    return;
  }
  switch (c->state) {
    case TRACE_SCHEDULED: text_add(t, ", queued %.1f s %s, not started", ago, ago_word); break;
    case TRACE_STARTED: text_add(t, ", started %.1f s %s", ago, ago_word); break;
    case TRACE_WAITING:
      text_add(t, ", started %.1f s %s, waiting on rank %d", ago, ago_word, c->waiting_on);
      break;
    case TRACE_COMPLETED: text_add(t, ", completed %.1f s %s", ago, ago_word); break;
    default: text_add(t, ", failed %.1f s %s", ago, ago_word);
  }
}

/* --- the verdict ---------------------------------------------------------- */

/* W_FAILED: the rank's call failed of its own (refused, say), not because
 * others did not come (weftRemoteError, which leaves it W_IN): the others
 * wait on it. W_QUEUED: the rank made the call, which waits behind another
 * of its calls (on a host stream, in a group): the others wait on it too. */
enum where_of {
  W_IN, W_FAILED, W_QUEUED, W_DONE, W_NEVER, W_PASSED, W_GONE, W_SILENT, W_NO_DUMP, W_NUM
};

/* Rank v's call under subject's number, or NULL; *where_out says where v is. */
static const struct trace_call *view_find(const struct hang_view *v, const struct trace_call *s,
                                          enum where_of *where_out) {
  if (v->status != HANG_ANSWERED) {
    *where_out = v->status == HANG_GONE ? W_GONE : v->status == HANG_SILENT ? W_SILENT : W_NO_DUMP;
    return NULL;
  }
  uint64_t newest = 0;
  for (int i = 0; i < v->ncalls; i++) {
    const struct trace_call *c = &v->calls[i];
    if (is_p2p(c) != is_p2p(s)) continue;
    if (c->seq == s->seq) {
      *where_out = c->state == TRACE_COMPLETED ? W_DONE
                   : c->state == TRACE_SCHEDULED                               ? W_QUEUED
                   : c->state == TRACE_FAILED && c->result != weftRemoteError ? W_FAILED
                                                                              : W_IN;
      return c;
    }
    if (c->seq > newest) newest = c->seq;
  }
  *where_out = newest > s->seq ? W_PASSED : W_NEVER;
  return NULL;
}

/* Rank v's last call that ran (trace_call_refused_at_start), or NULL; its
 * last call where every one was refused. */
static const struct trace_call *view_last(const struct hang_view *v) {
  if (v->ncalls == 0) return NULL;
  for (int i = v->ncalls - 1; i >= 0; i--) {
    const struct trace_call *c = &v->calls[i];
    if (!trace_call_refused_at_start(c)) return c;
  }
  return &v->calls[v->ncalls - 1];
}

/* text_groups' view of one field of calls[0..n), named by names[0..nnames) */
struct calls_field {
  const struct trace_call *const *calls;
  int32_t (*field)(const struct trace_call *);
  const char *const *names;
  int nnames;
};
static int64_t calls_field_value(const void *ctx, int i) {
  const struct calls_field *c = ctx;
  return c->field(c->calls[i]);
}
static void calls_field_format(const void *ctx, int i, char *buf, size_t n) {
  const struct calls_field *c = ctx;
  const int32_t v = c->field(c->calls[i]);
  snprintf(buf, n, "%s", v >= 0 && v < c->nnames ? c->names[v] : "?");
}

/* "rank 0 LL, ranks 1,2 SIMPLE": the ranks of calls[0..n) (ranks[i] is
 * calls[i]'s, in rank order) grouped by field; members has room for n. */
static void text_split(struct text *t, const struct trace_call *const *calls, const int *ranks,
                       int n, int32_t (*field)(const struct trace_call *),
                       const char *const *names, int nnames, int *members) {
  const struct calls_field c = {calls, field, names, nnames};
  text_groups(t, n, ranks, calls_field_value, calls_field_format, &c, 0, members);
}
static int32_t call_proto(const struct trace_call *c) { return c->proto; }
static int32_t call_algo(const struct trace_call *c) { return c->algo; }

/* Ranks whose calls on device memory agree but run on different protocols
 * or algorithms (the settings that choose them, compared when the comm
 * formed, changed on some rank since): their
 * kernels use different FIFOs and wait for each other forever, so this is
 * weftInvalidUsage too, naming the ranks. Host calls are left to their data
 * paths, which compare what they send. */
static weftResult_t verdict_plan_differs(const struct trace_call *s, const struct hang_view *views,
                                         int nranks) {
  static const char *const protos[] = {"SIMPLE", "LL"};
  static const char *const algos[] = {"ring", "tree", "recursive doubling", "direct",
                                      "single copy", "bulk"};
  _Static_assert(sizeof algos / sizeof algos[0] == ALGO_NUM, "a name per enum coll_algo");
  const struct trace_call **calls = calloc((size_t)nranks, sizeof *calls);
  int *ranks = calloc((size_t)nranks, sizeof *ranks);
  int *members = calloc((size_t)nranks, sizeof *members);
  weftResult_t res = weftSuccess;
  int n = 0, device = 1, proto_differs = 0, algo_differs = 0;
  for (int r = 0; calls != NULL && ranks != NULL && members != NULL && r < nranks; r++) {
    enum where_of w;
    const struct trace_call *c = view_find(&views[r], s, &w);
    if (c == NULL) continue;
    /* a plan that decides nothing (no elements, WEFT_DETERMINISTIC's
     * exchanges) is recorded as -1 */
    device &= c->on_device != 0 && c->algo >= 0 && c->proto >= 0 && c->count > 0;
    if (n > 0) {
      proto_differs |= c->proto != calls[0]->proto;
      algo_differs |= c->algo != calls[0]->algo;
    }
    calls[n] = c;
    ranks[n++] = r;
  }
  if (n > 1 && device && (proto_differs || algo_differs)) {
    char buf[512];
    struct text t = {.buf = buf, .n = sizeof buf, .len = 0};
    text_add(&t, "ranks disagree on how to run a collective on device memory: %s #%" PRIu64 ": ",
             coll_kind_name((enum coll_kind)s->coll), s->seq);
    if (algo_differs) {
      text_add(&t, "algorithm differs: ");
      text_split(&t, calls, ranks, n, call_algo, algos, ALGO_NUM, members);
    }
    if (proto_differs) {
      text_add(&t, "%sprotocol differs: ", algo_differs ? "; " : "");
      text_split(&t, calls, ranks, n, call_proto, protos, 2, members);
    }
    text_add(&t, " (the settings that choose them were the same on every rank when the "
                 "communicator formed: one changed on some rank since)");
    res = weft_error_set(weftInvalidUsage, "%s", buf);
  }
  free(calls);
  free(ranks);
  free(members);
  return res;
}

/* Ranks that reached subject's number under different collectives:
 * weftInvalidUsage with signature_compare_ranks's text; ranks whose device
 * calls agree but whose plans differ: verdict_plan_differs's. */
static weftResult_t verdict_mismatch(const struct trace_call *s, const struct hang_view *views,
                                     int nranks) {
  if (is_p2p(s)) return weftSuccess;
  struct signature *sigs = calloc((size_t)nranks, sizeof *sigs);
  int *ranks = calloc((size_t)nranks, sizeof *ranks);
  weftResult_t res = weftSuccess;
  int n = 0;
  for (int r = 0; sigs != NULL && ranks != NULL && r < nranks; r++) {
    enum where_of w;
    const struct trace_call *c = view_find(&views[r], s, &w);
    if (c == NULL) continue;
    /* a pre-multiplied sum is a sum, as signature_init signs it */
    sigs[n] = (struct signature){.magic = SIGNATURE_MAGIC, .coll = c->coll, .seq = c->seq,
                                 .count = c->count, .datatype = c->datatype,
                                 .op = c->op < weftNumOps ? c->op : (int32_t)weftSum,
                                 .root = c->root};
    ranks[n++] = r;
  }
  if (n > 1) res = signature_compare_ranks(sigs, ranks, n, "ranks disagree on a collective");
  if (res == weftSuccess && n > 1) res = verdict_plan_differs(s, views, nranks);
  free(sigs);
  free(ranks);
  return res;
}

weftResult_t hang_verdict(const struct trace_call *subject, const char *how,
                          const struct hang_view *views, int nranks, char *buf, size_t n) {
  weftResult_t mismatch = verdict_mismatch(subject, views, nranks);
  if (mismatch != weftSuccess) {
    snprintf(buf, n, "%s", weft_error_text());
    return mismatch;
  }
  struct text t = {.buf = buf, .n = n, .len = 0};
  if (n > 0) buf[0] = '\0';
  char name[160];
  hang_call_name(subject, name, sizeof name);
  text_add(&t, "%s %s:", name, how);
  if (is_p2p(subject)) {
    /* point-to-point calls are numbered per rank: only the peer's state counts */
    const int peer = subject->root;
    const struct hang_view *v = peer >= 0 && peer < nranks ? &views[peer] : NULL;
    if (v == NULL || v->status == HANG_SILENT) text_add(&t, " rank %d did not answer", peer);
    else if (v->status == HANG_GONE) text_add(&t, " rank %d is dead (its process ended)", peer);
    else if (v->status == HANG_NO_DUMP) text_add(&t, " rank %d left no trace", peer);
    else if (v->ncalls == 0) text_add(&t, " rank %d has made no call", peer);
    else {
      const struct trace_call *last = view_last(v);
      const int busy = last->state != TRACE_COMPLETED && last->state != TRACE_FAILED;
      text_add(&t, " rank %d %s", peer, busy ? "is in " : "is idle, its last: ");
      text_call_state(&t, last, v->now_ns, v->dumped ? "before its trace was written" : "ago");
    }
    /* a failure that reached the peer from elsewhere (its own peer died, and
     * the news went around): the ranks that are dead or did not answer,
     * which the peer's state does not name */
    for (int k = 0; k < 2; k++) {
      const enum hang_status want = k == 0 ? HANG_GONE : HANG_SILENT;
      int first = 1;
      for (int r = 0; r < nranks; r++) {
        if (r == peer || views[r].status != want) continue;
        text_add(&t, "%s%d", first ? (k == 0 ? "; elsewhere, dead: rank " : "; elsewhere, silent: rank ") : ",", r);
        first = 0;
      }
      if (!first) text_add(&t, k == 0 ? " (its process ended)" : " (no answer in time)");
    }
    return weftSuccess;
  }
  /* the ranks in each place, then the missing ones */
  int *lists = malloc(sizeof *lists * (size_t)nranks * (W_NUM + 1));
  int counts[W_NUM] = {0};
  if (lists == NULL) return weftSuccess;
  int *missing = lists + (size_t)nranks * W_NUM, nmissing = 0;
  for (int r = 0; r < nranks; r++) {
    enum where_of w;
    view_find(&views[r], subject, &w);
    lists[(size_t)w * (size_t)nranks + (size_t)counts[w]++] = r;
  }
  const char *sep = " ";
  /* who is missing, and what each did last */
  for (int i = 0; i < counts[W_NEVER]; i++) {
    const int r = lists[(size_t)W_NEVER * (size_t)nranks + (size_t)i];
    const struct hang_view *v = &views[r];
    text_add(&t, "%srank %d never called it", sep, r);
    if (v->ncalls == 0) {
      text_add(&t, " (it has made no call on this communicator)");
    } else {
      const struct trace_call *last = view_last(v);
      const int busy = last->state != TRACE_COMPLETED && last->state != TRACE_FAILED;
      text_add(&t, busy ? " (it is in " : " (its last: ");
      text_call_state(&t, last, v->now_ns, v->dumped ? "before its trace was written" : "ago");
      text_add(&t, ")");
    }
    sep = "; ";
  }
  static const char *const missing_why[2][W_NUM] = {
      {[W_GONE] = "%s is dead (its process ended, or it left the communicator)",
       [W_SILENT] = "%s did not answer",
       [W_NO_DUMP] = "%s left no trace (it died, or it could not write one)"},
      {[W_GONE] = "%s are dead (their processes ended, or they left the communicator)",
       [W_SILENT] = "%s did not answer",
       [W_NO_DUMP] = "%s left no trace (they died, or they could not write one)"}};
  for (int w = W_GONE; w <= W_NO_DUMP; w++) {
    if (counts[w] == 0) continue;
    struct text who = {.buf = (char[64]){0}, .n = 64, .len = 0};
    text_ranks(&who, &lists[(size_t)w * (size_t)nranks], counts[w]);
    text_add(&t, sep, "");
    text_add(&t, missing_why[counts[w] > 1][w], who.buf);
    sep = "; ";
  }
  /* those whose call waits behind another of theirs, and which */
  for (int i = 0; i < counts[W_QUEUED]; i++) {
    const int r = lists[(size_t)W_QUEUED * (size_t)nranks + (size_t)i];
    const struct hang_view *v = &views[r];
    const struct trace_call *busy = NULL;
    for (int k = 0; k < v->ncalls && busy == NULL; k++)
      if (v->calls[k].state == TRACE_STARTED || v->calls[k].state == TRACE_WAITING)
        busy = &v->calls[k];
    text_add(&t, "%srank %d has it queued", sep, r);
    if (busy != NULL) {
      text_add(&t, " behind ");
      text_call_state(&t, busy, v->now_ns, v->dumped ? "before its trace was written" : "ago");
    } else {
      text_add(&t, ", not started");
    }
    sep = "; ";
  }
  /* those that failed it of their own, and why */
  for (int i = 0; i < counts[W_FAILED]; i++) {
    const int r = lists[(size_t)W_FAILED * (size_t)nranks + (size_t)i];
    enum where_of w;
    const struct trace_call *c = view_find(&views[r], subject, &w);
    text_add(&t, "%srank %d failed it (%s)", sep, r,
             c != NULL ? weftGetErrorString((weftResult_t)c->result) : "?");
    sep = "; ";
  }
  /* those that reached it */
  for (int w = W_FAILED; w <= W_NO_DUMP; w++)
    for (int i = 0; i < counts[w]; i++) {
      if (w == W_PASSED || w == W_DONE) continue;
      missing[nmissing++] = lists[(size_t)w * (size_t)nranks + (size_t)i];
    }
  for (int a = 1; a < nmissing; a++) /* in rank order */
    for (int b = a; b > 0 && missing[b - 1] > missing[b]; b--) {
      int x = missing[b];
      missing[b] = missing[b - 1];
      missing[b - 1] = x;
    }
  if (counts[W_IN] > 0) {
    text_add(&t, "%s", sep);
    text_ranks(&t, &lists[(size_t)W_IN * (size_t)nranks], counts[W_IN]);
    if (nmissing > 0) {
      text_add(&t, " %s on ", counts[W_IN] == 1 ? "waits" : "wait");
      text_ranks(&t, missing, nmissing);
    } else {
      text_add(&t, " %s in it", counts[W_IN] == 1 ? "is" : "are");
      const char *open = " (";
      for (int i = 0; i < counts[W_IN]; i++) {
        const int r = lists[(size_t)W_IN * (size_t)nranks + (size_t)i];
        enum where_of w;
        const struct trace_call *c = view_find(&views[r], subject, &w);
        if (c == NULL || c->waiting_on < 0) continue;
        text_add(&t, "%srank %d waits on rank %d", open, r, c->waiting_on);
        open = ", ";
      }
      if (*open == ',') text_add(&t, ")");
    }
    sep = "; ";
  }
  if (counts[W_DONE] > 0) {
    text_add(&t, "%s", sep);
    text_ranks(&t, &lists[(size_t)W_DONE * (size_t)nranks], counts[W_DONE]);
    text_add(&t, " completed it");
    sep = "; ";
  }
  if (counts[W_PASSED] > 0) {
    text_add(&t, "%s", sep);
    text_ranks(&t, &lists[(size_t)W_PASSED * (size_t)nranks], counts[W_PASSED]);
    text_add(&t, " went past it");
  }
  free(lists);
  return weftSuccess;
}

/* --- asking the peers ----------------------------------------------------- */

static size_t where_answer_fn(void *arg, void *reply, size_t cap) {
  const struct weftComm *comm = arg;
  struct where_answer a = {.magic = WHERE_MAGIC, .rank = comm->rank, .now_ns = trace_now_ns()};
  a.ncalls = trace_window(comm->trace, a.calls, WHERE_CALLS);
  if (sizeof a > cap) return 0;
  memcpy(reply, &a, sizeof a);
  return sizeof a;
}

void hang_answer_install(struct weftComm *comm) {
  if (comm->trace != NULL && comm->bs != NULL) bootstrap_answer_set(comm->bs, where_answer_fn, comm);
}

/* Asks every peer where it is (this rank's own view from its trace) and
 * writes the verdict on subject into text: weftInvalidUsage for a mismatch,
 * else weftSuccess. Bounded by timeout_ns. */
/* Asks every rank where it is and writes the verdict on subject into text;
 * *peer_failed_out (when not NULL): a rank failed the call of its own, so it
 * left it and will not come. */
static weftResult_t ask_and_judge(struct weftComm *comm, const struct trace_call *subject,
                                  const char *how, uint64_t timeout_ns, char *text, size_t n,
                                  int *peer_failed_out, int *awaited_gone_out) {
  if (peer_failed_out != NULL) *peer_failed_out = 0;
  if (awaited_gone_out != NULL) *awaited_gone_out = 0;
  const int nr = comm->nranks;
  struct where_answer *answers = calloc((size_t)nr, sizeof *answers);
  size_t *got = calloc((size_t)nr, sizeof *got);
  enum bootstrap_ask_outcome *outcome = calloc((size_t)nr, sizeof *outcome);
  struct hang_view *views = calloc((size_t)nr, sizeof *views);
  weftResult_t res = weftSuccess;
  if (answers == NULL || got == NULL || outcome == NULL || views == NULL) {
    snprintf(text, n, "%s", "");
    goto free_all;
  }
  char why[256];
  bootstrap_ask_all(comm->bs, timeout_ns, answers, sizeof *answers, got, outcome, why,
                    sizeof why);
  for (int r = 0; r < nr; r++) {
    struct where_answer *a = &answers[r];
    if (r == comm->rank) {
      a->ncalls = trace_window(comm->trace, a->calls, WHERE_CALLS);
      a->now_ns = trace_now_ns();
      outcome[r] = BOOTSTRAP_ASK_ANSWERED;
      got[r] = sizeof *a;
      a->magic = WHERE_MAGIC;
    }
    views[r].status = HANG_SILENT;
    if (outcome[r] == BOOTSTRAP_ASK_GONE) views[r].status = HANG_GONE;
    if (outcome[r] == BOOTSTRAP_ASK_ANSWERED && got[r] == sizeof *a && a->magic == WHERE_MAGIC &&
        a->ncalls >= 0 && a->ncalls <= WHERE_CALLS) {
      views[r] = (struct hang_view){.status = HANG_ANSWERED, .calls = a->calls,
                                    .ncalls = a->ncalls, .now_ns = a->now_ns};
    }
  }
  res = hang_verdict(subject, how, views, nr, text, n);
  if (awaited_gone_out != NULL && subject->waiting_on >= 0 && subject->waiting_on < nr &&
      subject->waiting_on != comm->rank)
    *awaited_gone_out = views[subject->waiting_on].status == HANG_GONE;
  for (int r = 0; r < nr && peer_failed_out != NULL; r++) {
    enum where_of w;
    view_find(&views[r], subject, &w);
    if (w == W_FAILED && r != comm->rank) *peer_failed_out = 1;
  }
  /* the ranks this one could not ask count as silent: say why, which is
   * this process's trouble (out of descriptors), not theirs */
  int nunasked = 0;
  for (int r = 0; r < nr; r++) nunasked += outcome[r] == BOOTSTRAP_ASK_UNASKED;
  int *unasked = nunasked > 0 ? malloc(sizeof *unasked * (size_t)nunasked) : NULL;
  if (unasked != NULL) {
    for (int r = 0, i = 0; r < nr; r++)
      if (outcome[r] == BOOTSTRAP_ASK_UNASKED) unasked[i++] = r;
    struct text t = {.buf = text, .n = n, .len = strlen(text)};
    text_add(&t, "; rank %d could not ask ", comm->rank);
    text_ranks(&t, unasked, nunasked);
    text_add(&t, " where %s (%s)", nunasked > 1 ? "they are" : "it is", why);
    free(unasked);
  }
free_all:
  free(answers);
  free(got);
  free(outcome);
  free(views);
  return res;
}

weftResult_t hang_judge(struct weftComm *comm, const struct trace_call *subject, const char *how,
                        int stalling, char *text, size_t n) {
  return ask_and_judge(comm, subject, how, stalling ? HANG_STALL_ASK_NS : HANG_VERDICT_ASK_NS,
                       text, n, NULL, NULL);
}

/* --- the watcher ---------------------------------------------------------- */

/* The first mark among hw's calls (of an all-to-all, gather or scatter
 * whose sends and receives the others are: plan_is_mark) from from on, into
 * *out: its index + 1, or 0 when there is none. Their stalls and failures
 * are judged on it, as a collective's. */
static size_t watch_mark(const struct hang_watch *hw, size_t from, struct trace_call *out) {
  for (size_t i = from; i < hw->nids; i++)
    if (trace_get(hw->comm->trace, hw->ids[i], out) && !is_p2p(out) &&
        (out->coll == COLL_GATHER || out->coll == COLL_SCATTER || out->coll == COLL_ALLTOALL))
      return i + 1;
  return 0;
}

/* The call of hw waiting on peer: a send's or a receive's with that peer,
 * else the first. */
static uint64_t watch_call_of(const struct hang_watch *hw, int peer) {
  uint64_t id = hw->ids[0];
  for (size_t i = 0; i < hw->nids && peer >= 0; i++) {
    struct trace_call c;
    if (trace_get(hw->comm->trace, hw->ids[i], &c) && c.root == peer && is_p2p(&c))
      id = hw->ids[i];
  }
  return id;
}

static weftResult_t watch_fn(void *arg, enum wait_event event, int peer, uint64_t waited_ns) {
  struct hang_watch *hw = arg;
  struct weftComm *comm = hw->comm;
  if (event == WAIT_TIMED_OUT) {
    hw->waited_ns = waited_ns;
    hw->timed_out_peer = peer;
    return weftInProgress;
  }
  if (waited_ns > hw->stalled_ns) hw->stalled_ns = waited_ns;
  if (waited_ns < WAITING_AFTER_NS) return weftInProgress;
  const uint64_t id = watch_call_of(hw, peer);
  struct trace_call c;
  if (!trace_get(comm->trace, id, &c)) return weftInProgress;
  if (c.state != TRACE_WAITING || c.waiting_on != peer)
    trace_set_state(comm->trace, id, TRACE_WAITING, peer, weftSuccess);
  /* the marks of the calls these sends and receives are wait as they do */
  struct trace_call mark;
  for (size_t at = 0; is_p2p(&c) && (at = watch_mark(hw, at, &mark)) > 0;)
    if (mark.state != TRACE_WAITING || mark.waiting_on != peer)
      trace_set_state(comm->trace, mark.id, TRACE_WAITING, peer, weftSuccess);
  if (hw->next_ask_ns == 0 || waited_ns < hw->next_ask_ns || comm->nranks < 2) return weftInProgress;
  /* point-to-point calls are numbered per rank: the peers are asked about
   * the calls they are part of (each mark of a group's, first to last) */
  size_t at = 0;
  if (is_p2p(&c) && (at = watch_mark(hw, 0, &c)) == 0) return weftInProgress;
  /* a long stall: is a peer in another collective under this number? */
  hw->next_ask_ns = waited_ns * 2;
  hw->asked = 1;
  char text[1024];
  c.state = TRACE_WAITING;
  c.waiting_on = peer;
  int peer_failed, awaited_gone;
  weftResult_t res =
      ask_and_judge(comm, &c, "stalls", HANG_STALL_ASK_NS, text, sizeof text, &peer_failed,
                    &awaited_gone);
  /* every mark of the group is asked about before a peer's failure counts: a
   * peer that found the mismatch in a later one failed the earlier ones too */
  char failed_text[1024];
  if (peer_failed) snprintf(failed_text, sizeof failed_text, "%s", text);
  while (res == weftSuccess && at > 0 && (at = watch_mark(hw, at, &c)) > 0) {
    int failed_here;
    c.state = TRACE_WAITING;
    c.waiting_on = peer;
    res = ask_and_judge(comm, &c, "stalls", HANG_STALL_ASK_NS, text, sizeof text, &failed_here,
                        NULL);
    if (failed_here && !peer_failed) snprintf(failed_text, sizeof failed_text, "%s", text);
    peer_failed |= failed_here;
  }
  if (res == weftSuccess && peer_failed) snprintf(text, sizeof text, "%s", failed_text);
  /* a peer that refused the call of its own (an argument bad on that rank
   * only: a root out of range, a user op it destroyed) is not coming: wait
   * no longer for it */
  if (res == weftSuccess && peer_failed) return weft_error_set(weftRemoteError, "%s", text);
  /* nothing listens where the awaited peer answered questions: its process
   * ended (on another host, whose pid this one cannot watch) or it left the
   * communicator. Asked once more shortly, so that one refused question is
   * not the verdict; then the call waits no longer for it */
  if (res == weftSuccess && awaited_gone && hw->awaited_gone == peer + 1)
    return weft_error_set(weftRemoteError, "%s", text);
  hw->awaited_gone = res == weftSuccess && awaited_gone ? peer + 1 : 0;
  if (hw->awaited_gone) hw->next_ask_ns = waited_ns + HANG_GONE_ASK_AGAIN_NS;
  if (res == weftSuccess) {
    WEFT_INFO(LOG_COLL, "rank %d: %s", comm->rank, text);
    return weftInProgress;
  }
  snprintf(hw->mismatch, sizeof hw->mismatch, "%s", text);
  return weft_error_set(res, "%s", text);
}

/* Watches the thread's waits for the calls ids[nids] of comm. */
static void watch_install(struct hang_watch *hw, struct weftComm *comm, const uint64_t *ids,
                          size_t nids, size_t nbytes) {
  hw->watcher.fn = watch_fn;
  hw->watcher.arg = hw;
  hw->comm = comm;
  hw->ids = ids;
  hw->nids = nids;
  hw->long_call = nbytes >= LONG_CALL_NBYTES;
  hw->asked = 0;
  hw->awaited_gone = 0;
  hw->mismatch[0] = '\0';
  hw->stalled_ns = hw->waited_ns = 0;
  hw->timed_out_peer = -1;
  hw->next_ask_ns = hw->ask_after_ns = trace_ask_after_ns(comm->trace);
  /* a call of no elements waits only to learn that its peers agree: where
   * they run a path that does not see its ring's slots, their answers say */
  if (nbytes == 0 && hw->next_ask_ns > HANG_EMPTY_ASK_NS) hw->next_ask_ns = HANG_EMPTY_ASK_NS;
  hw->outer = wait_watcher_set(&hw->watcher);
}

void hang_watch_begin(struct hang_watch *hw, struct weftComm *comm, const uint64_t *ids,
                      size_t nids, size_t nbytes, int started) {
  hw->comm = NULL;
  hw->record = NULL;
  hw->prelude.arg = NULL; /* no prelude of its own */
  if (comm->trace == NULL || nids == 0) return; /* nothing to watch */
  for (size_t i = 0; i < nids && !started; i++)
    trace_set_state(comm->trace, ids[i], TRACE_STARTED, -1, weftSuccess);
  watch_install(hw, comm, ids, nids, nbytes);
}

/* hang_watch_record's prelude: the record, then the watch. */
static void watch_record(void *arg) {
  struct hang_watch *hw = arg;
  hw->id = trace_record(hw->comm->trace, hw->record, 1);
  hw->record = NULL;
  watch_install(hw, hw->comm, &hw->id, 1, hw->nbytes);
}

void hang_watch_record(struct hang_watch *hw, struct weftComm *comm,
                       const struct weft_plan *plan, size_t nbytes) {
  hw->comm = NULL;
  hw->record = NULL;
  if (comm->trace == NULL) return; /* nothing to record or watch */
  hw->comm = comm;
  hw->record = plan;
  hw->nbytes = nbytes;
  hw->prelude.fn = watch_record;
  hw->prelude.arg = hw;
  hw->outer_prelude = wait_prelude_set(&hw->prelude);
}

/* Whether res is the kind of failure a verdict explains: this rank waited
 * on others that did not come, died or failed. */
static int res_is_remote(weftResult_t res) { return res == weftRemoteError; }

/* hang_watch_end of a call that failed, stalled or was long. */
/* A mismatch that a collective's data path found names the call by its kind
 * alone ("AllReduce: rank 1 sent 96 bytes where 20 were expected ..."): the
 * kind, where the text names it first, gets the call's number in comm's
 * trace, as the hang verdicts and the flight recorder have it. A text that
 * numbers it already, or does not name its kind, stays as it is. */
/* The last c in text before end, or NULL. */
static const char *strrchr_before(const char *text, const char *end, char c) {
  for (const char *p = end; p > text;)
    if (*--p == c) return p;
  return NULL;
}

static void mismatch_number(struct weftComm *comm, const struct trace_call *c) {
  const char *text = weft_error_text();
  const char *kind = coll_kind_name((enum coll_kind)c->coll);
  const size_t klen = strlen(kind);
  const char *at = text;
  while (at != NULL && strncmp(at, kind, klen) != 0) {
    at = strstr(at, ": ");
    if (at != NULL) at += 2;
  }
  char numbered[WEFT_ERROR_TEXT_NBYTES];
  const char *differs = strstr(text, "collective differs: ");
  /* the word before it, where it follows ": " ("#12" where a number is said) */
  const char *word = differs != NULL && differs - text >= 3 && differs[-2] == ':'
                         ? strrchr_before(text, differs - 2, ' ')
                         : NULL;
  if (c->seq == 0) return;
  if (at != NULL && at[klen] == ':') {
    snprintf(numbered, sizeof numbered, "%.*s%s #%" PRIu64 "%s", (int)(at - text), text, kind,
             c->seq, at + klen);
  } else if (differs != NULL && !(word != NULL && word[1] == '#')) {
    /* ranks in different collectives (and no number said yet): the call's
     * number alone, as WEFT_CHECK's "#12: collective differs" says it, the
     * same on every rank whatever its kind */
    snprintf(numbered, sizeof numbered, "%.*s#%" PRIu64 ": %s", (int)(differs - text), text,
             c->seq, differs);
  } else {
    return;
  }
  /* the comm broke with the text as the data path set it: the later calls'
   * refusals name the cause numbered too */
  comm_error_text_replace(comm, text, numbered);
  weft_error_set(weftInvalidUsage, "%s", numbered);
}

__attribute__((noinline)) static weftResult_t watch_end_slow(struct hang_watch *hw,
                                                             weftResult_t res) {
  struct weftComm *comm = hw->comm;
  struct trace_call c;
  /* an abort or a revoke on this rank is no hang to explain */
  const int stopped = __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) != 0;
  /* the subject: of a group's sends and receives, the one whose wait timed out */
  if (res != weftSuccess && res_is_remote(res) && comm->nranks > 1 && !stopped && hw->nids > 0 &&
      trace_get(comm->trace, watch_call_of(hw, hw->timed_out_peer), &c)) {
    /* a send's or receive's of an all-to-all, gather or scatter: the call's
     * (of a group's several, the first that ranks disagree on, else the first) */
    struct trace_call mark;
    size_t at = watch_mark(hw, 0, &mark); /* the calls' sends and receives, or a mark itself */
    if (at > 0) c = mark;
    while (at > 0 && (at = watch_mark(hw, at, &mark)) > 0) {
      char probe[1024];
      if (ask_and_judge(comm, &mark, "failed", HANG_VERDICT_ASK_NS, probe, sizeof probe, NULL,
                        NULL) !=
          weftSuccess) {
        c = mark;
        break;
      }
    }
    char cause[1024], how[64], text[2048];
    snprintf(cause, sizeof cause, "%s", weft_error_text());
    /* a wait of the bootstrap's (WEFT_CHECK's signature exchange, a first
     * connection's set-up) times out out of the watch's sight: a call that
     * lasted its timeout timed out all the same */
    const int64_t ran_ns = c.t_started_ns > 0 ? trace_now_ns() - c.t_started_ns : 0;
    if (hw->waited_ns == 0 && ran_ns > 0 &&
        (uint64_t)ran_ns >= comm_timeout_ns(comm) - comm_timeout_ns(comm) / 20)
      hw->waited_ns = (uint64_t)ran_ns;
    if (hw->waited_ns > 0) snprintf(how, sizeof how, "timed out after %.1f s", (double)hw->waited_ns / 1e9);
    else if (hw->stalled_ns >= 1000000000ull)
      snprintf(how, sizeof how, "failed after %.1f s", (double)hw->stalled_ns / 1e9);
    else snprintf(how, sizeof how, "failed");
    weftResult_t judged =
        ask_and_judge(comm, &c, how, HANG_VERDICT_ASK_NS, text, sizeof text, NULL, NULL);
    /* a mismatch found by asking, after a stall (this rank's, or a peer's
     * that broke the comm about when this one would have asked), is this
     * rank's refusal too; one a peer's data path saw at once stays the
     * peer's failure here (its text says what) */
    const int stalled = hw->asked || hw->waited_ns > 0 ||
                        (hw->ask_after_ns > 0 && hw->stalled_ns * 2 >= hw->ask_after_ns);
    if (judged != weftSuccess && stalled) {
      res = judged;
      hw->asked = 1; /* breaks the comm below, as a stall's question would have */
    }
    if (res == weftInvalidUsage) weft_error_set(res, "%s", text);
    else weft_error_set(res, "%s (rank %d: %s)", text, comm->rank, cause);
  }
  /* what a stall's question found, as it found it */
  if (res == weftInvalidUsage && hw->mismatch[0] != '\0') weft_error_set(res, "%s", hw->mismatch);
  /* one call's (a group's sends and receives name their peer instead) */
  else if (res == weftInvalidUsage && !hw->asked && hw->nids == 1 &&
           trace_get(comm->trace, hw->ids[0], &c))
    mismatch_number(comm, &c);
  /* a mismatch found mid-call leaves data in the connections: the comm
   * breaks, and the peers still waiting fail at once (and find it too) */
  if (res == weftInvalidUsage && hw->asked) comm_fail_alone(comm, res);
  /* a short call that never stalled ends within the clock's resolution of
   * its start */
  const int read_clock = hw->long_call || hw->stalled_ns > 0 || res != weftSuccess;
  for (size_t i = 0; i < hw->nids; i++) trace_done(comm->trace, hw->ids[i], res, read_clock);
  /* a mismatch is dumped too, on every rank that found it (the others fail
   * remote): the verdict on the dumps then has every rank's side */
  if (res != weftSuccess && !stopped &&
      (res_is_remote(res) || hw->asked || res == weftInvalidUsage))
    trace_dump_to_dir(comm->trace, hw->waited_ns > 0 ? TRACE_ON_TIMEOUT : TRACE_ON_FAILURE,
                      weft_error_text());
  return res;
}

weftResult_t hang_watch_end(struct hang_watch *hw, weftResult_t res) {
  struct weftComm *comm = hw->comm;
  if (comm == NULL) return res;
  if (hw->prelude.arg == hw) {
    /* hang_watch_record's: taken away whether it ran or not */
    wait_prelude_set(hw->outer_prelude);
    hw->prelude.arg = NULL;
    if (hw->record != NULL && res == weftSuccess) {
      /* it never waited, and succeeded: recorded done at once, with no
       * watch to install and take away */
      trace_record_done(comm->trace, hw->record, res);
      hw->record = NULL;
      return res;
    }
    if (hw->record != NULL) watch_record(hw); /* recorded now, to fail below */
  }
  wait_watcher_set(hw->outer);
  if (res != weftSuccess || hw->long_call || hw->stalled_ns > 0) return watch_end_slow(hw, res);
  /* a short call that never stalled: done within the clock's resolution of
   * its start */
  for (size_t i = 0; i < hw->nids; i++) trace_done(comm->trace, hw->ids[i], res, 0);
  return res;
}
