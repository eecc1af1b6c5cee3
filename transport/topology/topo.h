/* Topology: the machine's packages, NUMA nodes, cores and PCI tree (host
 * bridges, PCI switches, GPUs, NICs), read through hwloc from the live
 * machine or from an hwloc XML file (WEFT_TOPO_FILE), so that a machine weft
 * does not run on can be planned here. Without hwloc, NUMA nodes and cores
 * come from /sys and the PCI tree is empty.
 *
 * Ranks describe their place in it (NUMA node, package, host bridge, PCI
 * switch, bus, NIC) in their peer info; rings and trees are ordered by it,
 * and FIFOs and proxy threads are placed on the rank's NUMA node. */
#ifndef WEFT_TOPO_H
#define WEFT_TOPO_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../../include/weft.h"
#include "../base/param_load.h"
#include "../base/peer_info.h"

/* The topology's settings: WEFT_TOPO_FILE, WEFT_TOPO_NUMA. */
extern struct weft_param topo_params[];

#define TOPO_MAX_NUMA 64
#define TOPO_MAX_DEVS 128

enum topo_dev_kind { TOPO_DEV_GPU, TOPO_DEV_NIC };

/* How far apart two PCI devices are, nearest first. */
enum topo_path {
  TOPO_PATH_SWITCH = 1, /* behind one PCI switch */
  TOPO_PATH_BRIDGE,     /* behind one host bridge, across PCI switches */
  TOPO_PATH_NUMA,       /* one NUMA node, across host bridges */
  TOPO_PATH_SYS,        /* across NUMA nodes (the CPU interconnect) */
};

struct topo_dev {
  enum topo_dev_kind kind;
  char name[48];      /* the OS devices' names ("mlx5_0,ib0"), else "gpuN"/"nicN" */
  int64_t bus_id;     /* domain << 20 | bus << 12 | device << 4 | function */
  uint16_t vendor_id, device_id, class_id;
  int numa;           /* index in topo.numa of the nearest NUMA node, or -1 */
  int package;        /* index of its package, or -1 */
  int bridge;         /* index of its host bridge, or -1 */
  int pci_switch;     /* index of its PCI switch (the topmost PCI bridge), or -1 */
  int ib;             /* a NIC with an ibverbs (OpenFabrics) device */
  int nearest_nic;    /* a GPU: index in devs of the NIC it uses, or -1 */
};

struct topo_numa {
  int os_index;
  int package;        /* index of its package, or -1 */
  uint64_t memory_nbytes;
  cpu_set_t cpus;
};

struct topo {
  char source[300];   /* "hwloc", "hwloc XML <file>", "sysfs" */
  int this_system;    /* describes the machine we run on: binding applies */
  int npackages, ncores, npus;
  int nnuma;
  struct topo_numa numa[TOPO_MAX_NUMA];
  int numa_latency[TOPO_MAX_NUMA][TOPO_MAX_NUMA]; /* relative; 0: unknown */
  int nbridges, nswitches;
  int ndevs, ngpus, nnics;
  struct topo_dev devs[TOPO_MAX_DEVS]; /* GPUs, then NICs, each in bus order */
};

/* Loads a topology: from xml_path when non-NULL (needs hwloc), else from
 * WEFT_TOPO_FILE, else the live machine (hwloc, or /sys without it). */
weftResult_t topo_load(const char *xml_path, struct topo **topo_out);
void topo_free(struct topo *topo);

/* This process's topology, loaded on first use and kept; never NULL (an
 * empty one when loading failed, after a warning). topo_get_cpus may skip
 * the PCI tree (no GPUs, no NICs) when the full one was not needed yet:
 * enough for host ranks and placement, and much cheaper. */
const struct topo *topo_get(void);
const struct topo *topo_get_cpus(void);

/* The index in devs of the GPU with CUDA number cuda_dev (GPUs numbered in
 * bus order), or -1. */
int topo_gpu(const struct topo *topo, int cuda_dev);

enum topo_path topo_dev_path(const struct topo *topo, const struct topo_dev *a,
                             const struct topo_dev *b);
const char *topo_path_name(enum topo_path path);

/* A rank's place: the GPU's when cuda_dev names one, else that of NUMA node
 * numa (an index in topo->numa; -1: the node this process runs on). */
struct topo_place {
  int numa, package, bridge, pci_switch, gpu, nic;
  int64_t bus_id;
};
void topo_place_rank(const struct topo *topo, int cuda_dev, int numa, struct topo_place *out);

/* Copies a place into info's topology fields. */
void topo_peer_fill(const struct topo *topo, const struct topo_place *pl, struct peer_info *info);

/* Fills info's topology fields (numa_node, package, host_bridge, pci_switch,
 * bus_id, nic) for a rank of this process using cuda_dev (-1: a host rank). */
void topo_peer_info(struct peer_info *info, int cuda_dev);

/* Memory and thread placement on the rank's NUMA node (WEFT_TOPO_NUMA).
 * Both are best effort: a failure is logged, never an error. Memory is
 * placed before its pages are first touched or allocated (pages already
 * there stay where they are). */
void topo_mem_place(void *addr, size_t nbytes);
void topo_thread_place(void);
/* The NUMA node (os index) placement uses, or -1 when it is off. */
int topo_place_node(void);

/* Prints the topology as an indented tree: packages, NUMA nodes, cores,
 * host bridges, switches, GPUs (with their NIC), NICs, NUMA latencies. */
void topo_print(const struct topo *topo, FILE *out);

/* "0000:03:00.0" form of a bus id into buf (at least 16 bytes). */
const char *topo_bus_text(int64_t bus_id, char *buf, size_t nbytes);

#endif
