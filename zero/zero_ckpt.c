/* Sharded checkpoints (the files: zero_ckpt_format.h).
 *
 * dir/step-<n>/manifest      the run, layout (layers and parameters),
 *                            counters, the hyperparameters of the save, each
 *                            shard's size and checksum, and the manifest's
 *                            own checksum
 * dir/step-<n>/rank-<r>.bin  a checked header, then for each layer the fp32
 *                            master weights, then each moment, of
 *                            weftZeroShardOf(count, nranks, r)
 * dir/step-<n>/client-state.bin
 *                            rank 0's client state (weftZeroSaveWithState),
 *                            when it has one
 * dir/LATEST                 "step-<n>": the checkpoint to load
 *
 * Save writes into step-<n>.tmp, renames it to step-<n> once every rank's
 * file is on disk, then replaces LATEST by renaming a new file over it, so
 * a crash at any point leaves LATEST naming a complete checkpoint; then it
 * removes what it supersedes, the same run's checkpoints of lower steps.
 * Load checks the manifest, every shard it takes from and the client state
 * (checksums, run, step, sizes, the parameters' boundaries, finite values)
 * on every rank and agrees on the outcome, and
 * on which checkpoint every rank read, before it changes anything, then
 * reads the shard ranges of the saved rank count that its own ranges need,
 * whatever its rank count and stage. A failure anywhere up to the state's
 * installation leaves every rank's context as it was. */
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

#include "zero_ckpt_format.h"

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
/* mkdir -p: path and every missing folder above it; 0, or -1 with errno
 * (EEXIST only where path exists and is not a folder). */
static int make_dirs(const char *path) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
    errno = ENAMETOOLONG;
    return -1;
  }
  for (char *s = p + 1; *s != '\0'; s++) {
    if (*s != '/') continue;
    *s = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
    *s = '/';
  }
  if (mkdir(p, 0755) == 0) return 0;
  struct stat st;
  if (errno == EEXIST && stat(p, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  return -1;
}

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

#ifdef WEFT_TEST_HOOKS
/* The suites' build only (zero_test_hooks.h): the rank that exits halfway
 * through writing its shard, as a crash would. */
int zero_test_save_crash_rank = -1;
static int crash_rank(void) { return zero_test_save_crash_rank; }
#else
static int crash_rank(void) { return -1; }
#endif

/* The manifest's fields from z's state; the layer counts, the parameters
 * and the shards' sizes and checksums (NULL here) are the caller's to fill. */
static void ckpt_manifest_of(const struct weftZero *z, struct ckpt_manifest *m) {
  memset(m, 0, sizeof *m);
  memcpy(m->run, z->run_id, sizeof m->run);
  m->nranks = z->nranks;
  m->stage = z->cfg.stage;
  m->good_steps = z->good_steps;
  m->nlayers = z->nlayers;
  m->arrays = zero_optim_arrays(z->cfg.optimizer);
  m->step = z->step;
  m->updates = z->updates;
  m->loss_scale = z->loss_scale;
  m->loss_scaled = z->cfg.paramType == weftFloat16;
  snprintf(m->optimizer, sizeof m->optimizer, "%s",
           z->cfg.optimizer == weftZeroAdamW ? "adamw" : "sgd-momentum");
  const weftZeroConfig_t *c = &z->cfg;
  m->hyper = (struct ckpt_hyper){.lr = c->lr, .beta1 = c->beta1, .beta2 = c->beta2,
                                 .eps = c->eps, .momentum = c->momentum,
                                 .weight_decay = c->weightDecay,
                                 .max_grad_norm = c->maxGradNorm,
                                 .accum_steps = c->accumSteps};
}

/* This rank's file: a header, then for each layer its range's master
 * weights, then moments, from src (host memory). The payload's size and CRC
 * go to *_out. */
static weftResult_t ckpt_write_shard_from(struct weftZero *z, float *const src[3],
                                          const char *path, const struct ckpt_manifest *m,
                                          uint64_t *nbytes_out, uint32_t *crc_out) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return zero_fail(weftSystemError, "cannot create %s: %s", path, strerror(errno));
  int arrays = zero_optim_arrays(z->cfg.optimizer);
  int crash = crash_rank() == z->rank;
  size_t total = 0, written = 0;
  uint64_t nbytes = 0;
  uint32_t crc = 0;
  struct ckpt_shard_header h;
  for (int i = 0; i < z->nlayers; i++)
    total += (size_t)arrays * weftZeroShardOf(z->layers[i].count, z->nranks, z->rank).count;
  /* sealed without the payload's size and CRC, which go in once known: a
   * shard cut short names its run, for the prune of a later save */
  ckpt_shard_header_fill(&h, m, z->rank, 0, 0);
  if (write_all(fd, &h, sizeof h) != 0) goto close_fd;
  for (int i = 0; i < z->nlayers; i++) {
    const struct zero_layer *l = &z->layers[i];
    weftZeroShard_t s = weftZeroShardOf(l->count, z->nranks, z->rank);
    if (s.count == 0) continue; /* a small layer: this rank holds only padding */
    size_t skip = s.offset - l->own_offset; /* stage 0 owns the whole layer */
    for (int a = 0; a < arrays; a++) {
      if (crash && written >= total / 2) _exit(3); /* half of the shard is on disk */
      written += s.count;
      const float *part = src[a] + l->master_offset + skip;
      crc = zero_crc32c(crc, part, s.count * sizeof(float));
      nbytes += s.count * sizeof(float);
      if (write_all(fd, part, s.count * sizeof(float)) != 0) goto close_fd;
    }
  }
  ckpt_shard_header_fill(&h, m, z->rank, nbytes, crc);
  if (pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) goto close_fd;
  if (fsync(fd) != 0) goto close_fd;
  if (close(fd) != 0)
    return zero_fail(weftSystemError, "writing %s: %s", path, strerror(errno));
  *nbytes_out = nbytes;
  *crc_out = crc;
  return weftSuccess;
close_fd: {
  int err = errno != 0 ? errno : EIO;
  close(fd);
  return zero_fail(weftSystemError, "writing %s: %s", path, strerror(err));
}
}

