/* Groups (api/group.c): weftGroupStart/End record operations and launch them
 * together at the outermost end. One thread-local group serves every API
 * over weft: weft's own calls and the NCCL drop-in's. */
#ifndef WEFT_GROUP_H
#define WEFT_GROUP_H

#include "../core/plan.h"

/* How many group starts are open on the calling thread (0: none); read
 * inline through group_depth_get, changed by group.c alone. */
extern __thread int group_depth;
static inline int group_depth_get(void) { return group_depth; }
/* Remembers the first failure while recording (res, the thread's error text
 * saying why), for weftGroupEnd to return: the group then runs nothing. */
void group_fail(weftResult_t res);
/* Records plan, checked and tuned, to run at the outermost weftGroupEnd. */
weftResult_t group_record(struct weftComm *comm, const struct weft_plan *plan,
                          weftStream_t stream);
/* Records plan's call, which runs nothing (refused when called, or done
 * with no elements), with its result: at the outermost weftGroupEnd it takes
 * its number and its place in the trace in call order, as the group's other
 * calls do; at weftGroupSimulateEnd, neither. */
void group_record_done(struct weftComm *comm, const struct weft_plan *plan,
                       weftResult_t result);

/* A call that ends where it is called, running nothing (refused, or of no
 * elements), still takes its number and its place in the trace, in call
 * order: now, or in a group at its end. */
void group_call_done(struct weftComm *comm, const struct weft_plan *plan, weftResult_t res);

/* All-to-all, gather and scatter (sendrecv_colls.c) on host memory: the
 * call's mark (coll: COLL_GATHER, COLL_SCATTER or COLL_ALLTOALL) in the open
 * group that then takes its sends and receives. It runs nothing; it takes a
 * collective's number and place in the trace, is done when they are, and a
 * stall of theirs asks the peers about it, so that ranks that disagree on
 * the root or the count are named at once as for a collective. With res a
 * failure (the call refused, outside the group or in it) it is recorded
 * failed with it. A call on device memory has no mark, decided by the buffer
 * every rank has (a gather's and an all-to-all's sendbuf, a scatter's
 * recvbuf) so that the peers decide alike; one of no elements always has
 * one (done at once), whatever its pointers. */
weftResult_t group_coll_mark(struct weftComm *comm, enum coll_kind coll, const void *sendbuf,
                             void *recvbuf, size_t count, weftDataType_t datatype, int root,
                             weftStream_t stream, weftResult_t res);

/* Communicator creation inside a group (the NCCL drop-in's init and split,
 * which one thread may call for several ranks of one clique), with this
 * rank's arguments checked by the caller (compat_comm_init, whose refusal
 * or failure to record fails the group): recorded, and run at the outermost end, every recorded one at once, a thread each, before the
 * group's operations. *out is written then: NULL where it failed, the end
 * returning a failure of a rank's own before a peer's weftRemoteError (that
 * peer waited for it). Where any call of the group failed, the end creates
 * nothing and writes NULL to every *out. cfg may be NULL; it is copied, its
 * name too. An init is bound to the CUDA device current at this call
 * (comm_device_bind). Outside a group the caller creates at once. */
weftResult_t group_defer_init(weftComm_t *out, int nranks, const weftUniqueId *id, int rank,
                              const weftConfig_t *cfg);
weftResult_t group_defer_split(weftComm_t parent, int color, int key, weftComm_t *out,
                               const weftConfig_t *cfg);
/* NCCL's shrink in a group: recorded with a copy of the exclude list. */
weftResult_t group_defer_shrink(weftComm_t parent, const int *exclude, int nexclude,
                                weftComm_t *out, const weftConfig_t *cfg);

#endif
