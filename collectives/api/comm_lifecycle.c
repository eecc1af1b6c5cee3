/* Communicator life cycle: init (from an id, a launcher or in-process),
 * finalize, destroy, abort, and the queries. */
#include "comm_lifecycle.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../transport/base/status.h"
#include "../../transport/topology/topo.h"
#include "../../transport/base/wait.h"
#include "../exec/device/device.h"
#include "../algo/sendrecv.h"
#include "../core/channel.h"
#include "../core/hang.h"
#include "../core/mem.h"
#include "../core/params.h"
#include "../core/signature.h"
#include "../core/trace.h"
#include "comm_create.h"
#include "config.h"
#include "stream.h"

weftResult_t weftGetVersion(int *version) {
  if (version == NULL) return weft_error_set(weftInvalidArgument, "version is NULL");
  *version = WEFT_VERSION_CODE;
  return weftSuccess;
}

weftResult_t weftGetUniqueId(weftUniqueId *uniqueId) {
  if (uniqueId == NULL) return weft_error_set(weftInvalidArgument, "uniqueId is NULL");
  weft_error_clear();
  struct bootstrap_id id;
  WEFT_TRY(bootstrap_id_create(&id));
  memset(uniqueId, 0, sizeof *uniqueId);
  memcpy(uniqueId->internal, &id, sizeof id);
  return weftSuccess;
}

void comm_child_watch(const struct weftComm *parent, const struct bootstrap_id *id,
                      int parent_rank, int child_rank) {
  const struct peer_info *p = &parent->peers[parent_rank];
  if (parent_rank == parent->rank || p->host_hash != parent->peers[parent->rank].host_hash ||
      p->pid <= 0)
    return;
  if (bootstrap_root_watch(id, child_rank, (pid_t)p->pid) != weftSuccess) weft_error_clear();
}

weftResult_t weftUniqueIdWatchRank(const weftUniqueId *uniqueId, int rank, int pid) {
  weft_error_clear();
  if (uniqueId == NULL) return weft_error_set(weftInvalidArgument, "uniqueId is NULL");
  struct bootstrap_id id;
  memcpy(&id, uniqueId->internal, sizeof id);
  weftResult_t res = bootstrap_root_watch(&id, rank, (pid_t)pid);
  if (res != weftSuccess) {
    char why[512];
    snprintf(why, sizeof why, "%s", weft_error_text());
    weft_error_set(res, "UniqueIdWatchRank: %s", why);
  }
  return res;
}

/* The ranges NCCL gives its config's fields (blocking 0 or 1, channel
 * bounds 1 and up, the least at most the most); a timeout is positive, as
 * weftCommSetTimeout's. WEFT_CONFIG_UNDEF_INT is the default, never out of
 * range. Bounds above what an executor has are lowered to it where
 * comm_init reads them, as NCCL lowers its CTA counts. */
static weftResult_t config_check(const weftConfig_t *cfg) {
  const int undef = WEFT_CONFIG_UNDEF_INT;
  if (cfg->blocking != undef && cfg->blocking != 0 && cfg->blocking != 1)
    return weft_error_set(weftInvalidArgument, "config blocking is %d: must be 0 or 1",
                          cfg->blocking);
  if (cfg->minChannels != undef && cfg->minChannels < 1)
    return weft_error_set(weftInvalidArgument, "config minChannels is %d: must be 1 or more",
                          cfg->minChannels);
  if (cfg->maxChannels != undef && cfg->maxChannels < 1)
    return weft_error_set(weftInvalidArgument, "config maxChannels is %d: must be 1 or more",
                          cfg->maxChannels);
  if (cfg->minChannels != undef && cfg->maxChannels != undef &&
      cfg->minChannels > cfg->maxChannels)
    return weft_error_set(weftInvalidArgument,
                          "config minChannels is %d: must be 1 to maxChannels (%d)",
                          cfg->minChannels, cfg->maxChannels);
  if (cfg->timeoutMs != undef && cfg->timeoutMs < 1)
    return weft_error_set(weftInvalidArgument, "config timeoutMs is %d: must be 1 or more",
                          cfg->timeoutMs);
  return weftSuccess;
}

