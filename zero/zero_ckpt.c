/* Sharded checkpoints.
 *
 * dir/step-<n>/manifest      text: format, ranks, stage, optimizer, step,
 *                            loss scale, layer counts
 * dir/step-<n>/rank-<r>.bin  for each layer, the fp32 master weights, then
 *                            each moment, of weftZeroShardOf(count, nranks, r)
 * dir/LATEST                 "step-<n>": the checkpoint to load
 *
 * Save writes into step-<n>.tmp, renames it to step-<n> once every rank's
 * file is on disk, then replaces LATEST by renaming a new file over it, so
 * a crash at any point leaves LATEST naming a complete checkpoint. Load reads
 * the shard ranges of the saved rank count and takes the parts its own
 * ranges need, whatever its rank count and stage. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zero_internal.h"

#define CKPT_FORMAT "weft-zero-checkpoint 1"
#define CKPT_MAX_LAYERS 1000000

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int read_at(int fd, void *buf, size_t n, off_t at) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
    at += r;
  }
  return 0;
}

static int fsync_path(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

/* Removes a directory of plain files (a checkpoint version). */
static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d == NULL) return;
  struct dirent *e;
  char file[PATH_MAX];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(file, sizeof file, "%s/%s", path, e->d_name);
    unlink(file);
  }
  closedir(d);
  rmdir(path);
}

/* Test hook: WEFT_ZERO_SAVE_CRASH_RANK=r makes rank r exit halfway through
 * writing its shard, as a crash would. */
static int crash_rank(void) {
  const char *v = getenv("WEFT_ZERO_SAVE_CRASH_RANK");
  return v != NULL && v[0] != '\0' ? atoi(v) : -1;
}

/* This rank's file: for each layer, its range's master weights, then moments. */
static weftResult_t ckpt_write_shard(struct weftZero *z, const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return zero_fail(weftSystemError, "cannot create %s: %s", path, strerror(errno));
  int arrays = zero_optim_arrays(z->cfg.optimizer);
  float *src[3] = {z->master, z->moment1, z->moment2};
  int crash = crash_rank() == z->rank;
  size_t total = 0, written = 0;
  for (int i = 0; i < z->nlayers; i++)
    total += (size_t)arrays * weftZeroShardOf(z->layers[i].count, z->nranks, z->rank).count;
  for (int i = 0; i < z->nlayers; i++) {
    const struct zero_layer *l = &z->layers[i];
    weftZeroShard_t s = weftZeroShardOf(l->count, z->nranks, z->rank);
    if (s.count == 0) continue; /* a small layer: this rank holds only padding */
    size_t skip = s.offset - l->own_offset; /* stage 0 owns the whole layer */
    for (int a = 0; a < arrays; a++) {
      if (crash && written >= total / 2) _exit(3); /* half of the shard is on disk */
      written += s.count;
      if (write_all(fd, src[a] + l->master_offset + skip, s.count * sizeof(float)) != 0) {
        int err = errno;
        close(fd);
        return zero_fail(weftSystemError, "writing %s: %s", path, strerror(err));
      }
    }
  }
  if (fsync(fd) != 0 || close(fd) != 0)
    return zero_fail(weftSystemError, "writing %s: %s", path, strerror(errno));
  return weftSuccess;
}

static weftResult_t ckpt_write_manifest(struct weftZero *z, const char *path) {
  FILE *f = fopen(path, "w");
  if (f == NULL) return zero_fail(weftSystemError, "cannot create %s: %s", path, strerror(errno));
  fprintf(f, "%s\nnranks %d\nstage %d\noptimizer %s\nstep %ld\nloss_scale %.17g\n"
             "updates %ld\ngood_steps %d\nlayers %d\n",
          CKPT_FORMAT, z->nranks, z->cfg.stage,
          z->cfg.optimizer == weftZeroAdamW ? "adamw" : "sgd-momentum", z->step, z->loss_scale,
          z->updates, z->good_steps, z->nlayers);
  for (int i = 0; i < z->nlayers; i++) fprintf(f, "layer %d %zu\n", i, z->layers[i].count);
  int bad = ferror(f);
  if (fflush(f) != 0 || fsync(fileno(f)) != 0) bad = 1;
  if (fclose(f) != 0) bad = 1;
  return bad ? zero_fail(weftSystemError, "writing %s failed", path) : weftSuccess;
}

