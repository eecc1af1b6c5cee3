/* The token file: "WEFTTOK2", uint32 bytes per token (1), uint32 vocabulary
 * (256), uint64 token count, uint64 hash of the text's bytes, then the
 * tokens; "WEFTTOK1" files, without the hash, are read too. A byte-level
 * tokenizer makes a token of every byte, so any text trains and every
 * sample prints. */
#include "train_data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOK_MAGIC "WEFTTOK2"
#define TOK_HEADER_NBYTES 32
#define TOK1_MAGIC "WEFTTOK1" /* no hash: a header of 24 bytes */
#define TOK1_HEADER_NBYTES 24

/* What a file's header says it is. */
/* TOK_CUT: weft-train's header, with fewer or more tokens than it counts */
enum tok_kind { TOK_NONE, TOK_V1, TOK_V2, TOK_CUT };

static uint64_t data_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void data_sources_free(char **paths, int n) {
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

/* The text's files, each by its absolute path (realpath): text_path, or the
 * regular files of the default folder by name. 0, or -1 with the reason on
 * stderr. */
static int data_sources(const char *text_path, char ***paths_out, int *n_out) {
  char **paths = NULL;
  int n = 0;
  if (text_path != NULL) {
    struct stat st;
    if (stat(text_path, &st) != 0) {
      fprintf(stderr, "weft-train: --data %s: %s\n", text_path, strerror(errno));
      return -1;
    }
    if (!S_ISREG(st.st_mode)) {
      fprintf(stderr, "weft-train: --data %s: %s, not a text file\n", text_path,
              S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
      return -1;
    }
    paths = malloc(sizeof *paths);
    if (paths == NULL || (paths[0] = strdup(text_path)) == NULL) {
      free(paths);
      return -1;
    }
    n = 1;
  } else {
    DIR *dir = opendir(TRAIN_DATA_DEFAULT_DIR);
    if (dir == NULL) {
      fprintf(stderr, "weft-train: no text at %s: %s\n", TRAIN_DATA_DEFAULT_DIR, strerror(errno));
      return -1;
    }
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
      char path[4096];
      struct stat st;
      snprintf(path, sizeof path, "%s/%s", TRAIN_DATA_DEFAULT_DIR, e->d_name);
      if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
      char **grown = realloc(paths, (size_t)(n + 1) * sizeof *paths);
      if (grown == NULL) break;
      paths = grown;
      if ((paths[n] = strdup(path)) != NULL) n++;
    }
    closedir(dir);
    qsort(paths, (size_t)n, sizeof *paths, name_cmp);
  }
  for (int i = 0; i < n; i++) {
    char *abs = realpath(paths[i], NULL);
    if (abs == NULL) {
      fprintf(stderr, "weft-train: %s: %s\n", paths[i], strerror(errno));
      data_sources_free(paths, n);
      return -1;
    }
    free(paths[i]);
    paths[i] = abs;
  }
  /* a file named twice (GPL, a link to GPL-3) is read once */
  int kept = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int j = 0; j < kept && !seen; j++) seen = strcmp(paths[j], paths[i]) == 0;
    if (seen)
      free(paths[i]);
    else
      paths[kept++] = paths[i];
  }
  n = kept;
  if (n == 0) {
    fprintf(stderr, "weft-train: no text at %s\n", TRAIN_DATA_DEFAULT_DIR);
    free(paths);
    return -1;
  }
  *paths_out = paths;
  *n_out = n;
  return 0;
}

/* The key of the default token file's name: the text's absolute paths, and
 * its bytes (a 64-bit mix a word) and their count, so that another file of
 * the same name, or a rewrite of the same size within the same second, gets
 * its own; and the hash of the bytes alone, which the file records. 0, or
 * -1 with the reason on stderr. */
