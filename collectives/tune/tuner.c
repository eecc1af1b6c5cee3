/* The tuner: picks algorithm, protocol and channels for each collective from
 * a latency/bandwidth cost model, within what WEFT_ALGO and WEFT_PROTO allow.
 *
 * Both variables take NCCL's syntax: a comma list of names ("tree,ring"), or
 * the names to leave out after a caret ("^ll"), optionally per collective
 * ("allreduce:tree;broadcast:ring"); names are case-insensitive. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../../transport/base/status.h"
#include "../algo/algo.h"
#include "../algo/bulk.h"
#include "../algo/cma.h"
#include "../core/channel.h"
#include "../core/params.h"
#include "../core/plan.h"
#include "../core/signature.h"
#include "../core/tree_links.h"
#include "tuner.h"

static const char *const algo_names[ALGO_NUM] = {"ring", "tree", "rd", "direct", "cma", "bulk"};
static const char *const proto_names[PROTO_NUM] = {"simple", "ll"};
static const char *const coll_keys[COLL_NUM_RING] = {"allreduce", "allgather", "reducescatter",
                                                     "broadcast", "reduce"};

/* Which algorithms each collective has on the host. */
static int algo_exists(enum coll_kind coll, enum coll_algo algo) {
  return algo == ALGO_RING ||
         (coll == COLL_ALLREDUCE && (algo == ALGO_TREE || algo == ALGO_RD || algo == ALGO_DIRECT)) ||
         ((coll == COLL_BROADCAST || coll == COLL_REDUCE) && algo == ALGO_DIRECT);
}

const char *tuner_algo_name(int algo) { return algo >= 0 && algo < ALGO_NUM ? algo_names[algo] : "?"; }

static int name_index(const char *name, size_t len, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) == len && strncasecmp(name, names[i], len) == 0) return i;
  return -1;
}

int tuner_parse(const char *spec, const char *const *names, int nnames,
                uint8_t allowed[COLL_NUM_RING][8]) {
  for (int c = 0; c < COLL_NUM_RING; c++)
    for (int i = 0; i < nnames; i++) allowed[c][i] = 1;
  if (spec == NULL || *spec == '\0') return 0;
  int bad = 0;
  const char *entry = spec;
  while (*entry) {
    const char *end = strchr(entry, ';');
    size_t elen = end ? (size_t)(end - entry) : strlen(entry);
    /* optional "collective:" prefix */
    int c_first = 0, c_last = COLL_NUM_RING - 1;
    const char *colon = memchr(entry, ':', elen);
    const char *list = entry;
    if (colon != NULL) {
      int c = name_index(entry, (size_t)(colon - entry), coll_keys, COLL_NUM_RING);
      if (c < 0) bad = 1;
      c_first = c_last = c;
      list = colon + 1;
    }
    size_t llen = elen - (size_t)(list - entry);
    int exclude = llen > 0 && list[0] == '^';
    if (exclude) list++, llen--;
    uint8_t pick[8] = {0};
    for (size_t o = 0; o < llen;) {
      const char *comma = memchr(list + o, ',', llen - o);
      size_t nlen = comma ? (size_t)(comma - (list + o)) : llen - o;
      int i = name_index(list + o, nlen, names, nnames);
      if (i < 0) bad = 1;
      else pick[i] = 1;
      o += nlen + 1;
    }
    /* an entry that allows nothing (unknown names only, or every name
     * excluded) is ignored as a whole: it restricts nothing */
    int none = 1;
    for (int i = 0; i < nnames; i++) none &= (exclude ? !pick[i] : pick[i]) == 0;
    if (none) bad = 1;
    for (int c = c_first; c >= 0 && c <= c_last; c++)
      for (int i = 0; i < nnames; i++) allowed[c][i] = none || (exclude ? !pick[i] : pick[i]);
    entry += elen + (end ? 1 : 0);
  }
  return bad ? -1 : 0;
}

/* The parsed variables, re-parsed when the cached text changes (tests).
 * Any thread may tune a plan while another finds the text changed, so a
 * parsed set is never changed once published: each is allocated, kept on a
 * list for the life of the process (a new one only per new text) and made
 * current with one atomic store. */
