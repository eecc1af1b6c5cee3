/* Channels: build each ring and connect its connections through the
 * transports, exchanging connection blobs over the bootstrap. */
#include <stdlib.h>
#include <string.h>

#include "../../transport/base/status.h"
#include "channel.h"

/* Whether rank a comes before rank b (both of one host) in the ring: by
 * package, NUMA node, host bridge, PCI switch, bus, then rank. Ranks behind
 * one switch are then adjacent, so the ring enters and leaves each switch
 * once. */
static int ring_before(const struct peer_info *a, const struct peer_info *b) {
  const int64_t ka[] = {a->package, a->numa_node, a->host_bridge,
                        a->pci_switch, a->bus_id, a->rank};
  const int64_t kb[] = {b->package, b->numa_node, b->host_bridge,
                        b->pci_switch, b->bus_id, b->rank};
  for (size_t i = 0; i < sizeof ka / sizeof ka[0]; i++)
    if (ka[i] != kb[i]) return ka[i] < kb[i];
  return 0;
}

/* Orders the ring so that the ranks of one host are adjacent: hosts in the
 * order of their lowest rank, and within a host by the topology (see
 * ring_before). The ring then crosses between hosts once per host. */
void ring_order(const struct peer_info *peers, int nranks, int *ring_out) {
  int n = 0;
  for (int r = 0; r < nranks; r++) {
    int first_of_host = 1;
    for (int q = 0; q < r && first_of_host; q++) first_of_host = peers[q].host_hash != peers[r].host_hash;
    if (!first_of_host) continue;
    const int start = n;
    for (int q = r; q < nranks; q++) {
      if (peers[q].host_hash != peers[r].host_hash) continue;
      int i = n++; /* insertion: peers arrive in rank order, so this is stable */
      while (i > start && ring_before(&peers[q], &peers[ring_out[i - 1]])) {
        ring_out[i] = ring_out[i - 1];
        i--;
      }
      ring_out[i] = q;
    }
  }
}

int comm_trees(const struct peer_info *peers, int nranks, int rank, struct tree_links trees[2],
               struct tree_links *small, struct tree_links (*all_out)[2]) {
  int *order = malloc(sizeof *order * (4 * (size_t)nranks + 1));
  if (order == NULL) return -1;
  int *host = order + nranks, *scratch = host + nranks;
  ring_order(peers, nranks, order);
  int nhosts = 0;
  for (int i = 0; i < nranks; i++) {
    if (i > 0 && peers[order[i]].host_hash != peers[order[i - 1]].host_hash) nhosts++;
    host[order[i]] = nhosts;
  }
  for (int t = 0; t < 2; t++) tree_hier_links(nranks, order, host, scratch, rank, t, &trees[t]);
  if (small != NULL) tree_small_order_links(nranks, order, rank, small);
  /* the deepest rank of either tree: every rank computes the same */
  int depth_max = 0;
  for (int r = 0; r < nranks; r++) {
    for (int t = 0; t < 2; t++) {
      struct tree_links l;
      tree_hier_links(nranks, order, host, scratch, r, t, &l);
      if (l.depth > depth_max) depth_max = l.depth;
      if (all_out != NULL) all_out[r][t] = l;
    }
  }
  free(order);
  return depth_max;
}

int comm_tree_small(const struct weftComm *comm, size_t nbytes) {
  return nbytes <= comm->tree_small_nbytes;
}

static weftResult_t ring_build(struct weftComm *comm, struct weft_channel *ch) {
  if (ch->id == 0) {
    comm->tree_depth = comm_trees(comm->peers, comm->nranks, comm->rank, comm->trees,
                                  &comm->tree_small, NULL);
    if (comm->tree_depth < 0) return weft_error_set(weftSystemError, "out of memory");
    for (int r = 1; r < comm->nranks; r++) /* across hosts the trees stay hierarchical */
      if (comm->peers[r].host_hash != comm->peers[0].host_hash) comm->tree_small_nbytes = 0;
  }
  ring_order(comm->peers, comm->nranks, ch->ring);
  for (int i = 0; i < comm->nranks; i++)
    if (ch->ring[i] == comm->rank) ch->ring_pos = i;
  return weftSuccess;
}

static void conn_init(struct weft_conn *conn, const struct weftComm *comm, int peer,
                      uint32_t nslots, size_t slot_nbytes) {
  memset(conn, 0, sizeof *conn);
  conn->nslots = nslots;
  conn->slot_nbytes = slot_nbytes;
  conn->peer_rank = peer;
  conn->bs = comm->bs;
  const struct peer_info *me = &comm->peers[comm->rank], *p = &comm->peers[peer];
  conn->peer_pid = p->host_hash == me->host_hash ? p->pid : 0;
}

