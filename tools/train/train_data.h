/* weft-train's data for the transformer: a byte-level tokenizer (a token is
 * a byte, vocabulary 256), a token file written once from a text and
 * memory-mapped by every rank, its last tenth held out for validation, and
 * batches drawn from a seeded order, each rank reading its own part. */
#ifndef WEFT_TRAIN_DATA_H
#define WEFT_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "weft.h"

/* The default text, present on Debian and Ubuntu after installation. */
#define TRAIN_DATA_DEFAULT_DIR "/usr/share/common-licenses"

struct train_data {
  const uint8_t *tokens; /* the mapped file's tokens */
  size_t count;          /* tokens in all */
  size_t train_count;    /* [0, train_count) trains; the rest validates */
  void *map;
  size_t map_nbytes;
};

/* Rank 0 writes the token file at tokens_path from text_path (NULL: the
 * files of TRAIN_DATA_DEFAULT_DIR by name, concatenated) unless it exists;
 * then every rank maps it. tokens_path NULL: one in $TMPDIR (or /tmp) named
 * for the text's absolute paths and a hash of its bytes, which rank 0 reads
 * every time. Collective; seq is the sequence length every split must hold. */
weftResult_t train_data_open(struct train_data *d, const char *text_path,
                             const char *tokens_path, int seq, weftComm_t comm);
void train_data_close(struct train_data *d);

/* The seq + 1 tokens of training sample `index` (inputs, then the next
 * token of each) of the seeded order: a window at a position drawn from
 * seed and index, so any rank count sees the same samples. */
void train_data_sample(const struct train_data *d, uint64_t seed, uint64_t index, int seq,
                       uint8_t *out);
/* Validation sample `index`: consecutive windows of the held-out tenth. */
void train_data_val_sample(const struct train_data *d, uint64_t index, int seq, uint8_t *out);

#endif
