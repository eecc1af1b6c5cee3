/* All-to-all, gather and scatter: groups of sends and receives, so they share
 * the point-to-point executor's ordering and deadlock freedom. */
#include <stdint.h>
#include <stdio.h>

#include "../../transport/base/status.h"
#include "../core/plan.h"
#include "comm_lifecycle.h"
#include "group.h"

/* Checks what the group's own calls do not: the comm and its state (first,
 * as for every collective: a finalized comm refuses whatever the
 * arguments), the type, the root (rooted: a gather's or a scatter's). */
static weftResult_t sendrecv_coll_check(const char *name, weftComm_t comm, size_t count,
                                        weftDataType_t datatype, int rooted, int root) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  WEFT_TRY(comm_op_begin(comm, 0, name));
  if (weftTypeSize(datatype) == 0)
    return weft_error_set(weftInvalidArgument, "%s: invalid datatype %d", name, (int)datatype);
  if (count > SIZE_MAX / 16 / (size_t)comm->nranks) /* as the collectives' own check */
    return weft_error_set(weftInvalidArgument, "%s: count %zu is too large", name, count);
  if (rooted && (root < 0 || root >= comm->nranks))
    return weft_error_set(weftInvalidArgument, "%s: root %d out of range [0, %d)", name, root,
                          comm->nranks);
  return weftSuccess;
}

/* Checks the root's two buffers of a gather or a scatter: `blocks`, nranks
 * blocks of block_nbytes (a gather's recvbuff, a scatter's sendbuff), and
 * `own`, one block (a gather's sendbuff, a scatter's recvbuff). In place
 * where own is the root's block of blocks, as NCCL and MPI_IN_PLACE mean it:
 * the copy to itself then moves nothing. Any other overlap is refused: the
 * copy to itself, made first, would overwrite blocks that the sends to the
 * peers still read (a scatter), or the receives would write over the input
 * that copy reads (a gather). Other ranks use one buffer only. */
static weftResult_t rooted_overlap_check(const char *name, const struct weftComm *comm,
                                         const char *blocks_name, const void *blocks,
                                         const void *own, size_t block_nbytes) {
  if (block_nbytes == 0 || blocks == NULL || own == NULL) return weftSuccess;
  const uintptr_t b = (uintptr_t)blocks, o = (uintptr_t)own;
  const size_t blocks_nbytes = block_nbytes * (size_t)comm->nranks;
  if (o == b + (size_t)comm->rank * block_nbytes) return weftSuccess;
  if (o < b + blocks_nbytes && b < o + block_nbytes)
    return weft_error_set(weftInvalidArgument,
                          "%s: sendbuff and recvbuff overlap without being in place (in "
                          "place: the root's block of %s, at offset rank * count)",
                          name, blocks_name);
  return weftSuccess;
}

/* A call refused before its group: its mark takes its number, failed (on
 * a live comm), and the text stays the refusal's, the comm's last error too. */
static weftResult_t coll_refused(weftComm_t comm, enum coll_kind coll, const void *sendbuff,
                                 void *recvbuff, size_t count, weftDataType_t datatype, int root,
                                 weftResult_t res) {
  char why[1024];
  snprintf(why, sizeof why, "%s", weft_error_text());
  if (comm_check(comm) == weftSuccess)
    (void)group_coll_mark(comm, coll, sendbuff, recvbuff, count, datatype, root, NULL, res);
  return comm_error_keep(comm, weft_error_set(res, "%s", why));
}

/* Closes the group even when a call inside it failed, keeping the first error. */
static weftResult_t group_close(weftResult_t res) {
  weftResult_t end = weftGroupEnd();
  return res != weftSuccess ? res : end;
}

weftResult_t weftAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  weftResult_t res = sendrecv_coll_check("AlltoAll", comm, count, datatype, 0, -1);
  size_t nbytes = res == weftSuccess ? count * weftTypeSize(datatype) * (size_t)comm->nranks : 0;
  uintptr_t s = (uintptr_t)sendbuff, r = (uintptr_t)recvbuff;
  if (res == weftSuccess && count > 0 && sendbuff != NULL && recvbuff != NULL && s < r + nbytes &&
      r < s + nbytes)
    res = weft_error_set(weftInvalidArgument, "AlltoAll: sendbuff and recvbuff overlap");
  if (res != weftSuccess)
    return coll_refused(comm, COLL_ALLTOALL, sendbuff, recvbuff, count, datatype, -1, res);
  size_t block = count * weftTypeSize(datatype);
  res = weftGroupStart();
  if (res == weftSuccess)
    res = group_coll_mark(comm, COLL_ALLTOALL, sendbuff, recvbuff, count, datatype, -1, stream,
                          weftSuccess);
  for (int p = 0; p < comm->nranks && res == weftSuccess; p++) {
    res = weftSend((const char *)sendbuff + p * block, count, datatype, p, comm, stream);
    if (res == weftSuccess) res = weftRecv((char *)recvbuff + p * block, count, datatype, p, comm, stream);
  }
  return group_close(res);
}

weftResult_t weftGather(const void *sendbuff, void *recvbuff, size_t count,
                        weftDataType_t datatype, int root, weftComm_t comm, weftStream_t stream) {
  weftResult_t res = sendrecv_coll_check("Gather", comm, count, datatype, 1, root);
  if (res == weftSuccess && comm->rank == root)
    res = rooted_overlap_check("Gather", comm, "recvbuff", recvbuff, sendbuff,
                               count * weftTypeSize(datatype));
  if (res != weftSuccess)
    return coll_refused(comm, COLL_GATHER, sendbuff, recvbuff, count, datatype, root, res);
  size_t block = count * weftTypeSize(datatype);
  const int is_root = comm->rank == root;
  res = weftGroupStart();
  if (res == weftSuccess)
    res = group_coll_mark(comm, COLL_GATHER, sendbuff, recvbuff, count, datatype, root, stream,
                          weftSuccess);
  if (res == weftSuccess) res = weftSend(sendbuff, count, datatype, root, comm, stream);
  for (int p = 0; is_root && p < comm->nranks && res == weftSuccess; p++)
    res = weftRecv((char *)recvbuff + p * block, count, datatype, p, comm, stream);
  return group_close(res);
}

weftResult_t weftScatter(const void *sendbuff, void *recvbuff, size_t count,
                         weftDataType_t datatype, int root, weftComm_t comm, weftStream_t stream) {
  weftResult_t res = sendrecv_coll_check("Scatter", comm, count, datatype, 1, root);
  if (res == weftSuccess && comm->rank == root)
    res = rooted_overlap_check("Scatter", comm, "sendbuff", sendbuff, recvbuff,
                               count * weftTypeSize(datatype));
  if (res != weftSuccess)
    return coll_refused(comm, COLL_SCATTER, sendbuff, recvbuff, count, datatype, root, res);
  size_t block = count * weftTypeSize(datatype);
  const int is_root = comm->rank == root;
  res = weftGroupStart();
  if (res == weftSuccess)
    res = group_coll_mark(comm, COLL_SCATTER, sendbuff, recvbuff, count, datatype, root, stream,
                          weftSuccess);
  for (int p = 0; is_root && p < comm->nranks && res == weftSuccess; p++)
    res = weftSend((const char *)sendbuff + p * block, count, datatype, p, comm, stream);
  if (res == weftSuccess) res = weftRecv(recvbuff, count, datatype, root, comm, stream);
  return group_close(res);
}
