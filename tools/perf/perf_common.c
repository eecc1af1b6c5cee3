/* The perf tools' driver: parse nccl-tests' flags, sweep sizes, time
 * out-of-place and in-place runs, check results, print nccl-tests' table. */
#include "perf_common.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf_bound.h"

struct perf_opts {
  size_t min_nbytes, max_nbytes, step_nbytes;
  double step_factor;
  int iters, warmup, agg_iters, check, average, root, timeout_s;
  int blocking, graph_iters, progress;
  int bound; /* measure the machine's bound at start-up and print it */
  enum perf_mem_kind mem_kind;
  const char *json_path;
  int ntypes, nops;
  weftDataType_t types[weftNumTypes];
  weftRedOp_t ops[weftNumOps];
};

static const char *type_names[weftNumTypes] = {"int8", "uint8", "int32", "uint32",
                                               "int64", "uint64", "half", "float",
                                               "double", "bfloat16", "f8e4m3", "f8e5m2"};
static const char *op_names[weftNumOps] = {"sum", "prod", "max", "min", "avg"};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A size: a number with an optional K, M or G (and B); refused when it is
 * not a finite number of bytes below 2^62 (nan, inf, 1e30 read as 0 bytes). */
static int parse_size(const char *s, size_t *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || !(v >= 0)) return -1;
  switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || !(v < 0x1p62)) return -1;
  *out = (size_t)v;
  return 0;
}

/* A whole number in [lo, hi] (a garbage value such as `-c yes` was read as 0). */
static int parse_int(const char *s, long lo, long hi, int *out) {
  char *end;
  errno = 0;
  const long v = strtol(s, &end, 0);
  if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

/* A step factor: a finite number, at least 1. */
static int parse_factor(const char *s, double *out) {
  char *end;
  const double v = strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= 1) || !(v < 0x1p62)) return -1;
  *out = v;
  return 0;
}

/* The size after nbytes in a sweep: times the factor where it is above 1
 * (-f wins over -i, in either order, as in nccl-tests), rounded to the
 * nearest byte and at least one more, so that a small factor still moves
 * (-f 1.1 from 8 B had stopped there); otherwise plus the step. 0 past
 * SIZE_MAX. */
static size_t sweep_next(const struct perf_opts *o, size_t nbytes) {
  if (o->step_factor > 1) {
    const double next = round((double)nbytes * o->step_factor);
    if (!(next < 0x1p63)) return 0;
    return (size_t)next > nbytes ? (size_t)next : nbytes + 1;
  }
  return nbytes + o->step_nbytes > nbytes ? nbytes + o->step_nbytes : 0;
}

/* A sweep's rows at most (every datatype and op): a table of more is refused
 * (-b 0 -e 8G -i 1 would count 8.6e9 sizes). */
#define SWEEP_MAX_ROWS 1000000

/* The rows of one sweep, for the progress line and the JSON file; past
 * SWEEP_MAX_ROWS, SWEEP_MAX_ROWS + 1. */
static long long sweep_rows(const struct perf_opts *o) {
  long long rows = 0;
  for (size_t nbytes = o->min_nbytes; nbytes <= o->max_nbytes;) {
    if (++rows * o->ntypes * o->nops > SWEEP_MAX_ROWS) return SWEEP_MAX_ROWS + 1;
    nbytes = sweep_next(o, nbytes);
    if (nbytes == 0) break; /* past SIZE_MAX */
  }
  return rows * o->ntypes * o->nops;
}

static int parse_type(const char *s, struct perf_opts *o) {
  static const struct { const char *alias; weftDataType_t t; } aliases[] = {
      {"char", weftInt8}, {"int", weftInt32}, {"float16", weftFloat16}, {"fp16", weftFloat16},
      {"float32", weftFloat32}, {"float64", weftFloat64}, {"bf16", weftBfloat16},
      {"fp8_e4m3", weftFloat8e4m3}, {"fp8_e5m2", weftFloat8e5m2}};
  if (strcmp(s, "all") == 0) {
    for (int t = 0; t < weftNumTypes; t++) o->types[t] = (weftDataType_t)t;
    o->ntypes = weftNumTypes;
    return 0;
  }
  for (int t = 0; t < weftNumTypes; t++)
    if (strcmp(s, type_names[t]) == 0) { o->types[0] = (weftDataType_t)t; o->ntypes = 1; return 0; }
  for (size_t a = 0; a < sizeof aliases / sizeof aliases[0]; a++)
    if (strcmp(s, aliases[a].alias) == 0) { o->types[0] = aliases[a].t; o->ntypes = 1; return 0; }
  return -1;
}

