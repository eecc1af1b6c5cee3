/* The socket transport: TCP between ranks on any hosts. Each end keeps its
 * FIFO in private memory with the same layout as shm (a ctrl page, then the
 * slots), and a proxy thread (socket_proxy.c) carries filled slots from the
 * sender's FIFO to the receiver's over WEFT_SOCKET_NSOCKS sockets. The
 * receiver listens and publishes its address and a random token; the sender
 * connects and proves the token on every socket. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../base/param.h"
#include "../base/sock.h"
#include "../base/status.h"
#include "../transport.h"
#include "../base/wait.h"
#include "socket_proxy.h"

struct weft_param socket_params[] = {
    [SOCKET_P_DISABLE] = {.name = "WEFT_SOCKET_DISABLE", .type = PARAM_INT, .min = 0, .max = 1,
     .out_of_range = PARAM_RANGE_ERROR, .default_str = "0",
     .doc = "`1` disables the socket (TCP) transport, used between hosts or when forced with "
            "`WEFT_TRANSPORT=socket`"},
    [SOCKET_P_NSOCKS] = {.name = "WEFT_SOCKET_NSOCKS", .type = PARAM_INT, .default_str = "2",
     .min = 1, .max = SOCKET_MAX_SOCKS,
     .doc = "TCP sockets per socket-transport connection; each slot is split across them"},
    [SOCKET_P_NTHREADS] = {.name = "WEFT_SOCKET_NTHREADS", .type = PARAM_INT,
     .default_str = "1", .min = 1, .max = SOCKET_MAX_THREADS,
     .doc = "proxy threads per process that move socket-transport data; connections are "
            "spread over them"},
    PARAM_END,
};

#define SOCKET_HELLO_MAGIC 0x7765667453434b31ull /* "weftSCK1" */
#define SOCKET_HELLO_TIMEOUT_NS 5000000000ull   /* a hello sits queued before the barrier */

/* What the receiver publishes: where to connect and what to prove. */
struct socket_blob {
  union weft_sockaddr addr;
  uint64_t token;
  uint64_t fifo_nbytes; /* nslots * slot_nbytes: both ends must agree */
  uint32_t nsocks;
};
static_assert(sizeof(struct socket_blob) <= sizeof(((struct conn_blob *)0)->data),
              "socket blob too large");

/* The first bytes on every socket, from the sender. */
struct socket_hello {
  uint64_t magic;
  uint64_t token;
  uint32_t index; /* which of the connection's sockets this is */
  uint32_t nsocks;
};

static void socket_close(struct weft_conn *conn);

static int socket_disabled(void) {
  return param_int(&socket_params[SOCKET_P_DISABLE]) != 0;
}

/* TCP reaches any host: host memory anywhere, a device kernel's FIFO on
 * another host (a device network connection; one host's GPUs use the
 * device transports). */
static int socket_can_connect(const struct peer_info *sender, const struct peer_info *receiver,
                              const struct transport_need *need, char *why, size_t why_nbytes) {
  if (need->mem == TRANSPORT_MEM_DEVICE && sender->host_hash == receiver->host_hash)
    return transport_refuse(why, why_nbytes, "device memory between hosts only");
  return 1;
}

/* Allocates this end's FIFO and hangs it on conn (conn->priv owns it, so
 * close() undoes a half-done set-up). */
static weftResult_t socket_conn_alloc(struct weft_conn *conn, int is_send, int nsocks,
                                      struct socket_conn **sc_out) {
  struct socket_conn *sc = calloc(1, sizeof *sc);
  if (sc == NULL) return weft_error_set(weftSystemError, "out of memory");
  sc->pc.ops = &socket_net_ops;
  sc->pc.is_send = is_send;
  sc->pc.peer_rank = conn->peer_rank;
  sc->nsocks = nsocks;
  sc->listen_fd = -1;
  sc->setup_pid = conn->peer_pid;
  for (int s = 0; s < SOCKET_MAX_SOCKS; s++) {
    sc->streams[s].fd = -1;
    sc->streams[s].readable = 1;
  }
  weftResult_t res = proxy_fifo_alloc(&sc->pc, conn->nslots, conn->slot_nbytes, conn->fifo_mem);
  if (res != weftSuccess) {
    free(sc);
    return res;
  }
  conn->priv = sc;
  conn->ctrl = sc->pc.ctrl;
  conn->slots = sc->pc.slots;
  conn->step = 0;
  *sc_out = sc;
  return weftSuccess;
}

static weftResult_t socket_fds_nonblock(struct socket_conn *sc) {
  for (int s = 0; s < sc->nsocks; s++) {
    int fd = sc->streams[s].fd;
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
      return weft_error_errno(weftSystemError, "making a socket to rank %d non-blocking",
                              sc->pc.peer_rank);
  }
  return weftSuccess;
}