weftResult_t comm_config_read(const weftConfig_t *config, weftConfig_t *cfg) {
  weftConfig_t defaults = WEFT_CONFIG_INITIALIZER;
  *cfg = defaults;
  if (config == NULL) return weftSuccess;
  if (config->magic != WEFT_CONFIG_MAGIC)
    return weft_error_set(weftInvalidArgument,
                          "config was not initialised with WEFT_CONFIG_INITIALIZER (bad magic)");
  if (config->size < offsetof(weftConfig_t, blocking) || config->size > 4096)
    return weft_error_set(weftInvalidArgument, "config size %zu is not plausible", config->size);
  size_t n = config->size < sizeof *cfg ? config->size : sizeof *cfg;
  memcpy(cfg, config, n);
  return config_check(cfg);
}

/* --- The live communicators --------------------------------------------------- */

/* Every communicator of the process from its creation to its free, so that
 * a call given one that was freed (weftGetLastError after a destroy, on any
 * thread) can tell without reading it. */
static pthread_mutex_t comms_live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct weftComm **comms_live;
static size_t comms_live_count, comms_live_cap;

/* A fork while another thread holds the lock leaves the child able to take it. */
static void comms_live_fork_prepare(void) { pthread_mutex_lock(&comms_live_lock); }
static void comms_live_fork_done(void) { pthread_mutex_unlock(&comms_live_lock); }
/* at load: weftGetLastError takes the lock before any comm exists */
__attribute__((constructor)) static void comms_live_fork_register(void) {
  (void)pthread_atfork(comms_live_fork_prepare, comms_live_fork_done, comms_live_fork_done);
}

/* comm's index in the set, or -1; under comms_live_lock. */
static ptrdiff_t comms_live_find(const struct weftComm *comm) {
  for (size_t i = 0; i < comms_live_count; i++)
    if (comms_live[i] == comm) return (ptrdiff_t)i;
  return -1;
}

static weftResult_t comms_live_add(struct weftComm *comm) {
  weftResult_t res = weftSuccess;
  pthread_mutex_lock(&comms_live_lock);
  if (comms_live_count == comms_live_cap) {
    const size_t cap = comms_live_cap ? 2 * comms_live_cap : 16;
    struct weftComm **grown = realloc(comms_live, cap * sizeof *grown);
    if (grown == NULL) {
      res = weft_error_set(weftSystemError, "out of memory");
    } else {
      comms_live = grown;
      comms_live_cap = cap;
    }
  }
  if (res == weftSuccess) comms_live[comms_live_count++] = comm;
  pthread_mutex_unlock(&comms_live_lock);
  return res;
}

static void comms_live_remove(struct weftComm *comm) {
  pthread_mutex_lock(&comms_live_lock);
  const ptrdiff_t i = comms_live_find(comm);
  if (i >= 0) comms_live[i] = comms_live[--comms_live_count];
  pthread_mutex_unlock(&comms_live_lock);
}

int comm_error_text_copy_live(const struct weftComm *comm, char *out, size_t n) {
  if (comm == NULL) return 0;
  pthread_mutex_lock(&comms_live_lock);
  const int live = comm != NULL && comms_live_find(comm) >= 0 && comm->pid == comm_self_pid();
  if (live) comm_error_text_copy((struct weftComm *)comm, out, n);
  pthread_mutex_unlock(&comms_live_lock);
  return live;
}

static int config_int(int value, int fallback) {
  return value == WEFT_CONFIG_UNDEF_INT ? fallback : value;
}

static weftResult_t comm_init_marked(struct weftComm *comm, int nranks,
                                     const struct bootstrap_id *id, int rank,
                                     const weftConfig_t *config, int cuda_dev);

/* The rank is marked present on its host while it sets up (the bootstrap's
 * root so learns at once of a rank that dies before it joined). */
/* comm_init's work on a zeroed comm with comm->pid set (comm_create_fns'
 * init): on failure what it set up is closed and comm is left to the caller;
 * it does not make comm live (its magic). */
static weftResult_t comm_init_into(struct weftComm *comm, int nranks,
                                   const struct bootstrap_id *id, int rank,
                                   const weftConfig_t *config, int cuda_dev) {
  if (nranks > SIGNATURE_MAX_RANKS) /* a root fits a call's signature */
    return weft_error_set(weftInvalidArgument, "nranks %d: a communicator holds at most %d ranks",
                          nranks, SIGNATURE_MAX_RANKS);
  struct bootstrap_presence presence;
  bootstrap_presence_begin(id, rank, &presence);
  weftResult_t res = comm_init_marked(comm, nranks, id, rank, config, cuda_dev);
  bootstrap_presence_end(&presence, res != weftSuccess);
  return res;
}

