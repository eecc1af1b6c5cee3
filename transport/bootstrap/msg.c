/* Messages between two ranks (up to 64 KiB, matched by sender and tag),
 * each on a connection of its own to the receiver's listener; and the
 * failure notice every rank's waits on the sender watch for. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/status.h"
#include "wire.h"

weftResult_t bootstrap_send(struct bootstrap *bs, int peer, uint32_t tag, const void *data,
                            size_t nbytes) {
  if (nbytes > MSG_MAX_NBYTES)
    return weft_error_set(weftInternalError, "bootstrap message of %zu bytes too large", nbytes);
  uint64_t deadline = clock_ns() + bs->timeout_ns;
  struct msg_header h = {.magic = MSG_MAGIC, .from = bs->rank, .tag = tag,
                         .nbytes = (uint32_t)nbytes};
  memcpy(h.secret, bs->secret, sizeof h.secret);
  int fd;
  struct weft_wait w;
  bootstrap_watch(bs, peer, bs->timeout_ns, "send a bootstrap message to", &w);
  weftResult_t res = sock_connect_peer(&bs->addrs[peer], deadline, &w, &fd);
  if (res != weftSuccess)
    return weft_error_set(res, "bootstrap message to rank %d: %s", peer, weft_error_text());
  res = sock_send_all(fd, &h, sizeof h, deadline);
  if (res == weftSuccess && nbytes > 0) res = sock_send_all(fd, data, nbytes, deadline);
  close(fd);
  return res;
}

weftResult_t bootstrap_recv(struct bootstrap *bs, int peer, uint32_t tag, void *data,
                            size_t nbytes) {
  uint64_t deadline = clock_ns() + bs->timeout_ns;
  struct weft_wait w;
  bootstrap_watch(bs, peer, bs->timeout_ns, "receive a bootstrap message from", &w);
  struct bs_msg **link = &bs->unexpected;
  for (;;) {
    for (; *link != NULL; link = &(*link)->next) {
      struct bs_msg *m = *link;
      if (m->from != peer || m->tag != tag) continue;
      *link = m->next;
      weftResult_t res = weftSuccess;
      if (m->nbytes != nbytes)
        res = weft_error_set(weftInternalError,
                             "bootstrap message from rank %d has %u bytes, expected %zu", peer,
                             m->nbytes, nbytes);
      else
        memcpy(data, m->data, nbytes);
      free(m);
      return res;
    }
    if (bootstrap_msg_failed_rank(bs, peer) >= 0)
      return weft_error_set(weftRemoteError,
                            "rank %d failed (seen while waiting for a bootstrap message from it)",
                            peer);
    /* the scan resumes at *link, where a newly queued message lands; in
     * slices, so that a failure message is seen promptly */
    uint64_t slice = clock_ns() + SERVE_SLICE_NS;
    weftResult_t res = bootstrap_listener_serve(bs, slice < deadline ? slice : deadline, &w, -1, NULL);
    if (res == weftInProgress && clock_ns() >= deadline)
      res = weft_error_set(weftRemoteError, "timed out");
    if (res != weftSuccess && res != weftInProgress)
      return weft_error_set(res, "waiting for a bootstrap message from rank %d: %s", peer,
                            weft_error_text());
  }
}

void bootstrap_poison(struct bootstrap *bs) {
  if (bs == NULL || __atomic_exchange_n(&bs->poisoned, 1u, __ATOMIC_ACQ_REL)) return;
  __atomic_store_n(&bs->failed_ns, clock_ns(), __ATOMIC_RELEASE); /* for bootstrap_query_linger */
  /* the caller's error is the one to report: a peer that is gone here
   * would overwrite its text */
  char *error = strdup(weft_error_text());
  uint32_t epoch = __atomic_load_n(&bs->epoch, __ATOMIC_ACQUIRE);
  struct msg_header h = {.magic = MSG_MAGIC, .from = bs->rank, .tag = MSG_TAG_FAILED,
                         .nbytes = sizeof epoch};
  memcpy(h.secret, bs->secret, sizeof h.secret);
  for (int r = 0; r < bs->nranks; r++) {
    if (r == bs->rank) continue;
    /* best effort and brief: a peer that is gone refuses at once */
    uint64_t deadline = clock_ns() + 250000000ull;
    int fd;
    if (sock_connect_peer(&bs->addrs[r], deadline, NULL, &fd) != weftSuccess) continue;
    if (sock_send_all(fd, &h, sizeof h, deadline) == weftSuccess)
      sock_send_all(fd, &epoch, sizeof epoch, deadline);
    close(fd);
  }
  WEFT_INFO(LOG_BOOTSTRAP, "rank %d told the other %d ranks that it failed", bs->rank,
            bs->nranks - 1);
  if (error != NULL) weft_error_set(weftSuccess, "%s", error);
  free(error);
}

void bootstrap_revoke(struct bootstrap *bs) {
  if (bs == NULL) return;
  __atomic_add_fetch(&bs->epoch, 1u, __ATOMIC_ACQ_REL);
  __atomic_store_n(&bs->poisoned, 0u, __ATOMIC_RELEASE);
}
