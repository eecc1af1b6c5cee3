/* UCX's own tagged-message throughput between two processes of this host, one
 * thread each, straight from and into the user's buffers: the ceiling that
 * UCX's transport sets under weft's UCX connections (docs/ucx.md).
 *
 *   cc -O2 -o /tmp/ucx_tag_bw tools/bench/ucx_tag_bw.c -lucp -lucs
 *   UCX_TLS=tcp /tmp/ucx_tag_bw 1048576 50          # UCX's own rendezvous threshold
 *   UCX_TLS=tcp /tmp/ucx_tag_bw 1048576 50 eager    # every message eager, as weft's slots
 *   UCX_TLS=tcp /tmp/ucx_tag_bw 1048576 50 peer     # endpoints with peer failure handling
 *   UCX_TLS=tcp /tmp/ucx_tag_bw 1048576 50 split 262144
 *       # the last 256 KiB as an eager message of its own, posted after the first
 *       # 768 KiB's rendezvous, whose handshake it may hide
 *
 * Each iteration both processes post a receive of NBYTES, send NBYTES to the
 * other and wait for both: the bidirectional exchange of a 2-rank all-reduce.
 * Prints the time per iteration and the bytes per second in each direction. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "bench_pair.h"

#define WARMUP_ITERS 3

static void die(const char *what) {
  fprintf(stderr, "ucx_tag_bw: %s\n", what);
  exit(1);
}

static void request_wait(ucp_worker_h worker, ucs_status_ptr_t req) {
  if (UCS_PTR_IS_ERR(req)) die(ucs_status_string(UCS_PTR_STATUS(req)));
  if (req == NULL) return;
  while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker);
  ucs_status_t st = ucp_request_check_status(req);
  ucp_request_free(req);
  if (st != UCS_OK) die(ucs_status_string(st));
}

struct run {
  size_t nbytes;
  int iters, eager, peer;
  size_t split; /* > 0: the last split bytes go eagerly, in a message of their own */
};

/* One process's side: worker addresses go over fd, then the exchanges. */
static void side_run(int rank, int fd, void *arg) {
  const struct run *run = arg;
  const size_t nbytes = run->nbytes;
  const int iters = run->iters, eager = run->eager, peer = run->peer;
  ucp_config_t *config;
  if (ucp_config_read(NULL, NULL, &config) != UCS_OK) die("ucp_config_read failed");
  if (eager && ucp_config_modify(config, "RNDV_THRESH", "inf") != UCS_OK)
    die("cannot set RNDV_THRESH");
  char thresh[32];
  snprintf(thresh, sizeof thresh, "%zu", run->split + 1); /* the head stays above it */
  if (run->split > 0 && ucp_config_modify(config, "RNDV_THRESH", thresh) != UCS_OK)
    die("cannot set RNDV_THRESH");
  ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
  ucp_context_h context;
  ucs_status_t st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) die(ucs_status_string(st));
  ucp_worker_params_t wparams = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                 .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_worker_h worker;
  if (ucp_worker_create(context, &wparams, &worker) != UCS_OK) die("ucp_worker_create failed");
  ucp_address_t *addr;
  size_t addr_nbytes, peer_nbytes;
  if (ucp_worker_get_address(worker, &addr, &addr_nbytes) != UCS_OK) die("no worker address");
  bench_io_all(fd, &addr_nbytes, sizeof addr_nbytes, 1);
  bench_io_all(fd, addr, addr_nbytes, 1);
  bench_io_all(fd, &peer_nbytes, sizeof peer_nbytes, 0);
  void *peer_addr = malloc(peer_nbytes);
  char *send = malloc(nbytes), *recv = malloc(nbytes);
  if (peer_addr == NULL || send == NULL || recv == NULL) die("out of memory");
  bench_io_all(fd, peer_addr, peer_nbytes, 0);
  /* peer failure handling changes the protocols UCX picks (UCX 1.13 over TCP:
   * large messages in 64 KiB active messages instead of zero-copy rendezvous) */
  ucp_ep_params_t eparams = {
      .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
      .address = peer_addr,
      .err_mode = peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE};
  ucp_ep_h ep;
  if (ucp_ep_create(worker, &eparams, &ep) != UCS_OK) die("ucp_ep_create failed");
  memset(send, 1, nbytes);
  memset(recv, 0, nbytes);
  ucp_request_param_t rparams = {.op_attr_mask = 0};
  double start = 0;
  for (int i = -WARMUP_ITERS; i < iters; i++) {
    if (i == 0) { /* both start the timed loop together */
      bench_barrier(fd);
      start = bench_now_s();
    }
    const size_t head = nbytes - run->split, tail = run->split;
    ucs_status_ptr_t rreq = ucp_tag_recv_nbx(worker, recv, head, 1, ~0ull, &rparams);
    ucs_status_ptr_t rtail =
        tail > 0 ? ucp_tag_recv_nbx(worker, recv + head, tail, 2, ~0ull, &rparams) : NULL;
    ucs_status_ptr_t sreq = ucp_tag_send_nbx(ep, send, head, 1, &rparams);
    ucs_status_ptr_t stail = tail > 0 ? ucp_tag_send_nbx(ep, send + head, tail, 2, &rparams) : NULL;
    request_wait(worker, sreq);
    request_wait(worker, stail);
    request_wait(worker, rreq);
    request_wait(worker, rtail);
  }
  double per_iter = (bench_now_s() - start) / iters;
  if (rank == 0)
    printf("%zu B %s: %.1f us, %.2f GB/s each way\n", nbytes,
           eager ? "eager" : peer ? "peer-failure-handling" : run->split ? "split" : "ucx-default",
           per_iter * 1e6, (double)nbytes / per_iter / 1e9);
  bench_barrier(fd); /* neither tears down while the other still sends */
  /* endpoint, worker and context go with the process */
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: ucx_tag_bw NBYTES ITERS [eager|peer|split TAIL]\n");
    return 2;
  }
  size_t nbytes = strtoull(argv[1], NULL, 0);
  int iters = atoi(argv[2]), eager = argc > 3 && strcmp(argv[3], "eager") == 0;
  int peer = argc > 3 && strcmp(argv[3], "peer") == 0;
  const int splitting = argc > 3 && strcmp(argv[3], "split") == 0;
  if (splitting && argc < 5) die("split needs TAIL, the bytes that go eagerly");
  size_t split = splitting ? strtoull(argv[4], NULL, 0) : 0;
  if (nbytes == 0 || iters <= 0) die("NBYTES and ITERS must be positive");
  if (split >= nbytes / 2) die("TAIL must be under half of NBYTES (the head goes by rendezvous)");
  struct run run = {.nbytes = nbytes, .iters = iters, .eager = eager, .peer = peer, .split = split};
  return bench_run_pair(side_run, &run);
}
