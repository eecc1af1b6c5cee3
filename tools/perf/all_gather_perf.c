/* all_gather_perf: weft's all-gather in nccl-tests' format. The size column
 * is the gathered buffer: nranks blocks of count elements. */
#include "perf_common.h"

static double busbw_factor(int nranks) { return nranks > 1 ? (double)(nranks - 1) / nranks : 0; }

static void counts(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                   size_t *recv_count, size_t *count) {
  *count = *send_count = nbytes / elem_nbytes / (size_t)nranks;
  *recv_count = *count * (size_t)nranks;
}

static weftResult_t run(const void *sendbuf, void *recvbuf, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream) {
  (void)op, (void)root;
  return weftAllGather(sendbuf, recvbuf, count, datatype, comm, stream);
}

static void expect(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype,
                   weftRedOp_t op, int root, double *value_out, double *magnitude_out) {
  (void)rank, (void)nranks, (void)root;
  *value_out = perf_input((int)(i / count), i % count, datatype, op);
  *magnitude_out = 0;
}

static const struct perf_coll all_gather = {
    .name = "all_gather",
    .busbw_factor = busbw_factor,
    .counts = counts,
    .run = run,
    .expect = expect,
};

int main(int argc, char **argv) { return perf_main(argc, argv, &all_gather); }