/* The same from the context's state, staged through host memory when it is
 * on a device. */
static weftResult_t ckpt_write_shard(struct weftZero *z, const char *path,
                                     const struct ckpt_manifest *m, uint64_t *nbytes_out,
                                     uint32_t *crc_out) {
  float *src[3];
  WEFT_TRY(zero_state_get(z, src));
  weftResult_t res = ckpt_write_shard_from(z, src, path, m, nbytes_out, crc_out);
  zero_state_free(z, src);
  return res;
}

/* Rank 0: the client state's file, and its CRC-32C to crc_out. */
static weftResult_t ckpt_write_state(const char *path, const void *state, size_t nbytes,
                                     uint32_t *crc_out) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return zero_fail(weftSystemError, "cannot create %s: %s", path, strerror(errno));
  if (write_all(fd, state, nbytes) != 0 || fsync(fd) != 0) {
    int err = errno != 0 ? errno : EIO;
    close(fd);
    return zero_fail(weftSystemError, "writing %s: %s", path, strerror(err));
  }
  if (close(fd) != 0) return zero_fail(weftSystemError, "writing %s: %s", path, strerror(errno));
  *crc_out = zero_crc32c(0, state, nbytes);
  return weftSuccess;
}

static weftResult_t ckpt_write_manifest(const struct ckpt_manifest *m, const char *path) {
  char *text;
  size_t len;
  WEFT_TRY(ckpt_manifest_format(m, &text, &len));
  weftResult_t res = weftSuccess;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) res = zero_fail(weftSystemError, "cannot create %s: %s", path, strerror(errno));
  else if (write_all(fd, text, len) != 0 || fsync(fd) != 0)
    res = zero_fail(weftSystemError, "writing %s: %s", path, strerror(errno));
  if (fd >= 0 && close(fd) != 0 && res == weftSuccess)
    res = zero_fail(weftSystemError, "writing %s: %s", path, strerror(errno));
  free(text);
  return res;
}

/* The step of a version directory's name: "step-<n>" (tmp 0) or
 * "step-<n>.tmp" (tmp 1), n without sign or leading zeros; -1 otherwise. */
