/* Checkpoint files, format 5: what is written and how it is checked
 * (zero/zero_ckpt_format.c); zero/zero_ckpt.c saves and loads with them.
 *
 * dir/step-<n>/manifest      text, one "key value" a line (format, run,
 *                            nranks, stage, optimizer, step, loss_scale,
 *                            loss_scaled, updates, good_steps; then the
 *                            hyperparameters at the save, for information:
 *                            lr, beta1, beta2, eps, momentum, weight_decay,
 *                            max_grad_norm, accum_steps; then layers,
 *                            params), "layer <i> <count>" per layer,
 *                            "param <id> <layer> <count> <weight decay>" per
 *                            parameter in registration order, "shard <r>
 *                            <bytes> <crc32c>" per rank, "state <bytes>
 *                            <crc32c>" of the client state (0 00000000:
 *                            none), and last "crc32c <hex>" of every byte
 *                            before
 * dir/step-<n>/rank-<r>.bin  a 64-byte header (struct ckpt_shard_header), then
 *                            for each layer the fp32 master weights, then each
 *                            moment, of weftZeroShardOf(count, nranks, r)
 * dir/step-<n>/client-state.bin
 *                            the client state's bytes as given to
 *                            weftZeroSaveWithState (absent when there are none)
 *
 * Format 4 lacks the state line (read: no client state); format 3 the
 * hyperparameter, params and param lines too; format 2 the loss_scaled line
 * too; all three are read (format 2 and 3 without parameter boundaries to
 * check). Format 1, without checksums, is refused. Numbers in the binary
 * files are little-endian. */
#ifndef WEFT_ZERO_CKPT_FORMAT_H
#define WEFT_ZERO_CKPT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "zero_internal.h"

#define CKPT_FORMAT_V1 "weft-zero-checkpoint 1"
/* format 2 has no loss_scaled line (read: not said) */
#define CKPT_FORMAT_V2 "weft-zero-checkpoint 2"
/* format 3 has no hyperparameter, params or param lines (read: nparams 0) */
#define CKPT_FORMAT_V3 "weft-zero-checkpoint 3"
/* format 4 has no state line (read: no client state) */
#define CKPT_FORMAT_V4 "weft-zero-checkpoint 4"
#define CKPT_FORMAT "weft-zero-checkpoint 5"
#define CKPT_STATE_FILE "client-state.bin"
#define CKPT_SHARD_MAGIC "WEFTZSH2"
#define CKPT_MAX_LAYERS 1000000
#define CKPT_MAX_RANKS (1 << 20)
#define CKPT_MAX_MANIFEST_NBYTES (64u << 20)

/* CRC-32C (Castagnoli, reflected, as iSCSI and ext4 use): pass 0 first,
 * then the previous result to continue over more bytes. */
uint32_t zero_crc32c(uint32_t crc, const void *buf, size_t nbytes);
/* The same from tables, on any processor (zero_crc32c uses SSE 4.2's crc32
 * instruction where the processor has it). */
uint32_t zero_crc32c_sw(uint32_t crc, const void *buf, size_t nbytes);

struct ckpt_shard_header {
  char magic[8];           /* CKPT_SHARD_MAGIC */
  uint32_t version;        /* 2 */
  uint32_t rank;
  uint32_t nranks;
  uint32_t arrays;         /* fp32 arrays per element: master, then moments */
  int64_t step;
  uint8_t run[16];
  uint64_t payload_nbytes; /* after the header */
  uint32_t payload_crc;
  uint32_t header_crc;     /* of the 60 bytes before it */
};
_Static_assert(sizeof(struct ckpt_shard_header) == 64, "the shard header is 64 bytes");

/* A parameter as the manifest records it (formats 4-5). */
struct ckpt_param {
  int layer;
  size_t count;
  double weight_decay;
};

/* The hyperparameters at the save (formats 4-5): information, not restored. */
struct ckpt_hyper {
  double lr, beta1, beta2, eps, momentum, weight_decay, max_grad_norm;
  int accum_steps;
};

struct ckpt_manifest {
  uint8_t run[16];
  int nranks, stage, good_steps, nlayers, arrays;
  long step, updates;
  double loss_scale;
  int loss_scaled;          /* 1: fp16's dynamic scale; 0: the run trained unscaled (its
                               loss_scale is 1); -1: not said (format 2) */
  char optimizer[32];
  struct ckpt_hyper hyper;  /* formats 4-5; zero in older ones */
  size_t nparams;           /* formats 4-5: the parameters; 0 in older formats */
  struct ckpt_param *params;
  size_t *counts;           /* per layer */
  uint64_t *shard_nbytes;   /* per rank: payload bytes, header excluded */
  uint32_t *shard_crc;      /* per rank: the payload's CRC-32C */
  uint64_t state_nbytes;    /* format 5: the client state's size (0: none, and no file) */
  uint32_t state_crc;       /* and its CRC-32C (0 when there is none) */
  uint32_t crc;             /* read: the manifest's own CRC-32C (its last line) */
};

/* Reads and checks ver/manifest: its checksum, every field's range, that
 * the parameters (formats 4-5) fill their layers exactly, in order, that
 * the layer counts give each rank exactly the payload its shard line says
 * (no size overflows), and that the client state (format 5) is within
 * WEFT_ZERO_STATE_MAX_NBYTES. The step must be the one ver's name says. */
weftResult_t ckpt_manifest_read(const char *ver, long step_of_name, struct ckpt_manifest *m);
void ckpt_manifest_free(struct ckpt_manifest *m);
/* The manifest's text, its checksum line included (malloc'd, *len_out bytes). */
weftResult_t ckpt_manifest_format(const struct ckpt_manifest *m, char **text_out,
                                  size_t *len_out);

/* The version directory LATEST names in dir (ver_out: PATH_MAX bytes), and
 * the step its name carries. */
weftResult_t ckpt_latest(const char *dir, char *ver_out, long *step_out);

/* Fills h for rank's shard and seals it (header_crc). */
void ckpt_shard_header_fill(struct ckpt_shard_header *h, const struct ckpt_manifest *m, int rank,
                            uint64_t payload_nbytes, uint32_t payload_crc);

/* Opens shard q of the version ver (a regular file of exactly the header
 * plus the manifest's payload), checks its header against m, and reads the
 * whole payload checking its CRC and that every value is finite (unless
 * allow_non_finite). */
weftResult_t ckpt_shard_scan(const char *ver, const struct ckpt_manifest *m, int q,
                             int allow_non_finite);

/* Reads ver's client state whole (a regular file of exactly the manifest's
 * size, its CRC-32C the manifest's) into a malloc'd buffer; NULL and 0
 * when the manifest has none. */
weftResult_t ckpt_state_read(const char *ver, const struct ckpt_manifest *m, void **state_out,
                             size_t *nbytes_out);

/* The run identity in the header at the start of path (a shard, complete or
 * not: its header is sealed before the payload is written), when the magic
 * and the header's CRC-32C hold; else -1. */
int ckpt_shard_run(const char *path, uint8_t run_out[16]);

/* Per-rank payload bytes that counts give on nranks ranks; 0 on success, -1
 * when a size overflows. */
int ckpt_shard_payload(const size_t *counts, int nlayers, int nranks, int rank, int arrays,
                       uint64_t *nbytes_out);

/* 16 random bytes. */
weftResult_t ckpt_run_id_new(uint8_t run_out[16]);

#endif
