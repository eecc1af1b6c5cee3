/* Reads a launcher's environment into a rank, a size and a rendezvous id. */
#include <errno.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "bootstrap.h"
#include "../base/env.h"
#include "../base/param.h"
#include "../base/status.h"
#include "../base/wait.h"

#define BOOTSTRAP_MAGIC 0x77667462u
#define LAUNCHER_MAX_RANKS (1 << 24)

/* Read at each weftCommInitFromEnv (a process may change them between
 * calls), so never cached: param_env_str and param_env_int. */
enum { L_RANK, L_NRANKS, L_UNIQUE_ID, L_COMM_ID, L_SECRET };
struct weft_param launcher_params[] = {
    [L_RANK] = {.name = "WEFT_RANK", .type = PARAM_INT, .min = 0, .max = LAUNCHER_MAX_RANKS,
     .doc = "this process's rank, for `weftCommInitFromEnv` (set by `weftrun`; with "
            "`WEFT_NRANKS`)"},
    [L_NRANKS] = {.name = "WEFT_NRANKS", .type = PARAM_INT, .min = 0, .max = LAUNCHER_MAX_RANKS,
     .doc = "the job's number of ranks, for `weftCommInitFromEnv` (set by `weftrun`; with "
            "`WEFT_RANK`)"},
    [L_UNIQUE_ID] = {.name = "WEFT_UNIQUE_ID", .type = PARAM_STR,
     .doc = "the job's unique id in hex (`weftrun` serves it): the rendezvous of "
            "`weftCommInitFromEnv`, before any address"},
    [L_COMM_ID] = {.name = "WEFT_COMM_ID", .type = PARAM_STR,
     .doc = "`host:port` where rank 0 serves the rendezvous of `weftCommInitFromEnv`, before "
            "`MASTER_ADDR`/`MASTER_PORT` (and instead of torchrun's store)"},
    [L_SECRET] = {.name = "WEFT_SECRET", .type = PARAM_STR,
     .doc = "a random value shared by the ranks of a job, from which the secret of a "
            "rendezvous at a fixed address is made; without it, a process that guesses the "
            "launcher's job identity can join the job"},
    PARAM_END,
};

/* name's entry above when it is one of weft's own variables, else NULL. */
static const struct weft_param *launcher_own(const char *name) {
  for (const struct weft_param *p = launcher_params; p->name != NULL; p++)
    if (strcmp(p->name, name) == 0) return p;
  return NULL;
}

/* A launcher's rank or size variable: 0 unset, 1 *out set, -1 not a number
 * of ranks. */
static int launcher_int(const char *name, int *out) {
  const struct weft_param *own = launcher_own(name);
  int64_t v = 0;
  int r = own != NULL ? param_env_int(own, &v) : env_int(name, 0, LAUNCHER_MAX_RANKS, &v);
  if (r == 1) *out = (int)v;
  return r;
}

/* A launcher's variable as text, for messages ("" when unset). */
static const char *launcher_text(const char *name) {
  const struct weft_param *own = launcher_own(name);
  const char *v = own != NULL ? param_env_str(own) : env_str(name);
  return v != NULL ? v : "";
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
  const char *secret = param_env_str(&launcher_params[L_SECRET]);
  int o = snprintf(text, sizeof text, "%s", secret != NULL ? secret : "weft-open");
  for (size_t i = 0; i < sizeof job_vars / sizeof job_vars[0]; i++) {
    const char *v = env_str(job_vars[i]);
    if (v != NULL && o >= 0 && (size_t)o < sizeof text)
      o += snprintf(text + o, sizeof text - (size_t)o, "|%s=%s", job_vars[i], v);
  }
  return text;
}

/* Splits "host:port", the port 1 to 65535 (what names the variable it came
 * from). */
static weftResult_t hostport_split(const char *text, const char *what, char *host, size_t n,
                                   int *port_out) {
  const char *colon = strrchr(text, ':');
  if (colon == NULL || colon == text || (size_t)(colon - text) >= n)
    return weft_error_set(weftInvalidArgument, "%s=%s: expected host:port", what, text);
  int64_t port;
  if (env_parse_int(colon + 1, 1, 65535, &port) != 0)
    return weft_error_set(weftInvalidArgument, "%s=%s: the port must be 1 to 65535", what, text);
  memcpy(host, text, (size_t)(colon - text));
  host[colon - text] = '\0';
  *port_out = (int)port;
  return weftSuccess;
}