static int parse_op(const char *s, struct perf_opts *o) {
  if (strcmp(s, "all") == 0) {
    for (int p = 0; p < weftNumOps; p++) o->ops[p] = (weftRedOp_t)p;
    o->nops = weftNumOps;
    return 0;
  }
  for (int p = 0; p < weftNumOps; p++)
    if (strcmp(s, op_names[p]) == 0) { o->ops[0] = (weftRedOp_t)p; o->nops = 1; return 0; }
  return -1;
}

static void usage(const char *prog, const struct perf_coll *coll) {
  printf("usage: %s [options]   (%s over weft; start ranks with weftrun -n N)\n"
         "  -b, --minbytes SIZE     smallest size (default 32M); K, M, G suffixes\n"
         "  -e, --maxbytes SIZE     largest size (default 32M)\n"
         "  -i, --stepbytes SIZE    linear step between sizes\n"
         "  -f, --stepfactor F      multiplicative step between sizes\n"
         "  -n, --iters N           timed iterations per size (default 20)\n"
         "  -w, --warmup_iters N    untimed iterations first (default 5)\n"
         "  -m, --agg_iters N       operations per timed iteration (default 1)\n"
         "  -c, --check 0/1         check results (default 1)\n"
         "  -d, --datatype T        int8 uint8 int32 uint32 int64 uint64 half float double\n"
         "                          bfloat16 f8e4m3 f8e5m2, or all (default float)\n"
         "  -o, --op OP             sum prod max min avg, or all (default sum)\n"
         "  -r, --root R            root rank of rooted collectives (default 0)\n"
         "  -a, --average 0-3       time across ranks: 0 rank 0, 1 avg, 2 min, 3 max (default 1)\n"
         "  -T, --timeout S         seconds before a stuck operation is an error\n"
         "  -z, --blocking 0/1      wait for each operation before the next (host\n"
         "                          operations on the NULL stream always do; default 1)\n"
         "  -G, --cudagraph N       CUDA graph launches per iteration (ignored for host\n"
         "                          memory, with a note)\n"
         "  -M, --memory KIND       buffers in host or cuda memory (default host)\n"
         "  -J, --json FILE         also write the results as JSON to FILE (rank 0)\n"
         "  -P, --progress 0/1      progress line on stderr (default: 1 when stderr is a\n"
         "                          terminal)\n"
         "  -B, --bound 0/1         measure the machine's bound at start-up (a cache-line\n"
         "                          round trip, a copy; under 0.5 s) and print the time\n"
         "                          it allows and the %% reached, in four columns after\n"
         "                          nccl-tests' (default 0: nccl-tests' columns alone)\n"
         "  -t, --nthreads 1        nccl-tests' threads per process, and\n"
         "  -g, --ngpus 1           GPUs per thread: one rank per process here (start\n"
         "                          N ranks with weftrun -n N); 1 is taken, more refused\n"
         "  -h, --help\n",
         prog, coll->name);
}

