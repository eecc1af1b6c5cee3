/* weftrun's leaf helpers: allocation that exits when out of memory, and the
 * ranks' environment. Calls nothing in the other weftrun files. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "weftrun_job.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

/* --- Small helpers ------------------------------------------------------ */

void run_die_oom(void)
{
  fprintf(stderr, "weftrun: out of memory\n");
  exit(1);
}

void *run_xmalloc(size_t nbytes)
{
  void *p = malloc(nbytes ? nbytes : 1);
  if (!p)
    run_die_oom();
  return p;
}

char *run_printf(const char *fmt, ...)
{
  va_list ap;
  char *s;
  va_start(ap, fmt);
  int rc = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (rc < 0)
    run_die_oom();
  return s;
}

/* --- The ranks' environment ------------------------------------------- */

/* Length of the NAME in "NAME=VALUE". */
static size_t run_env_name_len(const char *entry)
{
  const char *eq = strchr(entry, '=');
  return eq ? (size_t)(eq - entry) : strlen(entry);
}

static bool run_env_named_in(const char *entry, char *const *set, int n)
{
  size_t len = run_env_name_len(entry);
  for (int i = 0; i < n; i++)
    if (run_env_name_len(set[i]) == len && strncmp(entry, set[i], len) == 0)
      return true;
  return false;
}

/* Rank's environment: weftrun's own minus overridden names, then weftrun's
 * variables, then -x ones (which win). own[] receives strings to free. */
char **run_env_build(const struct run_job *job, int rank, char *own[RUN_OWN_VARS])
{
  int i = 0;
  own[i++] = run_printf("WEFT_RANK=%d", rank);
  own[i++] = run_printf("WEFT_NRANKS=%d", job->nranks);
  own[i++] = run_printf("WEFT_LOCAL_RANK=%d", rank);
  own[i++] = run_printf("WEFT_LOCAL_SIZE=%d", job->nranks);
  own[i++] = run_printf("WEFT_UNIQUE_ID=%s", job->unique_id_hex);
  own[i++] = run_printf("RANK=%d", rank);
  own[i++] = run_printf("WORLD_SIZE=%d", job->nranks);
  own[i++] = run_printf("LOCAL_RANK=%d", rank);
  own[i++] = run_printf("LOCAL_WORLD_SIZE=%d", job->nranks);
  own[i++] = run_printf("MASTER_ADDR=127.0.0.1");
  own[i++] = run_printf("MASTER_PORT=%d", job->master_port);

  int n_inherited = 0;
  while (environ[n_inherited])
    n_inherited++;
  char **envp = run_xmalloc((size_t)(n_inherited + RUN_OWN_VARS + job->n_x_vars + 1) *
                            sizeof(char *));
  int k = 0;
  for (int e = 0; e < n_inherited; e++)
    if (!run_env_named_in(environ[e], own, RUN_OWN_VARS) &&
        !run_env_named_in(environ[e], job->x_vars, job->n_x_vars))
      envp[k++] = environ[e];
  for (int o = 0; o < RUN_OWN_VARS; o++)
    if (!run_env_named_in(own[o], job->x_vars, job->n_x_vars))
      envp[k++] = own[o];
  for (int x = 0; x < job->n_x_vars; x++)
    if (!run_env_named_in(job->x_vars[x], job->x_vars + x + 1, job->n_x_vars - x - 1))
      envp[k++] = job->x_vars[x];
  envp[k] = NULL;
  return envp;
}