weftResult_t comm_init(weftComm_t *comm_out, int nranks, const struct bootstrap_id *id, int rank,
                       const weftConfig_t *config, int cuda_dev) {
  struct weftComm *comm = calloc(1, sizeof *comm);
  if (comm == NULL) return weft_error_set(weftSystemError, "out of memory");
  comm->pid = comm_self_pid();
  const weftResult_t res = comm_init_into(comm, nranks, id, rank, config, cuda_dev);
  if (res != weftSuccess) {
    free(comm);
    return res;
  }
  __atomic_store_n(&comm->magic, COMM_MAGIC, __ATOMIC_RELEASE);
  *comm_out = comm;
  return weftSuccess;
}

/* What comm_init reads of its config and the environment. */
struct init_settings {
  weftConfig_t cfg;
  int64_t nslots, slot_nbytes, tree_small_nbytes;
  int nchannels;
};

/* The first bad setting of the environment, with its message (cfg read
 * already). */
static weftResult_t init_settings_read(struct init_settings *s) {
  /* every variable out of its range, as docs/environment.md says */
  WEFT_TRY(param_tables_check(weft_param_tables));
  WEFT_TRY(param_int_checked(&coll_params[P_NSLOTS], &s->nslots));
  s->slot_nbytes = param_int(&coll_params[P_SLOT_BYTES]);
  if (s->slot_nbytes < 64 || s->slot_nbytes % 64 != 0 || s->slot_nbytes > (1 << 26))
    return weft_error_set(weftInvalidArgument,
                          "WEFT_SLOT_BYTES=%lld: must be a multiple of 64 up to 64M",
                          (long long)s->slot_nbytes);
  WEFT_TRY(param_int_checked(&coll_params[P_TREE_SMALL_BYTES], &s->tree_small_nbytes));
  int nchannels = (int)param_int(&coll_params[P_NCHANNELS]);
  /* the bounds as host rings can take them (device channels take them whole) */
  int max_ch = config_int(s->cfg.maxChannels, WEFT_MAX_CHANNELS);
  int min_ch = config_int(s->cfg.minChannels, 1);
  if (max_ch > WEFT_MAX_CHANNELS) max_ch = WEFT_MAX_CHANNELS;
  if (min_ch > WEFT_MAX_CHANNELS) min_ch = WEFT_MAX_CHANNELS;
  nchannels = max_ch < nchannels ? max_ch : nchannels;
  if (min_ch > nchannels) nchannels = min_ch;
  s->nchannels = nchannels;
  if (nchannels < 1 || nchannels > WEFT_MAX_CHANNELS)
    return weft_error_set(weftInvalidArgument, "channels must be 1 to %d, got %d",
                          WEFT_MAX_CHANNELS, nchannels);
  return weftSuccess;
}

/* Sets comm->oversubscribed_any to whether any rank's host is
 * oversubscribed (its own oversubscribed_hold): one bootstrap round. */
static weftResult_t oversubscribed_agree(struct weftComm *comm) {
  int *flags = calloc((size_t)comm->nranks, sizeof *flags);
  if (flags == NULL) return weft_error_set(weftSystemError, "out of memory");
  flags[comm->rank] = comm->oversubscribed_hold != 0;
  const weftResult_t res = bootstrap_allgather(comm->bs, flags, sizeof *flags);
  for (int r = 0; r < comm->nranks && res == weftSuccess; r++)
    comm->oversubscribed_any |= flags[r];
  free(flags);
  return res;
}

/* A bad config is refused before anything (the id stays good for another
 * try, as NCCL's). A rank whose environment holds a bad setting still joins
 * the bootstrap where it has peers, marked refused, so that they learn of
 * it at once rather than waiting for it until WEFT_TIMEOUT; it then returns
 * its own error. */
