/* The tree all-reduce's device channels: on each, a FIFO pair per protocol
 * with every neighbour this rank has in either of the comm's two trees
 * (comm->trees), and on channel 0 also in the tree of small calls
 * (comm->tree_small, which runs there alone), set up as the ring's hops are
 * (device_hops.c) and handed to the tree kernels (kernels.cuh) as struct
 * dev_tree_channel. CUDA builds only. */
#include <stdlib.h>
#include <string.h>

#include "../../../transport/bootstrap/bootstrap.h"
#include "../../../transport/cuda_ipc/cuda_fifo.h"
#include "../../algo/tree_steps.h"
#include "device_priv.h"

/* A rank's neighbours in either tree, in tree_steps.h's order, then those
 * only the tree of small calls adds (none where WEFT_TREE_SMALL_BYTES is 0
 * or the comm spans hosts): what the kernels' links are numbered by. [0]
 * the count, [1] the count of the first kind (every channel's links; channel
 * 0 has them all), then the ranks; [0] is -1 where they would be more than
 * TREE_MAX_PEERS, which they never are: on one host a rank has at most 4
 * neighbours in the double binary tree (interior in one of its trees) and 4
 * in the tree of small calls. */
typedef int tree_peer_list[TREE_MAX_PEERS + 2];

static void tree_peers_of(const struct weftComm *comm, tree_peer_list out) {
  struct tree_geom g;
  tree_geom_init(&g, comm->trees, 1, 0, 0, 1, 1); /* no elements: only the links */
  out[0] = out[1] = g.npeers;
  for (int j = 0; j < g.npeers; j++) out[2 + j] = g.peer[j];
  if (comm->tree_small_nbytes == 0) return;
  tree_geom_init_trees(&g, &comm->tree_small, 1, 1, 0, 0, 1, 1);
  for (int j = 0; j < g.npeers; j++) {
    int known = 0;
    for (int i = 0; i < out[0]; i++) known |= out[2 + i] == g.peer[j];
    if (known) continue;
    if (out[0] == TREE_MAX_PEERS) {
      out[0] = -1;
      return;
    }
    out[2 + out[0]++] = g.peer[j];
  }
}

/* Channel c's links: the first this many of the list. */
static int tree_channel_npeers(const int *list, int c) { return c == 0 ? list[0] : list[1]; }

/* Writes the channels where the kernels read them: each link's FIFOs at step 0. */
static weftResult_t tree_publish(struct weftComm *comm, struct device_comm *d,
                                 const tree_peer_list mine) {
  const int nch = d->tree_nchannels;
  struct dev_tree_channel *host = calloc((size_t)nch, sizeof *host);
  if (host == NULL) return weft_error_set(weftSystemError, "out of memory");
  weftResult_t res = weftSuccess;
  for (int c = 0; c < nch && res == weftSuccess; c++) {
    host[c].npeers = tree_channel_npeers(mine, c);
    host[c].links[0] = comm->trees[0];
    host[c].links[1] = comm->trees[1];
    host[c].link_small = comm->tree_small;
    for (int j = 0; j < host[c].npeers && res == weftSuccess; j++) {
      host[c].peer[j] = mine[2 + j];
      for (int p = 0; p < DEV_NPROTOS && res == weftSuccess; p++) {
        res = device_hop_fifo(&d->tree_send[c][j][p], &host[c].send[j][p]);
        if (res == weftSuccess) res = device_hop_fifo(&d->tree_recv[c][j][p], &host[c].recv[j][p]);
      }
    }
  }
  if (res == weftSuccess)
    res = device_cuda_check(cudaMalloc((void **)&d->trees_d, sizeof *host * (size_t)nch),
                            "tree channels");
  if (res == weftSuccess) res = cuda_fifo_copy(d->trees_d, host, sizeof *host * (size_t)nch,
                                               "tree channels");
  free(host);
  return res;
}

/* Sets up every tree link of every tree channel (collective over the comm's
 * ranks; every rank's neighbours are its neighbours' neighbours, of the
 * same kind). */
