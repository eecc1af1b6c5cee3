/* Buffers of the perf tools in host or CUDA memory (-M host|cuda). */
#ifndef WEFT_PERF_MEM_H
#define WEFT_PERF_MEM_H

#include <stddef.h>
#include <stdint.h>

enum perf_mem_kind { PERF_MEM_HOST, PERF_MEM_CUDA };

/* "host" or "cuda"; 0 on success, -1 for another name. */
int perf_mem_parse(const char *name, enum perf_mem_kind *kind_out);
const char *perf_mem_name(enum perf_mem_kind kind);

/* 0 when this build can use kind; else -1 with the reason in why (len bytes). */
int perf_mem_available(enum perf_mem_kind kind, char *why, size_t len);

/* nbytes of kind, page aligned on the host; NULL when out of memory. */
void *perf_mem_alloc(enum perf_mem_kind kind, size_t nbytes);
void perf_mem_free(enum perf_mem_kind kind, void *ptr);

/* Copies between a buffer of kind and host memory, and fills one with a byte. */
int perf_mem_upload(enum perf_mem_kind kind, void *dst, const void *host_src, size_t nbytes);
int perf_mem_download(enum perf_mem_kind kind, void *host_dst, const void *src, size_t nbytes);
int perf_mem_fill(enum perf_mem_kind kind, void *dst, int byte, size_t nbytes);

/* Waits for the device's queued work (CUDA memory: the collectives run on the
 * device, after the call returns); 0 on success. */
int perf_mem_sync(enum perf_mem_kind kind);

/* Where this rank's buffers of kind live, for the header's "# Using devices"
 * line: a CUDA device's number, PCI address and name; for host memory -1,
 * the CPUs the rank may run on ("cpus 0-3") and "host memory". 0 on success. */
int perf_mem_device(enum perf_mem_kind kind, int *device_out, char *where, size_t where_len,
                    char *name, size_t name_len);

/* Memory in use, for -M 1: the device's (total less free) for cuda, this
 * process's resident set for host; 0 on success. */
int perf_mem_used(enum perf_mem_kind kind, int64_t *nbytes_out);

#endif
