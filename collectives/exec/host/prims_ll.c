/* The LL (low-latency) protocol of the host primitives, after NCCL's LL.
 *
 * A slot is a row of 8-byte words: the low 4 bytes of each carry data, the
 * high 4 bytes a flag, (step + 1) truncated to 32 bits (never 0 within 2^32
 * steps, so zeroed memory reads as empty). The sender builds each word in a
 * register and stores it with one 8-byte store; the receiver loads each word
 * with one 8-byte load until its flag is the step's, and so has the data from
 * the same load. No tail counter sits between them, and the receiver takes
 * the first words while the sender still writes the last. A slot therefore
 * carries slot_nbytes / 2 bytes of payload; a payload that is not a multiple
 * of 4 bytes pads its last word with zeros, and an empty one is a single word
 * that carries only the flag.
 *
 * The rest is SIMPLE's: the sender waits for a credit (head) before it fills
 * a slot, then records slot_used_nbytes (marked LL) and release-stores tail,
 * so that the step counters stay one for both protocols and a proxy forwards
 * the slot; the receiver release-stores head once it has taken the slot.
 *
 * A flag can only be believed where the word held LL data before: bytes a
 * SIMPLE call left in the slot are raw data and may read as this step's flag
 * by chance. So the receiver takes a word whose flag it saw change to the
 * expected one (only this step's sender writes the slot now), and with it
 * every word before it (the sender stores them in order, with release, and
 * the receiver loads with acquire). A word that matches at first sight it
 * takes only once the slot is vouched for: by its slot_used_nbytes, marked LL
 * and covering the words (written after the words, so it says either that
 * this step is complete or that an earlier LL step wrote every one of them,
 * whose flags are older), else by tail, as SIMPLE. The receiver waits on the
 * last word of a block, so it mostly sees that word change and needs no
 * vouching unless it comes late.
 *
 * A FIFO that a proxy fills (the socket transport) gets its bytes from recv(),
 * which may stop in the middle of a word: there the receiver waits for tail,
 * which the proxy moves once the whole slot has landed, and checks the flags.
 * LL saves nothing there, but the results are the same. */
#include <stdalign.h>
#include <stdint.h>
#include <sched.h>
#include <string.h>

#include "../../../transport/base/status.h"
#include "../../../transport/transport.h"
#include "../../../transport/base/wait.h"
#include "../../core/signature.h"
#include "prims_ll.h"

/* Payload bytes per stage of the forwarding primitives: whole words and
 * whole elements of every datatype. */
#define LL_STAGE_NBYTES 2048

/* A receiver that catches up with its sender waits on the last word of the
 * next block of this many, not word by word: chasing the sender through each
 * cache line it writes would bounce that line between the cores. */
#define LL_POLL_WORDS 32

static inline uint32_t ll_flag(uint64_t step) { return (uint32_t)(step + 1); }

/* Words a slot of nbytes takes: an empty one still carries a flag, so that
 * its receiver need not wait for tail. */
static inline size_t ll_nwords(size_t nbytes) { return nbytes == 0 ? 1 : (nbytes + 3) / 4; }

/* The slot this end is filling. */
struct ll_out {
  struct weft_conn *conn;
  uint64_t *words;
  uint64_t flag_hi; /* the step's flag, in the high half of a word */
  size_t nwords;    /* words stored so far */
};

/* The slot this end is taking. */
struct ll_in {
  struct prims *p;
  struct weft_conn *conn;
  const uint64_t *words;
  size_t nwords;      /* words this step carries */
  uint32_t flag;
  size_t fresh_words; /* words [0, fresh_words) are this step's: a flag was seen changing */
  int vouched;        /* no word of the slot can show the flag by chance */
  int tail_seen;      /* the sender has finished the slot: every word shows the flag */
};

/* --- sending ------------------------------------------------------------ */

/* Waits for the credit of the next slot (as SIMPLE does) and starts it. */
static weftResult_t ll_out_begin(struct prims *p, struct ll_out *o) {
  struct weft_conn *c = p->send;
  if (!conn_send_ready(c)) {
    struct weft_wait w;
    wait_begin(&w, comm_timeout_ns(p->comm), &p->comm->abort_flag, &c->ctrl->poison, c->peer_pid,
               c->peer_rank, "send to");
    while (!conn_send_ready(c)) {
      weftResult_t res = wait_poll(&w);
      if (res != weftInProgress) return res;
    }
  }
  o->conn = c;
  o->words = (uint64_t *)(conn_slot(c, c->step));
  o->flag_hi = (uint64_t)ll_flag(c->step) << 32;
  o->nwords = 0;
  return weftSuccess;
}