weftResult_t channels_connect(struct weftComm *comm, uint32_t nslots, size_t slot_nbytes) {
  const int n = comm->nranks, nch = comm->nchannels;
  weftResult_t res = weftSuccess;
  for (int c = 0; c < nch; c++) {
    struct weft_channel *ch = &comm->channels[c];
    ch->id = c;
    ch->ring = malloc(sizeof *ch->ring * (size_t)n);
    if (ch->ring == NULL) return weft_error_set(weftSystemError, "out of memory");
    WEFT_TRY(ring_build(comm, ch));
  }
  if (n == 1) return weftSuccess;

  /* every rank sets up its receive side and publishes one blob per channel */
  struct conn_blob *blobs = calloc((size_t)n * (size_t)nch, sizeof *blobs);
  if (blobs == NULL) return weft_error_set(weftSystemError, "out of memory");
  struct conn_blob *mine = blobs + (size_t)comm->rank * (size_t)nch;
  weftResult_t local = weftSuccess;
  char why[512] = "";
  for (int c = 0; c < nch && local == weftSuccess; c++) {
    struct weft_channel *ch = &comm->channels[c];
    int prev = ch->ring[(ch->ring_pos + n - 1) % n];
    conn_init(&ch->recv, comm, prev, nslots, slot_nbytes);
    const struct transport_need need = {.mem = TRANSPORT_MEM_HOST};
    char refused[768];
    int t = transport_select(&comm->peers[prev], &comm->peers[comm->rank], &need, refused,
                             sizeof refused);
    mine[c].transport = t;
    if (t < 0) {
      local = weft_error_set(weftSystemError, "%s (host %s to host %s)", refused,
                             comm->peers[prev].hostname, comm->peers[comm->rank].hostname);
    } else {
      ch->recv.transport = weft_transports[t];
      local = ch->recv.transport->recv_setup(&ch->recv, &mine[c]);
      if (local != weftSuccess) ch->recv.transport = NULL, mine[c].transport = -1;
    }
    if (local != weftSuccess) snprintf(why, sizeof why, "%s", weft_error_text());
  }
  for (int c = 0; local != weftSuccess && c < nch; c++)
    if (mine[c].transport >= 0) mine[c].transport = -2; /* tell peers we failed */
  WEFT_TRY_GOTO(bootstrap_allgather(comm->bs, blobs, sizeof *blobs * (size_t)nch), res,
                free_blobs);
  if (local != weftSuccess) {
    res = weft_error_set(local, "%s", why);
    goto free_blobs;
  }
  /* every rank sees every blob, so all agree whether any ring hop leaves
   * shm, and on which channels every hop can move bulk transfers (a rank
   * whose own two hops can, among ranks whose hops cannot, must not take the
   * bulk path alone: with two ranks on one host and one on another, the
   * lone rank's hops both cross hosts) */
  for (size_t i = 0; i < (size_t)n * (size_t)nch; i++)
    if (blobs[i].transport > 0) comm->network = 1;
  comm->bulk_nchannels_all = nch;
  for (int c = 0; c < nch; c++)
    for (int r = 0; r < n && comm->bulk_nchannels_all > c; r++) {
      const int t = blobs[(size_t)r * (size_t)nch + (size_t)c].transport;
      if (t < 0 || weft_transports[t]->bulk.post == NULL) comm->bulk_nchannels_all = c;
    }
  for (int c = 0; c < nch; c++) {
    struct weft_channel *ch = &comm->channels[c];
    int next = ch->ring[(ch->ring_pos + 1) % n];
    const struct conn_blob *b = &blobs[(size_t)next * (size_t)nch + (size_t)c];
    conn_init(&ch->send, comm, next, nslots, slot_nbytes);
    if (b->transport < 0) {
      res = weft_error_set(weftRemoteError, "rank %d could not set up its connection from rank %d",
                           next, comm->rank);
      goto free_blobs;
    }
    ch->send.transport = weft_transports[b->transport];
    res = ch->send.transport->send_connect(&ch->send, b);
    if (res != weftSuccess) {
      ch->send.transport = NULL;
      goto free_blobs;
    }
  }
  /* everyone attached: receivers may drop what only served the attach */
  WEFT_TRY_GOTO(bootstrap_barrier(comm->bs), res, free_blobs);
  for (int c = 0; c < nch; c++)
    WEFT_TRY_GOTO(comm->channels[c].recv.transport->recv_connect(&comm->channels[c].recv), res,
                  free_blobs);
free_blobs:
  free(blobs);
  return res;
}

void channels_close(struct weftComm *comm) {
  for (int c = 0; c < comm->nchannels; c++) {
    struct weft_channel *ch = &comm->channels[c];
    if (ch->send.transport) ch->send.transport->close(&ch->send);
    if (ch->recv.transport) ch->recv.transport->close(&ch->recv);
    ch->send.transport = ch->recv.transport = NULL;
    free(ch->ring);
    ch->ring = NULL;
  }
}
