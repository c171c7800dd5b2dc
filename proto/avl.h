/* SPDX-License-Identifier: MIT */
/*
 * avl.h — intrusive AVL tree for the daemon's registry (names → entries,
 * ids → leases and segments).
 *
 * The tree never allocates: callers embed a struct avl_node in their own
 * object and get the object back with avl_entry(). Keys live in the caller's
 * object too; the tree only learns about them through an avl_cmp_fn, which
 * is passed to every call that searches, so one node type serves any key.
 *
 * Every operation is O(log n) and iterative; nothing recurses.
 *
 * Contracts shared by all functions:
 *   - Pointer arguments must not be NULL unless a function says otherwise.
 *   - A tree must be initialised with avl_init() (or be zeroed) before use.
 *   - Nodes returned are borrowed: valid until the caller removes them.
 *   - The tree is not thread-safe; callers serialise access.
 *   - All keys in one tree must be totally ordered by the same comparator.
 */
#ifndef DLX_DAEMON_AVL_H
#define DLX_DAEMON_AVL_H

#include <stddef.h>
#include <stdint.h>

struct avl_node {
        struct avl_node *left, *right, *parent;
        /* height(right) - height(left); always -1, 0 or 1 between calls. */
        int8_t balance;
};

/*
 * Compares a search key with a node: < 0 when key sorts before node, 0 when
 * equal, > 0 when after. Must not modify the tree.
 */
typedef int (*avl_cmp_fn)(const void *key, const struct avl_node *node);

struct avl_tree {
        struct avl_node *root;
        size_t count;
};

/* Makes t an empty tree. A zero-initialised struct avl_tree is empty too. */
void avl_init(struct avl_tree *t);

/* Returns the node equal to key, or NULL when there is none. */
struct avl_node *avl_find(const struct avl_tree *t, const void *key, avl_cmp_fn cmp);

/* Returns the first node whose key is >= key (lower bound), or NULL. */
struct avl_node *avl_lower_bound(const struct avl_tree *t, const void *key, avl_cmp_fn cmp);

/* Returns the first node whose key is > key (upper bound), or NULL. */
struct avl_node *avl_upper_bound(const struct avl_tree *t, const void *key, avl_cmp_fn cmp);

/*
 * Links node into t under key. key must describe node, i.e. later calls of
 * cmp(key, node) return 0. node must not be in any tree; its fields need no
 * initialisation.
 *
 * Returns NULL when node was inserted, or the node already in t that is equal
 * to key: then nothing is inserted and node is left untouched.
 */
struct avl_node *avl_insert(struct avl_tree *t, struct avl_node *node, const void *key,
                            avl_cmp_fn cmp);

/*
 * Unlinks node, which must be in t. No other node moves in the in-order
 * sequence, so a successor taken with avl_next() before the call stays valid:
 *
 *         for (n = avl_first(t); n; n = next) {
 *                 next = avl_next(n);
 *                 if (...)
 *                         avl_remove(t, n);
 *         }
 *
 * Afterwards node's fields are unspecified; it may be freed or reinserted.
 */
void avl_remove(struct avl_tree *t, struct avl_node *node);

/* Return the smallest / largest node, or NULL when t is empty. */
struct avl_node *avl_first(const struct avl_tree *t);
struct avl_node *avl_last(const struct avl_tree *t);

/* Return the in-order successor / predecessor of n (which is in a tree), or NULL at the end. */
struct avl_node *avl_next(const struct avl_node *n);
struct avl_node *avl_prev(const struct avl_node *n);

/* The object of type `type` whose member `member` is the node at ptr. */
#define avl_entry(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* Helpers for the common keys: return -1, 0 or 1 as a sorts before, equal to, or after b. */
int avl_cmp_u64(uint64_t a, uint64_t b);

#endif /* DLX_DAEMON_AVL_H */