static int data_key(char **paths, int n, uint64_t *key_out, uint64_t *text_hash_out) {
  uint64_t h = 0x5745465454524149ull, t = 0x5745465454455854ull;
  uint8_t buf[65536];
  for (int i = 0; i < n; i++) {
    for (const char *c = paths[i]; *c != '\0'; c++) h = data_mix64(h ^ (uint8_t)*c);
    FILE *in = fopen(paths[i], "rb");
    if (in == NULL) {
      fprintf(stderr, "weft-train: reading %s: %s\n", paths[i], strerror(errno));
      return -1;
    }
    uint64_t count = 0;
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0) {
      for (size_t at = 0; at < got; at += 8) {
        uint64_t word = 0;
        memcpy(&word, buf + at, got - at < 8 ? got - at : 8);
        h = data_mix64(h ^ word);
        t = data_mix64(t ^ word);
      }
      count += got;
    }
    const int failed = ferror(in);
    fclose(in);
    if (failed) {
      fprintf(stderr, "weft-train: reading %s failed\n", paths[i]);
      return -1;
    }
    h = data_mix64(h ^ count);
    t = data_mix64(t ^ count);
  }
  *key_out = h;
  *text_hash_out = t;
  return 0;
}

/* $TMPDIR/weft-train-<key>.tok */
static void data_default_tokens_path(uint64_t key, char *out, size_t out_nbytes) {
  const char *tmp = getenv("TMPDIR");
  snprintf(out, out_nbytes, "%s/weft-train-%016llx.tok", tmp != NULL && tmp[0] ? tmp : "/tmp",
           (unsigned long long)key);
}

/* Writes the token file beside its path and renames it into place. */
static int data_write_tokens(char **paths, int n, uint64_t text_hash, const char *tokens_path) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", tokens_path, (int)getpid());
  FILE *out = fopen(tmp, "wb");
  if (out == NULL) {
    fprintf(stderr, "weft-train: writing %s: %s\n", tmp, strerror(errno));
    return -1;
  }
  uint8_t header[TOK_HEADER_NBYTES] = {0};
  memcpy(header, TOK_MAGIC, 8);
  /* the count is filled in below */
  int ok = fwrite(header, 1, sizeof header, out) == sizeof header;
  uint64_t count = 0;
  char buf[65536];
  for (int i = 0; i < n && ok; i++) {
    FILE *in = fopen(paths[i], "rb");
    if (in == NULL) {
      fprintf(stderr, "weft-train: reading %s: %s\n", paths[i], strerror(errno));
      ok = 0;
      break;
    }
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0) { /* a byte is a token */
      ok &= fwrite(buf, 1, got, out) == got;
      count += got;
    }
    if (ferror(in)) {
      fprintf(stderr, "weft-train: reading %s failed\n", paths[i]);
      ok = 0;
    }
    fclose(in);
  }
  uint32_t token_nbytes = 1, vocab = 256;
  memcpy(header + 8, &token_nbytes, 4);
  memcpy(header + 12, &vocab, 4);
  memcpy(header + 16, &count, 8);
  memcpy(header + 24, &text_hash, 8);
  ok &= fseek(out, 0, SEEK_SET) == 0 && fwrite(header, 1, sizeof header, out) == sizeof header;
  ok &= fclose(out) == 0;
  if (!ok || rename(tmp, tokens_path) != 0) {
    fprintf(stderr, "weft-train: writing %s failed\n", tokens_path);
    unlink(tmp);
    return -1;
  }
  return 0;
}

static int data_map(struct train_data *d, const char *tokens_path, int seq) {
  int fd = open(tokens_path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size < TOK1_HEADER_NBYTES) {
    fprintf(stderr, "weft-train: %s: not a token file\n", tokens_path);
    if (fd >= 0) close(fd);
    return -1;
  }
  void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return -1;
  const uint8_t *h = map;
  uint32_t token_nbytes, vocab;
  uint64_t count;
  memcpy(&token_nbytes, h + 8, 4);
  memcpy(&vocab, h + 12, 4);
  memcpy(&count, h + 16, 8);
  const int v1 = memcmp(h, TOK1_MAGIC, 8) == 0;
  const size_t header = v1 ? TOK1_HEADER_NBYTES : TOK_HEADER_NBYTES;
  if ((!v1 && memcmp(h, TOK_MAGIC, 8) != 0) || (size_t)st.st_size < header || token_nbytes != 1 ||
      vocab != 256 || count != (uint64_t)st.st_size - header) {
    fprintf(stderr, "weft-train: %s: not a byte-level token file of this format\n", tokens_path);
    munmap(map, (size_t)st.st_size);
    return -1;
  }
  d->map = map;
  d->map_nbytes = (size_t)st.st_size;
  d->tokens = h + header;
  d->count = count;
  d->train_count = count - count / 10;
  d->seq = seq;
  if (d->count - d->train_count < (size_t)seq + 1 || d->train_count < (size_t)seq + 1) {
    fprintf(stderr, "weft-train: %s: %zu tokens are too few for sequences of %d\n", tokens_path,
            d->count, seq);
    return -1;
  }
  /* an epoch's windows start at o + k seq (k < W), the last one's seq + 1
   * tokens in the split for every o below seq at least: W seq <= span */
  const uint64_t span = d->train_count - (size_t)seq; /* where a window can start */
  d->train_windows = span / (uint64_t)seq > 0 ? span / (uint64_t)seq : 1;
  d->val_windows = (d->count - d->train_count - 1) / (uint64_t)seq;
  return 0;
}

