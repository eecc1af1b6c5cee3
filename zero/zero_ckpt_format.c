/* Checkpoint format 5: checksums, the manifest's text, shard headers, and the
 * checks a checkpoint passes before anything of it is used (zero_ckpt_format.h).
 * Every size read from a file is bounded by the file's length before it is
 * used to allocate or to index. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zero_ckpt_format.h"

/* The shard headers and data, and the consolidated file, are written as the
 * host holds them: little-endian, as the format says, on every host weft
 * builds for (x86-64, AArch64); a big-endian one would need byte swaps. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoint files are little-endian: a big-endian host needs byte swaps");

/* --- CRC-32C, eight bytes at a time ---------------------------------------- */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_tables_build(void) {
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    crc_table[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; b++)
    for (int t = 1; t < 8; t++)
      crc_table[t][b] = (crc_table[t - 1][b] >> 8) ^ crc_table[0][crc_table[t - 1][b] & 0xff];
}

uint32_t zero_crc32c_sw(uint32_t crc, const void *buf, size_t nbytes) {
  pthread_once(&crc_once, crc_tables_build);
  const unsigned char *p = buf;
  crc = ~crc;
  while (nbytes >= 8) {
    uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                         (uint32_t)p[3] << 24);
    crc = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
          crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
          crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
    p += 8;
    nbytes -= 8;
  }
  while (nbytes-- > 0) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

#if defined(__x86_64__)
/* SSE 4.2's crc32 instruction computes CRC-32C, eight bytes per instruction. */
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *buf,
                                                                size_t nbytes) {
  const unsigned char *p = buf;
  uint64_t c = ~crc;
  while (nbytes >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    nbytes -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (nbytes-- > 0) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return ~c32;
}
#endif

uint32_t zero_crc32c(uint32_t crc, const void *buf, size_t nbytes) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return crc32c_sse42(crc, buf, nbytes);
#endif
  return zero_crc32c_sw(crc, buf, nbytes);
}

/* --- sizes ----------------------------------------------------------------- */

int ckpt_shard_payload(const size_t *counts, int nlayers, int nranks, int rank, int arrays,
                       uint64_t *nbytes_out) {
  uint64_t total = 0;
  for (int i = 0; i < nlayers; i++) {
    if (counts[i] > SIZE_MAX - (size_t)nranks) return -1; /* weftZeroPadded would wrap */
    uint64_t part;
    if (__builtin_mul_overflow((uint64_t)weftZeroShardOf(counts[i], nranks, rank).count,
                               (uint64_t)arrays * sizeof(float), &part) ||
        __builtin_add_overflow(total, part, &total))
      return -1;
  }
  if (total > (uint64_t)INT64_MAX - sizeof(struct ckpt_shard_header)) return -1; /* an off_t */
  *nbytes_out = total;
  return 0;
}

weftResult_t ckpt_run_id_new(uint8_t run_out[16]) {
  size_t got = 0;
  while (got < 16) {
    ssize_t r = getrandom(run_out + got, 16 - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return zero_fail(weftSystemError, "no random bytes for a run identity: %s",
                                 strerror(errno));
    got += (size_t)r;
  }
  return weftSuccess;
}

static void hex_format(const uint8_t *bytes, int n, char *out) {
  for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", bytes[i]);
}

static int hex_parse(const char *s, uint8_t *bytes, int n) {
  if (strlen(s) != (size_t)(2 * n)) return -1;
  for (int i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1 || !isxdigit((unsigned char)s[2 * i]) ||
        !isxdigit((unsigned char)s[2 * i + 1]))
      return -1;
    bytes[i] = (uint8_t)v;
  }
  return 0;
}

static int all_hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isxdigit((unsigned char)s[i])) return 0;
  return 1;
}

/* --- the manifest ---------------------------------------------------------- */

void ckpt_manifest_free(struct ckpt_manifest *m) {
  free(m->params);
  m->params = NULL;
  free(m->counts);
  free(m->shard_nbytes);
  free(m->shard_crc);
  m->counts = NULL;
  m->shard_nbytes = NULL;
  m->shard_crc = NULL;
}

/* A growing text buffer. */
struct text {
  char *buf;
  size_t len, cap;
  int failed;
};

