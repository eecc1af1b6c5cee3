/* UCX's one-sided write over TCP, below UCP: two processes of this host, one
 * UCT tcp interface each, data written straight into the other's memory with
 * uct_ep_put_zcopy and a flag written behind it. What a weft bulk path under
 * UCP could cost at the least, beside UCP's tagged messages (ucx_tag_bw.c)
 * and raw TCP (tcp_exchange.c); docs/ucx.md.
 *
 *   cc -O3 -march=native -o /tmp/uct_put_bw tools/bench/uct_put_bw.c -luct -lucs
 *   /tmp/uct_put_bw 524288 300              # one 512 KiB exchange per iteration
 *   /tmp/uct_put_bw 1048576 300 2           # 1 MiB as two puts, one flag behind both
 *   /tmp/uct_put_bw 1048576 300 allreduce   # 2-rank float all-reduce in place:
 *                                           # reduce-scatter, then all-gather
 *
 * (UCP's own ucp_put_nbx over TCP is software emulation in UCX 1.13, eight
 * times slower at 512 KiB: hence UCT here.) DEVICE (UCT_DEV, default lo) is the
 * interface the tcp transport uses. Prints the time per iteration. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uct/api/uct.h>
#include <ucs/async/async_fwd.h>

#include "bench_pair.h"

#define WARMUP_ITERS 3
#define ADDR_MAX 256

static void die(const char *what, ucs_status_t st) {
  fprintf(stderr, "uct_put_bw: %s%s%s\n", what, st != UCS_OK ? ": " : "",
          st != UCS_OK ? ucs_status_string(st) : "");
  exit(1);
}

static void check(ucs_status_t st, const char *what) {
  if (st != UCS_OK) die(what, st);
}

/* Sends mine (nbytes) to the other process and receives its (as long). */
static void swap(int fd, const void *mine, size_t nbytes, void *theirs) {
  if (nbytes > ADDR_MAX) die("address too long", UCS_OK);
  bench_io_all(fd, (void *)mine, nbytes, 1);
  bench_io_all(fd, theirs, nbytes, 0);
}

/* The tcp memory domain and its component. */
static uct_md_h tcp_md_open(uct_component_h *component) {
  uct_component_h *comps;
  unsigned ncomps;
  check(uct_query_components(&comps, &ncomps), "uct_query_components");
  for (unsigned i = 0; i < ncomps; i++) {
    uct_component_attr_t attr = {.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT};
    check(uct_component_query(comps[i], &attr), "uct_component_query");
    if (attr.md_resource_count == 0) continue;
    uct_md_resource_desc_t mds[attr.md_resource_count];
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds;
    check(uct_component_query(comps[i], &attr), "uct_component_query");
    for (unsigned k = 0; k < attr.md_resource_count; k++) {
      if (strcmp(mds[k].md_name, "tcp") != 0) continue;
      uct_md_config_t *config;
      uct_md_h md;
      check(uct_md_config_read(comps[i], NULL, NULL, &config), "uct_md_config_read");
      check(uct_md_open(comps[i], "tcp", config, &md), "uct_md_open");
      uct_config_release(config);
      *component = comps[i];
      return md;
    }
  }
  die("UCX has no tcp memory domain", UCS_OK);
  return NULL;
}

struct side {
  uct_worker_h worker;
  uct_ep_h ep;
  uct_rkey_t rkey;
  uct_completion_t comp; /* every put's; count = puts in flight */
};

static void put_done(uct_completion_t *self) { (void)self; }

/* Writes nbytes at src to the other process's remote_addr. */
static void put(struct side *s, void *src, size_t nbytes, uint64_t remote_addr) {
  uct_iov_t iov = {.buffer = src, .length = nbytes, .memh = UCT_MEM_HANDLE_NULL, .count = 1};
  ucs_status_t st;
  s->comp.count++;
  while ((st = uct_ep_put_zcopy(s->ep, &iov, 1, remote_addr, s->rkey, &s->comp)) ==
         UCS_ERR_NO_RESOURCE)
    uct_worker_progress(s->worker);
  if (st == UCS_OK) s->comp.count--;
  else if (st != UCS_INPROGRESS) die("uct_ep_put_zcopy", st);
}

