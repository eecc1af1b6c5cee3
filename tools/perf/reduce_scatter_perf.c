/* reduce_scatter_perf: weft's reduce-scatter in nccl-tests' format. The size
 * column is the input buffer: nranks blocks of count elements. */
#include "perf_common.h"

static double busbw_factor(int nranks) { return nranks > 1 ? (double)(nranks - 1) / nranks : 0; }

static void counts(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                   size_t *recv_count, size_t *count) {
  *count = *recv_count = nbytes / elem_nbytes / (size_t)nranks;
  *send_count = *count * (size_t)nranks;
}

static weftResult_t run(const void *sendbuf, void *recvbuf, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream) {
  (void)root;
  return weftReduceScatter(sendbuf, recvbuf, count, datatype, op, comm, stream);
}

static void expect(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype,
                   weftRedOp_t op, int root, double *value_out, double *magnitude_out) {
  (void)root;
  perf_reduced((size_t)rank * count + i, nranks, datatype, op, value_out, magnitude_out);
}

static const struct perf_coll reduce_scatter = {
    .name = "reduce_scatter",
    .uses_op = 1,
    .busbw_factor = busbw_factor,
    .counts = counts,
    .run = run,
    .expect = expect,
};

int main(int argc, char **argv) { return perf_main(argc, argv, &reduce_scatter); }
