#include "shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../status.h"
#include "../topo.h"

weftResult_t shm_segment_create(size_t nbytes, struct shm_segment *seg_out) {
  struct shm_segment seg = {.nbytes = nbytes, .owner = 1};
  uint64_t salt = 0;
  if (getrandom(&salt, sizeof salt, 0) != (ssize_t)sizeof salt)
    return weft_error_errno(weftSystemError, "getrandom");
  snprintf(seg.name, sizeof seg.name, "/weft-%d-%016llx", (int)getpid(),
           (unsigned long long)salt);
  int fd = shm_open(seg.name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return weft_error_errno(weftSystemError, "shm_open %s", seg.name);
  weftResult_t res;
  seg.base = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (seg.base == MAP_FAILED) {
    res = weft_error_errno(weftSystemError, "mmap %s", seg.name);
    goto unlink_name;
  }
  /* the receiver's NUMA node (it reads the slots), set before the pages exist */
  topo_mem_place(seg.base, nbytes);
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
