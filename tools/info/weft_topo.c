/* weft-topo: the topology weft detects (or reads from an hwloc XML file) and
 * the rings, trees and transports it would build there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: weft-topo [--xml FILE] [--ranks N] [--hosts H] [--gpus] [--round-robin]\n"
          "  prints this machine's topology (or FILE's, an hwloc XML export such as\n"
          "  `lstopo --of xml`), then the plan for N ranks on H hosts like it:\n"
          "  each rank's NUMA node, PCI switch, GPU and NIC, the transport between\n"
          "  each pair, the ring and the two trees.\n"
          "  --ranks N      ranks in all (default: one per GPU with --gpus, else per core,\n"
          "                 on every host)\n"
          "  --hosts H      hosts, each with this topology (default 1)\n"
          "  --gpus         every rank drives a GPU (local rank i the i-th GPU)\n"
          "  --round-robin  rank r on host r %% H instead of blocks of ranks\n");
}

static int parse_count(const char *opt, const char *text, int min, int *out) {
  char *end = NULL;
  long v = text != NULL ? strtol(text, &end, 10) : 0;
  if (text == NULL || *end != '\0' || v < min || v > 1 << 20) {
    fprintf(stderr, "weft-topo: %s needs a number >= %d\n", opt, min);
    return -1;
  }
  *out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  const char *xml = NULL;
  int nranks = 0, nhosts = 1, flags = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--xml") == 0 && v != NULL) {
      xml = v;
      i++;
    } else if (strcmp(a, "--ranks") == 0) {
      if (parse_count(a, v, 1, &nranks) != 0) return 2;
      i++;
    } else if (strcmp(a, "--hosts") == 0) {
      if (parse_count(a, v, 1, &nhosts) != 0) return 2;
      i++;
    } else if (strcmp(a, "--gpus") == 0) {
      flags |= WEFT_TOPO_GPUS;
    } else if (strcmp(a, "--round-robin") == 0) {
      flags |= WEFT_TOPO_ROUND_ROBIN;
    } else {
      fprintf(stderr, "weft-topo: unknown or incomplete option %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (weftTopoPrint(stdout, xml, nranks, nhosts, flags) != weftSuccess) {
    fprintf(stderr, "weft-topo: %s\n", weftGetLastError(NULL));
    return 1;
  }
  return 0;
}
