/* Topology from hwloc (or /sys), a rank's place in it, and NUMA placement. */
#include "topo.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../base/param.h"
#include "../base/status.h"
#include "weft_build_config.h"

#if WEFT_HAVE_HWLOC
#include <hwloc.h>
#endif

struct weft_param topo_params[] = {
    {.name = "WEFT_TOPO_FILE", .type = PARAM_STR,
     .doc = "an hwloc XML file (`lstopo --of xml`) read instead of this machine's topology: "
            "rings, trees and NIC choices follow it; needs weft built with hwloc",
     .see = "topology.md"},
    {.name = "WEFT_TOPO_NUMA", .type = PARAM_STR, .default_str = "auto",
     .doc = "where FIFOs and proxy threads go: `auto` the rank's NUMA node (its GPU's, else the "
            "one its CPUs are on), `off` no placement, or a NUMA node number"},
    PARAM_END,
};
enum { P_FILE, P_NUMA };

/* --- loading ------------------------------------------------------------ */

static struct topo *topo_alloc(const char *source) {
  struct topo *t = calloc(1, sizeof *t);
  if (t != NULL) snprintf(t->source, sizeof t->source, "%s", source);
  return t;
}

static int numa_index_of_os(const struct topo *t, int os_index) {
  for (int i = 0; i < t->nnuma; i++)
    if (t->numa[i].os_index == os_index) return i;
  return -1;
}

/* Parses a /sys cpu list ("0-3,8,10-11") into set. */
static void cpulist_parse(const char *s, cpu_set_t *set) {
  CPU_ZERO(set);
  while (*s != '\0' && *s != '\n') {
    char *end;
    long a = strtol(s, &end, 10), b = a;
    if (end == s) break;
    if (*end == '-') b = strtol(end + 1, &end, 10);
    for (long c = a; c <= b && c < CPU_SETSIZE; c++)
      if (c >= 0) CPU_SET((int)c, set);
    s = *end == ',' ? end + 1 : end;
  }
}

/* NUMA nodes and cores from /sys: what weft knows without hwloc. */
static weftResult_t topo_load_sysfs(struct topo **topo_out) {
  struct topo *t = topo_alloc("sysfs");
  if (t == NULL) return weft_error_set(weftSystemError, "out of memory");
  t->this_system = 1;
  DIR *dir = opendir("/sys/devices/system/node");
  struct dirent *e;
  while (dir != NULL && (e = readdir(dir)) != NULL && t->nnuma < TOPO_MAX_NUMA) {
    int idx;
    if (sscanf(e->d_name, "node%d", &idx) != 1) continue;
    char path[128], buf[4096];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", idx);
    FILE *f = fopen(path, "re");
    if (f == NULL) continue;
    if (fgets(buf, sizeof buf, f) != NULL) {
      struct topo_numa *n = &t->numa[t->nnuma++];
      n->os_index = idx;
      n->package = -1;
      cpulist_parse(buf, &n->cpus);
    }
    fclose(f);
  }
  if (dir != NULL) closedir(dir);
  /* readdir's order is arbitrary: sort by os index */
  for (int i = 1; i < t->nnuma; i++)
    for (int j = i; j > 0 && t->numa[j].os_index < t->numa[j - 1].os_index; j--) {
      struct topo_numa tmp = t->numa[j];
      t->numa[j] = t->numa[j - 1];
      t->numa[j - 1] = tmp;
    }
  long ncpu = sysconf(_SC_NPROCESSORS_CONF);
  t->npus = ncpu > 0 ? (int)ncpu : 1;
  t->ncores = t->npus;
  t->npackages = 1;
  if (t->nnuma == 0) { /* no /sys: one node with every cpu */
    t->nnuma = 1;
    t->numa[0].package = -1;
    for (int c = 0; c < t->npus && c < CPU_SETSIZE; c++) CPU_SET(c, &t->numa[0].cpus);
  }
  *topo_out = t;
  return weftSuccess;
}

#if WEFT_HAVE_HWLOC

/* Dense index of key among the keys seen so far (added when new). */
static int dense_index(int *keys, int *nkeys, int max, int key) {
  for (int i = 0; i < *nkeys; i++)
    if (keys[i] == key) return i;
  if (*nkeys >= max) return -1;
  keys[*nkeys] = key;
  return (*nkeys)++;
}

