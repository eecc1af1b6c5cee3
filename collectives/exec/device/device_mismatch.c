/* What a device comm reports when one of its kernel blocks found that its
 * call's signature differs from the one a peer's slot carried
 * (prims_device.cuh, struct dev_mismatch): the fields that differ and the
 * two ranks, as the host executor's refusals name them
 * (docs/signature.md); and, when a block timed out, whom it waited on
 * (struct dev_stall). Plain C over the records, built with or without
 * CUDA, so that the host's tests run it. */
#include <stdio.h>
#include <string.h>

#include "../../../transport/base/status.h"
#include "../../core/plan.h"
#include "../../core/signature.h"
#include "dev_sig.h"
#include "device_mismatch.h"

int device_mismatch_found(const struct dev_mismatch *recs, int nrecs) {
  for (int i = 0; i < nrecs; i++)
    if (__atomic_load_n(&recs[i].found, __ATOMIC_ACQUIRE) != 0) return 1;
  return 0;
}

const struct dev_stall *device_stall_first(const struct dev_stall *recs, int nrecs) {
  for (int i = 0; i < nrecs; i++)
    if (__atomic_load_n(&recs[i].found, __ATOMIC_ACQUIRE) != 0) return &recs[i];
  return NULL;
}

int device_stall_describe(char *buf, size_t n, const struct dev_stall *recs, int nrecs) {
  const struct dev_stall *s = device_stall_first(recs, nrecs);
  if (s == NULL) return 0;
  snprintf(buf, n, "rank %d (waiting for %s at step %llu of their connection)", s->peer,
           s->dir == DEV_STALL_SEND ? "a free slot to send to it" : "its data",
           (unsigned long long)s->step);
  return 1;
}

weftResult_t device_mismatch_error(int rank, const struct dev_mismatch *recs, int nrecs) {
  const struct dev_mismatch *m = NULL;
  for (int i = 0; i < nrecs && m == NULL; i++)
    if (__atomic_load_n(&recs[i].found, __ATOMIC_ACQUIRE) != 0) m = &recs[i];
  if (m == NULL)
    return weft_error_set(weftInvalidUsage,
                          "ranks disagree on a call: a device kernel of rank %d found that its "
                          "peer's call differs from its own",
                          rank);
  if (m->kind == DEV_MISMATCH_P2P) {
    if (m->their_step != m->step)
      return weft_error_set(weftInvalidUsage,
                            "point-to-point on device memory: rank %d's receive from rank %d "
                            "(operation %llu of its group) found no chunk of this step on the "
                            "lane: the ranks' sends and receives do not pair up",
                            rank, m->peer, (unsigned long long)m->mine[1]);
    return weft_error_set(weftInvalidUsage,
                          "point-to-point on device memory: sizes differ: rank %d receives %llu "
                          "bytes from rank %d (operation %llu of its group), which sends %llu",
                          rank, (unsigned long long)m->mine[0], m->peer,
                          (unsigned long long)m->mine[1], (unsigned long long)m->theirs[0]);
  }
  struct signature_packed mine_p, theirs_p;
  uint64_t theirs_w[2];
  dev_sig_unkeyed(m->theirs, m->step, theirs_w);
  memcpy(&mine_p, m->mine, sizeof mine_p);
  memcpy(&theirs_p, theirs_w, sizeof theirs_p);
  struct signature mine, theirs;
  signature_unpack(&mine, &mine_p);
  signature_unpack(&theirs, &theirs_p);
  if (m->their_step == m->step && theirs.magic == SIGNATURE_MAGIC && m->peer != rank) {
    const int lower = m->peer < rank;
    const struct signature pair[2] = {lower ? theirs : mine, lower ? mine : theirs};
    const int ranks[2] = {lower ? m->peer : rank, lower ? rank : m->peer};
    if (signature_compare_ranks(pair, ranks, 2, "ranks disagree on a collective") != weftSuccess)
      return weftInvalidUsage;
  }
  /* the peer's slot held no signature of this step (its head is an earlier
   * step's): it is in another call, steps apart after an earlier difference */
  return weft_error_set(weftInvalidUsage,
                        "ranks disagree on a collective: %s: the first slot from rank %d on "
                        "device memory does not hold the signature rank %d expects: it is in "
                        "another call (count, datatype, root or collective differ)",
                        coll_kind_name((enum coll_kind)mine.coll), m->peer, rank);
}
