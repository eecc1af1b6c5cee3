/* The messages' string builder (text.h). */
#include "text.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void text_add(struct text *t, const char *fmt, ...) {
  if (t->n == 0 || t->len >= t->n - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(t->buf + t->len, t->n - t->len, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  if ((size_t)k < t->n - t->len) {
    t->len += (size_t)k;
    return;
  }
  t->len = t->n - 1;
  if (t->n >= 4) memcpy(t->buf + t->n - 4, "...", 4);
}

void text_ranks(struct text *t, const int *ranks, int n) {
  text_add(t, "%s ", n == 1 ? "rank" : "ranks");
  const char *comma = "";
  for (int i = 0; i < n; i++) {
    int j = i;
    while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
    if (j - i >= 2) text_add(t, "%s%d-%d", comma, ranks[i], ranks[j]);
    else if (j == i + 1) text_add(t, "%s%d,%d", comma, ranks[i], ranks[j]);
    else text_add(t, "%s%d", comma, ranks[i]);
    comma = ",";
    i = j;
  }
}

void text_groups(struct text *t, int n, const int *ranks, int64_t (*value_of)(const void *, int),
                 void (*format)(const void *, int, char *, size_t), const void *ctx, int has,
                 int *members) {
  const char *sep = "";
  for (int i = 0; i < n; i++) {
    const int64_t v = value_of(ctx, i);
    int earlier = 0, k = 0;
    for (int j = 0; j < i && !earlier; j++) earlier = value_of(ctx, j) == v;
    if (earlier) continue; /* said with the group's lowest entry */
    for (int j = i; j < n; j++)
      if (value_of(ctx, j) == v) members[k++] = ranks != NULL ? ranks[j] : j;
    char value[128];
    format(ctx, i, value, sizeof value);
    text_add(t, "%s", sep);
    text_ranks(t, members, k);
    if (has) text_add(t, " %s", k == 1 ? "has" : "have");
    text_add(t, " %s", value);
    sep = ", ";
  }
}
