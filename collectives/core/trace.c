/* Each communicator's trace (trace.h): a ring of its last calls, written by
 * the thread that makes them, read by any thread; and its dumps. */
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../transport/base/param.h"
#include "../../transport/base/status.h"

struct weft_param trace_params[] = {
    [P_TRACE_ENTRIES] = {.name = "WEFT_TRACE_ENTRIES", .type = PARAM_INT, .default_str = "256",
     .min = 0, .max = 1 << 20, .out_of_range = PARAM_RANGE_CLAMP,
     .doc = "calls (collectives, sends, receives) each communicator's trace keeps, rounded up "
            "to a power of two; `0` keeps none: no trace, no dumps, a timeout's error does "
            "not say where the other ranks are, and ranks waiting in different collectives "
            "wait until the timeout instead of failing within a second as a mismatch",
     .see = "diagnosis.md"},
    [P_TRACE_DIR] = {.name = "WEFT_TRACE_DIR", .type = PARAM_STR,
     .doc = "directory each rank writes its trace into as JSON "
            "(`weft_trace_<job>_rank<R>.json`) when a call of a communicator times out or fails, "
            "when it is aborted, and on `WEFT_TRACE_SIGNAL`; read them with "
            "`weft-info --trace DIR`. Unset: no automatic dumps",
     .see = "diagnosis.md"},
    [P_TRACE_SIGNAL] = {.name = "WEFT_TRACE_SIGNAL", .type = PARAM_STR,
     .doc = "a signal (`USR1`, `SIGUSR2` or a number) on which every communicator of the "
            "process dumps its trace into `WEFT_TRACE_DIR` (from a thread of weft's, not the "
            "handler); unset: weft installs no handler",
     .see = "diagnosis.md"},
    [P_HANG_ASK_MS] = {.name = "WEFT_HANG_ASK_MS", .type = PARAM_INT, .default_str = "500",
     .min = 0, .max = 3600000, .out_of_range = PARAM_RANGE_CLAMP,
     .doc = "milliseconds a wait of a collective lasts (on device memory: that a comm's "
            "kernels have work and end nothing, as `weftCommGetAsyncError` sees) before the "
            "rank asks its peers, over the bootstrap, where they are (again after twice as "
            "long, and so on): a peer in another collective under the same number is then "
            "`weftInvalidUsage` on every waiting rank at once, a peer that refused the call of "
            "its own `weftRemoteError`; `0` asks only once the timeout has passed",
     .see = "diagnosis.md"},
    PARAM_END,
};

/* A slot of the ring: gen is odd while the writer changes the call, so a
 * reader that sees it odd, or changed across its copy, copies again. */
struct trace_slot {
  uint32_t gen;
  uint32_t unused;
  struct trace_call call;
  struct trace_launch launch; /* a device call's; zeros for the host's */
};

struct trace {
  struct trace_slot *ring;
  uint64_t mask;     /* entries - 1 */
  uint64_t next_id;  /* ids given so far */
  uint64_t coll_seq; /* collectives numbered so far */
  uint64_t p2p_seq;  /* sends and receives numbered so far */
  int rank;
  int nranks;
  uint64_t job_hash;
  uint64_t ask_after_ns; /* WEFT_HANG_ASK_MS, read once */
  int shared;            /* a stream's thread writes it too (trace_share) */
  char name[64];
  struct trace *next; /* in the registry the signal dumps */
  /* where device calls' states are read from, held while a reader asks */
  pthread_mutex_t probe_mutex;
  trace_launch_fn probe;
  void *probe_arg;
};

/* The calls' times come from the coarse clock (the kernel's tick, a few
 * milliseconds, read without asking the hardware: a few nanoseconds, where
 * the precise clock takes tens, a tenth of an 8-byte all-reduce); what they
 * are for, how long ago a rank did what, needs no better. */
static inline int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t trace_now_ns(void) { return now_ns(); }

