/* A program written against nccl.h alone, linked with -lnccl: runs every
 * collective (each datatype and op, odd sizes, in place and out of place),
 * groups, sends and receives on host memory, plus the communicator calls,
 * and checks every result. Run it under weftrun: the ranks find each other
 * through WEFT_RANK, WEFT_NRANKS and WEFT_UNIQUE_ID (the 128 id bytes in
 * hex), which is all it knows of weft. Exits 0 when everything matched. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_elems.h"

int g_rank, g_nranks, g_failures;

/* --- Reductions: all-reduce, reduce, reduce-scatter ------------------------ */

/* A count and whether the call is in place. Odd counts; the largest ones
 * cross many pipeline chunks (the tests run with 4 KiB slots). */
struct shape {
  size_t count;
  int in_place;
};

static void test_reductions(ncclComm_t comm, const struct shape *shapes, int nshapes) {
  unsigned salt = 0;
  for (int ti = 0; ti < ncclNumTypes; ti++) {
    ncclDataType_t t = (ncclDataType_t)ti;
    for (int op = 0; op < NUM_TEST_OPS; op++) {
      void *scalar = NULL;
      ncclRedOp_t nop = make_op(op, t, comm, &scalar);
      for (int ci = 0; ci < nshapes; ci++) {
        size_t count = shapes[ci].count;
        {
          const int in_place = shapes[ci].in_place;
          char what[96];
          salt++;
          /* all-reduce */
          snprintf(what, sizeof what, "AllReduce %s count %zu%s", op_names[op], count,
                   in_place ? " in place" : "");
          void *send = buf_alloc(count, t), *recv = in_place ? send : buf_alloc(count, t);
          for (size_t i = 0; i < count; i++) elem_set(send, t, i, input_value(g_rank, i, t, op, salt));
          NCCL_OK(ncclAllReduce(send, recv, count, t, nop, comm, NULL));
          for (size_t i = 0; i < count; i++) {
            double got = elem_get(recv, t, i), want = expected_reduce(i, t, op, salt);
            if (!close_enough(got, want, t)) {
              FAIL("%s %s [%zu]: got %g, want %g", what, type_names[t], i, got, want);
              break;
            }
          }
          check_guard(recv, count, t, what);
          if (!in_place) free(recv);
          free(send);

          /* reduce, to a root that moves with the salt */
          int root = (int)(salt % (unsigned)g_nranks);
          snprintf(what, sizeof what, "Reduce %s count %zu root %d%s", op_names[op], count, root,
                   in_place ? " in place" : "");
          send = buf_alloc(count, t);
          recv = in_place ? send : buf_alloc(count, t);
          for (size_t i = 0; i < count; i++) elem_set(send, t, i, input_value(g_rank, i, t, op, salt));
          NCCL_OK(ncclReduce(send, recv, count, t, nop, root, comm, NULL));
          if (g_rank == root) {
            for (size_t i = 0; i < count; i++) {
              double got = elem_get(recv, t, i), want = expected_reduce(i, t, op, salt);
              if (!close_enough(got, want, t)) {
                FAIL("%s %s [%zu]: got %g, want %g", what, type_names[t], i, got, want);
                break;
              }
            }
          } else if (!in_place) {
            const unsigned char *b = recv;
            for (size_t k = 0; k < count * type_sizes[t]; k++)
              if (b[k] != POISON) {
                FAIL("%s %s: wrote the receive buffer of a non-root rank", what, type_names[t]);
                break;
              }
          }
          check_guard(recv, count, t, what);
          if (!in_place) free(recv);
          free(send);

          /* reduce-scatter: block r of every rank's input, reduced, to rank r */
          snprintf(what, sizeof what, "ReduceScatter %s recvcount %zu%s", op_names[op], count,
                   in_place ? " in place" : "");
          size_t total = count * (size_t)g_nranks;
          send = buf_alloc(total, t);
          for (size_t i = 0; i < total; i++) elem_set(send, t, i, input_value(g_rank, i, t, op, salt));
          void *own = in_place ? NULL : buf_alloc(count, t);
          recv = in_place ? (char *)send + (size_t)g_rank * count * type_sizes[t] : own;
          NCCL_OK(ncclReduceScatter(send, recv, count, t, nop, comm, NULL));
          for (size_t i = 0; i < count; i++) {
            double got = elem_get(recv, t, i);
            double want = expected_reduce((size_t)g_rank * count + i, t, op, salt);
            if (!close_enough(got, want, t)) {
              FAIL("%s %s [%zu]: got %g, want %g", what, type_names[t], i, got, want);
              break;
            }
          }
          check_guard(in_place ? send : own, in_place ? total : count, t, what);
          free(own);
          free(send);
        }
      }
      if (op >= ncclNumOps) {
        NCCL_OK(ncclRedOpDestroy(nop, comm));
        free(scalar);
      }
    }
  }
}

