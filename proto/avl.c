/* SPDX-License-Identifier: MIT */
/*
 * Intrusive AVL tree. Balance factors are stored rather than heights so a
 * node costs one byte beyond its three pointers, and so retracing can stop
 * as soon as a subtree's height is known not to have changed.
 */
#include "avl.h"

#include <stdbool.h>

void avl_init(struct avl_tree *t)
{
        t->root = NULL;
        t->count = 0;
}

static struct avl_node *leftmost(struct avl_node *n)
{
        while (n->left)
                n = n->left;
        return n;
}

static struct avl_node *rightmost(struct avl_node *n)
{
        while (n->right)
                n = n->right;
        return n;
}

/* Points whatever referred to old (its parent, or the root) at new instead. */
static void replace_child(struct avl_tree *t, struct avl_node *parent, struct avl_node *old,
                          struct avl_node *new)
{
        if (!parent)
                t->root = new;
        else if (parent->left == old)
                parent->left = new;
        else
                parent->right = new;
}

static int max0(int v)
{
        return v > 0 ? v : 0;
}

static int min0(int v)
{
        return v < 0 ? v : 0;
}

/*
 * The balance updates below hold for any starting balances, not only the
 * cases insertion and removal produce, so one pair of rotations serves both
 * and double rotations are just two single ones. Derivation: write each
 * subtree height in terms of the old factors and subtract.
 */
static struct avl_node *rotate_left(struct avl_tree *t, struct avl_node *x)
{
        struct avl_node *z = x->right;
        struct avl_node *parent = x->parent;

        x->right = z->left;
        if (z->left)
                z->left->parent = x;
        z->left = x;
        x->parent = z;
        z->parent = parent;
        replace_child(t, parent, x, z);

        x->balance = (int8_t)(x->balance - 1 - max0(z->balance));
        z->balance = (int8_t)(z->balance - 1 + min0(x->balance));
        return z;
}

static struct avl_node *rotate_right(struct avl_tree *t, struct avl_node *x)
{
        struct avl_node *z = x->left;
        struct avl_node *parent = x->parent;

        x->left = z->right;
        if (z->right)
                z->right->parent = x;
        z->right = x;
        x->parent = z;
        z->parent = parent;
        replace_child(t, parent, x, z);

        x->balance = (int8_t)(x->balance + 1 - min0(z->balance));
        z->balance = (int8_t)(z->balance + 1 + max0(x->balance));
        return z;
}

/* Restores a node whose balance reached ±2; returns the subtree's new root. */
static struct avl_node *rebalance(struct avl_tree *t, struct avl_node *x)
{
        if (x->balance > 0) {
                if (x->right->balance < 0)
                        rotate_right(t, x->right);
                return rotate_left(t, x);
        }
        if (x->left->balance > 0)
                rotate_left(t, x->left);
        return rotate_right(t, x);
}

struct avl_node *avl_find(const struct avl_tree *t, const void *key, avl_cmp_fn cmp)
{
        struct avl_node *n = t->root;

        while (n) {
                int c = cmp(key, n);
                if (c == 0)
                        return n;
                n = c < 0 ? n->left : n->right;
        }
        return NULL;
}

struct avl_node *avl_lower_bound(const struct avl_tree *t, const void *key, avl_cmp_fn cmp)
{
        struct avl_node *n = t->root, *best = NULL;

        while (n) {
                if (cmp(key, n) <= 0) {
                        best = n;
                        n = n->left;
                } else {
                        n = n->right;
                }
        }
        return best;
}

struct avl_node *avl_upper_bound(const struct avl_tree *t, const void *key, avl_cmp_fn cmp)
{
        struct avl_node *n = t->root, *best = NULL;

        while (n) {
                if (cmp(key, n) < 0) {
                        best = n;
                        n = n->left;
                } else {
                        n = n->right;
                }
        }
        return best;
}

struct avl_node *avl_insert(struct avl_tree *t, struct avl_node *node, const void *key,
                            avl_cmp_fn cmp)
{
        struct avl_node *parent = NULL, **link = &t->root;

        while (*link) {
                int c = cmp(key, *link);
                if (c == 0)
                        return *link;
                parent = *link;
                link = c < 0 ? &parent->left : &parent->right;
        }

        node->left = node->right = NULL;
        node->parent = parent;
        node->balance = 0;
        *link = node;
        t->count++;

        /*
         * Walk up while the subtree below grew taller. A node that becomes
         * level absorbed the growth; one that reaches ±2 is rotated back to
         * its height before the insert. Either way nothing above changes.
         */
        for (struct avl_node *child = node; parent; child = parent, parent = parent->parent) {
                parent->balance = (int8_t)(parent->balance + (child == parent->left ? -1 : 1));
                if (parent->balance == 0)
                        break;
                if (parent->balance != 1 && parent->balance != -1) {
                        rebalance(t, parent);
                        break;
                }
        }
        return NULL;
}

void avl_remove(struct avl_tree *t, struct avl_node *node)
{
        struct avl_node *parent;
        bool left_shrank;

        if (node->left && node->right) {
                /*
                 * Move the successor into node's place instead of swapping
                 * keys: the tree does not own the keys, and callers may hold
                 * pointers to every other node, so only links may change.
                 */
                struct avl_node *succ = leftmost(node->right);

                if (succ == node->right) {
                        parent = succ;
                        left_shrank = false;
                } else {
                        parent = succ->parent;
                        left_shrank = true;
                        parent->left = succ->right;
                        if (succ->right)
                                succ->right->parent = parent;
                        succ->right = node->right;
                        node->right->parent = succ;
                }
                succ->left = node->left;
                node->left->parent = succ;
                succ->balance = node->balance;
                succ->parent = node->parent;
                replace_child(t, node->parent, node, succ);
        } else {
                struct avl_node *child = node->left ? node->left : node->right;

                parent = node->parent;
                left_shrank = parent && parent->left == node;
                if (child)
                        child->parent = parent;
                replace_child(t, parent, node, child);
        }
        t->count--;

        /*
         * Walk up while the subtree below got shorter. A node that goes from
         * level to ±1 keeps its height; one rotated back from ±2 is shorter
         * exactly when its new root ends up level.
         */
        while (parent) {
                struct avl_node *up = parent->parent;
                bool up_left = up && up->left == parent;

                parent->balance = (int8_t)(parent->balance + (left_shrank ? 1 : -1));
                if (parent->balance == 1 || parent->balance == -1)
                        break;
                if (parent->balance != 0 && rebalance(t, parent)->balance != 0)
                        break;
                parent = up;
                left_shrank = up_left;
        }
}

struct avl_node *avl_first(const struct avl_tree *t)
{
        return t->root ? leftmost(t->root) : NULL;
}

struct avl_node *avl_last(const struct avl_tree *t)
{
        return t->root ? rightmost(t->root) : NULL;
}

struct avl_node *avl_next(const struct avl_node *n)
{
        if (n->right)
                return leftmost(n->right);
        while (n->parent && n == n->parent->right)
                n = n->parent;
        return n->parent;
}

struct avl_node *avl_prev(const struct avl_node *n)
{
        if (n->left)
                return rightmost(n->left);
        while (n->parent && n == n->parent->left)
                n = n->parent;
        return n->parent;
}

int avl_cmp_u64(uint64_t a, uint64_t b)
{
        return (a > b) - (a < b);
}
