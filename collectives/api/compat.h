/* What an API layered over weft's (the NCCL drop-in, collectives/nccl/)
 * needs beyond include/weft.h, each for the reason given: small calls over
 * the communicator's state, the group, ids, the device and the settings, so
 * that the layer reads no internal structure (api/compat.c). */
#ifndef WEFT_COMPAT_H
#define WEFT_COMPAT_H

#include <stdint.h>

#include "../../include/weft.h"
/* The thread's error text and the process's last failure (weft_error_set,
 * _clear, _text, _publish, _text_process): the layer reports its own
 * refusals as weft's calls do, and ncclGetLastError(NULL) reads the
 * process's. The bottom layer's status module, which every layer uses. */
#include "../../transport/base/status.h"

/* --- Communicators ------------------------------------------------------------ */

/* Whether comm is a live communicator of this process (comm_check): calls
 * of NCCL's that weft has no call for check it first. */
weftResult_t compat_comm_check(weftComm_t comm);

/* Keeps the thread's error text as comm's last error, where comm is live:
 * ncclGetLastError(comm) says why the layer refused a call on it. */
void compat_comm_error_keep(weftComm_t comm);

/* comm's last error, copied for the calling thread (valid until its next
 * call), where comm is a live communicator of this process; NULL otherwise,
 * without reading comm (one freed already, say), for ncclGetLastError to
 * give the process's text instead. */
const char *compat_comm_error_text(weftComm_t comm);

/* Whether operations may start on comm (comm_op_begin, asked only), for
 * NCCL's calls that refuse a revoked, suspended or finalized communicator
 * before their arguments: the refusal names fn and is kept as comm's last
 * error. weftSuccess for a comm that is not live, which weft's call then
 * refuses in its own words. */
weftResult_t compat_comm_usable(weftComm_t comm, const char *fn);
/* The (algorithm, protocol) pairs the calling thread's next collective
 * allows (PLAN_SELECT bits of collectives/core/plan.h; 0: the tuner's
 * choice), for the nccl*Config calls' algSelection: taken by that call; the
 * caller sets 0 after it, so that a call refused before it is enqueued
 * leaves nothing for the next. */
void compat_select_next(unsigned alg_select);
/* A collective (coll: an enum coll_kind) that the NCCL API refused before
 * weft saw it (a bad ncclCollConfig_t, a suspended communicator): it takes
 * its number and its place in the trace as weft's own refusals do, so that
 * this rank's next call is not paired with the peers' pending one, and
 * fails the group it is in. */
void compat_coll_refused(weftComm_t comm, int coll, size_t count, weftDataType_t datatype,
                         weftRedOp_t op, int root, weftResult_t res);

/* The same for an all-to-all, gather or scatter (coll), numbered as weft
 * numbers it: where its buffers are host memory (group_coll_mark). */
void compat_coll_mark_refused(weftComm_t comm, int coll, const void *sendbuf, void *recvbuf,
                              size_t count, weftDataType_t datatype, int root, weftResult_t res);

/* NCCL's init: inside a group recorded, to run at the outermost group end
 * (group_defer_init: one thread creates several ranks), its arguments
 * checked now as weftCommInitRankConfig checks them, a refusal failing the
 * group; otherwise at once.
 * Either way the comm is bound to the CUDA device current at this call, as
 * NCCL ties a communicator to it (-1, a thread without a CUDA context,
 * keeps weft's way: the device of the first device operation). */
weftResult_t compat_comm_init(weftComm_t *comm_out, int nranks, const weftUniqueId *id, int rank,
                              const weftConfig_t *config);

/* NCCL's split: inside a group recorded (group_defer_split), its arguments
 * checked now as weftCommSplit checks them, a refusal failing the group;
 * otherwise weftCommSplit at once. */
weftResult_t compat_comm_split(weftComm_t comm, int color, int key, weftComm_t *newcomm,
                               const weftConfig_t *config);

