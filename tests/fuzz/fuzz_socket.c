/* Fuzz target: the bytes a socket connection's receiver reads after a peer
 * proved its token: slot frames (socket_part_hdr and the part). Each input
 * goes, behind a valid hello, to a fresh receiving end of a real socket
 * connection (4 slots of 1 KiB, one socket); this thread then drains the
 * FIFO as a rank would and checks what the proxy published: a slot's byte
 * count never exceeds the slot, and tail never passes the free slots. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "transport/base/sock.h"
#include "transport/base/status.h"
#include "transport/transport.h"
#include "transport/base/wait.h"

const char *const fuzz_target_name = "socket";

extern const struct weft_transport socket_transport;

#define NSLOTS 4
#define SLOT_NBYTES 1024
#define USED_MASK 0x07ffffffu /* proxy.h's PROXY_USED_NBYTES_MASK */

/* socket_conn.c's blob and hello (the self-check fails when they drift) */
struct fuzz_socket_blob {
  union weft_sockaddr addr;
  uint64_t token;
  uint64_t fifo_nbytes;
  uint32_t nsocks;
};
struct fuzz_socket_hello {
  uint64_t magic;
  uint64_t token;
  uint32_t index;
  uint32_t nsocks;
};
struct fuzz_part_hdr {
  uint64_t step;
  uint32_t slot_used;
  uint32_t part_nbytes;
};

/* Runs data through a fresh connection; returns slots drained, or -1 after
 * printing what went wrong. *first_out gets slot 0's first bytes. Ends when
 * the connection fails, or once all is sent and nothing moved for idle_ns. */
static int run_frames(const uint8_t *data, size_t nbytes, uint8_t *first_out, size_t first_nbytes,
                      uint64_t idle_ns) {
  struct weft_conn conn;
  memset(&conn, 0, sizeof conn);
  conn.nslots = NSLOTS;
  conn.slot_nbytes = SLOT_NBYTES;
  conn.peer_rank = 1;
  struct conn_blob blob;
  if (socket_transport.recv_setup(&conn, &blob) != weftSuccess) {
    fprintf(stderr, "fuzz socket: recv_setup: %s\n", weft_error_text());
    return -1;
  }
  struct fuzz_socket_blob b;
  memcpy(&b, blob.data, sizeof b);
  int fd = -1;
  if (sock_connect(&b.addr, clock_ns() + 5000000000ull, &fd) != weftSuccess) {
    fprintf(stderr, "fuzz socket: connect: %s\n", weft_error_text());
    socket_transport.close(&conn);
    return -1;
  }
  struct fuzz_socket_hello hello = {.magic = 0x7765667453434b31ull, .token = b.token, .index = 0,
                                    .nsocks = b.nsocks};
  send(fd, &hello, sizeof hello, MSG_NOSIGNAL);
  if (socket_transport.recv_connect(&conn) != weftSuccess) {
    fprintf(stderr, "fuzz socket: recv_connect: %s\n", weft_error_text());
    close(fd);
    return -1;
  }
  /* the proxy reads while this thread sends and drains */
  size_t sent = 0;
  int drained = 0, bad = 0;
  uint64_t idle_since = clock_ns();
  while (!bad) {
    if (sent < nbytes) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      if (poll(&p, 1, 0) == 1) {
        ssize_t n = send(fd, data + sent, nbytes - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) sent += (size_t)n, idle_since = clock_ns();
        else if (n < 0 && (p.revents & (POLLERR | POLLHUP))) sent = nbytes;
      }
      if (sent == nbytes) shutdown(fd, SHUT_WR);
    }
    struct conn_ctrl *ctrl = conn.ctrl;
    uint64_t tail = __atomic_load_n(&ctrl->tail, __ATOMIC_ACQUIRE);
    uint64_t head = __atomic_load_n(&ctrl->head, __ATOMIC_RELAXED);
    if (tail > head + NSLOTS) {
      fprintf(stderr, "fuzz socket: tail %llu passed the free slots (head %llu)\n",
              (unsigned long long)tail, (unsigned long long)head);
      bad = 1;
      break;
    }
    for (; head < tail; head++) {
      uint32_t used = ctrl->slot_used_nbytes[head % NSLOTS] & USED_MASK;
      if (used > SLOT_NBYTES) {
        fprintf(stderr, "fuzz socket: slot %llu claims %u bytes of %d\n",
                (unsigned long long)head, used, SLOT_NBYTES);
        bad = 1;
        break;
      }
      if (head == 0 && first_out != NULL)
        memcpy(first_out, conn.slots, used < first_nbytes ? used : first_nbytes);
      drained++;
      __atomic_store_n(&ctrl->head, head + 1, __ATOMIC_RELEASE);
      idle_since = clock_ns();
    }
    if (__atomic_load_n(&ctrl->poison, __ATOMIC_ACQUIRE)) break;
    if (sent == nbytes && clock_ns() - idle_since > idle_ns) break;
    usleep(200);
  }
  close(fd);
  socket_transport.close(&conn);
  return bad ? -1 : drained;
}

int fuzz_init(void) {
  setenv("WEFT_SOCKET_NSOCKS", "1", 1);
  setenv("WEFT_DEBUG", "NONE", 1);
  /* self-check: one valid frame arrives as slot 0 with its bytes */
  uint8_t frame[sizeof(struct fuzz_part_hdr) + 100], first[100];
  struct fuzz_part_hdr h = {.step = 0, .slot_used = 100, .part_nbytes = 100};
  memcpy(frame, &h, sizeof h);
  for (int i = 0; i < 100; i++) frame[sizeof h + i] = (uint8_t)(i * 7 + 1);
  memset(first, 0, sizeof first);
  int n = run_frames(frame, sizeof frame, first, sizeof first, 5000000000ull); /* a busy machine */
  if (n != 1 || memcmp(first, frame + sizeof h, sizeof first) != 0) {
    fprintf(stderr, "fuzz socket: a valid frame gave %d slot(s): the target's hello or frame "
                    "layout no longer matches the socket transport\n", n);
    return 1;
  }
  return 0;
}

int fuzz_one(const uint8_t *data, size_t nbytes) {
  return run_frames(data, nbytes, NULL, 0, 30000000ull) < 0 ? 1 : 0;
}
