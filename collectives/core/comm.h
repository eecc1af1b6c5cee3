/* The communicator: who we are, our peers, our channels, and how we fail. */
#ifndef WEFT_COMM_H
#define WEFT_COMM_H

#include <stdint.h>

#include "../../include/weft.h"
#include "../../transport/bootstrap/bootstrap.h"
#include "../../transport/transport.h"
#include "tree_links.h"

struct trace;

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
/* A comm whose nonblocking creation (config blocking = 0) runs, or failed:
 * only weftCommGetAsyncError, weftCommDestroy and weftCommAbort take it
 * (comm_create.c). */
#define COMM_MAGIC_CREATING 0x776566742d6e6577ull /* "weft-new" */

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

/* A communicator's life cycle: one state in comm->life, changed only by the
 * comm_life_* transitions below (atomic compare-exchanges), read with
 * comm_life. Whether an operation may start is comm_op_begin's to say.
 *
 *   from                         to            by
 *   INITIALIZING                 READY         comm_init, once connected
 *   READY                        SUSPENDING    comm_life_suspend (deciding)
 *   SUSPENDING                   SUSPENDED     comm_life_suspend: nothing runs or is queued
 *   SUSPENDING                   READY         comm_life_suspend: something does (refused)
 *   SUSPENDED                    READY         comm_life_resume
 *   READY, SUSPENDED, FINALIZED  REVOKING      comm_life_revoke_begin (the first revoke)
 *   REVOKING                     REVOKED       comm_life_revoke_end
 *   REVOKING                     FINALIZED     comm_life_revoke_end, the revoke of a finalized comm
 *   READY, SUSPENDED, REVOKED    FINALIZED     comm_life_finalize
 *   any                          ABORTED       comm_life_abort (weftCommAbort, then freed)
 *
 * A transition out of SUSPENDING or REVOKING waits until that one is
 * decided. Collectives, sends and receives start in READY only; split and
 * shrink, which use the bootstrap alone, also on a SUSPENDED or REVOKED
 * comm; destroy and abort in any state. */
enum comm_life {
  COMM_INITIALIZING = 0, /* being connected (calloc's zero) */
  COMM_READY,            /* operations run */
  COMM_SUSPENDING,       /* a suspension is being decided */
  COMM_SUSPENDED,        /* operations are refused until resumed (ncclCommSuspend) */
  COMM_REVOKING,         /* weftCommRevoke is stopping what runs */
  COMM_REVOKED,          /* operations are refused; split, shrink, destroy and abort remain */
  COMM_FINALIZED,        /* weftCommFinalize: operations are refused; destroy and abort remain */
  COMM_ABORTED,          /* weftCommAbort: being freed */
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
  /* the channels, from 0, on which every rank's ring connections can move
   * bulk transfers (channels_connect, from every rank's transports): what
   * bulk_possible decides on, alike on every rank */
  int bulk_nchannels_all;
  struct tree_links trees[2];   /* this rank's place in the two trees (comm_trees) */
  int tree_depth;               /* the deepest rank's depth in either tree */
  struct tree_links tree_small;  /* the tree of small all-reduces (comm_tree_small) */
  size_t tree_small_nbytes;     /* WEFT_TREE_SMALL_BYTES on one host; 0 across hosts */
  uint32_t nslots;              /* FIFO shape of every connection */
  size_t slot_nbytes;
  /* [nranks]: to and from each peer, connected on first use: the peer
   * collectives' (direct, tree, recursive doubling, single copy's exchange,
   * WEFT_DETERMINISTIC's exchanges),
   * and apart from them the sends' and receives' (gather, scatter and
   * all-to-all among them), so that the two kinds never meet in a FIFO: a
   * rank may run a send and a collective in either order against its peer's */
  struct weft_conn *send_conns;
  struct weft_conn *recv_conns;
  struct weft_conn *p2p_send_conns;
  struct weft_conn *p2p_recv_conns;
  uint64_t timeout_ns;
  uint64_t seq;                 /* collectives issued */
  uint64_t signature_seq;       /* collectives run through WEFT_CHECK's comparison */
  uint32_t life;                /* enum comm_life: changed only by comm_life_* below */
  /* The word this rank's waits poll (transport/base/wait.h, the bootstrap,
   * the device executor's copy): not a state but the signal to stop, up
   * while the comm is ABORTED and while it is REVOKING. */
  volatile uint32_t abort_flag;
  /* Counters, not states: what a transition waits out. */
  uint32_t revoking;            /* threads inside weftCommRevoke: destroy and abort wait */
  uint32_t active;              /* threads inside an operation (comm_op_begin's hold) */
  uint32_t pending;             /* host-stream items naming this comm, not yet run */
  /* A result, not a state: the first failure, kept until a revoke clears
   * it; read and set from any thread (comm_async_error(_set)). */
  weftResult_t async_error;
  int oversubscribed_hold;      /* holds the waits' oversubscribed mode (transport/wait.h) */
  /* some host of the comm has more of its ranks than CPUs for them: what the
   * tuner prices, alike on every rank (each host knows only its own) */
  int oversubscribed_any;
  struct weft_redop redops[WEFT_MAX_REDOPS];
  /* The texts below are written by whichever thread ran the failing call (a
   * stream's worker among them) and read by any thread: each is written and
   * copied whole under error_lock (comm_error_text_*), never in place. */
  uint32_t error_lock;
  char last_error[1024];
  char broken_cause[1024];      /* the last error when the comm broke: what refusals name */
  void *device; /* the device executor's state (device_cuda.c), NULL until used */
  struct comm_state_slot states[COMM_MAX_STATES]; /* modules' own state (comm_state_get) */
  int nstates;
  /* its buffer registrations (weftCommRegister), listed and freed by mem.c
   * under its lock: any thread registers, and the comm's free frees them */
  struct mem_reg *regs;
  pid_t pid;                    /* the process that created it: a forked child may not use it */
  struct comm_creation *creation; /* a nonblocking creation's state until it is seen done */
  struct trace *trace;          /* its last calls (trace.h); NULL when tracing is off */
};

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

