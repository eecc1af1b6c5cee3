/* Communicator creation (api/comm_lifecycle.c): what split and shrink build their
 * children with, besides the public weftCommInit* calls; and the comm's last
 * error, which every call that names a comm keeps. */
#ifndef WEFT_API_COMM_H
#define WEFT_API_COMM_H

#include "../core/comm.h"

/* Joins rank `rank` of `nranks` to the communicator of id and connects it
 * (collective over the ranks holding id). config may be NULL; cuda_dev is -1
 * for a host rank. Blocks until connected or the timeout passes. */
weftResult_t comm_init(weftComm_t *comm_out, int nranks, const struct bootstrap_id *id, int rank,
                       const weftConfig_t *config, int cuda_dev);

/* Whether config asks for a nonblocking creation (its blocking is 0). */
int comm_config_nonblocking(const weftConfig_t *config);

/* comm_init without blocking (api/comm_create.c): hands back the comm at
 * once and returns weftInProgress while it joins and connects on a thread of
 * its own; comm_device_bind(bind_dev) once it is connected. */
weftResult_t comm_init_nonblocking(weftComm_t *comm_out, int nranks,
                                   const struct bootstrap_id *id, int rank,
                                   const weftConfig_t *config, int bind_dev);

/* weftCommInitRankConfig's checks, before any rendezvous: comm_out is not
 * NULL, nranks is 1 to the most a communicator holds, rank is in range and
 * config reads (comm_config_read). A group that records an init asks them at
 * the call. */
weftResult_t comm_init_args_check(weftComm_t *comm_out, int nranks, int rank,
                                  const weftConfig_t *config);

/* A split's or shrink's leader, which serves the child's rendezvous at id:
 * the parent's rank parent_rank joins as child_rank. Where it shares this
 * host, the root watches its process, so that a death before it joins
 * fails the others at once instead of at their timeout. */
void comm_child_watch(const struct weftComm *parent, const struct bootstrap_id *id,
                      int parent_rank, int child_rank);

/* weftCommShrink's checks of this rank's arguments, before any exchange:
 * comm is live, newcomm is not NULL, the exclude list is valid and leaves
 * this rank out of it, config reads. A group that records a shrink asks them
 * at the call. */
weftResult_t comm_shrink_args_check(weftComm_t comm, const int *exclude, int nexclude,
                                    const weftComm_t *newcomm, const weftConfig_t *config);

/* Reads config (NULL: the defaults) into cfg, honouring the caller's size
 * for older layouts; weftInvalidArgument when it is not a weftConfig_t or a
 * field is out of its range (the text names the field and the range). */
weftResult_t comm_config_read(const weftConfig_t *config, weftConfig_t *cfg);

/* Keeps the thread's error text as comm's last error (weftGetLastError(comm))
 * where comm is live, and returns res. Every refusal of a call that names a
 * live comm ends here, so that the comm's text is never an older failure's. */
weftResult_t comm_error_keep(struct weftComm *comm, weftResult_t res);

/* Copies comm's last error into out (n bytes) and returns 1 where comm is a
 * live communicator of this process; 0 otherwise, without reading comm (a
 * freed one among them). A free on another thread waits for the copy. */
int comm_error_text_copy_live(const struct weftComm *comm, char *out, size_t n);

#endif