const char *trace_state_name(enum trace_state s) {
  static const char *const names[TRACE_NUM_STATES] = {"scheduled", "started", "waiting",
                                                      "completed", "failed"};
  return (unsigned)s < TRACE_NUM_STATES ? names[s] : "?";
}

const char *trace_type_name(int32_t t) {
  static const char *const names[weftNumTypes] = {
      "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
      "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
  return t >= 0 && t < weftNumTypes ? names[t] : "?";
}

const char *trace_op_name(int32_t op) {
  static const char *const names[weftNumOps] = {"sum", "prod", "max", "min", "avg"};
  return op >= 0 && op < weftNumOps ? names[op] : "premulsum";
}

/* --- the registry a signal dumps ---------------------------------------- */

static pthread_mutex_t registry_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct trace *registry;
static int signal_pipe[2] = {-1, -1};

/* The handler only writes a byte (async-signal-safe); the dumps are the
 * signal thread's. */
static void signal_handler(int sig) {
  (void)sig;
  const int saved = errno;
  if (signal_pipe[1] >= 0) {
    ssize_t n = write(signal_pipe[1], "s", 1);
    (void)n;
  }
  errno = saved;
}

static void *signal_thread_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "weft-trace");
  for (;;) {
    char c;
    ssize_t n = read(signal_pipe[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return NULL;
    pthread_mutex_lock(&registry_mutex);
    for (struct trace *t = registry; t != NULL; t = t->next)
      trace_dump_to_dir(t, TRACE_ON_SIGNAL, NULL);
    pthread_mutex_unlock(&registry_mutex);
  }
}

static int signal_parse(const char *s) {
  static const struct { const char *name; int sig; } names[] = {
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP}, {"QUIT", SIGQUIT},
      {"TERM", SIGTERM}, {"INT", SIGINT}, {"PWR", SIGPWR}, {"WINCH", SIGWINCH}};
  if (strncmp(s, "SIG", 3) == 0) s += 3;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(s, names[i].name) == 0) return names[i].sig;
  char *end;
  long v = strtol(s, &end, 10);
  return *s != '\0' && *end == '\0' && v > 0 && v < NSIG ? (int)v : -1;
}

/* Installs WEFT_TRACE_SIGNAL's handler and thread, once per process. */
static void signal_install(void) {
  const char *s = param_str(&trace_params[P_TRACE_SIGNAL]);
  if (s == NULL || *s == '\0') return;
  int sig = signal_parse(s);
  if (sig < 0 || sig == SIGKILL || sig == SIGSTOP) {
    WEFT_WARN(LOG_COLL, "WEFT_TRACE_SIGNAL=%s: not a signal weft can catch; no handler", s);
    return;
  }
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) {
    WEFT_WARN(LOG_COLL, "WEFT_TRACE_SIGNAL: pipe: %m");
    return;
  }
  fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK); /* a full pipe drops the byte, never blocks */
  pthread_t tid;
  if (pthread_create(&tid, NULL, signal_thread_main, NULL) != 0) {
    WEFT_WARN(LOG_COLL, "WEFT_TRACE_SIGNAL: starting its thread failed");
    return;
  }
  pthread_detach(tid);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = signal_handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
  WEFT_INFO(LOG_COLL, "signal %d dumps every communicator's trace", sig);
}
static pthread_once_t signal_once = PTHREAD_ONCE_INIT;

/* --- the ring ------------------------------------------------------------- */