/* Each rank on this host runs proxy threads besides its own: once a peer
 * shares the host, at least two ranks and their proxies compete for cores,
 * and the waits must yield at once when those outnumber the cores (a rank
 * spinning on a core its proxy needs slows both by ten times). */
static int socket_note_local_peer(const struct weft_conn *conn) {
  if (conn->peer_pid <= 0) return 0;
  int64_t nthreads = param_int(&socket_params[SOCKET_P_NTHREADS]);
  return wait_oversubscribed_hold(2 * (1 + (int)(nthreads > 0 ? nthreads : 1)), 0);
}

/* The proxy tells a peer that went away (EOF, reset) from one that is slow,
 * and only after it has delivered every slot the peer sent. Waits must not
 * also watch the peer's pid: a peer that sent its last slot and exited is
 * not an error, yet its pid is gone while the proxy still moves that slot. */
static void socket_unwatch_peer(struct weft_conn *conn) { conn->peer_pid = 0; }

/* Rewrites the last error as "what rank N: cause". */
static weftResult_t socket_error_peer(weftResult_t res, const char *what, int peer_rank) {
  char cause[512];
  snprintf(cause, sizeof cause, "%s", weft_error_text());
  return weft_error_set(res, "socket transport, %s rank %d: %s", what, peer_rank, cause);
}

static weftResult_t socket_recv_setup(struct weft_conn *conn, struct conn_blob *blob_out) {
  int64_t nsocks, nthreads;
  WEFT_TRY(param_int_checked(&socket_params[SOCKET_P_NSOCKS], &nsocks));
  /* checked here too so that every rank fails before the exchange, not half-way */
  WEFT_TRY(param_int_checked(&socket_params[SOCKET_P_NTHREADS], &nthreads));
  struct socket_conn *sc;
  WEFT_TRY(socket_conn_alloc(conn, 0, (int)nsocks, &sc));
  weftResult_t res;
  /* the interface the job's bootstrap uses (loopback for a one-host job) */
  union weft_sockaddr local, bound;
  if (conn->bs != NULL) {
    local = *bootstrap_listen_addr(conn->bs);
    if (local.sa.sa_family == AF_INET) local.in.sin_port = 0;
    else local.in6.sin6_port = 0;
  } else {
    WEFT_TRY_GOTO(sock_local_addr(&local), res, close_conn);
  }
  WEFT_TRY_GOTO(sock_listen(&local, &sc->listen_fd, &bound), res, close_conn);
  if (getrandom(&sc->token, sizeof sc->token, 0) != (ssize_t)sizeof sc->token) {
    res = weft_error_errno(weftSystemError, "getrandom");
    goto close_conn;
  }
  struct socket_blob b;
  memset(&b, 0, sizeof b);
  b.addr = bound;
  b.token = sc->token;
  b.fifo_nbytes = (uint64_t)conn->nslots * conn->slot_nbytes;
  b.nsocks = (uint32_t)nsocks;
  memcpy(blob_out->data, &b, sizeof b);
  char buf[64];
  sc->oversubscribed_hold = socket_note_local_peer(conn);
  socket_unwatch_peer(conn);
  WEFT_INFO(LOG_NET, "socket connection from rank %d: listening on %s for %d socket(s)",
            conn->peer_rank, sock_addr_str(&bound, buf, sizeof buf), (int)nsocks);
  return weftSuccess;
close_conn:
  socket_close(conn); /* the caller forgets a connection whose set-up failed */
  return res;
}

static weftResult_t socket_send_connect(struct weft_conn *conn, const struct conn_blob *blob) {
  struct socket_blob b;
  memcpy(&b, blob->data, sizeof b);
  WEFT_TRY(
      transport_check_fifo(conn->peer_rank, conn->nslots, conn->slot_nbytes, b.fifo_nbytes));
  if (b.nsocks < 1 || b.nsocks > SOCKET_MAX_SOCKS)
    return weft_error_set(weftInternalError, "rank %d asks for %u sockets", conn->peer_rank,
                          b.nsocks);
  struct socket_conn *sc;
  WEFT_TRY(socket_conn_alloc(conn, 1, (int)b.nsocks, &sc));
  weftResult_t res = weftSuccess;
  uint64_t deadline = clock_ns() + wait_default_timeout_ns();
  /* the receiver listened before it published the address: refused means
   * it is gone, and a local receiver's death is seen at once */
  struct weft_wait w;
  wait_begin(&w, wait_default_timeout_ns(), NULL, NULL, sc->setup_pid, conn->peer_rank,
             "connect a socket to");
  for (int s = 0; s < sc->nsocks; s++) {
    res = sock_connect_peer(&b.addr, deadline, &w, &sc->streams[s].fd);
    if (res != weftSuccess) {
      res = socket_error_peer(res, "connecting to", conn->peer_rank);
      goto close_conn;
    }
    struct socket_hello hello = {.magic = SOCKET_HELLO_MAGIC, .token = b.token,
                                 .index = (uint32_t)s, .nsocks = b.nsocks};
    res = sock_send_all(sc->streams[s].fd, &hello, sizeof hello, deadline);
    if (res != weftSuccess) {
      res = socket_error_peer(res, "greeting", conn->peer_rank);
      goto close_conn;
    }
  }
  WEFT_TRY_GOTO(socket_fds_nonblock(sc), res, close_conn);
  WEFT_TRY_GOTO(socket_proxy_add(sc), res, close_conn);
  socket_unwatch_peer(conn);
  char buf[64];
  WEFT_INFO(LOG_NET, "socket connection to rank %d: %d socket(s) to %s", conn->peer_rank,
            sc->nsocks, sock_addr_str(&b.addr, buf, sizeof buf));
  return weftSuccess;
close_conn:
  socket_close(conn);
  return res;
}

