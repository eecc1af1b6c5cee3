/* How the socket transport moves slots (the proxy core, ../proxy.c, runs
 * the threads): each socket carries its part of every slot, with
 * non-blocking I/O only, and the thread sleeps in ppoll() on the sockets
 * that can move. */
#include "socket_proxy.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "../base/param.h"
#include "../base/status.h"

#define SOCKET_SLEEP_MIN_NS 50000ull   /* the first sleep once idle; later ones grow ... */
#define SOCKET_SLEEP_MAX_NS 2000000ull /* ... up to this */
#define HDR_NBYTES sizeof(struct socket_part_hdr)
#define SOCKET_LOOK_MIN 8 /* idle receiving sockets from which a pass polls them at once */

static struct proxy_pool socket_pool = PROXY_POOL_INITIALIZER(&socket_net_ops);

void socket_part_range(size_t slot_nbytes, int nsocks, int part, size_t *off_out,
                       size_t *nbytes_out) {
  /* whole 64-byte lines per part; the last non-empty part takes the rest */
  size_t lines = (slot_nbytes + 63) / 64;
  size_t per = (lines + (size_t)nsocks - 1) / (size_t)nsocks * 64;
  size_t off = per * (size_t)part, end = off + per;
  if (off > slot_nbytes) off = slot_nbytes;
  if (end > slot_nbytes) end = slot_nbytes;
  *off_out = off;
  *nbytes_out = end - off;
}

/* --- one connection end ------------------------------------------------- */

/* The peer reads EOF: every socket shut down. */
static void socket_notify_fail(struct proxy_conn *pc) {
  struct socket_conn *c = (struct socket_conn *)pc;
  for (int s = 0; s < c->nsocks; s++) shutdown(c->streams[s].fd, SHUT_RDWR);
}

static void proxy_conn_fail_errno(struct socket_conn *c, const char *why, int err) {
  proxy_conn_fail(&c->pc, why, err ? strerror(err) : NULL);
}

/* Sends what socket s can of the slots before tail. Returns 1 if bytes
 * moved, 0 if none could, -1 when the connection failed. */
static int proxy_stream_send(struct socket_conn *c, int s, uint64_t tail) {
  struct socket_stream *st = &c->streams[s];
  int moved = 0;
  while (st->step < tail) {
    size_t off, nbytes;
    if (st->done == 0) {
      uint32_t used;
      if (proxy_conn_slot_used(&c->pc, st->step, &used) != 0) return -1;
      socket_part_range(used & PROXY_USED_NBYTES_MASK, c->nsocks, s, &off, &nbytes);
      st->hdr = (struct socket_part_hdr){
          .step = st->step, .slot_used = used, .part_nbytes = (uint32_t)nbytes};
    }
    socket_part_range(st->hdr.slot_used & PROXY_USED_NBYTES_MASK, c->nsocks, s, &off, &nbytes);
    struct iovec iov[2];
    int niov = 0;
    if (st->done < HDR_NBYTES)
      iov[niov++] = (struct iovec){(char *)&st->hdr + st->done, HDR_NBYTES - st->done};
    size_t body_done = st->done > HDR_NBYTES ? st->done - HDR_NBYTES : 0;
    if (body_done < nbytes)
      iov[niov++] = (struct iovec){proxy_slot(&c->pc, st->step) + off + body_done,
                                   nbytes - body_done};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = sendmsg(st->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      proxy_conn_fail_errno(c, "send failed", errno);
      return -1;
    }
    moved = 1;
    st->done += (size_t)n;
    if (st->done == HDR_NBYTES + nbytes) {
      st->step++;
      st->done = 0;
    }
  }
  return moved;
}

/* Reads into buf; returns the byte count, 0 when nothing is there yet, or -1
 * after failing the connection (closed_why: what an EOF here means). */
static ssize_t proxy_stream_read(struct socket_conn *c, struct socket_stream *st, void *buf,
                                 size_t nbytes, const char *closed_why) {
  for (;;) {
    ssize_t n = recv(st->fd, buf, nbytes, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
      if (closed_why != NULL) {
        proxy_conn_fail(&c->pc, closed_why, NULL);
        return -1;
      }
      st->eof = 1;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      st->readable = 0; /* until the pass's look says otherwise */
      return 0;
    }
    proxy_conn_fail_errno(c, "receive failed", errno);
    return -1;
  }
}

/* Receives on socket s into the free slots of the local FIFO. Returns 1 if
 * bytes moved, 0 if none could, -1 when the connection failed. */