__attribute__((format(printf, 2, 3))) static void text_add(struct text *t, const char *fmt, ...) {
  if (t->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf == NULL ? NULL : t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = 1;
      return;
    }
    if ((size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = 2 * t->cap + (size_t)n + 256;
    char *grown = realloc(t->buf, cap);
    if (grown == NULL) {
      t->failed = 1;
      return;
    }
    t->buf = grown;
    t->cap = cap;
  }
}

weftResult_t ckpt_manifest_format(const struct ckpt_manifest *m, char **text_out,
                                  size_t *len_out) {
  struct text t = {0};
  char run[33];
  hex_format(m->run, 16, run);
  const struct ckpt_hyper *h = &m->hyper;
  text_add(&t, "%s\nrun %s\nnranks %d\nstage %d\noptimizer %s\nstep %ld\nloss_scale %.17g\n"
               "loss_scaled %d\nupdates %ld\ngood_steps %d\n",
           CKPT_FORMAT, run, m->nranks, m->stage, m->optimizer, m->step, m->loss_scale,
           m->loss_scaled, m->updates, m->good_steps);
  text_add(&t, "lr %.17g\nbeta1 %.17g\nbeta2 %.17g\neps %.17g\nmomentum %.17g\n"
               "weight_decay %.17g\nmax_grad_norm %.17g\naccum_steps %d\n",
           h->lr, h->beta1, h->beta2, h->eps, h->momentum, h->weight_decay, h->max_grad_norm,
           h->accum_steps);
  text_add(&t, "layers %d\nparams %zu\n", m->nlayers, m->nparams);
  for (int i = 0; i < m->nlayers; i++) text_add(&t, "layer %d %zu\n", i, m->counts[i]);
  for (size_t k = 0; k < m->nparams; k++)
    text_add(&t, "param %zu %d %zu %.17g\n", k, m->params[k].layer, m->params[k].count,
             m->params[k].weight_decay);
  for (int q = 0; q < m->nranks; q++)
    text_add(&t, "shard %d %" PRIu64 " %08" PRIx32 "\n", q, m->shard_nbytes[q], m->shard_crc[q]);
  text_add(&t, "state %" PRIu64 " %08" PRIx32 "\n", m->state_nbytes, m->state_crc);
  if (!t.failed) text_add(&t, "crc32c %08" PRIx32 "\n", zero_crc32c(0, t.buf, t.len));
  if (t.failed) {
    free(t.buf);
    return zero_fail(weftSystemError, "out of memory for the manifest");
  }
  *text_out = t.buf;
  *len_out = t.len;
  return weftSuccess;
}

/* Reads a whole regular file of at most max_nbytes (NUL-terminated copy). */
static weftResult_t file_read_bounded(const char *path, size_t max_nbytes, char **buf_out,
                                      size_t *len_out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return zero_fail(weftSystemError, "cannot open %s: %s", path, strerror(errno));
  weftResult_t res = weftSuccess;
  struct stat st;
  char *buf = NULL;
  if (fstat(fd, &st) != 0) {
    res = zero_fail(weftSystemError, "cannot stat %s: %s", path, strerror(errno));
    goto close_fd;
  }
  if (!S_ISREG(st.st_mode)) {
    res = zero_fail(weftInvalidUsage, "%s is not a regular file", path);
    goto close_fd;
  }
  if ((uint64_t)st.st_size > max_nbytes) {
    res = zero_fail(weftInvalidUsage, "%s is %lld bytes, more than the %zu a checkpoint has",
                    path, (long long)st.st_size, max_nbytes);
    goto close_fd;
  }
  size_t len = (size_t)st.st_size;
  buf = malloc(len + 1);
  if (buf == NULL) {
    res = zero_fail(weftSystemError, "out of memory for %s", path);
    goto close_fd;
  }
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  char extra;
  if (got != len || read(fd, &extra, 1) != 0) {
    res = zero_fail(weftSystemError, "%s changed while it was read", path);
    free(buf);
    goto close_fd;
  }
  buf[len] = '\0';
  *buf_out = buf;
  *len_out = len;
close_fd:
  close(fd);
  return res;
}

/* The next line of [*cur, end), NUL-terminated in place; NULL at the end. */
static char *line_next(char **cur, char *end) {
  if (*cur >= end) return NULL;
  char *line = *cur, *nl = memchr(line, '\n', (size_t)(end - line));
  if (nl == NULL) return NULL; /* every line ends with a newline */
  *nl = '\0';
  *cur = nl + 1;
  return line;
}

/* "key <long>" with nothing else on the line. */
static int line_long(const char *line, const char *key, long *v) {
  size_t k = strlen(key);
  if (strncmp(line, key, k) != 0 || line[k] != ' ') return -1;
  char *e;
  errno = 0;
  long x = strtol(line + k + 1, &e, 10);
  if (errno != 0 || e == line + k + 1 || *e != '\0') return -1;
  *v = x;
  return 0;
}

static int line_int(const char *line, const char *key, int *v) {
  long x;
  if (line_long(line, key, &x) != 0 || x < INT_MIN || x > INT_MAX) return -1;
  *v = (int)x;
  return 0;
}

/* "key <double>" with nothing else on the line (any value strtod reads,
 * NaN and infinities included: a configuration may hold them where its
 * optimizer does not use them). */
static int parse_real(const char *s, double *v) {
  if (isspace((unsigned char)*s)) return -1;
  char *e;
  double x = strtod(s, &e);
  if (e == s || *e != '\0') return -1;
  *v = x;
  return 0;
}

static int line_real(const char *line, const char *key, double *v) {
  size_t k = strlen(key);
  if (strncmp(line, key, k) != 0 || line[k] != ' ') return -1;
  return parse_real(line + k + 1, v);
}

/* Format 4's hyperparameter lines, in their order. */
static int hyper_read(char **cur, char *end, struct ckpt_hyper *h) {
  const char *keys[] = {"lr", "beta1", "beta2", "eps", "momentum", "weight_decay",
                        "max_grad_norm"};
  double *vals[] = {&h->lr, &h->beta1, &h->beta2, &h->eps, &h->momentum, &h->weight_decay,
                    &h->max_grad_norm};
  char *line;
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if ((line = line_next(cur, end)) == NULL || line_real(line, keys[i], vals[i]) != 0) return -1;
  if ((line = line_next(cur, end)) == NULL || line_int(line, "accum_steps", &h->accum_steps) != 0 ||
      h->accum_steps < 1)
    return -1;
  return 0;
}

/* A decimal uint64 that is all digits (no sign, no spaces) up to end. */
static int parse_u64(const char *s, char **end, uint64_t *v) {
  if (*s < '0' || *s > '9') return -1;
  errno = 0;
  unsigned long long x = strtoull(s, end, 10);
  if (errno != 0) return -1;
  *v = x;
  return 0;
}

#define MANIFEST_BAD(...)                                                       \
  do {                                                                          \
    res = zero_fail(weftInvalidUsage, __VA_ARGS__);                             \
    goto free_all;                                                              \
  } while (0)

weftResult_t ckpt_manifest_read(const char *ver, long step_of_name, struct ckpt_manifest *m) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/manifest", ver);
  memset(m, 0, sizeof *m);
  char *buf;
  size_t len;
  WEFT_TRY(file_read_bounded(path, CKPT_MAX_MANIFEST_NBYTES, &buf, &len));
  weftResult_t res = weftSuccess;
  char *cur = buf, *end = buf + len, *line;

  /* the format, then the checksum of everything before the last line */
  if (strncmp(buf, CKPT_FORMAT_V1 "\n", strlen(CKPT_FORMAT_V1) + 1) == 0)
    MANIFEST_BAD("%s is a format 1 checkpoint, written without checksums: this weft reads "
                 "formats 2 to 5 only (docs/zero.md)", path);
  const int v2 = strncmp(buf, CKPT_FORMAT_V2 "\n", strlen(CKPT_FORMAT_V2) + 1) == 0;
  const int v3 = strncmp(buf, CKPT_FORMAT_V3 "\n", strlen(CKPT_FORMAT_V3) + 1) == 0;
  const int is_v4 = strncmp(buf, CKPT_FORMAT_V4 "\n", strlen(CKPT_FORMAT_V4) + 1) == 0;
  const int v5 = strncmp(buf, CKPT_FORMAT "\n", strlen(CKPT_FORMAT) + 1) == 0;
  if (!v2 && !v3 && !is_v4 && !v5)
    MANIFEST_BAD("%s is not a weft ZeRO manifest (format 2, 3, 4 or 5)", path);
  const int v4 = is_v4 || v5; /* hyperparameters and parameters */
  if (len < 2 || buf[len - 1] != '\n') MANIFEST_BAD("%s is truncated", path);
  char *last = memrchr(buf, '\n', len - 1);
  last = last == NULL ? buf : last + 1;
  uint32_t want_crc;
  char tail[32];
  if (sscanf(last, "crc32c %8" SCNx32 "%1s", &want_crc, tail) != 1 || end - last != 16)
    MANIFEST_BAD("%s has no checksum line at its end (truncated, or something appended)", path);
  uint32_t crc = zero_crc32c(0, buf, (size_t)(last - buf));
  if (crc != want_crc)
    MANIFEST_BAD("%s is damaged: its checksum is %08" PRIx32 ", its content's %08" PRIx32, path,
                 want_crc, crc);
  m->crc = crc;
  end = last;

  line_next(&cur, end); /* the format */
  line = line_next(&cur, end);
  if (line == NULL || strncmp(line, "run ", 4) != 0 || hex_parse(line + 4, m->run, 16) != 0)
    MANIFEST_BAD("%s: no run identity", path);
  long step = 0, updates = 0;
  const char *opt;
  if ((line = line_next(&cur, end)) == NULL || line_int(line, "nranks", &m->nranks) != 0 ||
      (line = line_next(&cur, end)) == NULL || line_int(line, "stage", &m->stage) != 0 ||
      (line = line_next(&cur, end)) == NULL || strncmp(line, "optimizer ", 10) != 0 ||
      strlen(opt = line + 10) >= sizeof m->optimizer ||
      (line = line_next(&cur, end)) == NULL || line_long(line, "step", &step) != 0)
    MANIFEST_BAD("%s: the header lines are malformed", path);
  strcpy(m->optimizer, opt);
  line = line_next(&cur, end);
  char *e = NULL;
  if (line == NULL || strncmp(line, "loss_scale ", 11) != 0 ||
      (m->loss_scale = strtod(line + 11, &e), e == line + 11 || *e != '\0') ||
      (m->loss_scaled = -1, !v2 && ((line = line_next(&cur, end)) == NULL ||
                                    line_int(line, "loss_scaled", &m->loss_scaled) != 0)) ||
      (line = line_next(&cur, end)) == NULL || line_long(line, "updates", &updates) != 0 ||
      (line = line_next(&cur, end)) == NULL || line_int(line, "good_steps", &m->good_steps) != 0)
    MANIFEST_BAD("%s: the header lines are malformed", path);
  if (v4 && hyper_read(&cur, end, &m->hyper) != 0)
    MANIFEST_BAD("%s: the hyperparameter lines are malformed", path);
  uint64_t nparams = 0;
  if ((line = line_next(&cur, end)) == NULL || line_int(line, "layers", &m->nlayers) != 0 ||
      (v4 && ((line = line_next(&cur, end)) == NULL || strncmp(line, "params ", 7) != 0 ||
              parse_u64(line + 7, &e, &nparams) != 0 || *e != '\0')))
    MANIFEST_BAD("%s: the header lines are malformed", path);
  m->step = step;
  m->updates = updates;
  if (strcmp(m->optimizer, "adamw") == 0) m->arrays = 3;
  else if (strcmp(m->optimizer, "sgd-momentum") == 0) m->arrays = 2;
  else MANIFEST_BAD("%s: unknown optimizer '%s'", path, m->optimizer);
  if (step < 0) MANIFEST_BAD("%s: step %ld is negative", path, step);
  if (step != step_of_name)
    MANIFEST_BAD("%s: step %ld, but the directory is step %ld's", path, step, step_of_name);
  if (updates < 0 || updates > step)
    MANIFEST_BAD("%s: %ld optimizer updates in %ld steps", path, updates, step);
  if (m->good_steps < 0) MANIFEST_BAD("%s: good_steps %d is negative", path, m->good_steps);
  if (!isfinite(m->loss_scale) || m->loss_scale <= 0)
    MANIFEST_BAD("%s: loss scale %g is not a positive number", path, m->loss_scale);
  if (!v2 && m->loss_scaled != 0 && m->loss_scaled != 1)
    MANIFEST_BAD("%s: loss_scaled %d is not 0 or 1", path, m->loss_scaled);
  if (m->stage < 0 || m->stage > 3) MANIFEST_BAD("%s: stage %d is not 0-3", path, m->stage);
  /* one line per layer and per rank follows: the file's length bounds both */
  if (m->nranks < 1 || m->nranks > CKPT_MAX_RANKS || (size_t)m->nranks > len / 12)
    MANIFEST_BAD("%s: %d ranks do not fit its %zu bytes", path, m->nranks, len);
  if (m->nlayers < 1 || m->nlayers > CKPT_MAX_LAYERS || (size_t)m->nlayers > len / 10)
    MANIFEST_BAD("%s: %d layers do not fit its %zu bytes", path, m->nlayers, len);
  /* "param 0 0 1 0\n" is the shortest parameter line; each layer has one */
  if (v4 && nparams < (uint64_t)m->nlayers)
    MANIFEST_BAD("%s: %" PRIu64 " parameters cannot fill %d layers", path, nparams, m->nlayers);
  if (v4 && nparams > len / 14)
    MANIFEST_BAD("%s: %" PRIu64 " parameters do not fit its %zu bytes", path, nparams, len);
  m->nparams = (size_t)nparams;
  m->counts = calloc((size_t)m->nlayers, sizeof *m->counts);
  m->params = v4 ? calloc(m->nparams, sizeof *m->params) : NULL;
  m->shard_nbytes = calloc((size_t)m->nranks, sizeof *m->shard_nbytes);
  m->shard_crc = calloc((size_t)m->nranks, sizeof *m->shard_crc);
  if (m->counts == NULL || (v4 && m->params == NULL) || m->shard_nbytes == NULL ||
      m->shard_crc == NULL) {
    res = zero_fail(weftSystemError, "out of memory reading %s", path);
    goto free_all;
  }
  for (int i = 0; i < m->nlayers; i++) {
    char key[32];
    snprintf(key, sizeof key, "layer %d ", i);
    uint64_t c;
    line = line_next(&cur, end);
    if (line == NULL || strncmp(line, key, strlen(key)) != 0 ||
        parse_u64(line + strlen(key), &e, &c) != 0 || *e != '\0' || c > SIZE_MAX)
      MANIFEST_BAD("%s: layer %d is missing or malformed", path, i);
    m->counts[i] = (size_t)c;
  }
  /* the parameters, in order, each layer's filling it exactly */
  size_t filled = 0; /* of the layer of the last parameter */
  for (size_t k = 0; k < m->nparams; k++) {
    char key[48];
    snprintf(key, sizeof key, "param %zu ", k);
    struct ckpt_param *p = &m->params[k];
    uint64_t layer, c;
    line = line_next(&cur, end);
    if (line == NULL || strncmp(line, key, strlen(key)) != 0 ||
        parse_u64(line + strlen(key), &e, &layer) != 0 || *e != ' ' ||
        parse_u64(e + 1, &e, &c) != 0 || *e != ' ' || parse_real(e + 1, &p->weight_decay) != 0 ||
        layer >= (uint64_t)m->nlayers ||
        c == 0 || c > SIZE_MAX || !(p->weight_decay >= 0) || !isfinite(p->weight_decay))
      MANIFEST_BAD("%s: parameter %zu is missing or malformed", path, k);
    const int prev = k == 0 ? 0 : m->params[k - 1].layer;
    if (k > 0 && (int)layer == prev + 1 && filled != m->counts[prev])
      MANIFEST_BAD("%s: layer %d's parameters make %zu elements, the layer %zu", path, prev,
                   filled, m->counts[prev]);
    if ((int)layer != prev && (k == 0 || (int)layer != prev + 1))
      MANIFEST_BAD("%s: parameter %zu is in layer %" PRIu64 " after one of layer %d (layers "
                   "follow each other from 0)", path, k, layer, prev);
    if ((int)layer != prev) filled = 0;
    if (c > m->counts[layer] - filled)
      MANIFEST_BAD("%s: parameter %zu (%" PRIu64 " elements) overfills layer %" PRIu64
                   " (%zu)", path, k, c, layer, m->counts[layer]);
    filled += (size_t)c;
    p->layer = (int)layer;
    p->count = (size_t)c;
  }
  if (v4 && (m->params[m->nparams - 1].layer != m->nlayers - 1 ||
             filled != m->counts[m->nlayers - 1]))
    MANIFEST_BAD("%s: its parameters do not fill its %d layers", path, m->nlayers);
  for (int q = 0; q < m->nranks; q++) {
    char key[32];
    snprintf(key, sizeof key, "shard %d ", q);
    line = line_next(&cur, end);
    if (line == NULL || strncmp(line, key, strlen(key)) != 0 ||
        parse_u64(line + strlen(key), &e, &m->shard_nbytes[q]) != 0 || *e != ' ' ||
        strlen(e + 1) != 8 || sscanf(e + 1, "%8" SCNx32, &m->shard_crc[q]) != 1)
      MANIFEST_BAD("%s: shard %d is missing or malformed", path, q);
    uint64_t want;
    if (ckpt_shard_payload(m->counts, m->nlayers, m->nranks, q, m->arrays, &want) != 0)
      MANIFEST_BAD("%s: its layer sizes overflow", path);
    if (m->shard_nbytes[q] != want)
      MANIFEST_BAD("%s: shard %d is %" PRIu64 " bytes, its layers make %" PRIu64, path, q,
                   m->shard_nbytes[q], want);
  }
  if (v5) {
    line = line_next(&cur, end);
    if (line == NULL || strncmp(line, "state ", 6) != 0 ||
        parse_u64(line + 6, &e, &m->state_nbytes) != 0 || *e != ' ' || strlen(e + 1) != 8 ||
        !all_hex(e + 1, 8) || sscanf(e + 1, "%8" SCNx32, &m->state_crc) != 1)
      MANIFEST_BAD("%s: the state line is missing or malformed", path);
    if (m->state_nbytes > WEFT_ZERO_STATE_MAX_NBYTES)
      MANIFEST_BAD("%s: a client state of %" PRIu64 " bytes, more than the %zu a checkpoint "
                   "holds", path, m->state_nbytes, WEFT_ZERO_STATE_MAX_NBYTES);
    if (m->state_nbytes == 0 && m->state_crc != 0)
      MANIFEST_BAD("%s: an empty client state with checksum %08" PRIx32, path, m->state_crc);
  }
  if (cur != end) MANIFEST_BAD("%s: unexpected lines after the shards", path);
  free(buf);
  return weftSuccess;
free_all:
  ckpt_manifest_free(m);
  free(buf);
  return res;
}