/* WEFT_COMM_ID=host:port, else MASTER_ADDR + MASTER_PORT. */
static weftResult_t env_address(union weft_sockaddr *addr_out, int *found) {
  char host[256];
  int port = -1;
  const char *comm_id = param_env_str(&launcher_params[L_COMM_ID]);
  const char *master_addr = env_str("MASTER_ADDR"), *master_port = env_str("MASTER_PORT");
  *found = 0;
  if (comm_id != NULL) {
    WEFT_TRY(hostport_split(comm_id, "WEFT_COMM_ID", host, sizeof host, &port));
  } else if (master_addr != NULL && master_port != NULL) {
    snprintf(host, sizeof host, "%s", master_addr);
    int64_t v;
    if (env_parse_int(master_port, 1, 65535, &v) != 0)
      return weft_error_set(weftInvalidArgument, "MASTER_PORT=%s: must be a port, 1 to 65535",
                            master_port);
    port = (int)v;
  } else {
    return weftSuccess;
  }
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
    int r = launcher_int(launchers[i].rank, &e.rank), n = launcher_int(launchers[i].size, &e.nranks);
    if (r == 0 && n == 0) continue;
    /* a Slurm batch script's own process has SLURM_PROCID=0, and
     * SLURM_NTASKS only with --ntasks: without it, no tasks were launched */
    if (strcmp(launchers[i].source, "slurm") == 0 && n == 0 && r == 1 && e.rank == 0) continue;
    if (r != 1 || n != 1 || e.nranks < 1 || e.rank >= e.nranks)
      return weft_error_set(weftInvalidArgument, "%s=%s %s=%s: not a valid rank and size",
                            launchers[i].rank, launcher_text(launchers[i].rank),
                            launchers[i].size, launcher_text(launchers[i].size));
    e.found = 1;
    e.source = launchers[i].source;
  }
  if (!e.found) {
    e.nranks = 1;
    *env_out = e;
    return weftSuccess;
  }
  const char *hex = param_env_str(&launcher_params[L_UNIQUE_ID]);
  if (hex != NULL) {
    WEFT_TRY(bootstrap_id_from_hex(hex, &e.id));
    /* its root admits each rank once, then closes */
    static int reads;
    if (__atomic_fetch_add(&reads, 1, __ATOMIC_RELAXED) == 1)
      WEFT_WARN(LOG_INIT, "WEFT_UNIQUE_ID is used a second time in this process: its rendezvous "
                          "(weftrun's) admits each rank once, so a second weftCommInitFromEnv "
                          "finds nothing listening; make further communicators with "
                          "weftCommSplit");
    *env_out = e;
    return weftSuccess;
  }
  int have_addr = 0;
  WEFT_TRY(env_address(&e.id.root, &have_addr));
  /* torchrun's agent holds MASTER_PORT with its store: the id goes through it */
  const char *agent_store = env_str("TORCHELASTIC_USE_AGENT_STORE");
  const char *comm_id = param_env_str(&launcher_params[L_COMM_ID]);
  if (have_addr && strcmp(e.source, "torchrun") == 0 && comm_id == NULL &&
      agent_store != NULL && strcasecmp(agent_store, "true") == 0) {
    e.use_store = 1;
    e.store_addr = e.id.root;
    memset(&e.id, 0, sizeof e.id);
    *env_out = e;
    return weftSuccess;
  }
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
  e.id.flags = BOOTSTRAP_ID_ROOT_LATE;
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
  if (host[0] == '[') { /* an IPv6 literal */
    size_t n = strlen(host);
    if (n > 1 && host[n - 1] == ']') host[n - 1] = '\0';
    memmove(host, host + 1, strlen(host));
  }
  struct bootstrap_id id;
  memset(&id, 0, sizeof id);
  WEFT_TRY(sock_resolve(host, port, &id.root));
  id.magic = BOOTSTRAP_MAGIC;
  id.flags = BOOTSTRAP_ID_ROOT_LATE;
  char text[1024], abuf[64];
  snprintf(text, sizeof text, "%s|%s|%s", secret_text(), what,
           sock_addr_str(&id.root, abuf, sizeof abuf));
  secret_derive(text, id.secret);
  *id_out = id;
  return weftSuccess;
}

/* --- torchrun's store ----------------------------------------------------
 * A c10d TCPStore speaks a small binary protocol: a one-byte query type, then
 * strings and values as a 64-bit little-endian length and the bytes. Weft
 * uses four queries: VALIDATE (with the store's magic number), SET, WAIT
 * (answered once the keys exist) and GET. */
enum { STORE_VALIDATE = 0, STORE_SET = 1, STORE_GET = 3, STORE_WAIT = 6 };
#define STORE_MAGIC 0x3C85F7CEu
#define STORE_MAX_VALUE 4096

/* One query, sent whole in one call as the store's own client does (the
 * store's parser may take a query split across packets for a bad one). */
struct store_msg {
  size_t n;
  uint8_t buf[512];
};

static void store_put(struct store_msg *m, const void *data, size_t n) {
  if (m->n + n <= sizeof m->buf) memcpy(m->buf + m->n, data, n);
  m->n += n;
}

