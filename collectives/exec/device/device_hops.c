/* One device connection (a ring hop or a point-to-point lane) from its
 * transport's choice to the kernels' view of its FIFO. The choice is
 * transport_select's, for device memory (tested on the host); here it meets
 * CUDA: peer access between the GPUs, the FIFO memory of network and
 * pinned-FIFO connections. CUDA builds only. */
#include <stdio.h>
#include <string.h>

#include "../../../transport/net_dev.h"
#include "../../../transport/base/param.h"
#include "../../../transport/topology/topo.h"
#include "../../algo/ring_steps.h"
#include "device_priv.h"

/* Whether the GPU of sender (a peer of comm) can reach this rank's GPU
 * memory. Unknown (its GPU is not visible here): assumed, as before. */
static int hop_peer_access(const struct weftComm *comm, int dev, const struct peer_info *sender) {
  int local = -1;
  if (sender->pid == comm->peers[comm->rank].pid) {
    local = sender->cuda_dev;
  } else if (sender->bus_id >= 0) {
    char bus[32];
    topo_bus_text(sender->bus_id, bus, sizeof bus);
    if (cudaDeviceGetByPCIBusId(&local, bus) != cudaSuccess) local = -1;
    cudaGetLastError();
  }
  if (local < 0 || local == dev) return 1;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, local, dev) != cudaSuccess) can = 0;
  cudaGetLastError();
  return can;
}

static weftResult_t hop_choose(struct weftComm *comm, int dev, int from, struct conn_blob *b) {
  const struct peer_info *s = &comm->peers[from], *r = &comm->peers[comm->rank];
  const struct transport_need need = {
      .mem = TRANSPORT_MEM_DEVICE,
      .peer_access = s->host_hash == r->host_hash ? hop_peer_access(comm, dev, s) : 0};
  char why[768];
  int t = transport_select(s, r, &need, why, sizeof why);
  if (t < 0) return weft_error_set(weftSystemError, "%s", why);
  b->transport = t;
  return weftSuccess;
}

/* The transport a blob names, or NULL. */
static const struct weft_transport *hop_transport(int32_t t) {
  int n = 0;
  while (weft_transports[n] != NULL) n++;
  return t >= 0 && t < n ? weft_transports[t] : NULL;
}

/* Network and pinned-FIFO connections keep their FIFO in memory the device
 * maps (fifo_mem); the others in device memory. */
static weftResult_t hop_shape(struct weftComm *comm, struct weft_conn *c, int peer, int proto,
                              const struct weft_transport *t) {
  device_conn_shape(c, comm, peer, proto);
  c->bs = comm->bs;
  if (t->caps & TRANSPORT_CAP_PINNED_FIFO) c->fifo_mem = &net_dev_mem_cuda;
  if (!(t->caps & TRANSPORT_CAP_DEVICE_MEMORY)) WEFT_TRY(net_dev_fifo_mem(0, &c->fifo_mem));
  return weftSuccess;
}

weftResult_t device_hop_recv_setup(struct weftComm *comm, int dev, struct weft_conn *c,
                                   int from, int proto, struct conn_blob *b) {
  memset(b, 0, sizeof *b);
  b->transport = -1;
  WEFT_TRY(hop_choose(comm, dev, from, b));
  const struct weft_transport *tr = hop_transport(b->transport);
  WEFT_TRY(hop_shape(comm, c, from, proto, tr));
  WEFT_TRY(tr->recv_setup(c, b));
  c->transport = tr;
  return weftSuccess;
}

weftResult_t device_hop_send_connect(struct weftComm *comm, struct weft_conn *c, int to,
                                     int proto, const struct conn_blob *b) {
  const struct weft_transport *tr = hop_transport(b->transport);
  if (tr == NULL)
    return weft_error_set(weftRemoteError,
                          "rank %d could not set up its device connection from rank %d", to,
                          comm->rank);
  WEFT_TRY(hop_shape(comm, c, to, proto, tr));
  WEFT_TRY(tr->send_connect(c, b));
  c->transport = tr;
  return weftSuccess;
}

