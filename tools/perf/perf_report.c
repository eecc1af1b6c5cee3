/* The perf tools' output, line for line as nccl-tests prints it (util.cu's
 * layout), and its JSON file. weft's additions come where a script written
 * for nccl-tests does not look: "#" lines before the column heads, columns
 * after nccl-tests' last, keys it does not read. */
#include "perf_report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf_coll.h"

extern char **environ;

void perf_hostname(char *buf, size_t len) {
  if (gethostname(buf, len) != 0) snprintf(buf, len, "unknown");
  buf[len - 1] = '\0';
  char *dot = strchr(buf, '.');
  if (dot != NULL) *dot = '\0';
}

void perf_format_float(double value, int width, char *buf) {
  if (snprintf(buf, (size_t)width + 1, "%*.2f", width, value) <= width) return;
  if (snprintf(buf, (size_t)width + 1, "%*.1f", width, value) <= width) return;
  if (snprintf(buf, (size_t)width + 1, "%*.0f", width, value) <= width) return;
  snprintf(buf, (size_t)width + 1, width >= 7 ? "%*.1e" : "%*.0e", width, value);
}

static int compare_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* the nearest-rank percentile's index among n sorted values */
static int percentile_index(int n, int percentile) {
  const int i = (n * percentile + 99) / 100 - 1;
  return i < n - 1 ? i : n - 1;
}

void perf_iter_stats(const double *times_s, int n, struct perf_iter_stats *out) {
  double *sorted = malloc((size_t)n * sizeof *sorted);
  if (sorted == NULL || n <= 0) {
    free(sorted);
    *out = (struct perf_iter_stats){0};
    return;
  }
  memcpy(sorted, times_s, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, compare_double);
  double sum = 0, var = 0;
  for (int i = 0; i < n; i++) sum += sorted[i];
  out->avg = sum / n;
  for (int i = 0; i < n; i++) var += (sorted[i] - out->avg) * (sorted[i] - out->avg);
  out->min = sorted[0];
  out->max = sorted[n - 1];
  out->p50 = sorted[n / 2];
  out->p95 = sorted[percentile_index(n, 95)];
  out->p99 = sorted[percentile_index(n, 99)];
  out->stdev = sqrt(var / n);
  out->cv_pct = out->avg > 0 ? out->stdev / out->avg * 100.0 : 0.0;
  free(sorted);
}

/* --- JSON: written as the run goes, closed whatever happens ------------- */

/* the comma before a value or key, unless it is the first at its depth or
 * follows its key */
static void json_sep(struct perf_report *r) {
  if (r->json_after_key) {
    r->json_after_key = 0;
    return;
  }
  if (r->json_more[r->json_depth]) fputc(',', r->json);
  r->json_more[r->json_depth] = 1;
}

/* opens an object or a list: bracket is { or [ (never more than 6 deep) */
static void json_open(struct perf_report *r, char bracket) {
  json_sep(r);
  fputc(bracket, r->json);
  r->json_depth++;
  r->json_more[r->json_depth] = 0;
  r->json_closer[r->json_depth] = bracket == '{' ? '}' : ']';
}

static void json_close(struct perf_report *r) {
  fputc(r->json_closer[r->json_depth], r->json);
  r->json_depth--;
}

/* a string, escaped as JSON needs (control characters dropped) */
static void json_str(struct perf_report *r, const char *s) {
  json_sep(r);
  fputc('"', r->json);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', r->json);
    if ((unsigned char)*s >= 0x20) fputc(*s, r->json);
  }
  fputc('"', r->json);
}

static void json_key(struct perf_report *r, const char *key) {
  json_str(r, key);
  fputc(':', r->json);
  r->json_after_key = 1;
}

static void json_null(struct perf_report *r) {
  json_sep(r);
  fputs("null", r->json);
}

static void json_int(struct perf_report *r, long long v) {
  json_sep(r);
  fprintf(r->json, "%lld", v);
}

/* nccl-tests' "%lf"; a number that is not finite is null (JSON has none) */
static void json_double(struct perf_report *r, double v) {
  if (!isfinite(v)) {
    json_null(r);
    return;
  }
  json_sep(r);
  fprintf(r->json, "%f", v);
}