static void store_put_bytes(struct store_msg *m, const void *data, uint64_t n) {
  store_put(m, &n, sizeof n);
  store_put(m, data, n);
}

static weftResult_t store_send(int fd, const struct store_msg *m, uint64_t deadline) {
  if (m->n > sizeof m->buf) return weft_error_set(weftInternalError, "store query too long");
  return sock_send_all(fd, m->buf, m->n, deadline);
}

static weftResult_t store_open(const union weft_sockaddr *addr, uint64_t deadline, int *fd_out) {
  int fd;
  WEFT_TRY(sock_connect(addr, deadline, &fd));
  struct store_msg m = {0};
  uint8_t type = STORE_VALIDATE;
  uint32_t magic = STORE_MAGIC;
  store_put(&m, &type, 1);
  store_put(&m, &magic, sizeof magic);
  weftResult_t res = store_send(fd, &m, deadline);
  if (res != weftSuccess) {
    close(fd);
    return res;
  }
  *fd_out = fd;
  return weftSuccess;
}

static weftResult_t store_set(int fd, const char *key, const void *value, size_t n,
                              uint64_t deadline) {
  struct store_msg m = {0};
  uint8_t type = STORE_SET;
  store_put(&m, &type, 1);
  store_put_bytes(&m, key, strlen(key));
  store_put_bytes(&m, value, n);
  return store_send(fd, &m, deadline);
}

/* Waits until key exists, then reads its value (exactly n bytes). */
static weftResult_t store_get(int fd, const char *key, void *value, size_t n, uint64_t deadline) {
  uint64_t nkeys = 1, got = 0;
  uint8_t answer = 0xff, type = STORE_WAIT;
  struct store_msg m = {0};
  store_put(&m, &type, 1);
  store_put(&m, &nkeys, sizeof nkeys);
  store_put_bytes(&m, key, strlen(key));
  WEFT_TRY(store_send(fd, &m, deadline));
  WEFT_TRY(sock_recv_all(fd, &answer, 1, deadline));
  if (answer != 0) return weft_error_set(weftRemoteError, "the store cancelled the wait");
  m.n = 0;
  type = STORE_GET;
  store_put(&m, &type, 1);
  store_put_bytes(&m, key, strlen(key));
  WEFT_TRY(store_send(fd, &m, deadline));
  WEFT_TRY(sock_recv_all(fd, &got, sizeof got, deadline));
  if (got != n)
    return weft_error_set(weftRemoteError, "the store's value of %s has %llu bytes, expected %zu",
                          key, (unsigned long long)got, n);
  return sock_recv_all(fd, value, n, deadline);
}

/* Rank 0 makes the id and puts it in the store; the others wait for it. The
 * key is new for each call of the process (ranks call in the same order)
 * and for each restart of the job. */
static weftResult_t store_exchange_id(struct bootstrap_env *env) {
  static int calls;
  int seq = __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
  const char *restart = env_str("TORCHELASTIC_RESTART_COUNT");
  char key[160], abuf[64];
  snprintf(key, sizeof key, "weft/%s/%d/unique_id", restart != NULL ? restart : "0", seq);
  uint64_t deadline = clock_ns() + wait_default_timeout_ns();
  int fd;
  weftResult_t res = store_open(&env->store_addr, deadline, &fd);
  if (res == weftSuccess) {
    if (env->rank == 0) {
      union weft_sockaddr at;
      res = sock_local_addr_to(&env->store_addr, &at);
      if (res == weftSuccess) res = bootstrap_id_create_at(&at, &env->id);
      if (res == weftSuccess) res = store_set(fd, key, &env->id, sizeof env->id, deadline);
    } else {
      res = store_get(fd, key, &env->id, sizeof env->id, deadline);
    }
    sock_close_reset(fd); /* nothing more to read: no port left in TIME_WAIT */
  }
  if (res != weftSuccess)
    return weft_error_set(res,
                          "torchrun's store at %s (MASTER_ADDR:MASTER_PORT), key %s: %s; to "
                          "rendezvous without it, set WEFT_COMM_ID=host:port to a free port",
                          sock_addr_str(&env->store_addr, abuf, sizeof abuf), key,
                          weft_error_text());
  WEFT_INFO(LOG_BOOTSTRAP, "rank %d: unique id %s through torchrun's store at %s", env->rank,
            env->rank == 0 ? "published" : "read", sock_addr_str(&env->store_addr, abuf, sizeof abuf));
  return weftSuccess;
}

weftResult_t bootstrap_env_rendezvous(struct bootstrap_env *env) {
  if (!env->found) return bootstrap_id_create_local(&env->id); /* a job of one */
  if (env->use_store) return store_exchange_id(env);
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
