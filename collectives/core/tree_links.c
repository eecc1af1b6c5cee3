/* The double binary tree's shape (see tree.h). */
#include "tree_links.h"

/* NCCL's binary tree over ranks 0..n-1 in order: rank's parent and up to
 * two children. */
static void btree_links(int n, int rank, int *parent_out, int child_out[2]) {
  int bit = 1;
  while (bit < n && (bit & rank) == 0) bit <<= 1; /* rank's lowest set bit */
  child_out[0] = child_out[1] = TREE_NONE;
  if (rank == 0) { /* the root: one child, the largest power of two below n */
    *parent_out = TREE_NONE;
    if (n > 1) child_out[0] = bit >> 1;
    return;
  }
  int up = (rank ^ bit) | (bit << 1);
  if (up >= n) up = rank ^ bit;
  *parent_out = up;
  int low = bit >> 1;
  if (low == 0) return; /* odd ranks are leaves */
  child_out[0] = rank - low;
  while (low > 0 && rank + low >= n) low >>= 1;
  if (low > 0) child_out[1] = rank + low;
}

/* Tree t over n ranks, n even or 1: tree 0, or its mirror image. */
static void even_links(int n, int rank, int t, int *parent_out, int child_out[2]) {
  if (t == 0) {
    btree_links(n, rank, parent_out, child_out);
    return;
  }
  btree_links(n, n - 1 - rank, parent_out, child_out);
  if (*parent_out != TREE_NONE) *parent_out = n - 1 - *parent_out;
  for (int c = 0; c < 2; c++)
    if (child_out[c] != TREE_NONE) child_out[c] = n - 1 - child_out[c];
}

static void dtree_parent_children(int nranks, int rank, int t, int *parent_out,
                                  int child_out[2]) {
  if (nranks % 2 == 0 || nranks == 1) {
    even_links(nranks, rank, t, parent_out, child_out);
    return;
  }
  /* odd: the even double tree on the first m ranks; rank m hangs off both roots */
  const int m = nranks - 1, root = t == 0 ? 0 : m - 1;
  if (rank == m) {
    *parent_out = root;
    child_out[0] = child_out[1] = TREE_NONE;
    return;
  }
  even_links(m, rank, t, parent_out, child_out);
  if (rank == root) child_out[child_out[0] == TREE_NONE ? 0 : 1] = m;
}

void tree_dtree_links(int nranks, int rank, int t, struct tree_links *out) {
  int child[2];
  dtree_parent_children(nranks, rank, t, &out->parent, child);
  out->nchildren = 0;
  for (int c = 0; c < TREE_MAX_CHILDREN; c++) out->child[c] = TREE_NONE;
  for (int c = 0; c < 2; c++)
    if (child[c] != TREE_NONE) out->child[out->nchildren++] = child[c];
  out->depth = 0;
  int child2[2];
  for (int up = out->parent; up != TREE_NONE && out->depth < nranks; out->depth++)
    dtree_parent_children(nranks, up, t, &up, child2);
}

void tree_small_links(int nranks, int rank, struct tree_links *out) {
  const int k = TREE_MAX_CHILDREN;
  out->parent = rank > 0 ? (rank - 1) / k : TREE_NONE;
  out->nchildren = 0;
  for (int c = 0; c < k; c++) {
    const long child = (long)k * rank + 1 + c;
    out->child[c] = child < nranks ? (int)child : TREE_NONE;
    out->nchildren += child < nranks;
  }
  out->depth = 0;
  for (int up = rank; up > 0; up = (up - 1) / k) out->depth++;
}

/* The head of host h's chain in tree t: its first rank, or its last. */
static int hier_head(const int *order, const int *first, int h, int t) {
  return t == 0 ? order[first[h]] : order[first[h + 1] - 1];
}

/* Rank's links in tree t across nhosts hosts; host h holds the positions
 * [first[h], first[h + 1]) of order, and pos is order's inverse. */
static void hier_links(int nhosts, const int *order, const int *pos, const int *first, int rank,
                       int t, struct tree_links *out) {
  int host = 0;
  while (host + 1 < nhosts && first[host + 1] <= pos[rank]) host++;
  const int len = first[host + 1] - first[host];
  const int at = pos[rank] - first[host];
  const int li = t == 0 ? at : len - 1 - at; /* place along this tree's chain */
  const int step = t == 0 ? 1 : -1;
  out->parent = TREE_NONE;
  out->nchildren = 0;
  for (int c = 0; c < TREE_MAX_CHILDREN; c++) out->child[c] = TREE_NONE;
  if (li + 1 < len) out->child[out->nchildren++] = order[pos[rank] + step];
  if (li > 0) {
    out->parent = order[pos[rank] - step];
    return;
  }
  struct tree_links hl;
  tree_dtree_links(nhosts, host, t, &hl);
  if (hl.parent != TREE_NONE) out->parent = hier_head(order, first, hl.parent, t);
  for (int c = 0; c < hl.nchildren; c++)
    out->child[out->nchildren++] = hier_head(order, first, hl.child[c], t);
}

/* Where rank stands in order. */
static int position_of(int nranks, const int *order, int rank) {
  int pos = 0;
  for (int i = 0; i < nranks; i++)
    if (order[i] == rank) pos = i;
  return pos;
}

/* Links over positions of order made links over ranks. */
static void links_by_order(const int *order, struct tree_links *out) {
  if (out->parent != TREE_NONE) out->parent = order[out->parent];
  for (int c = 0; c < out->nchildren; c++) out->child[c] = order[out->child[c]];
}

void tree_small_order_links(int nranks, const int *order, int rank, struct tree_links *out) {
  tree_small_links(nranks, position_of(nranks, order, rank), out);
  links_by_order(order, out);
}

void tree_hier_links(int nranks, const int *order, const int *host, int *scratch, int rank,
                     int t, struct tree_links *out) {
  int nhosts = nranks > 0 ? host[order[nranks - 1]] + 1 : 1;
  if (nhosts <= 1) { /* one host: the double tree over positions */
    tree_dtree_links(nranks, position_of(nranks, order, rank), t, out);
    links_by_order(order, out);
    return;
  }
  int *pos = scratch, *first = scratch + nranks;
  for (int i = 0; i < nranks; i++) pos[order[i]] = i;
  for (int h = 0, i = 0; h <= nhosts; h++) {
    while (i < nranks && host[order[i]] < h) i++;
    first[h] = i;
  }
  hier_links(nhosts, order, pos, first, rank, t, out);
  /* depth: edges from the root, walking up */
  out->depth = 0;
  struct tree_links up = *out;
  while (up.parent != TREE_NONE && out->depth < nranks) {
    out->depth++;
    hier_links(nhosts, order, pos, first, up.parent, t, &up);
  }
}
