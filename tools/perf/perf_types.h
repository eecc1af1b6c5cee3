/* The perf tools' data by datatype: the inputs every tool sends, their
 * reductions, element access and each type's roundoff. */
#ifndef WEFT_PERF_TYPES_H
#define WEFT_PERF_TYPES_H

#include <stddef.h>

#include "weft.h"

/* The tools' ops: weft's built-in ones, then nccl-tests' "mulsum": a
 * pre-multiply sum (weftRedOpCreatePreMulSum) whose scalar is
 * perf_premul_scalar(rank) on each rank, made for each call. */
#define PERF_OP_MULSUM ((int)weftNumOps)
#define PERF_NUM_OPS (PERF_OP_MULSUM + 1)

/* The scalar rank multiplies its input by under mulsum: 1 on even ranks, 2
 * on odd ones, as nccl-tests chooses it. */
double perf_premul_scalar(int rank);

/* The input every tool sends: a small integer, exact in every datatype.
 * Seed 0 fills the timed calls' buffers; each check round takes a seed of
 * its own, so that its inputs differ from the round before. */
double perf_input(int rank, size_t i, weftDataType_t datatype, int op, unsigned seed);

/* The reduction over all ranks of perf_input(r, i, ..., seed) under op (a
 * weftRedOp_t or PERF_OP_MULSUM), and the sum of the magnitudes that went
 * into it (for the tolerance). */
void perf_reduced(size_t i, int nranks, weftDataType_t datatype, int op, unsigned seed,
                  double *value_out, double *magnitude_out);

/* Element access by datatype (values must be exact small integers to set). */
double perf_value_get(const void *buf, size_t i, weftDataType_t datatype);
void perf_value_set(void *buf, size_t i, weftDataType_t datatype, double value);
/* Unit roundoff of datatype's arithmetic (0 for integers). */
double perf_type_eps(weftDataType_t datatype);

#endif
