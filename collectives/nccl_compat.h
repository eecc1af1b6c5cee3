/* What the files of libnccl.so.2 (nccl_compat.c, nccl_group.c) share. */
#ifndef WEFT_NCCL_COMPAT_H
#define WEFT_NCCL_COMPAT_H

#include "../include/nccl.h"
#include "../include/weft.h"

/* As in NCCL, nccl<name> is weak so that a profiling library may define its
 * own and call the real one as pnccl<name>, the same function under a
 * second, strong name. */
#define NCCL_EXPORT __attribute__((visibility("default"), weak))
#define NCCL_PROFILING_ALIAS(name) \
  extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")))

#define RES(r) ((ncclResult_t)(r))

/* Whether the calling thread is between ncclGroupStart and ncclGroupEnd. */
int nccl_group_active(void);

/* Inside a group, communicator creation is recorded and runs at the
 * outermost ncclGroupEnd, every recorded one at once: so one thread can
 * create the communicators of several ranks of the same clique. cfg may be
 * NULL. *out is written when the group ends. */
ncclResult_t nccl_defer_init(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                             const weftConfig_t *cfg);
ncclResult_t nccl_defer_split(ncclComm_t parent, int color, int key, ncclComm_t *out,
                              const weftConfig_t *cfg);

#endif
