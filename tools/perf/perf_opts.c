/* The perf tools' flags: every flag of nccl-tests, under its short and long
 * name with its value syntax, and weft's own. A value that is not a number
 * in range is refused (exit 2) rather than read as 0. */
#include "perf_opts.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "perf_coll.h"

static const char *type_names[weftNumTypes] = {"int8", "uint8", "int32", "uint32",
                                               "int64", "uint64", "half", "float",
                                               "double", "bfloat16", "f8e4m3", "f8e5m2"};
static const char *op_names[PERF_NUM_OPS] = {"sum", "prod", "max", "min", "avg", "mulsum"};

const char *perf_type_name(weftDataType_t t) { return type_names[t]; }
const char *perf_op_name(int op) { return op_names[op]; }

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

/* sum prod max min avg mulsum, or all of them */
static int parse_op(const char *s, struct perf_opts *o) {
  if (strcmp(s, "all") == 0) {
    for (int p = 0; p < PERF_NUM_OPS; p++) o->ops[p] = p;
    o->nops = PERF_NUM_OPS;
    return 0;
  }
  for (int p = 0; p < PERF_NUM_OPS; p++)
    if (strcmp(s, op_names[p]) == 0) { o->ops[0] = p; o->nops = 1; return 0; }
  return -1;
}

/* -M: nccl-tests' memory report (0/1), or where the buffers live (host, cuda) */
static int parse_memory(const char *s, struct perf_opts *o) {
  if (parse_int(s, 0, 1, &o->memory_report) == 0) return 0;
  return perf_mem_parse(s, &o->mem_kind);
}

/* -J writes a file only for a name that ends .json (any case), as nccl-tests:
 * the text after the last dot, where no slash follows the dot. */
static int json_name(const char *path) {
  const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
  return dot != NULL && (slash == NULL || dot > slash) && strcasecmp(dot + 1, "json") == 0;
}

/* The size after nbytes in a sweep: times the factor where it is above 1
 * (-f wins over -i, in either order, as in nccl-tests), rounded to the
 * nearest byte and at least one more, so that a small factor still moves;
 * otherwise plus the step. 0 past SIZE_MAX. */
