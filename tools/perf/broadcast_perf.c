/* broadcast_perf: weft's broadcast in nccl-tests' format (-r picks the root). */
#include "perf_common.h"

static double busbw_factor(int nranks) { return nranks > 1 ? 1 : 0; }

static void counts(size_t nbytes, size_t elem_nbytes, int nranks, size_t *send_count,
                   size_t *recv_count, size_t *count) {
  (void)nranks;
  *count = *send_count = *recv_count = nbytes / elem_nbytes;
}

static weftResult_t run(const void *sendbuf, void *recvbuf, size_t count, weftDataType_t datatype,
                        weftRedOp_t op, int root, weftComm_t comm, weftStream_t stream) {
  (void)op;
  return weftBroadcast(sendbuf, recvbuf, count, datatype, root, comm, stream);
}

static void expect(size_t i, int rank, int nranks, size_t count, weftDataType_t datatype,
                   weftRedOp_t op, int root, double *value_out, double *magnitude_out) {
  (void)rank, (void)nranks, (void)count;
  *value_out = perf_input(root, i, datatype, op);
  *magnitude_out = 0;
}

static const struct perf_coll broadcast = {
    .name = "broadcast",
    .uses_root = 1,
    .busbw_factor = busbw_factor,
    .counts = counts,
    .run = run,
    .expect = expect,
};

int main(int argc, char **argv) { return perf_main(argc, argv, &broadcast); }
