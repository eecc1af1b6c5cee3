/* Memory for collectives: weftMemAlloc/weftMemAllocHost/weftMemFree,
 * buffer registration, and the mapping of peers' host buffers.
 *
 * Host memory is page aligned (huge-page aligned from 2 MiB). From 64 KiB it
 * comes from a memfd that this process keeps open, so a peer on the same
 * host can map the same pages (mem_peer_map: open /proc/<pid>/fd/<fd>, check
 * the device and inode, mmap); smaller buffers come from the heap. Every
 * host allocation is listed, so that weftMemFree refuses a pointer it did
 * not hand out. Each comm keeps the mappings it made, so a buffer used call
 * after call is mapped once. Registration lists the range with the
 * communicator and returns a handle, which deregistration looks up. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../transport/base/log.h"
#include "../../transport/base/status.h"
#include "comm.h"
#include "../exec/device/device.h"
#include "mem.h"

#define MEM_ALIGN 4096
#define MEM_HUGE_NBYTES (2u << 20)
#define MEM_SHARED_MIN_NBYTES (64u << 10) /* smaller buffers are not worth an fd */

/* The host allocations of this process (weftMemAllocHost's), sorted by
 * base: shareable ones (a memfd mapped) and private ones (the heap's). */
struct mem_host {
  void *base;
  size_t nbytes;
  int fd;   /* the memfd; -1: not shareable (a heap buffer, or any in a forked child) */
  int heap; /* posix_memalign's, freed with free(); else mapped, unmapped */
  uint64_t id;
  uint64_t dev, ino;
};
static pthread_mutex_t mem_host_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mem_host *mem_host_list;
static size_t mem_host_count, mem_host_cap;
static size_t mem_host_nfds; /* the entries with an open memfd */
static uint64_t mem_host_next_id = 1;
/* weftMemAlloc's device allocations, by base (few: frameworks cache them);
 * under mem_host_lock too */
static void **mem_dev_list;
static size_t mem_dev_count, mem_dev_cap;

/* The index of the last allocation whose base is at most p, or -1; under
 * mem_host_lock. A buffer lookup per collective stays cheap with
 * thousands of allocations (a framework's every large tensor). */
static ptrdiff_t mem_host_floor(const void *p) {
  size_t lo = 0, hi = mem_host_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if ((const char *)mem_host_list[mid].base <= (const char *)p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (ptrdiff_t)lo - 1;
}

/* A forked child gets memory from weftMemAllocHost as it gets malloc's: its
 * writes stay its own. Each allocation is mapped again, privately, at the
 * same address (the child reads the same pages until it writes one), and
 * is no longer offered to peers: the file's pages are the parent's. */
static void mem_fork_prepare(void) { pthread_mutex_lock(&mem_host_lock); }
static void mem_fork_parent(void) { pthread_mutex_unlock(&mem_host_lock); }
static void mem_fork_child(void) {
  for (size_t i = 0; i < mem_host_count; i++) {
    struct mem_host *m = &mem_host_list[i];
    if (m->fd < 0) continue;
    /* on failure the child keeps the shared mapping, as before fork handling */
    (void)mmap(m->base, m->nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, m->fd, 0);
    close(m->fd);
    m->fd = -1;
  }
  mem_host_nfds = 0;
  pthread_mutex_unlock(&mem_host_lock);
}
/* at load: the lock is taken by small allocations and frees too, so the
 * handlers must be there before any of them */
__attribute__((constructor)) static void mem_fork_register(void) {
  (void)pthread_atfork(mem_fork_prepare, mem_fork_parent, mem_fork_child);
}

/* Lists device memory at p; 0 when the list cannot grow. */
static int mem_dev_insert(void *p) {
  pthread_mutex_lock(&mem_host_lock);
  int ok = 1;
  if (mem_dev_count == mem_dev_cap) {
    const size_t cap = mem_dev_cap ? 2 * mem_dev_cap : 16;
    void **grown = realloc(mem_dev_list, cap * sizeof *grown);
    if (grown != NULL) {
      mem_dev_list = grown;
      mem_dev_cap = cap;
    }
    ok = grown != NULL;
  }
  if (ok) mem_dev_list[mem_dev_count++] = p;
  pthread_mutex_unlock(&mem_host_lock);
  return ok;
}

/* Takes p off the device list; 0 when it is not there. */
static int mem_dev_remove(const void *p) {
  pthread_mutex_lock(&mem_host_lock);
  int found = 0;
  for (size_t i = 0; i < mem_dev_count && !found; i++)
    if (mem_dev_list[i] == p) {
      mem_dev_list[i] = mem_dev_list[--mem_dev_count];
      found = 1;
    }
  pthread_mutex_unlock(&mem_host_lock);
  return found;
}

/* Maps nbytes (a multiple of align) of fd at an address aligned to align. */
static void *mem_map_aligned(int fd, size_t nbytes, size_t align) {
  if (align <= MEM_ALIGN) {
    void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
  }
  /* reserve align more than needed, then place the file at the aligned start */
  char *area = mmap(NULL, nbytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) return NULL;
  char *start = (char *)(((uintptr_t)area + align - 1) / align * align);
  void *p = mmap(start, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    munmap(area, nbytes + align);
    return NULL;
  }
  if (start > area) munmap(area, (size_t)(start - area));
  size_t tail = (size_t)(area + nbytes + align - (start + nbytes));
  if (tail > 0) munmap(start + nbytes, tail);
  return p;
}

/* Whether another shareable allocation may take a file descriptor: each
 * keeps one open (peers open it through /proc), and a framework that puts
 * every large tensor here could otherwise exhaust the process's descriptors
 * (RLIMIT_NOFILE, often 1024) and make its own opens and sockets fail. Half
 * the soft limit goes to shareable allocations at most; past it they are
 * private memory, which collectives reach through the kernel instead. */
static int mem_shared_fd_room(void) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 1;
  pthread_mutex_lock(&mem_host_lock);
  const size_t open_fds = mem_host_nfds;
  pthread_mutex_unlock(&mem_host_lock);
  if (open_fds < (size_t)lim.rlim_cur / 2) return 1;
  static int said;
  if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
    WEFT_INFO(LOG_INIT, "%zu shareable buffers hold half of this process's %llu file descriptors: "
              "further buffers are private memory", open_fds,
              (unsigned long long)lim.rlim_cur);
  return 0;
}