static void hw_numa(hwloc_topology_t hw, struct topo *t) {
  int n = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n && t->nnuma < TOPO_MAX_NUMA; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
    struct topo_numa *nm = &t->numa[t->nnuma++];
    nm->os_index = (int)o->os_index;
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_PACKAGE, o);
    nm->package = pkg != NULL ? (int)pkg->logical_index : -1;
    nm->memory_nbytes = o->attr != NULL ? o->attr->numanode.local_memory : 0;
    CPU_ZERO(&nm->cpus);
    for (int c = hwloc_bitmap_first(o->cpuset); c >= 0 && c < CPU_SETSIZE;
         c = hwloc_bitmap_next(o->cpuset, c))
      CPU_SET(c, &nm->cpus);
  }
  struct hwloc_distances_s *d[1];
  unsigned nr = 1;
  if (hwloc_distances_get_by_type(hw, HWLOC_OBJ_NUMANODE, &nr, d,
                                  HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0) == 0 && nr > 0) {
    for (unsigned i = 0; i < d[0]->nbobjs; i++)
      for (unsigned j = 0; j < d[0]->nbobjs; j++) {
        int a = numa_index_of_os(t, (int)d[0]->objs[i]->os_index);
        int b = numa_index_of_os(t, (int)d[0]->objs[j]->os_index);
        if (a >= 0 && b >= 0) t->numa_latency[a][b] = (int)d[0]->values[i * d[0]->nbobjs + j];
      }
    hwloc_distances_release(hw, d[0]);
  }
}

static int pci_is_gpu(const struct hwloc_pcidev_attr_s *p) {
  return p->class_id == 0x0302 || (p->class_id == 0x0300 && p->vendor_id == 0x10de);
}

static int pci_is_nic(const struct hwloc_pcidev_attr_s *p) {
  return p->class_id == 0x0200 || p->class_id == 0x0207;
}

/* Fills dev from a PCI device: bus id, NUMA node, host bridge, switch, names. */
static void hw_dev(hwloc_topology_t hw, struct topo *t, hwloc_obj_t o, struct topo_dev *dev,
                   int *bridge_keys, int *switch_keys) {
  const struct hwloc_pcidev_attr_s *p = &o->attr->pcidev;
  dev->bus_id = (int64_t)p->domain << 20 | (int64_t)p->bus << 12 | (int64_t)p->dev << 4 | p->func;
  dev->vendor_id = p->vendor_id;
  dev->device_id = p->device_id;
  dev->class_id = p->class_id;
  dev->nearest_nic = -1;
  hwloc_obj_t cpu_side = hwloc_get_non_io_ancestor_obj(hw, o);
  int node = cpu_side != NULL && cpu_side->nodeset != NULL ? hwloc_bitmap_first(cpu_side->nodeset)
                                                          : -1;
  dev->numa = node >= 0 ? numa_index_of_os(t, node) : -1;
  hwloc_obj_t pkg =
      cpu_side != NULL ? hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_PACKAGE, cpu_side) : NULL;
  if (pkg == NULL && dev->numa >= 0) dev->package = t->numa[dev->numa].package;
  else dev->package = pkg != NULL ? (int)pkg->logical_index : -1;
  /* walk up: the host bridge, and below it the topmost PCI bridge (the switch) */
  dev->bridge = dev->pci_switch = -1;
  hwloc_obj_t top_pci_bridge = NULL;
  for (hwloc_obj_t up = o->parent; up != NULL && up->type == HWLOC_OBJ_BRIDGE; up = up->parent) {
    if (up->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST)
      dev->bridge = dense_index(bridge_keys, &t->nbridges, TOPO_MAX_DEVS, (int)up->gp_index);
    else
      top_pci_bridge = up;
  }
  if (top_pci_bridge != NULL)
    dev->pci_switch = dense_index(switch_keys, &t->nswitches, TOPO_MAX_DEVS,
                                  (int)top_pci_bridge->gp_index);
  dev->name[0] = '\0';
  for (hwloc_obj_t c = o->io_first_child; c != NULL; c = c->next_sibling) {
    if (c->type != HWLOC_OBJ_OS_DEVICE || c->name == NULL) continue;
    if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) dev->ib = 1;
    size_t len = strlen(dev->name);
    snprintf(dev->name + len, sizeof dev->name - len, "%s%s", len ? "," : "", c->name);
  }
}