/* --- Data movement: broadcast, bcast, all-gather ---------------------------- */

static void expect_values(const void *buf, ncclDataType_t t, size_t count, int src_rank,
                          size_t src_offset, unsigned salt, const char *what) {
  for (size_t i = 0; i < count; i++) {
    double got = elem_get(buf, t, i), want = input_value(src_rank, src_offset + i, t, ncclSum, salt);
    if (got != want) {
      FAIL("%s %s [%zu]: got %g, want %g", what, type_names[t], i, got, want);
      return;
    }
  }
}

static void test_movement(ncclComm_t comm, const struct shape *shapes, int nshapes) {
  unsigned salt = 1000;
  for (int ti = 0; ti < ncclNumTypes; ti++) {
    ncclDataType_t t = (ncclDataType_t)ti;
    for (int ci = 0; ci < nshapes; ci++) {
      size_t count = shapes[ci].count;
      {
        const int in_place = shapes[ci].in_place;
        char what[96];
        salt++;
        int root = (int)(salt % (unsigned)g_nranks);
        snprintf(what, sizeof what, "Broadcast count %zu root %d%s", count, root,
                 in_place ? " in place" : "");
        void *send = buf_alloc(count, t), *recv = in_place ? send : buf_alloc(count, t);
        for (size_t i = 0; i < count; i++) elem_set(send, t, i, input_value(g_rank, i, t, ncclSum, salt));
        NCCL_OK(ncclBroadcast(send, recv, count, t, root, comm, NULL));
        expect_values(recv, t, count, root, 0, salt, what);
        check_guard(recv, count, t, what);
        if (!in_place) free(recv);
        free(send);

        if (in_place) { /* ncclBcast is always in place */
          snprintf(what, sizeof what, "Bcast count %zu root %d", count, root);
          void *buf = buf_alloc(count, t);
          for (size_t i = 0; i < count; i++) elem_set(buf, t, i, input_value(g_rank, i, t, ncclSum, salt));
          NCCL_OK(ncclBcast(buf, count, t, root, comm, NULL));
          expect_values(buf, t, count, root, 0, salt, what);
          check_guard(buf, count, t, what);
          free(buf);
        }

        snprintf(what, sizeof what, "AllGather sendcount %zu%s", count, in_place ? " in place" : "");
        size_t total = count * (size_t)g_nranks;
        recv = buf_alloc(total, t);
        void *own = in_place ? NULL : buf_alloc(count, t);
        send = in_place ? (char *)recv + (size_t)g_rank * count * type_sizes[t] : own;
        for (size_t i = 0; i < count; i++) elem_set(send, t, i, input_value(g_rank, i, t, ncclSum, salt));
        NCCL_OK(ncclAllGather(send, recv, count, t, comm, NULL));
        for (int r = 0; r < g_nranks; r++)
          expect_values((char *)recv + (size_t)r * count * type_sizes[t], t, count, r, 0, salt, what);
        check_guard(recv, total, t, what);
        free(own);
        free(recv);

        /* NCCL 2.28's three: gather and scatter in place at the root (the
         * root's own block of the big buffer), all-to-all out of place */
        root = (int)((salt + 1) % (unsigned)g_nranks);
        const int here = in_place && g_rank == root;
        snprintf(what, sizeof what, "Gather count %zu root %d%s", count, root, here ? " in place" : "");
        recv = buf_alloc(total, t);
        own = here ? NULL : buf_alloc(count, t);
        send = here ? (char *)recv + (size_t)root * count * type_sizes[t] : own;
        for (size_t i = 0; i < count; i++) elem_set(send, t, i, input_value(g_rank, i, t, ncclSum, salt));
        NCCL_OK(ncclGather(send, recv, count, t, root, comm, NULL));
        for (int r = 0; g_rank == root && r < g_nranks; r++)
          expect_values((char *)recv + (size_t)r * count * type_sizes[t], t, count, r, 0, salt, what);
        check_guard(recv, total, t, what);
        free(own);
        free(recv);

        snprintf(what, sizeof what, "Scatter count %zu root %d%s", count, root, here ? " in place" : "");
        send = buf_alloc(total, t); /* block r: what the root sends rank r */
        for (size_t i = 0; i < total; i++) elem_set(send, t, i, input_value(g_rank, i, t, ncclSum, salt));
        own = here ? NULL : buf_alloc(count, t);
        recv = here ? (char *)send + (size_t)root * count * type_sizes[t] : own;
        NCCL_OK(ncclScatter(send, recv, count, t, root, comm, NULL));
        expect_values(recv, t, count, root, (size_t)g_rank * count, salt, what);
        check_guard(here ? send : recv, here ? total : count, t, what);
        free(own);
        free(send);

        snprintf(what, sizeof what, "AlltoAll count %zu", count);
        send = buf_alloc(total, t);
        recv = buf_alloc(total, t);
        for (size_t i = 0; i < total; i++) elem_set(send, t, i, input_value(g_rank, i, t, ncclSum, salt));
        NCCL_OK(ncclAlltoAll(send, recv, count, t, comm, NULL));
        for (int r = 0; r < g_nranks; r++) /* block r came from rank r's block g_rank */
          expect_values((char *)recv + (size_t)r * count * type_sizes[t], t, count, r,
                        (size_t)g_rank * count, salt, what);
        check_guard(recv, total, t, what);
        free(send);
        free(recv);
      }
    }
  }
}