struct tuner_rules {
  const char *algo_text, *proto_text;
  uint8_t algo[COLL_NUM_RING][8];
  uint8_t proto[COLL_NUM_RING][8];
  struct tuner_rules *next; /* every set parsed so far */
};
static struct tuner_rules *rules_current;
static struct tuner_rules *rules_all;
static pthread_mutex_t rules_mutex = PTHREAD_MUTEX_INITIALIZER;
/* tuner_rules_get for texts a and p that are not the current rules'. */
static __attribute__((noinline)) const struct tuner_rules *
tuner_rules_find(const char *a, const char *p, struct tuner_rules *fallback) {
  pthread_mutex_lock(&rules_mutex);
  struct tuner_rules *r = rules_all;
  while (r != NULL && (r->algo_text != a || r->proto_text != p)) r = r->next;
  if (r == NULL && (r = calloc(1, sizeof *r)) != NULL) {
    r->algo_text = a;
    r->proto_text = p;
    if (tuner_parse(a, algo_names, ALGO_NUM, r->algo) != 0)
      WEFT_WARN(LOG_COLL,
                "WEFT_ALGO=%s: unknown names are ignored (known: ring, tree, rd, direct, cma, bulk), and an entry "
                "left allowing no algorithm restricts nothing",
                a);
    if (tuner_parse(p, proto_names, PROTO_NUM, r->proto) != 0)
      WEFT_WARN(LOG_COLL,
                "WEFT_PROTO=%s: unknown names are ignored (known: simple, ll), and an entry "
                "left allowing no protocol restricts nothing",
                p);
    r->next = rules_all;
    rules_all = r;
  }
  if (r != NULL) __atomic_store_n(&rules_current, r, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&rules_mutex);
  if (r == NULL) {
    WEFT_WARN(LOG_COLL, "out of memory parsing WEFT_ALGO/WEFT_PROTO: every algorithm allowed");
    tuner_parse(NULL, algo_names, ALGO_NUM, fallback->algo);
    tuner_parse(NULL, proto_names, PROTO_NUM, fallback->proto);
    return fallback;
  }
  return r;
}

/* The current rules; when out of memory, everything allowed, in *fallback. */
static inline const struct tuner_rules *tuner_rules_get(struct tuner_rules *fallback) {
  const char *a = param_str(&coll_params[P_ALGO]), *p = param_str(&coll_params[P_PROTO]);
  const struct tuner_rules *cur = __atomic_load_n(&rules_current, __ATOMIC_ACQUIRE);
  if (cur != NULL && cur->algo_text == a && cur->proto_text == p) return cur;
  return tuner_rules_find(a, p, fallback);
}

int tuner_algo_allowed(enum coll_kind coll, enum coll_algo algo) {
  struct tuner_rules fallback;
  return tuner_rules_get(&fallback)->algo[coll][algo];
}

static int64_t allowed_key(const uint8_t allowed[COLL_NUM_RING][8]) {
  return (int64_t)param_hash(allowed, sizeof(uint8_t[COLL_NUM_RING][8]));
}

void tuner_rules_keys(int64_t *algo_key, int64_t *proto_key) {
  struct tuner_rules fallback;
  const struct tuner_rules *r = tuner_rules_get(&fallback);
  *algo_key = allowed_key(r->algo);
  *proto_key = allowed_key(r->proto);
}

/* The cost model (docs/design.md, "Tuner"), in microseconds. One set of
 * constants, measured on shared memory with 2 ranks (all-gather, all-reduce,
 * reduce-scatter at 8-64 B, 20000 iterations: LL never ahead of SIMPLE,
 * 0.21-0.27 us against 0.21-0.26, and it moves half the payload per cache
 * line, so it is taken only where WEFT_PROTO leaves nothing else). */
static const struct {
  double lat_us;       /* per dependent step */
  double bytes_per_us; /* payload */
} tuner_cost[PROTO_NUM] = {
    [PROTO_SIMPLE] = {0.46, 8000},
    [PROTO_LL] = {0.47, 1500},
};
/* Network transports: latency times this, bandwidth divided by that. */
#define TUNER_NET_LAT_FACTOR 40
#define TUNER_NET_BW_DIVISOR 8
/* More ranks on a host than CPUs for them (comm->oversubscribed_any):
 * a dependent step waits until the scheduler runs the rank that sends, a
 * context switch rather than a cache line. 3-4 ranks on 2 vCPUs (AMD EPYC,
 * KVM): 2.3-5 us per call for one step (direct), 3.7-10 us for recursive
 * doubling's 2-3 (docs/perf.md). */