size_t perf_sweep_next(const struct perf_opts *o, size_t nbytes) {
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

/* Past SIZE_MAX rows, SWEEP_MAX_ROWS + 1. */
long long perf_sweep_rows(const struct perf_opts *o) {
  long long rows = 0;
  for (size_t nbytes = o->min_nbytes; nbytes <= o->max_nbytes;) {
    if (++rows * o->ntypes * o->nops > SWEEP_MAX_ROWS) return SWEEP_MAX_ROWS + 1;
    nbytes = perf_sweep_next(o, nbytes);
    if (nbytes == 0) break; /* past SIZE_MAX */
  }
  return rows * o->ntypes * o->nops;
}

static void usage(FILE *f, const char *prog, const struct perf_coll *coll) {
  fprintf(f,
          "usage: %s [options]   (%s over weft; start ranks with weftrun -n N)\n"
          "  -b, --minbytes SIZE        smallest size (default 32M); K, M, G suffixes\n"
          "  -e, --maxbytes SIZE        largest size (default 32M)\n"
          "  -i, --stepbytes SIZE       linear step between sizes (default 1M)\n"
          "  -f, --stepfactor F         multiplicative step between sizes (fractions too)\n"
          "  -n, --iters N              timed iterations per size (default 20)\n"
          "  -m, --agg_iters N          operations per iteration, in one group (default 1)\n"
          "  -w, --warmup_iters N       untimed iterations first (default 5)\n"
          "  -N, --run_cycles N         sweeps of each datatype, op and root (default 1;\n"
          "                             0: without end)\n"
          "  -p, --parallel_init 0/1    accepted; each rank is a process that initializes\n"
          "                             on its own\n"
          "  -c, --check N              check rounds per row (default 1; 0: none)\n"
          "  -o, --op OP                sum prod max min avg mulsum, or all (default sum)\n"
          "  -d, --datatype T           int8 uint8 int32 uint32 int64 uint64 half float\n"
          "                             double bfloat16 f8e4m3 f8e5m2, or all (default float)\n"
          "  -r, --root R               root of rooted collectives (default 0; -1: each rank\n"
          "                             in turn)\n"
          "  -z, --blocking 0-3         0: queue on a host stream, wait after the timed loop;\n"
          "                             1: wait for each operation, then a barrier; 2: each\n"
          "                             on the NULL stream (host memory: done on return;\n"
          "                             device: waited after the loop) (default); 3: wait\n"
          "                             after each iteration, then a barrier left out of the time\n"
          "  -y, --stream_null 0/1      1: every operation on the NULL stream (-z 0 too)\n"
          "  -T, --timeout S            seconds before a stuck operation is a timeout (exit 4)\n"
          "  -G, --cudagraph N          CUDA graph launches: noted and ignored (host\n"
          "                             operations have no graphs)\n"
          "  -C, --report_cputime 0/1   1: the time columns are the host's time to issue the\n"
          "                             calls (cputime)\n"
          "  -S, --report_timestamps 0/1  1: a timestamp after the in-place columns\n"
          "  -J, --output_file FILE     rank 0 writes nccl-tests' JSON to FILE when its name\n"
          "                             ends .json (never over a file: FILE.0, FILE.1, ...);\n"
          "                             --json is the same\n"
          "  -a, --average 0-3          time across ranks: 0 rank 0, 1 mean, 2 min, 3 max\n"
          "                             (default 1)\n"
          "  -R, --local_register 0-2   1: register the buffers (weftCommRegister); 2 as 1\n"
          "  -x, --cta_policy 0-2       accepted; weft has no CTA policy\n"
          "  -D, --device_implementation N  0 only: these tools have no device kernels\n"
          "  -V, --device_cta_count N   accepted; for -D only\n"
          "  -M, --memory 0/1           1: the memory used, in the footer\n"
          "  -M, --memory host/cuda     where the buffers live (default host)\n"
          "  -u, --unalign N            buffers N elements off their alignment (default 0)\n"
          "  -I, --per_iter_timing 0/1  1: each side's per-iteration min, max, p99 and cv%%\n"
          "  -K, --per_iter_skip N      leading iterations left out of -I's figures\n"
          "  -t, --nthreads 1           nccl-tests' threads per process, and\n"
          "  -g, --ngpus 1              GPUs per thread: one rank per process here (start\n"
          "                             N ranks with weftrun -n N); 1 is taken, more refused\n"
          "  -P, --progress 0/1         progress line on stderr (default: 1 when stderr is a\n"
          "                             terminal)\n"
          "  -B, --bound 0/1            measure the machine's bound at start-up (a cache-line\n"
          "                             round trip, a copy; under 0.5 s) and print the time\n"
          "                             it allows and the %% reached, in four columns after\n"
          "                             nccl-tests' (default 0: nccl-tests' columns alone)\n"
          "  -h, --help\n"
          "Environment, as nccl-tests reads it: NCCL_TESTS_MIN_BW (GB/s the average busbw\n"
          "must reach); NCCL_TESTS_SPLIT (AND, OR, MOD or DIV and a number) or\n"
          "NCCL_TESTS_SPLIT_MASK (hex): the rank's color, its group; alltoallv_perf:\n"
          "NCCL_TESTS_ALLTOALLV_SPREAD (0 to 1, default 1: shares by rank distance).\n"
          "Exit status as nccl-tests': 0; 2 a refused flag (or a CUDA failure); 3 a weft\n"
          "error; 4 a timeout; 5 -D; 7 a wrong value, or busbw below NCCL_TESTS_MIN_BW.\n",
          prog, coll->name);
}

/* A number as nccl-tests' parseInt reads NCCL_TESTS_SPLIT's: spaces first,
 * then 0b and binary digits, or C's notation (0x hex, 0 octal, decimal);
 * what follows may only be spaces. */
static int split_number(const char *s, unsigned long *out) {
  while (isspace((unsigned char)*s)) s++;
  const int binary = strncasecmp(s, "0b", 2) == 0;
  const char *digits = binary ? s + 2 : s;
  char *end;
  errno = 0;
  *out = strtoul(digits, &end, binary ? 2 : 0);
  if (end == digits || errno != 0 || *digits == '-') return -1;
  while (isspace((unsigned char)*end)) end++;
  return *end == '\0' ? 0 : -1;
}

int perf_split_parse(struct perf_split *split) {
  static const struct { const char *word, *sign; char how; } ops[] = {
      {"AND", "&", '&'}, {"OR", "|", '|'}, {"MOD", "%", '%'}, {"DIV", "/", '/'}};
  *split = (struct perf_split){0};
  const char *mask = getenv("NCCL_TESTS_SPLIT_MASK");
  if (mask != NULL) { /* hex, as nccl-tests' strtoul(s, NULL, 16) */
    char *end;
    errno = 0;
    split->operand = strtoul(mask, &end, 16);
    while (isspace((unsigned char)*end)) end++;
    if (end == mask || *end != '\0' || errno != 0 || *mask == '-') {
      fprintf(stderr, "bad value '%s' for NCCL_TESTS_SPLIT_MASK (a hex mask)\n", mask);
      return -1;
    }
    split->how = '&';
    return 0;
  }
  const char *s = getenv("NCCL_TESTS_SPLIT");
  if (s == NULL) return 0;
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    const size_t word = strlen(ops[k].word), sign = strlen(ops[k].sign);
    const char *rest = strncasecmp(s, ops[k].word, word) == 0 ? s + word
                       : strncmp(s, ops[k].sign, sign) == 0   ? s + sign
                                                               : NULL;
    if (rest == NULL) continue;
    if (split_number(rest, &split->operand) != 0) break;
    if ((ops[k].how == '%' || ops[k].how == '/') && split->operand == 0) break;
    split->how = ops[k].how;
    return 0;
  }
  fprintf(stderr, "bad value '%s' for NCCL_TESTS_SPLIT (AND, OR, MOD or DIV and a number; "
                  "MOD and DIV not by 0)\n", s);
  return -1;
}