static weftResult_t topo_load_hwloc(const char *xml_path, int with_pci, struct topo **topo_out) {
  hwloc_topology_t hw;
  if (hwloc_topology_init(&hw) != 0) return weft_error_errno(weftSystemError, "hwloc init");
  weftResult_t res = weftSuccess;
  /* GPUs are found on the PCI bus; the plug-ins that would open CUDA, NVML
   * or OpenCL to name them cost seconds and start drivers. The x86 backend
   * reads CPUID on every core by moving the thread there, which waits for
   * each core in turn (seconds when ranks outnumber cores); Linux's sysfs
   * tells the same. */
  static const char *const skip[] = {"cuda", "nvml", "opencl", "rsmi", "levelzero", "gl", "x86"};
  for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
    hwloc_topology_set_components(hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, skip[i]);
#if HWLOC_API_VERSION >= 0x00020500
  hwloc_topology_set_flags(hw, HWLOC_TOPOLOGY_FLAG_DONT_CHANGE_BINDING);
#endif
  hwloc_topology_set_cache_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_NONE); /* unused */
  hwloc_topology_set_icache_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_NONE);
  if (with_pci) hwloc_topology_set_io_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (xml_path != NULL && hwloc_topology_set_xml(hw, xml_path) != 0) {
    res = weft_error_errno(weftInvalidArgument, "hwloc cannot read topology file %s", xml_path);
    goto destroy;
  }
  if (hwloc_topology_load(hw) != 0) {
    res = weft_error_errno(xml_path ? weftInvalidArgument : weftSystemError,
                           "hwloc could not load the topology%s%s", xml_path ? " of " : "",
                           xml_path ? xml_path : "");
    goto destroy;
  }
  char source[300];
  if (xml_path != NULL) snprintf(source, sizeof source, "hwloc XML %s", xml_path);
  else snprintf(source, sizeof source, with_pci ? "hwloc" : "hwloc (CPUs and NUMA nodes only)");
  struct topo *t = topo_alloc(source);
  if (t == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto destroy;
  }
  t->this_system = hwloc_topology_is_thissystem(hw);
  t->npackages = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
  t->ncores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
  t->npus = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
  hw_numa(hw, t);
  int bridge_keys[TOPO_MAX_DEVS], switch_keys[TOPO_MAX_DEVS];
  /* GPUs first, then NICs, each in bus order (hwloc lists PCI devices so) */
  for (int kind = 0; kind < 2; kind++) {
    for (hwloc_obj_t o = hwloc_get_next_pcidev(hw, NULL); o != NULL;
         o = hwloc_get_next_pcidev(hw, o)) {
      int is_gpu = pci_is_gpu(&o->attr->pcidev), is_nic = pci_is_nic(&o->attr->pcidev);
      if ((kind == 0 && !is_gpu) || (kind == 1 && !is_nic) || t->ndevs >= TOPO_MAX_DEVS) continue;
      struct topo_dev *dev = &t->devs[t->ndevs++];
      dev->kind = kind == 0 ? TOPO_DEV_GPU : TOPO_DEV_NIC;
      hw_dev(hw, t, o, dev, bridge_keys, switch_keys);
      int nth = kind == 0 ? t->ngpus++ : t->nnics++;
      if (dev->name[0] == '\0')
        snprintf(dev->name, sizeof dev->name, "%s%d", kind == 0 ? "gpu" : "nic", nth);
    }
  }
  *topo_out = t;
destroy:
  hwloc_topology_destroy(hw);
  return res;
}
#endif

/* Pairs every GPU with its nearest NIC: the fewest PCI hops (same switch,
 * then host bridge, NUMA node), ties to the NIC fewest GPUs use yet, then an
 * ibverbs one, then bus order. */
static void topo_pair_nics(struct topo *t) {
  int users[TOPO_MAX_DEVS] = {0};
  for (int g = 0; g < t->ndevs; g++) {
    struct topo_dev *gpu = &t->devs[g];
    if (gpu->kind != TOPO_DEV_GPU) continue;
    int best = -1;
    enum topo_path best_path = TOPO_PATH_SYS;
    for (int n = 0; n < t->ndevs; n++) {
      const struct topo_dev *nic = &t->devs[n];
      if (nic->kind != TOPO_DEV_NIC) continue;
      enum topo_path p = topo_dev_path(t, gpu, nic);
      int better = best < 0 || p < best_path ||
                   (p == best_path && (users[n] < users[best] ||
                                       (users[n] == users[best] && nic->ib > t->devs[best].ib)));
      if (better) best = n, best_path = p;
    }
    gpu->nearest_nic = best;
    if (best >= 0) users[best]++;
  }
}

