/* weft-train's data for the transformer: a byte-level tokenizer (a token is
 * a byte, vocabulary 256), a token file written once from a text and
 * memory-mapped by every rank, its last tenth held out for validation, and
 * epochs of windows seq apart in a seeded order, each rank reading its own
 * part. */
#ifndef WEFT_TRAIN_DATA_H
#define WEFT_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "weft.h"

/* The default text, present on Debian and Ubuntu after installation. */
#define TRAIN_DATA_DEFAULT_DIR "/usr/share/common-licenses"

struct train_data {
  const uint8_t *tokens;   /* the mapped file's tokens */
  size_t count;            /* tokens in all */
  size_t train_count;      /* [0, train_count) trains; the rest validates */
  int seq;                 /* a window is seq + 1 tokens: inputs, and targets one on */
  uint64_t train_windows;  /* windows of the training split seq apart: an epoch */
  uint64_t val_windows;    /* windows of the held-out split seq apart */
  void *map;
  size_t map_nbytes;
};

/* Rank 0 writes the token file at tokens_path from text_path (NULL: the
 * files of TRAIN_DATA_DEFAULT_DIR by name, concatenated), and every rank
 * maps it. The file records a hash of the text's bytes, which rank 0 reads
 * every run that names the text: an existing file is kept where it holds
 * that text, written again (saying so) where it holds another or records
 * none, and refused where it is no token file. tokens_path alone (text_path
 * NULL) is used as it is where it exists. tokens_path NULL: one in $TMPDIR
 * (or /tmp) named for the text's absolute paths and the hash. Collective;
 * seq is the sequence length every split must hold. */
weftResult_t train_data_open(struct train_data *d, const char *text_path,
                             const char *tokens_path, int seq, weftComm_t comm);
void train_data_close(struct train_data *d);

/* The seq + 1 tokens of training sample `index` (inputs, then the next
 * token of each) of the seeded order, a function of seed and index alone,
 * so that any rank count sees the same samples: samples [e W, (e + 1) W)
 * are epoch e, W = train_windows, whose windows start at o_e + k seq for
 * k in [0, W) in an order drawn from seed and e (a permutation of [0, W)),
 * o_e an offset drawn from seed and e that keeps the last in the split. */
void train_data_sample(const struct train_data *d, uint64_t seed, uint64_t index, uint8_t *out);
/* Validation window `index` (modulo val_windows): the held-out tenth's
 * tokens [index seq, (index + 1) seq]. */
void train_data_val_sample(const struct train_data *d, uint64_t index, uint8_t *out);

#endif