static int proxy_stream_recv(struct socket_conn *c, int s) {
  struct socket_stream *st = &c->streams[s];
  int moved = 0;
  while (st->readable && !st->eof && st->step - proxy_conn_head(&c->pc) < c->pc.nslots) {
    size_t off, nbytes;
    if (st->done < HDR_NBYTES) {
      /* an EOF between slots is the peer closing; wait for the other sockets */
      ssize_t n = proxy_stream_read(c, st, (char *)&st->hdr + st->done, HDR_NBYTES - st->done,
                                    st->done == 0 ? NULL : "closed in the middle of a slot");
      if (n <= 0) return n < 0 ? -1 : moved;
      moved = 1;
      st->done += (size_t)n;
      if (st->done < HDR_NBYTES) continue;
      size_t used_nbytes = st->hdr.slot_used & PROXY_USED_NBYTES_MASK;
      socket_part_range(used_nbytes, c->nsocks, s, &off, &nbytes);
      if (st->hdr.step != st->step || used_nbytes > c->pc.slot_nbytes ||
          st->hdr.part_nbytes != nbytes) {
        proxy_conn_fail(&c->pc, "malformed data (not a weft peer?)", NULL);
        return -1;
      }
      proxy_conn_slot_set_used(&c->pc, st->step, st->hdr.slot_used);
    }
    socket_part_range(st->hdr.slot_used & PROXY_USED_NBYTES_MASK, c->nsocks, s, &off, &nbytes);
    size_t body_done = st->done - HDR_NBYTES;
    if (body_done < nbytes) {
      ssize_t n = proxy_stream_read(c, st, proxy_slot(&c->pc, st->step) + off + body_done,
                                    nbytes - body_done, "closed in the middle of a slot");
      if (n <= 0) return n < 0 ? -1 : moved;
      moved = 1;
      st->done += (size_t)n;
      if (st->done - HDR_NBYTES < nbytes) continue;
    }
    st->step++;
    st->done = 0;
  }
  return moved;
}

/* Moves what the sockets take now, in either direction. Returns whether
 * anything happened. */
static int socket_progress(struct proxy_conn *pc) {
  struct socket_conn *c = (struct socket_conn *)pc;
  int moved = 0, neof = 0;
  uint64_t low = UINT64_MAX;
  int is_send = c->pc.is_send;
  uint64_t tail = is_send ? proxy_conn_tail(&c->pc) : 0;
  for (int s = 0; s < c->nsocks; s++) {
    int r = is_send ? proxy_stream_send(c, s, tail) : proxy_stream_recv(c, s);
    if (r < 0) return 1;
    moved |= r;
    neof += c->streams[s].eof;
    if (c->streams[s].step < low) low = c->streams[s].step;
  }
  /* a slot is done once every socket is past it: the sender gets the credit
   * back, the receiver's rank may read it */
  if (is_send) {
    proxy_conn_publish_sent(&c->pc, low);
    proxy_conn_publish_head(&c->pc, low);
  } else {
    proxy_conn_publish_tail(&c->pc, low);
  }
  /* the peer closed every socket between slots: once the rank has read all
   * that came (so no wait of its own can race the poison), it is news */
  if (neof == c->nsocks && proxy_conn_head(&c->pc) == low) {
    proxy_conn_fail(&c->pc, "the peer closed the connection", NULL);
    return 1;
  }
  return moved;
}

/* The sender's sockets carry nothing back: readable means closed or reset. */
static void proxy_send_check_peer(struct socket_conn *c, int fd) {
  char byte;
  ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
  if (n == 0) proxy_conn_fail(&c->pc, "the peer closed the connection", NULL);
  else if (n > 0) proxy_conn_fail(&c->pc, "unexpected data from the receiver", NULL);
  else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    proxy_conn_fail_errno(c, "connection error", errno);
}

/* The descriptors the thread sleeps on: the sender's sockets for room
 * (while slots wait) and for the peer closing, the receiver's for data
 * (while the FIFO has room). */
static void socket_poll_fill(struct proxy_conn *pc, struct pollfd *pfds) {
  struct socket_conn *c = (struct socket_conn *)pc;
  uint64_t tail = proxy_conn_tail(pc);
  uint64_t head = proxy_conn_head(pc);
  for (int s = 0; s < c->nsocks; s++) {
    struct socket_stream *st = &c->streams[s];
    short events = pc->is_send ? (short)(POLLIN | (st->step < tail ? POLLOUT : 0))
                               : (short)(st->step - head < pc->nslots ? POLLIN : 0);
    pfds[s] = (struct pollfd){.fd = st->eof ? -1 : st->fd, .events = events};
  }
}

