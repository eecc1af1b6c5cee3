/* How many device channels a comm has, and how many ranks share a GPU:
 * pure arithmetic on what the ranks exchanged, tested on the host
 * (device_host). CUDA builds only. */
#include <string.h>

#include "../../algo/ring_steps.h"
#include "dev_types.h"
#include "device.h"

int device_nchannels(int want, int cfg_min, int cfg_max, int cap) {
  int n = want;
  if (cfg_max != WEFT_CONFIG_UNDEF_INT && cfg_max > 0 && n > cfg_max) n = cfg_max;
  if (cfg_min != WEFT_CONFIG_UNDEF_INT && cfg_min > 0 && n < cfg_min) n = cfg_min;
  if (n > DEV_MAX_CHANNELS) n = DEV_MAX_CHANNELS;
  if (n > cap) n = cap; /* every rank's blocks must be on the GPU at once */
  return n > 0 ? n : 1;
}

int device_busiest_gpu(const struct device_gpu_ident *ids, int n) {
  int most = 1;
  for (int i = 0; i < n; i++) {
    int same = 0;
    for (int j = 0; j < n; j++) same += memcmp(ids[i].uuid, ids[j].uuid, sizeof ids[i].uuid) == 0;
    if (same > most) most = same;
  }
  return most;
}

int device_nchannels_agreed(const struct device_gpu_ident *ids, int n, int cap) {
  int fewest = DEV_MAX_CHANNELS;
  for (int i = 0; i < n; i++)
    if (ids[i].want_channels < fewest) fewest = ids[i].want_channels;
  return device_nchannels(fewest, WEFT_CONFIG_UNDEF_INT, WEFT_CONFIG_UNDEF_INT, cap);
}

int device_interleave_agreed(const struct device_gpu_ident *ids, int n) {
  int fewest = ring_interleave_max(DEV_NSLOTS);
  for (int i = 0; i < n; i++)
    if (ids[i].want_interleave < fewest) fewest = ids[i].want_interleave;
  return fewest > 1 ? fewest : 1;
}

int device_channel_cap(const struct device_gpu_ident *ids, int n) {
  int fewest = 0; /* blocks the fewest-holding GPU holds at once */
  for (int i = 0; i < n; i++) {
    int holds = ids[i].sms * ids[i].blocks_per_sm;
    if (i == 0 || holds < fewest) fewest = holds;
  }
  int cap = fewest / device_busiest_gpu(ids, n);
  return cap > 0 ? cap : 1;
}
