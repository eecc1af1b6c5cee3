/* weft-info: the library's version and its environment parameters. */
#include <stdio.h>
#include <string.h>

#include "weft.h"

int main(int argc, char **argv) {
  int version = 0;
  weftGetVersion(&version);
  if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    printf("usage: weft-info [--config]\n"
           "  prints the weft version; --config adds every WEFT_* variable with its value\n");
    return 0;
  }
  printf("weft %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
  if (argc > 1 && strcmp(argv[1], "--config") == 0) weftConfigPrint(stdout);
  else if (argc > 1) {
    fprintf(stderr, "weft-info: unknown option %s\n", argv[1]);
    return 2;
  }
  return 0;
}
