/* Fuzz target: what strangers and peers send a bootstrap root. Each input is
 * one or more messages (separated by "WEFTFUZZ|"), each sent on its own TCP
 * connection to a fresh root listening on loopback, whose secret the corpus
 * knows (so fuzzed hellos reach the checks behind the secret). After the
 * messages, the target waits for the root to finish or give up: a root that
 * outlives its timeout by far, or crashes, fails the run. */
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/base/sock.h"
#include "transport/base/status.h"
#include "transport/base/wait.h"

const char *const fuzz_target_name = "bootstrap";

#define ROOT_TIMEOUT_S 1
/* bootstrap.c's hello, as a rank sends it (the self-check below fails when
 * the two drift apart, so the corpus keeps reaching past the secret) */
struct fuzz_hello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[BOOTSTRAP_SECRET_BYTES];
  int32_t rank;
  int32_t nranks;
  struct peer_info info;
};
static uint8_t secret[BOOTSTRAP_SECRET_BYTES];
static struct fuzz_hello valid; /* a job of one, rank 0 */

static int connect_to(const union weft_sockaddr *a) {
  int fd = socket(a->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = a->sa.sa_family == AF_INET6 ? sizeof a->in6 : sizeof a->in;
  if (fd >= 0 && connect(fd, &a->sa, len) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* Reads what the root answers within ms; returns the byte count. */
static size_t read_reply(int fd, uint8_t *buf, size_t cap, int ms) {
  size_t got = 0;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  while (got < cap && poll(&p, 1, ms) == 1) {
    ssize_t n = recv(fd, buf + got, cap - got, 0);
    if (n <= 0) break;
    got += (size_t)n;
  }
  return got;
}

struct send_ctx {
  const union weft_sockaddr *root;
  int fds[16];
  int nfds;
};

static void send_part(const uint8_t *part, size_t nbytes, int index, void *p) {
  struct send_ctx *c = p;
  if (index >= 16) return;
  int fd = connect_to(c->root);
  if (fd < 0) return; /* the root finished with an earlier message */
  if (nbytes > 0) send(fd, part, nbytes, MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR); /* a short message ends here instead of at the hello deadline */
  uint8_t reply[64];
  read_reply(fd, reply, 4, 50);
  c->fds[c->nfds++] = fd; /* kept open: a joined rank stays connected */
}

static weftResult_t root_start(union weft_sockaddr *bound) {
  union weft_sockaddr any;
  memset(&any, 0, sizeof any);
  any.in.sin_family = AF_INET;
  any.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return bootstrap_root_start(&any, secret, bound);
}

/* Waits until the root closed its listener; returns its time to do so. */
static double root_wait_gone(const union weft_sockaddr *root) {
  uint64_t t0 = clock_ns();
  for (;;) {
    int fd = connect_to(root);
    if (fd < 0) return (double)(clock_ns() - t0) / 1e9;
    close(fd);
    if (clock_ns() - t0 > 10ull * ROOT_TIMEOUT_S * 1000000000ull) return 1e9;
    usleep(2000);
  }
}

static void write_seed(const char *dir, const char *name, const void *data, size_t nbytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL) return;
  fwrite(data, 1, nbytes, f);
  fclose(f);
}

int fuzz_init(void) {
  memset(secret, 0x5a, sizeof secret);
  setenv("WEFT_TIMEOUT", "1", 1); /* ROOT_TIMEOUT_S: roots waiting for more ranks give up */
  setenv("WEFT_DEBUG", "NONE", 1);
  struct fuzz_hello h;
  memset(&h, 0, sizeof h);
  h.magic = 0x77667462u; /* "wftb" */
  h.version = 4; /* BOOTSTRAP_VERSION (transport/bootstrap/wire.h) */
  memcpy(h.secret, secret, sizeof secret);
  h.rank = 0;
  h.nranks = 1;
  bootstrap_peer_info_local(&h.info);
  valid = h;
  /* self-check: a real hello for a job of one gets ROOT_OK and the table */
  union weft_sockaddr root;
  if (root_start(&root) != weftSuccess) {
    fprintf(stderr, "fuzz bootstrap: cannot start a root: %s\n", weft_error_text());
    return 1;
  }
  int fd = connect_to(&root);
  /* admission (ROOT_OK), the outcome (all joined), the table */
  uint8_t reply[4 + 4 + sizeof(struct peer_info)];
  size_t got = 0;
  if (fd >= 0) {
    send(fd, &h, sizeof h, MSG_NOSIGNAL);
    got = read_reply(fd, reply, sizeof reply, 2000);
    close(fd);
  }
  uint32_t code = 1, outcome = 0;
  if (got >= 4) memcpy(&code, reply, 4);
  if (got >= 8) memcpy(&outcome, reply + 4, 4);
  if (got != sizeof reply || code != 0 || outcome != 0x6a6f696eu /* "join" */) {
    fprintf(stderr, "fuzz bootstrap: a valid hello got %zu reply bytes (code %u), expected %zu "
                    "(code 0): struct fuzz_hello no longer matches bootstrap.c\n",
            got, code, sizeof reply);
    return 1;
  }
  const char *dir = getenv("WEFT_FUZZ_WRITE_CORPUS"); /* regenerates tests/fuzz/corpus/bootstrap */
  if (dir != NULL) {
    mkdir(dir, 0755);
    write_seed(dir, "hello-1-rank", &h, sizeof h);
    uint8_t two[2 * sizeof h + 9];
    struct fuzz_hello h2 = h;
    h2.nranks = 2;
    memcpy(two, &h2, sizeof h2);
    memcpy(two + sizeof h2, "WEFTFUZZ|", 9);
    h2.rank = 1;
    memcpy(two + sizeof h2 + 9, &h2, sizeof h2);
    write_seed(dir, "hello-2-ranks", two, sizeof two);
    struct fuzz_hello bad = h;
    bad.secret[3] ^= 1;
    write_seed(dir, "hello-bad-secret", &bad, sizeof bad);
    bad = h;
    bad.rank = 5;
    write_seed(dir, "hello-bad-rank", &bad, sizeof bad);
    write_seed(dir, "short", &h, 12);
  }
  return 0;
}

int fuzz_one(const uint8_t *data, size_t nbytes) {
  union weft_sockaddr root;
  if (root_start(&root) != weftSuccess) {
    fprintf(stderr, "fuzz bootstrap: cannot start a root: %s\n", weft_error_text());
    return 1;
  }
  struct send_ctx c = {.root = &root};
  fuzz_split(data, nbytes, "WEFTFUZZ|", send_part, &c);
  /* then a real job of one, which ends the root unless the input began a
   * larger job (that root gives up at its timeout) */
  int fd = connect_to(&root);
  if (fd >= 0) {
    send(fd, &valid, sizeof valid, MSG_NOSIGNAL);
    uint8_t reply[4 + 4 + sizeof(struct peer_info)];
    read_reply(fd, reply, sizeof reply, 100);
    close(fd);
  }
  for (int i = 0; i < c.nfds; i++) close(c.fds[i]);
  double took = root_wait_gone(&root);
  if (took > 5.0 * ROOT_TIMEOUT_S) {
    fprintf(stderr, "fuzz bootstrap: the root still listened %.1f s after the input (timeout %d s)\n",
            took, ROOT_TIMEOUT_S);
    return 1;
  }
  return 0;
}