int perf_split_color(const struct perf_split *split, int rank) {
  /* nccl-tests takes the operand as an int */
  const long long operand = (int)split->operand, r = rank;
  long long color = 0;
  switch (split->how) {
    case '&': color = r & operand; break;
    case '|': color = r | operand; break;
    case '%': color = r % operand; break;
    case '/': color = r / operand; break;
    default: break;
  }
  return color >= 0 && color <= INT_MAX ? (int)color : -1;
}

/* Checks that apply to the flags together; 1 and *exit_out to leave. */
static int opts_check(const char *prog, struct perf_opts *o, int *exit_out) {
  *exit_out = 2;
  if (o->step_factor <= 1 && o->step_nbytes == 0 && o->min_nbytes < o->max_nbytes) {
    fprintf(stderr, "%s: a step of 0 bytes (-i 0) without a factor (-f) never reaches -e\n",
            prog);
    return 1;
  }
  if (o->min_nbytes <= o->max_nbytes && perf_sweep_rows(o) > SWEEP_MAX_ROWS) {
    fprintf(stderr, "%s: more than %d rows from -b %zu to -e %zu (with -i, -f, -d and -o)\n",
            prog, SWEEP_MAX_ROWS, o->min_nbytes, o->max_nbytes);
    return 1;
  }
  if (o->min_nbytes > o->max_nbytes) {
    fprintf(stderr, "%s: invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu\n", prog,
            o->min_nbytes, o->max_nbytes);
    return 1;
  }
  /* nccl-tests' rules for the device API, then its answer for a test with
   * no device implementation */
  if (o->device_impl > 0 && o->local_register != PERF_REG_SYMMETRIC) {
    fprintf(stderr, "device implementation (-D > 0) requires enabling symmetric memory "
                    "registration (-R 2)\n");
    return 1;
  }
  if (o->device_impl > 0) {
    fprintf(stderr, "Device implementation %d is not supported by this test\n", o->device_impl);
    *exit_out = 5;
    return 1;
  }
  /* nccl-tests' adjustments, with its notes */
  if (o->per_iter != 0 && o->per_iter != 1) {
    fprintf(stderr, "per-iteration timing (-I) only supports 0=off or 1=on. Disabling.\n");
    o->per_iter = 0;
  }
  if (o->per_iter && o->graph_iters >= 1) {
    fprintf(stderr, "per-iteration timing (-I) is incompatible with CUDA graph mode (-G). "
                    "Disabling.\n");
    o->per_iter = 0;
  }
  if (o->blocking == PERF_BLOCK_OUTER && o->graph_iters >= 1) {
    fprintf(stderr, "blocking mode (-z 3) is incompatible with CUDA graph mode (-G). "
                    "Disabling.\n");
    o->blocking = PERF_BLOCK_NONE;
  }
  if (o->per_iter_skip < 0 || o->per_iter_skip >= o->iters) {
    fprintf(stderr, "per-iteration skip (-K) must be between 0 and %d. Disabling.\n",
            o->iters - 1);
    o->per_iter_skip = 0;
  }
  if (o->per_iter_skip && !o->per_iter) {
    fprintf(stderr, "per-iteration skip (-K) requires per-iteration timing (-I 1). "
                    "Disabling.\n");
    o->per_iter_skip = 0;
  }
  if (o->device_ctas <= 0 || o->device_ctas > 128) {
    fprintf(stderr, "device_cta_count (-V) must be positive and less than 128, got %d. "
                    "Using default value 16.\n", o->device_ctas);
    o->device_ctas = 16;
  }
  return 0;
}