/* nccl-tests writes its booleans as the strings "true" and "false" */
static void json_bool(struct perf_report *r, int v) { json_str(r, v ? "true" : "false"); }

static void json_now(struct perf_report *r) {
  char buf[64];
  const time_t now = time(NULL);
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", localtime(&now));
  json_str(r, buf);
}

/* nccl-tests lists the whole environment; here only the variables that set
 * up a run (WEFT_, NCCL_, UCX_), and none that holds a credential: the job's
 * secret and unique id, or a name that says SECRET, TOKEN or PASSWORD */
static int env_listed(const char *entry) {
  if (strncmp(entry, "WEFT_", 5) != 0 && strncmp(entry, "NCCL_", 5) != 0 &&
      strncmp(entry, "UCX_", 4) != 0)
    return 0;
  char name[256];
  snprintf(name, sizeof name, "%.*s", (int)strcspn(entry, "="), entry);
  return strcmp(name, "WEFT_UNIQUE_ID") != 0 && strstr(name, "SECRET") == NULL &&
         strstr(name, "TOKEN") == NULL && strstr(name, "PASSWORD") == NULL;
}

void perf_report_open(struct perf_report *r, int argc, char **argv) {
  const char *path = r->o->json_path;
  if (path == NULL) return;
  /* exclusive creation, then FILE.0, FILE.1, ... */
  char try_path[4096];
  snprintf(try_path, sizeof try_path, "%s", path);
  for (int n = 0;; n++) {
    int fd = open(try_path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      r->json = fdopen(fd, "w");
      if (r->json == NULL) close(fd);
      break;
    }
    if (errno != EEXIST || n == 10000) break;
    snprintf(try_path, sizeof try_path, "%s.%d", path, n);
  }
  if (r->json == NULL) {
    printf("# skipping json output; %s not accessible\n", try_path);
    return;
  }
  printf("# Writing JSON output to %s\n", try_path);
  r->json_depth = 0;
  r->json_more[0] = 0;
  json_open(r, '{');
  json_key(r, "version");
  json_int(r, 3);
  json_key(r, "start_time");
  json_now(r);
  json_key(r, "args");
  json_open(r, '[');
  for (int i = 0; i < argc; i++) json_str(r, argv[i]);
  json_close(r);
  json_key(r, "env");
  json_open(r, '[');
  for (char **e = environ; e != NULL && *e != NULL; e++)
    if (env_listed(*e)) json_str(r, *e);
  json_close(r);
  int version = 0;
  weftGetVersion(&version);
  json_key(r, "nccl_version");
  json_int(r, version);
}

/* --- The header ----------------------------------------------------------- */

static void header_json(struct perf_report *r, const struct perf_rank_info *ranks) {
  const struct perf_opts *o = r->o;
  json_key(r, "config");
  json_open(r, '{');
  json_key(r, "nthreads"), json_int(r, 1);
  json_key(r, "ngpus"), json_int(r, 1);
  json_key(r, "minimum_bytes"), json_int(r, (long long)o->min_nbytes);
  json_key(r, "maximum_bytes"), json_int(r, (long long)o->max_nbytes);
  if (o->step_factor > 1) {
    json_key(r, "step_factor");
    json_sep(r);
    fprintf(r->json, "%.17g", o->step_factor);
  } else {
    json_key(r, "step_bytes"), json_int(r, (long long)o->step_nbytes);
  }
  json_key(r, "warmup_iters"), json_int(r, o->warmup);
  json_key(r, "iterations"), json_int(r, o->iters);
  json_key(r, "aggregated_iterations"), json_int(r, o->agg_iters);
  json_key(r, "validation"), json_int(r, o->check);
  json_key(r, "graph"), json_int(r, 0); /* what runs: -G is noted and ignored */
  json_key(r, "blocking_collectives"), json_bool(r, o->blocking != PERF_BLOCK_NONE);
  json_key(r, "per_iter_timing"), json_bool(r, o->per_iter);
  json_key(r, "per_iter_skip"), json_int(r, o->per_iter_skip);
  json_key(r, "parallel_init"), json_bool(r, o->parallel_init);
  json_key(r, "devices");
  json_open(r, '[');
  for (int i = 0; i < r->nranks; i++) {
    json_open(r, '{');
    json_key(r, "rank"), json_int(r, i);
    json_key(r, "group"), json_int(r, ranks[i].group);
    json_key(r, "pid"), json_int(r, ranks[i].pid);
    json_key(r, "hostname"), json_str(r, ranks[i].host);
    json_key(r, "device"), json_int(r, ranks[i].device);
    json_key(r, "device_hex"), json_str(r, ranks[i].where);
    json_key(r, "device_info"), json_str(r, ranks[i].name);
    json_close(r);
  }
  json_close(r);
  json_close(r);
  json_key(r, "results");
  json_open(r, '[');
}