/* Appends nbytes of src to the slot; only the slot's last piece may end in a
 * partial word, which is padded with zeros. */
static void ll_out_put(struct ll_out *o, const void *src, size_t nbytes) {
  const char *s = src;
  uint64_t *w = o->words + o->nwords;
  const size_t nfull = nbytes / 4;
  for (size_t i = 0; i < nfull; i++) {
    uint32_t data;
    memcpy(&data, s + 4 * i, 4);
    __atomic_store_n(&w[i], o->flag_hi | data, __ATOMIC_RELEASE);
  }
  o->nwords += nfull;
  if (nbytes % 4 != 0) {
    uint32_t data = 0;
    memcpy(&data, s + 4 * nfull, nbytes % 4);
    __atomic_store_n(&w[nfull], o->flag_hi | data, __ATOMIC_RELEASE);
    o->nwords++;
  }
}

/* Marks the slot full for proxies and for receivers that need tail. */
static void ll_out_end(struct ll_out *o) {
  struct weft_conn *c = o->conn;
  if (o->nwords == 0) __atomic_store_n(&o->words[o->nwords++], o->flag_hi, __ATOMIC_RELEASE);
  __atomic_store_n(&c->ctrl->slot_used_nbytes[slot_index(c->step, c->nslots)],
                   (uint32_t)(o->nwords * 8) | PRIMS_LL_USED_MARK, __ATOMIC_RELEASE);
  c->step++;
  __atomic_store_n(&c->ctrl->tail, c->step, __ATOMIC_RELEASE);
}

/* --- receiving ---------------------------------------------------------- */

static void ll_in_wait_begin(struct ll_in *in, struct weft_wait *w) {
  struct weft_conn *c = in->conn;
  wait_begin(w, comm_timeout_ns(in->p->comm), &in->p->comm->abort_flag, &c->ctrl->poison,
             c->peer_pid, c->peer_rank, "receive from");
}

/* Waits until the sender has finished the slot, as SIMPLE does. */
static weftResult_t ll_in_wait_tail(struct ll_in *in) {
  struct weft_conn *c = in->conn;
  if (__atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) <= c->step) {
    struct weft_wait w;
    ll_in_wait_begin(in, &w);
    while (__atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) <= c->step) {
      weftResult_t res = wait_poll(&w);
      if (res != weftInProgress) return res;
    }
  }
  in->vouched = in->tail_seen = 1;
  return weftSuccess;
}

/* A word without the flag in a finished slot: the ranks disagree on the
 * protocol, and the connection's steps no longer line up, so it is poisoned
 * for the sender to see. */
static weftResult_t ll_in_mismatch(struct ll_in *in, size_t i) {
  conn_poison(in->conn);
  return weft_error_set(weftInvalidUsage,
                        "rank %d sent step %llu without LL flags (word %zu): do all ranks use "
                        "the same protocol?",
                        in->conn->peer_rank, (unsigned long long)in->conn->step, i);
}

/* Vouches for the slot: by its LL mark if that covers our words, else by tail. */
static weftResult_t ll_in_vouch(struct ll_in *in) {
  struct weft_conn *c = in->conn;
  const uint32_t *at = &c->ctrl->slot_used_nbytes[slot_index(c->step, c->nslots)];
  uint32_t used = __atomic_load_n(at, __ATOMIC_ACQUIRE);
  if ((used & PRIMS_LL_USED_MARK) && (used & PRIMS_USED_NBYTES_MASK) >= in->nwords * 8) {
    in->vouched = 1;
    return weftSuccess;
  }
  return ll_in_wait_tail(in);
}

