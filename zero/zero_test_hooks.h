/* What the test suites reach in the ZeRO layer: compiled into the static
 * variant they link (built with -DWEFT_TEST_HOOKS), never into the libraries
 * that ship. */
#ifndef WEFT_ZERO_TEST_HOOKS_H
#define WEFT_ZERO_TEST_HOOKS_H

#ifdef __cplusplus
extern "C" {
#endif

/* The rank (-1: none) whose weftZeroSave exits with status 3 halfway through
 * writing its shard, as a crash would; set before the ranks start. */
extern int zero_test_save_crash_rank;

#ifdef __cplusplus
}
#endif

#endif
