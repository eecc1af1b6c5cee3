/* The communicator: who we are, our peers, our channels, and how we fail. */
#ifndef WEFT_COMM_H
#define WEFT_COMM_H

#include <stdint.h>

#include "../../include/weft.h"
#include "../../transport/bootstrap/bootstrap.h"
#include "../../transport/transport.h"
#include "tree_links.h"

#define WEFT_MAX_CHANNELS 16
#define WEFT_MAX_REDOPS 64

/* A user reduction op (weftRedOpCreatePreMulSum). */
struct weft_redop {
  int in_use;
  weftDataType_t datatype;
  char scalar[8];         /* the value, for weftScalarHostImmediate */
  const void *scalar_ptr; /* read when the op runs, for weftScalarDevice */
  int scalar_device_only; /* scalar_ptr is device memory, which the host cannot read */
};
#define COMM_MAGIC 0x776566742d636f6dull /* "weft-com" */

/* What a module of collectives/ keeps per communicator (an algorithm's
 * buffers, a cache of mappings) is its own type, which only its file knows:
 * the communicator holds it as an opaque pointer under the module's ops,
 * which also say how to free it, so that the communicator names no module
 * and a new algorithm adds no field here. */
struct comm_state_ops {
  const char *name;
  /* Frees state; called once, when the communicator is freed. */
  void (*destroy)(void *state);
  /* Optional: the bytes of scratch state holds that it allocates again on
   * first use, and their release (NCCL_SUSPEND_MEM). */
  uint64_t (*scratch_nbytes)(const void *state);
  void (*scratch_release)(void *state);
};
#define COMM_MAX_STATES 8
struct comm_state_slot {
  const struct comm_state_ops *ops;
  void *state;
};

/* One ring over all ranks with its own connections. */
struct weft_channel {
  int id;
  int *ring;     /* ring[i]: the rank at position i; ring[ring_pos] == comm->rank */
  int ring_pos;
  struct weft_conn send; /* to the next rank in the ring */
  struct weft_conn recv; /* from the previous rank in the ring */
};

struct weftComm {
  uint64_t magic;
  int rank;
  int nranks;
  int cuda_dev;
  int cfg_min_channels; /* weftConfig_t's bounds as given (WEFT_CONFIG_UNDEF_INT: none); */
  int cfg_max_channels; /* the device executor applies them to its channels */
  char name[64];
  struct bootstrap *bs;
  struct peer_info *peers;
  int nchannels;
  struct weft_channel channels[WEFT_MAX_CHANNELS];
  int network;                  /* some ring connection crosses hosts */
  struct tree_links trees[2];   /* this rank's place in the two trees (comm_trees) */
  int tree_depth;               /* the deepest rank's depth in either tree */
  uint32_t nslots;              /* FIFO shape of every connection */
  size_t slot_nbytes;
  struct weft_conn *send_conns; /* [nranks]: to each peer, connected on first use */
  struct weft_conn *recv_conns; /* [nranks]: from each peer */
  uint64_t timeout_ns;
  uint64_t seq;                 /* collectives issued */
  uint64_t signature_seq;       /* collectives run through WEFT_CHECK's comparison */
  volatile uint32_t abort_flag; /* set by weftCommAbort */
  uint32_t revoked;             /* weftCommRevoke: operations are refused (1 while the
                                   first revoke runs, 2 once it is done) */
  uint32_t revoking;            /* threads inside weftCommRevoke: destroy and abort wait */
  uint32_t suspended;           /* comm_suspend: operations are refused until comm_resume
                                   (1; 2 while comm_suspend decides) */
  uint32_t active;              /* threads inside an operation on this comm */
  uint32_t pending;             /* host-stream items naming this comm, not yet run */
  weftResult_t async_error;     /* read and set from any thread: comm_async_error(_set) */
  int oversubscribed_hold;      /* holds the waits' oversubscribed mode (transport/wait.h) */
  struct weft_redop redops[WEFT_MAX_REDOPS];
  int finalized;
  char last_error[1024];
  void *device; /* the device executor's state (device_cuda.c), NULL until used */
  struct comm_state_slot states[COMM_MAX_STATES]; /* modules' own state (comm_state_get) */
  int nstates;
  pid_t pid;                    /* the process that created it: a forked child may not use it */
};

/* Joins rank `rank` of `nranks` to the communicator of id and connects it
 * (collective over the ranks holding id). config may be NULL; cuda_dev is -1
 * for a host rank. Blocks until connected or the timeout passes. */
weftResult_t comm_init(weftComm_t *comm_out, int nranks, const struct bootstrap_id *id, int rank,
                       const weftConfig_t *config, int cuda_dev);

/* weftCommSplit on a rank that refuses it (refused, the thread's error text
 * saying why, as a caller's own checks found it): the rank takes part,
 * marked failed, so that every rank fails at once; returns refused. */
