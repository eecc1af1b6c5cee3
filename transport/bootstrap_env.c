/* Reads a launcher's environment into a rank, a size and a rendezvous id. */
#include <errno.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "status.h"

#define BOOTSTRAP_MAGIC 0x77667462u

static int env_int(const char *name, int *out) {
  const char *s = getenv(name);
  if (s == NULL || *s == '\0') return 0;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (*end != '\0' || v < 0 || v > 1 << 24) return -1;
  *out = (int)v;
  return 1;
}

static int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

weftResult_t bootstrap_id_from_hex(const char *hex, struct bootstrap_id *id_out) {
  unsigned char raw[WEFT_UNIQUE_ID_BYTES];
  if (strlen(hex) != 2 * sizeof raw)
    return weft_error_set(weftInvalidArgument, "unique id: expected %zu hex digits, got %zu",
                          2 * sizeof raw, strlen(hex));
  for (size_t i = 0; i < sizeof raw; i++) {
    int hi = hex_val(hex[2 * i]), lo = hex_val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return weft_error_set(weftInvalidArgument, "unique id: not hex");
    raw[i] = (unsigned char)(hi << 4 | lo);
  }
  memcpy(id_out, raw, sizeof *id_out);
  return weftSuccess;
}

/* Stretches text into the secret (FNV-1a over text and a counter). Not a
 * cryptographic derivation: it only binds the secret to WEFT_SECRET. */
static void secret_derive(const char *text, uint8_t secret[BOOTSTRAP_SECRET_BYTES]) {
  for (int i = 0; i < BOOTSTRAP_SECRET_BYTES; i += 8) {
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)i;
    for (const char *c = text; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    h ^= h >> 29;
    memcpy(secret + i, &h, 8);
  }
}

/* What the secret of a rendezvous at a fixed address is made from:
 * WEFT_SECRET, and the job identity the launcher gives every rank (values of
 * the environment, which other users cannot read). Without WEFT_SECRET that
 * identity may be guessable, so the secret is only as strong as it is. */
static const char *secret_text(void) {
  static const char *const job_vars[] = {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                                         "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"};
  static _Thread_local char text[768];
  const char *secret = getenv("WEFT_SECRET");
  int o = snprintf(text, sizeof text, "%s", secret != NULL ? secret : "weft-open");
  for (size_t i = 0; i < sizeof job_vars / sizeof job_vars[0]; i++) {
    const char *v = getenv(job_vars[i]);
    if (v != NULL && o >= 0 && (size_t)o < sizeof text)
      o += snprintf(text + o, sizeof text - (size_t)o, "|%s=%s", job_vars[i], v);
  }
  return text;
}

/* Splits "host:port" (what names the variable it came from). */
static weftResult_t hostport_split(const char *text, const char *what, char *host, size_t n,
                                   int *port_out) {
  const char *colon = strrchr(text, ':');
  if (colon == NULL || colon == text || (size_t)(colon - text) >= n)
    return weft_error_set(weftInvalidArgument, "%s=%s: expected host:port", what, text);
  memcpy(host, text, (size_t)(colon - text));
  host[colon - text] = '\0';
  *port_out = atoi(colon + 1);
  return weftSuccess;
}

/* WEFT_COMM_ID=host:port, else MASTER_ADDR + MASTER_PORT. */
static weftResult_t env_address(union weft_sockaddr *addr_out, int *found) {
  char host[256];
  int port = -1;
  const char *comm_id = getenv("WEFT_COMM_ID");
  *found = 0;
  if (comm_id != NULL && *comm_id) {
    WEFT_TRY(hostport_split(comm_id, "WEFT_COMM_ID", host, sizeof host, &port));
  } else if (getenv("MASTER_ADDR") != NULL && getenv("MASTER_PORT") != NULL) {
    snprintf(host, sizeof host, "%s", getenv("MASTER_ADDR"));
    port = atoi(getenv("MASTER_PORT"));
  } else {
    return weftSuccess;
  }
  if (port <= 0 || port > 65535)
    return weft_error_set(weftInvalidArgument, "rendezvous port %d out of range", port);
  /* strip brackets of an IPv6 literal */
  if (host[0] == '[') {
    size_t n = strlen(host);
    if (n > 1 && host[n - 1] == ']') host[n - 1] = '\0';
    memmove(host, host + 1, strlen(host));
  }
  WEFT_TRY(sock_resolve(host, port, addr_out));
  *found = 1;
  return weftSuccess;
}