static size_t socket_hello_size(const uint8_t *buf, size_t got, void *arg) {
  (void)buf;
  (void)got;
  (void)arg;
  return sizeof(struct socket_hello);
}

/* Takes the next socket whose hello proves the token; strangers and silent
 * connections are dropped without holding up the sender's sockets. */
static weftResult_t socket_accept_one(struct socket_conn *sc, struct sock_hellos *hs,
                                      struct weft_wait *w, uint64_t deadline) {
  int fd;
  struct socket_hello hello;
  uint8_t buf[SOCK_HELLO_MAX_NBYTES];
  size_t got;
  weftResult_t res = sock_hellos_next(hs, sc->listen_fd, SOCKET_HELLO_TIMEOUT_NS,
                                      socket_hello_size, NULL, deadline, w, &fd, buf, &got);
  if (res == weftInProgress) return weft_error_set(weftRemoteError, "timed out");
  WEFT_TRY(res);
  memcpy(&hello, buf, sizeof hello);
  if (hello.magic != SOCKET_HELLO_MAGIC || hello.token != sc->token ||
      hello.nsocks != (uint32_t)sc->nsocks || hello.index >= (uint32_t)sc->nsocks ||
      sc->streams[hello.index].fd >= 0) {
    WEFT_INFO(LOG_NET, "socket transport: dropping a connection without rank %d's token",
              sc->pc.peer_rank);
    close(fd);
    return weftInProgress;
  }
  sc->streams[hello.index].fd = fd;
  return weftSuccess;
}

static weftResult_t socket_recv_connect(struct weft_conn *conn) {
  struct socket_conn *sc = conn->priv;
  weftResult_t res = weftSuccess;
  /* the senders connected before the barrier: their sockets are queued */
  uint64_t deadline = clock_ns() + wait_default_timeout_ns();
  struct weft_wait w;
  wait_begin(&w, wait_default_timeout_ns(), NULL, NULL, sc->setup_pid, conn->peer_rank,
             "accept a socket from");
  struct sock_hellos *hs = calloc(1, sizeof *hs);
  if (hs == NULL) {
    res = weft_error_set(weftSystemError, "out of memory");
    goto close_conn;
  }
  for (int got = 0; got < sc->nsocks;) {
    res = socket_accept_one(sc, hs, &w, deadline);
    if (res == weftSuccess) {
      got++;
    } else if (res != weftInProgress) {
      res = socket_error_peer(res, "accepting", conn->peer_rank);
      goto free_hellos;
    }
  }
  sock_hellos_close(hs);
  free(hs);
  close(sc->listen_fd);
  sc->listen_fd = -1;
  WEFT_TRY_GOTO(socket_fds_nonblock(sc), res, close_conn);
  WEFT_TRY_GOTO(socket_proxy_add(sc), res, close_conn);
  return weftSuccess;
free_hellos:
  sock_hellos_close(hs);
  free(hs);
close_conn:
  socket_close(conn);
  return res;
}

static void socket_close(struct weft_conn *conn) {
  struct socket_conn *sc = conn->priv;
  if (sc == NULL) return;
  if (sc->pc.proxy != NULL) {
    if (sc->pc.is_send) proxy_conn_drain(&sc->pc);
    socket_proxy_remove(sc);
  }
  for (int s = 0; s < SOCKET_MAX_SOCKS; s++)
    if (sc->streams[s].fd >= 0) close(sc->streams[s].fd);
  if (sc->listen_fd >= 0) close(sc->listen_fd);
  proxy_fifo_free(&sc->pc);
  if (sc->oversubscribed_hold) wait_oversubscribed_release();
  free(sc);
  conn->priv = NULL;
  conn->ctrl = NULL;
  conn->slots = NULL;
}

const struct weft_transport socket_transport = {
    .name = "socket",
    .disable_env = "WEFT_SOCKET_DISABLE",
    .disabled = socket_disabled,
    .can_connect = socket_can_connect,
    .recv_setup = socket_recv_setup,
    .send_connect = socket_send_connect,
    .recv_connect = socket_recv_connect,
    .close = socket_close,
    .kick = proxy_conn_kick,
};