/* --- Groups and point-to-point --------------------------------------------- */

static void test_groups(ncclComm_t comm) {
  const size_t count = 3001;
  const ncclDataType_t t = ncclFloat32;
  unsigned salt = 5000;
  /* several collectives launched by one group end, in call order */
  void *ar = buf_alloc(count, t), *bc = buf_alloc(count, t);
  void *ag = buf_alloc(count * (size_t)g_nranks, t), *ag_in = buf_alloc(count, t);
  for (size_t i = 0; i < count; i++) {
    elem_set(ar, t, i, input_value(g_rank, i, t, ncclSum, salt));
    elem_set(bc, t, i, input_value(g_rank, i, t, ncclSum, salt + 1));
    elem_set(ag_in, t, i, input_value(g_rank, i, t, ncclSum, salt + 2));
  }
  int root = g_nranks - 1;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(pncclAllReduce(ar, ar, count, t, ncclSum, comm, NULL)); /* the profiling name */
  NCCL_OK(ncclGroupStart()); /* nested: the outer end launches */
  NCCL_OK(ncclBroadcast(bc, bc, count, t, root, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclAllGather(ag_in, ag, count, t, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  for (size_t i = 0; i < count; i++)
    if (elem_get(ar, t, i) != expected_reduce(i, t, ncclSum, salt)) {
      FAIL("grouped AllReduce [%zu] wrong", i);
      break;
    }
  expect_values(bc, t, count, root, 0, salt + 1, "grouped Broadcast");
  for (int r = 0; r < g_nranks; r++)
    expect_values((char *)ag + (size_t)r * count * 4, t, count, r, 0, salt + 2, "grouped AllGather");
  free(ar);
  free(bc);
  free(ag);
  free(ag_in);

  /* all-to-all from sends and receives in one group, a rank sending to itself
   * too, each pair's messages between ones of no elements (all_to_all_single's
   * zero splits: NULL, or the end of a block, which must stay unwritten) */
  const size_t per = 777;
  const ncclDataType_t t64 = ncclInt64;
  void *out = buf_alloc(per * (size_t)g_nranks, t64), *in = buf_alloc(per * (size_t)g_nranks, t64);
  for (int p = 0; p < g_nranks; p++)
    for (size_t i = 0; i < per; i++) elem_set(out, t64, (size_t)p * per + i, g_rank * 1000000 + p * 1000 + (double)i);
  NCCL_OK(ncclGroupStart());
  for (int p = 0; p < g_nranks; p++) {
    NCCL_OK(ncclSend(NULL, 0, t64, p, comm, NULL));
    NCCL_OK(ncclSend((char *)out + (size_t)p * per * 8, per, t64, p, comm, NULL));
    NCCL_OK(ncclRecv((char *)in + (size_t)p * per * 8, per, t64, p, comm, NULL));
    NCCL_OK(ncclRecv((char *)in + (size_t)(p + 1) * per * 8, 0, t64, p, comm, NULL));
    NCCL_OK(ncclRecv(NULL, 0, t64, p, comm, NULL));
  }
  NCCL_OK(ncclGroupEnd());
  for (int p = 0; p < g_nranks; p++)
    for (size_t i = 0; i < per; i++)
      if (elem_get(in, t64, (size_t)p * per + i) != p * 1000000 + g_rank * 1000 + (double)i) {
        FAIL("all-to-all: block from rank %d, element %zu wrong", p, i);
        p = g_nranks;
        break;
      }
  check_guard(in, per * (size_t)g_nranks, t64, "all-to-all");
  free(out);
  free(in);

  /* a ring shift with sends and receives outside a group: even ranks send
   * first, odd ranks receive first, so no order deadlocks */
  if (g_nranks % 2 == 0) {
    const size_t n = 10007;
    uint8_t *s = buf_alloc(n, ncclUint8), *r = buf_alloc(n, ncclUint8);
    for (size_t i = 0; i < n; i++) s[i] = (uint8_t)(g_rank * 31 + i);
    int next = (g_rank + 1) % g_nranks, prev = (g_rank + g_nranks - 1) % g_nranks;
    if (g_rank % 2 == 0) {
      NCCL_OK(ncclSend(s, n, ncclUint8, next, comm, NULL));
      NCCL_OK(ncclRecv(r, n, ncclUint8, prev, comm, NULL));
    } else {
      NCCL_OK(ncclRecv(r, n, ncclUint8, prev, comm, NULL));
      NCCL_OK(ncclSend(s, n, ncclUint8, next, comm, NULL));
    }
    for (size_t i = 0; i < n; i++)
      if (r[i] != (uint8_t)(prev * 31 + i)) {
        FAIL("ring shift: element %zu wrong", i);
        break;
      }
    free(s);
    free(r);
  }

  /* a simulated group runs nothing but estimates a time */
  float *sim = buf_alloc(count, ncclFloat32);
  for (size_t i = 0; i < count; i++) sim[i] = 1.0f;
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  EXPECT(info.estimatedTime == NCCL_UNDEF_FLOAT, "NCCL_SIM_INFO_INITIALIZER: estimatedTime unset");
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(sim, sim, count, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupSimulateEnd(&info));
  EXPECT(info.estimatedTime > 0, "ncclGroupSimulateEnd: estimate %g us", (double)info.estimatedTime);
  for (size_t i = 0; i < count; i++)
    if (sim[i] != 1.0f) {
      FAIL("ncclGroupSimulateEnd ran the all-reduce");
      break;
    }
  /* nested: the inner end leaves simInfo alone (nothing checked, nothing
   * written), as NCCL's; the outermost estimates */
  ncclSimInfo_t inner = {0}, outer = NCCL_SIM_INFO_INITIALIZER;
  inner.estimatedTime = -3.0f;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(sim, sim, count, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupSimulateEnd(&inner));
  EXPECT(inner.estimatedTime == -3.0f, "an inner ncclGroupSimulateEnd wrote %g",
         (double)inner.estimatedTime);
  NCCL_OK(ncclGroupSimulateEnd(&outer));
  EXPECT(outer.estimatedTime > 0, "nested ncclGroupSimulateEnd: estimate %g us",
         (double)outer.estimatedTime);
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0;
  NCCL_OK(ncclGroupStart());
  EXPECT(ncclGroupSimulateEnd(&bad) == ncclInvalidArgument, "uninitialised ncclSimInfo_t accepted");
  /* without a ncclSimInfo_t the simulated end is NCCL's group end: it runs */
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(sim, sim, count, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupSimulateEnd(NULL));
  for (size_t i = 0; i < count; i++)
    if (sim[i] != (float)g_nranks) {
      FAIL("ncclGroupSimulateEnd(NULL): [%zu] = %g, want %d", i, (double)sim[i], g_nranks);
      break;
    }
  free(sim);
}

/* --- Communicators ------------------------------------------------------------ */

static void expect_allreduce_works(ncclComm_t comm, const char *what) {
  int n = 0, r = -1;
  NCCL_OK(ncclCommCount(comm, &n));
  NCCL_OK(ncclCommUserRank(comm, &r));
  int64_t v = r + 1, sum = 0;
  NCCL_OK(ncclAllReduce(&v, &sum, 1, ncclInt64, ncclSum, comm, NULL));
  EXPECT(sum == (int64_t)n * (n + 1) / 2, "%s: all-reduce of rank+1 gave %lld on %d ranks", what,
         (long long)sum, n);
}

static void test_comms(ncclComm_t comm) {
  /* a fresh id from rank 0, sent with a broadcast; an old-layout config */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclBroadcast(&id, &id, sizeof id, ncclUint8, 0, comm, NULL));
  ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
  old.version = NCCL_VERSION(2, 13, 0); /* blocking came in 2.14: not read */
  old.size = offsetof(ncclConfig_t, splitShare);
  old.blocking = 5;
  ncclComm_t second = NULL;
  NCCL_OK(ncclCommInitRankConfig(&second, g_nranks, id, g_rank, &old));
  expect_allreduce_works(second, "comm from an old config");

  /* split: two colors, ranks reversed by key */
  ncclComm_t half = NULL;
  NCCL_OK(ncclCommSplit(second, g_rank % 2, -g_rank, &half, NULL));
  int hn = 0, hr = -1;
  NCCL_OK(ncclCommCount(half, &hn));
  NCCL_OK(ncclCommUserRank(half, &hr));
  int want_n = (g_nranks + 1 - g_rank % 2) / 2;
  EXPECT(hn == want_n, "split: %d ranks, want %d", hn, want_n);
  EXPECT(hr == want_n - 1 - g_rank / 2, "split: rank %d, want %d", hr, want_n - 1 - g_rank / 2);
  expect_allreduce_works(half, "split comm");
  ncclComm_t none = (ncclComm_t)&id;
  NCCL_OK(ncclCommSplit(second, g_rank == 0 ? NCCL_SPLIT_NOCOLOR : 1, 0, &none, NULL));
  EXPECT((g_rank == 0) == (none == NULL), "split with NCCL_SPLIT_NOCOLOR");
  if (none != NULL) expect_allreduce_works(none, "split without rank 0");
  NCCL_OK(ncclCommDestroy(none));
  NCCL_OK(ncclCommAbort(half));

  /* shrink: the last rank leaves; only the others call */
  if (g_nranks > 2) {
    int gone = g_nranks - 1;
    if (g_rank != gone) {
      ncclComm_t shrunk = NULL;
      NCCL_OK(ncclCommShrink(second, &gone, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT));
      int sn = 0, sr = -1;
      NCCL_OK(ncclCommCount(shrunk, &sn));
      NCCL_OK(ncclCommUserRank(shrunk, &sr));
      EXPECT(sn == g_nranks - 1 && sr == g_rank, "shrink: rank %d of %d", sr, sn);
      expect_allreduce_works(shrunk, "shrunk comm");
      NCCL_OK(ncclCommDestroy(shrunk));
    }
    int self = g_rank;
    ncclComm_t bad = NULL;
    ncclResult_t self_res = ncclCommShrink(second, &self, 1, &bad, NULL, NCCL_SHRINK_DEFAULT);
    EXPECT(self_res == ncclInvalidArgument, "a rank shrank itself out: %d, want %d (as NCCL)",
           (int)self_res, (int)ncclInvalidArgument);
  }
  NCCL_OK(ncclCommFinalize(second));
  NCCL_OK(ncclCommDestroy(second));

  /* scalable init with two ids, from ranks 0 and last, gathered */
  ncclUniqueId ids[2];
  ncclUniqueId mine;
  memset(&mine, 0, sizeof mine);
  int makers[2] = {0, g_nranks - 1};
  if (g_rank == makers[0] || g_rank == makers[1]) NCCL_OK(ncclGetUniqueId(&mine));
  for (int k = 0; k < 2; k++) {
    if (g_rank == makers[k]) ids[k] = mine;
    NCCL_OK(ncclBroadcast(&ids[k], &ids[k], sizeof ids[k], ncclUint8, makers[k], comm, NULL));
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = "scalable";
  ncclComm_t scalable = NULL;
  NCCL_OK(ncclCommInitRankScalable(&scalable, g_nranks, g_rank, 2, ids, &cfg));
  expect_allreduce_works(scalable, "scalable init");
  NCCL_OK(ncclCommDestroy(scalable));

  /* a clique of three ranks in this process, driven by one thread */
  if (g_rank == 0) {
    ncclComm_t all[3];
    NCCL_OK(ncclCommInitAll(all, 3, NULL));
    float v[3] = {1, 2, 3}, out[3] = {0, 0, 0};
    NCCL_OK(ncclGroupStart());
    for (int i = 0; i < 3; i++) NCCL_OK(ncclAllReduce(&v[i], &out[i], 1, ncclFloat32, ncclMax, all[i], NULL));
    NCCL_OK(ncclGroupEnd());
    for (int i = 0; i < 3; i++) {
      EXPECT(out[i] == 3, "CommInitAll clique: max gave %g", (double)out[i]);
      NCCL_OK(ncclCommDestroy(all[i]));
    }
  }
}

/* One thread creates two ranks per process inside a group (NCCL's pattern for
 * a GPU per rank), then splits them inside a group too. */
static void test_grouped_init(ncclComm_t comm) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclBroadcast(&id, &id, sizeof id, ncclUint8, 0, comm, NULL));
  const int n = 2 * g_nranks;
  ncclComm_t two[2] = {NULL, NULL};
  char name[32];
  snprintf(name, sizeof name, "grouped-%d", g_rank);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = name;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommInitRankConfig(&two[0], n, id, 2 * g_rank, &cfg));
  memset(name, 0, sizeof name); /* read at the call, not at the group's end */
  NCCL_OK(ncclCommInitRank(&two[1], n, id, 2 * g_rank + 1));
  NCCL_OK(ncclGroupEnd());
  EXPECT(two[0] != NULL && two[1] != NULL, "grouped init left a communicator NULL");

  int64_t v[2] = {2 * g_rank + 1, 2 * g_rank + 2}, sum[2] = {0, 0};
  NCCL_OK(ncclGroupStart());
  for (int k = 0; k < 2; k++) NCCL_OK(ncclAllReduce(&v[k], &sum[k], 1, ncclInt64, ncclSum, two[k], NULL));
  NCCL_OK(ncclGroupEnd());
  for (int k = 0; k < 2; k++)
    EXPECT(sum[k] == (int64_t)n * (n + 1) / 2, "grouped comms: sum %lld on %d ranks",
           (long long)sum[k], n);

  /* split inside a group: the even ranks and the odd ranks */
  ncclComm_t half[2] = {NULL, NULL};
  NCCL_OK(ncclGroupStart());
  for (int k = 0; k < 2; k++) NCCL_OK(ncclCommSplit(two[k], k, g_rank, &half[k], NULL));
  NCCL_OK(ncclGroupEnd());
  int64_t hsum[2] = {0, 0};
  NCCL_OK(ncclGroupStart());
  for (int k = 0; k < 2; k++) NCCL_OK(ncclAllReduce(&v[k], &hsum[k], 1, ncclInt64, ncclSum, half[k], NULL));
  NCCL_OK(ncclGroupEnd());
  for (int k = 0; k < 2; k++) {
    int64_t want = 0; /* ranks 2p+k hold 2p+k+1 */
    for (int p = 0; p < g_nranks; p++) want += 2 * p + k + 1;
    EXPECT(hsum[k] == want, "grouped split %d: sum %lld, want %lld", k, (long long)hsum[k],
           (long long)want);
    int hn = 0;
    NCCL_OK(ncclCommCount(half[k], &hn));
    EXPECT(hn == g_nranks, "grouped split %d: %d ranks", k, hn);
  }
  for (int k = 0; k < 2; k++) {
    NCCL_OK(ncclCommDestroy(half[k]));
    NCCL_OK(ncclCommDestroy(two[k]));
  }

  /* a grouped init of a rank out of range is refused at the call, as NCCL's,
   * and fails the group, whose end runs nothing and leaves NULL */
  ncclComm_t bad = (ncclComm_t)&id;
  NCCL_OK(ncclGroupStart());
  EXPECT(ncclCommInitRank(&bad, 2, id, 5) == ncclInvalidArgument,
         "a grouped init of rank 5 of 2 was accepted");
  EXPECT(ncclGroupEnd() == ncclInvalidArgument, "a grouped init of rank 5 of 2 succeeded");
  EXPECT(bad == NULL, "a failed grouped init left *comm set");
}