struct trace *trace_create(int rank, int nranks, uint64_t job_hash, const char *name) {
  int64_t want = param_int(&trace_params[P_TRACE_ENTRIES]);
  if (want <= 0) return NULL;
  uint64_t n = 1;
  while ((int64_t)n < want) n <<= 1;
  struct trace *t = calloc(1, sizeof *t);
  if (t != NULL) t->ring = calloc(n, sizeof *t->ring);
  if (t == NULL || t->ring == NULL) {
    free(t);
    WEFT_WARN(LOG_COLL, "no memory for a trace of %" PRIu64 " calls: tracing is off", n);
    return NULL;
  }
  t->mask = n - 1;
  pthread_mutex_init(&t->probe_mutex, NULL);
  t->rank = rank;
  t->nranks = nranks;
  t->job_hash = job_hash;
  const int64_t ask_ms = param_int(&trace_params[P_HANG_ASK_MS]);
  t->ask_after_ns = ask_ms > 0 ? (uint64_t)ask_ms * 1000000ull : 0;
  snprintf(t->name, sizeof t->name, "%s", name != NULL ? name : "");
  pthread_once(&signal_once, signal_install);
  pthread_mutex_lock(&registry_mutex);
  t->next = registry;
  registry = t;
  pthread_mutex_unlock(&registry_mutex);
  return t;
}

void trace_destroy(struct trace *t) {
  if (t == NULL) return;
  pthread_mutex_lock(&registry_mutex);
  for (struct trace **p = &registry; *p != NULL; p = &(*p)->next)
    if (*p == t) {
      *p = t->next;
      break;
    }
  pthread_mutex_unlock(&registry_mutex);
  pthread_mutex_destroy(&t->probe_mutex);
  free(t->ring);
  free(t);
}

void trace_launch_probe_set(struct trace *t, trace_launch_fn fn, void *arg) {
  if (t == NULL) return;
  pthread_mutex_lock(&t->probe_mutex);
  t->probe = fn;
  t->probe_arg = arg;
  pthread_mutex_unlock(&t->probe_mutex);
}

uint64_t trace_ask_after_ns(const struct trace *t) { return t != NULL ? t->ask_after_ns : 0; }

/* The call's fields are stored, and its words loaded, one by one and
 * atomically (relaxed): a reader racing the writer sees a mix, which the
 * slot's gen tells it to copy again, and no field is ever torn. */
#define CALL_WORDS ((sizeof(struct trace_call) + sizeof(struct trace_launch)) / sizeof(uint64_t))
_Static_assert(sizeof(struct trace_call) % sizeof(uint64_t) == 0 &&
                   offsetof(struct trace_slot, launch) ==
                       offsetof(struct trace_slot, call) + sizeof(struct trace_call),
               "a call and its launches are whole words, one after the other");

/* A consistent copy of slot s (and of its launches, where launch is not
 * NULL): 1, or 0 when the writer kept changing it. */
static int slot_read(const struct trace_slot *s, struct trace_call *out,
                     struct trace_launch *launch) {
  const uint64_t *src = (const uint64_t *)(const void *)&s->call;
  uint64_t w[CALL_WORDS];
  for (int tries = 0; tries < 1000; tries++) {
    const uint32_t g1 = __atomic_load_n(&s->gen, __ATOMIC_ACQUIRE);
    if (g1 & 1u) continue;
    for (size_t i = 0; i < CALL_WORDS; i++) w[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&s->gen, __ATOMIC_RELAXED) == g1) {
      memcpy(out, w, sizeof *out);
      if (launch != NULL) memcpy(launch, (const char *)w + sizeof *out, sizeof *launch);
      return 1;
    }
  }
  return 0;
}

/* A device call's state as its launches say now (the probe's), over the
 * state it was recorded in; its times stay the host's: when it was
 * enqueued (its end is not read from the GPU, so a completed one has no
 * end time). */
static void device_view(const struct trace *t, const struct trace_launch *l,
                        struct trace_call *c) {
  if (!c->on_device || l->last == 0 || c->state == TRACE_COMPLETED || c->state == TRACE_FAILED)
    return;
  struct trace *mt = (struct trace *)t; /* the mutex only */
  pthread_mutex_lock(&mt->probe_mutex);
  if (t->probe != NULL) t->probe(t->probe_arg, l, &c->state, &c->result, &c->waiting_on);
  pthread_mutex_unlock(&mt->probe_mutex);
}

/* Stores field f of call c whole (relaxed): for the readers' seqlock. */
#define CALL_SET(c, f, v) __atomic_store_n(&(c)->f, (v), __ATOMIC_RELAXED)