/* What the file at path is, and the text's hash where it records one; -1
 * (errno set) where it cannot be opened. */
static int data_header_read(const char *path, enum tok_kind *kind_out, uint64_t *text_hash_out) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return -1;
  uint8_t h[TOK_HEADER_NBYTES];
  struct stat st;
  const size_t got = fread(h, 1, sizeof h, f);
  const int sized = fstat(fileno(f), &st) == 0;
  fclose(f);
  *kind_out = TOK_NONE;
  const size_t header = memcmp(h, TOK_MAGIC, 8) == 0 ? TOK_HEADER_NBYTES : TOK1_HEADER_NBYTES;
  if (got >= TOK1_HEADER_NBYTES && memcmp(h, TOK1_MAGIC, 8) == 0) *kind_out = TOK_V1;
  if (got >= TOK_HEADER_NBYTES && memcmp(h, TOK_MAGIC, 8) == 0) {
    *kind_out = TOK_V2;
    memcpy(text_hash_out, h + 24, 8);
  }
  uint64_t count = 0;
  memcpy(&count, h + 16, 8);
  if (*kind_out != TOK_NONE && (!sized || (uint64_t)st.st_size < header ||
                                count != (uint64_t)st.st_size - header))
    *kind_out = TOK_CUT;
  return 0;
}

/* Whether the existing token file at path is kept for the text of hash
 * text_hash: 1 it is, 0 it is written again (saying so where it was
 * given), -1 it is refused (no token file of weft-train's, which is not
 * overwritten), with the reason on stderr. The default file (given 0) is
 * named for the text: one without a hash holds it. */
static int data_keep(const char *path, int given, const char *text_path, uint64_t text_hash) {
  enum tok_kind kind;
  uint64_t had = 0;
  const char *label = given ? "--tokens " : "the token file ";
  if (data_header_read(path, &kind, &had) != 0) {
    fprintf(stderr, "weft-train: %s%s: %s\n", label, path, strerror(errno));
    return -1;
  }
  if (kind == TOK_V2 && had == text_hash) return 1;
  if (kind == TOK_V1 && !given) return 1;
  if (kind == TOK_NONE) {
    fprintf(stderr,
            "weft-train: %s%s: not a token file, so not overwritten with the tokens of %s\n",
            label, path, text_path != NULL ? text_path : TRAIN_DATA_DEFAULT_DIR);
    return -1;
  }
  fprintf(stderr, "weft-train: %s%s %s: writing it again from %s\n", label, path,
          kind == TOK_V1    ? "records no text (a WEFTTOK1 file)"
          : kind == TOK_CUT ? "holds fewer or more tokens than its header counts"
                            : "holds another text's tokens",
          text_path != NULL ? text_path : TRAIN_DATA_DEFAULT_DIR);
  return 0;
}

/* Rank 0's part of train_data_open: the key of the default token file's
 * name (tokens_path NULL), and the file written from the text where it is
 * not there or holds another. 0, or -1 with the reason on stderr. */
