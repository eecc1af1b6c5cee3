/* The perf tools' flags: nccl-tests' flags with their value syntax, and
 * weft's own (-M host|cuda, -P, -B, --json). */
#ifndef WEFT_PERF_OPTS_H
#define WEFT_PERF_OPTS_H

#include <stddef.h>

#include "perf_mem.h"
#include "perf_types.h"
#include "weft.h"

struct perf_coll;

/* -z: when the tool waits for an operation, as nccl-tests numbers them */
enum perf_blocking {
  PERF_BLOCK_NONE = 0,    /* queued on a host stream, waited for after the timed loop */
  PERF_BLOCK_BARRIER = 1, /* each operation waited for, then a barrier of all ranks */
  PERF_BLOCK_WAIT = 2,    /* each operation waited for (weft's default) */
  PERF_BLOCK_OUTER = 3,   /* waited for after each -n iteration, then a barrier not timed */
};

/* -R: buffer registration */
enum perf_register { PERF_REG_NONE = 0, PERF_REG_LOCAL = 1, PERF_REG_SYMMETRIC = 2 };

struct perf_opts {
  size_t min_nbytes, max_nbytes, step_nbytes;
  double step_factor;
  int iters, warmup, agg_iters;
  int check;      /* -c: check rounds per row, 0 for none */
  int cycles;     /* -N: sweeps of each datatype, op and root; 0 without end */
  int average;    /* -a: 0 rank 0, 1 mean, 2 min, 3 max */
  int root;       /* -r: a rank, or -1 for every rank in turn */
  int timeout_s;  /* -T: 0 for the library's own */
  int blocking;   /* -z: enum perf_blocking */
  int stream_null; /* -y 1: every operation on the NULL stream, -z 0 too */
  int graph_iters; /* -G: accepted; host operations have no graphs */
  int cputime;    /* -C 1: the time columns are the host's time to issue the calls */
  int timestamps; /* -S 1: a timestamp column after the in-place side */
  int per_iter;   /* -I 1: each side's per-iteration min, max, p99 and spread */
  int per_iter_skip; /* -K: leading iterations left out of -I's figures */
  int unalign;    /* -u: buffers moved by this many elements off their alignment */
  int parallel_init; /* -p: accepted; each rank is its own process */
  int local_register; /* -R: enum perf_register */
  int cta_policy; /* -x: accepted; -1 when not given */
  int device_impl, device_ctas; /* -D, -V */
  int memory_report; /* -M 0/1: the footer's memory line */
  int progress;   /* -P: a progress line per row on stderr */
  int bound;      /* -B: measure the machine's bound at start-up and print it */
  enum perf_mem_kind mem_kind; /* -M host|cuda */
  const char *json_path; /* -J: NULL, or a name that ends .json */
  const char *json_ignored; /* -J's name when it does not end .json */
  int ntypes, nops;
  weftDataType_t types[weftNumTypes];
  int ops[PERF_NUM_OPS]; /* weftRedOp_t values, or PERF_OP_MULSUM */
};

/* Parses argv into o. Returns 0 to run, or 1 with *exit_out the status to
 * leave with: 0 after -h (the usage printed), 2 for a refused flag or value,
 * 5 for a device implementation (-D) these tools do not have (the reason
 * printed). Values that nccl-tests adjusts (-I, -K, -z 3 with -G) are
 * adjusted with its note on stderr. */
int perf_opts_parse(int argc, char **argv, const struct perf_coll *coll, struct perf_opts *o,
                    int *exit_out);

/* NCCL_TESTS_SPLIT_MASK (hex: color = rank & mask) or NCCL_TESTS_SPLIT
 * ("AND n", "OR n", "MOD n", "DIV n", or & | % / for the words, any case;
 * n as C writes it, or 0b and binary digits), as nccl-tests reads them: the
 * ranks of one color run the collective together, a group of their own. */
struct perf_split {
  char how; /* '&', '|', '%' or '/'; 0: one group of every rank */
  unsigned long operand;
};

/* Reads the variables; -1 (the reason on stderr) for a value that is not
 * one of these, or MOD or DIV by 0, where nccl-tests would run one group
 * (or divide by 0). */
int perf_split_parse(struct perf_split *split);

/* The color of rank (its rank among all the job's); -1 when negative. */
int perf_split_color(const struct perf_split *split, int rank);

/* The size after nbytes in a sweep; 0 past SIZE_MAX. */
size_t perf_sweep_next(const struct perf_opts *o, size_t nbytes);

/* Rows of one sweep of every datatype and op (roots and cycles aside). */
long long perf_sweep_rows(const struct perf_opts *o);

const char *perf_type_name(weftDataType_t t);
const char *perf_op_name(int op);

#endif