int perf_opts_parse(int argc, char **argv, const struct perf_coll *coll, struct perf_opts *o,
                    int *exit_out) {
  static const struct option longopts[] = {
      {"nthreads", required_argument, 0, 't'}, {"ngpus", required_argument, 0, 'g'},
      {"minbytes", required_argument, 0, 'b'}, {"maxbytes", required_argument, 0, 'e'},
      {"stepbytes", required_argument, 0, 'i'}, {"stepfactor", required_argument, 0, 'f'},
      {"iters", required_argument, 0, 'n'}, {"agg_iters", required_argument, 0, 'm'},
      {"warmup_iters", required_argument, 0, 'w'}, {"run_cycles", required_argument, 0, 'N'},
      {"parallel_init", required_argument, 0, 'p'}, {"check", required_argument, 0, 'c'},
      {"op", required_argument, 0, 'o'}, {"datatype", required_argument, 0, 'd'},
      {"root", required_argument, 0, 'r'}, {"blocking", required_argument, 0, 'z'},
      {"stream_null", required_argument, 0, 'y'}, {"timeout", required_argument, 0, 'T'},
      {"cudagraph", required_argument, 0, 'G'}, {"report_cputime", required_argument, 0, 'C'},
      {"report_timestamps", required_argument, 0, 'S'},
      {"output_file", required_argument, 0, 'J'}, {"json", required_argument, 0, 'J'},
      {"average", required_argument, 0, 'a'}, {"local_register", required_argument, 0, 'R'},
      {"cta_policy", required_argument, 0, 'x'},
      {"device_implementation", required_argument, 0, 'D'},
      {"device_cta_count", required_argument, 0, 'V'}, {"memory", required_argument, 0, 'M'},
      {"unalign", required_argument, 0, 'u'}, {"per_iter_timing", required_argument, 0, 'I'},
      {"per_iter_skip", required_argument, 0, 'K'}, {"progress", required_argument, 0, 'P'},
      {"bound", required_argument, 0, 'B'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  *o = (struct perf_opts){.min_nbytes = 32 << 20, .max_nbytes = 32 << 20, .step_nbytes = 1 << 20,
                          .step_factor = 1, .iters = 20, .warmup = 5, .agg_iters = 1,
                          .check = 1, .cycles = 1, .average = 1, .root = 0,
                          .blocking = PERF_BLOCK_WAIT, .cta_policy = -1, .device_ctas = 16,
                          .progress = isatty(STDERR_FILENO), .mem_kind = PERF_MEM_HOST};
  o->types[0] = weftFloat32;
  o->ntypes = 1;
  o->ops[0] = weftSum;
  o->nops = 1;
  const char *shortopts = "t:g:b:e:i:f:n:m:w:N:p:I:K:c:o:d:r:z:y:T:hG:C:a:R:x:D:V:J:S:M:u:P:B:";
  int c;
  *exit_out = 2;
  while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
    int bad = 0;
    switch (c) {
      case 'b': bad = parse_size(optarg, &o->min_nbytes); break;
      case 'e': bad = parse_size(optarg, &o->max_nbytes); break;
      case 'i': bad = parse_size(optarg, &o->step_nbytes); break;
      case 'f': bad = parse_factor(optarg, &o->step_factor); break;
      case 'n': bad = parse_int(optarg, 1, INT_MAX, &o->iters); break;
      case 'm': bad = parse_int(optarg, 1, INT_MAX, &o->agg_iters); break;
      case 'w': bad = parse_int(optarg, 0, INT_MAX, &o->warmup); break;
      case 'N': bad = parse_int(optarg, 0, INT_MAX, &o->cycles); break;
      case 'p': bad = parse_int(optarg, 0, 1, &o->parallel_init); break;
      case 'c': bad = parse_int(optarg, 0, INT_MAX, &o->check); break;
      case 'o': bad = parse_op(optarg, o); break;
      case 'd': bad = parse_type(optarg, o); break;
      case 'r': bad = parse_int(optarg, -1, INT_MAX, &o->root); break;
      case 'z': bad = parse_int(optarg, 0, 3, &o->blocking); break;
      case 'y': bad = parse_int(optarg, 0, 1, &o->stream_null); break;
      case 'T': bad = parse_int(optarg, 0, INT_MAX / 1000, &o->timeout_s); break;
      case 'G': bad = parse_int(optarg, 0, INT_MAX, &o->graph_iters); break;
      case 'C': bad = parse_int(optarg, 0, 1, &o->cputime); break;
      case 'S': bad = parse_int(optarg, 0, 1, &o->timestamps); break;
      case 'J':
        if (json_name(optarg)) o->json_path = optarg, o->json_ignored = NULL;
        else o->json_ignored = optarg, o->json_path = NULL;
        break;
      case 'a': bad = parse_int(optarg, 0, 3, &o->average); break;
      case 'R': bad = parse_int(optarg, 0, 2, &o->local_register); break;
      case 'x': bad = parse_int(optarg, 0, 2, &o->cta_policy); break;
      case 'D': bad = parse_int(optarg, 0, INT_MAX, &o->device_impl); break;
      case 'V': bad = parse_int(optarg, INT_MIN, INT_MAX, &o->device_ctas); break;
      case 'M': bad = parse_memory(optarg, o); break;
      case 'u': bad = parse_int(optarg, 0, 1 << 16, &o->unalign); break;
      case 'I': bad = parse_int(optarg, INT_MIN, INT_MAX, &o->per_iter); break;
      case 'K': bad = parse_int(optarg, INT_MIN, INT_MAX, &o->per_iter_skip); break;
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
          return 1;
        }
        break;
      }
      case 'h':
        usage(stdout, argv[0], coll);
        *exit_out = 0;
        return 1;
      default: /* getopt named the flag; a typo exits non-zero, not 0 as in nccl-tests */
        usage(stderr, argv[0], coll);
        return 1;
    }
    if (bad) {
      fprintf(stderr, "%s: bad value '%s' for -%c\n", argv[0], optarg, c);
      return 1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
    return 1;
  }
  if (coll->op_column != NULL) o->nops = 1; /* its column names no op */
  return opts_check(argv[0], o, exit_out);
}