static int opts_parse(int argc, char **argv, const struct perf_coll *coll, struct perf_opts *o) {
  static const struct option longopts[] = {
      {"minbytes", required_argument, 0, 'b'}, {"maxbytes", required_argument, 0, 'e'},
      {"stepbytes", required_argument, 0, 'i'}, {"stepfactor", required_argument, 0, 'f'},
      {"iters", required_argument, 0, 'n'}, {"warmup_iters", required_argument, 0, 'w'},
      {"agg_iters", required_argument, 0, 'm'}, {"check", required_argument, 0, 'c'},
      {"datatype", required_argument, 0, 'd'}, {"op", required_argument, 0, 'o'},
      {"root", required_argument, 0, 'r'}, {"average", required_argument, 0, 'a'},
      {"timeout", required_argument, 0, 'T'}, {"blocking", required_argument, 0, 'z'},
      {"cudagraph", required_argument, 0, 'G'}, {"memory", required_argument, 0, 'M'},
      {"json", required_argument, 0, 'J'}, {"progress", required_argument, 0, 'P'},
      {"bound", required_argument, 0, 'B'}, {"nthreads", required_argument, 0, 't'},
      {"ngpus", required_argument, 0, 'g'},
      {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  *o = (struct perf_opts){.min_nbytes = 32 << 20, .max_nbytes = 32 << 20, .step_nbytes = 1 << 20,
                          .step_factor = 1, .iters = 20, .warmup = 5, .agg_iters = 1,
                          .check = 1, .average = 1, .root = 0, .timeout_s = 0,
                          .blocking = 1, .graph_iters = 0, .progress = isatty(STDERR_FILENO),
                          .mem_kind = PERF_MEM_HOST, .json_path = NULL, .bound = 0};
  o->types[0] = weftFloat32;
  o->ntypes = 1;
  o->ops[0] = weftSum;
  o->nops = 1;
  const char *shortopts = "b:e:i:f:n:w:m:c:d:o:r:a:T:z:G:M:J:P:B:t:g:h";
  int c;
  while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
    int bad = 0;
    switch (c) {
      case 'b': bad = parse_size(optarg, &o->min_nbytes); break;
      case 'e': bad = parse_size(optarg, &o->max_nbytes); break;
      case 'i': bad = parse_size(optarg, &o->step_nbytes); break;
      case 'f': bad = parse_factor(optarg, &o->step_factor); break;
      case 'n': bad = parse_int(optarg, 1, INT_MAX, &o->iters); break;
      case 'w': bad = parse_int(optarg, 0, INT_MAX, &o->warmup); break;
      case 'm': bad = parse_int(optarg, 1, INT_MAX, &o->agg_iters); break;
      case 'c': /* nccl-tests' check iteration count: any non-zero value checks */
        bad = parse_int(optarg, 0, INT_MAX, &o->check);
        o->check = o->check != 0;
        break;
      case 'd': bad = parse_type(optarg, o); break;
      case 'o': bad = parse_op(optarg, o); break;
      case 'r': bad = parse_int(optarg, 0, INT_MAX, &o->root); break;
      case 'a': bad = parse_int(optarg, 0, 3, &o->average); break;
      case 'T': bad = parse_int(optarg, 0, INT_MAX / 1000, &o->timeout_s); break;
      case 'z': bad = parse_int(optarg, 0, 1, &o->blocking); break;
      case 'G': bad = parse_int(optarg, 0, INT_MAX, &o->graph_iters); break;
      case 'M': bad = perf_mem_parse(optarg, &o->mem_kind); break;
      case 'J': o->json_path = optarg; break;
      case 'P': bad = parse_int(optarg, 0, 1, &o->progress); break;
      case 'B': bad = parse_int(optarg, 0, 1, &o->bound); break;
      case 't':
      case 'g': { /* nccl-tests' threads and GPUs of one process: here a process is a rank */
        int n = 0;
        bad = parse_int(optarg, 1, INT_MAX, &n);
        if (!bad && n != 1) {
          fprintf(stderr,
                  "%s: -%c %d: weft's perf tools run one rank per process; start %d ranks "
                  "with weftrun -n %d (and -%c 1, the default)\n",
                  argv[0], c, n, n, n, c);
          return -1;
        }
        break;
      }
      case 'h': usage(argv[0], coll); exit(0);
      default: usage(argv[0], coll); return -1;
    }
    if (bad) {
      fprintf(stderr, "%s: bad value '%s' for -%c\n", argv[0], optarg, c);
      return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
    return -1;
  }
  if (o->step_factor <= 1 && o->step_nbytes == 0 && o->min_nbytes < o->max_nbytes) {
    fprintf(stderr, "%s: a step of 0 bytes (-i 0) without a factor (-f) never reaches -e\n",
            argv[0]);
    return -1;
  }
  if (o->min_nbytes <= o->max_nbytes && sweep_rows(o) > SWEEP_MAX_ROWS) {
    fprintf(stderr, "%s: more than %d rows from -b %zu to -e %zu (with -i, -f, -d and -o)\n",
            argv[0], SWEEP_MAX_ROWS, o->min_nbytes, o->max_nbytes);
    return -1;
  }
  if (o->min_nbytes > o->max_nbytes) {
    fprintf(stderr, "%s: invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu\n", argv[0],
            o->min_nbytes, o->max_nbytes);
    return -1;
  }
  if (!coll->uses_op) o->nops = 1;
  return 0;
}

/* Fills sendbuf with this rank's inputs. */
static void fill_inputs(void *buf, size_t count, int rank, weftDataType_t t, weftRedOp_t op) {
  for (size_t i = 0; i < count; i++) perf_value_set(buf, i, t, perf_input(rank, i, t, op));
}

static long long count_wrong(const struct perf_coll *coll, const void *recvbuf, size_t recv_count,
                             size_t count, int rank, int nranks, weftDataType_t t,
                             weftRedOp_t op, int root) {
  long long wrong = 0;
  double eps = perf_type_eps(t);
  for (size_t i = 0; i < recv_count; i++) {
    double want, magnitude;
    coll->expect(i, rank, nranks, count, t, op, root, &want, &magnitude);
    if (isnan(want)) continue; /* nothing defined here on this rank */
    double got = perf_value_get(recvbuf, i, t);
    double tol = eps * (nranks + 1) * magnitude;
    if (!(fabs(got - want) <= tol)) wrong++;
  }
  return wrong;
}

/* Combines a per-rank double across ranks: 0 rank 0, 1 mean, 2 min, 3 max. */
static double across_ranks(weftComm_t comm, double v, int how, int nranks) {
  double out = v;
  weftRedOp_t op = how == 2 ? weftMin : how == 3 ? weftMax : weftSum;
  if (weftAllReduce(&v, &out, 1, weftFloat64, op, comm, NULL) != weftSuccess) return NAN;
  return how == 1 ? out / nranks : how == 0 ? v : out;
}

struct perf_result {
  double time_us, algbw, busbw;
  long long wrong;
  double bound_us;  /* the least time the machine allows; NAN when not measured */
  double bound_pct; /* bound_us / time_us, in percent */
  int bound_by_copy; /* the memory traffic set the bound, not the round trip */
};

/* One rank's sweep: the options and where its buffers live. */
struct perf_run {
  const struct perf_coll *coll;
  const struct perf_opts *o;
  weftComm_t comm;
  weftStream_t stream; /* NULL with -z 1, a host stream with -z 0 */
  int rank, nranks;
  char *sendbuf, *recvbuf; /* of o->mem_kind */
  char *staging;           /* host copy to fill and check cuda buffers; NULL for host */
  const struct perf_bound *bound; /* NULL without one */
};

/* n operations, then waits for them: on the stream they were queued on, and
 * on the device, whose kernels run after the calls return. */
static weftResult_t run_ops(const struct perf_run *p, const char *src, char *dst, size_t count,
                            weftDataType_t t, weftRedOp_t op, long long n) {
  for (long long i = 0; i < n; i++) {
    weftResult_t res = p->coll->run(src, dst, count, t, op, p->o->root, p->comm, p->stream);
    if (res != weftSuccess) return res;
  }
  if (p->stream != NULL) {
    weftResult_t res = weftStreamSynchronize(p->stream);
    if (res != weftSuccess) return res;
  }
  if (perf_mem_sync(p->o->mem_kind) != 0) {
    fprintf(stderr, "rank %d: waiting for the device failed\n", p->rank);
    return weftSystemError;
  }
  return weftSuccess;
}

/* Writes this rank's inputs into src (a buffer of the run's memory kind). */
static int put_inputs(const struct perf_run *p, char *src, size_t send_count, weftDataType_t t,
                      weftRedOp_t op) {
  if (p->staging == NULL) {
    fill_inputs(src, send_count, p->rank, t, op);
    return 0;
  }
  fill_inputs(p->staging, send_count, p->rank, t, op);
  return perf_mem_upload(p->o->mem_kind, src, p->staging, send_count * weftTypeSize(t));
}

static int run_one(const struct perf_run *p, size_t nbytes, weftDataType_t t, weftRedOp_t op,
                   int in_place, struct perf_result *r) {
  const struct perf_coll *coll = p->coll;
  const struct perf_opts *o = p->o;
  int rank = p->rank, nranks = p->nranks;
  size_t esize = weftTypeSize(t), send_count, recv_count, count;
  coll->counts(nbytes, esize, nranks, &send_count, &recv_count, &count);
  /* in place, input and output share one buffer: a gather's input sits in its
   * rank's block of the output, a scatter's output in its rank's block of the input */
  char *src = p->sendbuf, *dst = p->recvbuf;
  if (in_place) {
    src = dst = p->recvbuf;
    if (recv_count > send_count) src += (size_t)rank * send_count * esize;
    if (send_count > recv_count) dst += (size_t)rank * recv_count * esize;
  }
  if (put_inputs(p, src, send_count, t, op) != 0) return -1;
  if (run_ops(p, src, dst, count, t, op, o->warmup) != weftSuccess) return -1;
  double t0 = now_s();
  const long long ops = (long long)o->iters * o->agg_iters;
  if (run_ops(p, src, dst, count, t, op, ops) != weftSuccess) return -1;
  double elapsed = (now_s() - t0) / (double)ops;
  elapsed = across_ranks(p->comm, elapsed, o->average, nranks);
  r->time_us = elapsed * 1e6;
  r->algbw = elapsed > 0 ? (double)nbytes / elapsed / 1e9 : 0;
  r->busbw = r->algbw * coll->busbw_factor(nranks);
  r->wrong = 0;
  r->bound_us = r->bound_pct = NAN;
  r->bound_by_copy = 0;
  if (p->bound != NULL) {
    const double traffic = coll->traffic(nranks, in_place) * (double)nbytes;
    r->bound_us = perf_bound_us(p->bound, traffic, &r->bound_by_copy);
    r->bound_pct = r->time_us > 0 ? 100.0 * r->bound_us / r->time_us : NAN;
  }
  if (o->check) {
    /* one more run on fresh inputs into a poisoned output */
    if (perf_mem_fill(o->mem_kind, dst, 0xa5, recv_count * esize) != 0) return -1;
    if (put_inputs(p, src, send_count, t, op) != 0) return -1;
    if (run_ops(p, src, dst, count, t, op, 1) != weftSuccess) return -1;
    const char *out = dst;
    if (p->staging != NULL) {
      if (perf_mem_download(o->mem_kind, p->staging, dst, recv_count * esize) != 0) return -1;
      out = p->staging;
    }
    long long wrong = count_wrong(coll, out, recv_count, count, rank, nranks, t, op, o->root);
    long long total = wrong;
    if (weftAllReduce(&wrong, &total, 1, weftInt64, weftSum, p->comm, NULL) != weftSuccess)
      return -1;
    r->wrong = total;
  }
  return 0;
}

/* One table row, kept for the JSON file. */
struct perf_row {
  size_t nbytes, count;
  weftDataType_t type;
  weftRedOp_t op;
  int root;
  struct perf_result oop, ip;
};

/* "key": v with digits decimals, after sep; null where v is not a finite
 * number (JSON has no nan or inf: a bound of 0 us, a time of no operations). */
static void json_num(FILE *f, const char *sep, const char *key, double v, int digits) {
  if (isfinite(v)) fprintf(f, "%s\"%s\": %.*f", sep, key, digits, v);
  else fprintf(f, "%s\"%s\": null", sep, key);
}

static void json_result(FILE *f, const struct perf_result *r, int check) {
  json_num(f, "{", "time_us", r->time_us, 3);
  json_num(f, ", ", "algbw_GBps", r->algbw, 4);
  json_num(f, ", ", "busbw_GBps", r->busbw, 4);
  if (check) fprintf(f, ", \"wrong\": %lld", r->wrong);
  else fprintf(f, ", \"wrong\": null");
  if (isnan(r->bound_us)) {
    fprintf(f, ", \"bound_us\": null, \"bound_pct\": null, \"bound_by\": null}");
    return;
  }
  /* the bound as busbw too: the busbw the row would have at the bound's time */
  json_num(f, ", ", "bound_us", r->bound_us, 4);
  json_num(f, ", ", "bound_busbw_GBps", r->busbw * r->time_us / r->bound_us, 4);
  json_num(f, ", ", "bound_pct", r->bound_pct, 2);
  fprintf(f, ", \"bound_by\": \"%s\"}", r->bound_by_copy ? "copy" : "round_trip");
}

/* The bound's figures, as an object. */
static void json_bound(FILE *f, const struct perf_bound *b) {
  if (b == NULL) {
    fprintf(f, "null");
    return;
  }
  json_num(f, "{", "round_trip_us", b->have_round_trip ? b->round_trip_us : NAN, 4);
  if (b->have_round_trip) fprintf(f, ", \"round_trip_cpus\": [%d, %d]", b->cpus[0], b->cpus[1]);
  json_num(f, ", ", "copy_rw_GBps", b->have_copy ? b->copy_rw_GBps : NAN, 3);
  if (b->have_copy) fprintf(f, ", \"copy_nbytes\": %zu", b->copy_nbytes);
  fprintf(f, ", \"why\": \"%s\"", b->why);
  json_num(f, ", ", "measure_s", b->measure_s, 3);
  fprintf(f, "}");
}

/* Writes the run as JSON: the settings, every row, and the footer's values. */
static int json_write(const char *path, int argc, char **argv, const struct perf_coll *coll,
                      const struct perf_opts *o, int nranks, const struct perf_bound *bound,
                      const struct perf_row *rows, int nrows, long long wrong, double avg_busbw,
                      int complete) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return -1;
  fprintf(f, "{\n  \"tool\": \"%s_perf\",\n  \"collective\": \"%s\",\n  \"command\": [", coll->name,
          coll->name);
  for (int i = 0; i < argc; i++) {
    fputc('"', f);
    for (const char *c = argv[i]; *c; c++) {
      if (*c == '"' || *c == '\\') fputc('\\', f);
      if ((unsigned char)*c >= 0x20) fputc(*c, f);
    }
    fprintf(f, "\"%s", i + 1 < argc ? ", " : "");
  }
  fprintf(f, "],\n  \"nranks\": %d,\n  \"memory\": \"%s\",\n  \"blocking\": %d,\n", nranks,
          perf_mem_name(o->mem_kind), o->blocking);
  fprintf(f, "  \"iters\": %d,\n  \"warmup_iters\": %d,\n  \"agg_iters\": %d,\n", o->iters,
          o->warmup, o->agg_iters);
  fprintf(f, "  \"check\": %d,\n  \"complete\": %s,\n  \"bound\": ", o->check,
          complete ? "true" : "false");
  json_bound(f, bound);
  fprintf(f, ",\n  \"rows\": [\n");
  for (int i = 0; i < nrows; i++) {
    const struct perf_row *r = &rows[i];
    fprintf(f, "    {\"size_bytes\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", "
               "\"root\": %d, \"out_of_place\": ",
            r->nbytes, r->count, type_names[r->type], coll->uses_op ? op_names[r->op] : "none",
            r->root);
    json_result(f, &r->oop, o->check);
    fprintf(f, ", \"in_place\": ");
    if (coll->no_in_place) fprintf(f, "null");
    else json_result(f, &r->ip, o->check);
    fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
  }
  fprintf(f, "  ],\n  \"out_of_bounds\": %lld,\n", wrong);
  json_num(f, "  ", "avg_busbw_GBps", avg_busbw, 6);
  fprintf(f, "\n}\n");
  return fclose(f) == 0 ? 0 : -1;
}

/* The bound's figures, or why there are none, above the table. */
static void print_bound(const struct perf_opts *o, const struct perf_bound *b, int nranks) {
  if (b == NULL) {
    if (o->bound) printf("# Bound: not measured (only for host memory)\n#\n");
    return;
  }
  printf("# Bound: the larger of a cache-line round trip and the memory traffic at the copy "
         "rate\n");
  if (b->have_round_trip)
    printf("#   cache-line round trip %.3f us (ranks 0 and 1 on CPUs %d and %d, ping-pong)\n",
           b->round_trip_us, b->cpus[0], b->cpus[1]);
  if (b->have_copy)
    printf("#   copy %.2f GB/s read + written (%d ranks copying %zu MiB each at once)\n",
           b->copy_rw_GBps, nranks, b->copy_nbytes >> 20);
  if (b->why[0] != '\0') printf("#   %s\n", b->why);
  printf("#   measured in %.2f s (-B 1)\n#\n", b->measure_s);
}

static void print_header(const struct perf_opts *o, int nranks, const char *host,
                         const struct perf_bound *bound) {
  /* the step as nccl-tests prints it (a whole number; a fractional factor
   * as it was given) */
  char step[48];
  if (o->step_factor > 1) snprintf(step, sizeof step, "%g(factor)", o->step_factor);
  else snprintf(step, sizeof step, "%zu(bytes)", o->step_nbytes);
  printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %s warmup iters: %d "
         "iters: %d agg iters: %d validation: %d graph: %d\n#\n",
         o->min_nbytes, o->max_nbytes, step, o->warmup, o->iters, o->agg_iters, o->check,
         o->graph_iters);
  printf("# Using %s memory: %d ranks, rank 0 pid %d on %s, blocking %d\n#\n",
         perf_mem_name(o->mem_kind), nranks, (int)getpid(), host, o->blocking);
  if (o->graph_iters > 0)
    printf("# -G %d ignored: operations run on the host executor, which has no CUDA graphs\n#\n",
           o->graph_iters);
  print_bound(o, bound, nranks);
  /* nccl-tests' 13 columns; the bound's four after them with -B 1 */
  const int b = o->bound;
  printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place%s\n",
         "", "", "", "", "", b ? "           bound: out-of-place, in-place" : "");
  static const char columns[] =
      "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s";
  printf(columns, "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
         "time", "algbw", "busbw", "#wrong");
  if (b) printf("  %8s  %6s  %8s  %6s", "time", "%", "time", "%");
  printf("\n");
  printf(columns, "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
         "(GB/s)", "(GB/s)", "");
  if (b) printf("  %8s  %6s  %8s  %6s", "(us)", "", "(us)", "");
  printf("\n");
  fflush(stdout);
}