/* Two neighbouring 32-bit fields of c, from first on (8-byte aligned), as
 * one whole 64-bit store: the readers load words of 8 bytes (slot_read),
 * so the pair is never seen half written. */
union call_pair {
  int32_t v[2];
  uint64_t w;
};
#define CALL_SET2(c, first, lo, hi)                                                        \
  __atomic_store_n((uint64_t *)(void *)&(c)->first,                                       \
                   ((union call_pair){.v = {(int32_t)(lo), (int32_t)(hi)}}).w, __ATOMIC_RELAXED)
_Static_assert(offsetof(struct trace_call, coll) % 8 == 0 &&
                   offsetof(struct trace_call, datatype) == offsetof(struct trace_call, coll) + 4 &&
                   offsetof(struct trace_call, root) == offsetof(struct trace_call, op) + 4 &&
                   offsetof(struct trace_call, waiting_on) ==
                       offsetof(struct trace_call, state) + 4 &&
                   offsetof(struct trace_call, proto) == offsetof(struct trace_call, algo) + 4 &&
                   offsetof(struct trace_call, result) == offsetof(struct trace_call, nranks) + 4 &&
                   offsetof(struct trace_call, on_device) % 8 == 0 &&
                   offsetof(struct trace_call, unused) == offsetof(struct trace_call, on_device) + 4,
               "CALL_SET2's pairs are neighbours, each pair 8-byte aligned");

/* Writers. The thread that makes the calls writes its trace alone until a
 * call goes to a stream (trace_share); from then on the stream's thread
 * writes states into the same ring, and a slot the caller reuses (the ring
 * wrapped under calls still queued) may be one the stream's thread is
 * changing: each writer then takes the slot by making its gen odd with a
 * compare-and-swap, and waits while another writer holds it (a few stores).
 * Alone, the caller takes it with a plain store (an atomic exchange costs
 * what a few of an 8-byte all-reduce's other steps do). */
static inline uint32_t slot_take(const struct trace *t, struct trace_slot *s) {
  if (!__atomic_load_n(&t->shared, __ATOMIC_RELAXED)) {
    const uint32_t g = s->gen + 1; /* no other writer */
    __atomic_store_n(&s->gen, g, __ATOMIC_RELAXED); /* odd: being written */
    __atomic_thread_fence(__ATOMIC_RELEASE);
    return g;
  }
  for (unsigned spins = 0;; spins++) {
    uint32_t g = __atomic_load_n(&s->gen, __ATOMIC_RELAXED);
    if (!(g & 1u) && __atomic_compare_exchange_n(&s->gen, &g, g + 1, 0, __ATOMIC_ACQUIRE,
                                                 __ATOMIC_RELAXED)) {
      __atomic_thread_fence(__ATOMIC_RELEASE);
      return g + 1;
    }
    if (spins >= 64) sched_yield(); /* its writer lost the CPU */
  }
}

/* Ends the write slot_take began (gen taken: odd). */
static inline void slot_release(struct trace_slot *s, uint32_t gen) {
  __atomic_store_n(&s->gen, gen + 1, __ATOMIC_RELEASE);
}

void trace_share(struct trace *t) {
  if (t != NULL && !__atomic_load_n(&t->shared, __ATOMIC_RELAXED))
    __atomic_store_n(&t->shared, 1, __ATOMIC_RELAXED);
}

/* Writes plan's call into the next slot, in state, with its times and
 * result; returns its id. The fields go in pairs into the slot: a whole
 * struct built first and copied would be stored and loaded back at once
 * (stalls worth a tenth of an 8-byte all-reduce). */
