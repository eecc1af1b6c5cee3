/* The double binary tree (NCCL's): two binary trees over the same ranks,
 * built so that every rank is a leaf in at least one of them and interior
 * (has children) in at most one. Tree all-reduce gives each tree half of the
 * data, so every rank sends and receives about the same amount.
 *
 * Tree 0 is NCCL's in-order binary tree: rank 0 is the root with one child
 * (the largest power of two below nranks), odd ranks are leaves, the
 * children of an even rank r are r - b/2 and r + b/2 (b the lowest set bit
 * of r, the latter shrunk while past the end). Tree 1, for even nranks, is
 * its mirror (rank r plays nranks-1-r): even ranks are interior in tree 0,
 * odd ranks in tree 1. For odd nranks NCCL shifts tree 0 by one instead,
 * which makes rank 0 interior in both; here both trees are built on the
 * first nranks-1 ranks (an even count) and the last rank becomes the second
 * child of both roots (each has one child there), a leaf in both. */
#ifndef WEFT_TREE_H
#define WEFT_TREE_H

#define TREE_NONE (-1)

#define TREE_MAX_CHILDREN 3

struct tree_links {
  int parent;    /* TREE_NONE at the root */
  int child[TREE_MAX_CHILDREN]; /* the first nchildren entries; TREE_NONE after */
  int nchildren;
  int depth;     /* edges from the root */
};

/* Rank's place in tree t (0 or 1) of the double binary tree over nranks
 * ranks. A pure function. */
void tree_dtree_links(int nranks, int rank, int t, struct tree_links *out);

/* Rank's place in the tree small all-reduces take on one host (where a
 * call is a piece or two, a tree's depth is its latency): ranks 0..nranks-1
 * in heap order with TREE_MAX_CHILDREN children a node, rank r's children
 * TREE_MAX_CHILDREN * r + 1 onwards, so depth 1 up to 4 ranks, 2 up to 13
 * and 3 up to 40, where the double binary tree's is log2 of the ranks. A
 * pure function. */
void tree_small_links(int nranks, int rank, struct tree_links *out);

/* The same over the positions of order (a permutation of the ranks, the
 * ring order): rank's links, as ranks. A pure function. */
void tree_small_order_links(int nranks, const int *order, int rank, struct tree_links *out);

/* Rank's place in tree t (0 or 1) of the trees over hosts. order is the
 * ring order (the ranks of each host adjacent), host[r] rank r's host
 * (0..nhosts-1, numbered along order). On one host: the double binary tree
 * over the positions in order. Across hosts: the double binary tree over
 * the hosts, and inside each host a chain along order (tree 0 from the
 * host's first rank, tree 1 from its last); the head of a host's chain hangs
 * off the head of its parent host's. So each tree crosses into every host
 * but the root's exactly once, and the two trees enter a host at different
 * ranks. A head has up to three children (its chain's next rank and two
 * hosts' heads). scratch: room for 2 * nranks + 1 ints, overwritten. A
 * pure function. */
void tree_hier_links(int nranks, const int *order, const int *host, int *scratch, int rank,
                     int t, struct tree_links *out);

#endif
