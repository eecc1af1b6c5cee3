/* weft-zero-consolidate: turns a sharded ZeRO checkpoint (any rank count,
 * any stage) into one file of full fp32 parameters.
 *
 *   weft-zero-consolidate CHECKPOINT_DIR OUT_FILE */
#include <stdio.h>
#include <string.h>

#include "weft_zero.h"

int main(int argc, char **argv) {
  if (argc != 3 || strcmp(argv[1], "--help") == 0) {
    fprintf(argc == 2 ? stdout : stderr,
            "usage: weft-zero-consolidate CHECKPOINT_DIR OUT_FILE\n"
            "writes \"WEFTZF32\", a uint64 layer count, a uint64 count per layer, then the\n"
            "fp32 parameters in registration order\n");
    return argc == 2 ? 0 : 2;
  }
  if (weftZeroConsolidate(argv[1], argv[2]) != weftSuccess) {
    fprintf(stderr, "weft-zero-consolidate: %s\n", weftZeroLastError());
    return 1;
  }
  return 0;
}