/* The slow path of ll_in_word: *v_io is word i as first loaded. */
static weftResult_t ll_in_wait_word(struct ll_in *in, size_t i, uint64_t *v_io) {
  uint64_t v = *v_io;
  if ((uint32_t)(v >> 32) == in->flag) {
    /* a match at first sight may be raw data that SIMPLE left */
    WEFT_TRY(ll_in_vouch(in));
    v = __atomic_load_n(&in->words[i], __ATOMIC_RELAXED);
    if ((uint32_t)(v >> 32) == in->flag) {
      *v_io = v;
      return weftSuccess;
    }
  }
  if (in->tail_seen) return ll_in_mismatch(in, i);
  /* the word is older than this step: once it matches, this step's sender wrote it */
  struct weft_wait w;
  ll_in_wait_begin(in, &w);
  for (uint32_t polls = 1; (uint32_t)(v >> 32) != in->flag; polls++) {
    weftResult_t res = wait_poll(&w);
    if (res != weftInProgress) return res;
    v = __atomic_load_n(&in->words[i], __ATOMIC_ACQUIRE);
    if ((polls & 255) == 0 && (uint32_t)(v >> 32) != in->flag &&
        __atomic_load_n(&in->conn->ctrl->tail, __ATOMIC_ACQUIRE) > in->conn->step) {
      /* the sender finished the slot without flagging this word: it sent SIMPLE */
      v = __atomic_load_n(&in->words[i], __ATOMIC_RELAXED);
      if ((uint32_t)(v >> 32) != in->flag) return ll_in_mismatch(in, i);
    }
  }
  /* the sender stores the words in order, with release: the ones before are
   * this step's too */
  if (i + 1 > in->fresh_words) in->fresh_words = i + 1;
  *v_io = v;
  return weftSuccess;
}

/* The data of word i of the slot, once its flag is the step's. */
static inline weftResult_t ll_in_word(struct ll_in *in, size_t i, uint32_t *data_out) {
  uint64_t v = __atomic_load_n(&in->words[i], __ATOMIC_RELAXED);
  int trusted = in->vouched || i < in->fresh_words;
  if (__builtin_expect((uint32_t)(v >> 32) != in->flag || !trusted, 0))
    WEFT_TRY(ll_in_wait_word(in, i, &v));
  *data_out = (uint32_t)v;
  return weftSuccess;
}

/* Starts taking the next slot, which carries nbytes of payload. */
static weftResult_t ll_in_begin(struct prims *p, size_t nbytes, struct ll_in *in) {
  struct weft_conn *c = p->recv;
  in->p = p;
  in->conn = c;
  in->words = (const uint64_t *)(conn_slot(c, c->step));
  in->nwords = ll_nwords(nbytes);
  in->flag = ll_flag(c->step);
  in->fresh_words = 0;
  in->vouched = in->tail_seen = 0;
  /* a proxy's FIFO has no atomic words: it is read once tail says it landed;
   * only a FIFO in host memory that the sender stores into has them */
  if (!(c->transport->caps & TRANSPORT_CAP_HOST_MEMORY)) WEFT_TRY(ll_in_wait_tail(in));
  if (nbytes == 0) { /* nothing to take: wait for the flag alone */
    uint32_t data;
    WEFT_TRY(ll_in_word(in, 0, &data));
  }
  return weftSuccess;
}

/* How many words from `first` on need only their flag to be taken. */
static inline size_t ll_in_trusted(const struct ll_in *in, size_t first) {
  if (in->vouched) return SIZE_MAX;
  return in->fresh_words > first ? in->fresh_words - first : 0;
}

/* Takes nbytes from the slot's words [first, ...) into dst; of a partial last
 * word only the bytes asked for. */
static weftResult_t ll_in_take(struct ll_in *in, size_t first, void *dst, size_t nbytes) {
  char *d = dst;
  const uint64_t *words = in->words + first;
  const uint32_t flag = in->flag;
  const size_t nwords = (nbytes + 3) / 4;
  for (size_t b = 0; b < nwords; b += LL_POLL_WORDS) {
    const size_t e = nwords - b < LL_POLL_WORDS ? nwords : b + LL_POLL_WORDS;
    uint32_t data;
    WEFT_TRY(ll_in_word(in, first + e - 1, &data)); /* the block's last word first */
    /* words below `trusted` need only their flag */
    size_t trusted = ll_in_trusted(in, first);
    for (size_t i = b; i < e; i++) {
      uint64_t v = __atomic_load_n(&words[i], __ATOMIC_RELAXED);
      if (__builtin_expect((uint32_t)(v >> 32) != flag || i >= trusted, 0)) {
        WEFT_TRY(ll_in_wait_word(in, first + i, &v));
        trusted = ll_in_trusted(in, first);
      }
      data = (uint32_t)v;
      if (__builtin_expect(i < nbytes / 4, 1)) memcpy(d + 4 * i, &data, 4);
      else memcpy(d + 4 * i, &data, nbytes % 4); /* a partial last word */
    }
  }
  return weftSuccess;
}

/* Returns the slot's credit to the sender. */
static void ll_in_end(struct ll_in *in) {
  struct weft_conn *c = in->conn;
  c->step++;
  __atomic_store_n(&c->ctrl->head, c->step, __ATOMIC_RELEASE);
}

