/* A small, deterministic fuzzing driver (fuzz_main.c). Each target defines
 * the three functions below; the driver runs every corpus file through the
 * target, then mutates corpus entries with a seeded generator for a bounded
 * time or number of runs. A sanitizer report, a crash or a hang writes the
 * input that caused it to a file and fails the run.
 *
 *   fuzz_<target> [-seed N] [-time SECONDS] [-runs N] [-out DIR] CORPUS...
 *
 * CORPUS arguments are files or directories of files. The seed is printed;
 * a run is repeated by passing the same seed and corpus. */
#ifndef WEFT_FUZZ_H
#define WEFT_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The target's name, for messages and the file names of failing inputs. */
extern const char *const fuzz_target_name;

/* Called once before any input; returns 0, or nonzero when the target cannot
 * run (the driver then fails with the target's message on stderr). */
int fuzz_init(void);

/* Runs one input. Returns 0 when the library handled it (whatever it said
 * about the input), nonzero when the target saw the library misbehave; the
 * driver then keeps the input and fails. */
int fuzz_one(const uint8_t *data, size_t nbytes);

/* Splits data at each occurrence of sep (the parts exclude it); calls fn on
 * every part. Lets one input carry several files or messages. */
void fuzz_split(const uint8_t *data, size_t nbytes, const char *sep,
                void (*fn)(const uint8_t *part, size_t nbytes, int index, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