/* Lists m in address order; 0 when the list cannot grow. */
static int mem_host_insert(const struct mem_host *m) {
  pthread_mutex_lock(&mem_host_lock);
  if (mem_host_count == mem_host_cap) {
    size_t cap = mem_host_cap ? 2 * mem_host_cap : 16;
    struct mem_host *grown = realloc(mem_host_list, cap * sizeof(*grown));
    if (grown == NULL) {
      pthread_mutex_unlock(&mem_host_lock);
      return 0;
    }
    mem_host_list = grown;
    mem_host_cap = cap;
  }
  size_t at = (size_t)(mem_host_floor(m->base) + 1);
  memmove(&mem_host_list[at + 1], &mem_host_list[at],
          (mem_host_count - at) * sizeof(*mem_host_list));
  mem_host_list[at] = *m;
  mem_host_list[at].id = mem_host_next_id++;
  mem_host_count++;
  if (m->fd >= 0) mem_host_nfds++;
  pthread_mutex_unlock(&mem_host_lock);
  return 1;
}

/* A shareable allocation of rounded bytes; NULL where memfds are missing or
 * refused (the caller then takes private memory). */
static void *mem_shared_alloc(size_t rounded, size_t align) {
  if (!mem_shared_fd_room()) return NULL;
  int fd = memfd_create("weft-mem", MFD_CLOEXEC);
  if (fd < 0) return NULL;
  struct stat st;
  void *p = NULL;
  if (ftruncate(fd, (off_t)rounded) != 0 || fstat(fd, &st) != 0) goto close_fd;
  p = mem_map_aligned(fd, rounded, align);
  if (p == NULL) goto close_fd;
  const struct mem_host m = {
      .base = p, .nbytes = rounded, .fd = fd, .dev = st.st_dev, .ino = st.st_ino};
  if (mem_host_insert(&m)) return p;
  munmap(p, rounded);
close_fd:
  close(fd);
  return NULL;
}

/* A private allocation of rounded bytes from the heap, listed; NULL when
 * the heap or the list cannot grow. */
static void *mem_heap_alloc(size_t rounded, size_t align) {
  void *p = NULL;
  if (posix_memalign(&p, align, rounded) != 0) return NULL;
  const struct mem_host m = {.base = p, .nbytes = rounded, .fd = -1, .heap = 1};
  if (mem_host_insert(&m)) return p;
  free(p);
  return NULL;
}