/* with_pci 0 skips the PCI scan on the live machine (a file is read whole):
 * about 15 ms of CPU and, on a loaded virtual machine, up to half a second */
static weftResult_t topo_load_ex(const char *xml_path, int with_pci, struct topo **topo_out) {
  if (xml_path == NULL) xml_path = param_str(&topo_params[P_FILE]);
  struct topo *t = NULL;
#if WEFT_HAVE_HWLOC
  WEFT_TRY(topo_load_hwloc(xml_path, with_pci || xml_path != NULL, &t));
#else
  (void)with_pci;
  if (xml_path != NULL)
    return weft_error_set(weftInvalidUsage,
                          "cannot read topology file %s: weft was built without hwloc", xml_path);
  WEFT_TRY(topo_load_sysfs(&t));
#endif
  topo_pair_nics(t);
  *topo_out = t;
  return weftSuccess;
}

weftResult_t topo_load(const char *xml_path, struct topo **topo_out) {
  return topo_load_ex(xml_path, 1, topo_out);
}

void topo_free(struct topo *topo) { free(topo); }

/* This process's topologies: [0] CPUs and NUMA nodes only, [1] with the
 * PCI tree. Each is loaded once, on first use. */
static struct topo *topo_process[2];
static pthread_once_t topo_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static void topo_process_load(int with_pci) {
  struct topo *t = NULL;
  if (topo_load_ex(NULL, with_pci, &t) == weftSuccess) {
    WEFT_INFO(LOG_INIT, "topology from %s: %d NUMA node(s), %d GPU(s), %d NIC(s)", t->source,
              t->nnuma, t->ngpus, t->nnics);
  } else {
    WEFT_WARN(LOG_INIT, "no topology (%s); using /sys only", weft_error_text());
    if (topo_load_sysfs(&t) != weftSuccess) {
      static struct topo empty = {.source = "none", .nnuma = 0};
      t = &empty;
    }
  }
  __atomic_store_n(&topo_process[with_pci], t, __ATOMIC_RELEASE);
}

static void topo_process_load_cpus(void) { topo_process_load(0); }
static void topo_process_load_pci(void) { topo_process_load(1); }

const struct topo *topo_get(void) {
  pthread_once(&topo_once[1], topo_process_load_pci);
  return topo_process[1];
}

const struct topo *topo_get_cpus(void) {
  const struct topo *full = __atomic_load_n(&topo_process[1], __ATOMIC_ACQUIRE);
  if (full != NULL) return full;
  pthread_once(&topo_once[0], topo_process_load_cpus);
  return topo_process[0];
}

/* --- queries ------------------------------------------------------------- */

int topo_gpu(const struct topo *topo, int cuda_dev) {
  if (cuda_dev < 0 || cuda_dev >= topo->ngpus) return -1;
  return cuda_dev; /* GPUs come first in devs, in bus order */
}

enum topo_path topo_dev_path(const struct topo *topo, const struct topo_dev *a,
                             const struct topo_dev *b) {
  (void)topo;
  if (a->pci_switch >= 0 && a->pci_switch == b->pci_switch) return TOPO_PATH_SWITCH;
  if (a->bridge >= 0 && a->bridge == b->bridge) return TOPO_PATH_BRIDGE;
  if (a->numa >= 0 && a->numa == b->numa) return TOPO_PATH_NUMA;
  return TOPO_PATH_SYS;
}

const char *topo_path_name(enum topo_path path) {
  switch (path) {
    case TOPO_PATH_SWITCH: return "switch";
    case TOPO_PATH_BRIDGE: return "host-bridge";
    case TOPO_PATH_NUMA: return "numa";
    default: return "sys";
  }
}

/* The NUMA node (index) this process runs on: the one holding every cpu it
 * may use, else the one of the cpu it is on now. */
static int topo_numa_here(const struct topo *topo) {
  if (topo->nnuma == 0 || !topo->this_system) return topo->nnuma > 0 ? 0 : -1;
  cpu_set_t mine, both;
  if (sched_getaffinity(0, sizeof mine, &mine) == 0) {
    for (int i = 0; i < topo->nnuma; i++) {
      CPU_AND(&both, &mine, &topo->numa[i].cpus);
      if (CPU_EQUAL(&both, &mine)) return i;
    }
  }
  int cpu = sched_getcpu();
  for (int i = 0; i < topo->nnuma && cpu >= 0; i++)
    if (CPU_ISSET(cpu, &topo->numa[i].cpus)) return i;
  return 0;
}