weftResult_t device_hop_recv_connect(struct weft_conn *c) {
  return c->transport != NULL ? c->transport->recv_connect(c) : weftSuccess;
}

weftResult_t device_hop_fifo(const struct weft_conn *c, struct dev_fifo *fifo_out) {
  if (c->transport == NULL || c->slots == NULL)
    return weft_error_set(weftInternalError, "rank %d: a device connection that is not set up",
                          c->peer_rank);
  if (c->transport->caps & TRANSPORT_CAP_DEVICE_MEMORY) {
    *fifo_out = device_fifo_of(c);
    return weftSuccess;
  }
  struct net_dev_fifo nf;
  WEFT_TRY(net_dev_conn_fifo(c, &nf));
  struct dev_fifo f;
  memset(&f, 0, sizeof f);
  f.ctrl = nf.ctrl;
  f.used_nbytes = nf.used_nbytes;
  f.slots = nf.slots;
  f.nslots = nf.nslots;
  f.slot_nbytes = (uint32_t)nf.slot_nbytes;
  *fifo_out = f;
  return weftSuccess;
}

void device_net_kick(const struct weftComm *comm, const struct device_comm *d) {
  if (d->ring_ready)
    for (int c = 0; c < d->nchannels; c++)
      for (int p = 0; p < DEV_NPROTOS; p++) {
        net_dev_conn_kick(&d->send[c][p]);
        net_dev_conn_kick(&d->recv[c][p]);
      }
  if (d->sendrecv.send != NULL)
    for (int r = 0; r < comm->nranks; r++)
      for (int l = 0; l < d->sendrecv.nlanes; l++) {
        net_dev_conn_kick(&d->sendrecv.send[r][l]);
        net_dev_conn_kick(&d->sendrecv.recv[r][l]);
      }
}

void device_net_expect_ring(const struct weftComm *comm, const struct device_comm *d,
                            const struct weft_plan *plan, int nch) {
  const struct weft_channel *ch = &comm->channels[0]; /* every device channel's ring */
  const size_t esize = weftTypeSize(plan->datatype);
  int root_pos = -1;
  if (plan->coll == COLL_BROADCAST || plan->coll == COLL_REDUCE)
    for (int i = 0; i < comm->nranks; i++)
      if (ch->ring[i] == plan->root) root_pos = i;
  for (int c = 0; c < nch; c++) {
    const struct weft_conn *send = &d->send[c][DEV_PROTO_SIMPLE];
    const struct weft_conn *recv = &d->recv[c][DEV_PROTO_SIMPLE];
    struct dev_fifo f; /* the kernel's slot size is its send FIFO's */
    if ((send->transport == NULL || send->transport->kick == NULL) &&
        (recv->transport == NULL || recv->transport->kick == NULL))
      continue; /* neither hop is a network one */
    if (device_hop_fifo(send, &f) != weftSuccess) continue;
    size_t offset, count;
    ring_channel_share(plan->count, nch, esize, c, &offset, &count);
    if (count == 0) continue; /* the channel's block returns at once */
    struct ring_geom g; /* as the kernel sets it up */
    ring_geom_init(&g, (int)plan->coll, comm->nranks, ch->ring_pos, root_pos, plan->count, offset,
                   count, DEV_SLOT_ROOM(DEV_PROTO_SIMPLE, (size_t)f.slot_nbytes) / esize, esize);
    size_t nsends, nrecvs;
    ring_channel_nslots(&g, ch->ring, &nsends, &nrecvs);
    size_t agree_sends, agree_recvs; /* a chain's agreement (broadcast, reduce) */
    ring_chain_agree_nslots((int)plan->coll, comm->nranks, root_pos, ch->ring_pos, &agree_sends,
                            &agree_recvs);
    nsends += agree_sends;
    nrecvs += agree_recvs;
    net_dev_conn_expect(send, nsends); /* each leaves a hop that is not a network one alone */
    net_dev_conn_expect(recv, nrecvs);
  }
}

int device_comm_crosses_hosts(const struct weftComm *comm) {
  for (int i = 1; i < comm->nranks; i++)
    if (comm->peers[i].host_hash != comm->peers[0].host_hash) return 1;
  return 0;
}