/* --- the signature -------------------------------------------------------
 * A signed call's first slot on a connection carries the signature as four
 * payload words after the data's (padded) last word. The flags make the
 * words the step's own, so no mixing is needed. */

/* Appends the signature to the call's first slot. */
static void ll_sig_put(struct prims *p, struct ll_out *o) {
  if (!p->sig_send) return;
  p->sig_send = 0;
  ll_out_put(o, p->sig, sizeof *p->sig);
}

/* Payload bytes the receiver waits for in a slot of nbytes of data: the
 * signature's words too in the call's first slot. */
static size_t ll_in_nbytes(const struct prims *p, size_t nbytes) {
  return p->sig_recv ? (nbytes + 3) / 4 * 4 + sizeof(struct signature_packed) : nbytes;
}

/* How long a mismatched first slot is waited for to be finished (its
 * signature read): the sender stores its words back to back. */
#define LL_MISMATCH_SLOT_WAIT_NS 20000000ull

/* The first slot does not hold this call's data and signature as this rank
 * expects (res: how taking it failed): names what differs where the
 * sender's finished slot ends in its signature, and breaks the comm. */
__attribute__((noinline, cold)) static weftResult_t ll_sig_mismatch(struct ll_in *in,
                                                                    weftResult_t res) {
  struct prims *p = in->p;
  struct weft_conn *c = in->conn;
  struct weftComm *comm = p->comm;
  if (res != weftInvalidUsage && res != weftSuccess) return res; /* a timeout, a dead peer */
  struct signature mine, theirs;
  signature_unpack(&mine, p->sig);
  memset(&theirs, 0, sizeof theirs);
  /* the sender moves tail once the slot's last word is stored: a slot seen
   * wrong while its words still arrive is waited for a little, so that the
   * signature it ends in names what differs */
  const uint64_t give_up_ns = clock_ns() + LL_MISMATCH_SLOT_WAIT_NS;
  while (__atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) <= c->step &&
         __atomic_load_n(&c->ctrl->poison, __ATOMIC_ACQUIRE) == 0 && clock_ns() < give_up_ns)
    sched_yield();
  if (__atomic_load_n(&c->ctrl->tail, __ATOMIC_ACQUIRE) > c->step) {
    const uint32_t used = c->ctrl->slot_used_nbytes[slot_index(c->step, c->nslots)];
    const size_t nwords = (used & PRIMS_USED_NBYTES_MASK) / 8;
    if ((used & PRIMS_LL_USED_MARK) && nwords >= 4 && nwords * 8 <= c->slot_nbytes) {
      uint32_t data[4];
      for (int i = 0; i < 4; i++) data[i] = (uint32_t)in->words[nwords - 4 + (size_t)i];
      struct signature_packed packed;
      memcpy(&packed, data, sizeof packed);
      signature_unpack(&theirs, &packed);
    }
  }
  if (theirs.magic == SIGNATURE_MAGIC) {
    const int lower = c->peer_rank < comm->rank;
    const struct signature pair[2] = {lower ? theirs : mine, lower ? mine : theirs};
    const int ranks[2] = {lower ? c->peer_rank : comm->rank, lower ? comm->rank : c->peer_rank};
    if (signature_compare_ranks(pair, ranks, 2, "ranks disagree on a collective") != weftSuccess)
      return comm_fail_alone(comm, weftInvalidUsage);
  }
  weft_error_set(weftInvalidUsage,
                 "ranks disagree on a collective: %s: rank %d's first slot (LL) does not hold "
                 "the data and signature rank %d expects: it is in another call (count, "
                 "datatype, root, collective or protocol differ)",
                 coll_kind_name((enum coll_kind)mine.coll), c->peer_rank, comm->rank);
  return comm_fail_alone(comm, weftInvalidUsage);
}

/* Takes the signature after nbytes of data in the call's first slot and
 * compares it with this rank's. */
static weftResult_t ll_sig_check(struct ll_in *in, size_t nbytes) {
  struct prims *p = in->p;
  if (!p->sig_recv) return weftSuccess;
  p->sig_recv = 0;
  struct signature_packed theirs;
  weftResult_t res = ll_in_take(in, (nbytes + 3) / 4, &theirs, sizeof theirs);
  if (res == weftSuccess && signature_packed_same(&theirs, p->sig)) return weftSuccess;
  return ll_sig_mismatch(in, res);
}