weftResult_t ckpt_latest(const char *dir, char *ver_out, long *step_out) {
  char path[PATH_MAX + 64], *text;
  size_t len;
  snprintf(path, sizeof path, "%s/LATEST", dir);
  if (access(path, F_OK) != 0)
    return zero_fail(weftSystemError, "no checkpoint in %s: %s", dir, strerror(errno));
  WEFT_TRY(file_read_bounded(path, 64, &text, &len));
  long step = -1;
  int n = 0;
  /* "step-<n>\n", n without sign or leading zeros, as the save writes it */
  int ok = sscanf(text, "step-%ld\n%n", &step, &n) == 1 && (size_t)n == len && step >= 0 &&
           text[5] >= '0' && text[5] <= '9' && (text[5] != '0' || text[6] == '\n');
  if (ok) snprintf(ver_out, PATH_MAX, "%s/step-%ld", dir, step);
  free(text);
  if (!ok) return zero_fail(weftInvalidUsage, "%s is damaged: it does not name a step", path);
  *step_out = step;
  return weftSuccess;
}

/* --- the client state ------------------------------------------------------ */

weftResult_t ckpt_state_read(const char *ver, const struct ckpt_manifest *m, void **state_out,
                             size_t *nbytes_out) {
  if (m->state_nbytes == 0) {
    *state_out = NULL;
    *nbytes_out = 0;
    return weftSuccess;
  }
  char path[PATH_MAX + 64], *buf;
  size_t len;
  snprintf(path, sizeof path, "%s/" CKPT_STATE_FILE, ver);
  WEFT_TRY(file_read_bounded(path, WEFT_ZERO_STATE_MAX_NBYTES, &buf, &len));
  weftResult_t res = weftSuccess;
  uint32_t crc;
  if (len != m->state_nbytes)
    res = zero_fail(weftInvalidUsage, "%s is %zu bytes, the manifest's client state %" PRIu64
                    " (truncated, or something appended)", path, len, m->state_nbytes);
  else if ((crc = zero_crc32c(0, buf, len)) != m->state_crc)
    res = zero_fail(weftInvalidUsage, "%s is damaged: its checksum is %08" PRIx32 ", saved %08"
                    PRIx32, path, crc, m->state_crc);
  if (res != weftSuccess) {
    free(buf);
    return res;
  }
  *state_out = buf;
  *nbytes_out = len;
  return weftSuccess;
}

