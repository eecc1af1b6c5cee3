/* sendrecv_perf: each rank sends to the next rank and receives from the
 * previous one, in one group, in nccl-tests' format. */
#include "perf_common.h"

static double busbw_factor(int nranks) { return nranks > 1 ? 1 : 0; }

static void counts(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                   size_t *recv_count, size_t *count) {
  (void)nranks;
  *count = *send_count = *recv_count = nbytes / elem_nbytes;
}

static weftResult_t run(const void *sendbuf, void *recvbuf, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  int rank, nranks;
  weftCommUserRank(comm, &rank);
  weftCommCount(comm, &nranks);
  weftGroupStart();
  weftResult_t s = weftSend(sendbuf, count, datatype, (rank + 1) % nranks, comm, stream);
  weftResult_t r = weftRecv(recvbuf, count, datatype, (rank + nranks - 1) % nranks, comm, stream);
  weftResult_t e = weftGroupEnd();
  return s != weftSuccess ? s : r != weftSuccess ? r : e;
}

static void expect(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype,
                   weftRedOp_t op, int root, double *value_out, double *magnitude_out) {
  (void)count, (void)root;
  *value_out = perf_input((rank + nranks - 1) % nranks, i, datatype, op);
  *magnitude_out = 0;
}

static const struct perf_coll sendrecv = {
    .name = "sendrecv",
    .no_in_place = 1,
    .busbw_factor = busbw_factor,
    .counts = counts,
    .run = run,
    .expect = expect,
};

int main(int argc, char **argv) { return perf_main(argc, argv, &sendrecv); }
