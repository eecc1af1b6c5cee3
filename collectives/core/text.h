/* A bounded string builder for the messages that name ranks (hang.c,
 * signature.c, api/config.c): appends until the buffer is full, then ends in
 * "...". */
#ifndef WEFT_TEXT_H
#define WEFT_TEXT_H

#include <stddef.h>
#include <stdint.h>

struct text {
  char *buf; /* n bytes, NUL-terminated once anything was added */
  size_t n, len;
};

void text_add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "rank 3" or "ranks 0-2,5": ranks ascending, runs of three or more as
 * ranges. */
void text_ranks(struct text *t, const int *ranks, int n);

/* Appends "rank 3 has X, ranks 0-2,5 have Y" (with has 0: "rank 3 X, ranks
 * 0-2,5 Y"): n entries grouped by value_of(ctx, i), each group in the order
 * of its lowest entry, whose ranks are ranks[i] (ranks NULL: i) and whose
 * value format(ctx, i) writes. members has room for n. */
void text_groups(struct text *t, int n, const int *ranks, int64_t (*value_of)(const void *, int),
                 void (*format)(const void *, int, char *, size_t), const void *ctx, int has,
                 int *members);

#endif