/* --- shards ---------------------------------------------------------------- */

static void shard_header_seal(struct ckpt_shard_header *h) {
  h->header_crc = zero_crc32c(0, h, offsetof(struct ckpt_shard_header, header_crc));
}

void ckpt_shard_header_fill(struct ckpt_shard_header *h, const struct ckpt_manifest *m, int rank,
                            uint64_t payload_nbytes, uint32_t payload_crc) {
  memset(h, 0, sizeof *h);
  memcpy(h->magic, CKPT_SHARD_MAGIC, sizeof h->magic);
  h->version = 2;
  h->rank = (uint32_t)rank;
  h->nranks = (uint32_t)m->nranks;
  h->arrays = (uint32_t)m->arrays;
  h->step = m->step;
  memcpy(h->run, m->run, sizeof h->run);
  h->payload_nbytes = payload_nbytes;
  h->payload_crc = payload_crc;
  shard_header_seal(h);
}

int ckpt_shard_run(const char *path, uint8_t run_out[16]) {
  struct ckpt_shard_header h;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t got = pread(fd, &h, sizeof h, 0);
  close(fd);
  if (got != (ssize_t)sizeof h || memcmp(h.magic, CKPT_SHARD_MAGIC, sizeof h.magic) != 0 ||
      zero_crc32c(0, &h, offsetof(struct ckpt_shard_header, header_crc)) != h.header_crc)
    return -1;
  memcpy(run_out, h.run, sizeof h.run);
  return 0;
}

