/* weftTopoPrint: the topology and the rings, trees and transports weft
 * would build on it, computed from planned peer info by the same functions
 * a communicator uses. */
#include "topo_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "../../transport/transport.h"
#include "../core/channel.h"
#include "../core/comm.h"
#include "../core/params.h"
#include "../core/tree_links.h"

weftResult_t topo_plan_peers(const struct topo *topo, int nranks, int nhosts, int flags,
                             struct peer_info *peers_out) {
  if (nranks < 1 || nhosts < 1 || nhosts > nranks)
    return weft_error_set(weftInvalidArgument,
                          "plan of %d rank(s) on %d host(s): need 1 <= hosts <= ranks", nranks,
                          nhosts);
  if ((flags & WEFT_TOPO_GPUS) && topo->ngpus == 0)
    return weft_error_set(weftInvalidArgument, "the topology (%s) has no GPU", topo->source);
  for (int r = 0; r < nranks; r++) {
    const int rr = flags & WEFT_TOPO_ROUND_ROBIN;
    const int host = rr ? r % nhosts : (int)((long)r * nhosts / nranks);
    /* this rank's index among its host's ranks, and how many those are */
    int local = 0, nlocal = 0;
    for (int q = 0; q < nranks; q++) {
      int hq = rr ? q % nhosts : (int)((long)q * nhosts / nranks);
      if (hq != host) continue;
      if (q < r) local++;
      nlocal++;
    }
    struct peer_info *p = &peers_out[r];
    memset(p, 0, sizeof *p);
    p->rank = r;
    p->pid = 0;
    p->host_hash = (uint64_t)host + 1;
    snprintf(p->hostname, sizeof p->hostname, "host%d", host);
    p->cuda_dev = flags & WEFT_TOPO_GPUS ? local % topo->ngpus : -1;
    int numa = topo->nnuma > 0 ? (int)((long)local * topo->nnuma / nlocal) : -1;
    struct topo_place pl;
    topo_place_rank(topo, p->cuda_dev, numa, &pl);
    topo_peer_fill(topo, &pl, p);
  }
  return weftSuccess;
}

void ring_count_crossings(const struct peer_info *peers, int nranks, const int *ring,
                          struct ring_crossings *out) {
  memset(out, 0, sizeof *out);
  if (nranks < 2) return;
  for (int i = 0; i < nranks; i++) {
    const struct peer_info *a = &peers[ring[i]], *b = &peers[ring[(i + 1) % nranks]];
    int other_host = a->host_hash != b->host_hash;
    out->hosts += other_host;
    out->numa += other_host || a->numa_node != b->numa_node;
    out->switches += other_host || a->pci_switch != b->pci_switch;
  }
}

static void plan_print_ranks(const struct topo *topo, const struct peer_info *peers, int n,
                             FILE *out) {
  fprintf(out, "  rank host numa package bridge switch bus          gpu            nic\n");
  for (int r = 0; r < n; r++) {
    const struct peer_info *p = &peers[r];
    char bus[24];
    int g = topo_gpu(topo, p->cuda_dev);
    fprintf(out, "  %4d %4s %4d %7d %6d %6d %-12s %-14s %s", r, p->hostname + 4, p->numa_node,
            p->package, p->host_bridge, p->pci_switch, topo_bus_text(p->bus_id, bus, sizeof bus),
            g >= 0 ? topo->devs[g].name : "-", p->nic >= 0 ? topo->devs[p->nic].name : "-");
    if (g >= 0 && p->nic >= 0)
      fprintf(out, " (%s)",
              topo_path_name(topo_dev_path(topo, &topo->devs[g], &topo->devs[p->nic])));
    fputc('\n', out);
  }
}

/* the ring and the matrix show the transports of host memory */
static const struct transport_need host_need = {.mem = TRANSPORT_MEM_HOST};

static void plan_print_transports(const struct peer_info *peers, int n, FILE *out) {
  int ntransports = 0;
  while (weft_transports[ntransports] != NULL) ntransports++;
  fprintf(out, "transports (row sends to column):");
  for (int t = 0; t < ntransports; t++) fprintf(out, " %d = %s,", t, weft_transports[t]->name);
  fprintf(out, " - = none\n");
  if (n > 64) { /* a matrix too wide to read: totals */
    long count[16] = {0}, none = 0;
    for (int s = 0; s < n; s++)
      for (int r = 0; r < n; r++) {
        if (s == r) continue;
        int t = transport_select(&peers[s], &peers[r], &host_need, NULL, 0);
        if (t < 0 || t >= 16) none++;
        else count[t]++;
      }
    for (int t = 0; t < ntransports && t < 16; t++)
      fprintf(out, "  %s: %ld pair(s)\n", weft_transports[t]->name, count[t]);
    if (none) fprintf(out, "  none: %ld pair(s)\n", none);
    return;
  }
  fprintf(out, "      ");
  for (int r = 0; r < n; r++) fprintf(out, "%d", r % 10);
  fputc('\n', out);
  for (int s = 0; s < n; s++) {
    fprintf(out, "  %3d ", s);
    for (int r = 0; r < n; r++) {
      int t = s == r ? -2 : transport_select(&peers[s], &peers[r], &host_need, NULL, 0);
      fputc(t == -2 ? '.' : t < 0 ? '-' : '0' + t % 10, out);
    }
    fputc('\n', out);
  }
}

