/* The machine's bound for a collective, measured when a perf tool starts:
 * the least time any implementation could take for a row of its table.
 *
 *   small sizes: one cache-line round trip between the cores of ranks 0 and
 *                1 (a ping-pong on one shared line);
 *   large sizes: the bytes the collective must read and write in memory, at
 *                the read + write rate of a copy that every rank runs at once.
 *
 * A row's bound is the larger of the two; docs/perf.md gives the bytes per
 * collective. */
#ifndef WEFT_PERF_BOUND_H
#define WEFT_PERF_BOUND_H

#include <stddef.h>

#include "weft.h"

struct perf_bound {
  int have_round_trip, have_copy;
  char why[160];       /* why a figure is missing, when one is */
  double round_trip_us; /* median over batches of ping-pongs */
  int cpus[2];          /* the CPUs ranks 0 and 1 ran the ping-pong on */
  double copy_rw_GBps;  /* bytes read + written per second, all ranks copying */
  size_t copy_nbytes;   /* each rank's copy */
  double measure_s;     /* how long measuring took */
};

/* Measures both figures; every rank of comm calls it. Does not fail: a
 * figure that cannot be measured (ranks on one CPU, ranks on other hosts, no
 * shared memory) is left out, with the reason in b->why. Returns weftSuccess,
 * or the error of a collective that failed on the way. */
weftResult_t perf_bound_measure(weftComm_t comm, struct perf_bound *b);

/* The bound in microseconds for a collective that must read and write
 * traffic_nbytes in memory, all ranks together; NAN when neither figure was
 * measured. *by_copy_out says which figure set it. */
double perf_bound_us(const struct perf_bound *b, double traffic_nbytes, int *by_copy_out);

#endif
