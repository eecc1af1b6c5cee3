/* Point-to-point on device memory: the host side of the send/recv kernel
 * (kernels_sendrecv.cu). Lanes (WEFT_P2P_LANES FIFOs per peer and direction, SIMPLE
 * slots) are connected per peer on first use, with that peer only, over the
 * device transports (p2p, cuda_ipc, host_fifo; a peer on another host over
 * the network: device_hops.c); a group's sends and receives on a comm
 * then run as one kernel on its stream, scheduled by collectives/algo/sendrecv_steps.h. */
#include <stdlib.h>
#include <string.h>

#include "../../../transport/bootstrap/bootstrap.h"
#include "../../../transport/cuda_ipc/cuda_fifo.h"
#include "../../../transport/base/param.h"
#include "../../../transport/net_dev.h"
#include "device_params.h"
#include "device_priv.h"

enum { TAG_DEV_INFO = 0x70320101u, TAG_DEV_BLOB = 0x70320102u, TAG_DEV_ACK = 0x70320103u };

/* the kernel's host stub (kernels_sendrecv.cu, extern "C") */
void weft_sendrecv_kernel(struct dev_sendrecv_work w);

void device_sendrecv_load(void) { device_kernel_load((const void *)weft_sendrecv_kernel); }

void device_sendrecv_free(struct device_sendrecv *p, int nranks) {
  for (int r = 0; p->send != NULL && p->recv != NULL && r < nranks; r++)
    for (int l = 0; l < SENDRECV_MAX_LANES; l++) {
      if (p->send[r][l].transport) p->send[r][l].transport->close(&p->send[r][l]);
      if (p->recv[r][l].transport) p->recv[r][l].transport->close(&p->recv[r][l]);
    }
  free(p->send);
  free(p->recv);
  free(p->known);
  cudaFree(p->lanes_d);
  cudaGetLastError();
  memset(p, 0, sizeof *p);
}

static weftResult_t sendrecv_alloc(struct weftComm *comm, struct device_sendrecv *p) {
  if (p->send != NULL) return weftSuccess;
  const int64_t nlanes = param_int(&device_params[DEVICE_P_SENDRECV_LANES]);
  if (nlanes < 1 || nlanes > SENDRECV_MAX_LANES)
    return weft_error_set(weftInvalidArgument, "WEFT_P2P_LANES=%lld: must be 1 to %d",
                          (long long)nlanes, SENDRECV_MAX_LANES);
  const size_t n = (size_t)comm->nranks;
  p->send = calloc(n, sizeof *p->send);
  p->recv = calloc(n, sizeof *p->recv);
  p->known = calloc(n, 1);
  weftResult_t res = p->send == NULL || p->recv == NULL || p->known == NULL
                         ? weft_error_set(weftSystemError, "out of memory")
                         : weftSuccess;
  if (res == weftSuccess)
    res = device_cuda_check(cudaMalloc((void **)&p->lanes_d, n * sizeof *p->lanes_d),
                            "send/recv lanes");
  if (res == weftSuccess)
    res = cuda_fifo_copy(p->lanes_d, NULL, n * sizeof *p->lanes_d, "send/recv lanes");
  /* every rank's blocks must run at once: share the SMs among ranks that may
   * share this GPU (all of them, at worst) */
  int sms = 1;
  if (res == weftSuccess)
    res = device_cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                                   comm->cuda_dev), "SMs");
  if (res != weftSuccess) { /* nothing half made stays: the next call starts afresh */
    device_sendrecv_free(p, comm->nranks);
    return res;
  }
  p->nlanes = (int)nlanes;
  int cap = sms / comm->nranks > 0 ? sms / comm->nranks : 1;
  p->max_blocks = device_nchannels(DEV_MAX_CHANNELS, WEFT_CONFIG_UNDEF_INT, comm->cfg_max_channels,
                                   cap);
  return weftSuccess;
}

/* Peers learn each other's GPU (the transports choose by it) and check
 * that they cut messages into as many lanes (WEFT_P2P_LANES): a pair that
 * did not would wait on lanes the other never fills. */