/* weft's notes: flags taken that do nothing here, and why */
static void print_notes(const struct perf_opts *o) {
  if (o->graph_iters > 0)
    printf("# -G %d ignored: operations run on the host executor, which has no CUDA graphs\n",
           o->graph_iters);
  if (o->parallel_init)
    printf("# -p 1 ignored: each rank is a process of its own, which initializes by itself\n");
  if (o->cta_policy >= 0) printf("# -x %d ignored: weft has no CTA policy\n", o->cta_policy);
  if (o->local_register == PERF_REG_SYMMETRIC)
    printf("# -R 2: weft has no symmetric windows; buffers registered as with -R 1\n");
  if (o->stream_null && o->blocking == PERF_BLOCK_NONE)
    printf("# -y 1: operations on the NULL stream, each done when its call returns\n");
  if (o->json_ignored != NULL)
    printf("# -J %s ignored: only a name that ends .json is written\n", o->json_ignored);
}

/* The bound's figures, or why there are none. */
static void print_bound(const struct perf_opts *o, const struct perf_bound *b, int nranks) {
  if (b == NULL) {
    if (o->bound) printf("# Bound: not measured (only for host memory)\n");
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
  printf("#   measured in %.2f s (-B 1)\n", b->measure_s);
}

/* The column heads: nccl-tests' (with -I's and -S's), then the bound's. */
static void print_heads(const struct perf_opts *o) {
  const char *t = o->cputime ? "cputime" : "time";
  const int ts_pad = o->timestamps ? 19 : 0;
  const char *ts_label = o->timestamps ? "timestamp" : "";
  const char *ts_format = o->timestamps ? "%Y-%m-%d %H:%M:%S" : "";
  const char *bound_title = o->bound ? "           bound: out-of-place, in-place" : "";
  printf("#\n");
  if (o->per_iter) {
    printf("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)         "
           "                       in-place (+ per-iteration)%s\n",
           "", "", "", "", "", bound_title);
    static const char heads[] = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  "
                                "%7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s %*s";
    printf(heads, "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong",
           "i_min", "i_max", "i_p99", "i_cv%", t, "algbw", "busbw", "#wrong", "i_min", "i_max",
           "i_p99", "i_cv%", ts_pad, ts_label);
    if (o->bound) printf("  %8s  %6s  %8s  %6s", "time", "%", "time", "%");
    printf("\n");
    printf(heads, "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
           "(us)", "(us)", "(%)", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)",
           ts_pad, ts_format);
  } else {
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
           "          %s\n",
           "", "", "", "", "", bound_title);
    static const char heads[] =
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s";
    printf(heads, "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", t,
           "algbw", "busbw", "#wrong", ts_pad, ts_label);
    if (o->bound) printf("  %8s  %6s  %8s  %6s", "time", "%", "time", "%");
    printf("\n");
    printf(heads, "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
           "(GB/s)", "(GB/s)", "", ts_pad, ts_format);
  }
  if (o->bound) printf("  %8s  %6s  %8s  %6s", "(us)", "", "(us)", "");
  printf("\n");
}