/* NCCL's shrink: as its split, inside a group recorded (group_defer_shrink),
 * its arguments checked now (comm_shrink_args_check); otherwise
 * weftCommShrink at once. */
weftResult_t compat_comm_shrink(weftComm_t comm, const int *exclude, int nexclude,
                                weftComm_t *newcomm, const weftConfig_t *config);

/* A split refused by the layer's own checks (an NCCL config that does not
 * read), outside a group: the rank still takes part, marked failed, so that
 * its peers fail at once instead of at their timeout (comm_split_refused). */
weftResult_t compat_comm_split_refused(weftComm_t comm, int key, weftResult_t refused);

/* ncclCommSuspend and ncclCommResume: the life-cycle transitions
 * (comm_life_suspend, comm_life_resume); resume returns 0 when comm was not
 * suspended. */
weftResult_t compat_comm_suspend(weftComm_t comm, int release_scratch, const char *fn);
int compat_comm_resume(weftComm_t comm);

/* ncclCommMemStats: whether comm is suspended, and the bytes of scratch a
 * suspension releases. */
int compat_comm_suspended(weftComm_t comm);
uint64_t compat_comm_scratch_nbytes(weftComm_t comm);

/* ncclCommGrow on an existing rank: the ranks learn the root's id (id is
 * non-NULL on the root alone) over comm, then all join it as a communicator
 * of nranks, this rank keeping its rank. config NULL: comm's timeout and
 * name. comm is held meanwhile (an abort waits) and must be usable; a
 * failure is kept as comm's last error. */
weftResult_t compat_comm_grow(weftComm_t comm, int nranks, const weftUniqueId *id,
                              const weftConfig_t *config, weftComm_t *newcomm);

/* --- Groups ------------------------------------------------------------------- */

/* How many group starts are open on the calling thread: NCCL's calls that
 * behave otherwise inside a group (ncclCommGrow refuses, an inner
 * ncclGroupSimulateEnd leaves its estimate alone). The group itself is
 * weftGroupStart/End/SimulateEnd. */
int compat_group_depth(void);

/* A refusal of the layer's own (an NCCL config that does not read) while a
 * group is open: the group fails with res (the thread's error text saying
 * why), so that its end returns it and runs nothing, as for weft's own
 * refusals in a group. Nothing outside a group. */
void compat_group_fail(weftResult_t res);

/* --- Unique ids ---------------------------------------------------------------- */

/* The id every process computes from "host:port" without talking to the
 * others (NCCL_COMM_ID; what names the variable in messages). */
weftResult_t compat_id_from_hostport(const char *hostport, const char *what,
                                     weftUniqueId *id_out);
/* Serves the rendezvous of such an id on every address of this host at its
 * port: what rank 0 does when it joins a fixed NCCL_COMM_ID. */
weftResult_t compat_id_root_start(const weftUniqueId *id);

/* --- The CUDA device ------------------------------------------------------------ */

/* The calling thread's current device, or -1 without a CUDA context. */
int compat_device_current(void);
/* Visible devices (0 without CUDA): ncclCommInitAll's default list. */
int compat_device_count(void);
/* Makes the current device's context where there is a device: ncclMemAlloc
 * allocates device memory where weftMemAlloc would take host memory. */
void compat_device_ctx_make(void);

/* --- Settings --------------------------------------------------------------------- */

/* NCCL's parameter calls read weft's settings: a setting, by its variable's
 * name (NULL when there is none); every setting in order, i from 0 (NULL
 * past the last); its name, whether it is text (else an integer), and its
 * value (cached as weft reads it; text NULL when unset). */
struct weft_param;
struct weft_param *compat_param_find(const char *name);
struct weft_param *compat_param_at(int i);
const char *compat_param_name(const struct weft_param *p);
int compat_param_is_text(const struct weft_param *p);
int64_t compat_param_int(struct weft_param *p);
const char *compat_param_text(struct weft_param *p);

/* Forgets the logging settings' cached values (ncclResetDebugInit, after
 * NCCL_DEBUG changed). */
void compat_log_settings_reset(void);

#endif