static weftResult_t sendrecv_exchange_info(struct weftComm *comm, struct device_sendrecv *p,
                                           const char *want) {
  /* its device, lanes and GPU's PCI address (whether two processes' GPUs
   * reach each other: device_hops.c) */
  int64_t mine[3] = {comm->cuda_dev, p->nlanes, device_bus_id(comm->cuda_dev)};
  comm->peers[comm->rank].cuda_dev = (int)mine[0]; /* the hop's receiver or sender: this rank */
  for (int r = 0; r < comm->nranks; r++)
    if (want[r] && !p->known[r])
      WEFT_TRY(bootstrap_send(comm->bs, r, TAG_DEV_INFO, mine, sizeof mine));
  weftResult_t res = weftSuccess;
  for (int r = 0; r < comm->nranks; r++) {
    if (!want[r] || p->known[r]) continue;
    int64_t theirs[3];
    WEFT_TRY(bootstrap_recv(comm->bs, r, TAG_DEV_INFO, theirs, sizeof theirs));
    comm->peers[r].cuda_dev = (int)theirs[0];
    if (theirs[2] >= 0) comm->peers[r].bus_id = theirs[2]; /* CUDA's, over a guess */
    if (theirs[1] != p->nlanes && res == weftSuccess)
      res = weft_error_set(weftInvalidUsage,
                           "WEFT_P2P_LANES differs between ranks: rank %d has %d, rank %d has "
                           "%d (set it alike on every rank)", r, (int)theirs[1], comm->rank,
                           p->nlanes);
    else p->known[r] = 1;
  }
  return res;
}

/* Copies the newly connected direction of peer's lanes (steps 0) to the
 * kernels' table; the other direction's steps, which kernels may have
 * advanced, are left alone. */
static weftResult_t lanes_publish(struct device_sendrecv *p, int peer, int send) {
  struct dev_fifo x[SENDRECV_MAX_LANES];
  memset(x, 0, sizeof x);
  for (int l = 0; l < p->nlanes; l++)
    WEFT_TRY(device_hop_fifo(send ? &p->send[peer][l] : &p->recv[peer][l], &x[l]));
  void *at = send ? (void *)p->lanes_d[peer].send : (void *)p->lanes_d[peer].recv;
  return cuda_fifo_copy(at, x, sizeof x, "send/recv lanes");
}

/* Closes peer's lanes in one direction after their connection failed
 * (lane 0 up, lane 1 not; the peer refused or gone): the next group
 * connects them afresh instead of taking them for connected while the
 * kernels' table has none of them. */
static void lanes_close(struct device_sendrecv *p, int peer, int send) {
  for (int l = 0; l < SENDRECV_MAX_LANES; l++) {
    struct weft_conn *c = send ? &p->send[peer][l] : &p->recv[peer][l];
    if (c->transport != NULL) c->transport->close(c);
    memset(c, 0, sizeof *c);
  }
}

/* Receiver: sets up the lanes from each peer of want_recv and sends it the
 * blobs; once a set-up failed, the later peers get a refusal, so no sender
 * waits for blobs that never come. Returns the first failure. */
static weftResult_t lanes_offer(struct weftComm *comm, struct device_sendrecv *p,
                                const char *want_recv) {
  weftResult_t first = weftSuccess;
  for (int r = 0; r < comm->nranks; r++) {
    if (!want_recv[r]) continue;
    struct conn_blob b[SENDRECV_MAX_LANES];
    memset(b, 0, sizeof b);
    weftResult_t res = first;
    for (int l = 0; l < p->nlanes && res == weftSuccess; l++)
      res = device_hop_recv_setup(comm, comm->cuda_dev, &p->recv[r][l], r, DEV_PROTO_SIMPLE,
                                  &b[l]);
    if (res != weftSuccess) b[0].transport = -2; /* tell the peer */
    weftResult_t sent = bootstrap_send(comm->bs, r, TAG_DEV_BLOB, b, sizeof b);
    if (first == weftSuccess) first = res != weftSuccess ? res : sent;
  }
  return first;
}

/* Sender: attaches to the lanes each peer of want_send offers, publishes
 * them, and answers 1, or closes what it made and answers 0, so that the
 * receiver knows at once. Returns the first failure. */
static weftResult_t lanes_attach(struct weftComm *comm, struct device_sendrecv *p,
                                 const char *want_send) {
  weftResult_t first = weftSuccess;
  for (int r = 0; r < comm->nranks; r++) {
    if (!want_send[r]) continue;
    struct conn_blob b[SENDRECV_MAX_LANES];
    weftResult_t res = bootstrap_recv(comm->bs, r, TAG_DEV_BLOB, b, sizeof b);
    if (res == weftSuccess && b[0].transport < 0)
      res = weft_error_set(weftRemoteError,
                           "rank %d could not set up its device lanes from rank %d", r,
                           comm->rank);
    for (int l = 0; l < p->nlanes && res == weftSuccess; l++)
      res = device_hop_send_connect(comm, &p->send[r][l], r, DEV_PROTO_SIMPLE, &b[l]);
    if (res == weftSuccess) res = lanes_publish(p, r, 1);
    if (res != weftSuccess) lanes_close(p, r, 1);
    uint32_t ack = res == weftSuccess;
    weftResult_t sent = bootstrap_send(comm->bs, r, TAG_DEV_ACK, &ack, sizeof ack);
    if (first == weftSuccess) first = res != weftSuccess ? res : sent;
  }
  return first;
}

