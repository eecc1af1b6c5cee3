/* The perf tools' driver: its main, for a collective's tool (perf_coll.h). */
#ifndef WEFT_PERF_COMMON_H
#define WEFT_PERF_COMMON_H

#include <stddef.h>

#include "perf_coll.h"
#include "perf_mem.h"
#include "perf_types.h"
#include "weft.h"

/* Runs the tool; returns its exit status (nccl-tests' numbers, perf_opts.h). */
int perf_main(int argc, char **argv, const struct perf_coll *coll);

#endif
