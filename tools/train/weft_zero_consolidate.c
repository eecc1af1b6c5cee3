/* weft-zero-consolidate: turns a sharded ZeRO checkpoint (any rank count,
 * any stage) into one file of full fp32 parameters, after checking every
 * shard (checksums, run, step, sizes, finite values).
 *
 *   weft-zero-consolidate [--allow-non-finite] CHECKPOINT_DIR OUT_FILE */
#include <stdio.h>
#include <string.h>

#include "weft_zero.h"

static int usage(FILE *out, int rc) {
  fprintf(out,
          "usage: weft-zero-consolidate [--allow-non-finite] CHECKPOINT_DIR OUT_FILE\n"
          "writes \"WEFTZF32\", a uint64 layer count, a uint64 count per layer, then the\n"
          "fp32 parameters in registration order; a damaged checkpoint is refused (exit 1)\n"
          "  --allow-non-finite   take NaN and infinite values instead of refusing them\n");
  return rc;
}

int main(int argc, char **argv) {
  int flags = 0, first = 1;
  if (argc == 2 && strcmp(argv[1], "--help") == 0) return usage(stdout, 0);
  if (argc > 1 && strcmp(argv[1], "--allow-non-finite") == 0) {
    flags |= weftZeroAllowNonFinite;
    first = 2;
  }
  if (argc - first != 2) return usage(stderr, 2);
  if (weftZeroConsolidateFlags(argv[first], argv[first + 1], flags) != weftSuccess) {
    fprintf(stderr, "weft-zero-consolidate: %s\n", weftZeroLastError());
    return 1;
  }
  return 0;
}
