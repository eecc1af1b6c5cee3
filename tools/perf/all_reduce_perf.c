/* all_reduce_perf: weft's all-reduce in nccl-tests' format. */
#include "perf_common.h"

static double busbw_factor(int nranks) { return nranks > 1 ? 2.0 * (nranks - 1) / nranks : 0; }

static void counts(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                   size_t *recv_count, size_t *count) {
  (void)nranks;
  *count = *send_count = *recv_count = nbytes / elem_nbytes;
}

static weftResult_t run(const void *sendbuf, void *recvbuf, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream) {
  (void)root;
  return weftAllReduce(sendbuf, recvbuf, count, datatype, op, comm, stream);
}

static void expect(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype,
                   weftRedOp_t op, int root, double *value_out, double *magnitude_out) {
  (void)rank, (void)count, (void)root;
  perf_reduced(i, nranks, datatype, op, value_out, magnitude_out);
}

static const struct perf_coll all_reduce = {
    .name = "all_reduce",
    .uses_op = 1,
    .busbw_factor = busbw_factor,
    .counts = counts,
    .run = run,
    .expect = expect,
};

int main(int argc, char **argv) { return perf_main(argc, argv, &all_reduce); }
