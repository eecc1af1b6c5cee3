/* libnccl.so.2's environment: NCCL_* variables that weft has an equivalent
 * for are copied to the WEFT_* ones when the library loads, after NCCL's
 * configuration files (NCCL_CONF_FILE, ~/.nccl.conf, /etc/nccl.conf) have
 * set those the environment lacks; the version line NCCL_DEBUG asks for. */
#include <ctype.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "nccl_shim.h"

/* NCCL_DEBUG levels; VERSION prints the version line and warnings. */
static const char *debug_level(const char *nccl, char *buf, size_t n) {
  static const char *const map[][2] = {{"VERSION", "WARN"}, {"WARN", "WARN"}, {"INFO", "INFO"},
                                       {"ABORT", "WARN"},   {"TRACE", "TRACE"}, {"NONE", "NONE"}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (strcasecmp(nccl, map[i][0]) == 0) return snprintf(buf, n, "%s", map[i][1]), buf;
  return NULL;
}

/* NCCL_DEBUG_SUBSYS: NCCL's names onto weft's subsystems; others dropped. */
static const char *debug_subsys(const char *nccl, char *buf, size_t n) {
  static const char *const map[][2] = {
      {"INIT", "INIT"}, {"ENV", "INIT"},   {"BOOTSTRAP", "BOOTSTRAP"}, {"SHM", "SHM"},
      {"NET", "NET"},   {"PROXY", "NET"},  {"COLL", "COLL"},           {"P2P", "COLL"},
      {"TUNING", "COLL"}, {"ALL", "ALL"}};
  size_t used = 0;
  buf[0] = '\0';
  if (*nccl == '^') {
    used = (size_t)snprintf(buf, n, "^");
    nccl++;
  }
  int any = 0;
  while (*nccl) {
    size_t len = strcspn(nccl, ",");
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
      if (strlen(map[i][0]) == len && strncasecmp(nccl, map[i][0], len) == 0 && used < n) {
        used += (size_t)snprintf(buf + used, n - used, "%s%s", any ? "," : "", map[i][1]);
        any = 1;
        break;
      }
    nccl += len;
    if (*nccl == ',') nccl++;
  }
  return any ? buf : NULL;
}

/* NCCL_ALGO and NCCL_PROTO: weft spells the names in lower case. */
static const char *lower(const char *nccl, char *buf, size_t n) {
  size_t i = 0;
  for (; nccl[i] && i + 1 < n; i++) buf[i] = (char)tolower((unsigned char)nccl[i]);
  buf[i] = '\0';
  return buf;
}

static const char *same(const char *nccl, char *buf, size_t n) {
  return snprintf(buf, n, "%s", nccl), buf;
}

static struct env_alias {
  const char *nccl, *weft;
  const char *(*map)(const char *value, char *buf, size_t n); /* NULL: no weft value */
  int ours; /* we set the WEFT_* variable, so a reset may set it again */
} env_aliases[] = {
    {"NCCL_DEBUG", "WEFT_DEBUG", debug_level, 0},
    {"NCCL_DEBUG_SUBSYS", "WEFT_DEBUG_SUBSYS", debug_subsys, 0},
    {"NCCL_DEBUG_FILE", "WEFT_DEBUG_FILE", same, 0},
    {"NCCL_SOCKET_IFNAME", "WEFT_SOCKET_IFNAME", same, 0},
    {"NCCL_SHM_DISABLE", "WEFT_SHM_DISABLE", same, 0},
    {"NCCL_ALGO", "WEFT_ALGO", lower, 0},
    {"NCCL_PROTO", "WEFT_PROTO", lower, 0},
};

/* One configuration file of NCCL's: each line VAR=VALUE (a line starting
 * with '#' or without '=' skipped, the value the rest of the line as it
 * is) sets VAR where nothing set it yet: the environment wins, then the
 * file read first. */
static void conf_file_load(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return;
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) != -1) {
    if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
    char *eq = strchr(line, '=');
    if (line[0] == '#' || eq == NULL || eq == line) continue;
    *eq = '\0';
    setenv(line, eq + 1, 0);
  }
  free(line);
  fclose(f);
}

/* NCCL's configuration files, as NCCL reads them (the library's load):
 * NCCL_CONF_FILE where it is set and not empty, else ~/.nccl.conf (the
 * user's home directory from the password database), then /etc/nccl.conf. */
static void conf_files_load(void) {
  const char *file = getenv("NCCL_CONF_FILE");
  if (file != NULL && file[0] != '\0') {
    conf_file_load(file);
  } else {
    const struct passwd *pw = getpwuid(getuid());
    if (pw != NULL && pw->pw_dir != NULL) {
      char path[4096];
      snprintf(path, sizeof path, "%s/.nccl.conf", pw->pw_dir);
      conf_file_load(path);
    }
  }
  conf_file_load("/etc/nccl.conf");
}

/* A WEFT_* variable the user set wins over its NCCL_* alias. One import at
 * a time (the first use's, ncclResetDebugInit's): they share the flags. */
static pthread_mutex_t env_import_lock = PTHREAD_MUTEX_INITIALIZER;

static void env_import(void) {
  pthread_mutex_lock(&env_import_lock);
  for (size_t i = 0; i < sizeof env_aliases / sizeof env_aliases[0]; i++) {
    struct env_alias *a = &env_aliases[i];
    const char *user = getenv(a->weft);
    if (user != NULL && !a->ours) continue;
    const char *value = getenv(a->nccl);
    char buf[256];
    const char *mapped = value != NULL && *value ? a->map(value, buf, sizeof buf) : NULL;
    if (mapped != NULL) {
      setenv(a->weft, mapped, 1);
      a->ours = 1;
    } else if (a->ours) {
      unsetenv(a->weft);
      a->ours = 0;
    }
  }
  pthread_mutex_unlock(&env_import_lock);
}

/* At load: NCCL's configuration files once, then the aliases (which the
 * first init or unique id, and ncclResetDebugInit, import again). */
__attribute__((constructor)) static void nccl_compat_load(void) {
  conf_files_load();
  env_import();
}

/* NCCL reads its variables when first asked (its init, its first log
 * line), so a program may set them before its first NCCL call: the first
 * call that starts something imports them again. */
static void env_first_use_import(void) {
  env_import();
  compat_log_settings_reset();
}

void nccl_env_first_use(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, env_first_use_import);
}

const char *nccl_env_alias(const char *nccl_name) {
  for (size_t i = 0; i < sizeof env_aliases / sizeof env_aliases[0]; i++)
    if (strcmp(env_aliases[i].nccl, nccl_name) == 0) return env_aliases[i].weft;
  return NULL;
}

void nccl_version_banner(int rank) {
  static int printed;
  const char *d = getenv("NCCL_DEBUG");
  if (rank != 0 || d == NULL || __atomic_exchange_n(&printed, 1, __ATOMIC_SEQ_CST)) return;
  if (strcasecmp(d, "VERSION") == 0 || strcasecmp(d, "INFO") == 0 || strcasecmp(d, "TRACE") == 0)
    fprintf(stderr, "NCCL version %d.%d.%d (weft %d.%d.%d)\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
            WEFT_MAJOR, WEFT_MINOR, WEFT_PATCH);
}

NCCL_EXPORT void ncclResetDebugInit(void) {
  env_import();
  compat_log_settings_reset();
}
NCCL_PROFILING_ALIAS(ncclResetDebugInit);

/* NCCL 2.32 exports it, strong and without a pnccl twin. */
__attribute__((visibility("default"))) void ncclResetDebugInitInternal(void) {
  pncclResetDebugInit(); /* not through a name a profiler may interpose */
}
