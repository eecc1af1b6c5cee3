/* Host identity (which ranks share memory) and presence while joining
 * (markers that tell the root a rank of this host died before it joined). */
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/param.h"
#include "../base/shm_segment.h"
#include "../base/status.h"
#include "wire.h"

struct weft_param bootstrap_params[] = {
    {.name = "WEFT_HOSTID", .type = PARAM_STR,
     .doc = "the host identity, instead of the host name, boot id and network namespace: "
            "ranks with equal ids (in one pid namespace, seeing one /dev/shm) are taken to "
            "share memory"},
    PARAM_END,
};
enum { P_HOSTID };

uint64_t bootstrap_hash_bytes(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull; /* FNV-1a */
  return h;
}

/* Continues h with the identity of what path names: its device and inode. */
static uint64_t hash_stat(uint64_t h, const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return h;
  h = bootstrap_hash_bytes(h, &st.st_dev, sizeof st.st_dev);
  return bootstrap_hash_bytes(h, &st.st_ino, sizeof st.st_ino);
}

static uint64_t hash_file(uint64_t h, const char *path) {
  char buf[128];
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return h;
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  return n > 0 ? bootstrap_hash_bytes(h, buf, (size_t)n) : h;
}

void bootstrap_peer_info_local(struct peer_info *info) {
  info->pid = (int32_t)getpid();
  gethostname(info->hostname, sizeof info->hostname - 1);
  info->hostname[sizeof info->hostname - 1] = '\0';
  uint64_t h = 0xcbf29ce484222325ull;
  info->net_hash = hash_stat(hash_file(h, "/proc/sys/kernel/random/boot_id"), "/proc/self/ns/net");
  const char *override = param_str(&bootstrap_params[P_HOSTID]);
  if (override != NULL) {
    h = bootstrap_hash_bytes(h, override, strlen(override));
  } else {
    h = bootstrap_hash_bytes(h, info->hostname, strlen(info->hostname));
    h = hash_file(h, "/proc/sys/kernel/random/boot_id");
    /* ranks in different network namespaces count as different hosts */
    h = hash_stat(h, "/proc/self/ns/net");
  }
  /* and, whatever the host's name, so do ranks that cannot share memory or
   * see each other's processes: another pid namespace (a container per rank)
   * makes a peer's pid meaningless here, yet every user of the hash watches
   * (kill), reads (process_vm_readv) or opens (/proc/<pid>/fd) a peer's
   * process by it; another /dev/shm (a container's own) hides the segments
   * that shm_open would attach. Such ranks connect by network transports,
   * whose closed connections report a death. */
  h = hash_stat(h, "/proc/self/ns/pid");
  h = hash_stat(h, "/dev/shm");
  info->host_hash = h;
}

uint32_t bootstrap_presence_key(const uint8_t secret[BOOTSTRAP_SECRET_BYTES], int rank) {
  uint64_t h = bootstrap_hash_bytes(0xcbf29ce484222325ull, secret, BOOTSTRAP_SECRET_BYTES);
  h = bootstrap_hash_bytes(h, &rank, sizeof rank);
  return (uint32_t)(h ^ (h >> 32));
}

void bootstrap_presence_begin(const struct bootstrap_id *id, int rank,
                              struct bootstrap_presence *p) {
  static_assert(sizeof p->name == SHM_NAME_BYTES, "a marker's name fits");
  if (shm_marker_create(bootstrap_presence_key(id->secret, rank), p->name) != weftSuccess)
    WEFT_INFO(LOG_BOOTSTRAP, "rank %d joins unmarked: %s", rank, weft_error_text());
}

void bootstrap_presence_end(struct bootstrap_presence *p, int failed) {
  shm_marker_remove(p->name);
  if (failed) bootstrap_sweep_dead();
}

void bootstrap_sweep_dead(void) { shm_segment_sweep(); }