static int data_prepare(const char *text_path, const char *tokens_path, uint64_t *key_out) {
  /* a token file given alone is used as it is: no text to compare */
  if (tokens_path != NULL && text_path == NULL && access(tokens_path, R_OK) == 0) return 0;
  char **paths = NULL;
  int n = 0;
  if (data_sources(text_path, &paths, &n) != 0) return -1;
  char def[4096];
  uint64_t text_hash = 0;
  int rc = data_key(paths, n, key_out, &text_hash);
  const int given = tokens_path != NULL;
  if (!given) {
    data_default_tokens_path(*key_out, def, sizeof def);
    tokens_path = def;
  }
  int keep = 0;
  if (rc == 0 && access(tokens_path, F_OK) == 0) {
    keep = data_keep(tokens_path, given, text_path, text_hash);
    if (keep < 0) rc = -1;
  }
  if (rc == 0 && !keep) rc = data_write_tokens(paths, n, text_hash, tokens_path);
  data_sources_free(paths, n);
  return rc;
}

weftResult_t train_data_open(struct train_data *d, const char *text_path,
                             const char *tokens_path, int seq, weftComm_t comm) {
  memset(d, 0, sizeof *d);
  int rank;
  weftCommUserRank(comm, &rank);
  /* rank 0 reads the text, and everyone learns whether it made the file
   * and, by default, the key of its name, before mapping it */
  enum { FAILED, KEY, NWORDS };
  uint64_t words[NWORDS] = {0, 0}; /* rank 0's, summed with the others' zeros */
  if (rank == 0) words[FAILED] = data_prepare(text_path, tokens_path, &words[KEY]) != 0;
  weftResult_t res = weftAllReduce(words, words, NWORDS, weftUint64, weftSum, comm, NULL);
  if (res != weftSuccess) return res;
  if (words[FAILED] != 0) return weftInvalidUsage;
  char def[4096];
  if (tokens_path == NULL) {
    data_default_tokens_path(words[KEY], def, sizeof def);
    tokens_path = def;
  }
  /* and whether every rank mapped it (on several hosts, rank 0's file may
   * not be where another rank looks): all fail together, none trains alone */
  const int unmapped = data_map(d, tokens_path, seq) != 0;
  if (unmapped) fprintf(stderr, "weft-train: rank %d cannot use the tokens\n", rank);
  int all = unmapped;
  res = weftAllReduce(&all, &all, 1, weftInt32, weftMax, comm, NULL);
  if (res == weftSuccess && all != 0) res = weftInvalidUsage;
  if (res != weftSuccess) train_data_close(d);
  return res;
}

void train_data_close(struct train_data *d) {
  if (d->map != NULL) munmap(d->map, d->map_nbytes);
  memset(d, 0, sizeof *d);
}

/* i's place in a permutation of [0, n) keyed by key: a balanced Feistel
 * network on the fewest even bits that hold n - 1, walked along its cycle
 * until it lands below n (at most four tries on average, the domain being
 * under 4 n). */
static uint64_t data_permute(uint64_t key, uint64_t n, uint64_t i) {
  if (n <= 1) return 0;
  int bits = 0;
  while (bits < 64 && (n - 1) >> bits != 0) bits++;
  const int half = (bits + 1) / 2;
  const uint64_t mask = (1ull << half) - 1;
  do {
    uint64_t left = i >> half, right = i & mask;
    for (uint64_t round = 0; round < 4; round++) {
      const uint64_t f = data_mix64(key ^ data_mix64(round << 56 ^ right)) & mask;
      const uint64_t was = right;
      right = left ^ f;
      left = was;
    }
    i = left << half | right;
  } while (i >= n);
  return i;
}

void train_data_sample(const struct train_data *d, uint64_t seed, uint64_t index, uint8_t *out) {
  const uint64_t seq = (uint64_t)d->seq, n = d->train_windows;
  const uint64_t epoch = index / n, slot = index % n;
  const uint64_t key = data_mix64(data_mix64(seed * 0x2545f4914f6cdd1dull + 7) ^ epoch);
  /* where the first window can start with the last in the split: seq at
   * least */
  const uint64_t offsets = d->train_count - seq - (n - 1) * seq;
  const uint64_t first = data_mix64(key ^ 0x4f4646534554ull) % offsets;
  const uint64_t at = first + data_permute(key, n, slot) * seq;
  memcpy(out, d->tokens + at, (size_t)seq + 1);
}

void train_data_val_sample(const struct train_data *d, uint64_t index, uint8_t *out) {
  const size_t at = d->train_count + (size_t)(index % d->val_windows) * (size_t)d->seq;
  memcpy(out, d->tokens + at, (size_t)d->seq + 1);
}