/* Frees the host allocation at ptr (unmapped and its memfd closed, or given
 * back to the heap); 0 when no allocation starts at ptr. */
static int mem_host_free(void *ptr) {
  pthread_mutex_lock(&mem_host_lock);
  ptrdiff_t i = mem_host_floor(ptr);
  if (i < 0 || mem_host_list[i].base != ptr) {
    pthread_mutex_unlock(&mem_host_lock);
    return 0;
  }
  struct mem_host m = mem_host_list[i];
  memmove(&mem_host_list[i], &mem_host_list[i + 1],
          (mem_host_count - (size_t)i - 1) * sizeof(*mem_host_list));
  mem_host_count--;
  if (m.fd >= 0) mem_host_nfds--;
  pthread_mutex_unlock(&mem_host_lock);
  if (m.heap) {
    free(m.base);
    return 1;
  }
  munmap(m.base, m.nbytes);
  if (m.fd >= 0) close(m.fd);
  return 1;
}

void mem_shared_find(const void *ptr, size_t nbytes, struct mem_shared_ref *ref_out) {
  memset(ref_out, 0, sizeof(*ref_out));
  ref_out->fd = -1;
  const char *p = ptr;
  pthread_mutex_lock(&mem_host_lock);
  ptrdiff_t i = mem_host_floor(ptr);
  if (i >= 0) {
    const struct mem_host *m = &mem_host_list[i];
    const char *base = m->base;
    if (m->fd >= 0 && p <= base + m->nbytes && nbytes <= (size_t)(base + m->nbytes - p))
      *ref_out = (struct mem_shared_ref){.fd = m->fd,
                                         .id = m->id,
                                         .dev = m->dev,
                                         .ino = m->ino,
                                         .base = (uintptr_t)m->base,
                                         .nbytes = m->nbytes};
  }
  pthread_mutex_unlock(&mem_host_lock);
}

/* One mapping of a peer's allocation. */
struct mem_peer_map {
  int peer;
  uint64_t id;
  uint64_t base;   /* in the peer's process */
  uint64_t nbytes;
  void *addr;      /* in this process */
  uint64_t used;   /* comm->seq when last asked for */
};

/* What mem keeps per communicator (comm_state_get): the peers' buffers
 * mapped here. */
struct mem_comm {
  struct mem_peer_map *maps;
  int nmaps, cap;
  int refused; /* a peer's buffer could not be mapped: stop trying */
};

static void mem_peer_map_drop(struct mem_comm *mc, int i) {
  munmap(mc->maps[i].addr, mc->maps[i].nbytes);
  mc->maps[i] = mc->maps[--mc->nmaps];
}

static void mem_comm_destroy(void *state) {
  struct mem_comm *mc = state;
  while (mc->nmaps > 0) mem_peer_map_drop(mc, mc->nmaps - 1);
  free(mc->maps);
  free(mc);
}

static const struct comm_state_ops mem_comm_ops = {.name = "mem", .destroy = mem_comm_destroy};

#ifdef WEFT_TEST_HOOKS
int mem_peer_map_count(const struct weftComm *comm) {
  const struct mem_comm *mc = comm_state_get(comm, &mem_comm_ops);
  return mc != NULL ? mc->nmaps : 0;
}
#endif