static weftResult_t comm_init_marked(struct weftComm *comm, int nranks,
                                     const struct bootstrap_id *id, int rank,
                                     const weftConfig_t *config, int cuda_dev) {
  struct init_settings set;
  memset(&set, 0, sizeof set);
  WEFT_TRY(comm_config_read(config, &set.cfg));
  const weftResult_t refused = init_settings_read(&set);
  if (refused != weftSuccess && nranks == 1) return refused;
  char refusal[256] = "";
  if (refused != weftSuccess) snprintf(refusal, sizeof refusal, "%s", weft_error_text());
  const weftConfig_t cfg = set.cfg;
  const int64_t nslots = set.nslots, slot_nbytes = set.slot_nbytes;
  const int nchannels = set.nchannels;

  struct peer_info *peers = calloc((size_t)nranks, sizeof *peers);
  weftResult_t res = weftSuccess;
  if (peers == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto free_comm;
  }
  comm->rank = rank;
  comm->nranks = nranks;
  comm->cuda_dev = cuda_dev;
  comm->nchannels = nchannels;
  comm->cfg_min_channels = cfg.minChannels;
  comm->cfg_max_channels = cfg.maxChannels;
  comm->peers = peers;
  comm->nslots = (uint32_t)nslots;
  comm->slot_nbytes = (size_t)slot_nbytes;
  comm->tree_small_nbytes = (size_t)set.tree_small_nbytes;
  WEFT_TRY_GOTO(sendrecv_conns_alloc(comm), res, free_comm);
  comm->timeout_ns = cfg.timeoutMs != WEFT_CONFIG_UNDEF_INT ? (uint64_t)cfg.timeoutMs * 1000000ull
                                                            : wait_default_timeout_ns();
  snprintf(comm->name, sizeof comm->name, "%s", cfg.commName ? cfg.commName : "");

  struct peer_info self;
  memset(&self, 0, sizeof self);
  self.rank = rank;
  self.cuda_dev = cuda_dev;
  self.numa_node = -1;
  self.bus_id = -1;
  bootstrap_peer_info_local(&self);
  topo_peer_info(&self, cuda_dev);
  transport_peer_info(&self);
  struct param_agreement agreed;
  config_agreement_fill(&self, nchannels, &agreed);
  self.refused = refused != weftSuccess;
  res = bootstrap_init(id, rank, nranks, &self, comm_timeout_ns(comm), &comm->bs, peers);
  if (res == weftSuccess) {
    /* every rank has every rank's digest and refusal: all fail alike */
    res = config_agreement_check(comm->bs, peers, nranks, rank, &agreed, refusal);
    if (res != weftSuccess || refused != weftSuccess) bootstrap_close(comm->bs);
  }
  if (refused != weftSuccess) res = weft_error_set(refused, "%s", refusal);
  if (res != weftSuccess) goto free_comm;
  bootstrap_set_abort(comm->bs, &comm->abort_flag);
  comm->trace = trace_create(rank, nranks, bootstrap_job_hash(comm->bs), comm->name);
  hang_answer_install(comm);
  /* oversubscribed: more ranks here than the CPUs they may run on together */
  int nlocal = 0;
  cpu_set_t local_cpus, one;
  CPU_ZERO(&local_cpus);
  for (int r = 0; r < nranks; r++) {
    if (peers[r].host_hash != peers[rank].host_hash) continue;
    nlocal++;
    if (sched_getaffinity(peers[r].pid, sizeof one, &one) == 0)
      CPU_OR(&local_cpus, &local_cpus, &one);
  }
  comm->oversubscribed_hold = wait_oversubscribed_hold(nlocal, CPU_COUNT(&local_cpus));
  /* the tuner prices calls alike on every rank: where ranks span hosts, each
   * learns whether any host is oversubscribed (one host: all know already) */
  comm->oversubscribed_any = comm->oversubscribed_hold;
  if (nlocal < nranks)
    WEFT_TRY_GOTO(oversubscribed_agree(comm), res, close_channels);
  WEFT_TRY_GOTO(channels_connect(comm, (uint32_t)nslots, (size_t)slot_nbytes), res,
                close_channels);
  WEFT_TRY_GOTO(comms_live_add(comm), res, close_channels);
  comm_life_ready(comm);
  WEFT_INFO(LOG_INIT, "comm %p rank %d/%d ready: %d channel(s), %lld slots of %lld bytes",
            (void *)comm, rank, nranks, nchannels, (long long)nslots, (long long)slot_nbytes);
  return weftSuccess;

close_channels:
  comm_poison_conns(comm);
  channels_close(comm);
  if (comm->oversubscribed_hold) wait_oversubscribed_release();
  bootstrap_close(comm->bs);
  trace_destroy(comm->trace);
free_comm:
  sendrecv_conns_close(comm);
  free(peers);
  comm->peers = NULL;
  return res;
}