/* Rank 0: the version directory goes live, then LATEST points at it. */
static weftResult_t ckpt_commit(struct weftZero *z, const char *dir, const char *tmp,
                                const char *name) {
  char path[PATH_MAX + 64], final[PATH_MAX], latest_tmp[PATH_MAX], latest[PATH_MAX];
  snprintf(path, sizeof path, "%s/manifest", tmp);
  ZERO_TRY(ckpt_write_manifest(z, path));
  snprintf(final, sizeof final, "%s/%s", dir, name);
  snprintf(latest, sizeof latest, "%s/LATEST", dir);
  snprintf(latest_tmp, sizeof latest_tmp, "%s/LATEST.tmp", dir);
  /* a version of the same name that LATEST does not name can go first */
  char current[256] = "";
  FILE *lf = fopen(latest, "r");
  if (lf != NULL) {
    if (fscanf(lf, "%255s", current) != 1) current[0] = '\0';
    fclose(lf);
  }
  if (strcmp(current, name) == 0)
    return zero_fail(weftInvalidUsage, "%s already holds the checkpoint of step %ld", dir, z->step);
  remove_tree(final);
  if (fsync_path(tmp) != 0 || rename(tmp, final) != 0)
    return zero_fail(weftSystemError, "renaming %s: %s", tmp, strerror(errno));
  FILE *f = fopen(latest_tmp, "w");
  if (f == NULL) return zero_fail(weftSystemError, "cannot create %s: %s", latest_tmp, strerror(errno));
  fprintf(f, "%s\n", name);
  int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
  if (fclose(f) != 0 || bad) return zero_fail(weftSystemError, "writing %s failed", latest_tmp);
  if (rename(latest_tmp, latest) != 0 || fsync_path(dir) != 0)
    return zero_fail(weftSystemError, "replacing %s: %s", latest, strerror(errno));
  /* older versions and leftovers of interrupted saves */
  DIR *d = opendir(dir);
  if (d != NULL) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (strncmp(e->d_name, "step-", 5) != 0 || strcmp(e->d_name, name) == 0) continue;
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      remove_tree(path);
    }
    closedir(d);
  }
  return weftSuccess;
}

/* Every rank learns whether any failed; the collective also fails when a
 * rank died. */
static weftResult_t ckpt_agree(struct weftZero *z, weftResult_t mine, weftStream_t stream,
                               const char *what) {
  double failed = mine != weftSuccess;
  weftResult_t res = zero_allreduce_sum(z, &failed, 1, stream);
  if (res != weftSuccess) return res;
  if (mine != weftSuccess) return mine;
  if (failed > 0) return zero_fail(weftRemoteError, "%s failed on another rank", what);
  return weftSuccess;
}

weftResult_t weftZeroSave(weftZero_t z, const char *dir, weftStream_t stream) {
  if (z == NULL || dir == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (strlen(dir) > PATH_MAX - 64) return zero_fail(weftInvalidArgument, "path too long");
  if (stream != NULL) ZERO_WEFT(z, weftStreamSynchronize(stream), "synchronizing the stream");
  char name[64], tmp[PATH_MAX], path[PATH_MAX + 64];
  snprintf(name, sizeof name, "step-%ld", z->step);
  snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
  weftResult_t mine = weftSuccess;
  if (z->rank == 0) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
      mine = zero_fail(weftSystemError, "cannot create %s: %s", dir, strerror(errno));
    remove_tree(tmp);
    if (mine == weftSuccess && mkdir(tmp, 0755) != 0)
      mine = zero_fail(weftSystemError, "cannot create %s: %s", tmp, strerror(errno));
  }
  ZERO_TRY(ckpt_agree(z, mine, stream, "preparing the checkpoint directory"));
  snprintf(path, sizeof path, "%s/rank-%05d.bin", tmp, z->rank);
  ZERO_TRY(ckpt_agree(z, ckpt_write_shard(z, path), stream, "writing a shard"));
  mine = z->rank == 0 ? ckpt_commit(z, dir, tmp, name) : weftSuccess;
  return ckpt_agree(z, mine, stream, "committing the checkpoint");
}

struct ckpt_manifest {
  int nranks, stage, good_steps, nlayers;
  long step, updates;
  double loss_scale;
  char optimizer[32];
  size_t *counts;
};

