/* docs/environment.md's table of variables, generated from the settings
 * tables (collectives/api/config.c's list). The page keeps its hand-written
 * text around the table; the table lies between the two marker lines.
 *   environment_doc PAGE           exits 1 when PAGE's table differs
 *   environment_doc PAGE --write   rewrites PAGE's table */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/api/config.h"

#define BEGIN_MARK "<!-- begin: generated from the settings tables; edit them, then run " \
                   "environment_doc docs/environment.md --write -->\n"
#define END_MARK "<!-- end: generated -->\n"

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) fwrite(buf, 1, n, out);
  fclose(f);
  fclose(out);
  return text;
}

int main(int argc, char **argv) {
  if (argc < 2 || (argc == 3 && strcmp(argv[2], "--write") != 0) || argc > 3) {
    fprintf(stderr, "usage: environment_doc PAGE [--write]\n");
    return 2;
  }
  const int write = argc == 3;
  char *page = read_file(argv[1]);
  if (page == NULL) {
    perror(argv[1]);
    return 2;
  }
  char *begin = strstr(page, BEGIN_MARK);
  char *end = begin != NULL ? strstr(begin, END_MARK) : NULL;
  if (end == NULL) {
    fprintf(stderr, "%s: no marker lines around the table:\n%s%s", argv[1], BEGIN_MARK,
            END_MARK);
    return 1;
  }
  begin += strlen(BEGIN_MARK);
  char *table = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&table, &len);
  param_tables_markdown(weft_param_tables, out);
  fclose(out);
  const size_t have = (size_t)(end - begin);
  if (have == len && memcmp(begin, table, len) == 0) {
    printf("ok: %s's table of variables is the settings tables'\n", argv[1]);
    return 0;
  }
  if (!write) {
    fprintf(stderr,
            "%s's table of variables differs from the settings tables; regenerate it with\n"
            "  build/tests/environment_doc %s --write\nthe tables give:\n%s",
            argv[1], argv[1], table);
    return 1;
  }
  FILE *f = fopen(argv[1], "wb");
  if (f == NULL) {
    perror(argv[1]);
    return 2;
  }
  fwrite(page, 1, (size_t)(begin - page), f);
  fwrite(table, 1, len, f);
  fputs(end, f);
  fclose(f);
  printf("wrote %s's table of variables\n", argv[1]);
  return 0;
}