/* Receiver: each peer's answer; lanes the peer attached to are completed
 * and published, the others closed (the next group offers them again).
 * Returns the first failure. */
static weftResult_t lanes_complete(struct weftComm *comm, struct device_sendrecv *p,
                                   const char *want_recv) {
  weftResult_t first = weftSuccess;
  for (int r = 0; r < comm->nranks; r++) {
    if (!want_recv[r]) continue;
    uint32_t ack = 0;
    weftResult_t res = bootstrap_recv(comm->bs, r, TAG_DEV_ACK, &ack, sizeof ack);
    const int offered = p->recv[r][p->nlanes - 1].transport != NULL;
    if (res == weftSuccess && offered && ack != 1)
      res = weft_error_set(weftRemoteError,
                           "rank %d could not attach to its device lanes to rank %d", r,
                           comm->rank);
    for (int l = 0; l < p->nlanes && res == weftSuccess && offered; l++)
      res = device_hop_recv_connect(&p->recv[r][l]);
    if (res == weftSuccess && offered) res = lanes_publish(p, r, 0);
    if (res != weftSuccess || !offered) lanes_close(p, r, 0);
    if (first == weftSuccess) first = res;
  }
  return first;
}

/* Per pair: the receiver sets up its lanes and sends the blobs; the sender
 * attaches and answers. Messages never wait for the peer, so any order
 * works; a failure on one pair is answered on every pair of the call, so no
 * peer is left waiting for the timeout. */
static weftResult_t sendrecv_connect_lanes(struct weftComm *comm, struct device_sendrecv *p,
                                           const char *want_send, const char *want_recv) {
  weftResult_t offered = lanes_offer(comm, p, want_recv);
  weftResult_t attached = lanes_attach(comm, p, want_send);
  weftResult_t completed = lanes_complete(comm, p, want_recv);
  if (offered != weftSuccess) return offered;
  return attached != weftSuccess ? attached : completed;
}

weftResult_t device_sendrecv_connect(struct weftComm *comm, struct device_comm *d,
                                     const struct weft_plan *const *plans, size_t nops) {
  const int n = comm->nranks;
  struct device_sendrecv *p = &d->sendrecv;
  WEFT_TRY(sendrecv_alloc(comm, p));
  char *want = calloc((size_t)n * 3, 1);
  if (want == NULL) return weft_error_set(weftSystemError, "out of memory");
  char *want_send = want + n, *want_recv = want + 2 * n;
  for (size_t i = 0; i < nops; i++) {
    int peer = plans[i]->root;
    if (!plan_is_sendrecv(plans[i]) || peer == comm->rank) continue;
    if (plans[i]->coll == COLL_SEND) want_send[peer] = p->send[peer][0].transport == NULL;
    else want_recv[peer] = p->recv[peer][0].transport == NULL;
  }
  for (int r = 0; r < n; r++) want[r] = want_send[r] | want_recv[r];
  weftResult_t res = sendrecv_exchange_info(comm, p, want);
  if (res == weftSuccess) res = sendrecv_connect_lanes(comm, p, want_send, want_recv);
  free(want);
  return res;
}