#define TUNER_OVERSUB_LAT_FACTOR 10

/* Device buffers to another host (docs/cuda.md): the sending kernel writes
 * each slot into pinned host memory over PCIe, the proxy sends it, the
 * receiving kernel reads it back over PCIe. Per step the network's latency
 * plus two PCIe crossings (a mapped-memory store and the flag read across
 * the bus); the stages overlap slot by slot, so the bandwidth is the
 * slower of the network and PCIe. Datasheet figures (PCIe 4 x16, about
 * 1-2 us a round trip), not yet measured on a GPU. */
#define TUNER_DEV_PCIE_LAT_US 1.5
#define TUNER_DEV_PCIE_BYTES_PER_US 20000

/* Device buffers on one host (docs/cuda.md, "Tuner"): the device ring's
 * kernels, per dependent step and for the payload (bytes, as the model
 * counts them, over time: busbw). Measured with all_reduce_device_perf on an
 * H200 (gpu-check of 2026-11-27). SIMPLE: 33.5 us at 8 B for 4 ranks (6
 * steps) and 347 GB/s busbw at 128 MiB. LL: 13.5 us at 8 B for 4 ranks
 * under MPS (6 steps); at 2 and 4 MiB, 92 GB/s for 2 ranks and 98-127 GB/s
 * for 4 beyond that. 110 GB/s puts the change to SIMPLE where perf_proto
 * saw it: near 1 MiB for 2 ranks, between 2 and 4 MiB for 4. */
static const struct {
  double lat_us;
  double bytes_per_us;
} tuner_dev_cost[PROTO_NUM] = {
    [PROTO_SIMPLE] = {5.6, 347000},
    [PROTO_LL] = {2.25, 110000},
};

/* The device tree all-reduce's kernels, likewise: none measured yet (0),
 * so the tuner does not pick the tree on its own; WEFT_ALGO=tree (the ring
 * excluded) runs it, which is how a GPU measures these figures. Once they
 * are here, the model weighs the tree (2 * depth + 2 steps, each a slot's
 * latency, twice the bytes) against the ring as on the host. */
static const struct {
  double lat_us;
  double bytes_per_us;
} tuner_dev_tree_cost[PROTO_NUM] = {
    [PROTO_SIMPLE] = {0, 0},
    [PROTO_LL] = {0, 0},
};

static int tuner_dev_tree_measured(enum coll_proto proto) {
  return tuner_dev_tree_cost[proto].lat_us > 0 && tuner_dev_tree_cost[proto].bytes_per_us > 0;
}

static void tuner_cost_get(const struct weftComm *comm, enum coll_proto proto, int on_device,
                           double *lat_out, double *bw_out) {
  if (on_device && !comm->network) {
    *lat_out = tuner_dev_cost[proto].lat_us;
    *bw_out = tuner_dev_cost[proto].bytes_per_us;
    return;
  }
  double lat = tuner_cost[proto].lat_us, bw = tuner_cost[proto].bytes_per_us;
  if (comm->network) lat *= TUNER_NET_LAT_FACTOR, bw /= TUNER_NET_BW_DIVISOR;
  if (comm->oversubscribed_any) lat *= TUNER_OVERSUB_LAT_FACTOR;
  if (comm->network && on_device) {
    lat += 2 * TUNER_DEV_PCIE_LAT_US;
    if (bw > TUNER_DEV_PCIE_BYTES_PER_US) bw = TUNER_DEV_PCIE_BYTES_PER_US;
  }
  *lat_out = lat;
  *bw_out = bw;
}

/* Whether the executor can run proto for plan: device rings that cross
 * hosts carry SIMPLE slots only (a proxy cannot see an LL slot complete). */
static int tuner_proto_runs(const struct weftComm *comm, const struct weft_plan *plan,
                            enum coll_proto proto) {
  return proto == PROTO_SIMPLE || !(plan->on_device && comm->network);
}

/* Steps times latency plus bytes over bandwidth. The host executor runs a
 * plan's channels one after another on one thread (exec/host/run.c), each a
 * whole ring over its share: the steps repeat per channel, the bytes add up
 * to the same total. */