static inline uint64_t slot_write(struct trace *t, const struct weft_plan *plan,
                                  enum trace_state state, int64_t created, int64_t started,
                                  int64_t done, weftResult_t result,
                                  const struct trace_launch *launch) {
  const uint64_t id = t->next_id + 1;
  const int p2p = plan_is_sendrecv(plan);
  struct trace_slot *s = &t->ring[id & t->mask];
  struct trace_call *c = &s->call;
  const uint32_t gen = slot_take(t, s);
  CALL_SET(c, id, id);
  CALL_SET(c, seq, p2p ? ++t->p2p_seq : ++t->coll_seq);
  CALL_SET(c, count, (uint64_t)plan->count);
  CALL_SET(c, t_created_ns, created);
  CALL_SET(c, t_started_ns, started);
  CALL_SET(c, t_done_ns, done);
  CALL_SET2(c, coll, plan->coll, plan->datatype);
  CALL_SET2(c, op, plan->op,
            (p2p || coll_has_root(plan->coll)) ? plan->root : -1);
  CALL_SET2(c, state, state, -1); /* waiting on nobody */
  CALL_SET2(c, algo, plan->algo, plan->proto);
  CALL_SET2(c, nranks, t->nranks, result);
  CALL_SET2(c, on_device, launch != NULL, 0);
  CALL_SET(&s->launch, first, launch != NULL ? launch->first : 0);
  CALL_SET(&s->launch, last, launch != NULL ? launch->last : 0);
  CALL_SET(&s->launch, nblocks, launch != NULL ? launch->nblocks : 0);
  slot_release(s, gen);
  __atomic_store_n(&t->next_id, id, __ATOMIC_RELEASE); /* readers see it whole */
  return id;
}

uint64_t trace_record(struct trace *t, const struct weft_plan *plan, int starts_now) {
  if (t == NULL) return 0;
  const int64_t now = now_ns();
  return slot_write(t, plan, starts_now ? TRACE_STARTED : TRACE_SCHEDULED, now,
                    starts_now ? now : 0, 0, weftSuccess, NULL);
}

uint64_t trace_record_launched(struct trace *t, const struct weft_plan *plan,
                               const struct trace_launch *l) {
  if (t == NULL) return 0;
  return slot_write(t, plan, TRACE_SCHEDULED, now_ns(), 0, 0, weftSuccess, l);
}

uint64_t trace_record_done(struct trace *t, const struct weft_plan *plan, weftResult_t result) {
  if (t == NULL) return 0;
  const int64_t now = now_ns();
  return slot_write(t, plan, result == weftSuccess ? TRACE_COMPLETED : TRACE_FAILED, now, now,
                    now, result, NULL);
}

void trace_set_state(struct trace *t, uint64_t id, enum trace_state state, int peer,
                     weftResult_t result) {
  if (t == NULL || id == 0) return;
  struct trace_slot *s = &t->ring[id & t->mask];
  struct trace_call *c = &s->call;
  /* overwritten: more calls were queued than the ring holds */
  if (__atomic_load_n(&c->id, __ATOMIC_RELAXED) != id) return;
  if (state == TRACE_STARTED && __atomic_load_n(&c->state, __ATOMIC_RELAXED) == TRACE_STARTED)
    return; /* recorded as it started */
  /* only the fields that change, each whole */
  const uint32_t gen = slot_take(t, s);
  if (__atomic_load_n(&c->id, __ATOMIC_RELAXED) != id) { /* overwritten as it was taken */
    slot_release(s, gen);
    return;
  }
  switch (state) {
    case TRACE_STARTED: __atomic_store_n(&c->t_started_ns, now_ns(), __ATOMIC_RELAXED); break;
    case TRACE_WAITING: __atomic_store_n(&c->waiting_on, peer, __ATOMIC_RELAXED); break;
    case TRACE_COMPLETED:
    case TRACE_FAILED:
      __atomic_store_n(&c->t_done_ns, now_ns(), __ATOMIC_RELAXED);
      __atomic_store_n(&c->result, (int32_t)result, __ATOMIC_RELAXED);
      break;
    default: break;
  }
  __atomic_store_n(&c->state, (int32_t)state, __ATOMIC_RELAXED);
  slot_release(s, gen);
}

