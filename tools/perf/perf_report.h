/* What the perf tools print (rank 0): nccl-tests' header, table rows and
 * footer on stdout, and its JSON file (-J), with weft's additions (notes on
 * ignored flags, the bound's columns and keys). */
#ifndef WEFT_PERF_REPORT_H
#define WEFT_PERF_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "perf_bound.h"
#include "perf_opts.h"

/* The nccl-tests release whose flags, output and JSON (version 3) the tools
 * follow. */
#define PERF_NCCL_TESTS_VERSION "2.19.6"

/* One rank's line under "# Using devices". */
struct perf_rank_info {
  int pid, device; /* device: -1 for host memory */
  int group;       /* the color of its group (NCCL_TESTS_SPLIT), 0 unsplit */
  char host[64];   /* the host name up to its first dot, as nccl-tests prints it */
  char where[48];  /* in brackets: a device's PCI address, or the rank's CPUs */
  char name[96];   /* a device's name, or "host memory" */
};

/* -I: one side's iteration times, as nccl-tests summarizes them. */
struct perf_iter_stats {
  double min, max, avg, p50, p95, p99, stdev, cv_pct; /* times in seconds */
};

struct perf_result {
  double time_us;   /* the time column: per operation, or the host's (-C 1) */
  double algbw, busbw;
  long long wrong;  /* wrong elements, all ranks together (with -c) */
  int checked;      /* wrong counts: -c above 0, and a side the collective checks */
  int saw_wrong;    /* this rank found a wrong element (the footer counts these) */
  double bound_us;  /* the least time the machine allows; NAN when not measured */
  double bound_pct; /* bound_us / time_us, in percent */
  int bound_by_copy; /* the memory traffic set the bound, not the round trip */
  /* -I: each iteration's time, the largest over the ranks (iters of them),
   * and every rank's own (nranks x iters, rank 0 only); NULL without -I */
  double *iter_s, *rank_iter_s;
  struct perf_iter_stats stats;
};

/* One table row. */
struct perf_row {
  size_t nbytes, count;
  weftDataType_t type;
  int op, root; /* root -1 where the collective has none */
  struct perf_result oop, ip;
};

/* -M 1: memory taken at each stage, the largest over the ranks. */
struct perf_mem_usage {
  int64_t init_nbytes, buffer_nbytes, coll_nbytes;
};

struct perf_report {
  const struct perf_opts *o;
  const struct perf_coll *coll;
  const char *prog; /* the tool's name, without its folder */
  int nranks;
  FILE *json;       /* -J's file; NULL when none */
  int json_depth, json_after_key;
  unsigned char json_more[16]; /* a value was written at this depth */
  char json_closer[16];        /* what closes this depth: '}' or ']' */
};

/* Opens -J's file as nccl-tests does: never over an existing file (FILE,
 * then FILE.0, FILE.1, ...), saying which one on stdout; writes the run's
 * start (its arguments, the WEFT_, NCCL_ and UCX_ variables). Rank 0 only. */
void perf_report_open(struct perf_report *r, int argc, char **argv);

/* nccl-tests' header: version, settings, one line per rank; then weft's notes
 * and the bound (may be NULL); then the table's column heads. */
void perf_report_header(struct perf_report *r, const struct perf_rank_info *ranks,
                        const struct perf_bound *bound);

void perf_report_row(struct perf_report *r, const struct perf_row *row);

/* The footer: nccl-tests' count of sides with wrong values (errors: each
 * rank's sides where it found one, summed over the ranks), the
 * average busbw with its verdict against min_busbw (< 0: none), the memory
 * line when mem is not NULL, and the closing lines. */
void perf_report_footer(struct perf_report *r, long long errors, double avg_busbw,
                        double min_busbw, const struct perf_mem_usage *mem);

/* Ends the JSON file, whatever was left open, with weft's own keys (the
 * bound, whether the sweep completed); 0, or -1 when it could not be
 * written. */
int perf_report_close(struct perf_report *r, const struct perf_bound *bound, int complete);

/* value in width characters or fewer, as nccl-tests narrows its columns:
 * two decimals, then one, then none, then an exponent. buf holds width + 1. */
void perf_format_float(double value, int width, char *buf);

/* The summary of n iteration times (seconds). */
void perf_iter_stats(const double *times_s, int n, struct perf_iter_stats *out);

/* This host's name up to its first dot. */
void perf_hostname(char *buf, size_t len);

#endif