weftResult_t comm_init_args_check(weftComm_t *comm_out, int nranks, int rank,
                                  const weftConfig_t *config) {
  if (comm_out == NULL) return weft_error_set(weftInvalidArgument, "comm is NULL");
  if (nranks < 1) return weft_error_set(weftInvalidArgument, "nranks %d < 1", nranks);
  if (nranks > SIGNATURE_MAX_RANKS) /* a root fits a call's signature */
    return weft_error_set(weftInvalidArgument, "nranks %d: a communicator holds at most %d ranks",
                          nranks, SIGNATURE_MAX_RANKS);
  if (rank < 0 || rank >= nranks)
    return weft_error_set(weftInvalidArgument, "rank %d out of range [0, %d)", rank, nranks);
  weftConfig_t cfg;
  return comm_config_read(config, &cfg);
}

int comm_config_nonblocking(const weftConfig_t *config) {
  weftConfig_t cfg;
  return config != NULL && comm_config_read(config, &cfg) == weftSuccess && cfg.blocking == 0;
}

weftResult_t comm_init_nonblocking(weftComm_t *comm_out, int nranks,
                                   const struct bootstrap_id *id, int rank,
                                   const weftConfig_t *config, int bind_dev) {
  static const struct comm_create_fns fns = {.init = comm_init_into, .abort = weftCommAbort};
  /* the caller's config as far as its size goes (an older, shorter one) */
  weftConfig_t cfg;
  WEFT_TRY(comm_config_read(config, &cfg));
  return comm_create_start(comm_out, nranks, id, rank, config != NULL ? &cfg : NULL, bind_dev,
                           &fns);
}

weftResult_t weftCommInitRankConfig(weftComm_t *comm, int nranks, weftUniqueId commId, int rank,
                                    weftConfig_t *config) {
  weft_error_clear();
  if (comm != NULL) *comm = NULL; /* what a failed init leaves, as NCCL's */
  WEFT_TRY(comm_init_args_check(comm, nranks, rank, config));
  struct bootstrap_id id;
  memcpy(&id, commId.internal, sizeof id);
  if (comm_config_nonblocking(config))
    return comm_init_nonblocking(comm, nranks, &id, rank, config, -1);
  return comm_init(comm, nranks, &id, rank, config, -1);
}

