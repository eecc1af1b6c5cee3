/* The trace's entry points: a communicator's dump, and the verdict on the
 * dumps of a directory (docs/diagnosis.md). */
#include "../../transport/base/status.h"
#include "../core/comm.h"
#include "../core/trace.h"
#include "../core/trace_read.h"

weftResult_t weftCommTraceDump(weftComm_t comm, FILE *out) {
  weft_error_clear();
  WEFT_TRY(comm_check(comm));
  return trace_dump(comm->trace, out != NULL ? out : stdout, TRACE_ON_REQUEST, NULL);
}

weftResult_t weftTraceDiagnose(const char *dir, FILE *out) {
  weft_error_clear();
  if (dir == NULL) return weft_error_set(weftInvalidArgument, "weftTraceDiagnose: dir is NULL");
  return trace_diagnose_dir(dir, out != NULL ? out : stdout);
}
