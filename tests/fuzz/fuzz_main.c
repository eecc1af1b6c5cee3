/* The fuzzing driver (fuzz.h): corpus first, then seeded mutations. */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#include <sanitizer/common_interface_defs.h>
#define FUZZ_HAVE_SANITIZER 1
#endif

#define FUZZ_MAX_INPUT 65536
#define FUZZ_MAX_CORPUS 4096
#define FUZZ_HANG_S 20 /* one input running longer than this is a hang */

struct input {
  uint8_t *data;
  size_t nbytes;
};

static struct input corpus[FUZZ_MAX_CORPUS];
static int ncorpus;
static const char *out_dir = ".";
static uint64_t run_seed;
static uint64_t run_index;
/* the input being run, kept for the failure handlers */
static uint8_t current[FUZZ_MAX_INPUT];
static size_t current_nbytes;

static uint64_t rng_state;
static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static size_t rng_below(size_t n) { return n ? (size_t)(rng_next() % n) : 0; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Writes the current input to out_dir; async-signal-safe calls only. */
static void save_current(const char *why) {
  char path[4096];
  snprintf(path, sizeof path, "%s/fuzz-%s-seed%llu-run%llu.bin", out_dir, fuzz_target_name,
           (unsigned long long)run_seed, (unsigned long long)run_index);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ssize_t w = write(fd, current, current_nbytes);
    (void)w;
    close(fd);
  }
  char msg[4400];
  int n = snprintf(msg, sizeof msg, "fuzz %s: %s on run %llu (seed %llu); input (%zu bytes) in %s\n",
                   fuzz_target_name, why, (unsigned long long)run_index,
                   (unsigned long long)run_seed, current_nbytes, path);
  if (n > 0) {
    ssize_t w = write(2, msg, (size_t)n);
    (void)w;
  }
}

#ifdef FUZZ_HAVE_SANITIZER
static void on_death(void) { save_current("sanitizer report"); }
#endif

static void on_signal(int sig) {
  save_current(sig == SIGALRM ? "hang" : "crash");
  signal(sig, SIG_DFL);
  if (sig == SIGALRM) _exit(3);
  raise(sig);
}

void fuzz_split(const uint8_t *data, size_t nbytes, const char *sep,
                void (*fn)(const uint8_t *part, size_t nbytes, int index, void *ctx), void *ctx) {
  size_t seplen = strlen(sep), start = 0;
  int index = 0;
  for (size_t i = 0; i + seplen <= nbytes;) {
    if (memcmp(data + i, sep, seplen) == 0) {
      fn(data + start, i - start, index++, ctx);
      i += seplen;
      start = i;
    } else {
      i++;
    }
  }
  fn(data + start, nbytes - start, index, ctx);
}

static int corpus_add_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "fuzz %s: %s: %s\n", fuzz_target_name, path, strerror(errno));
    return -1;
  }
  uint8_t *buf = malloc(FUZZ_MAX_INPUT);
  size_t n = buf ? fread(buf, 1, FUZZ_MAX_INPUT, f) : 0;
  fclose(f);
  if (buf == NULL || ncorpus == FUZZ_MAX_CORPUS) {
    free(buf);
    return 0;
  }
  corpus[ncorpus++] = (struct input){buf, n};
  return 0;
}

static int corpus_add(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "fuzz %s: %s: %s\n", fuzz_target_name, path, strerror(errno));
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) return corpus_add_file(path);
  struct dirent **names;
  int n = scandir(path, &names, NULL, alphasort); /* sorted: the same order every run */
  if (n < 0) return -1;
  int rc = 0;
  for (int i = 0; i < n; i++) {
    char file[4096];
    snprintf(file, sizeof file, "%s/%s", path, names[i]->d_name);
    if (names[i]->d_name[0] != '.' && rc == 0) rc = corpus_add_file(file);
    free(names[i]);
  }
  free(names);
  return rc;
}