static double model_us(const struct weftComm *comm, const struct weft_plan *plan,
                       enum coll_algo algo, enum coll_proto proto, size_t nbytes, int nchannels) {
  const double n = comm->nranks;
  const enum coll_kind coll = plan->coll;
  double lat, bw;
  tuner_cost_get(comm, proto, plan->on_device, &lat, &bw);
  if (plan->on_device && algo == ALGO_TREE && tuner_dev_tree_measured(proto)) {
    lat = tuner_dev_tree_cost[proto].lat_us;
    bw = tuner_dev_tree_cost[proto].bytes_per_us;
  }
  double steps, bytes;
  int log2n = 0;
  while ((1 << log2n) < comm->nranks) log2n++;
  switch (algo) {
    case ALGO_TREE: /* across hosts the trees chain each host's ranks: deeper than log2 */
      steps = 2.0 * (comm->tree_depth > log2n ? comm->tree_depth : log2n) + 2;
      bytes = 2.0 * (double)nbytes;
      if (coll == COLL_ALLREDUCE && comm_tree_small(comm, nbytes)) {
        /* the tree of small calls, whole: its deepest rank is the last in heap order */
        struct tree_links last;
        tree_small_links(comm->nranks, comm->nranks - 1, &last);
        steps = 2.0 * last.depth + 2;
      }
      break;
    case ALGO_RD: steps = log2n + (comm->nranks & (comm->nranks - 1) ? 2 : 0);
                  bytes = steps * (double)nbytes; break;
    /* one hop; each further peer adds a slot to fill and a tail to poll,
     * whose transfers overlap the first's: less than a step each (recursive
     * doubling, first in the loop, keeps 2 ranks, and 8 where it takes 3) */
    case ALGO_DIRECT: steps = 1 + 0.4 * (n - 2); bytes = (n - 1) * (double)nbytes; break;
    default:
      steps = coll == COLL_ALLREDUCE ? 2 * (n - 1) : n - 1;
      bytes = (coll == COLL_ALLREDUCE ? 2.0 : 1.0) * (n - 1) / n * (double)nbytes;
      /* a rooted chain of 3 or more ranks ends with the agreement token,
       * k - 1 hops more (ring.c) */
      if (coll == COLL_BROADCAST || coll == COLL_REDUCE) {
        bytes = (double)nbytes;
        if (WEFT_SLOT_SIGNATURE && n > 2) steps = 2 * (n - 1);
      }
      break;
  }
  /* each pipeline step also waits for a slot: more slots per byte hurt */
  return (nchannels > 1 ? nchannels : 1) * steps * lat + bytes / bw;
}

/* Single copy (cma) for large all-reduce, all-gather, reduce-scatter,
 * broadcast and reduce on one host, from WEFT_CMA_MIN_NBYTES up, and bulk
 * transfers of the first three over transports that have them, from
 * WEFT_BULK_MIN_NBYTES up; either at any size where
 * WEFT_ALGO leaves no pipelined algorithm. Whether algo is refused for the
 * call alone (its collective, the rules, the size against min_nbytes),
 * which a run of calls of one shape answers alike every time: 1, 0 when
 * the comm decides (the possible check), -1 when the call takes it. */
static int tuner_whole_refused(const struct weft_plan *plan, const struct tuner_rules *r,
                               size_t nbytes, enum coll_algo algo, size_t min_nbytes) {
  const enum coll_kind c = plan->coll;
  const int rooted = c == COLL_BROADCAST || c == COLL_REDUCE;
  if (c != COLL_ALLREDUCE && c != COLL_ALLGATHER && c != COLL_REDUCESCATTER &&
      !(rooted && algo == ALGO_CMA))
    return 1;
  if (!r->algo[c][algo]) return 1;
  int others = 0;
  for (int a = 0; a < ALGO_CMA; a++) others += algo_exists(c, (enum coll_algo)a) && r->algo[c][a];
  return nbytes < min_nbytes && others > 0 ? 1 : 0;
}

static int tuner_whole_possible(const struct weftComm *comm, enum coll_algo algo) {
  return algo == ALGO_CMA ? cma_possible(comm) : bulk_possible(comm);
}

/* What this thread picked last, and what it picked it for: a run of calls
 * of one shape skips the checks and the cost model's loop, most of a small
 * call's time in the tuner. The key holds every input of the pick that the
 * call or a setting gives (rule sets live as long as the process, so their
 * address names them); what the comm's transports allow (cma_possible,
 * bulk_possible, which may change) is asked again where the pick depended
 * on it. Per thread, so that no lock is taken and no thread reads a pick
 * another thread is writing. */