void perf_report_header(struct perf_report *r, const struct perf_rank_info *ranks,
                        const struct perf_bound *bound) {
  const struct perf_opts *o = r->o;
  int version = 0;
  weftGetVersion(&version);
  printf("# nccl-tests version %s nccl-headers=%d nccl-library=%d\n", PERF_NCCL_TESTS_VERSION,
         WEFT_VERSION_CODE, version);
  printf("# Collective test starting: %s\n", r->prog);
  /* the step as nccl-tests prints it; a fractional factor as it was given */
  char step[48];
  if (o->step_factor > 1) snprintf(step, sizeof step, "%g(factor)", o->step_factor);
  else snprintf(step, sizeof step, "%zu(bytes)", o->step_nbytes);
  /* graph: the launches that run, none (weft's note below says -G N was
   * ignored) */
  printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d "
         "agg iters: %d validation: %d graph: 0 unalign: %d\n",
         o->min_nbytes, o->max_nbytes, step, o->warmup, o->iters, o->agg_iters, o->check,
         o->unalign);
  if (o->blocking == PERF_BLOCK_BARRIER)
    printf("# Blocking Enabled: wait and barrier after each inner iteration (-m) \n");
  if (o->blocking == PERF_BLOCK_WAIT)
    printf("# Blocking Enabled: wait after each inner iteration (-m), no barrier \n");
  if (o->blocking == PERF_BLOCK_OUTER)
    printf("# Blocking Enabled: wait and barrier after each outer iteration (-n); time "
           "excludes barrier \n");
  if (o->per_iter) {
    printf("# Per-Iteration Report: host clock timing; i_* uses max over process rows");
    if (o->per_iter_skip) printf("; summary skips first %d iterations", o->per_iter_skip);
    printf(" \n");
  }
  printf("#\n# Using devices\n");
  for (int i = 0; i < r->nranks; i++)
    printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n", i, ranks[i].group,
           ranks[i].pid, ranks[i].host, ranks[i].device, ranks[i].where, ranks[i].name);
  print_notes(o);
  print_bound(o, bound, r->nranks);
  print_heads(o);
  fflush(stdout);
  if (r->json != NULL) header_json(r, ranks);
}

/* --- Rows ---------------------------------------------------------------- */

/* A side's nccl-tests columns: time, algbw, busbw, #wrong (%6g, or N/A
 * where not checked). */
static void print_side(const struct perf_opts *o, const struct perf_result *s) {
  char t[8], alg[7], bus[7];
  perf_format_float(s->time_us, 7, t);
  perf_format_float(s->algbw, 6, alg);
  perf_format_float(s->busbw, 6, bus);
  if (s->checked) printf("  %7s  %6s  %6s  %6g", t, alg, bus, (double)s->wrong);
  else printf("  %7s  %6s  %6s    N/A", t, alg, bus);
  if (o->per_iter) {
    char mn[8], mx[8], p99[8], cv[8];
    perf_format_float(s->stats.min * 1e6, 7, mn);
    perf_format_float(s->stats.max * 1e6, 7, mx);
    perf_format_float(s->stats.p99 * 1e6, 7, p99);
    perf_format_float(s->stats.cv_pct, 7, cv);
    printf("  %7s  %7s  %7s  %7s", mn, mx, p99, cv);
  }
}

static void print_bound_cols(const struct perf_result *s) {
  if (isnan(s->bound_us)) printf("  %8s  %6s", "N/A", "N/A");
  else printf("  %8.3f  %6.1f", s->bound_us, s->bound_pct);
}

