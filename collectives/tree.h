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

struct tree_links {
  int parent;    /* TREE_NONE at the root */
  int child[2];  /* the first nchildren entries; TREE_NONE after */
  int nchildren;
  int depth;     /* edges from the root */
};

/* Rank's place in tree t (0 or 1) of the double binary tree over nranks
 * ranks. A pure function. */
void tree_dtree_links(int nranks, int rank, int t, struct tree_links *out);

#endif