void trace_done(struct trace *t, uint64_t id, weftResult_t result, int read_clock) {
  if (t == NULL || id == 0) return;
  struct trace_slot *s = &t->ring[id & t->mask];
  struct trace_call *c = &s->call;
  if (__atomic_load_n(&c->id, __ATOMIC_RELAXED) != id) return;
  const uint32_t gen = slot_take(t, s);
  if (__atomic_load_n(&c->id, __ATOMIC_RELAXED) == id) { /* not overwritten as it was taken */
    int64_t done = __atomic_load_n(&c->t_started_ns, __ATOMIC_RELAXED);
    if (read_clock || done == 0) done = now_ns();
    CALL_SET(c, t_done_ns, done);
    CALL_SET(c, result, (int32_t)result);
    CALL_SET(c, state, result == weftSuccess ? TRACE_COMPLETED : TRACE_FAILED);
  }
  slot_release(s, gen);
}

int trace_get(const struct trace *t, uint64_t id, struct trace_call *out) {
  if (t == NULL || id == 0) return 0;
  struct trace_launch l;
  if (!slot_read(&t->ring[id & t->mask], out, &l) || out->id != id) return 0;
  device_view(t, &l, out);
  return 1;
}

int trace_window(const struct trace *t, struct trace_call *out, int max) {
  struct trace_call oldest;
  if (t == NULL || max <= 0) return 0;
  if (!trace_oldest_unfinished(t, &oldest)) return trace_latest(t, out, max);
  const uint64_t last = __atomic_load_n(&t->next_id, __ATOMIC_ACQUIRE);
  uint64_t first = oldest.id > 1 ? oldest.id - 1 : oldest.id;
  /* back over sends and receives to the collective before them (a gather's
   * mark before its sends), within a quarter of max, so that a peer asking
   * about that collective's number finds it */
  struct trace_call c;
  for (uint64_t id = first, back = 0; id > 1 && back < (uint64_t)max / 4 && trace_get(t, id, &c) &&
                                      (c.coll == COLL_SEND || c.coll == COLL_RECV);
       back++)
    if (trace_get(t, --id, &c) && c.coll != COLL_SEND && c.coll != COLL_RECV) first = id;
  if (last > t->mask && first < last - t->mask) first = last - t->mask;
  /* more than max from there: the first half from there, the rest the
   * newest (a verdict reads a rank's newest call as where it is) */
  const uint64_t head = last - first + 1 > (uint64_t)max ? (uint64_t)max / 2 : (uint64_t)max;
  int n = 0;
  for (uint64_t id = first; id <= last && id < first + head; id++)
    if (trace_get(t, id, &out[n])) n++;
  const uint64_t tail_first = last - (uint64_t)(max - (int)head) + 1;
  for (uint64_t id = tail_first; head < (uint64_t)max && id <= last && n < max; id++)
    if (id >= first + head && trace_get(t, id, &out[n])) n++;
  return n;
}

int trace_oldest_unfinished(const struct trace *t, struct trace_call *out) {
  if (t == NULL) return 0;
  const uint64_t last = __atomic_load_n(&t->next_id, __ATOMIC_ACQUIRE);
  const uint64_t first = last > t->mask ? last - t->mask : 1;
  int found = 0;
  for (uint64_t id = last; id >= first && id > 0; id--) {
    struct trace_call c;
    if (!trace_get(t, id, &c) || c.state == TRACE_COMPLETED) break;
    *out = c;
    found = 1;
  }
  return found;
}

int trace_latest(const struct trace *t, struct trace_call *out, int max) {
  if (t == NULL || max <= 0) return 0;
  const uint64_t last = __atomic_load_n(&t->next_id, __ATOMIC_ACQUIRE);
  uint64_t first = last > (uint64_t)max ? last - (uint64_t)max + 1 : 1;
  if (last - first + 1 > t->mask + 1) first = last - t->mask;
  int n = 0;
  for (uint64_t id = first; id <= last && last > 0; id++)
    if (trace_get(t, id, &out[n])) n++;
  return n;
}