/* --- Memory, registration, errors ------------------------------------------ */

static void test_memory(ncclComm_t comm) {
  const size_t count = 12345;
  double *buf = NULL;
  NCCL_OK(ncclMemAlloc((void **)&buf, count * sizeof *buf));
  void *handle = NULL;
  ncclWindow_t win = NULL;
  NCCL_OK(ncclCommRegister(comm, buf, count * sizeof *buf, &handle));
  NCCL_OK(ncclCommWindowRegister(comm, buf, count * sizeof *buf, &win, NCCL_WIN_COLL_SYMMETRIC));
  for (size_t i = 0; i < count; i++) buf[i] = g_rank + (double)i;
  NCCL_OK(ncclAllReduce(buf, buf, count, ncclFloat64, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; i++)
    if (buf[i] != g_nranks * (g_nranks - 1) / 2.0 + g_nranks * (double)i) {
      FAIL("all-reduce on ncclMemAlloc memory: [%zu] = %g", i, buf[i]);
      break;
    }
  NCCL_OK(ncclCommWindowDeregister(comm, win));
  NCCL_OK(ncclCommDeregister(comm, handle));
  NCCL_OK(ncclMemFree(buf));
  EXPECT(ncclCommWindowRegister(comm, &handle, 8, &win, 0x40) == ncclInvalidArgument,
         "unknown window flags accepted");
  /* 0 bytes: NULL and success, as cudaMalloc's; freeing NULL succeeds */
  void *none = &handle;
  NCCL_OK(ncclMemAlloc(&none, 0));
  EXPECT(none == NULL, "ncclMemAlloc of 0 bytes gave %p, not NULL", none);
  NCCL_OK(ncclMemFree(none));
}

static void test_errors(ncclComm_t comm, ncclUniqueId id) {
  for (int r = 0; r < ncclNumResults; r++)
    EXPECT(ncclGetErrorString((ncclResult_t)r) != NULL, "no string for result %d", r);
  float x = 1;
  EXPECT(ncclAllReduce(&x, &x, 1, (ncclDataType_t)ncclNumTypes, ncclSum, comm, NULL) ==
             ncclInvalidArgument,
         "bad datatype accepted");
  EXPECT(strlen(ncclGetLastError(comm)) > 0, "no last error after a bad datatype");
  EXPECT(ncclAllReduce(&x, &x, 1, ncclFloat32, (ncclRedOp_t)(ncclNumOps + 40), comm, NULL) ==
             ncclInvalidArgument,
         "unknown op accepted");
  EXPECT(ncclBroadcast(&x, &x, 1, ncclFloat32, g_nranks, comm, NULL) == ncclInvalidArgument,
         "root out of range accepted");
  EXPECT(ncclGetVersion(NULL) == ncclInvalidArgument, "ncclGetVersion(NULL) accepted");
  if (comm != NULL) { /* NCCL's device API: linked by PyTorch, refused by weft */
    ncclDevComm_t *dev_comm = (ncclDevComm_t *)&x;
    EXPECT(ncclDevCommCreate(comm, NULL, dev_comm) == ncclInvalidUsage, "ncclDevCommCreate accepted");
    EXPECT(strstr(ncclGetLastError(comm), "device API is not supported") != NULL,
           "ncclDevCommCreate: last error '%s'", ncclGetLastError(comm));
    EXPECT(ncclDevCommDestroy(comm, dev_comm) == ncclInvalidUsage, "ncclDevCommDestroy accepted");
    /* the device API's window flags */
    ncclWindow_t win = NULL;
    EXPECT(ncclCommWindowRegister(comm, &x, sizeof x, &win, NCCL_WIN_GIN_ONLY) == ncclInvalidUsage,
           "NCCL_WIN_GIN_ONLY accepted");
    EXPECT(ncclCommWindowRegister(comm, &x, sizeof x, &win, NCCL_WIN_CFT_COUNTED) ==
               ncclInvalidUsage,
           "NCCL_WIN_CFT_COUNTED accepted");
  }
  /* a refused split leaves *newcomm NULL */
  ncclComm_t child = (ncclComm_t)&x;
  EXPECT(ncclCommSplit(NULL, 0, 0, &child, NULL) != ncclSuccess, "a split of NULL accepted");
  EXPECT(child == NULL, "a refused split left *newcomm set");
  /* arguments NCCL refuses before any rendezvous */
  ncclUniqueId ids[2] = {id, id};
  ncclComm_t scalable = NULL;
  EXPECT(ncclCommInitRankScalable(&scalable, 1, 0, 2, ids, NULL) == ncclInvalidArgument,
         "ncclCommInitRankScalable: 2 ids for 1 rank accepted");
  ncclComm_t pair[2] = {NULL, NULL};
  const int twice[2] = {0, 0};
  EXPECT(ncclCommInitAll(pair, 2, twice) == ncclInvalidUsage,
         "ncclCommInitAll: a device named twice accepted");
  /* configs that must be refused before any rendezvous */
  /* a refused init leaves *comm NULL, as NCCL's */
  ncclComm_t c = (ncclComm_t)&x;
  EXPECT(ncclCommInitRank(&c, g_nranks, id, g_nranks) == ncclInvalidArgument,
         "rank out of range accepted");
  EXPECT(c == NULL, "a refused ncclCommInitRank left *comm set");
  c = (ncclComm_t)&x;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 5;
  EXPECT(ncclCommInitRankConfig(&c, g_nranks, id, g_rank, &cfg) == ncclInvalidArgument,
         "blocking = 5 accepted from a 2.30 config");
  EXPECT(c == NULL, "a refused ncclCommInitRankConfig left *comm set");
  ncclConfig_t raw;
  memset(&raw, 0, sizeof raw);
  raw.size = sizeof raw;
  EXPECT(ncclCommInitRankConfig(&c, g_nranks, id, g_rank, &raw) == ncclInvalidArgument,
         "config without NCCL_CONFIG_INITIALIZER accepted");
  EXPECT(strstr(ncclGetLastError(NULL), "NCCL_CONFIG_INITIALIZER") != NULL,
         "last error does not name the initializer: %s", ncclGetLastError(NULL));
  if (comm != NULL) {
    ncclResult_t async = ncclInternalError;
    NCCL_OK(ncclCommGetAsyncError(comm, &async));
    EXPECT(async == ncclSuccess, "async error %d on a healthy comm", (int)async);
  }
  ncclResetDebugInit();
}

/* --quick: init, one all-reduce, destroy (for the environment test).
 * --comm-id: the same, each rank taking its id from ncclGetUniqueId with
 * NCCL_COMM_ID set, no id passed around. */
int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  int comm_id = argc > 1 && strcmp(argv[1], "--comm-id") == 0;
  ncclUniqueId id;
  nccl_test_job(&id);

  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE && version == 23203, "version %d", version);
  int pversion = 0;
  NCCL_OK(pncclGetVersion(&pversion));
  EXPECT(pversion == version, "pncclGetVersion gave %d", pversion);

  if (comm_id) {
    ncclComm_t c = NULL;
    NCCL_OK(ncclGetUniqueId(&id));
    NCCL_OK(ncclCommInitRank(&c, g_nranks, id, g_rank));
    expect_allreduce_works(c, "NCCL_COMM_ID");
    NCCL_OK(ncclCommDestroy(c));
    if (g_rank == 0 && !g_failures) printf("nccl_test: NCCL_COMM_ID: %d ranks joined\n", g_nranks);
    return g_failures ? 1 : 0;
  }

  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.commName = "nccl_test";
  cfg.minCTAs = 2; /* two channels: both rings carry data */
  cfg.maxCTAs = 2;
  ncclComm_t comm = NULL;
  if (!quick) test_errors(NULL, id); /* nothing here joins the rendezvous */
  NCCL_OK(ncclCommInitRankConfig(&comm, g_nranks, id, g_rank, &cfg));
  int n = 0, r = -1, dev = 0;
  NCCL_OK(ncclCommCount(comm, &n));
  NCCL_OK(ncclCommUserRank(comm, &r));
  NCCL_OK(ncclCommCuDevice(comm, &dev));
  EXPECT(n == g_nranks && r == g_rank, "comm says rank %d of %d", r, n);
  EXPECT(dev == -1, "a host comm reports CUDA device %d", dev);

  if (quick) {
    expect_allreduce_works(comm, "quick");
    /* a refusal, which NCCL_DEBUG=WARN shows (test_env.sh) */
    EXPECT(ncclGetVersion(NULL) == ncclInvalidArgument, "ncclGetVersion(NULL) accepted");
    NCCL_OK(ncclCommDestroy(comm));
    return g_failures ? 1 : 0;
  }
  const struct shape shapes[] = {{0, 0}, {1, 1}, {7, 0}, {1001, 1}, {30011, 0}, {12289, 1}};
  const int nshapes = sizeof shapes / sizeof shapes[0];
  test_reductions(comm, shapes, nshapes);
  test_movement(comm, shapes, nshapes);
  test_groups(comm);
  test_memory(comm);
  test_comms(comm);
  test_grouped_init(comm);
  test_errors(comm, id);

  NCCL_OK(ncclCommFinalize(comm));
  /* as NCCL: a second finalize is refused, NULL is nothing to do */
  EXPECT(ncclCommFinalize(comm) == ncclInvalidArgument, "a second ncclCommFinalize accepted");
  EXPECT(ncclCommFinalize(NULL) == ncclSuccess, "ncclCommFinalize(NULL) refused");
  NCCL_OK(ncclCommDestroy(comm));
  if (g_failures) fprintf(stderr, "rank %d: %d checks failed\n", g_rank, g_failures);
  else if (g_rank == 0) printf("nccl_test: %d ranks: all checks passed\n", g_nranks);
  return g_failures ? 1 : 0;
}