/* Progresses until *flag reaches want and every put has left. */
static void wait_flag(struct side *s, volatile uint64_t *flag, uint64_t want) {
  while (*flag < want || s->comp.count > 0) uct_worker_progress(s->worker);
}

/* Element i of rank's buffer before the first all-reduce. Each all-reduce
 * averages the two ranks' buffers and adds one, so that a write that never
 * came shows in the result. */
static float start_value(size_t i, int rank) {
  return 1.0f / (float)(i % 97 + 1) + (float)rank * 0.25f * (float)(i % 13);
}

static float step(float a, float b) { return (a + b) * 0.5f + 1.0f; }

struct run {
  size_t nbytes;
  int iters, pieces; /* pieces == 0: the all-reduce */
};

/* One process's side: addresses over fd, then the iterations. */
static void side_run(int rank, int fd, void *arg) {
  const struct run *run = arg;
  const size_t nbytes = run->nbytes;
  const int iters = run->iters, pieces = run->pieces;
  struct side s = {.comp = {.func = put_done, .count = 0, .status = UCS_OK}};
  uct_component_h component;
  uct_md_h md = tcp_md_open(&component);
  uct_md_attr_t md_attr;
  check(uct_md_query(md, &md_attr), "uct_md_query");
  ucs_async_context_t *async;
  check(ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async), "async context");
  check(uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &s.worker), "uct_worker_create");
  uct_iface_config_t *iface_config;
  check(uct_md_iface_config_read(md, "tcp", NULL, NULL, &iface_config), "iface config");
  const char *dev = getenv("UCT_DEV");
  uct_iface_params_t iparams = {
      .field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE |
                    UCT_IFACE_PARAM_FIELD_STATS_ROOT | UCT_IFACE_PARAM_FIELD_RX_HEADROOM,
      .open_mode = UCT_IFACE_OPEN_MODE_DEVICE,
      .mode.device = {.tl_name = "tcp", .dev_name = dev != NULL ? dev : "lo"}};
  uct_iface_h iface;
  check(uct_iface_open(md, s.worker, &iparams, iface_config, &iface), "uct_iface_open");
  uct_config_release(iface_config);
  uct_iface_attr_t iattr;
  check(uct_iface_query(iface, &iattr), "uct_iface_query");
  uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);

  char dev_addr[ADDR_MAX], peer_dev_addr[ADDR_MAX], if_addr[ADDR_MAX], peer_if_addr[ADDR_MAX];
  check(uct_iface_get_device_address(iface, (uct_device_addr_t *)dev_addr), "device address");
  check(uct_iface_get_address(iface, (uct_iface_addr_t *)if_addr), "iface address");
  swap(fd, dev_addr, iattr.device_addr_len, peer_dev_addr);
  swap(fd, if_addr, iattr.iface_addr_len, peer_if_addr);
  uct_ep_params_t eparams = {.field_mask = UCT_EP_PARAM_FIELD_IFACE |
                                           UCT_EP_PARAM_FIELD_DEV_ADDR |
                                           UCT_EP_PARAM_FIELD_IFACE_ADDR,
                             .iface = iface,
                             .dev_addr = (uct_device_addr_t *)peer_dev_addr,
                             .iface_addr = (uct_iface_addr_t *)peer_if_addr};
  check(uct_ep_create(&eparams, &s.ep), "uct_ep_create");

  /* land: what the other writes (nbytes, then two flags); data: this side's */
  const size_t land_nbytes = (nbytes + 2 * sizeof(uint64_t) + 4095) / 4096 * 4096;
  char *land = aligned_alloc(4096, land_nbytes);
  float *data = aligned_alloc(4096, (nbytes + 4095) / 4096 * 4096);
  if (land == NULL || data == NULL) die("out of memory", UCS_OK);
  memset(land, 0, land_nbytes);
  for (size_t i = 0; i < nbytes / sizeof(float); i++) data[i] = start_value(i, rank);
  /* the tcp domain needs no registration: its remote keys are empty, and a
   * put names the address itself (an RDMA domain would register land here) */
  char rkey_buf[ADDR_MAX] = {0}, peer_rkey_buf[ADDR_MAX] = {0};
  if (md_attr.rkey_packed_size > 0) die("this domain wants registered memory", UCS_OK);
  swap(fd, rkey_buf, md_attr.rkey_packed_size, peer_rkey_buf);
  uct_rkey_bundle_t rkey;
  check(uct_rkey_unpack(component, peer_rkey_buf, &rkey), "uct_rkey_unpack");
  s.rkey = rkey.rkey;
  uint64_t my_addrs[2] = {(uint64_t)(uintptr_t)land, (uint64_t)(uintptr_t)data}, peer[2];
  swap(fd, my_addrs, sizeof my_addrs, peer);
  const uint64_t peer_land = peer[0], peer_data = peer[1];

  volatile uint64_t *flag = (volatile uint64_t *)(land + nbytes);
  uint64_t flag_out[2];
  const size_t half = nbytes / 2;
  char *bytes = (char *)data;
  double start = 0;
  for (int i = -WARMUP_ITERS; i < iters; i++) {
    if (i == 0) { /* both start the timed loop together */
      bench_barrier(fd);
      start = bench_now_s();
    }
    const uint64_t seq = (uint64_t)(i + WARMUP_ITERS + 1);
    flag_out[0] = flag_out[1] = seq;
    if (pieces > 0) { /* the exchange: nbytes into the other's land, a flag behind */
      const size_t piece = nbytes / (size_t)pieces;
      for (int k = 0; k < pieces; k++)
        put(&s, bytes + (size_t)k * piece, k + 1 < pieces ? piece : nbytes - (size_t)k * piece,
            peer_land + (size_t)k * piece);
      uct_ep_fence(s.ep, 0);
      put(&s, &flag_out[0], sizeof(uint64_t), peer_land + nbytes);
      wait_flag(&s, &flag[0], seq);
      continue;
    }
    /* the all-reduce: the other's half into its land; reduce this rank's half
     * with what landed; this half into the other's data, then its flag */
    char *mine = bytes + (size_t)rank * half, *theirs = bytes + (size_t)(1 - rank) * half;
    put(&s, theirs, half, peer_land);
    uct_ep_fence(s.ep, 0);
    put(&s, &flag_out[0], sizeof(uint64_t), peer_land + nbytes);
    wait_flag(&s, &flag[0], seq);
    float *a = (float *)mine;
    const float *b = (const float *)land;
    for (size_t k = 0; k < half / sizeof(float); k++) a[k] = step(a[k], b[k]);
    put(&s, mine, half, peer_data + (size_t)rank * half);
    uct_ep_fence(s.ep, 0);
    put(&s, &flag_out[1], sizeof(uint64_t), peer_land + nbytes + sizeof(uint64_t));
    wait_flag(&s, &flag[1], seq);
  }
  const double per_iter = (bench_now_s() - start) / iters;
  for (size_t k = 0; pieces == 0 && k < nbytes / sizeof(float); k++) {
    float want = step(start_value(k, 0), start_value(k, 1));
    for (int i = 1; i < WARMUP_ITERS + iters; i++) want = step(want, want);
    if (memcmp(&data[k], &want, sizeof want) != 0) die("wrong all-reduce result", UCS_OK);
  }
  if (rank == 0)
    printf("%zu B %s: %.1f us, %.2f GB/s%s\n", nbytes,
           pieces == 0 ? "uct put all-reduce" : "uct put exchange", per_iter * 1e6,
           (double)nbytes / per_iter / 1e9, pieces == 0 ? " busbw" : " each way");
  bench_barrier(fd); /* neither tears down while the other still writes */
  /* interface, worker and domain go with the process */
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: uct_put_bw NBYTES ITERS [PIECES|allreduce]\n");
    return 2;
  }
  size_t nbytes = strtoull(argv[1], NULL, 0);
  int iters = atoi(argv[2]);
  int pieces = argc < 4 ? 1 : strcmp(argv[3], "allreduce") == 0 ? 0 : atoi(argv[3]);
  if (nbytes < 8 || nbytes % 8 != 0 || iters <= 0 || pieces < 0)
    die("NBYTES must be a positive multiple of 8, ITERS and PIECES positive", UCS_OK);
  struct run run = {.nbytes = nbytes, .iters = iters, .pieces = pieces};
  return bench_run_pair(side_run, &run);
}
