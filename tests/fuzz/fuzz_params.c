/* Fuzz target: the parsers of what users type into the environment:
 * WEFT_ALGO / WEFT_PROTO, integer WEFT_* values, launcher variables,
 * WEFT_UNIQUE_ID and host:port addresses. The first byte picks the parser;
 * the rest is the text. */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/api/config.h"
#include "collectives/core/params.h"
#include "collectives/core/plan.h"
#include "collectives/tune/tuner.h"
#include "fuzz.h"
#include "transport/bootstrap/bootstrap.h"

const char *const fuzz_target_name = "params";

static const char *const algo_names[] = {"ring", "tree", "rd", "cma", "bulk"};
static const char *const proto_names[] = {"simple", "ll"};
static const char *const int_vars[] = {"WEFT_TIMEOUT", "WEFT_NSLOTS", "WEFT_SLOT_BYTES",
                                       "WEFT_NCHANNELS", "WEFT_SPIN_NS"};
static const char *const env_vars[] = {"WEFT_RANK", "WEFT_NRANKS", "RANK", "WORLD_SIZE",
                                       "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                       "SLURM_PROCID", "SLURM_NTASKS", "WEFT_UNIQUE_ID",
                                       "WEFT_COMM_ID", "MASTER_ADDR", "MASTER_PORT", "WEFT_SECRET"};
#define NENV (sizeof env_vars / sizeof env_vars[0])

int fuzz_init(void) {
  for (size_t i = 0; i < NENV; i++) unsetenv(env_vars[i]);
  setenv("WEFT_DEBUG", "NONE", 1); /* "ignoring X=..." warnings are expected */
  return 0;
}

/* Host names would go to DNS: only numeric addresses (or none) pass. */
static int host_is_numeric(const char *hostport) {
  const char *colon = strrchr(hostport, ':');
  size_t n = colon ? (size_t)(colon - hostport) : strlen(hostport);
  char host[256];
  if (n >= sizeof host) return 1; /* refused as too long before any lookup */
  memcpy(host, hostport, n);
  host[n] = '\0';
  char *h = host;
  if (h[0] == '[') {
    h++;
    size_t k = strlen(h);
    if (k > 0 && h[k - 1] == ']') h[k - 1] = '\0';
  }
  unsigned char buf[16];
  return h[0] == '\0' || inet_pton(AF_INET, h, buf) == 1 || inet_pton(AF_INET6, h, buf) == 1;
}

/* "NAME=VALUE" lines, NAME from env_vars only. */
static void env_set_lines(char *text) {
  for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
    char *eq = strchr(line, '=');
    if (eq == NULL) continue;
    *eq = '\0';
    for (size_t i = 0; i < NENV; i++)
      if (strcmp(line, env_vars[i]) == 0) setenv(line, eq + 1, 1);
  }
}

int fuzz_one(const uint8_t *data, size_t nbytes) {
  if (nbytes == 0) return 0;
  char *text = malloc(nbytes); /* the text after the selector, NUL-terminated */
  if (text == NULL) return 0;
  memcpy(text, data + 1, nbytes - 1);
  text[nbytes - 1] = '\0';
  uint8_t allowed[COLL_NUM_RING][8];
  struct bootstrap_id id;
  switch (data[0] % 6) {
    case 0:
      tuner_parse(text, algo_names, 5, allowed);
      break;
    case 1:
      tuner_parse(text, proto_names, 2, allowed);
      break;
    case 2: /* one integer variable, read through the parameter tables */
      for (size_t i = 0; i < sizeof int_vars / sizeof int_vars[0]; i++) {
        setenv(int_vars[i], text, 1);
        weft_params_reset();
        for (struct weft_param *const *t = weft_param_tables; *t != NULL; t++)
          for (struct weft_param *p = *t; p->name != NULL; p++)
            if (strcmp(p->name, int_vars[i]) == 0) (void)param_int(p);
        unsetenv(int_vars[i]);
      }
      weft_params_reset();
      break;
    case 3:
      bootstrap_id_from_hex(text, &id);
      break;
    case 4:
      if (host_is_numeric(text)) bootstrap_id_from_hostport(text, "WEFT_COMM_ID", &id);
      break;
    default: { /* launcher variables */
      env_set_lines(text);
      const char *a = getenv("WEFT_COMM_ID"), *m = getenv("MASTER_ADDR");
      if ((a == NULL || host_is_numeric(a)) && (m == NULL || host_is_numeric(m))) {
        struct bootstrap_env env;
        bootstrap_env_read(&env);
      }
      for (size_t i = 0; i < NENV; i++) unsetenv(env_vars[i]);
      break;
    }
  }
  free(text);
  return 0;
}