/* A side's bound columns: the time and the percentage, or N/A. */
static void format_bound(char *buf, size_t len, const struct perf_result *r, int absent) {
  if (absent || isnan(r->bound_us)) snprintf(buf, len, "  %8s  %6s", "N/A", "N/A");
  else snprintf(buf, len, "  %8.3f  %6.1f", r->bound_us, r->bound_pct);
}

/* A side's #wrong: N/A without -c 1, as nccl-tests prints it. */
static void format_wrong(char *buf, size_t len, const struct perf_opts *o, long long wrong) {
  if (o->check) snprintf(buf, len, "%lld", wrong);
  else snprintf(buf, len, "N/A");
}

static void print_row(const struct perf_coll *coll, const struct perf_opts *o,
                      const struct perf_row *r) {
  char root[16], in_place[64], bound_oop[32], bound_ip[32], wrong_oop[24], wrong_ip[24];
  format_wrong(wrong_oop, sizeof wrong_oop, o, r->oop.wrong);
  format_wrong(wrong_ip, sizeof wrong_ip, o, r->ip.wrong);
  format_bound(bound_oop, sizeof bound_oop, &r->oop, 0);
  format_bound(bound_ip, sizeof bound_ip, &r->ip, coll->no_in_place);
  if (!o->bound) bound_oop[0] = bound_ip[0] = '\0';
  snprintf(root, sizeof root, "%d", r->root);
  if (coll->no_in_place)
    snprintf(in_place, sizeof in_place, "  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
  else
    snprintf(in_place, sizeof in_place, "  %7.2f  %6.2f  %6.2f  %6s", r->ip.time_us,
             r->ip.algbw, r->ip.busbw, wrong_ip);
  printf("  %10zu  %12zu  %8s  %6s  %6s  %7.2f  %6.2f  %6.2f  %6s%s%s%s\n", r->nbytes, r->count,
         type_names[r->type], coll->uses_op ? op_names[r->op] : "none", root, r->oop.time_us,
         r->oop.algbw, r->oop.busbw, wrong_oop, in_place, bound_oop, bound_ip);
  fflush(stdout);
}

/* "# all_reduce_perf: 5/24 rows, 1048576 B, 3.2 s" on stderr: over itself on a
 * terminal, one line per row otherwise. */
static void print_progress(const struct perf_coll *coll, int done, int total, size_t nbytes,
                           double elapsed_s) {
  int tty = isatty(STDERR_FILENO);
  fprintf(stderr, "%s# %s_perf: %d/%d rows, %zu B, %.1f s%s", tty ? "\r" : "", coll->name, done,
          total, nbytes, elapsed_s, tty ? (done == total ? "\n" : "") : "\n");
  fflush(stderr);
}

int perf_main(int argc, char **argv, const struct perf_coll *coll) {
  struct perf_opts o;
  if (opts_parse(argc, argv, coll, &o) != 0) return 2;
  char why[256];
  if (perf_mem_available(o.mem_kind, why, sizeof why) != 0) {
    fprintf(stderr, "%s: -M %s: %s\n", argv[0], perf_mem_name(o.mem_kind), why);
    return 2;
  }
  weftConfig_t config = WEFT_CONFIG_INITIALIZER;
  if (o.timeout_s > 0) config.timeoutMs = o.timeout_s * 1000;
  weftComm_t comm;
  weftResult_t res = weftCommInitFromEnv(&comm, &config);
  if (res != weftSuccess) {
    fprintf(stderr, "%s: init failed: %s: %s\n", argv[0], weftGetErrorString(res),
            weftGetLastError(NULL));
    return 1;
  }
  struct perf_run run = {.coll = coll, .o = &o, .comm = comm};
  weftCommUserRank(comm, &run.rank);
  weftCommCount(comm, &run.nranks);
  int rank = run.rank, nranks = run.nranks;
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  /* the bound, before anything else runs: host memory only (a device
   * collective's floor is the device's) */
  struct perf_bound bound;
  if (o.bound && o.mem_kind == PERF_MEM_HOST) {
    res = perf_bound_measure(comm, &bound);
    if (res != weftSuccess) {
      fprintf(stderr, "%s: rank %d: measuring the bound: %s\n", argv[0], rank,
              weftGetLastError(comm));
      weftCommAbort(comm);
      return 1;
    }
    run.bound = &bound;
  }
  const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  if (rank == 0) {
    printf("# Collective test starting: %s\n", prog); /* as nccl-tests frames its run */
    print_header(&o, nranks, host, run.bound);
  }
  /* let the launcher forward the header now rather than in the first timed
   * loop, where it would take a core from a spinning rank; then bring every
   * rank's connections and caches up before the first row's own warm-up */
  usleep(20000);
  /* buffers for the largest size: recv may be nranks x send (gathers) */
  size_t max_send = 0, max_recv = 0, max_count = 0;
  coll->counts(o.max_nbytes, 1, nranks, &max_send, &max_recv, &max_count);
  size_t alloc = (max_send > max_recv ? max_send : max_recv) + 64;
  run.sendbuf = perf_mem_alloc(o.mem_kind, alloc);
  run.recvbuf = perf_mem_alloc(o.mem_kind, alloc);
  if (o.mem_kind != PERF_MEM_HOST) run.staging = perf_mem_alloc(PERF_MEM_HOST, alloc);
  const int total_rows = (int)sweep_rows(&o); /* at most SWEEP_MAX_ROWS (opts_parse) */
  struct perf_row *rows = rank == 0 ? calloc((size_t)total_rows + 1, sizeof *rows) : NULL;
  int failed = 0;
  if (run.sendbuf == NULL || run.recvbuf == NULL ||
      (o.mem_kind != PERF_MEM_HOST && run.staging == NULL) || (rank == 0 && rows == NULL)) {
    fprintf(stderr, "%s: cannot allocate %zu bytes of %s memory\n", argv[0], alloc,
            perf_mem_name(o.mem_kind));
    failed = 1;
  }
  if (!failed && !o.blocking && weftStreamCreate(&run.stream) != weftSuccess) {
    fprintf(stderr, "%s: -z 0: cannot create a host stream: %s\n", argv[0],
            weftGetLastError(NULL));
    failed = 1;
  }
  if (!failed) {
    /* the first timed loop of a fresh job runs slow (cold connections and
     * caches): a start-up warm-up of the smallest size, untimed */
    size_t send_count, recv_count, count;
    size_t warm_nbytes = o.min_nbytes < 65536 ? o.min_nbytes : 65536;
    coll->counts(warm_nbytes, weftTypeSize(o.types[0]), nranks, &send_count, &recv_count, &count);
    if (perf_mem_fill(o.mem_kind, run.sendbuf, 0, alloc) != 0 ||
        run_ops(&run, run.sendbuf, run.recvbuf, count, o.types[0], o.ops[0], 200) != weftSuccess) {
      fprintf(stderr, "%s: rank %d: %s\n", argv[0], rank, weftGetLastError(comm));
      failed = 1;
    }
  }
  long long total_wrong = 0;
  double bw_sum = 0, t_start = now_s();
  int bw_n = 0, nrows = 0;
  for (int ti = 0; ti < o.ntypes && !failed; ti++) {
    for (int oi = 0; oi < o.nops && !failed; oi++) {
      weftDataType_t t = o.types[ti];
      weftRedOp_t op = o.ops[oi];
      size_t esize = weftTypeSize(t);
      for (size_t nbytes = o.min_nbytes; nbytes <= o.max_nbytes && !failed;) {
        size_t send_count, recv_count, count;
        coll->counts(nbytes, esize, nranks, &send_count, &recv_count, &count);
        size_t total = send_count > recv_count ? send_count : recv_count;
        /* size: one rank's larger buffer; count: what each call is given
         * (a gather's per-rank block), as nccl-tests prints them */
        struct perf_row row = {.nbytes = total * esize, .count = count, .type = t, .op = op,
                               .root = coll->uses_root ? o.root : -1};
        if (run_one(&run, row.nbytes, t, op, 0, &row.oop) ||
            (!coll->no_in_place && run_one(&run, row.nbytes, t, op, 1, &row.ip))) {
          fprintf(stderr, "%s: rank %d: %s\n", argv[0], rank, weftGetLastError(comm));
          failed = 1;
          break;
        }
        total_wrong += row.oop.wrong + row.ip.wrong;
        bw_sum += row.oop.busbw + row.ip.busbw;
        bw_n += coll->no_in_place ? 1 : 2;
        if (rank == 0) {
          if (nrows < total_rows) rows[nrows] = row;
          nrows++;
          print_row(coll, &o, &row);
          if (o.progress) print_progress(coll, nrows, total_rows, row.nbytes, now_s() - t_start);
        }
        nbytes = sweep_next(&o, nbytes);
        if (nbytes == 0) break;
      }
    }
  }
  double avg_busbw = bw_n ? bw_sum / bw_n : 0.0;
  if (rank == 0 && !failed) {
    printf("# Out of bounds values : %lld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", avg_busbw);
    printf("# Collective test concluded: %s\n#\n", prog);
    fflush(stdout);
  }
  int json_failed = 0;
  if (rank == 0 && o.json_path != NULL && rows != NULL &&
      json_write(o.json_path, argc, argv, coll, &o, nranks, run.bound, rows,
                 nrows < total_rows ? nrows : total_rows, total_wrong, avg_busbw, !failed) != 0) {
    fprintf(stderr, "%s: cannot write %s: %s\n", argv[0], o.json_path, strerror(errno));
    json_failed = 1;
  }
  free(rows);
  if (run.stream != NULL) weftStreamDestroy(run.stream);
  perf_mem_free(o.mem_kind, run.sendbuf);
  perf_mem_free(o.mem_kind, run.recvbuf);
  perf_mem_free(PERF_MEM_HOST, run.staging);
  if (failed) {
    weftCommAbort(comm);
    return 1;
  }
  weftCommFinalize(comm);
  weftCommDestroy(comm);
  return total_wrong || json_failed ? 1 : 0;
}