weftResult_t comm_split_refused(weftComm_t comm, int key, weftResult_t refused);

/* Reads config (NULL: the defaults) into cfg, honouring the caller's size
 * for older layouts; weftInvalidArgument when it is not a weftConfig_t. */
weftResult_t comm_config_read(const weftConfig_t *config, weftConfig_t *cfg);

/* The ring order: ranks of one host adjacent, hosts by their lowest rank. */
void ring_order(const struct peer_info *peers, int nranks, int *ring_out);

/* Rank's links in the two trees over peers: hierarchical across hosts
 * (tree_hier_links over the ring order); every rank's too in all_out[nranks]
 * unless NULL. Returns the depth of the deepest rank in either tree, the
 * same on every rank, or -1 when out of memory. */
int comm_trees(const struct peer_info *peers, int nranks, int rank, struct tree_links trees[2],
               struct tree_links (*all_out)[2]);

/* Connects every channel's ring (collective over the bootstrap). */
weftResult_t channels_connect(struct weftComm *comm, uint32_t nslots, size_t slot_nbytes);
void channels_close(struct weftComm *comm);

/* This process's id (renewed in a forked child). */
pid_t comm_self_pid(void);

/* The state module ops keeps on comm, or NULL before it set one. */
void *comm_state_get(const struct weftComm *comm, const struct comm_state_ops *ops);
/* Keeps state for module ops on comm (replacing the one it had); comm frees
 * it with ops->destroy. weftInternalError when the table is full. */
weftResult_t comm_state_set(struct weftComm *comm, const struct comm_state_ops *ops, void *state);
/* Frees every module's state, the last set first (comm's destruction). */
void comm_states_destroy(struct weftComm *comm);
/* Bytes of scratch the modules hold, and their release (NCCL_SUSPEND_MEM). */
uint64_t comm_states_scratch_nbytes(const struct weftComm *comm);
void comm_states_scratch_release(struct weftComm *comm);

/* Suspends comm (ncclCommSuspend): refused (weftInvalidUsage, the text
 * naming fn) while an operation runs or is queued on a stream, or when it
 * is suspended already; otherwise operations are refused until comm_resume,
 * and with release_scratch the modules' scratch is freed. An operation
 * marks the comm active before it asks `suspended` (op_begin,
 * device_op_begin), so one checked before the suspension either holds it
 * off or refuses itself. */
weftResult_t comm_suspend(struct weftComm *comm, int release_scratch, const char *fn);
/* Ends comm's suspension; 0 when it was not suspended. */
int comm_resume(struct weftComm *comm);
/* An operation begins on comm (the host and device executors alike): marks
 * it active, so that an abort, a revoke or a suspension waits for it or is
 * refused, then asks whether comm is revoked, suspended, finalized or
 * aborted, after the mark (an operation checked before one of those,
 * recorded in a group or queued on a host stream, runs after it). The mark
 * stays either way: the caller ends it (active--) whatever this returns. */
weftResult_t comm_op_mark(struct weftComm *comm);
/* Whether comm is suspended (a suspension still being decided is not). */
int comm_suspended(const struct weftComm *comm);

/* A host operation on comm begins: the threads that move its network
 * connections' slots poll without sleeping a while (struct weft_transport's
 * kick), or a peer's first slot after an idle spell waits for their sleep. */
void comm_kick_conns(struct weftComm *comm);

/* Poisons comm's channel and point-to-point connections only: operations in
 * flight here and on the peers end, the bootstrap stays usable (a revoke,
 * which every rank does and which later splits and shrinks build on). */
void comm_poison_conns(struct weftComm *comm);

/* Marks every connection of comm failed: channels and point-to-point. */
void comm_poison(struct weftComm *comm);

/* Records a failure on comm: the async error, the last-error text, and
 * poisoned connections. Returns res. */
weftResult_t comm_fail(struct weftComm *comm, weftResult_t res);

/* The first failure recorded on comm, or weftSuccess; any thread. */
static inline weftResult_t comm_async_error(const struct weftComm *comm) {
  return __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
}

/* Records res as comm's async error unless one is there already; any thread. */
static inline void comm_async_error_set(struct weftComm *comm, weftResult_t res) {
  weftResult_t none = weftSuccess;
  __atomic_compare_exchange_n(&comm->async_error, &none, res, 0, __ATOMIC_ACQ_REL,
                              __ATOMIC_ACQUIRE);
}

/* Records a failure of this rank alone that leaves its peers waiting on it
 * (an argument error in one rank's call of a collective): the comm breaks
 * as in comm_fail for a system error, whatever res is, so that the peers'
 * waits end at once instead of at the timeout. Returns res. */
weftResult_t comm_fail_alone(struct weftComm *comm, weftResult_t res);

/* Checks that comm is a live communicator of this process (not a forked
 * child's copy); sets the error text otherwise. */
weftResult_t comm_check(const struct weftComm *comm);

#endif