struct tuner_memo {
  const struct weftComm *comm;
  const struct tuner_rules *rules;
  int nranks, tree_depth, network, oversubscribed, on_device;
  enum coll_kind coll;
  size_t nbytes, cma_min_nbytes, bulk_min_nbytes;
  int cma_refused, bulk_refused; /* tuner_whole_refused's: 1 for the call alone, 0 by the comm */
  enum coll_algo algo;
  enum coll_proto proto;
};
static __thread struct tuner_memo tuner_memo;

static int tuner_memo_matches(const struct tuner_memo *m, const struct weftComm *comm,
                              const struct tuner_rules *r, const struct weft_plan *plan,
                              size_t nbytes, size_t cma_min, size_t bulk_min) {
  return m->comm == comm && m->rules == r && m->nbytes == nbytes && m->coll == plan->coll &&
         m->cma_min_nbytes == cma_min && m->bulk_min_nbytes == bulk_min &&
         m->on_device == plan->on_device && m->nranks == comm->nranks &&
         m->tree_depth == comm->tree_depth && m->network == comm->network &&
         m->oversubscribed == comm->oversubscribed_any;
}

/* A call that names the (algorithm, protocol) pairs it allows (plan's
 * alg_select, NCCL's per-call algSelection): the cheapest of them that runs
 * here, of those WEFT_ALGO and WEFT_PROTO allow too where any is left, else
 * of them all (the call's choice, made alike on every rank, outweighs the
 * job's). Returns 0 where one runs (chosen anew at each call), -1 where
 * none does. */
static int tune_selected(const struct weftComm *comm, struct weft_plan *plan,
                         const struct tuner_rules *r, size_t nbytes) {
  const enum coll_kind coll = plan->coll;
  const int tree_runs =
      coll == COLL_ALLREDUCE && comm->nranks > 1 && !(plan->on_device && comm->network);
  double best = -1;
  for (int pass = 0; pass < 2 && best < 0; pass++)
    for (int a = ALGO_RING; a <= ALGO_TREE; a++)
      for (int p = 0; p < PROTO_NUM; p++) {
        if (!(plan->alg_select & PLAN_SELECT(a, p))) continue;
        if (pass == 0 && (!r->algo[coll][a] || !r->proto[coll][p])) continue;
        if ((a == ALGO_TREE && !tree_runs) || !algo_exists(coll, (enum coll_algo)a) ||
            !tuner_proto_runs(comm, plan, (enum coll_proto)p))
          continue;
        const double t = model_us(comm, plan, (enum coll_algo)a, (enum coll_proto)p, nbytes, 1);
        if (best < 0 || t < best) {
          best = t;
          plan->algo = (enum coll_algo)a;
          plan->proto = (enum coll_proto)p;
        }
      }
  plan->nchannels = 1; /* one pipeline on the host; the launch spreads it on a device */
  return best < 0 ? -1 : 0;
}