/* --- JSON ----------------------------------------------------------------- */

static void json_string(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s != '\0'; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
    else if (c == '\n') fputs("\\n", out);
    else if (c < 0x20) fprintf(out, "\\u%04x", c);
    else fputc(c, out);
  }
  fputc('"', out);
}

static const char *profiling_name(int32_t coll) {
  static const char *const names[COLL_NUM] = {
      "weft:all_reduce", "weft:all_gather", "weft:reduce_scatter", "weft:broadcast",
      "weft:reduce",     "weft:send",       "weft:recv",           "weft:gather",
      "weft:scatter",    "weft:all_to_all"};
  return coll >= 0 && coll < COLL_NUM ? names[coll] : "weft:?";
}

static const char *reason_name(enum trace_reason r) {
  switch (r) {
    case TRACE_ON_TIMEOUT: return "timeout";
    case TRACE_ON_FAILURE: return "failure";
    case TRACE_ON_ABORT: return "abort";
    case TRACE_ON_SIGNAL: return "signal";
    default: return "request";
  }
}

/* The element counts of the call's input and output ([] when it has none). */
static void call_sizes(const struct trace_call *c, uint64_t *in, uint64_t *out) {
  const uint64_t n = (uint64_t)(c->nranks > 0 ? c->nranks : 1);
  *in = *out = c->count;
  if (c->coll == COLL_ALLGATHER) *out = c->count * n;
  if (c->coll == COLL_REDUCESCATTER) *in = c->count * n;
  if (c->coll == COLL_GATHER || c->coll == COLL_ALLTOALL) *out = c->count * n;
  if (c->coll == COLL_SCATTER || c->coll == COLL_ALLTOALL) *in = c->count * n;
  if (c->coll == COLL_SEND) *out = UINT64_MAX;
  if (c->coll == COLL_RECV) *in = UINT64_MAX;
}

static void json_sizes(FILE *out, const char *key, uint64_t n, int32_t datatype,
                       const char *types_key) {
  if (n == UINT64_MAX) fprintf(out, ", \"%s\": [], \"%s\": []", key, types_key);
  else fprintf(out, ", \"%s\": [[%" PRIu64 "]], \"%s\": [\"%s\"]", key, n, types_key,
               trace_type_name(datatype));
}

static void json_call(FILE *out, const struct trace_call *c) {
  static const char *const algos[] = {"ring", "tree", "rd", "direct", "cma", "bulk"};
  _Static_assert(sizeof algos / sizeof algos[0] == ALGO_NUM, "a name per enum coll_algo");
  static const char *const protos[] = {"simple", "ll"};
  const int p2p = c->coll == COLL_SEND || c->coll == COLL_RECV;
  fprintf(out, "    {\"record_id\": %" PRIu64 ", \"collective_seq_id\": %" PRIu64
               ", \"p2p_seq_id\": %" PRIu64 ", \"profiling_name\": \"%s\", \"kind\": \"%s\"",
          c->id, p2p ? 0 : c->seq, p2p ? c->seq : 0, profiling_name(c->coll),
          coll_kind_name((enum coll_kind)c->coll));
  uint64_t in, outn;
  call_sizes(c, &in, &outn);
  json_sizes(out, "input_sizes", in, c->datatype, "input_dtypes");
  json_sizes(out, "output_sizes", outn, c->datatype, "output_dtypes");
  fprintf(out, ", \"count\": %" PRIu64 ", \"datatype\": \"%s\"", c->count,
          trace_type_name(c->datatype));
  if (c->coll == COLL_ALLREDUCE || c->coll == COLL_REDUCESCATTER || c->coll == COLL_REDUCE)
    fprintf(out, ", \"op\": \"%s\"", trace_op_name(c->op));
  if (coll_has_root(c->coll)) fprintf(out, ", \"root\": %d", c->root);
  if (p2p) fprintf(out, ", \"peer\": %d", c->root);
  fprintf(out, ", \"state\": \"%s\"", trace_state_name((enum trace_state)c->state));
  if (c->on_device) fputs(", \"device\": true", out);
  if (c->waiting_on >= 0) fprintf(out, ", \"waiting_on\": %d", c->waiting_on);
  fprintf(out, ", \"time_created_ns\": %" PRId64, c->t_created_ns);
  if (c->t_started_ns != 0)
    fprintf(out, ", \"time_discovered_started_ns\": %" PRId64, c->t_started_ns);
  if (c->t_done_ns != 0)
    fprintf(out, ", \"time_discovered_completed_ns\": %" PRId64, c->t_done_ns);
  /* a device call's plan is made as it is enqueued */
  const int planned = c->t_started_ns != 0 || c->on_device;
  if (c->algo >= 0 && c->algo < ALGO_NUM && planned)
    fprintf(out, ", \"algorithm\": \"%s\"", algos[c->algo]);
  if (c->proto >= 0 && c->proto < 2 && planned)
    fprintf(out, ", \"protocol\": \"%s\"", protos[c->proto]);
  if (c->state == TRACE_FAILED)
    fprintf(out, ", \"result\": \"%s\"", weftGetErrorString((weftResult_t)c->result));
  fputs("}", out);
}