weftResult_t prims_ll_sign_alone(struct prims *p, unsigned flags) {
  if (flags & PRIMS_SEND) {
    struct ll_out o;
    p->sig_send = 1;
    WEFT_TRY(ll_out_begin(p, &o));
    ll_sig_put(p, &o);
    ll_out_end(&o);
    return weftSuccess;
  }
  struct ll_in in;
  p->sig_recv = 1;
  WEFT_TRY(ll_in_begin(p, ll_in_nbytes(p, 0), &in));
  WEFT_TRY(ll_sig_check(&in, 0));
  ll_in_end(&in);
  return weftSuccess;
}

/* --- the step ----------------------------------------------------------- */

/* src -> next (SEND), and to dst where COPY names another buffer. */
static weftResult_t ll_send(struct prims *p, unsigned flags, const void *src, void *dst,
                            size_t nbytes) {
  struct ll_out o;
  WEFT_TRY(ll_out_begin(p, &o));
  ll_out_put(&o, src, nbytes);
  ll_sig_put(p, &o);
  ll_out_end(&o);
  if ((flags & PRIMS_COPY) && dst != NULL && dst != src) memcpy(dst, src, nbytes);
  return weftSuccess;
}

/* prev -> dst, the slot at once. */
static weftResult_t ll_recv(struct prims *p, void *dst, size_t nbytes) {
  struct ll_in in;
  WEFT_TRY(ll_in_begin(p, ll_in_nbytes(p, nbytes), &in));
  WEFT_TRY(ll_sig_check(&in, nbytes)); /* the slot's last words: its data is in by then */
  WEFT_TRY(ll_in_take(&in, 0, dst, nbytes));
  ll_in_end(&in);
  return weftSuccess;
}

/* prev (op src) -> next and/or dst, a stage at a time, so that the next rank
 * gets the first words while the last still come in. The words land in dst
 * where they are only copied there, else in the stage; a reduction writes the
 * final value (COPY) to dst and back into the stage, which goes on. The flags
 * are tested once per stage, never in the loops over words. */
static weftResult_t ll_forward(struct prims *p, unsigned flags, const char *src, char *dst,
                               size_t nbytes) {
  const size_t esize = p->elem_nbytes;
  const int reduce = (flags & PRIMS_REDUCE) != 0, send = (flags & PRIMS_SEND) != 0,
            copy = (flags & PRIMS_COPY) != 0;
  const int divisor = copy ? p->divisor : 1;
  alignas(64) unsigned char stage[LL_STAGE_NBYTES];
  struct ll_in in;
  struct ll_out o;
  const int first = p->sig_recv;
  WEFT_TRY(ll_in_begin(p, ll_in_nbytes(p, nbytes), &in));
  if (send) WEFT_TRY(ll_out_begin(p, &o));
  for (size_t off = 0; off < nbytes; off += LL_STAGE_NBYTES) {
    const size_t n = nbytes - off < LL_STAGE_NBYTES ? nbytes - off : LL_STAGE_NBYTES;
    char *got = !reduce && copy ? dst + off : (char *)stage;
    weftResult_t res = ll_in_take(&in, off / 4, got, n);
    if (__builtin_expect(res != weftSuccess, 0)) return first ? ll_sig_mismatch(&in, res) : res;
    if (reduce)
      p->reduce(copy ? dst + off : got, copy && send ? got : NULL, got, src + off, n / esize,
                divisor);
    /* the first slot's last stage goes on only once the signature compared:
     * a rank's step completes with the last stage, so no rank downstream of
     * a refusal finishes a step that depends on it */
    if (first && off + n >= nbytes) WEFT_TRY(ll_sig_check(&in, nbytes));
    if (send) ll_out_put(&o, got, n); /* re-flagged for the next rank */
  }
  WEFT_TRY(ll_sig_check(&in, nbytes));
  if (send) {
    ll_sig_put(p, &o);
    ll_out_end(&o);
  }
  ll_in_end(&in);
  return weftSuccess;
}

weftResult_t prims_ll_step(struct prims *p, unsigned flags, const void *src, void *dst,
                           size_t count) {
  const size_t nbytes = count * p->elem_nbytes;
  if (!(flags & PRIMS_RECV)) return ll_send(p, flags, src, dst, nbytes);
  if (!(flags & (PRIMS_REDUCE | PRIMS_SEND))) return ll_recv(p, dst, nbytes);
  return ll_forward(p, flags, src, dst, nbytes);
}
