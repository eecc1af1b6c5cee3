/* Naming a hang: while a call of a communicator runs, its waits tell a
 * watcher when they stall; the rank then asks every peer over the bootstrap
 * (whose query thread answers while the peer's own threads are stuck or busy
 * elsewhere) which calls it made last. A peer in another collective under
 * the same number is a mismatch, refused at once on every waiting rank; at
 * the timeout, or when a peer fails, the error says which ranks never
 * reached the call and what each did last, and the trace is dumped. The
 * verdict's text is one function's, which weft-info --trace also uses on
 * dumps (trace_read.c). */
#ifndef WEFT_HANG_H
#define WEFT_HANG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../transport/base/wait.h"
#include "comm.h"
#include "trace.h"

/* --- the verdict ---------------------------------------------------------- */

/* What is known of one rank. */
enum hang_status {
  HANG_ANSWERED, /* its calls are known (an answer, or its dump) */
  HANG_GONE,     /* its process ended: nothing listens for questions any more */
  HANG_SILENT,   /* it did not answer in time */
  HANG_NO_DUMP,  /* after the fact: it left no dump */
};
struct hang_view {
  enum hang_status status;
  const struct trace_call *calls; /* its latest calls, oldest first */
  int ncalls;
  int64_t now_ns; /* its clock when it answered (or dumped) */
  int dumped;     /* known from its dump, after the fact */
};

/* Writes into text (n bytes) what each rank of views[nranks] did about
 * subject, a call of one of them: "AllReduce #12 (1024 float32 sum) <how>:
 * rank 3 never called it (its last: AllReduce #11, completed 2.0 s ago);
 * ranks 0-2 wait on rank 3". Returns weftInvalidUsage, the error text
 * naming the ranks and the fields, when ranks that reached subject's number
 * made different collectives under it; else weftSuccess. */
weftResult_t hang_verdict(const struct trace_call *subject, const char *how,
                          const struct hang_view *views, int nranks, char *text, size_t n);
/* "AllReduce #12 (1024 float32 sum)" into buf. */
void hang_call_name(const struct trace_call *c, char *buf, size_t n);

/* Asks every peer of comm over the bootstrap where it is and writes the
 * verdict on subject, a call of comm's trace, into text (n bytes): returns
 * weftInvalidUsage where ranks that reached its number made different
 * collectives under it, else weftSuccess. Blocks a quarter of a second at
 * most while the call stalls (stalling), half a second for the verdict
 * after a failure. Any thread but against the comm's destruction (the
 * device executor asks from weftCommGetAsyncError). */
weftResult_t hang_judge(struct weftComm *comm, const struct trace_call *subject, const char *how,
                        int stalling, char *text, size_t n);

/* --- watching a call ------------------------------------------------------ */

/* The watcher of the calls a thread runs on comm (trace ids ids[nids]),
 * installed by hang_watch_begin, removed by hang_watch_end. */
struct hang_watch {
  struct wait_watcher watcher;
  const struct wait_watcher *outer; /* the thread's watcher before this one */
  struct weftComm *comm;
  const uint64_t *ids;
  size_t nids;
  uint64_t next_ask_ns; /* the stall after which peers are asked next; 0: never */
  uint64_t ask_after_ns; /* WEFT_HANG_ASK_MS */
  uint64_t stalled_ns;  /* the longest wait seen */
  uint64_t waited_ns;   /* the wait that timed out, or 0 */
  int timed_out_peer;   /* the peer that wait was on, or -1 */
  int asked;            /* a stall asked the peers */
  int awaited_gone;     /* the last question found the awaited peer gone: that peer + 1, else 0 */
  char mismatch[1024];  /* what a stall's question found ranks disagree on (""): the
                           call's error, whatever the wait it ended wrapped it in */
  int long_call;        /* moves 64 KiB or more: its end is read from the clock */
  /* hang_watch_record's: the call to record, its id once recorded, and the
   * thread's prelude that records it */
  const struct weft_plan *record;
  uint64_t id;
  size_t nbytes;
  struct wait_prelude prelude;
  struct wait_prelude *outer_prelude;
};

/* The answer comm's rank gives peers that ask where it is: installed once
 * comm->trace is made (comm_init); the bootstrap's query thread, which
 * calls it, stops when the bootstrap closes, before the trace is freed. */
void hang_answer_install(struct weftComm *comm);

/* Marks the calls started and watches the thread's waits; nbytes is what
 * they move (this rank's input). started: they were recorded as started
 * (trace_record's starts_now), so their state stays as it is. */
void hang_watch_begin(struct hang_watch *hw, struct weftComm *comm, const uint64_t *ids,
                      size_t nids, size_t nbytes, int started);
/* hang_watch_begin of plan's call, not yet in the trace: it is recorded as
 * started, and watched, when the thread's first wait begins (a prelude,
 * wait.h), or by hang_watch_end where it never waited. The record's stores
 * and its clock read then overlap the flight of the call's first stores to
 * its peers, rather than delay them. plan lives until hang_watch_end. */
void hang_watch_record(struct hang_watch *hw, struct weftComm *comm,
                       const struct weft_plan *plan, size_t nbytes);
/* Stops watching and marks the calls done with res. A remote failure (a
 * timeout, a peer that died or failed) of a collective gets the verdict as
 * its error text, and the trace is dumped (WEFT_TRACE_DIR); a mismatch the
 * verdict finds becomes weftInvalidUsage. Returns the result. */
weftResult_t hang_watch_end(struct hang_watch *hw, weftResult_t res);

#endif
