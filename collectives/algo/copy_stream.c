/* The last-level cache's size and the streaming-store threshold
 * (copy_stream.h). */
#include "copy_stream.h"

#include <stdint.h>
#include <stdio.h>

struct weft_param copy_stream_params[] = {
    {.name = "WEFT_CMA_STREAM_NBYTES", .type = PARAM_INT, .default_str = "0",
     .doc = "size of each rank's output from which single-copy collectives, and groups of sends "
            "and receives between ranks of one host (all-to-all), write with streaming stores "
            "(past the caches); 0: the last-level cache's size (sysfs, at most 32 MiB) divided by the "
            "ranks; in-place all-reduce and reduce-scatter never stream"},
    PARAM_END,
};

#define L3_DEFAULT_NBYTES (32u << 20) /* where sysfs does not say */
#define L3_COUNTED_NBYTES (32u << 20) /* the most of it counted on */

/* The last-level cache's size, from sysfs (sysconf's figure can be the
 * whole package's on a virtual machine). */
static size_t l3_nbytes(void) {
  static size_t cached; /* threads of several comms may race here: both find the same */
  size_t known = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (known != 0) return known;
  size_t nbytes = L3_DEFAULT_NBYTES;
  for (int i = 0; i < 8; i++) {
    char path[96];
    int level = 0;
    unsigned long kib = 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE *f = fopen(path, "r");
    if (f == NULL) break;
    int ok = fscanf(f, "%d", &level) == 1;
    fclose(f);
    if (!ok || level != 3) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    if ((f = fopen(path, "r")) == NULL) break;
    if (fscanf(f, "%luK", &kib) == 1 && kib > 0) nbytes = (size_t)kib << 10;
    fclose(f);
    break;
  }
  __atomic_store_n(&cached, nbytes, __ATOMIC_RELAXED);
  return nbytes;
}

/* Measured on 2 ranks, 32 MiB L3: plain copies 2-3x faster at 4 MiB,
 * streaming ones faster from 16 MiB (all-gather); all-to-all of 16 MiB on
 * 4 ranks 1.6x faster streaming. */
size_t copy_stream_min_nbytes(int nranks) {
  int64_t v = param_int(&copy_stream_params[0]);
  if (v > 0) return (size_t)v;
  /* a virtual machine's few vCPUs get a share of a large L3, not all of it:
   * on a 2-vCPU Xeon whose sysfs says 105 MiB, 2-rank out-of-place
   * all-reduce and all-gather of 16 MiB ran 1.6-2.2x faster streaming */
  size_t l3 = l3_nbytes();
  if (l3 > L3_COUNTED_NBYTES) l3 = L3_COUNTED_NBYTES;
  return l3 / (size_t)nranks;
}