/* comm's state now (any thread). */
static inline enum comm_life comm_life(const struct weftComm *comm) {
  return (enum comm_life)__atomic_load_n(&comm->life, __ATOMIC_SEQ_CST);
}
/* The name of a state, for messages and logs. */
const char *comm_life_name(enum comm_life life);

/* INITIALIZING -> READY: comm_init has connected comm. */
void comm_life_ready(struct weftComm *comm);

/* Suspends comm (ncclCommSuspend): refused (weftInvalidUsage, the text
 * naming fn) while an operation runs or is queued on a stream, or when comm
 * is not READY; otherwise operations are refused until comm_life_resume,
 * and with release_scratch the modules' scratch is freed. An operation
 * holds the comm before it asks its state (comm_op_begin), so one that
 * asked before the suspension either holds it off or refuses itself. */
weftResult_t comm_life_suspend(struct weftComm *comm, int release_scratch, const char *fn);
/* SUSPENDED -> READY; 0 when comm was not suspended. */
int comm_life_resume(struct weftComm *comm);

/* Starts weftCommRevoke: 1 when this thread revokes (comm is REVOKING now,
 * its abort flag up; *from_out is the state it left), 0 when another revoke has run or runs
 * (waited for: comm is revoked once this returns). */
int comm_life_revoke_begin(struct weftComm *comm, enum comm_life *from_out);
/* Ends the revoke comm_life_revoke_begin started from `from`: REVOKED, or
 * FINALIZED again for a finalized comm; the abort flag comes down first
 * (the bootstrap serves split and shrink next) unless comm was aborted
 * meanwhile. */
void comm_life_revoke_end(struct weftComm *comm, enum comm_life from);

/* weftCommFinalize's transition (after the streams drained): -> FINALIZED,
 * once a suspension or a revoke being decided is. */
void comm_life_finalize(struct weftComm *comm);

/* Any state -> ABORTED, and the abort flag up: every wait of this rank on
 * comm ends, and nothing starts on it again. */
void comm_life_abort(struct weftComm *comm);

