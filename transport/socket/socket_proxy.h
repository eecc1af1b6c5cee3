/* How the socket transport moves slots. Each end of a socket connection
 * keeps its FIFO in private memory; a proxy thread of the proxy core
 * (../proxy.h) moves filled slots from the sender's FIFO over TCP into the
 * receiver's FIFO, so the algorithms see the same connection as with shm.
 *
 * On the wire, every slot is cut into nsocks contiguous parts, one per
 * socket, and each part goes out behind a socket_part_hdr. Each socket
 * advances on its own; a slot is done when all its parts are. */
#ifndef WEFT_SOCKET_PROXY_H
#define WEFT_SOCKET_PROXY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../include/weft.h"
#include "../base/param.h"
#include "../proxy.h"
#include "../transport.h"

#define SOCKET_MAX_SOCKS 8
#define SOCKET_MAX_THREADS PROXY_MAX_THREADS

/* The socket transport's settings (socket_conn.c). */
extern struct weft_param socket_params[];
enum { SOCKET_P_DISABLE, SOCKET_P_NSOCKS, SOCKET_P_NTHREADS };

struct socket_part_hdr {
  uint64_t step;        /* the slot number this part belongs to */
  uint32_t slot_used;   /* the sender's slot_used_nbytes word for the slot */
  uint32_t part_nbytes; /* bytes of this part that follow the header */
};

/* One socket's position in the stream of slots. */
struct socket_stream {
  int fd;
  uint64_t step;    /* the slot this socket sends or receives now */
  size_t done;      /* bytes of header + part moved for that slot */
  int eof;          /* receiver: the peer closed this socket between slots */
  int readable;     /* receiver: worth a recv (its last one found bytes, or the
                       pass's look said so): an idle socket costs no call */
  struct socket_part_hdr hdr;
};

/* One end of a socket connection. Set up by socket_conn.c; while registered,
 * only its proxy thread touches the streams. */
struct socket_conn {
  struct proxy_conn pc; /* the FIFO, poison, registration (proxy.h) */
  int listen_fd; /* receiver, until recv_connect: -1 after */
  pid_t setup_pid; /* the peer's pid where it shares the host: watched during set-up */
  uint64_t token;
  int nsocks;
  struct socket_stream streams[SOCKET_MAX_SOCKS];
  int oversubscribed_hold; /* taken for a peer on this host (wait_oversubscribed_hold) */
};

/* The byte range [*off_out, *off_out + *nbytes_out) of part `part` of a slot
 * holding slot_nbytes bytes. */
void socket_part_range(size_t slot_nbytes, int nsocks, int part, size_t *off_out,
                       size_t *nbytes_out);

/* How a socket connection's slots move (the proxy core's ops table). */
extern const struct proxy_net_ops socket_net_ops;

/* Hands conn to a proxy thread (started if none runs). The sockets must be
 * connected and non-blocking. Does not block. */
weftResult_t socket_proxy_add(struct socket_conn *conn);

/* Takes conn back: on return no proxy thread touches it. The proxy thread
 * stops when its last connection is removed. Blocks for one pass of the
 * proxy at most. */
void socket_proxy_remove(struct socket_conn *conn);

#endif
