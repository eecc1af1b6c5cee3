#include "shm_segment.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "status.h"
#include "wait.h"

/* Names are "/weft-<pid>-<tag><random>": the creator's pid, and a tag of
 * its pid namespace (8 hex digits) followed by 8 random ones. A segment whose
 * creator died before anyone attached can so be recognised and unlinked by
 * any later weft process of the same user and pid namespace. */
static uint32_t shm_pidns_tag(void) {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? (uint32_t)st.st_ino : 0;
}

/* Unlinks the names "/weft-<pid>-<tag><suffix>" of this user and pid
 * namespace whose creator is gone, for every suffix when want is NULL, else
 * for the first of the nwant given; returns how many, and in *which the index
 * in want of the first found (when want is given). */
static int shm_unlink_dead(const uint32_t *want, int nwant, int *which) {
  DIR *d = opendir("/dev/shm");
  if (d == NULL) return 0;
  uint32_t tag = shm_pidns_tag();
  uid_t uid = geteuid();
  int swept = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && (want == NULL || swept == 0)) {
    int pid = 0, used = 0, found = -1;
    unsigned int their_tag = 0, rnd = 0;
    if (sscanf(e->d_name, "weft-%d-%8x%8x%n", &pid, &their_tag, &rnd, &used) != 3 ||
        e->d_name[used] != '\0' || used != (int)strlen(e->d_name) || pid <= 0 ||
        pid == (int)getpid() || their_tag != tag)
      continue;
    for (int i = 0; want != NULL && i < nwant && found < 0; i++)
      if (want[i] == rnd) found = i;
    if (want != NULL && found < 0) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != uid ||
        !S_ISREG(st.st_mode) || !pid_gone((pid_t)pid, 1))
      continue;
    char name[SHM_NAME_BYTES + 2];
    snprintf(name, sizeof name, "/%s", e->d_name);
    if (shm_unlink(name) == 0) {
      swept++;
      if (which != NULL) *which = found;
      WEFT_INFO(LOG_SHM, "unlinked %s: its creator (pid %d) died", name, pid);
    }
  }
  closedir(d);
  return swept;
}

int shm_segment_sweep(void) { return shm_unlink_dead(NULL, 0, NULL); }

weftResult_t shm_marker_create(uint32_t key, char name_out[SHM_NAME_BYTES]) {
  snprintf(name_out, SHM_NAME_BYTES, "/weft-%d-%08x%08x", (int)getpid(), shm_pidns_tag(), key);
  int fd = shm_open(name_out, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    weftResult_t res = weft_error_errno(weftSystemError, "shm_open %s", name_out);
    name_out[0] = '\0';
    return res;
  }
  close(fd);
  return weftSuccess;
}

void shm_marker_remove(char name[SHM_NAME_BYTES]) {
  if (name[0] != '\0') shm_unlink(name);
  name[0] = '\0';
}

int shm_marker_find_dead(const uint32_t *keys, int nkeys) {
  int which = -1;
  return nkeys > 0 && shm_unlink_dead(keys, nkeys, &which) > 0 ? which : -1;
}

weftResult_t shm_segment_create(size_t nbytes, shm_segment_place_fn place,
                                struct shm_segment *seg_out) {
  static int swept_once; /* the first segment of a process sweeps what dead ones left */
  if (!__atomic_exchange_n(&swept_once, 1, __ATOMIC_RELAXED)) shm_segment_sweep();
  struct shm_segment seg = {.nbytes = nbytes, .owner = 1};
  uint32_t rnd = 0;
  if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
    return weft_error_errno(weftSystemError, "getrandom");
  snprintf(seg.name, sizeof seg.name, "/weft-%d-%08x%08x", (int)getpid(), shm_pidns_tag(), rnd);
  int fd = shm_open(seg.name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return weft_error_errno(weftSystemError, "shm_open %s", seg.name);
  weftResult_t res;
  seg.base = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (seg.base == MAP_FAILED) {
    res = weft_error_errno(weftSystemError, "mmap %s", seg.name);
    goto unlink_name;
  }
  /* where the caller wants the pages (a NUMA node), said before they exist */
  if (place != NULL) place(seg.base, nbytes);
  /* posix_fallocate reserves the pages now, so a full /dev/shm is an error
   * here instead of a SIGBUS later */
  int rc = posix_fallocate(fd, 0, (off_t)nbytes);
  if (rc != 0) {
    errno = rc;
    res = weft_error_errno(weftSystemError, "allocating %zu bytes of shared memory for %s",
                           nbytes, seg.name);
    goto unmap;
  }
  close(fd);
  WEFT_TRACE(LOG_SHM, "created %s (%zu bytes)", seg.name, nbytes);
  *seg_out = seg;
  return weftSuccess;
unmap:
  munmap(seg.base, nbytes);
unlink_name:
  shm_unlink(seg.name);
  close(fd);
  return res;
}

weftResult_t shm_segment_attach(const char *name, size_t nbytes, struct shm_segment *seg_out) {
  struct shm_segment seg = {.nbytes = nbytes, .owner = 0};
  snprintf(seg.name, sizeof seg.name, "%s", name);
  int fd = shm_open(seg.name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return weft_error_errno(weftSystemError, "shm_open %s to attach", seg.name);
  struct stat st;
  if (fstat(fd, &st) != 0 || (size_t)st.st_size < nbytes) {
    close(fd);
    return weft_error_set(weftInternalError, "shared memory %s is smaller than announced",
                          seg.name);
  }
  seg.base = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (seg.base == MAP_FAILED) {
    errno = err;
    return weft_error_errno(weftSystemError, "mmap %s", seg.name);
  }
  shm_unlink(seg.name); /* both ends hold a mapping now */
  *seg_out = seg;
  return weftSuccess;
}

void shm_segment_close(struct shm_segment *seg) {
  if (seg->base != NULL && seg->base != MAP_FAILED) munmap(seg->base, seg->nbytes);
  if (seg->owner) shm_unlink(seg->name); /* ENOENT once the attacher unlinked it */
  seg->base = NULL;
}

void shm_segment_close_conn(struct shm_segment *seg) {
  const int unfinished = seg->owner;
  shm_segment_close(seg);
  if (unfinished) shm_segment_sweep();
}