static void json_side(struct perf_report *r, const char *key, const struct perf_result *s) {
  const struct perf_opts *o = r->o;
  json_key(r, key);
  json_open(r, '{');
  json_key(r, o->cputime ? "cpu_time" : "time"), json_double(r, s->time_us);
  json_key(r, "alg_bw"), json_double(r, s->algbw);
  json_key(r, "bus_bw"), json_double(r, s->busbw);
  json_key(r, "nwrong");
  if (s->checked) json_double(r, (double)s->wrong);
  else json_null(r);
  /* weft's: the bound, also as the busbw the row would have at the bound's time */
  const int have = !isnan(s->bound_us);
  json_key(r, "bound_us"), json_double(r, have ? s->bound_us : NAN);
  json_key(r, "bound_bus_bw"), json_double(r, have ? s->busbw * s->time_us / s->bound_us : NAN);
  json_key(r, "bound_pct"), json_double(r, have ? s->bound_pct : NAN);
  json_key(r, "bound_by");
  if (have) json_str(r, s->bound_by_copy ? "copy" : "round_trip");
  else json_null(r);
  json_close(r);
  if (!o->per_iter || s->iter_s == NULL) return;
  char per_iter_key[32];
  snprintf(per_iter_key, sizeof per_iter_key, "%s_per_iter", key);
  json_key(r, per_iter_key);
  json_open(r, '{');
  const struct perf_iter_stats *st = &s->stats;
  json_key(r, "skipped_iterations"), json_int(r, o->per_iter_skip);
  json_key(r, "min_us"), json_double(r, st->min * 1e6);
  json_key(r, "max_us"), json_double(r, st->max * 1e6);
  json_key(r, "avg_us"), json_double(r, st->avg * 1e6);
  json_key(r, "p50_us"), json_double(r, st->p50 * 1e6);
  json_key(r, "p95_us"), json_double(r, st->p95 * 1e6);
  json_key(r, "p99_us"), json_double(r, st->p99 * 1e6);
  json_key(r, "stdev_us"), json_double(r, st->stdev * 1e6);
  json_key(r, "cv_pct"), json_double(r, st->cv_pct);
  json_key(r, "times_us");
  json_open(r, '[');
  for (int i = 0; i < o->iters; i++) json_double(r, s->iter_s[i] * 1e6);
  json_close(r);
  if (r->nranks > 1 && s->rank_iter_s != NULL) {
    json_key(r, "per_process_max_times_us");
    json_open(r, '[');
    for (int p = 0; p < r->nranks; p++) {
      json_open(r, '[');
      for (int i = 0; i < o->iters; i++) json_double(r, s->rank_iter_s[p * o->iters + i] * 1e6);
      json_close(r);
    }
    json_close(r);
  }
  json_close(r);
}

void perf_report_row(struct perf_report *r, const struct perf_row *row) {
  const struct perf_opts *o = r->o;
  const char *op = r->coll->op_column ? r->coll->op_column : perf_op_name(row->op);
  char root[16];
  snprintf(root, sizeof root, "%6i", row->root);
  printf("%12zu  %12zu  %8s  %6s  %6s", row->nbytes, row->count, perf_type_name(row->type), op,
         root);
  print_side(o, &row->oop);
  print_side(o, &row->ip);
  if (o->timestamps) {
    char now[64];
    const time_t t = time(NULL);
    strftime(now, sizeof now, "%Y-%m-%d %H:%M:%S", localtime(&t));
    printf("%21s", now);
  }
  if (o->bound) {
    print_bound_cols(&row->oop);
    print_bound_cols(&row->ip);
  }
  printf("\n");
  fflush(stdout);
  if (r->json == NULL) return;
  json_open(r, '{');
  json_key(r, "size"), json_int(r, (long long)row->nbytes);
  json_key(r, "count"), json_int(r, (long long)row->count);
  json_key(r, "type"), json_str(r, perf_type_name(row->type));
  json_key(r, "redop"), json_str(r, op);
  json_key(r, "root"), json_str(r, root);
  json_side(r, "out_of_place", &row->oop);
  json_side(r, "in_place", &row->ip);
  json_key(r, "actual_iterations"), json_int(r, o->iters);
  json_key(r, "experiment_name"), json_str(r, "");
  json_close(r);
}

/* --- The footer ------------------------------------------------------------ */

/* nccl-tests' amounts: B, KB, MB or GB (of 1024), 2 decimals under 10, 1 under 100 */
static void format_mem(int64_t nbytes, char *buf, size_t len) {
  double v = (double)nbytes;
  const char *unit = " B";
  if (fabs(v) >= 1024.0 * 1024 * 1024) unit = " GB", v /= 1024.0 * 1024 * 1024;
  else if (fabs(v) >= 1024.0 * 1024) unit = " MB", v /= 1024.0 * 1024;
  else if (fabs(v) >= 1024.0) unit = " KB", v /= 1024.0;
  const int digits = fabs(v) < 10.0 ? 2 : fabs(v) < 100.0 ? 1 : 0;
  snprintf(buf, len, "%.*f%s", digits, v, unit);
}