void *mem_peer_map(struct weftComm *comm, int peer, const struct mem_shared_ref *ref) {
  if (ref->fd < 0) return NULL;
  struct mem_comm *mc = comm_state_get(comm, &mem_comm_ops);
  if (mc == NULL) {
    mc = calloc(1, sizeof *mc);
    if (mc == NULL) return NULL;
    if (comm_state_set(comm, &mem_comm_ops, mc) != weftSuccess) {
      free(mc);
      return NULL;
    }
  }
  if (mc->refused) return NULL;
  for (int i = 0; i < mc->nmaps; i++) {
    struct mem_peer_map *m = &mc->maps[i];
    if (m->peer == peer && m->id == ref->id) {
      m->used = comm->seq;
      return m->addr;
    }
  }
  /* An older allocation of this peer over the same addresses has been freed:
   * its mapping only holds the pages alive now. */
  for (int i = 0; i < mc->nmaps;) {
    const struct mem_peer_map *m = &mc->maps[i];
    if (m->peer == peer && m->base < ref->base + ref->nbytes && ref->base < m->base + m->nbytes)
      mem_peer_map_drop(mc, i);
    else
      i++;
  }
  /* Past the cap, the least recently used mapping not needed by this call goes. */
  const int cap = 4 * comm->nranks + 16;
  if (mc->nmaps >= cap) {
    int oldest = -1;
    for (int i = 0; i < mc->nmaps; i++)
      if (mc->maps[i].used != comm->seq &&
          (oldest < 0 || mc->maps[i].used < mc->maps[oldest].used))
        oldest = i;
    if (oldest >= 0) mem_peer_map_drop(mc, oldest);
  }
  if (mc->nmaps == mc->cap) {
    int cap_new = mc->cap ? 2 * mc->cap : 8;
    struct mem_peer_map *grown = realloc(mc->maps, (size_t)cap_new * sizeof(*grown));
    if (grown == NULL) return NULL;
    mc->maps = grown;
    mc->cap = cap_new;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)comm->peers[peer].pid, (int)ref->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  void *addr = NULL;
  if (fd < 0) {
    WEFT_INFO(LOG_COLL, "cannot open rank %d's buffer (%s): %s; copying through the kernel", peer,
              path, strerror(errno));
  } else if (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != ref->dev ||
             (uint64_t)st.st_ino != ref->ino ||
             (uint64_t)st.st_size < ref->nbytes) {
    WEFT_INFO(LOG_COLL, "%s is not rank %d's buffer; copying through the kernel", path, peer);
  } else {
    addr = mmap(NULL, ref->nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      WEFT_INFO(LOG_COLL, "cannot map rank %d's buffer (%zu bytes): %s; copying through the kernel",
                peer, (size_t)ref->nbytes, strerror(errno));
      addr = NULL;
    }
  }
  if (fd >= 0) close(fd);
  if (addr == NULL) {
    mc->refused = 1;
    return NULL;
  }
  mc->maps[mc->nmaps++] = (struct mem_peer_map){.peer = peer,
                                                              .id = ref->id,
                                                              .base = ref->base,
                                                              .nbytes = ref->nbytes,
                                                              .addr = addr,
                                                              .used = comm->seq};
  return addr;
}

/* No object can be larger than PTRDIFF_MAX bytes (pointer differences
 * within it must fit), and an allocation rounded up to its alignment must
 * stay within that: larger sizes are argument errors, not requests the
 * system might refuse (rounding SIZE_MAX - 2 MiB + 2 up used to wrap to 0). */
static weftResult_t mem_nbytes_check(const char *name, size_t nbytes) {
  if (nbytes > (size_t)PTRDIFF_MAX - MEM_HUGE_NBYTES)
    return weft_error_set(weftInvalidArgument, "%s: nbytes %zu is larger than any object can be",
                          name, nbytes);
  return weftSuccess;
}

/* A registration: one entry of its comm's list (comm->regs), whose address
 * is the handle. The lock guards every comm's list: any thread registers. */
struct mem_reg {
  struct mem_reg *next;
  void *buff;
  size_t nbytes;
  int on_device; /* a device buffer, for the device executor's single-copy paths */
};
static pthread_mutex_t mem_reg_lock = PTHREAD_MUTEX_INITIALIZER;

weftResult_t weftMemAllocHost(void **ptr, size_t nbytes) {
  weft_error_clear();
  if (ptr == NULL) return weft_error_set(weftInvalidArgument, "MemAllocHost: ptr is NULL");
  if (nbytes == 0) return weft_error_set(weftInvalidArgument, "MemAllocHost: nbytes is 0");
  WEFT_TRY(mem_nbytes_check("MemAllocHost", nbytes));
  void *p = NULL;
  /* Buffers of 2 MiB and more are 2 MiB aligned and ask for transparent
   * huge pages (where the kernel leaves them to madvise; for shared memory,
   * where its shmem_enabled setting allows): the copies then walk a few large
   * pages instead of many small ones (with cross-memory attach on private
   * memory a 256 MiB all-reduce ran about 20 % faster on 2 cores). */
  const size_t align = nbytes >= MEM_HUGE_NBYTES ? MEM_HUGE_NBYTES : MEM_ALIGN;
  size_t rounded = (nbytes + align - 1) / align * align;
  if (nbytes >= MEM_SHARED_MIN_NBYTES) p = mem_shared_alloc(rounded, align);
  if (p == NULL) p = mem_heap_alloc(rounded, align);
  if (p == NULL)
    return weft_error_set(weftSystemError, "MemAllocHost: cannot allocate %zu bytes", nbytes);
  if (align == MEM_HUGE_NBYTES) (void)madvise(p, rounded, MADV_HUGEPAGE); /* a hint */
  *ptr = p;
  return weftSuccess;
}

