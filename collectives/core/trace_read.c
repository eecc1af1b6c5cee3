/* Reading the traces ranks dumped (trace.c's JSON) and judging them after
 * the fact with the verdict a live rank gives (hang.c): weftTraceDiagnose. */
#include "trace_read.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "hang.h"
#include "signature.h"

/* --- a small JSON reader -------------------------------------------------- */

enum json_type { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
struct json {
  enum json_type type;
  int64_t num; /* J_NUM (integers are kept exactly), J_BOOL */
  char *str;   /* J_STR */
  int n;       /* J_ARR, J_OBJ */
  struct json *items;
  char **keys; /* J_OBJ */
};

struct json_in {
  const char *p, *end;
  int depth;
};

static void json_free(struct json *v) {
  if (v == NULL) return;
  free(v->str);
  for (int i = 0; i < v->n; i++) {
    json_free(&v->items[i]);
    if (v->keys != NULL) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
}

static void json_skip(struct json_in *in) {
  while (in->p < in->end && (*in->p == ' ' || *in->p == '\n' || *in->p == '\r' || *in->p == '\t'))
    in->p++;
}

static int json_parse(struct json_in *in, struct json *out);

static int json_string(struct json_in *in, char **out) {
  if (in->p >= in->end || *in->p != '"') return -1;
  in->p++;
  size_t cap = 16, len = 0;
  char *s = malloc(cap);
  while (s != NULL && in->p < in->end && *in->p != '"') {
    char c = *in->p++;
    if (c == '\\' && in->p < in->end) {
      c = *in->p++;
      if (c == 'n') c = '\n';
      else if (c == 't') c = '\t';
      else if (c == 'u' && in->end - in->p >= 4) {
        c = (char)strtol((char[5]){in->p[0], in->p[1], in->p[2], in->p[3], 0}, NULL, 16);
        in->p += 4;
      }
    }
    if (len + 2 > cap) {
      char *g = realloc(s, cap *= 2);
      if (g == NULL) break;
      s = g;
    }
    s[len++] = c;
  }
  if (s == NULL || in->p >= in->end) {
    free(s);
    return -1;
  }
  in->p++;
  s[len] = '\0';
  *out = s;
  return 0;
}

/* Appends a parsed value to v's items (and key, for an object). */
static int json_items(struct json_in *in, struct json *v, char close) {
  in->p++;
  int cap = 0;
  json_skip(in);
  if (in->p < in->end && *in->p == close) {
    in->p++;
    return 0;
  }
  for (;;) {
    if (v->n == cap) {
      cap = cap ? cap * 2 : 8;
      struct json *items = realloc(v->items, sizeof *items * (size_t)cap);
      if (items == NULL) return -1;
      v->items = items;
      if (v->type == J_OBJ) {
        char **keys = realloc(v->keys, sizeof *keys * (size_t)cap);
        if (keys == NULL) return -1;
        v->keys = keys;
      }
    }
    json_skip(in);
    if (v->type == J_OBJ) {
      if (json_string(in, &v->keys[v->n]) != 0) return -1;
      json_skip(in);
      if (in->p >= in->end || *in->p != ':') {
        free(v->keys[v->n]);
        return -1;
      }
      in->p++;
    }
    memset(&v->items[v->n], 0, sizeof v->items[0]);
    if (json_parse(in, &v->items[v->n]) != 0) {
      json_free(&v->items[v->n]);
      if (v->type == J_OBJ) free(v->keys[v->n]);
      return -1;
    }
    v->n++;
    json_skip(in);
    if (in->p < in->end && *in->p == ',') {
      in->p++;
      continue;
    }
    if (in->p < in->end && *in->p == close) {
      in->p++;
      return 0;
    }
    return -1;
  }
}

static int json_parse(struct json_in *in, struct json *out) {
  memset(out, 0, sizeof *out);
  json_skip(in);
  if (in->p >= in->end || ++in->depth > 32) return -1;
  int rc = 0;
  const char c = *in->p;
  if (c == '{' || c == '[') {
    out->type = c == '{' ? J_OBJ : J_ARR;
    rc = json_items(in, out, c == '{' ? '}' : ']');
  } else if (c == '"') {
    out->type = J_STR;
    rc = json_string(in, &out->str);
  } else if (c == '-' || (c >= '0' && c <= '9')) {
    out->type = J_NUM;
    char *end;
    out->num = strtoll(in->p, &end, 10);
    while (end < in->end && (*end == '.' || *end == 'e' || *end == 'E' || *end == '+' ||
                             *end == '-' || (*end >= '0' && *end <= '9')))
      end++;
    in->p = end;
  } else if (in->end - in->p >= 4 && strncmp(in->p, "true", 4) == 0) {
    out->type = J_BOOL, out->num = 1, in->p += 4;
  } else if (in->end - in->p >= 5 && strncmp(in->p, "false", 5) == 0) {
    out->type = J_BOOL, in->p += 5;
  } else if (in->end - in->p >= 4 && strncmp(in->p, "null", 4) == 0) {
    out->type = J_NULL, in->p += 4;
  } else {
    rc = -1;
  }
  in->depth--;
  return rc;
}

static const struct json *json_get(const struct json *obj, const char *key) {
  if (obj == NULL || obj->type != J_OBJ) return NULL;
  for (int i = 0; i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  return NULL;
}

static int64_t json_int(const struct json *obj, const char *key, int64_t fallback) {
  const struct json *v = json_get(obj, key);
  return v != NULL && v->type == J_NUM ? v->num : fallback;
}

static const char *json_str(const struct json *obj, const char *key) {
  const struct json *v = json_get(obj, key);
  return v != NULL && v->type == J_STR ? v->str : "";
}

/* --- dumps into calls ----------------------------------------------------- */

static int name_index(const char *s, const char *(*name_of)(int32_t), int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, name_of(i)) == 0) return i;
  return -1;
}
static const char *kind_of(int32_t i) { return coll_kind_name((enum coll_kind)i); }
static const char *state_of(int32_t i) { return trace_state_name((enum trace_state)i); }

/* A dump's "result" (weftGetErrorString's text; absent: success) as its
 * code: a text this build does not know, from another version, reads as a
 * failure of weft's own rather than as none. */
static int32_t result_of(const struct json *e) {
  const struct json *v = json_get(e, "result");
  if (v == NULL) return weftSuccess;
  const char *s = v->type == J_STR ? v->str : "";
  for (int32_t r = 0; r < weftNumResults; r++)
    if (strcmp(s, weftGetErrorString((weftResult_t)r)) == 0) return r;
  return weftInternalError;
}

static void call_from_json(const struct json *e, int nranks, struct trace_call *c) {
  const int32_t coll = name_index(json_str(e, "kind"), kind_of, COLL_NUM);
  const int p2p = coll == COLL_SEND || coll == COLL_RECV;
  const char *op = json_str(e, "op");
  *c = (struct trace_call){
      .id = (uint64_t)json_int(e, "record_id", 0),
      .seq = (uint64_t)json_int(e, p2p ? "p2p_seq_id" : "collective_seq_id", 0),
      .count = (uint64_t)json_int(e, "count", 0),
      .t_created_ns = json_int(e, "time_created_ns", 0),
      .t_started_ns = json_int(e, "time_discovered_started_ns", 0),
      .t_done_ns = json_int(e, "time_discovered_completed_ns", 0),
      .coll = coll,
      .datatype = name_index(json_str(e, "datatype"), trace_type_name, weftNumTypes),
      .op = *op ? name_index(op, trace_op_name, weftNumOps) : weftSum,
      .root = (int32_t)json_int(e, p2p ? "peer" : "root", -1),
      .state = name_index(json_str(e, "state"), state_of, TRACE_NUM_STATES),
      .waiting_on = (int32_t)json_int(e, "waiting_on", -1),
      .nranks = nranks,
      .result = result_of(e),
      .on_device = json_get(e, "device") != NULL};
}

/* One rank's dump. */
struct dump {
  char job[32];
  int rank, nranks;
  int64_t time_ns;
  char reason[32];
  char *error;
  struct trace_call *calls;
  int ncalls;
};

static int dump_read(const char *path, struct dump *d) {
  FILE *f = fopen(path, "re");
  if (f == NULL) return -1;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  size_t got;
  while (buf != NULL && (got = fread(buf + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) {
      char *g = realloc(buf, cap *= 2);
      if (g == NULL) free(buf);
      buf = g;
    }
  }
  fclose(f);
  if (buf == NULL) return -1;
  struct json_in in = {.p = buf, .end = buf + len};
  struct json root;
  int rc = json_parse(&in, &root);
  free(buf);
  if (rc != 0 || root.type != J_OBJ) {
    json_free(&root);
    return -1;
  }
  memset(d, 0, sizeof *d);
  snprintf(d->job, sizeof d->job, "%s", json_str(&root, "job"));
  snprintf(d->reason, sizeof d->reason, "%s", json_str(&root, "reason"));
  d->rank = (int)json_int(&root, "rank", -1);
  d->nranks = (int)json_int(&root, "nranks", 0);
  d->time_ns = json_int(&root, "dump_time_ns", 0);
  const char *error = json_str(&root, "error");
  d->error = *error ? strdup(error) : NULL;
  const struct json *entries = json_get(&root, "entries");
  rc = -1;
  /* a communicator holds at most SIGNATURE_MAX_RANKS ranks: more is no dump of one */
  if (entries != NULL && entries->type == J_ARR && d->rank >= 0 && d->rank < d->nranks &&
      d->nranks <= SIGNATURE_MAX_RANKS) {
    d->calls = calloc((size_t)entries->n + 1, sizeof *d->calls);
    for (int i = 0; d->calls != NULL && i < entries->n; i++)
      call_from_json(&entries->items[i], d->nranks, &d->calls[d->ncalls++]);
    rc = d->calls != NULL ? 0 : -1;
  }
  json_free(&root);
  return rc;
}

/* --- the verdict on a job ------------------------------------------------- */

/* The call to judge: the lowest-numbered collective some rank did not
 * complete (calls refused as they were made left out); where there is none,
 * the earliest send or receive some rank did not complete, whose rank goes
 * to *rank_out. NULL when every dumped call completed. */
static const struct trace_call *first_unfinished(struct dump *const *byrank, int nranks,
                                                 int *rank_out) {
  const struct trace_call *best = NULL;
  *rank_out = -1;
  for (int r = 0; r < nranks; r++) {
    if (byrank[r] == NULL) continue;
    for (int i = 0; i < byrank[r]->ncalls; i++) {
      const struct trace_call *c = &byrank[r]->calls[i];
      if (c->coll == COLL_SEND || c->coll == COLL_RECV || c->state == TRACE_COMPLETED ||
          trace_call_refused_at_start(c))
        continue;
      if (best == NULL || c->seq < best->seq) best = c;
      break;
    }
  }
  if (best != NULL) return best;
  for (int r = 0; r < nranks; r++) {
    if (byrank[r] == NULL) continue;
    for (int i = 0; i < byrank[r]->ncalls; i++) {
      const struct trace_call *c = &byrank[r]->calls[i];
      if ((c->coll != COLL_SEND && c->coll != COLL_RECV) || c->state == TRACE_COMPLETED ||
          trace_call_refused_at_start(c))
        continue;
      if (best == NULL || c->t_created_ns < best->t_created_ns) best = c, *rank_out = r;
      break;
    }
  }
  return best;
}

static void judge_job(struct dump *dumps, int ndumps, const char *job, FILE *out) {
  int nranks = 0;
  for (int i = 0; i < ndumps; i++)
    if (strcmp(dumps[i].job, job) == 0 && dumps[i].nranks > nranks) nranks = dumps[i].nranks;
  struct dump **byrank = calloc((size_t)nranks, sizeof *byrank);
  struct hang_view *views = calloc((size_t)nranks, sizeof *views);
  if (byrank == NULL || views == NULL) {
    fprintf(out, "job %s: %d ranks: out of memory to judge it\n", job, nranks);
    goto free_all;
  }
  int have = 0;
  for (int i = 0; i < ndumps; i++) {
    struct dump *d = &dumps[i];
    if (strcmp(d->job, job) != 0 || d->rank >= nranks) continue;
    if (byrank[d->rank] == NULL || d->time_ns > byrank[d->rank]->time_ns) byrank[d->rank] = d;
  }
  for (int r = 0; r < nranks; r++) {
    views[r].status = HANG_NO_DUMP;
    if (byrank[r] == NULL) continue;
    have++;
    views[r] = (struct hang_view){.status = HANG_ANSWERED, .calls = byrank[r]->calls,
                                  .ncalls = byrank[r]->ncalls, .now_ns = byrank[r]->time_ns,
                                  .dumped = 1};
  }
  fprintf(out, "job %s: %d ranks, traces from %d\n", job, nranks, have);
  int p2p_rank;
  const struct trace_call *subject = first_unfinished(byrank, nranks, &p2p_rank);
  if (subject == NULL) {
    fprintf(out, "  every call traced completed");
    if (have < nranks) {
      fprintf(out, "; no trace from rank");
      for (int r = 0, first = 1; r < nranks; r++)
        if (byrank[r] == NULL) fprintf(out, "%s %d", first ? "" : ",", r), first = 0;
    }
    fprintf(out, "\n");
  } else {
    char text[4096];
    struct trace_call s = *subject;
    hang_verdict(&s, "did not complete", views, nranks, text, sizeof text);
    /* a send or a receive is numbered among its rank's own */
    if (p2p_rank >= 0) fprintf(out, "  rank %d's %s\n", p2p_rank, text);
    else fprintf(out, "  %s\n", text);
  }
  for (int r = 0; r < nranks; r++)
    if (byrank[r] != NULL && byrank[r]->error != NULL)
      fprintf(out, "  rank %d (%s dump): %s\n", r, byrank[r]->reason, byrank[r]->error);
free_all:
  free(byrank);
  free(views);
}

weftResult_t trace_diagnose_dir(const char *dir, FILE *out) {
  DIR *dp = opendir(dir);
  if (dp == NULL) return weft_error_errno(weftInvalidArgument, "cannot read %s", dir);
  struct dump *dumps = NULL;
  int ndumps = 0, cap = 0, bad = 0;
  struct dirent *e;
  while ((e = readdir(dp)) != NULL) {
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "weft_trace_", 11) != 0 || len < 5 ||
        strcmp(e->d_name + len - 5, ".json") != 0)
      continue;
    if (ndumps == cap) {
      cap = cap ? cap * 2 : 16;
      struct dump *g = realloc(dumps, sizeof *g * (size_t)cap);
      if (g == NULL) break;
      dumps = g;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (dump_read(path, &dumps[ndumps]) == 0) ndumps++;
    else bad++, fprintf(out, "%s: not a weft trace, skipped\n", path);
  }
  closedir(dp);
  weftResult_t res = weftSuccess;
  if (ndumps == 0)
    res = weft_error_set(weftInvalidArgument, "%s holds no weft trace (weft_trace_*.json)", dir);
  for (int i = 0; i < ndumps; i++) {
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) seen = strcmp(dumps[j].job, dumps[i].job) == 0;
    if (!seen) judge_job(dumps, ndumps, dumps[i].job, out);
  }
  for (int i = 0; i < ndumps; i++) {
    free(dumps[i].calls);
    free(dumps[i].error);
  }
  free(dumps);
  (void)bad;
  return res;
}