weftResult_t bootstrap_env_read(struct bootstrap_env *env_out) {
  struct bootstrap_env e;
  memset(&e, 0, sizeof e);
  static const struct {
    const char *source, *rank, *size;
  } launchers[] = {
      {"weft", "WEFT_RANK", "WEFT_NRANKS"},
      {"torchrun", "RANK", "WORLD_SIZE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS"},
  };
  for (size_t i = 0; i < sizeof launchers / sizeof launchers[0] && !e.found; i++) {
    int r = env_int(launchers[i].rank, &e.rank), n = env_int(launchers[i].size, &e.nranks);
    if (r == 0 && n == 0) continue;
    if (r != 1 || n != 1 || e.nranks < 1 || e.rank >= e.nranks)
      return weft_error_set(weftInvalidArgument, "%s=%s %s=%s: not a valid rank and size",
                            launchers[i].rank, getenv(launchers[i].rank) ? getenv(launchers[i].rank) : "",
                            launchers[i].size, getenv(launchers[i].size) ? getenv(launchers[i].size) : "");
    e.found = 1;
    e.source = launchers[i].source;
  }
  if (!e.found) {
    e.nranks = 1;
    *env_out = e;
    return weftSuccess;
  }
  const char *hex = getenv("WEFT_UNIQUE_ID");
  if (hex != NULL && *hex) {
    WEFT_TRY(bootstrap_id_from_hex(hex, &e.id));
    *env_out = e;
    return weftSuccess;
  }
  int have_addr = 0;
  WEFT_TRY(env_address(&e.id.root, &have_addr));
  if (!have_addr) {
    if (e.nranks == 1) {
      e.found = 0;
      *env_out = e;
      return weftSuccess;
    }
    return weft_error_set(weftInvalidArgument,
                          "%s launcher variables found but no rendezvous address: set "
                          "WEFT_COMM_ID=host:port (or MASTER_ADDR and MASTER_PORT)",
                          e.source);
  }
  e.id.magic = BOOTSTRAP_MAGIC;
  char text[1024], abuf[64];
  snprintf(text, sizeof text, "%s|%s|%d", secret_text(), sock_addr_str(&e.id.root, abuf, sizeof abuf),
           e.nranks);
  secret_derive(text, e.id.secret);
  e.serve_root = e.rank == 0;
  *env_out = e;
  return weftSuccess;
}

weftResult_t bootstrap_id_from_hostport(const char *hostport, const char *what,
                                        struct bootstrap_id *id_out) {
  char host[256];
  int port = -1;
  WEFT_TRY(hostport_split(hostport, what, host, sizeof host, &port));
  if (port <= 0 || port > 65535)
    return weft_error_set(weftInvalidArgument, "%s=%s: port out of range", what, hostport);
  if (host[0] == '[') { /* an IPv6 literal */
    size_t n = strlen(host);
    if (n > 1 && host[n - 1] == ']') host[n - 1] = '\0';
    memmove(host, host + 1, strlen(host));
  }
  struct bootstrap_id id;
  memset(&id, 0, sizeof id);
  WEFT_TRY(sock_resolve(host, port, &id.root));
  id.magic = BOOTSTRAP_MAGIC;
  char text[1024], abuf[64];
  snprintf(text, sizeof text, "%s|%s|%s", secret_text(), what,
           sock_addr_str(&id.root, abuf, sizeof abuf));
  secret_derive(text, id.secret);
  *id_out = id;
  return weftSuccess;
}

weftResult_t bootstrap_env_rendezvous(struct bootstrap_env *env) {
  if (!env->found) return bootstrap_id_create_local(&env->id); /* a job of one */
  if (!env->serve_root) return weftSuccess;
  /* on the rendezvous address itself, so that only its interface (loopback
   * for 127.0.0.1) takes connections; on every interface when the address
   * is not one of this host's (a name that resolves elsewhere, NAT) */
  union weft_sockaddr at = env->id.root;
  weftResult_t res = bootstrap_root_start(&at, env->id.secret, NULL);
  if (res == weftSuccess) return weftSuccess;
  char first[512], abuf[64];
  snprintf(first, sizeof first, "%s", weft_error_text());
  if (strstr(first, strerror(EADDRINUSE)) != NULL)
    return weft_error_set(weftSystemError,
                          "%s: the rendezvous port %s is taken; under torchrun MASTER_PORT is its "
                          "store's (weft then uses the store unless WEFT_COMM_ID is set): set "
                          "WEFT_COMM_ID=host:port to a free port",
                          first, sock_addr_str(&at, abuf, sizeof abuf));
  if (at.sa.sa_family == AF_INET) at.in.sin_addr.s_addr = htonl(INADDR_ANY);
  else at.in6.sin6_addr = in6addr_any;
  WEFT_INFO(LOG_BOOTSTRAP, "%s; serving the rendezvous on every interface", first);
  return bootstrap_root_start(&at, env->id.secret, NULL);
}