/* The NIC a host rank on NUMA node numa uses: one on its node (ibverbs
 * first), else any (ibverbs first). */
static int topo_nic_for_numa(const struct topo *topo, int numa) {
  int best = -1, best_score = -1;
  for (int n = 0; n < topo->ndevs; n++) {
    const struct topo_dev *nic = &topo->devs[n];
    if (nic->kind != TOPO_DEV_NIC) continue;
    int score = (nic->numa == numa) * 2 + nic->ib;
    if (score > best_score) best = n, best_score = score;
  }
  return best;
}

void topo_place_rank(const struct topo *topo, int cuda_dev, int numa, struct topo_place *out) {
  out->gpu = topo_gpu(topo, cuda_dev);
  if (out->gpu >= 0) {
    const struct topo_dev *g = &topo->devs[out->gpu];
    out->numa = g->numa;
    out->package = g->package;
    out->bridge = g->bridge;
    out->pci_switch = g->pci_switch;
    out->bus_id = g->bus_id;
    out->nic = g->nearest_nic;
    return;
  }
  out->numa = numa >= 0 && numa < topo->nnuma ? numa : topo_numa_here(topo);
  out->package = out->numa >= 0 ? topo->numa[out->numa].package : -1;
  out->bridge = out->pci_switch = -1;
  out->bus_id = -1;
  out->nic = topo_nic_for_numa(topo, out->numa);
}

void topo_peer_fill(const struct topo *topo, const struct topo_place *pl, struct peer_info *info) {
  info->numa_node = pl->numa >= 0 ? topo->numa[pl->numa].os_index : -1;
  info->package = pl->package;
  info->host_bridge = pl->bridge;
  info->pci_switch = pl->pci_switch;
  info->bus_id = pl->bus_id;
  info->nic = pl->nic;
}

void topo_peer_info(struct peer_info *info, int cuda_dev) {
  /* a host rank needs no PCI scan unless something loaded it already */
  const struct topo *topo = cuda_dev >= 0 ? topo_get() : topo_get_cpus();
  struct topo_place pl;
  topo_place_rank(topo, cuda_dev, -1, &pl);
  topo_peer_fill(topo, &pl, info);
}

/* --- placement ----------------------------------------------------------- */

int topo_place_node(void) {
  const struct topo *topo = topo_get_cpus();
  const char *mode = param_str(&topo_params[P_NUMA]);
  if (!topo->this_system || topo->nnuma == 0) return -1;
  if (mode == NULL || strcmp(mode, "auto") == 0) {
    int i = topo_numa_here(topo);
    return i >= 0 ? topo->numa[i].os_index : -1;
  }
  if (strcmp(mode, "off") == 0) return -1;
  char *end;
  long node = strtol(mode, &end, 10);
  if (*end != '\0' || numa_index_of_os(topo, (int)node) < 0) {
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
      WEFT_WARN(LOG_INIT, "ignoring WEFT_TOPO_NUMA=%s: not auto, off or a NUMA node here", mode);
    return -1;
  }
  return (int)node;
}

#ifndef MPOL_PREFERRED
#define MPOL_PREFERRED 1
#endif

void topo_mem_place(void *addr, size_t nbytes) {
  int node = topo_place_node();
  if (node < 0 || node >= 64 * 16) return;
  unsigned long mask[16] = {0};
  mask[node / 64] = 1ul << (node % 64);
  /* preferred, not bound: a full node spills over instead of failing */
  /* no MPOL_MF_MOVE: moving pages waits for an RCU grace period, which takes
   * seconds when ranks outnumber cores; callers place memory before touching it */
  if (syscall(SYS_mbind, addr, nbytes, MPOL_PREFERRED, mask, (unsigned long)(node + 2), 0ul) != 0)
    WEFT_INFO(LOG_INIT, "mbind of %zu bytes to NUMA node %d failed: %m", nbytes, node);
}

void topo_thread_place(void) {
  int node = topo_place_node();
  if (node < 0) return;
  const struct topo *topo = topo_get_cpus();
  int i = numa_index_of_os(topo, node);
  cpu_set_t mine, both;
  if (i < 0 || sched_getaffinity(0, sizeof mine, &mine) != 0) return;
  CPU_AND(&both, &mine, &topo->numa[i].cpus);
  if (CPU_COUNT(&both) == 0 || CPU_EQUAL(&both, &mine)) return; /* nothing to narrow */
  int rc = pthread_setaffinity_np(pthread_self(), sizeof both, &both);
  if (rc != 0)
    WEFT_INFO(LOG_INIT, "binding a thread to NUMA node %d failed: %s", node, strerror(rc));
}