static long ckpt_name_step(const char *name, int *tmp_out) {
  const char *p = name + 5;
  if (strncmp(name, "step-", 5) != 0 || *p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9'))
    return -1;
  char *end;
  errno = 0;
  long step = strtol(p, &end, 10);
  if (errno != 0) return -1;
  if (strcmp(end, "") == 0) *tmp_out = 0;
  else if (strcmp(end, ".tmp") == 0) *tmp_out = 1;
  else return -1;
  return step;
}

/* The run that the version directory path (of the given step) belongs to:
 * its manifest's, or for a save's leftover (tmp) its first shard's header;
 * -1 when neither can be read. */
static int ckpt_version_run(const char *path, long step, int tmp, uint8_t run_out[16]) {
  if (tmp) {
    char shard[PATH_MAX + 64];
    if (snprintf(shard, sizeof shard, "%s/rank-00000.bin", path) >= (int)sizeof shard) return -1;
    return ckpt_shard_run(shard, run_out);
  }
  struct ckpt_manifest m;
  if (ckpt_manifest_read(path, step, &m) != weftSuccess) return -1;
  memcpy(run_out, m.run, sizeof m.run);
  ckpt_manifest_free(&m);
  return 0;
}

/* Rank 0, before anything is written: a save of step-<n> (name) may go into
 * dir unless LATEST names it already, or a step-<n> of another run (or one
 * that cannot be read) is there, which it would replace. */
static weftResult_t ckpt_save_check(const struct weftZero *z, const char *dir, const char *name) {
  char latest[PATH_MAX], final[PATH_MAX], current[256] = "";
  snprintf(latest, sizeof latest, "%s/LATEST", dir);
  FILE *lf = fopen(latest, "r");
  if (lf != NULL) {
    if (fscanf(lf, "%255s", current) != 1) current[0] = '\0';
    fclose(lf);
  }
  if (strcmp(current, name) == 0)
    return zero_fail(weftInvalidUsage, "%s already holds the checkpoint of step %ld", dir, z->step);
  snprintf(final, sizeof final, "%s/%s", dir, name);
  struct stat st;
  if (lstat(final, &st) != 0) return weftSuccess;
  uint8_t run[16];
  if (ckpt_version_run(final, z->step, 0, run) != 0 || memcmp(run, z->run_id, sizeof run) != 0)
    return zero_fail(weftInvalidUsage,
                     "%s holds a checkpoint of another run (or one that cannot be read), "
                     "which this save would replace: move it away, or save elsewhere", final);
  return weftSuccess; /* this run's, left by a save that did not reach LATEST */
}

/* Rank 0, once LATEST names the new checkpoint (of m's run and step): removes
 * what it supersedes, the checkpoints of the same run at lower steps and
 * their saves' leftovers. Another run's, a higher step's and anything whose
 * run cannot be read stay. */
static void ckpt_prune(const struct ckpt_manifest *m, const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) return;
  struct dirent *e;
  char path[PATH_MAX];
  while ((e = readdir(d)) != NULL) {
    int tmp = 0;
    long step = ckpt_name_step(e->d_name, &tmp);
    uint8_t run[16];
    if (step < 0 || step >= m->step) continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    if (ckpt_version_run(path, step, tmp, run) == 0 && memcmp(run, m->run, sizeof run) == 0)
      remove_tree(path);
  }
  closedir(d);
}

/* Rank 0: the version directory goes live, then LATEST points at it. */
static weftResult_t ckpt_commit(struct weftZero *z, const struct ckpt_manifest *m,
                                const char *dir, const char *tmp, const char *name) {
  char path[PATH_MAX + 64], final[PATH_MAX], latest_tmp[PATH_MAX], latest[PATH_MAX];
  snprintf(path, sizeof path, "%s/manifest", tmp);
  WEFT_TRY(ckpt_write_manifest(m, path));
  snprintf(final, sizeof final, "%s/%s", dir, name);
  snprintf(latest, sizeof latest, "%s/LATEST", dir);
  snprintf(latest_tmp, sizeof latest_tmp, "%s/LATEST.tmp", dir);
  /* checked before the shards were written; again, for what came since. A
   * step-<n> of this run that LATEST does not name can go first */
  WEFT_TRY(ckpt_save_check(z, dir, name));
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
  ckpt_prune(m, dir);
  return weftSuccess;
}

/* Every rank learns whether any failed; the collective also fails when a
 * rank died. vals (n + 1 doubles; vals[0] is the agreement's own) carries n
 * values after it, of which every rank receives the largest over ranks in
 * the same all-reduce. A rank's failure before it (a sync, an allocation)
 * is its mine: every rank enters the all-reduce, so none waits for one that
 * returned. */
static weftResult_t ckpt_agree_with(struct weftZero *z, weftResult_t mine, double *vals, size_t n,
                                    weftStream_t stream, const char *what) {
  vals[0] = mine != weftSuccess;
  weftResult_t res = zero_allreduce_max(z, vals, n + 1, stream);
  if (res != weftSuccess) return res;
  if (mine != weftSuccess) return mine;
  if (vals[0] > 0) return zero_fail(weftRemoteError, "%s failed on another rank", what);
  return weftSuccess;
}

static weftResult_t ckpt_agree(struct weftZero *z, weftResult_t mine, weftStream_t stream,
                               const char *what) {
  double flag[1];
  return ckpt_agree_with(z, mine, flag, 0, stream, what);
}

/* The run identity: kept from a loaded checkpoint, else rank 0's random one,
 * handed to every rank (as four 32-bit words, exact in doubles) with the
 * agreement on the directory. */
