/* The latency of a small tree all-reduce on device memory as a model: every
 * rank runs its steps of tree_steps.h for 8 B of float32 on one channel (one
 * piece; a channel's share of each tree is rounded to 64 bytes, so tree 0
 * carries it all and tree 1 nothing), each primitive takes c microseconds
 * once its message is in, and a message takes L microseconds over a link.
 * Prints, per rank count, the ring's longest chain ((2n - 2) links, 2n - 1
 * primitives), the tree run primitive by primitive (the SIMPLE kernel) and
 * run a (key, part) step at a time with a root's up(i) and down(i) together
 * (the LL kernel, tree_ll_group in kernels.cuh), each with the fixed parts
 * added; and the counts of links and primitives on the longest chain; then
 * the same for the small calls' tree (tree_small_links, three children a
 * node) run by the LL kernel.
 * Usage: tree_model [c_us L_us ring_fixed_us tree_extra_us]
 * The defaults fit gpu-check's perf_tree figures of 2026-12-04 (docs/cuda.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/algo/tree_steps.h"

#define MAX_RANKS 16
#define MAX_STEPS 64

struct rank_steps {
  struct tree_geom g;
  struct tree_step st[MAX_STEPS];
  int group_end[MAX_STEPS]; /* 1 where a (key, part) step ends */
  int n;
};

/* The time the last rank ends, for n ranks; grouped: a (key, part) step's
 * primitives as one (its receives awaited together, then its sends). */
static double simulate(int n, int grouped, double c, double L, int small) {
  static struct rank_steps R[MAX_RANKS];
  static double sent[MAX_RANKS][MAX_RANKS][MAX_STEPS];
  int nsent[MAX_RANKS][MAX_RANKS], nrecvd[MAX_RANKS][MAX_RANKS];
  memset(nsent, 0, sizeof nsent);
  memset(nrecvd, 0, sizeof nrecvd);
  for (int r = 0; r < n; r++) {
    struct tree_links t[2];
    if (small) { /* the tree of small calls, whole (comm_tree_small) */
      tree_small_links(n, r, &t[0]);
      tree_geom_init_trees(&R[r].g, t, 1, 1, 0, 2, 4, 1024); /* 8 B of float32 */
    } else {
      tree_dtree_links(n, r, 0, &t[0]);
      tree_dtree_links(n, r, 1, &t[1]);
      tree_geom_init(&R[r].g, t, 1, 0, 2, 4, 1024);
    }
    struct tree_iter it;
    tree_iter_init(&it, &R[r].g);
    R[r].n = 0;
    int root_up_ends = -1; /* where a root's up(i) ended, to join its down(i) */
    size_t piece = 0;
    int part = -1;
    while (R[r].n < MAX_STEPS && tree_iter_next(&R[r].g, &it, &R[r].st[R[r].n])) {
      const int first = it.j == 1;
      /* the kernel runs a root's up(i) and its down(i), next in its order, as one */
      if (first && !it.up && root_up_ends == R[r].n - 1 && it.part == part && it.piece == piece)
        R[r].group_end[root_up_ends] = 0;
      R[r].group_end[R[r].n] = it.j >= it.nsteps;
      if (it.j >= it.nsteps) {
        root_up_ends = it.up && R[r].g.part[it.part].links.parent == TREE_NONE ? R[r].n : -1;
        piece = it.piece;
        part = it.part;
      }
      R[r].n++;
    }
  }
  int pc[MAX_RANKS] = {0};
  double now[MAX_RANKS] = {0};
  for (int moved = 1; moved;) {
    moved = 0;
    for (int r = 0; r < n; r++)
      while (pc[r] < R[r].n) {
        /* the primitives run as one: [pc, end] */
        int end = pc[r];
        while (grouped && !R[r].group_end[end]) end++;
        double start = now[r];
        int ready = 1;
        for (int i = pc[r]; i <= end && ready; i++) {
          const struct tree_step *s = &R[r].st[i];
          if (s->recv_peer < 0) continue;
          const int q = R[r].g.peer[s->recv_peer];
          if (nrecvd[q][r] >= nsent[q][r]) ready = 0;
        }
        if (!ready) break;
        for (int i = pc[r]; i <= end; i++) {
          const struct tree_step *s = &R[r].st[i];
          if (s->recv_peer < 0) continue;
          const int q = R[r].g.peer[s->recv_peer];
          const double in = sent[q][r][nrecvd[q][r]++] + L;
          if (in > start) start = in;
          if (!grouped) break; /* one primitive: one receive */
        }
        const double done = start + c;
        for (int i = pc[r]; i <= end; i++) {
          const struct tree_step *s = &R[r].st[i];
          if (s->send_peer < 0) continue;
          const int q = R[r].g.peer[s->send_peer];
          sent[r][q][nsent[r][q]++] = done;
        }
        now[r] = done;
        pc[r] = end + 1;
        moved = 1;
      }
  }
  double last = 0;
  for (int r = 0; r < n; r++) {
    if (pc[r] != R[r].n) {
      fprintf(stderr, "tree_model: the steps of %d ranks deadlock at rank %d\n", n, r);
      exit(1);
    }
    if (now[r] > last) last = now[r];
  }
  return last;
}

int main(int argc, char **argv) {
  const double c = argc > 1 ? atof(argv[1]) : 1.61, L = argc > 2 ? atof(argv[2]) : 1.03;
  const double ring_fixed = argc > 3 ? atof(argv[3]) : 3.87;
  const double tree_extra = argc > 4 ? atof(argv[4]) : 1.24;
  printf("c %.2f us a primitive, L %.2f us a link, fixed %.2f us (ring) and %.2f us more (tree)\n",
         c, L, ring_fixed, tree_extra);
  printf("%5s %9s %14s %14s %7s %24s %9s %7s %13s\n", "ranks", "ring_us", "tree_prims_us",
         "tree_steps_us", "ratio", "links/prims (prims/steps)", "small_us", "ratio",
         "links (steps)");
  for (int n = 2; n <= 9; n++) {
    const double ring = ring_fixed + (2 * n - 2) * (L + c) + c;
    const double by_prim = ring_fixed + tree_extra + simulate(n, 0, c, L, 0);
    const double by_step = ring_fixed + tree_extra + simulate(n, 1, c, L, 0);
    /* the chain's counts: L alone counts links, c alone primitives */
    const double links = simulate(n, 1, 0, 1, 0), prims = simulate(n, 0, 1, 0, 0),
                 steps = simulate(n, 1, 1, 0, 0);
    /* the small calls' tree (WEFT_TREE_SMALL_BYTES) run by the LL kernel */
    const double small = ring_fixed + tree_extra + simulate(n, 1, c, L, 1);
    const double small_links = simulate(n, 1, 0, 1, 1), small_steps = simulate(n, 1, 1, 0, 1);
    printf("%5d %9.2f %14.2f %14.2f %7.2f %12.0f/%.0f (%.0f) %9.2f %7.2f %9.0f (%.0f)\n", n,
           ring, by_prim, by_step, by_step / ring, links, prims, steps, small, small / ring,
           small_links, small_steps);
  }
  return 0;
}