/* Whether no value is NaN or infinite: an all-ones exponent, tested on the
 * bits without a branch per value so that the loop vectorises. */
static int all_finite(const float *vals, size_t count) {
  uint32_t special = 0;
  for (size_t i = 0; i < count; i++) {
    uint32_t bits;
    memcpy(&bits, &vals[i], sizeof bits);
    special |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
  }
  return special == 0;
}

static const char *what_array(int a) { return a == 0 ? "master weight" : "moment"; }

/* Whether no value is below zero (-0 is not): AdamW's second moments, whose
 * square root the step takes. */
static int none_negative(const float *vals, size_t count) {
  uint32_t neg = 0;
  for (size_t i = 0; i < count; i++) neg |= (uint32_t)(vals[i] < 0);
  return neg == 0;
}

#define SHARD_BAD(code, ...)                                                    \
  do {                                                                          \
    res = zero_fail(code, __VA_ARGS__);                                         \
    goto free_buf;                                                              \
  } while (0)

weftResult_t ckpt_shard_scan(const char *ver, const struct ckpt_manifest *m, int q,
                             int allow_non_finite) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/rank-%05d.bin", ver, q);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return zero_fail(weftSystemError, "cannot open %s: %s", path, strerror(errno));
  weftResult_t res = weftSuccess;
  const size_t chunk = 1u << 18; /* floats per read */
  float *buf = NULL;
  struct stat st;
  struct ckpt_shard_header h, want;
  const uint64_t total = sizeof h + m->shard_nbytes[q];
  if (fstat(fd, &st) != 0) SHARD_BAD(weftSystemError, "cannot stat %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) SHARD_BAD(weftInvalidUsage, "%s is not a regular file", path);
  if ((uint64_t)st.st_size != total)
    SHARD_BAD(weftInvalidUsage, "%s is %lld bytes, the checkpoint's layers make %" PRIu64
              " (truncated, or something appended)", path, (long long)st.st_size, total);
  if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
    SHARD_BAD(weftSystemError, "%s is unreadable", path);
  if (memcmp(h.magic, CKPT_SHARD_MAGIC, sizeof h.magic) != 0)
    SHARD_BAD(weftInvalidUsage, "%s is not a weft ZeRO shard (no header)", path);
  if (zero_crc32c(0, &h, offsetof(struct ckpt_shard_header, header_crc)) != h.header_crc)
    SHARD_BAD(weftInvalidUsage, "%s is damaged: its header's checksum does not match", path);
  if (memcmp(h.run, m->run, sizeof h.run) != 0) {
    char theirs[33], ours[33];
    hex_format(h.run, 16, theirs);
    hex_format(m->run, 16, ours);
    SHARD_BAD(weftInvalidUsage, "%s belongs to run %s, the manifest to run %s", path, theirs,
              ours);
  }
  ckpt_shard_header_fill(&want, m, q, m->shard_nbytes[q], m->shard_crc[q]);
  if (h.step != want.step)
    SHARD_BAD(weftInvalidUsage, "%s was saved at step %" PRId64 ", the manifest at step %ld",
              path, h.step, m->step);
  if (memcmp(&h, &want, sizeof h) != 0)
    SHARD_BAD(weftInvalidUsage, "%s: its header (rank %" PRIu32 " of %" PRIu32 ", %" PRIu64
              " bytes, checksum %08" PRIx32 ") is not the manifest's (rank %d of %d, %" PRIu64
              " bytes, checksum %08" PRIx32 ")", path, h.rank, h.nranks, h.payload_nbytes,
              h.payload_crc, q, m->nranks, m->shard_nbytes[q], m->shard_crc[q]);
  buf = malloc(chunk * sizeof *buf);
  if (buf == NULL) SHARD_BAD(weftSystemError, "out of memory reading %s", path);
  uint32_t crc = 0;
  off_t at = sizeof h;
  int bad_layer = -1, bad_array = 0; /* the first non-finite value, told once the CRC holds */
  size_t bad_index = 0;
  int neg_layer = -1; /* the first negative second moment (AdamW: the third array) */
  size_t neg_index = 0;
  float neg_value = 0;
  float bad_value = 0;
  for (int i = 0; i < m->nlayers; i++) {
    size_t n = weftZeroShardOf(m->counts[i], m->nranks, q).count;
    for (int a = 0; a < m->arrays; a++) {
      for (size_t done = 0; done < n;) {
        size_t k = n - done < chunk ? n - done : chunk;
        ssize_t r = pread(fd, buf, k * sizeof *buf, at);
        if (r != (ssize_t)(k * sizeof *buf)) SHARD_BAD(weftSystemError, "%s is unreadable", path);
        crc = zero_crc32c(crc, buf, k * sizeof *buf);
        if (!allow_non_finite && bad_layer < 0 && !all_finite(buf, k)) {
          size_t j = 0;
          while (isfinite(buf[j])) j++;
          bad_layer = i;
          bad_array = a;
          bad_index = done + j;
          bad_value = buf[j];
        }
        if (m->arrays == 3 && a == 2 && neg_layer < 0 && !none_negative(buf, k)) {
          size_t j = 0;
          while (!(buf[j] < 0)) j++;
          neg_layer = i;
          neg_index = done + j;
          neg_value = buf[j];
        }
        done += k;
        at += (off_t)(k * sizeof *buf);
      }
    }
  }
  if (crc != m->shard_crc[q])
    SHARD_BAD(weftInvalidUsage, "%s is damaged: its data's checksum is %08" PRIx32 ", saved %08"
              PRIx32, path, crc, m->shard_crc[q]);
  if (bad_layer >= 0)
    SHARD_BAD(weftInvalidUsage, "%s: %s %zu of layer %d is %g (non-finite values are refused "
              "unless allowed)", path, what_array(bad_array), bad_index, bad_layer,
              (double)bad_value);
  if (neg_layer >= 0)
    SHARD_BAD(weftInvalidUsage, "%s: second moment %zu of layer %d is %g (never negative: "
              "the step takes its square root)", path, neg_index, neg_layer, (double)neg_value);
free_buf:
  free(buf);
  close(fd);
  return res;
}