static void socket_poll_event(struct proxy_conn *pc, int index, const struct pollfd *pfd) {
  struct socket_conn *c = (struct socket_conn *)pc;
  short re = pfd->revents;
  (void)index;
  if (pc->is_send && (re & (POLLIN | POLLHUP | POLLERR))) {
    proxy_send_check_peer(c, pfd->fd);
  } else if (!pc->is_send && (re & (POLLHUP | POLLERR)) && !(re & POLLIN)) {
    /* reset while the FIFO is full: nothing more will arrive */
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(pfd->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    proxy_conn_fail_errno(c, "connection reset", err);
  }
}

/* Each thread's look at its receiving sockets (socket_pass). */
struct socket_look {
  struct pollfd *pfds;
  struct socket_stream **streams;
  int cap;
};
static struct socket_look socket_looks[SOCKET_MAX_THREADS];

/* Before the connections' turns: one poll without waiting over the
 * receiving sockets that a recv found empty and whose FIFO has room, so
 * that a pass costs one call for all the idle ones (a device ring keeps
 * tens of connections, each of WEFT_SOCKET_NSOCKS sockets) rather than a
 * recv each; below SOCKET_LOOK_MIN of them, each gets its recv. Moves
 * nothing itself. */
static int socket_pass(struct proxy *p) {
  if (p->index < 0 || p->index >= SOCKET_MAX_THREADS) return 0;
  struct socket_look *look = &socket_looks[p->index];
  int n = 0;
  for (struct proxy_conn *pc = p->conns; pc != NULL; pc = pc->next) {
    if (pc->is_send || pc->failed) continue;
    struct socket_conn *c = (struct socket_conn *)pc;
    uint64_t head = proxy_conn_head(pc);
    for (int s = 0; s < c->nsocks; s++) {
      struct socket_stream *st = &c->streams[s];
      if (st->readable || st->eof || st->step - head >= pc->nslots) continue;
      if (n == look->cap) {
        int cap = look->cap ? 2 * look->cap : 64;
        struct pollfd *pfds = realloc(look->pfds, sizeof *pfds * (size_t)cap);
        if (pfds != NULL) look->pfds = pfds;
        struct socket_stream **sts = realloc(look->streams, sizeof *sts * (size_t)cap);
        if (sts != NULL) look->streams = sts;
        if (pfds == NULL || sts == NULL) { /* no room to look: try every socket */
          st->readable = 1;
          continue;
        }
        look->cap = cap;
      }
      look->pfds[n] = (struct pollfd){.fd = st->fd, .events = POLLIN};
      look->streams[n++] = st;
    }
  }
  if (n < SOCKET_LOOK_MIN) { /* a recv each costs no more than the look */
    for (int i = 0; i < n; i++) look->streams[i]->readable = 1;
    return 0;
  }
  int ready = poll(look->pfds, (nfds_t)n, 0);
  if (ready < 0) { /* no look (memory, descriptor limit): a recv each, as below the bound */
    for (int i = 0; i < n; i++) look->streams[i]->readable = 1;
    return 0;
  }
  if (ready == 0) return 0;
  for (int i = 0; i < n; i++)
    if (look->pfds[i].revents != 0) look->streams[i]->readable = 1; /* data, EOF or error */
  return 0;
}

const struct proxy_net_ops socket_net_ops = {
    .name = "socket",
    .sleep_min_ns = SOCKET_SLEEP_MIN_NS,
    .sleep_max_ns = SOCKET_SLEEP_MAX_NS,
    .linger = 0,
    .unpin = 1,
    .progress = socket_progress,
    .notify_fail = socket_notify_fail,
    .pass = socket_pass,
    .poll_fill = socket_poll_fill,
    .poll_event = socket_poll_event,
};

weftResult_t socket_proxy_add(struct socket_conn *conn) {
  int64_t nthreads;
  WEFT_TRY(param_int_checked(&socket_params[SOCKET_P_NTHREADS], &nthreads));
  conn->pc.npoll = conn->nsocks;
  return proxy_pool_add(&socket_pool, &conn->pc, (int)nthreads);
}

void socket_proxy_remove(struct socket_conn *conn) { proxy_pool_remove(&socket_pool, &conn->pc); }