/* Device memory when this thread has a CUDA context (as ncclMemAlloc), else
 * host memory as weftMemAllocHost. */
weftResult_t weftMemAlloc(void **ptr, size_t nbytes) {
  weft_error_clear();
  if (ptr == NULL) return weft_error_set(weftInvalidArgument, "MemAlloc: ptr is NULL");
  if (nbytes == 0) { /* as cudaMalloc's of 0 bytes (and NCCL's): NULL, which MemFree takes */
    *ptr = NULL;
    return weftSuccess;
  }
  WEFT_TRY(mem_nbytes_check("MemAlloc", nbytes));
  int on_device = 0;
  WEFT_TRY(device_mem_alloc(ptr, nbytes, &on_device));
  if (!on_device) return weftMemAllocHost(ptr, nbytes);
  if (mem_dev_insert(*ptr)) return weftSuccess;
  device_mem_free(*ptr);
  *ptr = NULL;
  return weft_error_set(weftSystemError, "MemAlloc: out of memory listing the allocation");
}

weftResult_t weftMemFree(void *ptr) {
  weft_error_clear();
  if (ptr == NULL) return weftSuccess;
  if (mem_dev_remove(ptr)) {
    if (device_mem_free(ptr)) return weftSuccess;
    return weft_error_set(weftUnhandledCudaError, "MemFree: the device refused to free %p (%s)",
                          ptr, weft_error_text());
  }
  if (mem_host_free(ptr)) return weftSuccess;
  return weft_error_set(weftInvalidArgument,
                        "MemFree: %p is not a buffer of weftMemAlloc or weftMemAllocHost (%s, "
                        "freed already, or not its start)",
                        ptr, device_ptr_on_device(ptr) ? "device memory allocated elsewhere"
                                                       : "never allocated there");
}

weftResult_t weftCommRegister(const weftComm_t comm, void *buff, size_t nbytes, void **handle) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  if (buff == NULL || handle == NULL)
    return weft_error_set(weftInvalidArgument, "CommRegister: %s is NULL",
                          buff == NULL ? "buff" : "handle");
  WEFT_TRY(mem_nbytes_check("CommRegister", nbytes));
  if ((uintptr_t)buff > UINTPTR_MAX - nbytes)
    return weft_error_set(weftInvalidArgument,
                          "CommRegister: [%p, +%zu) runs past the end of the address space", buff,
                          nbytes);
  struct mem_reg *reg = calloc(1, sizeof(*reg));
  if (reg == NULL) return weft_error_set(weftSystemError, "CommRegister: out of memory");
  reg->buff = buff;
  reg->nbytes = nbytes;
  reg->on_device = device_ptr_on_device(buff);
  pthread_mutex_lock(&mem_reg_lock);
  reg->next = comm->regs;
  comm->regs = reg;
  pthread_mutex_unlock(&mem_reg_lock);
  *handle = reg;
  return weftSuccess;
}

/* The handle is looked up in comm's list, never read: one that comm did not
 * hand out, or that was deregistered already, is refused as NCCL refuses it. */
weftResult_t weftCommDeregister(const weftComm_t comm, void *handle) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  if (handle == NULL)
    return weft_error_set(weftInvalidArgument, "CommDeregister: handle is NULL");
  struct mem_reg *reg = NULL;
  pthread_mutex_lock(&mem_reg_lock);
  for (struct mem_reg **at = &comm->regs; *at != NULL; at = &(*at)->next)
    if (*at == handle) {
      reg = *at;
      *at = reg->next;
      break;
    }
  pthread_mutex_unlock(&mem_reg_lock);
  if (reg == NULL)
    return weft_error_set(weftInvalidUsage,
                          "CommDeregister: handle %p was not registered with this communicator "
                          "(or was deregistered already)",
                          handle);
  free(reg);
  return weftSuccess;
}

void mem_regs_free(struct weftComm *comm) {
  pthread_mutex_lock(&mem_reg_lock);
  struct mem_reg *reg = comm->regs;
  comm->regs = NULL;
  pthread_mutex_unlock(&mem_reg_lock);
  while (reg != NULL) {
    struct mem_reg *next = reg->next;
    free(reg);
    reg = next;
  }
}
