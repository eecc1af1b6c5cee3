#include "transport.h"

#include <string.h>

#include "base/param.h"
#include "base/status.h"
#include "weft_build_config.h"

struct weft_param transport_params[] = {
    {.name = "WEFT_TRANSPORT", .type = PARAM_STR,
     .doc = "use only this transport (`shm`, `ucx`, `socket`); connections it cannot make fail"},
    PARAM_END,
};
enum { P_TRANSPORT };

extern const struct weft_transport shm_transport;
extern const struct weft_transport socket_transport;
#if WEFT_HAVE_UCX
extern const struct weft_transport ucx_transport;
#endif

const struct weft_transport *const weft_transports[] = {
    &shm_transport,
#if WEFT_HAVE_UCX
    &ucx_transport, /* between hosts, before sockets */
#endif
    &socket_transport, /* after shm: on one host, memory is faster */
    NULL,
};

int transport_select(const struct peer_info *sender, const struct peer_info *receiver) {
  const char *only = param_str(&transport_params[P_TRANSPORT]);
  for (int i = 0; weft_transports[i] != NULL; i++) {
    const struct weft_transport *t = weft_transports[i];
    if (only != NULL && strcmp(only, t->name) != 0) continue;
    if (t->disabled != NULL && t->disabled()) continue;
    if (t->can_connect(sender, receiver)) return i;
  }
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
