/* All-to-all, gather and scatter: groups of sends and receives, so they share
 * the point-to-point executor's ordering and deadlock freedom. */
#include <stdint.h>

#include "../../transport/base/status.h"
#include "../core/plan.h"

/* Checks what the group's own calls do not: the comm, the type, the root. */
static weftResult_t sendrecv_coll_check(const char *name, weftComm_t comm, size_t count,
                                        weftDataType_t datatype, int root) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  if (weftTypeSize(datatype) == 0)
    return weft_error_set(weftInvalidArgument, "%s: invalid datatype %d", name, (int)datatype);
  if (count > SIZE_MAX / 16 / (size_t)comm->nranks) /* as the collectives' own check */
    return weft_error_set(weftInvalidArgument, "%s: count %zu is too large", name, count);
  if (root < -1 || root >= comm->nranks)
    return weft_error_set(weftInvalidArgument, "%s: root %d out of range [0, %d)", name, root,
                          comm->nranks);
  return weftSuccess;
}

/* Closes the group even when a call inside it failed, keeping the first error. */
static weftResult_t group_close(weftResult_t res) {
  weftResult_t end = weftGroupEnd();
  return res != weftSuccess ? res : end;
}

weftResult_t weftAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          weftDataType_t datatype, weftComm_t comm, weftStream_t stream) {
  WEFT_TRY(sendrecv_coll_check("AlltoAll", comm, count, datatype, -1));
  size_t nbytes = count * weftTypeSize(datatype) * (size_t)comm->nranks;
  uintptr_t s = (uintptr_t)sendbuff, r = (uintptr_t)recvbuff;
  if (count > 0 && sendbuff != NULL && recvbuff != NULL && s < r + nbytes && r < s + nbytes)
    return weft_error_set(weftInvalidArgument, "AlltoAll: sendbuff and recvbuff overlap");
  size_t block = count * weftTypeSize(datatype);
  weftResult_t res = weftGroupStart();
  for (int p = 0; p < comm->nranks && res == weftSuccess; p++) {
    res = weftSend((const char *)sendbuff + p * block, count, datatype, p, comm, stream);
    if (res == weftSuccess) res = weftRecv((char *)recvbuff + p * block, count, datatype, p, comm, stream);
  }
  return group_close(res);
}

weftResult_t weftGather(const void *sendbuff, void *recvbuff, size_t count,
                        weftDataType_t datatype, int root, weftComm_t comm, weftStream_t stream) {
  WEFT_TRY(sendrecv_coll_check("Gather", comm, count, datatype, root < 0 ? -2 : root));
  size_t block = count * weftTypeSize(datatype);
  weftResult_t res = weftGroupStart();
  if (res == weftSuccess) res = weftSend(sendbuff, count, datatype, root, comm, stream);
  for (int p = 0; comm->rank == root && p < comm->nranks && res == weftSuccess; p++)
    res = weftRecv((char *)recvbuff + p * block, count, datatype, p, comm, stream);
  return group_close(res);
}

weftResult_t weftScatter(const void *sendbuff, void *recvbuff, size_t count,
                         weftDataType_t datatype, int root, weftComm_t comm, weftStream_t stream) {
  WEFT_TRY(sendrecv_coll_check("Scatter", comm, count, datatype, root < 0 ? -2 : root));
  size_t block = count * weftTypeSize(datatype);
  weftResult_t res = weftGroupStart();
  for (int p = 0; comm->rank == root && p < comm->nranks && res == weftSuccess; p++)
    res = weftSend((const char *)sendbuff + p * block, count, datatype, p, comm, stream);
  if (res == weftSuccess) res = weftRecv(recvbuff, count, datatype, root, comm, stream);
  return group_close(res);
}
