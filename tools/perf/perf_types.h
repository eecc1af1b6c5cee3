/* The perf tools' data by datatype: the inputs every tool sends, their
 * reductions, element access and each type's roundoff. */
#ifndef WEFT_PERF_TYPES_H
#define WEFT_PERF_TYPES_H

#include <stddef.h>

#include "weft.h"

/* The input every tool sends: a small integer, exact in every datatype. */
double perf_input(int rank, size_t i, weftDataType_t datatype, weftRedOp_t op);

/* The reduction over all ranks of perf_input(r, i), and the sum of the
 * magnitudes that went into it (for the tolerance). */
void perf_reduced(size_t i, int nranks, weftDataType_t datatype, weftRedOp_t op,
                  double *value_out, double *magnitude_out);

/* Element access by datatype (values must be exact small integers to set). */
double perf_value_get(const void *buf, size_t i, weftDataType_t datatype);
void perf_value_set(void *buf, size_t i, weftDataType_t datatype, double value);
/* Unit roundoff of datatype's arithmetic (0 for integers). */
double perf_type_eps(weftDataType_t datatype);

#endif
