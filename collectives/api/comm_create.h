/* Nonblocking communicator creation (api/comm_create.c): a config's
 * blocking = 0 makes weftCommInitRankConfig and weftCommInitFromEnv return
 * weftInProgress with the comm, which weftCommGetAsyncError reports as
 * weftInProgress until it is connected. */
#ifndef WEFT_API_COMM_CREATE_H
#define WEFT_API_COMM_CREATE_H

#include "../core/comm.h"

/* What a creation's thread runs, from the module that creates comms
 * (api/comm_lifecycle.c, which calls in here): init, its work on a zeroed
 * comm with comm->pid set, which on failure closes what it set up and does
 * not make comm live; abort, for a comm made after its caller gave up. */
struct comm_create_fns {
  weftResult_t (*init)(struct weftComm *comm, int nranks, const struct bootstrap_id *id,
                       int rank, const weftConfig_t *config, int cuda_dev);
  weftResult_t (*abort)(weftComm_t comm);
};

/* Hands back in *comm_out a comm whose creation (fns->init, then
 * comm_device_bind(bind_dev)) runs on a thread of its own, and returns
 * weftInProgress; or an error, leaving *comm_out alone. config, NULL or a
 * whole weftConfig_t as comm_config_read writes it, is copied. */
weftResult_t comm_create_start(weftComm_t *comm_out, int nranks, const struct bootstrap_id *id,
                               int rank, const weftConfig_t *config, int bind_dev,
                               const struct comm_create_fns *fns);

int comm_creating(const struct weftComm *comm);

/* For such a comm: *state is weftInProgress while the creation runs, then
 * its result; the first look at a success makes comm live. A failure's text
 * becomes the thread's. */
weftResult_t comm_create_poll(struct weftComm *comm, weftResult_t *state);

/* Destroy's and abort's part for such a comm: 1 where it is (now) a live
 * comm, to destroy or abort as any; 0 where nothing is left to do: a failed
 * creation freed, or, with abort, one still running left to free itself.
 * Without abort it waits for the creation to end. */
int comm_create_end(struct weftComm *comm, int abort);

#endif
