/* The socket transport's progress threads. Each end of a socket connection
 * keeps its FIFO in private memory; a proxy thread moves filled slots from the
 * sender's FIFO over TCP into the receiver's FIFO, so the algorithms see the
 * same connection as with shm.
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
#include "../param.h"
#include "../transport.h"

#define SOCKET_MAX_SOCKS 8
#define SOCKET_MAX_THREADS 16

/* socket_params[] (param.h), defined in socket_conn.c */
enum { SOCKET_P_DISABLE, SOCKET_P_NSOCKS, SOCKET_P_NTHREADS };

/* A slot holds at most 64 MiB (2^26 bytes), so the low 27 bits of
 * slot_used_nbytes are its byte count; the bits above are flags of the
 * algorithms (p2p marks a message's last slot), carried unchanged. */
#define SOCKET_USED_NBYTES_MASK 0x07ffffffu

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
  struct socket_part_hdr hdr;
};

struct socket_proxy;

/* One end of a socket connection. Set up by socket_conn.c; while registered,
 * only its proxy thread touches the streams. */
struct socket_conn {
  int is_send;
  int peer_rank;
  struct conn_ctrl *ctrl; /* the local FIFO: ctrl page, then the slots */
  char *slots;
  uint32_t nslots;
  size_t slot_nbytes;
  void *fifo;
  size_t fifo_nbytes;
  int listen_fd; /* receiver, until recv_connect: -1 after */
  pid_t setup_pid; /* the peer's pid where it shares the host: watched during set-up */
  uint64_t token;
  int nsocks;
  struct socket_stream streams[SOCKET_MAX_SOCKS];
  int oversubscribed_hold; /* taken for a peer on this host (wait_oversubscribed_hold) */
  /* owned by the proxy */
  struct socket_proxy *proxy; /* set while registered */
  struct socket_conn *next;   /* in the proxy's lists */
  int failed;                 /* sockets shut down, poison set */
  /* the registration handshake, under the proxy's mutex */
  int remove_requested;
  int removed;
};

/* The byte range [*off_out, *off_out + *nbytes_out) of part `part` of a slot
 * holding slot_nbytes bytes. */
void socket_part_range(size_t slot_nbytes, int nsocks, int part, size_t *off_out,
                       size_t *nbytes_out);

/* Hands conn to a proxy thread (started if none runs). The sockets must be
 * connected and non-blocking. Does not block. */
weftResult_t socket_proxy_add(struct socket_conn *conn);

/* Takes conn back: on return no proxy thread touches it. The proxy thread
 * stops when its last connection is removed. Blocks until the proxy has let
 * go (one turn of its loop, woken at once). */
void socket_proxy_remove(struct socket_conn *conn);

#endif