int plan_tune(const struct weftComm *comm, struct weft_plan *plan) {
  if (plan_is_sendrecv(plan)) return 0;
  struct tuner_rules fallback;
  const struct tuner_rules *r = tuner_rules_get(&fallback);
  size_t nbytes = plan->count * plan_type_size(plan->datatype);
  if (plan->coll == COLL_ALLGATHER || plan->coll == COLL_REDUCESCATTER)
    nbytes *= (size_t)comm->nranks;
  if (__builtin_expect(plan->alg_select != 0, 0)) {
    if (tune_selected(comm, plan, r, nbytes) == 0) return 0;
    plan->alg_select = 0; /* nothing it allows runs here: the tuner's own choice */
  }
  double best = -1;
  plan->algo = ALGO_RING;
  plan->proto = PROTO_SIMPLE;
  if (plan->on_device) {
    /* the ring, and for all-reduce on one host the tree: where its figures
     * are measured, or WEFT_ALGO leaves it alone (tuner_dev_tree_cost) */
    const int tree_runs = plan->coll == COLL_ALLREDUCE && !comm->network && comm->nranks > 1 &&
                          r->algo[COLL_ALLREDUCE][ALGO_TREE];
    const int ring_only = !r->algo[plan->coll][ALGO_RING] && tree_runs ? 0 : 1;
    for (int a = ALGO_RING; a <= ALGO_TREE; a++)
      for (int p = 0; p < PROTO_NUM; p++) {
        if (!r->proto[plan->coll][p] || !tuner_proto_runs(comm, plan, (enum coll_proto)p)) continue;
        if (a == ALGO_TREE && (!tree_runs || (ring_only && !tuner_dev_tree_measured(p))))
          continue;
        if (a == ALGO_RING && !ring_only) continue;
        double t = model_us(comm, plan, (enum coll_algo)a, (enum coll_proto)p, nbytes, 1);
        if (best < 0 || t < best) {
          best = t;
          plan->algo = (enum coll_algo)a;
          plan->proto = (enum coll_proto)p;
        }
      }
    plan->nchannels = 1; /* the launch spreads the ring or trees over the comm's channels */
    return 0;
  }
  const size_t cma_min = cma_min_nbytes(plan->coll), bulk_min = bulk_min_nbytes();
  struct tuner_memo *m = &tuner_memo;
  if (r != &fallback && tuner_memo_matches(m, comm, r, plan, nbytes, cma_min, bulk_min) &&
      (m->cma_refused || !tuner_whole_possible(comm, ALGO_CMA)) &&
      (m->bulk_refused || !tuner_whole_possible(comm, ALGO_BULK))) {
    plan->algo = m->algo;
    plan->proto = m->proto;
    plan->nchannels = 1;
    return 1;
  }
  const int cma_refused = tuner_whole_refused(plan, r, nbytes, ALGO_CMA, cma_min);
  if (!cma_refused && tuner_whole_possible(comm, ALGO_CMA)) {
    plan->algo = ALGO_CMA;
    plan->nchannels = 1;
    return 0;
  }
  const int bulk_refused = tuner_whole_refused(plan, r, nbytes, ALGO_BULK, bulk_min);
  if (!bulk_refused && tuner_whole_possible(comm, ALGO_BULK)) {
    plan->algo = ALGO_BULK;
    plan->nchannels = comm->nchannels; /* chunks spread over them */
    return 0;
  }
  plan->nchannels = 1; /* the host executor runs a pipeline on one channel */
  for (int a = 0; a < ALGO_CMA; a++) { /* cma and bulk: not pipelines, not in the cost model */
    if (!algo_exists(plan->coll, (enum coll_algo)a) || !r->algo[plan->coll][a]) continue;
    if (a == ALGO_DIRECT && comm->nranks > DIRECT_MAX_RANKS) continue;
    for (int p = 0; p < PROTO_NUM; p++) {
      if (!r->proto[plan->coll][p] || !tuner_proto_runs(comm, plan, (enum coll_proto)p)) continue;
      double t = model_us(comm, plan, (enum coll_algo)a, (enum coll_proto)p, nbytes, 1);
      if (best < 0 || t < best) {
        best = t;
        plan->algo = (enum coll_algo)a;
        plan->proto = (enum coll_proto)p;
      }
    }
  }
  if (r != &fallback)
    *m = (struct tuner_memo){.comm = comm, .rules = r, .nranks = comm->nranks,
                             .tree_depth = comm->tree_depth, .network = comm->network,
                             .oversubscribed = comm->oversubscribed_any,
                             .on_device = plan->on_device, .coll = plan->coll, .nbytes = nbytes,
                             .cma_min_nbytes = cma_min, .bulk_min_nbytes = bulk_min,
                             .cma_refused = cma_refused, .bulk_refused = bulk_refused,
                             .algo = plan->algo, .proto = plan->proto};
  return r != &fallback;
}

double plan_estimate_us(const struct weftComm *comm, const struct weft_plan *plan) {
  size_t nbytes = plan->count * weftTypeSize(plan->datatype);
  if (plan_is_sendrecv(plan)) { /* one step of the simple protocol */
    double lat, bw;
    tuner_cost_get(comm, PROTO_SIMPLE, plan->on_device, &lat, &bw);
    return lat + (double)nbytes / bw;
  }
  if (plan->coll == COLL_ALLGATHER || plan->coll == COLL_REDUCESCATTER)
    nbytes *= (size_t)comm->nranks;
  return model_us(comm, plan, plan->algo, plan->proto, nbytes,
                  plan->algo == ALGO_RING ? plan->nchannels : 1);
}