static weftResult_t ckpt_read_manifest(const char *path, struct ckpt_manifest *m) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return zero_fail(weftSystemError, "cannot open %s: %s", path, strerror(errno));
  char line[256];
  weftResult_t res = weftSuccess;
  memset(m, 0, sizeof *m);
  if (fgets(line, sizeof line, f) == NULL || strncmp(line, CKPT_FORMAT, strlen(CKPT_FORMAT)) != 0 ||
      fscanf(f, " nranks %d stage %d optimizer %31s step %ld loss_scale %lg updates %ld"
                " good_steps %d layers %d",
             &m->nranks, &m->stage, m->optimizer, &m->step, &m->loss_scale, &m->updates,
             &m->good_steps, &m->nlayers) != 8 ||
      m->nranks < 1 || m->nlayers < 1 || m->nlayers > CKPT_MAX_LAYERS) {
    res = zero_fail(weftInvalidUsage, "%s is not a weft ZeRO manifest", path);
    goto close_file;
  }
  m->counts = calloc((size_t)m->nlayers, sizeof *m->counts);
  if (m->counts == NULL) {
    res = zero_fail(weftSystemError, "out of memory");
    goto close_file;
  }
  for (int i = 0; i < m->nlayers; i++) {
    int idx;
    if (fscanf(f, " layer %d %zu", &idx, &m->counts[i]) != 2 || idx != i) {
      res = zero_fail(weftInvalidUsage, "%s: layer %d is missing", path, i);
      free(m->counts);
      m->counts = NULL;
      goto close_file;
    }
  }
close_file:
  fclose(f);
  return res;
}

/* Fills this rank's owned range of every layer from the saved shards. */
static weftResult_t ckpt_read_shards(struct weftZero *z, const char *ver,
                                     const struct ckpt_manifest *m) {
  int arrays = zero_optim_arrays(z->cfg.optimizer);
  float *dst[3] = {z->master, z->moment1, z->moment2};
  char path[PATH_MAX + 64];
  for (int q = 0; q < m->nranks; q++) {
    snprintf(path, sizeof path, "%s/rank-%05d.bin", ver, q);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zero_fail(weftSystemError, "cannot open %s: %s", path, strerror(errno));
    off_t base = 0; /* the layer's start in rank q's file */
    for (int i = 0; i < z->nlayers; i++) {
      const struct zero_layer *l = &z->layers[i];
      weftZeroShard_t theirs = weftZeroShardOf(l->count, m->nranks, q);
      weftZeroShard_t mine = {l->own_offset, l->own_offset < l->count
                                                 ? (l->own_offset + l->own_count > l->count
                                                        ? l->count - l->own_offset
                                                        : l->own_count)
                                                 : 0};
      weftZeroShard_t part = weftZeroShardIntersect(mine, theirs.offset, theirs.count);
      for (int a = 0; a < arrays && part.count > 0; a++) {
        off_t at = base + (off_t)((a * theirs.count + part.offset) * sizeof(float));
        float *out = dst[a] + l->master_offset + (theirs.offset + part.offset - l->own_offset);
        if (read_at(fd, out, part.count * sizeof(float), at) != 0) {
          close(fd);
          return zero_fail(weftSystemError, "%s is short or unreadable", path);
        }
      }
      base += (off_t)(arrays * theirs.count * sizeof(float));
    }
    close(fd);
  }
  return weftSuccess;
}

/* The version LATEST names (ver_out, PATH_MAX bytes) and its manifest. */
static weftResult_t ckpt_open_latest(const char *dir, char *ver_out, struct ckpt_manifest *m) {
  char path[PATH_MAX + 64], name[256];
  snprintf(path, sizeof path, "%s/LATEST", dir);
  FILE *f = fopen(path, "r");
  if (f == NULL) return zero_fail(weftSystemError, "no checkpoint in %s: %s", dir, strerror(errno));
  int ok = fscanf(f, "%255s", name) == 1;
  fclose(f);
  if (!ok || strchr(name, '/') != NULL) return zero_fail(weftInvalidUsage, "%s is damaged", path);
  snprintf(ver_out, PATH_MAX, "%s/%s", dir, name);
  snprintf(path, sizeof path, "%s/manifest", ver_out);
  return ckpt_read_manifest(path, m);
}