static void plan_print_ring(const struct peer_info *peers, int n, const int *ring, FILE *out) {
  fprintf(out, "ring:");
  for (int i = 0; i < n; i++) {
    if (i > 0 && peers[ring[i]].host_hash != peers[ring[i - 1]].host_hash) fprintf(out, " |");
    fprintf(out, " %d", ring[i]);
  }
  struct ring_crossings c;
  ring_count_crossings(peers, n, ring, &c);
  fprintf(out, "\n  crossings: %d between hosts, %d between NUMA nodes, %d between PCI switches\n",
          c.hosts, c.numa, c.switches);
  int t = n > 1 ? transport_select(&peers[ring[0]], &peers[ring[1 % n]], &host_need, NULL, 0)
                : -1;
  for (int i = 0; i < n && n > 1; i++) {
    int s = ring[i], r = ring[(i + 1) % n];
    int tt = transport_select(&peers[s], &peers[r], &host_need, NULL, 0);
    if (i == 0 || tt != t || peers[s].host_hash != peers[r].host_hash)
      fprintf(out, "  hop %d -> %d: %s\n", s, r, tt >= 0 ? weft_transports[tt]->name : "none");
    t = tt;
  }
}

/* One tree: each rank's parent, the root, depth and links between hosts. */
static void plan_print_tree(const struct peer_info *peers, int n, const struct tree_links *links,
                            const char *name, FILE *out) {
  int root = -1, depth = 0, crossings = 0;
  fprintf(out, "%s (rank<-parent):", name);
  for (int r = 0; r < n; r++) {
    const struct tree_links *l = &links[r];
    if (l->parent == TREE_NONE) root = r;
    else crossings += peers[r].host_hash != peers[l->parent].host_hash;
    if (l->depth > depth) depth = l->depth;
    if (l->parent != TREE_NONE) fprintf(out, " %d<-%d", r, l->parent);
  }
  fprintf(out, "\n  root %d, depth %d, %d link(s) between hosts\n", root, depth, crossings);
}

/* The double binary tree, and the tree of small calls (comm_tree_small)
 * where the ranks share a host and WEFT_TREE_SMALL_BYTES is not 0. */
static void plan_print_trees(const struct peer_info *peers, int n, const int *ring, FILE *out) {
  struct tree_links(*all)[2] = calloc((size_t)n, sizeof *all);
  struct tree_links *one = calloc((size_t)n, sizeof *one);
  struct tree_links mine[2];
  if (all == NULL || one == NULL || comm_trees(peers, n, 0, mine, NULL, all) < 0) goto done;
  for (int t = 0; t < 2; t++) {
    for (int r = 0; r < n; r++) one[r] = all[r][t];
    char name[16];
    snprintf(name, sizeof name, "tree %d", t);
    plan_print_tree(peers, n, one, name, out);
  }
  const int64_t small = param_int(&coll_params[P_TREE_SMALL_BYTES]);
  int hosts_differ = 0;
  for (int r = 1; r < n; r++) hosts_differ |= peers[r].host_hash != peers[0].host_hash;
  if (small == 0 || hosts_differ) {
    fprintf(out, "tree of small calls: none (%s)\n",
            small == 0 ? "WEFT_TREE_SMALL_BYTES=0" : "the ranks span hosts");
    goto done;
  }
  for (int r = 0; r < n; r++) tree_small_order_links(n, ring, r, &one[r]);
  char name[64];
  snprintf(name, sizeof name, "tree of small calls, up to %lld bytes", (long long)small);
  plan_print_tree(peers, n, one, name, out);
done:
  free(one);
  free(all);
}

weftResult_t weftTopoPrint(FILE *out, const char *xmlPath, int nranks, int nhosts, int flags) {
  weft_error_clear();
  if (out == NULL) out = stdout;
  if (nhosts < 1) return weft_error_set(weftInvalidArgument, "nhosts %d < 1", nhosts);
  if (nranks < 0 || nranks > TOPO_PLAN_MAX_RANKS)
    return weft_error_set(weftInvalidArgument, "nranks %d: plans take 0 to %d ranks", nranks,
                          TOPO_PLAN_MAX_RANKS);
  if (flags & ~(WEFT_TOPO_GPUS | WEFT_TOPO_ROUND_ROBIN))
    return weft_error_set(weftInvalidArgument, "unknown flags 0x%x", (unsigned)flags);
  struct topo *topo;
  WEFT_TRY(topo_load(xmlPath, &topo));
  weftResult_t res = weftSuccess;
  topo_print(topo, out);
  if (nranks == 0) {
    int per_host = flags & WEFT_TOPO_GPUS ? topo->ngpus : topo->ncores > 0 ? topo->ncores : 1;
    nranks = (per_host > 0 ? per_host : 1) * nhosts;
    if (nranks > TOPO_PLAN_MAX_RANKS) nranks = TOPO_PLAN_MAX_RANKS;
  }
  struct peer_info *peers = calloc((size_t)nranks, sizeof *peers);
  int *ring = calloc((size_t)nranks, sizeof *ring);
  if (peers == NULL || ring == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto free_plan;
  }
  WEFT_TRY_GOTO(topo_plan_peers(topo, nranks, nhosts, flags, peers), res, free_plan);
  fprintf(out, "\nplan: %d rank(s) on %d host(s)%s%s\n", nranks, nhosts,
          flags & WEFT_TOPO_GPUS ? ", one GPU each" : ", host memory",
          flags & WEFT_TOPO_ROUND_ROBIN ? ", ranks round-robin over hosts" : "");
  plan_print_ranks(topo, peers, nranks, out);
  plan_print_transports(peers, nranks, out);
  ring_order(peers, nranks, ring);
  plan_print_ring(peers, nranks, ring, out);
  plan_print_trees(peers, nranks, ring, out);
free_plan:
  free(ring);
  free(peers);
  topo_free(topo);
  return res;
}