/* --- printing ------------------------------------------------------------ */

const char *topo_bus_text(int64_t bus_id, char *buf, size_t nbytes) {
  if (bus_id < 0) snprintf(buf, nbytes, "-");
  else
    snprintf(buf, nbytes, "%04x:%02x:%02x.%x", (unsigned)(bus_id >> 20),
             (unsigned)(bus_id >> 12) & 0xff, (unsigned)(bus_id >> 4) & 0xff,
             (unsigned)bus_id & 0xf);
  return buf;
}

/* "0-3,8" form of a cpu set. */
static void cpus_text(const cpu_set_t *set, char *buf, size_t nbytes) {
  size_t len = 0;
  buf[0] = '\0';
  for (int c = 0; c < CPU_SETSIZE && len + 16 < nbytes; c++) {
    if (!CPU_ISSET(c, set)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set)) e++;
    len += (size_t)snprintf(buf + len, nbytes - len, e > c ? "%s%d-%d" : "%s%d", len ? "," : "",
                            c, e);
    c = e;
  }
}

static void dev_print(const struct topo *t, const struct topo_dev *d, const char *indent,
                      FILE *out) {
  char bus[24];
  fprintf(out, "%s%s %-14s %s [%04x:%04x]", indent, d->kind == TOPO_DEV_GPU ? "GPU" : "NIC",
          d->name, topo_bus_text(d->bus_id, bus, sizeof bus), d->vendor_id, d->device_id);
  if (d->kind == TOPO_DEV_NIC && d->ib) fprintf(out, " ibverbs");
  if (d->kind == TOPO_DEV_GPU && d->nearest_nic >= 0) {
    const struct topo_dev *n = &t->devs[d->nearest_nic];
    fprintf(out, " -> NIC %s (%s)", n->name, topo_path_name(topo_dev_path(t, d, n)));
  }
  fputc('\n', out);
}

void topo_print(const struct topo *t, FILE *out) {
  fprintf(out, "topology: %s\n", t->source);
  fprintf(out, "  %d package(s), %d core(s), %d PU(s), %d NUMA node(s), %d GPU(s), %d NIC(s)\n",
          t->npackages, t->ncores, t->npus, t->nnuma, t->ngpus, t->nnics);
  char cpus[256];
  for (int i = 0; i < t->nnuma; i++) {
    const struct topo_numa *n = &t->numa[i];
    cpus_text(&n->cpus, cpus, sizeof cpus);
    fprintf(out, "  NUMA node %d (package %d, ", n->os_index, n->package);
    if (n->memory_nbytes > 0)
      fprintf(out, "%llu MiB, ", (unsigned long long)(n->memory_nbytes >> 20));
    fprintf(out, "cpus %s)\n", cpus);
    for (int b = -1; b < t->nbridges; b++) {
      int printed_bridge = 0;
      for (int s = -1; s < t->nswitches; s++) {
        int printed_switch = 0;
        for (int d = 0; d < t->ndevs; d++) {
          const struct topo_dev *dev = &t->devs[d];
          if (dev->numa != i || dev->bridge != b || dev->pci_switch != s) continue;
          if (!printed_bridge && b >= 0) fprintf(out, "    host bridge %d\n", b);
          printed_bridge = 1;
          if (!printed_switch && s >= 0) fprintf(out, "      PCI switch %d\n", s);
          printed_switch = 1;
          dev_print(t, dev, s >= 0 ? "        " : "      ", out);
        }
      }
    }
  }
  for (int d = 0; d < t->ndevs; d++)
    if (t->devs[d].numa < 0) dev_print(t, &t->devs[d], "  (no NUMA node) ", out);
  int have_latency = 0;
  for (int i = 0; i < t->nnuma; i++) have_latency |= t->numa_latency[i][i] != 0;
  if (have_latency && t->nnuma > 1) {
    fprintf(out, "  NUMA latency:");
    for (int j = 0; j < t->nnuma; j++) fprintf(out, " %5d", t->numa[j].os_index);
    fputc('\n', out);
    for (int i = 0; i < t->nnuma; i++) {
      fprintf(out, "  %12d", t->numa[i].os_index);
      for (int j = 0; j < t->nnuma; j++) fprintf(out, " %5d", t->numa_latency[i][j]);
      fputc('\n', out);
    }
  }
}