static void run_id_pack(const uint8_t run[16], double words[4]) {
  for (int w = 0; w < 4; w++) {
    uint32_t v;
    memcpy(&v, run + 4 * w, 4);
    words[w] = v;
  }
}

static void run_id_unpack(const double words[4], uint8_t run[16]) {
  for (int w = 0; w < 4; w++) {
    uint32_t v = (uint32_t)words[w];
    memcpy(run + 4 * w, &v, 4);
  }
}

/* weftZeroSave and weftZeroSaveWithState: state and nbytes are rank 0's. */
static weftResult_t ckpt_save(weftZero_t z, const char *dir, const void *state, size_t nbytes,
                              weftStream_t stream) {
  if (z == NULL || dir == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (strlen(dir) > PATH_MAX - 64) return zero_fail(weftInvalidArgument, "path too long");
  /* from here every failure is this rank's part of an agreement, which
   * comes after the last step's all-gathers (or stage 3's gathers) on
   * another stream on every rank */
  weftResult_t mine = zero_gathers_order(z, stream);
  if (mine == weftSuccess) mine = z->ops->sync(stream, z->comm, "synchronizing the stream");
  if (mine == weftSuccess && z->state_damaged)
    mine = zero_fail(weftInvalidUsage,
                     "the optimizer state is partly updated since %s: load a checkpoint "
                     "(weftZeroLoad) before saving one",
                     z->broken);
  /* rank 0's refusal of its client state reaches the others in the first
   * agreement, before anything is written */
  if (mine == weftSuccess && z->rank == 0 && nbytes > WEFT_ZERO_STATE_MAX_NBYTES)
    mine = zero_fail(weftInvalidArgument,
                     "a client state of %zu bytes, more than the %zu a checkpoint holds", nbytes,
                     WEFT_ZERO_STATE_MAX_NBYTES);
  if (mine == weftSuccess && z->rank == 0 && state == NULL && nbytes > 0)
    mine = zero_fail(weftInvalidArgument, "the client state is NULL, of %zu bytes", nbytes);
  char name[64], tmp[PATH_MAX], path[PATH_MAX + 64];
  snprintf(name, sizeof name, "step-%ld", z->step);
  snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
  /* each rank's payload size and CRC reach rank 0 through an agreement
   * (sums[0] is the agreement's own) */
  double *sums = calloc(2 * (size_t)z->nranks + 1, sizeof *sums);
  if (sums == NULL && mine == weftSuccess) mine = zero_fail(weftSystemError, "out of memory");
  double words[5] = {0, 0, 0, 0, 0};
  int made_tmp = 0;
  if (z->rank == 0 && mine == weftSuccess) {
    if (!z->has_run_id) mine = ckpt_run_id_new(z->run_id);
    run_id_pack(z->run_id, words + 1);
    if (mine == weftSuccess && make_dirs(dir) != 0)
      mine = zero_fail(weftSystemError, "cannot create %s: %s", dir, strerror(errno));
    /* a save that would be refused at the commit is refused before the writing */
    if (mine == weftSuccess) mine = ckpt_save_check(z, dir, name);
    if (mine == weftSuccess) {
      remove_tree(tmp);
      if (mkdir(tmp, 0755) != 0)
        mine = zero_fail(weftSystemError, "cannot create %s: %s", tmp, strerror(errno));
      else
        made_tmp = 1;
    }
  }
  weftResult_t res;
  WEFT_TRY_GOTO(
      ckpt_agree_with(z, mine, words, 4, stream, "preparing the checkpoint directory"), res,
      remove_tmp);
  run_id_unpack(words + 1, z->run_id);
  z->has_run_id = 1;
  struct ckpt_manifest m;
  ckpt_manifest_of(z, &m);
  uint64_t shard_nbytes = 0;
  uint32_t crc = 0;
  mine = weftSuccess;
  if (z->rank == 0 && nbytes > 0) {
    snprintf(path, sizeof path, "%s/" CKPT_STATE_FILE, tmp);
    mine = ckpt_write_state(path, state, nbytes, &m.state_crc);
    m.state_nbytes = nbytes;
  }
  snprintf(path, sizeof path, "%s/rank-%05d.bin", tmp, z->rank);
  if (mine == weftSuccess) mine = ckpt_write_shard(z, path, &m, &shard_nbytes, &crc);
  sums[1 + 2 * z->rank] = (double)shard_nbytes; /* exact below 2^53 bytes */
  sums[1 + 2 * z->rank + 1] = crc;
  WEFT_TRY_GOTO(
      ckpt_agree_with(z, mine, sums, 2 * (size_t)z->nranks, stream, "writing a shard"), res,
      remove_tmp);
  mine = weftSuccess;
  if (z->rank == 0) {
    m.counts = malloc((size_t)z->nlayers * sizeof *m.counts);
    m.params = malloc(z->nparams * sizeof *m.params);
    m.shard_nbytes = malloc((size_t)z->nranks * sizeof *m.shard_nbytes);
    m.shard_crc = malloc((size_t)z->nranks * sizeof *m.shard_crc);
    if (m.counts == NULL || m.params == NULL || m.shard_nbytes == NULL || m.shard_crc == NULL) {
      mine = zero_fail(weftSystemError, "out of memory");
    } else {
      for (int i = 0; i < z->nlayers; i++) m.counts[i] = z->layers[i].count;
      m.nparams = z->nparams;
      for (size_t k = 0; k < z->nparams; k++)
        m.params[k] = (struct ckpt_param){z->params[k].layer, z->params[k].count,
                                          z->params[k].weight_decay};
      for (int q = 0; q < z->nranks; q++) {
        m.shard_nbytes[q] = (uint64_t)sums[1 + 2 * q];
        m.shard_crc[q] = (uint32_t)sums[1 + 2 * q + 1];
      }
      mine = ckpt_commit(z, &m, dir, tmp, name);
    }
    ckpt_manifest_free(&m);
  }
  res = ckpt_agree(z, mine, stream, "committing the checkpoint");
remove_tmp:
  /* a failed save leaves nothing of its own (but a version it renamed) */
  if (res != weftSuccess && made_tmp) remove_tree(tmp);
  free(sums);
  return res;
}

weftResult_t weftZeroSave(weftZero_t z, const char *dir, weftStream_t stream) {
  return ckpt_save(z, dir, NULL, 0, stream);
}

weftResult_t weftZeroSaveWithState(weftZero_t z, const char *dir, const void *state,
                                   size_t nbytes, weftStream_t stream) {
  return ckpt_save(z, dir, state, nbytes, stream);
}

/* The range of layer l this rank owns and holds in master, cut to the layer. */
static weftZeroShard_t ckpt_owned(const struct zero_layer *l) {
  weftZeroShard_t mine = {l->own_offset, 0};
  if (l->own_offset < l->count)
    mine.count = l->own_offset + l->own_count > l->count ? l->count - l->own_offset : l->own_count;
  return mine;
}

/* Whether this rank takes anything from saved rank q's shard. */
static int ckpt_takes_from(const struct weftZero *z, const struct ckpt_manifest *m, int q) {
  for (int i = 0; i < z->nlayers; i++) {
    weftZeroShard_t theirs = weftZeroShardOf(z->layers[i].count, m->nranks, q);
    if (weftZeroShardIntersect(ckpt_owned(&z->layers[i]), theirs.offset, theirs.count).count > 0)
      return 1;
  }
  return 0;
}

/* Fills this rank's owned range of every layer from the saved shards (which
 * were checked). */
static weftResult_t ckpt_read_shards_into(struct weftZero *z, float *const dst[3],
                                          const char *ver, const struct ckpt_manifest *m) {
  int arrays = zero_optim_arrays(z->cfg.optimizer);
  char path[PATH_MAX + 64];
  for (int q = 0; q < m->nranks; q++) {
    if (!ckpt_takes_from(z, m, q)) continue;
    snprintf(path, sizeof path, "%s/rank-%05d.bin", ver, q);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zero_fail(weftSystemError, "cannot open %s: %s", path, strerror(errno));
    off_t base = sizeof(struct ckpt_shard_header); /* the layer's start in rank q's file */
    for (int i = 0; i < z->nlayers; i++) {
      const struct zero_layer *l = &z->layers[i];
      weftZeroShard_t theirs = weftZeroShardOf(l->count, m->nranks, q);
      weftZeroShard_t part = weftZeroShardIntersect(ckpt_owned(l), theirs.offset, theirs.count);
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

/* The version LATEST names (ver_out, PATH_MAX bytes), its manifest checked. */
static weftResult_t ckpt_open_latest(const char *dir, char *ver_out, struct ckpt_manifest *m) {
  long step;
  WEFT_TRY(ckpt_latest(dir, ver_out, &step));
  return ckpt_manifest_read(ver_out, step, m);
}

/* Format 4: the checkpoint's parameter boundaries against the model's (the
 * layers' sizes agree already: two parameters of 2 and 3 elements and one of
 * 5 fill a layer alike). Weight decays and the other hyperparameters may
 * differ: a resumed run may change them. */
static weftResult_t ckpt_check_params(const struct weftZero *z, const char *ver,
                                      const struct ckpt_manifest *m) {
  if (m->nparams == 0) return weftSuccess; /* format 2 or 3: not recorded */
  for (size_t k = 0; k < m->nparams || k < z->nparams; k++) {
    const struct ckpt_param *saved = k < m->nparams ? &m->params[k] : NULL;
    const struct zero_param *mine = k < z->nparams ? &z->params[k] : NULL;
    if (saved != NULL && mine != NULL && saved->layer == mine->layer &&
        saved->count == mine->count)
      continue;
    char theirs[96] = "absent", ours[96] = "absent";
    if (saved != NULL)
      snprintf(theirs, sizeof theirs, "layer %d, count %zu", saved->layer, saved->count);
    if (mine != NULL) snprintf(ours, sizeof ours, "layer %d, count %zu", mine->layer, mine->count);
    return zero_fail(weftInvalidUsage,
                     "%s: its parameters' boundaries differ from this model's: parameter %zu is "
                     "%s in the checkpoint; %s in this model (%zu parameters in the checkpoint, "
                     "%zu in this model)",
                     ver, k, theirs, ours, m->nparams, z->nparams);
  }
  return weftSuccess;
}

/* Checks what this rank will take: the manifest against the model, the
 * shards it reads from (and every shard q with q % nranks == rank, so that
 * each is checked by someone), and the client state, which it reads whole
 * (state_out: malloc'd, NULL when there is none). */
static weftResult_t ckpt_check_local(struct weftZero *z, const char *dir, char *ver,
                                     struct ckpt_manifest *m, void **state_out,
                                     size_t *state_nbytes_out) {
  WEFT_TRY(ckpt_open_latest(dir, ver, m));
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
  if (res == weftSuccess) res = ckpt_check_params(z, ver, m);
  for (int q = 0; res == weftSuccess && q < m->nranks; q++)
    if (q % z->nranks == z->rank || ckpt_takes_from(z, m, q))
      res = ckpt_shard_scan(ver, m, q, z->cfg.allowNonFinite);
  if (res == weftSuccess) res = ckpt_state_read(ver, m, state_out, state_nbytes_out);
  if (res != weftSuccess) ckpt_manifest_free(m);
  return res;
}

/* What a loading rank read, for the ranks to agree on: the step, the run
 * identity (four words) and the manifest's CRC-32C, each as itself and
 * negated, so that one all-reduce of maxima gives each one's largest and
 * smallest over ranks. */
enum { CKPT_IDENT = 6 };

static void ckpt_ident_of(const struct ckpt_manifest *m, double ident[2 * CKPT_IDENT]) {
  ident[0] = (double)m->step; /* exact below 2^53 */
  run_id_pack(m->run, ident + 1);
  ident[5] = m->crc;
  for (int i = 0; i < CKPT_IDENT; i++) ident[CKPT_IDENT + i] = -ident[i];
}

/* Every rank sees the same maxima: either all refuse, or none. */
static weftResult_t ckpt_ident_check(const double ident[2 * CKPT_IDENT], const char *dir,
                                     const char *ver) {
  double hi[CKPT_IDENT], lo[CKPT_IDENT];
  for (int i = 0; i < CKPT_IDENT; i++) hi[i] = ident[i], lo[i] = -ident[CKPT_IDENT + i];
  const char *why = "(LATEST moved between their reads, or the ranks see different directories)";
  if (hi[0] != lo[0])
    return zero_fail(weftInvalidUsage,
                     "the ranks read different checkpoints from %s: steps %.0f to %.0f %s; this "
                     "rank read %s", dir, lo[0], hi[0], why, ver);
  for (int w = 1; w <= 4; w++)
    if (hi[w] != lo[w])
      return zero_fail(weftInvalidUsage,
                       "the ranks read checkpoints of different runs from %s, at step %.0f %s; "
                       "this rank read %s", dir, hi[0], why, ver);
  if (hi[5] != lo[5])
    return zero_fail(weftInvalidUsage,
                     "the ranks read different manifests of step %.0f from %s (crc32c %08x to "
                     "%08x) %s; this rank read %s", hi[0], dir, (unsigned)lo[5], (unsigned)hi[5],
                     why, ver);
  return weftSuccess;
}

/* Reads this rank's ranges of a checked checkpoint into host copies of its
 * state, and keeps a second host copy of the state as it is; once every
 * rank has read them, the first is installed, and if that fails on any rank
 * every rank puts the second back (m is freed, its counters kept). */
static weftResult_t ckpt_read_and_install(struct weftZero *z, const char *ver,
                                          struct ckpt_manifest *m, weftStream_t stream) {
  float *staged[3] = {NULL, NULL, NULL}, *kept[3] = {NULL, NULL, NULL};
  weftResult_t res = zero_state_copy(z, staged);
  if (res == weftSuccess) res = ckpt_read_shards_into(z, staged, ver, m);
  if (res == weftSuccess) res = zero_state_copy(z, kept);
  ckpt_manifest_free(m);
  WEFT_TRY_GOTO(ckpt_agree(z, res, stream, "reading the checkpoint"), res, free_copies);
  /* the last publication's write-backs read the master weights */
  for (int i = 0; i < z->nlayers && res == weftSuccess; i++)
    res = zero_gather_wait(z, &z->layers[i]);
  if (res == weftSuccess) res = zero_state_install(z, staged);
  res = ckpt_agree(z, res, stream, "installing the checkpoint");
  if (res != weftSuccess) {
    char why[512];
    snprintf(why, sizeof why, "%s", weftZeroLastError());
    const weftResult_t back = zero_state_install(z, kept);
    if (back != weftSuccess)
      res = zero_fail(back,
                      "%s; then putting the state back failed (%s): this context's optimizer "
                      "state is damaged, load a checkpoint into it again or destroy it",
                      why, weftZeroLastError());
    else
      zero_fail(res, "%s", why);
  }
free_copies:
  zero_state_copy_free(kept);
  zero_state_copy_free(staged);
  return res;
}

weftResult_t weftZeroLoad(weftZero_t z, const char *dir, weftStream_t stream) {
  if (z == NULL || dir == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (!z->finalized) return zero_fail(weftInvalidUsage, "call weftZeroFinalize first");
  if (strlen(dir) > PATH_MAX - 64) return zero_fail(weftInvalidArgument, "path too long");
  /* from here every failure is this rank's part of an agreement, which
   * comes after the last step's all-gathers (or stage 3's gathers) on
   * another stream on every rank */
  weftResult_t mine = zero_gathers_order(z, stream);
  if (mine == weftSuccess) mine = z->ops->sync(stream, z->comm, "synchronizing the stream");
  char ver[PATH_MAX] = "";
  struct ckpt_manifest m;
  void *state = NULL; /* the checkpoint's client state, the context's once installed */
  size_t state_nbytes = 0;
  double ident[1 + 2 * CKPT_IDENT] = {0};
  if (mine == weftSuccess) mine = ckpt_check_local(z, dir, ver, &m, &state, &state_nbytes);
  if (mine == weftSuccess) ckpt_ident_of(&m, ident + 1);
  weftResult_t res =
      ckpt_agree_with(z, mine, ident, 2 * CKPT_IDENT, stream, "checking the checkpoint");
  if (res == weftSuccess) res = ckpt_ident_check(ident + 1, dir, ver);
  if (res != weftSuccess) {
    if (mine == weftSuccess) ckpt_manifest_free(&m);
    free(state);
    return res;
  }
  /* every rank found the same checkpoint sound */
  res = ckpt_read_and_install(z, ver, &m, stream);
  if (res != weftSuccess) {
    free(state);
    return res;
  }
  free(z->loaded_state);
  z->loaded_state = state;
  z->loaded_state_nbytes = state_nbytes;
  z->step = m.step;
  z->updates = m.updates;
  z->good_steps = m.good_steps;
  z->loss_scale = z->cfg.paramType == weftFloat16 ? zero_loss_scale_clamp(m.loss_scale) : 1.0;
  if (z->cfg.paramType == weftFloat16 && m.loss_scaled == 0) {
    /* a run that trained unscaled (bf16, fp32) has no scale to go on
     * with: fp16 starts from its configured one (the checkpoint's 1 would
     * flush small gradients to zero for many windows) */
    z->loss_scale = z->cfg.lossScale;
    z->good_steps = 0;
  }
  memcpy(z->run_id, m.run, sizeof z->run_id);
  z->has_run_id = 1;
  /* the state is the checkpoint's on every rank: what remains are the
   * gradients (zeroed) and the parameters (written back, gathered) */
  z->state_damaged = 0;
  res = zero_release_all(z);
  if (res == weftSuccess) res = zero_grads_reset(z, stream);
  /* stages 1-2 gather in the publication: every rank enters it, or none */
  res = ckpt_agree(z, res, stream, "resetting the gradients");
  if (res == weftSuccess) res = zero_publish_params(z, stream);
  /* the parameters are partly the old ones, or the gradients the last
   * step's: a step would train on both (the optimizer state is the
   * checkpoint's, so a save may keep it) */
  if (res != weftSuccess)
    return zero_break(z, res, "writing back the parameters of %.64s", ver);
  z->broken[0] = '\0'; /* whatever a failed step left is replaced */
  return weftSuccess;
}

weftResult_t weftZeroLoadedState(weftZero_t z, const void **state_out, size_t *nbytes_out) {
  if (z == NULL || state_out == NULL || nbytes_out == NULL)
    return zero_fail(weftInvalidArgument, "NULL argument");
  *state_out = z->loaded_state;
  *nbytes_out = z->loaded_state_nbytes;
  return weftSuccess;
}

weftResult_t weftZeroConsolidateFlags(const char *dir, const char *out_path, int flags) {
  if (dir == NULL || out_path == NULL) return zero_fail(weftInvalidArgument, "NULL argument");
  if (strlen(dir) > PATH_MAX - 64 || strlen(out_path) > PATH_MAX - 64)
    return zero_fail(weftInvalidArgument, "path too long");
  if ((flags & ~weftZeroAllowNonFinite) != 0)
    return zero_fail(weftInvalidArgument, "unknown flags %#x", (unsigned)flags);
  char ver[PATH_MAX], path[PATH_MAX + 64], tmp_path[PATH_MAX];
  struct ckpt_manifest m;
  WEFT_TRY(ckpt_open_latest(dir, ver, &m));
  weftResult_t res = weftSuccess;
  FILE *out = NULL;
  const size_t chunk = 1u << 18; /* floats per copy */
  float *buf = NULL;
  /* every shard is checked whole before anything is written */
  for (int q = 0; q < m.nranks && res == weftSuccess; q++)
    res = ckpt_shard_scan(ver, &m, q, flags & weftZeroAllowNonFinite);
  if (res != weftSuccess) goto free_manifest;
  buf = malloc(chunk * sizeof *buf);
  if (buf == NULL) {
    res = zero_fail(weftSystemError, "out of memory");
    goto free_manifest;
  }
  /* written beside out_path and renamed over it once complete */
  snprintf(tmp_path, sizeof tmp_path, "%s.tmp", out_path);
  out = fopen(tmp_path, "wb");
  if (out == NULL) {
    res = zero_fail(weftSystemError, "cannot create %s: %s", tmp_path, strerror(errno));
    goto free_manifest;
  }
  uint64_t nlayers = (uint64_t)m.nlayers;
  int bad = fwrite("WEFTZF32", 1, 8, out) != 8 || fwrite(&nlayers, sizeof nlayers, 1, out) != 1;
  for (int i = 0; i < m.nlayers && !bad; i++) {
    uint64_t c = m.counts[i];
    bad = fwrite(&c, sizeof c, 1, out) != 1;
  }
  if (bad) res = zero_fail(weftSystemError, "writing %s failed", tmp_path);
  /* layer by layer, the master weights of each saved rank in rank order */
  for (int i = 0; i < m.nlayers && res == weftSuccess; i++) {
    for (int q = 0; q < m.nranks && res == weftSuccess; q++) {
      snprintf(path, sizeof path, "%s/rank-%05d.bin", ver, q);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        res = zero_fail(weftSystemError, "cannot open %s: %s", path, strerror(errno));
        break;
      }
      off_t base = sizeof(struct ckpt_shard_header);
      for (int j = 0; j < i; j++)
        base += (off_t)(m.arrays * weftZeroShardOf(m.counts[j], m.nranks, q).count * sizeof(float));
      size_t n = weftZeroShardOf(m.counts[i], m.nranks, q).count;
      for (size_t done = 0; done < n && res == weftSuccess;) {
        size_t k = n - done < chunk ? n - done : chunk;
        if (read_at(fd, buf, k * sizeof *buf, base + (off_t)(done * sizeof *buf)) != 0)
          res = zero_fail(weftSystemError, "%s is short or unreadable", path);
        else if (fwrite(buf, sizeof *buf, k, out) != k)
          res = zero_fail(weftSystemError, "writing %s failed", tmp_path);
        done += k;
      }
      close(fd);
    }
  }
  if ((fflush(out) != 0 || fsync(fileno(out)) != 0) && res == weftSuccess)
    res = zero_fail(weftSystemError, "writing %s: %s", tmp_path, strerror(errno));
  if (fclose(out) != 0 && res == weftSuccess)
    res = zero_fail(weftSystemError, "writing %s failed", tmp_path);
  if (res == weftSuccess && rename(tmp_path, out_path) != 0)
    res = zero_fail(weftSystemError, "renaming %s: %s", tmp_path, strerror(errno));
  if (res != weftSuccess) unlink(tmp_path);
free_manifest:
  free(buf);
  ckpt_manifest_free(&m);
  return res;
}

weftResult_t weftZeroConsolidate(const char *dir, const char *out_path) {
  return weftZeroConsolidateFlags(dir, out_path, 0);
}
