// Reference results for collective tests: inputs drawn per (seed, rank), a
// double-precision (or exact wrapping-integer) reference, and tolerances.
#ifndef WEFT_TESTS_COLL_REF_H
#define WEFT_TESTS_COLL_REF_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harness.h"
#include "weft.h"

namespace weft_test {

const char *type_name(weftDataType_t t);
const char *op_name(weftRedOp_t op);
bool type_is_float(weftDataType_t t);

// Rank r's element i of a seeded draw: a float of varied magnitude (2^-13
// to 2^11), so that the order of a sum shows in its bits.
float varied_value(uint64_t seed, int rank, size_t i);

// Random inputs for one rank, as raw bytes of count elements.
std::vector<uint8_t> make_input(weftDataType_t t, weftRedOp_t op, size_t count, uint64_t seed,
                                int rank);

// Element i of a raw buffer as double (integers converted exactly up to 2^53).
double value_at(weftDataType_t t, const void *buf, size_t i);

// Checks out[0..count) against the reduction of inputs (one per rank). On a
// mismatch returns false and describes the first bad element in why.
bool check_reduction(weftDataType_t t, weftRedOp_t op,
                     const std::vector<std::vector<uint8_t>> &inputs, const void *out,
                     size_t count, std::string *why);

// One all-reduce on comm over fresh random inputs (every rank's drawn from
// seed), into a poisoned output with guard bytes: checks the result, the
// guard and an untouched sendbuff. Returns 0 or a failure code (rank_fail).
int check_allreduce(const RankCtx &ctx, weftComm_t comm, weftDataType_t t, weftRedOp_t op,
                    size_t count, bool in_place, uint64_t seed);

// One float32 sum all-reduce over every comm of comms[0..n) (ranks of one
// process, as from weftCommInitAll) as one group, out of place into poisoned
// outputs with guard bytes: checks every rank's result and guard. Returns
// false and says why on the first failure.
bool group_allreduce_check(weftComm_t *comms, int n, size_t count, uint64_t seed,
                           std::string *why);

// weftMemAllocHost gives buffers from this size a shared mapping peers can map.
constexpr size_t kMemSharedMinNbytes = 64 << 10;

enum Coll { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce };
const char *coll_name(Coll c);

// One all-reduce, all-gather, reduce-scatter, broadcast or reduce (rooted at
// root) with fresh inputs, its buffers 200 bytes into poisoned allocations
// (not cache-line aligned) from weftMemAllocHost (weft_send, weft_recv) or
// malloc. Checks the result, the bytes around the output and an untouched
// input. A broadcast's non-root out of place passes no input (NULL), a
// reduce's no output; in place, a reduce's non-root buffer stays as it was.
// Returns 0 or a failure code (rank_fail).
int check_coll(const RankCtx &ctx, weftComm_t comm, Coll c, weftDataType_t t, weftRedOp_t op,
               size_t count, bool in_place, bool weft_send, bool weft_recv, uint64_t seed,
               int root = 0);

// Every collective (all-reduce, all-gather, reduce-scatter, broadcast, reduce,
// all-to-all) on comm for a few sizes and datatypes, against references.
// Returns 0 or a failure code (rank_fail).
int check_every_collective(const RankCtx &ctx, weftComm_t comm, uint64_t seed);

}  // namespace weft_test

#endif
