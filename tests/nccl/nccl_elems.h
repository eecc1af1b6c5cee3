/* What nccl_test.c's checks compute with (nccl_elems.c): elements of every
 * datatype as doubles, each rank's inputs, the expected reductions, poisoned
 * buffers with a guard after the output, and the test's ops. */
#ifndef WEFT_TESTS_NCCL_ELEMS_H
#define WEFT_TESTS_NCCL_ELEMS_H

#include <stddef.h>

#include "nccl_check.h"

extern const char *const type_names[ncclNumTypes];
extern const size_t type_sizes[ncclNumTypes];
int type_is_float(ncclDataType_t t);
int type_is_unsigned(ncclDataType_t t);
void elem_set(void *buf, ncclDataType_t t, size_t i, double v);
double elem_get(const void *buf, ncclDataType_t t, size_t i);

/* The built-in ops, then PreMulSum with its scalar on the host and on the
 * device side (ncclScalarDevice: here host memory, read when the op runs). */
enum { OP_PREMUL_HOST = ncclNumOps, OP_PREMUL_DEVICE, NUM_TEST_OPS };
extern const char *const op_names[NUM_TEST_OPS];
#define PREMUL_SCALAR 2

/* Rank r's input element i for op, and the reduction over g_nranks ranks;
 * whether got is within the datatype's rounding of want. */
double input_value(int r, size_t i, ncclDataType_t t, int op, unsigned salt);
double expected_reduce(size_t i, ncclDataType_t t, int op, unsigned salt);
int close_enough(double got, double want, ncclDataType_t t);

#define POISON 0xa5
#define GUARD 16 /* elements after every output that must stay poisoned */

/* count elements and the guard, poisoned; exits when out of memory. */
void *buf_alloc(size_t count, ncclDataType_t t);
void check_guard(const void *buf, size_t count, ncclDataType_t t, const char *what);

/* op as an ncclRedOp_t: a built-in one, or a PreMulSum made on comm whose
 * scalar buffer is left in *scalar_p (to free after ncclRedOpDestroy). */
ncclRedOp_t make_op(int op, ncclDataType_t t, ncclComm_t comm, void **scalar_p);

#endif