void perf_report_footer(struct perf_report *r, long long errors, double avg_busbw,
                        double min_busbw, const struct perf_mem_usage *mem) {
  if (r->json != NULL) json_close(r); /* the results */
  const int bw_ok = !(avg_busbw < min_busbw * 0.9);
  printf("# %-20s : %lld %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
  printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg_busbw,
         min_busbw == -1 ? "" : bw_ok ? "OK" : "FAILED");
  printf("#\n# Collective test concluded: %s\n", r->prog);
  if (mem != NULL) {
    /* nccl-tests' label names the GPU; host memory is named for what it is */
    char init[32], buffers[32], coll[32], total[32];
    format_mem(mem->init_nbytes, init, sizeof init);
    format_mem(mem->buffer_nbytes, buffers, sizeof buffers);
    format_mem(mem->coll_nbytes, coll, sizeof coll);
    format_mem(mem->init_nbytes + mem->buffer_nbytes + mem->coll_nbytes, total, sizeof total);
    printf("# %-20s : Initialization %s | User-Allocated %s | Collective %s | Total  %s\n",
           r->o->mem_kind == PERF_MEM_CUDA ? "GPU memory usage" : "Host memory usage", init,
           buffers, coll, total);
  }
  printf("#\n\n");
  fflush(stdout);
  if (r->json == NULL) return;
  json_key(r, "out_of_bounds");
  json_open(r, '{');
  json_key(r, "count"), json_int(r, errors);
  json_key(r, "okay"), json_bool(r, errors == 0);
  json_close(r);
  json_key(r, "average_bus_bandwidth");
  json_open(r, '{');
  json_key(r, "bandwidth"), json_double(r, avg_busbw);
  json_key(r, "okay");
  if (min_busbw == -1) json_str(r, "unchecked");
  else json_bool(r, bw_ok);
  json_close(r);
  json_key(r, "errors");
  json_open(r, '[');
  json_close(r);
}

int perf_report_close(struct perf_report *r, const struct perf_bound *b, int complete) {
  if (r->json == NULL) return 0;
  /* what a failure left open: a key without its value, a row, the results */
  if (r->json_after_key) json_null(r);
  while (r->json_depth > 1) json_close(r);
  json_key(r, "weft");
  json_open(r, '{');
  json_key(r, "tool"), json_str(r, r->prog);
  json_key(r, "collective"), json_str(r, r->coll->name);
  json_key(r, "nranks"), json_int(r, r->nranks);
  json_key(r, "memory"), json_str(r, perf_mem_name(r->o->mem_kind));
  json_key(r, "blocking"), json_int(r, r->o->blocking);
  json_key(r, "complete"), json_bool(r, complete);
  json_key(r, "bound");
  if (b == NULL) {
    json_null(r);
  } else {
    json_open(r, '{');
    json_key(r, "round_trip_us"), json_double(r, b->have_round_trip ? b->round_trip_us : NAN);
    if (b->have_round_trip) {
      json_key(r, "round_trip_cpus");
      json_open(r, '[');
      json_int(r, b->cpus[0]);
      json_int(r, b->cpus[1]);
      json_close(r);
    }
    json_key(r, "copy_rw_GBps"), json_double(r, b->have_copy ? b->copy_rw_GBps : NAN);
    if (b->have_copy) json_key(r, "copy_nbytes"), json_int(r, (long long)b->copy_nbytes);
    json_key(r, "why"), json_str(r, b->why);
    json_key(r, "measure_s"), json_double(r, b->measure_s);
    json_close(r);
  }
  json_close(r);
  json_key(r, "end_time");
  json_now(r);
  json_close(r);
  fputc('\n', r->json);
  const int failed = ferror(r->json) | (fclose(r->json) != 0);
  r->json = NULL;
  return failed ? -1 : 0;
}