static weftResult_t tree_connect(struct weftComm *comm, struct device_comm *d) {
  const int n = comm->nranks;
  const int nch = d->nchannels < DEV_TREE_MAX_CHANNELS ? d->nchannels : DEV_TREE_MAX_CHANNELS;
  tree_peer_list *lists = calloc((size_t)n, sizeof *lists);
  if (lists == NULL) return weft_error_set(weftSystemError, "out of memory");
  tree_peers_of(comm, lists[comm->rank]);
  weftResult_t res = bootstrap_allgather(comm->bs, lists, sizeof *lists);
  for (int r = 0; r < n && res == weftSuccess; r++)
    if (lists[r][0] < 0) /* every rank sees it alike */
      res = weft_error_set(weftInternalError, "tree: rank %d has more than %d neighbours", r,
                           TREE_MAX_PEERS);
  const int *mine = lists[comm->rank];
  if (res == weftSuccess) {
    d->tree_send = calloc((size_t)nch, sizeof *d->tree_send);
    d->tree_recv = calloc((size_t)nch, sizeof *d->tree_recv);
    if (d->tree_send == NULL || d->tree_recv == NULL)
      res = weft_error_set(weftSystemError, "out of memory");
    d->tree_nchannels = nch;
  }
  /* blobs: [rank][channel][link][protocol], each rank's receiving ends */
  const size_t per_rank = (size_t)nch * TREE_MAX_PEERS * DEV_NPROTOS;
  struct conn_blob *blobs = res == weftSuccess ? calloc((size_t)n * per_rank, sizeof *blobs) : NULL;
  if (res == weftSuccess && blobs == NULL) res = weft_error_set(weftSystemError, "out of memory");
  if (res != weftSuccess) {
    free(lists);
    return res; /* every rank failed alike here, or before any exchange */
  }
#define TREE_BLOB(rank, c, j, p) \
  blobs[(size_t)(rank) * per_rank + ((size_t)(c) * TREE_MAX_PEERS + (size_t)(j)) * DEV_NPROTOS + (p)]
  weftResult_t local = weftSuccess;
  char why[512] = "";
  for (int c = 0; c < nch && local == weftSuccess; c++)
    for (int j = 0; j < tree_channel_npeers(mine, c) && local == weftSuccess; j++)
      for (int p = 0; p < DEV_NPROTOS && local == weftSuccess; p++)
        local = device_hop_recv_setup(comm, d->dev, &d->tree_recv[c][j][p], mine[2 + j], p,
                                      &TREE_BLOB(comm->rank, c, j, p));
  if (local != weftSuccess) {
    snprintf(why, sizeof why, "%s", weft_error_text());
    for (size_t i = 0; i < per_rank; i++) /* tell the peers */
      blobs[(size_t)comm->rank * per_rank + i].transport = -2;
  }
  res = bootstrap_allgather(comm->bs, blobs, sizeof *blobs * per_rank);
  if (res == weftSuccess && local != weftSuccess) res = weft_error_set(local, "%s", why);
  for (int j = 0; j < mine[0] && res == weftSuccess; j++) {
    const int q = mine[2 + j];
    int k = -1; /* where this rank is among q's neighbours */
    for (int i = 0; i < lists[q][0]; i++)
      if (lists[q][2 + i] == comm->rank) k = i;
    if (k < 0 || (j < mine[1]) != (k < lists[q][1])) {
      res = weft_error_set(weftInternalError, "tree: rank %d is not a neighbour of its "
                           "neighbour %d in the same trees", comm->rank, q);
      break;
    }
    for (int c = 0; c < nch && j < tree_channel_npeers(mine, c) && res == weftSuccess; c++)
      for (int p = 0; p < DEV_NPROTOS && res == weftSuccess; p++)
        res = device_hop_send_connect(comm, &d->tree_send[c][j][p], q, p, &TREE_BLOB(q, c, k, p));
  }
#undef TREE_BLOB
  free(blobs);
  if (res == weftSuccess) res = bootstrap_barrier(comm->bs);
  for (int c = 0; c < nch && res == weftSuccess; c++)
    for (int j = 0; j < tree_channel_npeers(mine, c) && res == weftSuccess; j++)
      for (int p = 0; p < DEV_NPROTOS && res == weftSuccess; p++)
        res = device_hop_recv_connect(&d->tree_recv[c][j][p]);
  if (res == weftSuccess) res = tree_publish(comm, d, mine);
  free(lists);
  return res;
}

/* Channel 0's links, and every other channel's. */
static void lists_npeers(const struct weftComm *comm, int *first, int *others) {
  tree_peer_list mine;
  tree_peers_of(comm, mine);
  *first = mine[0];
  *others = mine[1];
}

weftResult_t device_tree_get(struct weftComm *comm, struct device_comm *d) {
  if (d->tree_ready) return weftSuccess;
  weftResult_t res = tree_connect(comm, d);
  if (res != weftSuccess) {
    device_tree_close(d); /* what was made of it */
    return res;
  }
  d->tree_ready = 1;
  int first, others;
  lists_npeers(comm, &first, &others);
  WEFT_INFO(LOG_INIT, "rank %d: device tree channels connected: %d, to %d neighbours (channel 0: "
            "%d, with the tree of small calls)", comm->rank, d->tree_nchannels, others, first);
  return weftSuccess;
}

void device_tree_close(struct device_comm *d) {
  for (int c = 0; c < d->tree_nchannels; c++)
    for (int j = 0; j < TREE_MAX_PEERS; j++)
      for (int p = 0; p < DEV_NPROTOS; p++) {
        if (d->tree_send != NULL && d->tree_send[c][j][p].transport)
          d->tree_send[c][j][p].transport->close(&d->tree_send[c][j][p]);
        if (d->tree_recv != NULL && d->tree_recv[c][j][p].transport)
          d->tree_recv[c][j][p].transport->close(&d->tree_recv[c][j][p]);
      }
  free(d->tree_send);
  free(d->tree_recv);
  cudaFree(d->trees_d);
  d->tree_send = NULL;
  d->tree_recv = NULL;
  d->trees_d = NULL;
  d->tree_nchannels = 0;
  d->tree_ready = 0;
}