/* comm_op_begin's flags. */
enum {
  /* Hold comm first (active++): an abort, a revoke or a suspension waits for
   * the hold or is refused. The hold stays whatever comm_op_begin returns:
   * the caller ends it with comm_op_end. Without it comm_op_begin only asks,
   * for a call recorded in a group or queued on a host stream, which begins
   * again when it runs. */
  COMM_OP_HOLD = 1,
  /* Split and shrink: they use comm's bootstrap only, so a SUSPENDED or
   * REVOKED comm may; a REVOKING one may not yet (its bootstrap is
   * stopped). */
  COMM_OP_REBUILD = 2,
};

/* The one answer to whether an operation may start on comm (the
 * collectives' calls, the host and device executors, split, shrink, the
 * NCCL drop-in): weftSuccess, or the refusal with the thread's error text
 * saying why, prefixed with fn unless NULL (weftInvalidUsage; weftRemoteError
 * for an aborted comm). With COMM_OP_HOLD the state is asked after the hold,
 * waiting out a suspension being decided (it then fails: the hold is
 * seen). */
/* comm_op_begin's answer for a comm found in state v (after the hold, with
 * COMM_OP_HOLD), other than READY. */
weftResult_t comm_op_begin_state(struct weftComm *comm, int flags, const char *fn,
                                 enum comm_life v);
static inline weftResult_t comm_op_begin(struct weftComm *comm, int flags, const char *fn) {
  if (flags & COMM_OP_HOLD) __atomic_add_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
  const enum comm_life v = comm_life(comm);
  if (__builtin_expect(v == COMM_READY, 1)) return weftSuccess;
  return comm_op_begin_state(comm, flags, fn, v);
}
/* Holds comm without asking its state (comm_op_end ends it), for a call
 * that uses comm across steps that each ask (a group's end): an abort or a
 * revoke on another thread waits for it rather than free or reuse what it
 * still touches. */
static inline void comm_hold(struct weftComm *comm) {
  __atomic_add_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
}
/* comm's timeout, which weftCommSetTimeout changes from any thread. */
static inline uint64_t comm_timeout_ns(const struct weftComm *comm) {
  return __atomic_load_n(&comm->timeout_ns, __ATOMIC_RELAXED);
}
/* Ends comm_op_begin's hold. */
static inline void comm_op_end(struct weftComm *comm) {
  __atomic_sub_fetch(&comm->active, 1, __ATOMIC_SEQ_CST);
}

/* Whether a failure on comm is a revoke's doing (REVOKING or REVOKED): not
 * the comm's error, which the revoke clears. */
int comm_life_revoked(const struct weftComm *comm);

/* NCCL ties a communicator to the CUDA device current at its creation:
 * comm takes dev (>= 0) unless it has one. */
void comm_device_bind(struct weftComm *comm, int dev);

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

/* Makes text comm's last error (weftGetLastError); any thread. */
void comm_error_text_set(struct weftComm *comm, const char *text);
/* Copies comm's last error into out (n bytes); any thread. */
void comm_error_text_copy(struct weftComm *comm, char *out, size_t n);
/* Replaces the last error and the broken cause where they read old (the
 * numbering of a failed call's text, hang.c); any thread. */
void comm_error_text_replace(struct weftComm *comm, const char *old, const char *text);

/* The refusal of a call on comm once it broke: "communicator is broken by
 * an earlier error: " and the error it broke with (broken_cause, not the
 * last error, which is the last refusal's: each refusal had wrapped the one
 * before again). Sets the thread's error text; returns its code. */
weftResult_t comm_broken_refusal(struct weftComm *comm, const char *call);

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
weftResult_t comm_check_slow(const struct weftComm *comm);
/* comm_self_pid's value once it was asked (a comm's creation asks), else 0. */
extern pid_t comm_pid_cached;
/* comm_check_slow, inline where it passes: every call of the API checks. */
static inline weftResult_t comm_check(const struct weftComm *comm) {
  if (__builtin_expect(comm != NULL && comm->magic == COMM_MAGIC &&
                           comm->pid == __atomic_load_n(&comm_pid_cached, __ATOMIC_RELAXED),
                       1))
    return weftSuccess;
  return comm_check_slow(comm);
}

#endif