/* One mutation of buf (n bytes, capacity FUZZ_MAX_INPUT); returns the new size. */
static size_t mutate_once(uint8_t *buf, size_t n) {
  static const int64_t interesting[] = {0, 1, -1, 2, 16, 64, 127, 128, 255, 256, 4096, 65535,
                                        65536, 0x7fffffff, -0x7fffffffLL - 1, 0xffffffffLL,
                                        0x7fffffffffffffffLL};
  switch (rng_below(9)) {
    case 0: /* flip a bit */
      if (n) buf[rng_below(n)] ^= (uint8_t)(1u << rng_below(8));
      return n;
    case 1: /* a random byte */
      if (n) buf[rng_below(n)] = (uint8_t)rng_next();
      return n;
    case 2: { /* an interesting value, 1, 2, 4 or 8 bytes wide */
      size_t w = (size_t)1 << rng_below(4);
      if (n < w) return n;
      int64_t v = interesting[rng_below(sizeof interesting / sizeof interesting[0])];
      memcpy(buf + rng_below(n - w + 1), &v, w);
      return n;
    }
    case 3: { /* insert random bytes */
      size_t k = 1 + rng_below(16);
      if (n + k > FUZZ_MAX_INPUT) return n;
      size_t at = rng_below(n + 1);
      memmove(buf + at + k, buf + at, n - at);
      for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)rng_next();
      return n + k;
    }
    case 4: { /* delete a range */
      if (n == 0) return n;
      size_t at = rng_below(n), k = 1 + rng_below(n - at < 32 ? n - at : 32);
      memmove(buf + at, buf + at + k, n - at - k);
      return n - k;
    }
    case 5: { /* copy a range over another place */
      if (n < 2) return n;
      size_t from = rng_below(n), to = rng_below(n), k = 1 + rng_below(32);
      if (from + k > n) k = n - from;
      if (to + k > n) k = n - to;
      memmove(buf + to, buf + from, k);
      return n;
    }
    case 6: /* truncate */
      return n ? rng_below(n) : 0;
    case 7: { /* splice in part of another corpus entry */
      const struct input *o = &corpus[rng_below((size_t)ncorpus)];
      if (o->nbytes == 0) return n;
      size_t from = rng_below(o->nbytes), k = 1 + rng_below(o->nbytes - from);
      size_t at = rng_below(n + 1);
      if (at + k > FUZZ_MAX_INPUT) k = FUZZ_MAX_INPUT - at;
      memcpy(buf + at, o->data + from, k);
      return at + k > n ? at + k : n;
    }
    default: { /* an ASCII digit, sign or separator: text formats */
      static const char text[] = "0123456789-+ ,;:^\n\t=x.e";
      if (n) buf[rng_below(n)] = (uint8_t)text[rng_below(sizeof text - 1)];
      return n;
    }
  }
}

static int run_one(const uint8_t *data, size_t n) {
  memcpy(current, data, n);
  current_nbytes = n;
  alarm(FUZZ_HANG_S);
  int rc = fuzz_one(current, current_nbytes);
  alarm(0);
  if (rc != 0) save_current("the target reported a failure");
  run_index++;
  return rc;
}

int main(int argc, char **argv) {
  double budget_s = 10;
  uint64_t max_runs = UINT64_MAX;
  int have_seed = 0;
  /* options anywhere (a later one wins), everything else is corpus */
  for (int i = 1; i < argc; i++) {
    const char *opt = argv[i];
    if (opt[0] == '-' && i + 1 < argc) {
      const char *val = argv[++i];
      if (strcmp(opt, "-seed") == 0) run_seed = strtoull(val, NULL, 0), have_seed = 1;
      else if (strcmp(opt, "-time") == 0) budget_s = atof(val);
      else if (strcmp(opt, "-runs") == 0) max_runs = strtoull(val, NULL, 0);
      else if (strcmp(opt, "-out") == 0) out_dir = val;
      else opt = NULL;
      if (opt != NULL) continue;
    }
    if (argv[i][0] == '-') {
      fprintf(stderr, "usage: %s [-seed N] [-time S] [-runs N] [-out DIR] CORPUS...\n", argv[0]);
      return 2;
    }
    if (corpus_add(argv[i]) != 0) return 2;
  }
  if (ncorpus == 0) {
    fprintf(stderr, "fuzz %s: empty corpus\n", fuzz_target_name);
    return 2;
  }
  if (!have_seed) run_seed = (uint64_t)time(NULL);
  rng_state = run_seed;
#ifdef FUZZ_HAVE_SANITIZER
  __sanitizer_set_death_callback(on_death);
#endif
  signal(SIGALRM, on_signal);
  signal(SIGSEGV, on_signal);
  signal(SIGBUS, on_signal);
  signal(SIGPIPE, SIG_IGN); /* peers that close early are part of the game */
  if (fuzz_init() != 0) {
    fprintf(stderr, "fuzz %s: the target could not start\n", fuzz_target_name);
    return 1;
  }
  printf("fuzz %s: seed %llu, %d corpus file(s), %.0f s\n", fuzz_target_name,
         (unsigned long long)run_seed, ncorpus, budget_s);
  fflush(stdout);
  double t0 = now_s();
  for (int c = 0; c < ncorpus; c++)
    if (run_one(corpus[c].data, corpus[c].nbytes) != 0) return 1;
  static uint8_t buf[FUZZ_MAX_INPUT];
  uint64_t mutated = 0;
  while (run_index < max_runs && now_s() - t0 < budget_s) {
    const struct input *base = &corpus[rng_below((size_t)ncorpus)];
    memcpy(buf, base->data, base->nbytes);
    size_t n = base->nbytes;
    for (size_t k = 1 + rng_below(4); k > 0; k--) n = mutate_once(buf, n);
    if (run_one(buf, n) != 0) return 1;
    mutated++;
  }
  printf("fuzz %s: %llu runs (%llu mutated) in %.1f s, no failure\n", fuzz_target_name,
         (unsigned long long)run_index, (unsigned long long)mutated, now_s() - t0);
  for (int c = 0; c < ncorpus; c++) free(corpus[c].data);
  return 0;
}
