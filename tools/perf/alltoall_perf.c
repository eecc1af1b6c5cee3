/* alltoall_perf: weft's all-to-all in nccl-tests' format. The size column is
 * one rank's whole buffer: nranks blocks of count elements. */
#include "perf_common.h"

static double busbw_factor(int nranks) { return nranks > 1 ? (double)(nranks - 1) / nranks : 0; }

static void counts(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                   size_t *recv_count, size_t *count) {
  *count = nbytes / elem_nbytes / (size_t)nranks;
  *send_count = *recv_count = *count * (size_t)nranks;
}

static weftResult_t run(const void *sendbuf, void *recvbuf, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  return weftAlltoAll(sendbuf, recvbuf, count, datatype, comm, stream);
}

static void expect(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype,
                   weftRedOp_t op, int root, double *value_out, double *magnitude_out) {
  (void)nranks, (void)root;
  int from = (int)(i / count);
  *value_out = perf_input(from, (size_t)rank * count + i % count, datatype, op);
  *magnitude_out = 0;
}

static const struct perf_coll alltoall = {
    .name = "alltoall",
    .no_in_place = 1,
    .busbw_factor = busbw_factor,
    .counts = counts,
    .run = run,
    .expect = expect,
};

int main(int argc, char **argv) { return perf_main(argc, argv, &alltoall); }