weftResult_t weftCommInitRank(weftComm_t *comm, int nranks, weftUniqueId commId, int rank) {
  return weftCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

weftResult_t weftCommInitFromEnv(weftComm_t *comm, weftConfig_t *config) {
  weft_error_clear();
  if (comm == NULL) return weft_error_set(weftInvalidArgument, "comm is NULL");
  struct bootstrap_env env;
  WEFT_TRY(bootstrap_env_read(&env));
  WEFT_TRY(bootstrap_env_rendezvous(&env));
  WEFT_INFO(LOG_INIT, "joining as rank %d of %d from the %s environment", env.rank, env.nranks,
            env.found ? env.source : "(none)");
  if (comm_config_nonblocking(config)) {
    WEFT_TRY(comm_init_args_check(comm, env.nranks, env.rank, config));
    return comm_init_nonblocking(comm, env.nranks, &env.id, env.rank, config, -1);
  }
  return comm_init(comm, env.nranks, &env.id, env.rank, config, -1);
}

struct init_all_arg {
  weftComm_t *comm;
  int nranks, rank, cuda_dev;
  const struct bootstrap_id *id;
  weftResult_t res;
  char error[1024];
};

static void *init_all_main(void *p) {
  struct init_all_arg *a = p;
  a->res = comm_init(a->comm, a->nranks, a->id, a->rank, NULL, a->cuda_dev);
  if (a->res != weftSuccess) snprintf(a->error, sizeof a->error, "%s", weft_error_text());
  return NULL;
}

/* A device number names a CUDA device, or, when the topology comes from a
 * file (WEFT_TOPO_FILE: a machine planned rather than this one), a GPU of
 * that file: the ranks take the file's places and run on host memory. */
static weftResult_t comm_check_device(int dev) {
  if (topo_get_cpus()->this_system) return device_check_ordinal(dev);
  const struct topo *topo = topo_get(); /* with the file's GPUs */
  if (dev < 0 || dev >= topo->ngpus)
    return weft_error_set(weftInvalidArgument, "device %d: the topology (%s) has %d GPUs", dev,
                          topo->source, topo->ngpus);
  return weftSuccess;
}

weftResult_t weftCommInitAll(weftComm_t *comms, int ndev, const int *devlist) {
  weft_error_clear();
  if (comms == NULL) return weft_error_set(weftInvalidArgument, "comms is NULL");
  if (ndev < 1) return weft_error_set(weftInvalidArgument, "ndev %d < 1", ndev);
  for (int i = 0; devlist != NULL && i < ndev; i++) WEFT_TRY(comm_check_device(devlist[i]));
  struct bootstrap_id id;
  WEFT_TRY(bootstrap_id_create_local(&id)); /* every rank is in this process */
  struct init_all_arg *args = calloc((size_t)ndev, sizeof *args);
  pthread_t *tids = calloc((size_t)ndev, sizeof *tids);
  weftResult_t res = weftSuccess;
  if (args == NULL || tids == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto free_args;
  }
  int started = 0;
  for (int i = 0; i < ndev; i++) {
    args[i] = (struct init_all_arg){.comm = &comms[i], .nranks = ndev, .rank = i,
                                    .cuda_dev = devlist ? devlist[i] : -1, .id = &id};
    if (pthread_create(&tids[i], NULL, init_all_main, &args[i]) != 0) {
      res = weft_error_errno(weftSystemError, "starting init thread %d", i);
      break;
    }
    started++;
  }
  for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
  for (int i = 0; i < started && res == weftSuccess; i++)
    if (args[i].res != weftSuccess) res = weft_error_set(args[i].res, "rank %d: %s", i, args[i].error);
  if (res != weftSuccess)
    for (int i = 0; i < started; i++)
      if (args[i].res == weftSuccess) weftCommDestroy(comms[i]);
free_args:
  free(args);
  free(tids);
  return res;
}

/* The pause between two looks of the waits below at another thread's
 * progress (a host stream's items, operations leaving, a revoke). */
static void comm_nap(void) {
  struct timespec ts = {0, 100000};
  nanosleep(&ts, NULL);
}

/* Waits until no host stream holds work for comm. */
static void comm_drain(struct weftComm *comm) {
  while (__atomic_load_n(&comm->pending, __ATOMIC_ACQUIRE) != 0)
    comm_nap();
}

weftResult_t weftCommFinalize(weftComm_t comm) {
  WEFT_TRY(comm_check(comm));
  comm_drain(comm);
  comm_life_finalize(comm);
  return comm_async_error(comm);
}

/* Whether comm's last call failed of its own (refused: a bad argument only
 * this rank passed, say), which peers in that call wait on. */
static int comm_last_call_refused(const struct weftComm *comm) {
  struct trace_call last;
  return trace_latest(comm->trace, &last, 1) == 1 && last.state == TRACE_FAILED &&
         last.result != weftRemoteError;
}

/* broken: whether comm had broken of itself (its async error; an abort's
 * own doing, the operations it cut short, is not). */
static void comm_free(struct weftComm *comm, int broken) {
  const int failed = broken || comm_life(comm) == COMM_ABORTED;
  comms_live_remove(comm); /* first: a weftGetLastError copying its text is waited for */
  comm->magic = 0;
  /* peers that fail after this rank ask it where it was: a comm that broke
   * answers a little longer (hang.h); an abort of a working one does not,
   * unless its last call was refused here (a refusal that left the comm
   * working: the abort's notice sends the peers waiting in that call to ask,
   * and they should learn that this rank failed it, not that it is gone).
   * It asks nothing more: peers that linger too need not wait for it */
  const int answers =
      broken || (comm_life(comm) == COMM_ABORTED && comm_last_call_refused(comm));
  if (answers) bootstrap_query_bye(comm->bs);
  if (answers && comm->trace != NULL)
    bootstrap_query_linger(comm->bs, 2000000000ull,
                           comm_timeout_ns(comm) / 2 < 1000000000ull ? comm_timeout_ns(comm) / 2
                                                                      : 1000000000ull);
  device_comm_free(comm);
  channels_close(comm);
  sendrecv_conns_close(comm);
  if (comm->oversubscribed_hold) wait_oversubscribed_release();
  bootstrap_close(comm->bs); /* its query thread, which reads the trace, first */
  trace_destroy(comm->trace);
  free(comm->peers);
  comm_states_destroy(comm);
  mem_regs_free(comm);
  free(comm);
  weft_memo_invalidate(); /* the address may be another comm's next */
  if (failed) bootstrap_sweep_dead(); /* a peer that died may have left names behind */
}

/* Until no thread is inside weftCommRevoke on comm (a watchdog's revoke
 * while the caller destroys or aborts after the failure it caused). */
static void comm_wait_revokes(struct weftComm *comm) {
  while (__atomic_load_n(&comm->revoking, __ATOMIC_SEQ_CST) != 0)
    comm_nap();
}

weftResult_t weftCommDestroy(weftComm_t comm) {
  if (comm_creating(comm) && !comm_create_end(comm, 0)) return weftSuccess;
  WEFT_TRY(comm_check(comm));
  comm_wait_revokes(comm);
  comm_drain(comm);
  if (__atomic_load_n(&comm->active, __ATOMIC_ACQUIRE) != 0)
    return comm_error_keep(
        comm, weft_error_set(weftInvalidUsage,
                             "comm is in use by another thread; use weftCommAbort to stop it"));
  comm_free(comm, comm_async_error(comm) != weftSuccess);
  return weftSuccess;
}

/* Once the abort flag is up: threads in an operation see it within
 * microseconds, and queued stream work fails at once; waits for both. */
static void comm_wait_quiet(struct weftComm *comm) {
  /* seq_cst, as comm_op_begin's hold and its look at the state: one of the
   * two sides sees the other */
  while (__atomic_load_n(&comm->active, __ATOMIC_SEQ_CST) != 0 ||
         __atomic_load_n(&comm->pending, __ATOMIC_SEQ_CST) != 0)
    comm_nap();
}

weftResult_t weftCommAbort(weftComm_t comm) {
  if (comm_creating(comm) && !comm_create_end(comm, 1)) return weftSuccess;
  WEFT_TRY(comm_check(comm));
  /* asked first: what the abort cuts short below fails, which is not the
   * comm breaking of itself */
  const int broken = comm_async_error(comm) != weftSuccess;
  comm_life_abort(comm);
  device_comm_abort(comm);
  comm_poison(comm);
  stream_drop_comm(comm, weftRemoteError);
  comm_wait_quiet(comm);
  comm_wait_revokes(comm);
  trace_dump_to_dir(comm->trace, TRACE_ON_ABORT, comm->last_error);
  comm_free(comm, broken);
  return weftSuccess;
}

/* As an abort that keeps the communicator: the abort flag stops this rank's
 * waits, poisoned connections stop the peers', and the bootstrap's failure
 * notice stops those of peers that wait on a connection not made yet (its
 * set-up is a bootstrap exchange): they fail with an error and revoke in
 * turn. Once nothing runs the flag is lowered again and the bootstrap moves
 * to its next epoch (the notice is over for it) so that it serves split and
 * shrink. The errors the revocation caused
 * are its purpose, not the communicator's state: the async error is
 * cleared. Device kernels keep the abort word (device_comm_abort): the
 * comm launches nothing more. */
weftResult_t weftCommRevoke(weftComm_t comm, int revokeFlags) {
  WEFT_TRY(comm_check(comm));
  if (revokeFlags != 0)
    return comm_error_keep(comm, weft_error_set(weftInvalidArgument,
                                                "weftCommRevoke: flags 0x%x (only 0 is valid)",
                                                revokeFlags));
  /* counted first: destroy and abort wait until no revoke is in here */
  __atomic_add_fetch(&comm->revoking, 1, __ATOMIC_SEQ_CST);
  /* REVOKING, and the abort flag up: an operation holds the comm, then
   * asks its state (comm_op_begin), so it either is waited for below or
   * refuses itself. Once: a second revoke (another thread, or the same
   * again) waits until the first is done, as a second bootstrap revoke
   * would leave this rank a generation ahead of its peers. */
  enum comm_life from;
  if (!comm_life_revoke_begin(comm, &from)) {
    __atomic_sub_fetch(&comm->revoking, 1, __ATOMIC_SEQ_CST);
    return weftSuccess;
  }
  device_comm_abort(comm);
  comm_poison(comm);
  stream_drop_comm(comm, weftRemoteError);
  comm_wait_quiet(comm);
  /* what failed inside the revoke (an operation cut short here or on a
   * peer) is over for the bootstrap too: split and shrink use it next */
  bootstrap_revoke(comm->bs);
  /* the error cleared before the flag comes down: a split that sees the
   * comm revoked sees it without error */
  __atomic_store_n(&comm->async_error, weftSuccess, __ATOMIC_SEQ_CST);
  comm->broken_cause[0] = '\0';
  comm_life_revoke_end(comm, from);
  WEFT_INFO(LOG_INIT, "comm %p rank %d revoked", (void *)comm, comm->rank);
  __atomic_sub_fetch(&comm->revoking, 1, __ATOMIC_SEQ_CST);
  return weftSuccess;
}

weftResult_t weftCommGetAsyncError(weftComm_t comm, weftResult_t *asyncError) {
  if (comm_creating(comm)) {
    if (asyncError == NULL) return weft_error_set(weftInvalidArgument, "asyncError is NULL");
    WEFT_TRY(comm_create_poll(comm, asyncError));
    if (*asyncError != weftSuccess) return weftSuccess;
  }
  WEFT_TRY(comm_check(comm));
  if (asyncError == NULL)
    return comm_error_keep(comm, weft_error_set(weftInvalidArgument, "asyncError is NULL"));
  /* a revoked comm's kernels stopped because of the revoke: that is its
   * purpose, not an error to report (nor to poison the bootstrap with,
   * which shrink and split still use) */
  if (!comm_life_revoked(comm) && comm_async_error(comm) == weftSuccess) {
    /* the kernels' failure, or a watch of kernels that end nothing, which
     * asks the peers where they are (device_watch.c) */
    const weftResult_t dres = device_comm_watch(comm);
    /* whatever its code (a mismatch the kernels found is weftInvalidUsage),
     * the kernels stopped and poisoned the comm's connections: it is failed */
    if (dres != weftSuccess) comm_fail_alone(comm, dres);
  }
  *asyncError = comm_async_error(comm);
  return weftSuccess;
}

weftResult_t weftCommSetTimeout(weftComm_t comm, int timeoutMs) {
  WEFT_TRY(comm_check(comm));
  if (timeoutMs <= 0)
    return comm_error_keep(comm, weft_error_set(weftInvalidArgument,
                                                "timeoutMs %d: a timeout is positive", timeoutMs));
  const uint64_t ns = (uint64_t)timeoutMs * 1000000ull;
  __atomic_store_n(&comm->timeout_ns, ns, __ATOMIC_RELAXED);
  if (comm->bs != NULL) bootstrap_timeout_set(comm->bs, ns);
  return weftSuccess;
}

weftResult_t weftCommCount(const weftComm_t comm, int *count) {
  WEFT_TRY(comm_check(comm));
  if (count == NULL)
    return comm_error_keep(comm, weft_error_set(weftInvalidArgument, "count is NULL"));
  *count = comm->nranks;
  return weftSuccess;
}

weftResult_t weftCommUserRank(const weftComm_t comm, int *rank) {
  WEFT_TRY(comm_check(comm));
  if (rank == NULL)
    return comm_error_keep(comm, weft_error_set(weftInvalidArgument, "rank is NULL"));
  *rank = comm->rank;
  return weftSuccess;
}

weftResult_t weftCommCuDevice(const weftComm_t comm, int *device) {
  WEFT_TRY(comm_check(comm));
  if (device == NULL)
    return comm_error_keep(comm, weft_error_set(weftInvalidArgument, "device is NULL"));
  *device = comm->cuda_dev;
  return weftSuccess;
}

/* Whether comm is a live comm of this process, without touching the thread's
 * error text (comm_check sets it). */
static int comm_live(const struct weftComm *comm) {
  return comm != NULL && comm->magic == COMM_MAGIC && comm->pid == comm_self_pid();
}

weftResult_t comm_error_keep(struct weftComm *comm, weftResult_t res) {
  if (comm_live(comm)) comm_error_text_set(comm, weft_error_text());
  return res;
}

/* A copy, not comm's own text, which another thread's failure may rewrite
 * while the caller reads it: valid until this thread's next call. A comm
 * that is not live (NULL, or freed) gives the thread's text. */
const char *weftGetLastError(weftComm_t comm) {
  static __thread char text[sizeof comm->last_error];
  if (!comm_error_text_copy_live(comm, text, sizeof text)) return weft_error_text();
  return text;
}
