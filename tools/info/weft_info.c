/* weft-info: the library's version, its environment parameters, and the
 * verdict on the traces ranks dumped (--trace DIR). */
#include <stdio.h>
#include <string.h>

#include "weft.h"

int main(int argc, char **argv) {
  int version = 0;
  weftGetVersion(&version);
  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: weft-info [--version | --config | --trace DIR]\n"
           "  prints the weft version (alone with --version); --config adds every WEFT_*\n"
           "  variable with its value;\n"
           "  --trace DIR reads the traces ranks dumped into DIR (WEFT_TRACE_DIR) and says,\n"
           "  per job, which collective did not complete and which ranks never called it\n");
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--trace") == 0) {
    if (argc != 3) {
      fprintf(stderr, "weft-info: --trace takes a directory\n");
      return 2;
    }
    if (weftTraceDiagnose(argv[2], stdout) != weftSuccess) {
      fprintf(stderr, "weft-info: %s\n", weftGetLastError(NULL));
      return 1;
    }
    return 0;
  }
  const int is_config = argc == 2 && strcmp(argv[1], "--config") == 0;
  const int is_version = argc == 2 && (strcmp(argv[1], "--version") == 0 ||
                                       strcmp(argv[1], "-V") == 0);
  if (argc > 1 && !is_config && !is_version) {
    if (argc > 2) fprintf(stderr, "weft-info: %s takes no argument (weft-info --help)\n", argv[1]);
    else fprintf(stderr, "weft-info: unknown option %s (weft-info --help)\n", argv[1]);
    return 2;
  }
  printf("weft %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
  if (is_config) weftConfigPrint(stdout);
  return 0;
}
