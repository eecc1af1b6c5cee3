/* What the files of libnccl.so.2 share: nccl_compat.c (the core API and
 * groups), nccl_comm.c (revoke, suspend, grow), nccl_comm_state.c (what the
 * NCCL API keeps per communicator), nccl_param.c (parameters), nccl_device.c
 * (the device API's host side), nccl_coll_config.c (the nccl*Config
 * collectives), nccl_env.c (NCCL_* variables and configuration files). They use include/weft.h and, for what it
 * does not offer, api/compat.h alone. */
#ifndef WEFT_NCCL_SHIM_H
#define WEFT_NCCL_SHIM_H

#include <stdint.h>
#include <stdlib.h>

#include "../../include/nccl.h"
#include "../../include/weft.h"
#include "../api/compat.h"

/* As in NCCL, nccl<name> is weak so that a profiling library may define its
 * own and call the real one as pnccl<name>, the same function under a
 * second, strong name. */
#define NCCL_EXPORT __attribute__((visibility("default"), weak))
#define NCCL_PROFILING_ALIAS(name) \
  extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")))

/* nccl_res of a failure. NCCL prints its refusals with NCCL_DEBUG=WARN or
 * more, and nothing with NCCL_DEBUG unset, where weft's level is WARN by
 * default: asked for a level, a WARN line; else the INFO line every error
 * gets. */
static inline void nccl_res_failed(weftResult_t r) {
  const char *text = weft_error_text();
  weft_error_publish(text);
  if (getenv("NCCL_DEBUG") != NULL || getenv("WEFT_DEBUG") != NULL)
    WEFT_WARN(LOG_ALL, "%s: %s", weftGetErrorString(r), text);
}

/* An NCCL call's result: a failure's text becomes the process's last
 * (ncclGetLastError(NULL) on a thread of its own), and is logged at WARN
 * where NCCL_DEBUG (or WEFT_DEBUG) is set, as NCCL logs its refusals. */
static inline ncclResult_t nccl_res(weftResult_t r) {
  if (__builtin_expect(r != weftSuccess && r != weftInProgress, 0)) nccl_res_failed(r);
  return (ncclResult_t)r;
}
#define RES(r) nccl_res(r)

/* Reads an ncclConfig_t of any 2.x layout into cfg; *cfg_out_p is cfg, or
 * NULL when user is NULL. */
ncclResult_t nccl_config_read(const ncclConfig_t *user, weftConfig_t *cfg,
                              weftConfig_t **cfg_out_p);

/* The WEFT_* variable an NCCL_* one is copied to (at load, at the first
 * use), or NULL. */
const char *nccl_env_alias(const char *nccl_name);
/* Imports the NCCL_* variables again, once per process, at the first call
 * that starts something (a unique id, an init): those a program sets before
 * its first NCCL call count, as in NCCL (nccl_env.c). */
void nccl_env_first_use(void);
/* NCCL_DEBUG=VERSION (or more) prints the version once, on rank 0, as NCCL
 * does (nccl_env.c). */
void nccl_version_banner(int rank);

/* Around the free of comm: what nccl_comm_state.c keeps about it is set
 * aside before (from then on, a communicator made at the same address gets
 * an entry of its own), and dropped after, or put back where the free was
 * refused (freed 0). */
void nccl_comm_close_begin(ncclComm_t comm);
void nccl_comm_close_end(ncclComm_t comm, int freed);

/* A grow id for comm (ncclCommGetUniqueId): weftInvalidUsage while the last
 * one is unconsumed. */
weftResult_t nccl_comm_grow_id_make(ncclComm_t comm, ncclUniqueId *uniqueId);
/* Whether uniqueId is comm's unconsumed grow id; consumes it if so. */
int nccl_comm_grow_id_consume(ncclComm_t comm, const ncclUniqueId *uniqueId);

/* A window: a registration and the buffer it covers. */
#define NCCL_WINDOW_MAGIC 0x6e63636c2d77696eull /* "nccl-win" */
struct ncclWindow_vidmem {
  uint64_t magic;
  ncclComm_t comm;
  void *handle; /* weftCommRegister's */
  void *buff;
  size_t nbytes;
};
/* The window's communicator, or NULL when win is not a live window. */
ncclComm_t nccl_window_comm(ncclWindow_t win);

#endif
