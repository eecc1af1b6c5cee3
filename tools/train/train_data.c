/* The token file: "WEFTTOK1", uint32 bytes per token (1), uint32 vocabulary
 * (256), uint64 token count, then the tokens. A byte-level tokenizer makes a
 * token of every byte, so any text trains and every sample prints. */
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

#define TOK_MAGIC "WEFTTOK1"
#define TOK_HEADER_NBYTES 24

static uint64_t data_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The text's files: text_path, or the regular files of the default folder by name. */
static int data_sources(const char *text_path, char ***paths_out, int *n_out) {
  char **paths = NULL;
  int n = 0;
  if (text_path != NULL) {
    paths = malloc(sizeof *paths);
    if (paths == NULL || (paths[0] = strdup(text_path)) == NULL) return -1;
    n = 1;
  } else {
    DIR *dir = opendir(TRAIN_DATA_DEFAULT_DIR);
    if (dir == NULL) return -1;
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
  *paths_out = paths;
  *n_out = n;
  return n > 0 ? 0 : -1;
}

static void data_sources_free(char **paths, int n) {
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

/* $TMPDIR/weft-train-<hash of paths, sizes and times>.tok */
static void data_default_tokens_path(char **paths, int n, char *out, size_t out_nbytes) {
  uint64_t h = 0x5745465454524149ull;
  for (int i = 0; i < n; i++) {
    struct stat st;
    for (const char *c = paths[i]; *c != '\0'; c++) h = data_mix64(h ^ (uint8_t)*c);
    if (stat(paths[i], &st) == 0)
      h = data_mix64(h ^ data_mix64((uint64_t)st.st_size) ^ (uint64_t)st.st_mtime);
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(out, out_nbytes, "%s/weft-train-%016llx.tok", tmp != NULL && tmp[0] ? tmp : "/tmp",
           (unsigned long long)h);
}

/* Writes the token file beside its path and renames it into place. */
static int data_write_tokens(char **paths, int n, const char *tokens_path) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", tokens_path, (int)getpid());
  FILE *out = fopen(tmp, "wb");
  if (out == NULL) {
    fprintf(stderr, "weft-train: writing %s: %s\n", tmp, strerror(errno));
    return -1;
  }
  uint8_t header[TOK_HEADER_NBYTES] = {0};
  memcpy(header, TOK_MAGIC, 8);
  fwrite(header, 1, sizeof header, out); /* the count is filled in below */
  uint64_t count = 0;
  char buf[65536];
  int ok = 1;
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
    fclose(in);
  }
  uint32_t token_nbytes = 1, vocab = 256;
  memcpy(header + 8, &token_nbytes, 4);
  memcpy(header + 12, &vocab, 4);
  memcpy(header + 16, &count, 8);
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
  if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size < TOK_HEADER_NBYTES) {
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
  if (memcmp(h, TOK_MAGIC, 8) != 0 || token_nbytes != 1 || vocab != 256 ||
      count != (uint64_t)st.st_size - TOK_HEADER_NBYTES) {
    fprintf(stderr, "weft-train: %s: not a byte-level token file of this format\n", tokens_path);
    munmap(map, (size_t)st.st_size);
    return -1;
  }
  d->map = map;
  d->map_nbytes = (size_t)st.st_size;
  d->tokens = h + TOK_HEADER_NBYTES;
  d->count = count;
  d->train_count = count - count / 10;
  if (d->count - d->train_count < (size_t)seq + 1 || d->train_count < (size_t)seq + 1) {
    fprintf(stderr, "weft-train: %s: %zu tokens are too few for sequences of %d\n", tokens_path,
            d->count, seq);
    return -1;
  }
  return 0;
}

weftResult_t train_data_open(struct train_data *d, const char *text_path,
                             const char *tokens_path, int seq, weftComm_t comm) {
  memset(d, 0, sizeof *d);
  int rank;
  weftCommUserRank(comm, &rank);
  char **paths = NULL;
  int n = 0;
  char def[4096];
  int status = 0; /* rank 0's: 0 the file is ready */
  /* the text is read for the default file's name, and by rank 0 to write a
   * file that is not there yet: a token file given and present needs none */
  const int need_text =
      tokens_path == NULL || (rank == 0 && access(tokens_path, R_OK) != 0);
  if (need_text && data_sources(text_path, &paths, &n) != 0) {
    if (rank == 0)
      fprintf(stderr, "weft-train: no text at %s\n", text_path ? text_path : TRAIN_DATA_DEFAULT_DIR);
    status = 1;
  } else if (tokens_path == NULL) {
    data_default_tokens_path(paths, n, def, sizeof def);
    tokens_path = def;
  }
  if (rank == 0 && status == 0 && access(tokens_path, R_OK) != 0)
    status = data_write_tokens(paths, n, tokens_path) != 0;
  data_sources_free(paths, n);
  /* everyone learns whether rank 0 made the file before mapping it */
  int all = status;
  weftResult_t res = weftAllReduce(&all, &all, 1, weftInt32, weftMax, comm, NULL);
  if (res != weftSuccess) return res;
  if (all != 0) return weftInvalidUsage;
  /* and whether every rank mapped it (on several hosts, rank 0's file may
   * not be where another rank looks): all fail together, none trains alone */
  const int unmapped = data_map(d, tokens_path, seq) != 0;
  if (unmapped) fprintf(stderr, "weft-train: rank %d cannot use the tokens\n", rank);
  all = unmapped;
  res = weftAllReduce(&all, &all, 1, weftInt32, weftMax, comm, NULL);
  if (res == weftSuccess && all != 0) res = weftInvalidUsage;
  if (res != weftSuccess) train_data_close(d);
  return res;
}

void train_data_close(struct train_data *d) {
  if (d->map != NULL) munmap(d->map, d->map_nbytes);
  memset(d, 0, sizeof *d);
}

void train_data_sample(const struct train_data *d, uint64_t seed, uint64_t index, int seq,
                       uint8_t *out) {
  size_t span = d->train_count - (size_t)seq; /* windows of seq + 1 tokens */
  size_t at = data_mix64(data_mix64(seed * 0x2545f4914f6cdd1dull + 7) ^ index) % span;
  memcpy(out, d->tokens + at, (size_t)seq + 1);
}

void train_data_val_sample(const struct train_data *d, uint64_t index, int seq, uint8_t *out) {
  size_t span = d->count - d->train_count - (size_t)seq;
  size_t at = d->train_count + (index * (uint64_t)seq) % span;
  memcpy(out, d->tokens + at, (size_t)seq + 1);
}