/* The launch's ops from plans; copies to self are enqueued here. */
static weftResult_t sendrecv_work_fill(struct weftComm *comm,
                                       const struct weft_plan *const *plans, size_t nops,
                                       struct dev_sendrecv_work *w, cudaStream_t stream) {
  w->nops = 0;
  for (size_t i = 0; i < nops; i++) {
    const struct weft_plan *pl = plans[i];
    if (!plan_is_sendrecv(pl)) continue;
    if (w->nops == SENDRECV_MAX_OPS)
      return weft_error_set(weftInvalidUsage,
                            "a group has more than %d sends and receives on device memory for "
                            "one communicator (rank %d)", SENDRECV_MAX_OPS, comm->rank);
    struct sendrecv_op *o = &w->ops[w->nops];
    o->nbytes = pl->count * weftTypeSize(pl->datatype);
    o->peer = pl->root;
    o->send = pl->coll == COLL_SEND;
    o->self = pl->root == comm->rank;
    w->bufs[w->nops++] = o->send ? (void *)pl->sendbuf : pl->recvbuf;
  }
  int self_sends = 0, self_recvs = 0;
  for (int i = 0; i < w->nops; i++)
    if (w->ops[i].self) *(w->ops[i].send ? &self_sends : &self_recvs) += 1;
  if (self_sends != self_recvs)
    return weft_error_set(weftInvalidUsage,
                          "rank %d posts %d sends to itself and %d receives from itself in one "
                          "group: they must pair up", comm->rank, self_sends, self_recvs);
  for (int i = 0; i < w->nops; i++) {
    if (!w->ops[i].self || !w->ops[i].send) continue;
    int j = sendrecv_self_match(w->ops, w->nops, i);
    if (j < 0 || w->ops[j].nbytes != w->ops[i].nbytes)
      return weft_error_set(weftInvalidUsage,
                            "rank %d sends %llu bytes to itself without a receive of the same "
                            "size from itself in the group", comm->rank,
                            (unsigned long long)w->ops[i].nbytes);
    if (w->ops[i].nbytes > 0 && w->bufs[i] != w->bufs[j])
      CUDA_TRY(cudaMemcpyAsync(w->bufs[j], w->bufs[i], w->ops[i].nbytes,
                               cudaMemcpyDeviceToDevice, stream), "copy to self");
  }
  return weftSuccess;
}

weftResult_t device_sendrecv_launch(struct weftComm *comm, struct device_comm *d,
                                    const struct weft_plan *const *plans, size_t nops,
                                    cudaStream_t stream, int captured, int announce) {
  static struct dev_sendrecv_work zero;
  struct dev_sendrecv_work w = zero;
  WEFT_TRY(sendrecv_work_fill(comm, plans, nops, &w, stream));
  for (int i = 0; i < w.nops; i++) {
    const struct sendrecv_op *o = &w.ops[i];
    if (!o->self && (o->send ? d->sendrecv.send : d->sendrecv.recv)[o->peer][0].transport == NULL)
      return weft_error_set(weftInternalError, "rank %d: device lanes %s rank %d are not "
                            "connected", comm->rank, o->send ? "to" : "from", o->peer);
  }
  int npairs = sendrecv_assign_pairs(w.ops, w.nops);
  if (npairs == 0) return weftSuccess;
  w.peers = d->sendrecv.lanes_d;
  w.abort_flag = d->flags_d;
  w.error = d->flags_d + 1;
  w.stopped = (uint64_t *)(d->flags_d + 4);
  w.mismatch = device_mismatch_d(d);
  w.timeout_ns = comm_timeout_ns(comm);
  w.chunk_nbytes = sendrecv_chunk_room(DEV_SIMPLE_SLOT_NBYTES);
  w.nlanes = d->sendrecv.nlanes;
  w.nblocks = sendrecv_nblocks(npairs, w.nlanes, d->sendrecv.max_blocks);
  /* threads for the largest chunk, in one pass of the copy loop */
  uint64_t largest = 0;
  for (int i = 0; i < w.nops; i++)
    if (!w.ops[i].self && w.ops[i].nbytes > largest) largest = w.ops[i].nbytes;
  if (largest > w.chunk_nbytes) largest = w.chunk_nbytes;
  void *args[] = {&w};
  dim3 grid = {(unsigned)w.nblocks, 1, 1},
       block = {device_block_threads(largest, 16u * DEV_UNROLL), 1, 1};
  device_done_fill(d, captured, &w.done);
  static cudaKernel_t handle;
  const char *why = device_kernel_launch((const void *)weft_sendrecv_kernel, &handle, grid, block,
                                         args, stream, 0);
  if (why != NULL)
    return weft_error_set(weftSystemError, "cuda: launching the send/recv kernel: %s", why);
  device_done_commit(d, &w.done, w.nblocks);
  for (int i = 0; announce && i < w.nops; i++) {
    const struct sendrecv_op *o = &w.ops[i];
    if (o->self) continue;
    for (int l = 0; l < w.nlanes; l++) /* net_dev_conn_expect leaves other lanes alone */
      net_dev_conn_expect(o->send ? &d->sendrecv.send[o->peer][l] : &d->sendrecv.recv[o->peer][l],
                          sendrecv_lane_nchunks(o->nbytes, w.chunk_nbytes, l, w.nlanes));
  }
  return weftSuccess;
}