weftResult_t trace_dump(const struct trace *t, FILE *out, enum trace_reason reason,
                        const char *error) {
  if (t == NULL)
    return weft_error_set(weftInvalidUsage, "the trace is off (WEFT_TRACE_ENTRIES=0)");
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const int version = WEFT_VERSION_CODE;
  fprintf(out, "{\n  \"version\": \"1\", \"library\": \"weft %d.%d.%d\",\n", version / 10000,
          version / 100 % 100, version % 100);
  fprintf(out, "  \"job\": \"%016" PRIx64 "\", \"comm_name\": ", t->job_hash);
  json_string(out, t->name);
  fprintf(out, ", \"rank\": %d, \"nranks\": %d, \"pid\": %d, \"hostname\": ", t->rank, t->nranks,
          (int)getpid());
  json_string(out, host);
  fprintf(out, ",\n  \"reason\": \"%s\", \"dump_time_ns\": %" PRId64 ", \"entries_max\": %" PRIu64,
          reason_name(reason), trace_now_ns(), t->mask + 1);
  if (error != NULL && *error != '\0') {
    fputs(", \"error\": ", out);
    json_string(out, error);
  }
  fputs(",\n  \"entries\": [\n", out);
  const uint64_t last = __atomic_load_n(&t->next_id, __ATOMIC_ACQUIRE);
  const uint64_t first = last > t->mask ? last - t->mask : 1;
  const char *sep = "";
  for (uint64_t id = first; id <= last && last > 0; id++) {
    struct trace_call c;
    if (!trace_get(t, id, &c)) continue;
    fputs(sep, out);
    json_call(out, &c);
    sep = ",\n";
  }
  fputs("\n  ]\n}\n", out);
  return ferror(out) ? weft_error_set(weftSystemError, "writing the trace failed") : weftSuccess;
}

void trace_dump_to_dir(const struct trace *t, enum trace_reason reason, const char *error) {
  const char *dir = param_str(&trace_params[P_TRACE_DIR]);
  if (t == NULL || dir == NULL || *dir == '\0') return;
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/weft_trace_%016" PRIx64 "_rank%d.json", dir, t->job_hash,
           t->rank);
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "we");
  if (f == NULL) {
    WEFT_WARN(LOG_COLL, "WEFT_TRACE_DIR: cannot write %s: %m", tmp);
    return;
  }
  weftResult_t res = trace_dump(t, f, reason, error);
  if (fclose(f) != 0 || res != weftSuccess || rename(tmp, path) != 0) {
    WEFT_WARN(LOG_COLL, "WEFT_TRACE_DIR: writing %s failed", path);
    unlink(tmp);
    return;
  }
  WEFT_INFO(LOG_COLL, "trace of rank %d written to %s (%s)", t->rank, path, reason_name(reason));
}