static weftResult_t ckpt_load_local(struct weftZero *z, const char *dir, struct ckpt_manifest *m) {
  char ver[PATH_MAX];
  ZERO_TRY(ckpt_open_latest(dir, ver, m));
  const char *opt = z->cfg.optimizer == weftZeroAdamW ? "adamw" : "sgd-momentum";
  weftResult_t res = weftSuccess;
  if (strcmp(m->optimizer, opt) != 0)
    res = zero_fail(weftInvalidUsage, "%s was saved with %s, this model uses %s", ver,
                    m->optimizer, opt);
  else if (m->nlayers != z->nlayers)
    res = zero_fail(weftInvalidUsage, "%s has %d layers, this model %d", ver, m->nlayers,
                    z->nlayers);
  for (int i = 0; res == weftSuccess && i < z->nlayers; i++)
    if (m->counts[i] != z->layers[i].count)
      res = zero_fail(weftInvalidUsage, "%s: layer %d has %zu parameters, this model %zu", ver, i,
                      m->counts[i], z->layers[i].count);
  if (res == weftSuccess) res = ckpt_read_shards(z, ver, m);
  free(m->counts);
  m->counts = NULL;
  return res;
}

weftResult_t weftZeroLoad(weftZero_t z, const char *dir, weftStream_t stream) {
  if (z == NULL || dir == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (strlen(dir) > PATH_MAX - 64) return zero_fail(weftInvalidArgument, "path too long");
  if (stream != NULL) ZERO_WEFT(z, weftStreamSynchronize(stream), "synchronizing the stream");
  ZERO_TRY(zero_release_all(z));
  zero_grads_reset(z);
  struct ckpt_manifest m;
  ZERO_TRY(ckpt_agree(z, ckpt_load_local(z, dir, &m), stream, "loading the checkpoint"));
  z->step = m.step;
  z->updates = m.updates;
  z->good_steps = m.good_steps;
  z->loss_scale = z->cfg.paramType == weftFloat16 ? m.loss_scale : 1.0;
  return zero_publish_params(z, stream);
}

weftResult_t weftZeroConsolidate(const char *dir, const char *out_path) {
  if (dir == NULL || out_path == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (strlen(dir) > PATH_MAX - 64) return zero_fail(weftInvalidArgument, "path too long");
  char ver[PATH_MAX], path[PATH_MAX + 64];
  struct ckpt_manifest m;
  ZERO_TRY(ckpt_open_latest(dir, ver, &m));
  int arrays = strcmp(m.optimizer, "adamw") == 0 ? 3 : 2;
  weftResult_t res = weftSuccess;
  FILE *out = fopen(out_path, "wb");
  if (out == NULL) {
    res = zero_fail(weftSystemError, "cannot create %s: %s", out_path, strerror(errno));
    goto free_manifest;
  }
  uint64_t nlayers = (uint64_t)m.nlayers;
  fwrite("WEFTZF32", 1, 8, out);
  fwrite(&nlayers, sizeof nlayers, 1, out);
  for (int i = 0; i < m.nlayers; i++) {
    uint64_t c = m.counts[i];
    fwrite(&c, sizeof c, 1, out);
  }
  /* layer by layer, the master weights of each saved rank in rank order */
  for (int i = 0; i < m.nlayers && res == weftSuccess; i++) {
    for (int q = 0; q < m.nranks && res == weftSuccess; q++) {
      snprintf(path, sizeof path, "%s/rank-%05d.bin", ver, q);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        res = zero_fail(weftSystemError, "cannot open %s: %s", path, strerror(errno));
        break;
      }
      off_t base = 0;
      for (int j = 0; j < i; j++)
        base += (off_t)(arrays * weftZeroShardOf(m.counts[j], m.nranks, q).count * sizeof(float));
      weftZeroShard_t s = weftZeroShardOf(m.counts[i], m.nranks, q);
      float *buf = malloc((s.count > 0 ? s.count : 1) * sizeof *buf);
      if (buf == NULL) res = zero_fail(weftSystemError, "out of memory");
      else if (read_at(fd, buf, s.count * sizeof *buf, base) != 0)
        res = zero_fail(weftSystemError, "%s is short or unreadable", path);
      else if (fwrite(buf, sizeof *buf, s.count, out) != s.count)
        res = zero_fail(weftSystemError, "writing %s failed", out_path);
      free(buf);
      close(fd);
    }
  }
  if (fclose(out) != 0 && res == weftSuccess)
    res = zero_fail(weftSystemError, "writing %s failed", out_path);
free_manifest:
  free(m.counts);
  return res;
}
