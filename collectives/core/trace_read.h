/* Reading the traces ranks dumped into a directory (trace.c's JSON) and
 * printing, per job, the verdict a timed-out rank gives (hang.h). */
#ifndef WEFT_TRACE_READ_H
#define WEFT_TRACE_READ_H

#include <stdio.h>

#include "../../include/weft.h"

/* weftTraceDiagnose: weftInvalidArgument when dir holds no trace. */
weftResult_t trace_diagnose_dir(const char *dir, FILE *out);

#endif
