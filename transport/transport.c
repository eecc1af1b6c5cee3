/* The one registry of transports, host and device memory alike, and the
 * one function that chooses among them by asking each transport. */
#include "transport.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/param.h"
#include "base/status.h"
#include "weft_build_config.h"

static const char *const transport_names[] = {"shm", "socket", "ucx", NULL};
struct weft_param transport_params[] = {
    {.name = "WEFT_TRANSPORT", .type = PARAM_STR, .choices = transport_names,
     .doc = "use only this transport (`shm`, `ucx`, `socket`, any case); connections it cannot "
            "make fail; another name is refused when a communicator is created. It and each "
            "transport's disable setting apply to all connections to and from the rank that "
            "sets them: its peers use, towards it, only transports it has not turned off "
            "(with `WEFT_TRANSPORT`, the one it names; a connection no allowed transport can "
            "make fails), so only a host whose UCX is broken needs `WEFT_UCX_DISABLE=1`"},
    PARAM_END,
};
enum { P_TRANSPORT };

extern const struct weft_transport shm_transport;
extern const struct weft_transport socket_transport;
#if WEFT_HAVE_UCX
extern const struct weft_transport ucx_transport;
#endif
#if WEFT_HAVE_CUDA
extern const struct weft_transport peer_access_transport;
extern const struct weft_transport cuda_ipc_transport;
extern const struct weft_transport host_fifo_transport;
#endif

/* The order is the preference. Each transport's can_connect says which
 * memory and which pairs of ranks it serves: shm carries host memory on one
 * host; the device transports carry a kernel's FIFO on one host (GPUs of one
 * process with peer access, then other processes' GPUs with peer access,
 * then pinned host memory both map); the networks carry host memory to any
 * rank and device memory to other hosts (as device network connections,
 * net_dev.h). */
const struct weft_transport *const weft_transports[] = {
    &shm_transport,
#if WEFT_HAVE_CUDA
    &peer_access_transport,
    &cuda_ipc_transport,
    &host_fifo_transport,
#endif
#if WEFT_HAVE_UCX
    &ucx_transport, /* between hosts, before sockets */
#endif
    &socket_transport, /* after shm: on one host, memory is faster */
    NULL,
};

int transport_refuse(char *why, size_t why_nbytes, const char *fmt, ...) {
  if (why_nbytes > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_nbytes, fmt, ap);
    va_end(ap);
  }
  return 0;
}

/* Appends "name: reason; " to the message being built in why. */
static void why_append(char *why, size_t why_nbytes, size_t *len, const char *name,
                       const char *reason) {
  if (*len >= why_nbytes) return;
  int n = snprintf(why + *len, why_nbytes - *len, "%s%s: %s", *len > 0 ? "; " : "", name, reason);
  if (n > 0) *len += (size_t)n;
}

/* Whether this rank's settings turn t off, with why in reason. */
static int transport_off_here(const struct weft_transport *t, char *reason, size_t nbytes) {
  const char *only = param_str(&transport_params[P_TRANSPORT]);
  /* WEFT_TRANSPORT names the transports of host memory and the networks */
  if (only != NULL && !(t->caps & TRANSPORT_CAP_DEVICE_MEMORY) && strcasecmp(only, t->name) != 0) {
    snprintf(reason, nbytes, "WEFT_TRANSPORT=%s", only);
    return 1;
  }
  if (t->disabled != NULL && t->disabled()) {
    snprintf(reason, nbytes, "disabled (%s=1)", t->disable_env);
    return 1;
  }
  return 0;
}

void transport_peer_info(struct peer_info *info) {
  char reason[160];
  info->transports_off = 0;
  for (int i = 0; weft_transports[i] != NULL && i < 32; i++)
    if (transport_off_here(weft_transports[i], reason, sizeof reason))
      info->transports_off |= 1u << i;
}

int transport_select(const struct peer_info *sender, const struct peer_info *receiver,
                     const struct transport_need *need, char *why, size_t why_nbytes) {
  char reasons[512] = "", reason[160];
  size_t len = 0;
  for (int i = 0; weft_transports[i] != NULL; i++) {
    const struct weft_transport *t = weft_transports[i];
    const uint32_t bit = i < 32 ? 1u << i : 0;
    reason[0] = '\0';
    if (transport_off_here(t, reason, sizeof reason)) {
    } else if (sender->transports_off & bit) {
      snprintf(reason, sizeof reason, "off on rank %d (its WEFT_TRANSPORT or %s)", sender->rank,
               t->disable_env != NULL ? t->disable_env : "settings");
    } else if (receiver->transports_off & bit) {
      snprintf(reason, sizeof reason, "off on rank %d (its WEFT_TRANSPORT or %s)",
               receiver->rank, t->disable_env != NULL ? t->disable_env : "settings");
    } else if (t->can_connect(sender, receiver, need, reason, sizeof reason)) {
      return i;
    }
    why_append(reasons, sizeof reasons, &len, t->name, reason[0] ? reason : "cannot");
  }
  if (why_nbytes > 0)
    snprintf(why, why_nbytes, "no transport connects rank %d to rank %d (%s memory): %s",
             sender->rank, receiver->rank, need->mem == TRANSPORT_MEM_DEVICE ? "device" : "host",
             reasons);
  return -1;
}

weftResult_t transport_check_fifo(int peer_rank, uint32_t nslots, size_t slot_nbytes,
                                  uint64_t peer_fifo_nbytes) {
  if (peer_fifo_nbytes == (uint64_t)nslots * slot_nbytes) return weftSuccess;
  return weft_error_set(weftInvalidUsage,
                        "rank %d uses a different FIFO size (WEFT_NSLOTS/WEFT_SLOT_BYTES must "
                        "match on all ranks)",
                        peer_rank);
}
