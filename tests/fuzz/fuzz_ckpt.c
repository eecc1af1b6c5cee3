/* Fuzz target: checkpoint files as weftZeroConsolidate reads them. An input
 * is the manifest, then each rank's shard, separated by "WEFTFUZZ|"; they
 * are written into a fresh checkpoint directory (LATEST names step-1) and
 * consolidated. Whatever the files say, consolidation must return (an error
 * is fine) without touching memory it does not own. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "weft_zero.h"

const char *const fuzz_target_name = "ckpt";

static char root[256];

static void write_file(const char *path, const void *data, size_t nbytes) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) return;
  if (nbytes > 0) fwrite(data, 1, nbytes, f);
  fclose(f);
}

struct files_ctx {
  char ver[300];
};

static void write_part(const uint8_t *part, size_t nbytes, int index, void *p) {
  struct files_ctx *c = p;
  char path[400];
  if (index == 0) snprintf(path, sizeof path, "%s/manifest", c->ver);
  else if (index <= 64) snprintf(path, sizeof path, "%s/rank-%05d.bin", c->ver, index - 1);
  else return;
  write_file(path, part, nbytes);
}

static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *e;
  char path[600];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(path);
    else unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static void cleanup(void) { remove_tree(root); }

/* A real two-rank checkpoint of two layers, as the corpus's first entry. */
static void write_seed(const char *dir) {
  mkdir(dir, 0755);
  const size_t counts[2] = {5, 3};
  char text[512];
  int n = snprintf(text, sizeof text,
                   "weft-zero-checkpoint 1\nnranks 2\nstage 2\noptimizer adamw\nstep 7\n"
                   "loss_scale 1\nupdates 7\ngood_steps 0\nlayers 2\nlayer 0 5\nlayer 1 3\n");
  size_t nbytes = (size_t)n;
  static uint8_t buf[4096];
  memcpy(buf, text, nbytes);
  for (int q = 0; q < 2; q++) {
    memcpy(buf + nbytes, "WEFTFUZZ|", 9);
    nbytes += 9;
    for (int l = 0; l < 2; l++) {
      weftZeroShard_t s = weftZeroShardOf(counts[l], 2, q);
      for (size_t i = 0; i < 3 * s.count; i++) {
        float v = 0.25f * (float)(q * 100 + l * 10 + (int)i);
        memcpy(buf + nbytes, &v, sizeof v);
        nbytes += sizeof v;
      }
    }
  }
  char path[300];
  snprintf(path, sizeof path, "%s/two-ranks-adamw", dir);
  write_file(path, buf, nbytes);
}

int fuzz_init(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(root, sizeof root, "%s/weft-fuzz-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(root) == NULL) {
    perror("fuzz ckpt: mkdtemp");
    return 1;
  }
  atexit(cleanup);
  const char *dir = getenv("WEFT_FUZZ_WRITE_CORPUS"); /* regenerates tests/fuzz/corpus/ckpt */
  if (dir != NULL) write_seed(dir);
  return 0;
}

int fuzz_one(const uint8_t *data, size_t nbytes) {
  struct files_ctx c;
  char path[400];
  snprintf(path, sizeof path, "%s/ckpt", root);
  mkdir(path, 0700);
  snprintf(c.ver, sizeof c.ver, "%s/ckpt/step-1", root);
  mkdir(c.ver, 0700);
  snprintf(path, sizeof path, "%s/ckpt/LATEST", root);
  write_file(path, "step-1\n", 7);
  fuzz_split(data, nbytes, "WEFTFUZZ|", write_part, &c);
  char ckpt[300], out[300];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", root);
  snprintf(out, sizeof out, "%s/out.bin", root);
  weftZeroConsolidate(ckpt, out);
  remove_tree(ckpt);
  unlink(out);
  return 0;
}
