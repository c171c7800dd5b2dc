/* SPDX-License-Identifier: MIT */
/*
 * Tests for daemon/avl.c. The randomized test drives the tree against a
 * plain presence array and runs a full structural check every few hundred
 * operations, so a broken rotation or retrace is caught close to the
 * operation that caused it rather than as a wrong answer much later.
 */
#include "avl.h"

#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toolkit.h"

struct u64_item {
        uint64_t key;
        struct avl_node node;
};

static int cmp_u64_item(const void *key, const struct avl_node *node)
{
        return avl_cmp_u64(*(const uint64_t *)key, avl_entry(node, struct u64_item, node)->key);
}

static uint64_t key_of(const struct avl_node *n)
{
        return avl_entry(n, struct u64_item, node)->key;
}

struct str_item {
        const char *name;
        struct avl_node node;
};

static int cmp_str_item(const void *key, const struct avl_node *node)
{
        return strcmp(key, avl_entry(node, struct str_item, node)->name);
}

static const char *name_of(const struct avl_node *n)
{
        return avl_entry(n, struct str_item, node)->name;
}

/*
 * Structural check of one subtree: parent links, stored balance factors
 * against recomputed heights, and the AVL bound. Returns the height and adds
 * the subtree's size to *count. Recursion depth is the tree height, which
 * the checks themselves keep logarithmic.
 */
static int check_subtree(const struct avl_node *n, const struct avl_node *parent, size_t *count)
{
        if (!n)
                return 0;
        expect(n->parent == parent, "node %p has parent %p, not %p", (void *)n, (void *)n->parent,
               (void *)parent);
        int hl = check_subtree(n->left, n, count);
        int hr = check_subtree(n->right, n, count);
        expect(n->balance == hr - hl, "node %p: balance %d, heights %d/%d", (void *)n, n->balance,
               hl, hr);
        expect(abs(hr - hl) <= 1, "node %p: heights %d/%d", (void *)n, hl, hr);
        (*count)++;
        return 1 + (hl > hr ? hl : hr);
}

/*
 * Full invariant check: structure as above, count, and strictly increasing
 * keys in both iteration directions (which also checks first/last/next/prev
 * against the structure). Returns the height.
 */
static int check_tree(const struct avl_tree *t, avl_cmp_fn cmp,
                      const void *(*key)(const struct avl_node *))
{
        size_t count = 0;
        int height = check_subtree(t->root, NULL, &count);
        ck_assert_uint_eq(count, t->count);

        size_t seen = 0;
        const struct avl_node *prev = NULL;
        for (const struct avl_node *n = avl_first(t); n; prev = n, n = avl_next(n)) {
                if (prev)
                        expect(cmp(key(n), prev) > 0, "node %p out of order", (void *)n);
                expect(avl_find(t, key(n), cmp) == n, "node %p not found", (void *)n);
                seen++;
        }
        ck_assert_ptr_eq(prev, avl_last(t));
        ck_assert_uint_eq(seen, t->count);

        seen = 0;
        prev = NULL;
        for (const struct avl_node *n = avl_last(t); n; prev = n, n = avl_prev(n))
                seen++;
        ck_assert_ptr_eq(prev, avl_first(t));
        ck_assert_uint_eq(seen, t->count);
        return height;
}

static const void *u64_key(const struct avl_node *n)
{
        return &avl_entry(n, struct u64_item, node)->key;
}

static const void *str_key(const struct avl_node *n)
{
        return name_of(n);
}

static int check_u64_tree(const struct avl_tree *t)
{
        return check_tree(t, cmp_u64_item, u64_key);
}

START_TEST(test_cmp_u64)
{
        ck_assert_int_eq(avl_cmp_u64(1, 2), -1);
        ck_assert_int_eq(avl_cmp_u64(2, 1), 1);
        ck_assert_int_eq(avl_cmp_u64(7, 7), 0);
        /* A subtraction-based compare gets these wrong. */
        ck_assert_int_eq(avl_cmp_u64(0, UINT64_MAX), -1);
        ck_assert_int_eq(avl_cmp_u64(UINT64_MAX, 0), 1);
        ck_assert_int_eq(avl_cmp_u64(1, (uint64_t)1 << 63), -1);
}
END_TEST

START_TEST(test_empty)
{
        struct avl_tree t;
        uint64_t k = 5;

        avl_init(&t);
        ck_assert_ptr_null(t.root);
        ck_assert_uint_eq(t.count, 0);
        ck_assert_ptr_null(avl_first(&t));
        ck_assert_ptr_null(avl_last(&t));
        ck_assert_ptr_null(avl_find(&t, &k, cmp_u64_item));
        ck_assert_ptr_null(avl_lower_bound(&t, &k, cmp_u64_item));
        ck_assert_ptr_null(avl_upper_bound(&t, &k, cmp_u64_item));
        check_u64_tree(&t);

        /* A zeroed tree is documented as empty too. */
        struct avl_tree z = {0};
        ck_assert_ptr_null(avl_first(&z));
        check_u64_tree(&z);
}
END_TEST

START_TEST(test_single)
{
        struct avl_tree t;
        struct u64_item a = {.key = 42};

        avl_init(&t);
        ck_assert_ptr_null(avl_insert(&t, &a.node, &a.key, cmp_u64_item));
        check_u64_tree(&t);
        ck_assert_ptr_eq(avl_first(&t), &a.node);
        ck_assert_ptr_eq(avl_last(&t), &a.node);
        ck_assert_ptr_null(avl_next(&a.node));
        ck_assert_ptr_null(avl_prev(&a.node));

        avl_remove(&t, &a.node);
        ck_assert_ptr_null(t.root);
        ck_assert_uint_eq(t.count, 0);
        check_u64_tree(&t);

        /* A removed node can go straight back in. */
        ck_assert_ptr_null(avl_insert(&t, &a.node, &a.key, cmp_u64_item));
        check_u64_tree(&t);
        ck_assert_uint_eq(t.count, 1);
}
END_TEST

START_TEST(test_duplicate)
{
        struct avl_tree t;
        struct u64_item items[16];
        struct u64_item dup = {.key = 7};

        avl_init(&t);
        for (int i = 0; i < 16; i++) {
                items[i].key = (uint64_t)i;
                ck_assert_ptr_null(avl_insert(&t, &items[i].node, &items[i].key, cmp_u64_item));
        }

        /* Poison dup's node: a rejected insert must not have written to it. */
        memset(&dup.node, 0xa5, sizeof(dup.node));
        struct avl_node before = dup.node;

        ck_assert_ptr_eq(avl_insert(&t, &dup.node, &dup.key, cmp_u64_item), &items[7].node);
        ck_assert_uint_eq(t.count, 16);
        ck_assert_int_eq(memcmp(&before, &dup.node, sizeof(before)), 0);
        ck_assert_ptr_eq(avl_find(&t, &dup.key, cmp_u64_item), &items[7].node);
        check_u64_tree(&t);

        /* The same node again is a duplicate of itself. */
        ck_assert_ptr_eq(avl_insert(&t, &items[3].node, &items[3].key, cmp_u64_item),
                         &items[3].node);
        ck_assert_uint_eq(t.count, 16);
        check_u64_tree(&t);
}
END_TEST

START_TEST(test_bounds)
{
        enum { N = 50 };
        struct avl_tree t;
        struct u64_item items[N];
        uint64_t k;

        /* Keys 10, 20, ..., 500: every key between two present ones is absent. */
        avl_init(&t);
        for (int i = 0; i < N; i++) {
                items[i].key = (uint64_t)(i + 1) * 10;
                ck_assert_ptr_null(avl_insert(&t, &items[i].node, &items[i].key, cmp_u64_item));
        }
        check_u64_tree(&t);

        for (uint64_t q = 0; q <= 520; q++) {
                /* Expected answers straight from the arithmetic. */
                uint64_t lb = (q + 9) / 10 * 10;
                uint64_t ub = (q / 10 + 1) * 10;
                if (lb == 0)
                        lb = 10;

                struct avl_node *n = avl_lower_bound(&t, &q, cmp_u64_item);
                if (lb > 500)
                        ck_assert_ptr_null(n);
                else
                        ck_assert_uint_eq(key_of(n), lb);

                n = avl_upper_bound(&t, &q, cmp_u64_item);
                if (ub > 500)
                        ck_assert_ptr_null(n);
                else
                        ck_assert_uint_eq(key_of(n), ub);

                n = avl_find(&t, &q, cmp_u64_item);
                if (q % 10 == 0 && q >= 10 && q <= 500)
                        ck_assert_uint_eq(key_of(n), q);
                else
                        ck_assert_ptr_null(n);
        }

        /* Spot checks the loop above would also catch, spelled out. */
        k = 20;
        ck_assert_ptr_eq(avl_lower_bound(&t, &k, cmp_u64_item), &items[1].node);
        ck_assert_ptr_eq(avl_upper_bound(&t, &k, cmp_u64_item), &items[2].node);
        k = 15;
        ck_assert_ptr_eq(avl_lower_bound(&t, &k, cmp_u64_item), &items[1].node);
        ck_assert_ptr_eq(avl_upper_bound(&t, &k, cmp_u64_item), &items[1].node);
        k = 0;
        ck_assert_ptr_eq(avl_lower_bound(&t, &k, cmp_u64_item), avl_first(&t));
        k = 500;
        ck_assert_ptr_eq(avl_lower_bound(&t, &k, cmp_u64_item), avl_last(&t));
        ck_assert_ptr_null(avl_upper_bound(&t, &k, cmp_u64_item));
        k = UINT64_MAX;
        ck_assert_ptr_null(avl_lower_bound(&t, &k, cmp_u64_item));
        ck_assert_ptr_null(avl_upper_bound(&t, &k, cmp_u64_item));
}
END_TEST

START_TEST(test_iterate)
{
        enum { N = 1000 };
        struct avl_tree t;
        static struct u64_item items[N];
        uint64_t state = 0x1234;

        /* Insert a shuffled permutation so the shape is not a sequential one. */
        avl_init(&t);
        for (int i = 0; i < N; i++)
                items[i].key = (uint64_t)i;
        for (int i = N - 1; i > 0; i--) {
                int j = (int)(rng_next(&state) % (uint64_t)(i + 1));
                uint64_t tmp = items[i].key;
                items[i].key = items[j].key;
                items[j].key = tmp;
        }
        for (int i = 0; i < N; i++)
                ck_assert_ptr_null(avl_insert(&t, &items[i].node, &items[i].key, cmp_u64_item));
        check_u64_tree(&t);

        uint64_t expect = 0;
        for (struct avl_node *n = avl_first(&t); n; n = avl_next(n))
                ck_assert_uint_eq(key_of(n), expect++);
        ck_assert_uint_eq(expect, N);

        for (struct avl_node *n = avl_last(&t); n; n = avl_prev(n))
                ck_assert_uint_eq(key_of(n), --expect);
        ck_assert_uint_eq(expect, 0);

        /* Walking from the middle in both directions. */
        uint64_t mid = N / 2;
        struct avl_node *m = avl_find(&t, &mid, cmp_u64_item);
        ck_assert_uint_eq(key_of(avl_next(m)), mid + 1);
        ck_assert_uint_eq(key_of(avl_prev(m)), mid - 1);
        ck_assert_ptr_eq(avl_prev(avl_next(m)), m);
        ck_assert_ptr_eq(avl_next(avl_prev(m)), m);
        ck_assert_ptr_null(avl_next(avl_last(&t)));
        ck_assert_ptr_null(avl_prev(avl_first(&t)));
}
END_TEST

START_TEST(test_remove_while_iterating)
{
        enum { N = 1000 };
        struct avl_tree t;
        static struct u64_item items[N];

        avl_init(&t);
        for (int i = 0; i < N; i++) {
                items[i].key = (uint64_t)i;
                expect(!avl_insert(&t, &items[i].node, &items[i].key, cmp_u64_item), "key %d", i);
        }

        /* Drop every multiple of 3 during one forward pass. */
        size_t visited = 0;
        for (struct avl_node *n = avl_first(&t), *next; n; n = next) {
                next = avl_next(n);
                visited++;
                if (key_of(n) % 3 == 0)
                        avl_remove(&t, n);
        }
        ck_assert_uint_eq(visited, N);
        ck_assert_uint_eq(t.count, N - (N + 2) / 3);
        check_u64_tree(&t);
        for (struct avl_node *n = avl_first(&t); n; n = avl_next(n))
                ck_assert_uint_ne(key_of(n) % 3, 0);

        /* Same backwards with avl_prev, dropping odd keys. */
        visited = 0;
        for (struct avl_node *n = avl_last(&t), *prev; n; n = prev) {
                prev = avl_prev(n);
                visited++;
                if (key_of(n) % 2 == 1)
                        avl_remove(&t, n);
        }
        ck_assert_uint_eq(visited, N - (N + 2) / 3);
        check_u64_tree(&t);
        for (struct avl_node *n = avl_first(&t); n; n = avl_next(n))
                ck_assert(key_of(n) % 6 == 2 || key_of(n) % 6 == 4);

        /* And drain whatever is left. */
        for (struct avl_node *n = avl_first(&t), *next; n; n = next) {
                next = avl_next(n);
                avl_remove(&t, n);
        }
        ck_assert_ptr_null(t.root);
        ck_assert_uint_eq(t.count, 0);
}
END_TEST

START_TEST(test_sequential_height)
{
        enum { N = 1 << 16 };
        struct avl_tree t;
        struct u64_item *items = calloc(N, sizeof(*items));
        ck_assert_ptr_nonnull(items);

        /*
         * Ascending and descending inserts degenerate an unbalanced tree
         * into a list; here the height must stay within the AVL bound,
         * 1.44 log2(n + 2), i.e. 23 for 65536 nodes.
         */
        for (int pass = 0; pass < 2; pass++) {
                avl_init(&t);
                for (int i = 0; i < N; i++) {
                        items[i].key = pass == 0 ? (uint64_t)i : (uint64_t)(N - i);
                        expect(!avl_insert(&t, &items[i].node, &items[i].key, cmp_u64_item), "i %d",
                               i);
                }
                int h = check_u64_tree(&t);
                ck_assert_int_le(h, 23);
                ck_assert_int_ge(h, 17);

                /* Removing from one end is the removal-side worst case. */
                for (int i = 0; i < N / 2; i++)
                        avl_remove(&t, avl_first(&t));
                check_u64_tree(&t);
                ck_assert_uint_eq(t.count, N / 2);
        }
        free(items);
}
END_TEST

/* Reference answer for lower (strict = false) or upper (strict = true) bound. */
static long ref_bound(const bool *present, long nkeys, long q, bool strict)
{
        for (long k = strict ? q + 1 : q; k < nkeys; k++)
                if (present[k])
                        return k;
        return -1;
}

START_TEST(test_random)
{
        enum { NKEYS = 4096, OPS = 100000, CHECK_EVERY = 500 };
        struct avl_tree t;
        struct u64_item *items = calloc(NKEYS, sizeof(*items));
        bool *present = calloc(NKEYS, sizeof(*present));
        size_t ref_count = 0;
        uint64_t state = 0xd1ce5eed;
        ck_assert_ptr_nonnull(items);
        ck_assert_ptr_nonnull(present);

        avl_init(&t);
        for (long k = 0; k < NKEYS; k++)
                items[k].key = (uint64_t)k;

        for (long op = 0; op < OPS; op++) {
                /*
                 * Phases bias the mix toward growth, then shrinkage, then
                 * balance, so the tree is exercised both nearly full and
                 * nearly empty rather than hovering at one size.
                 */
                unsigned insert_pct = (op / 20000) % 3 == 0 ? 75 : (op / 20000) % 3 == 1 ? 25 : 50;
                uint64_t r = rng_next(&state);
                long k = (long)(r % NKEYS);
                unsigned what = (unsigned)((r >> 32) % 100);

                if (what < insert_pct) {
                        struct avl_node *dup;
                        if (present[k]) {
                                /* Insert a stand-in so the existing node stays put. */
                                struct u64_item other = {.key = (uint64_t)k};
                                dup = avl_insert(&t, &other.node, &other.key, cmp_u64_item);
                                expect(dup == &items[k].node, "op %ld key %ld", op, k);
                        } else {
                                dup = avl_insert(&t, &items[k].node, &items[k].key, cmp_u64_item);
                                expect(!dup, "op %ld key %ld", op, k);
                                present[k] = true;
                                ref_count++;
                        }
                } else {
                        uint64_t key = (uint64_t)k;
                        struct avl_node *n = avl_find(&t, &key, cmp_u64_item);
                        if (present[k]) {
                                expect(n == &items[k].node, "op %ld key %ld", op, k);
                                avl_remove(&t, n);
                                present[k] = false;
                                ref_count--;
                        } else {
                                expect(!n, "op %ld key %ld", op, k);
                        }
                }
                expect(t.count == ref_count, "op %ld: %zu != %zu", op, t.count, ref_count);

                /* Query another random key every op; NKEYS itself is past every key. */
                long q = (long)(rng_next(&state) % (NKEYS + 1));
                uint64_t qk = (uint64_t)q;
                struct avl_node *n = avl_find(&t, &qk, cmp_u64_item);
                expect(q < NKEYS && present[q] ? n == &items[q].node : n == NULL, "op %ld q %ld",
                       op, q);
                long lb = ref_bound(present, NKEYS, q, false);
                long ub = ref_bound(present, NKEYS, q, true);
                n = avl_lower_bound(&t, &qk, cmp_u64_item);
                expect(n == (lb < 0 ? NULL : &items[lb].node), "op %ld q %ld", op, q);
                n = avl_upper_bound(&t, &qk, cmp_u64_item);
                expect(n == (ub < 0 ? NULL : &items[ub].node), "op %ld q %ld", op, q);

                if (op % CHECK_EVERY == 0 || op == OPS - 1) {
                        check_u64_tree(&t);
                        /* Iteration yields exactly the present keys, in order. */
                        n = avl_first(&t);
                        for (long k2 = 0; k2 < NKEYS; k2++) {
                                if (!present[k2])
                                        continue;
                                expect(n == &items[k2].node, "op %ld key %ld", op, k2);
                                n = avl_next(n);
                        }
                        expect(!n, "op %ld: extra node", op);
                }
        }

        free(present);
        free(items);
}
END_TEST

START_TEST(test_string_prefix)
{
        /*
         * '.' (0x2e) sorts just before '/' (0x2f) and '0' (0x30) just after,
         * so "a/b.x" and "a/b0" sit right outside the "a/b/" range and catch
         * a scan that starts or stops one node off.
         */
        static const char *names[] = {
                "a/b",  "a/b.x", "a/b/", "a/b/c", "a/b/d/e", "a/b/z",  "a/b0",
                "a/bc", "a/c/x", "a",    "b",     "",        "a/b/c/", "z/a/b/",
        };
        enum { N = N_ELEMS(names) };
        struct str_item items[N];
        struct avl_tree t;

        avl_init(&t);
        for (int i = 0; i < N; i++) {
                items[i].name = names[i];
                ck_assert_ptr_null(avl_insert(&t, &items[i].node, names[i], cmp_str_item));
        }
        check_tree(&t, cmp_str_item, str_key);

        static const char *const want[] = {"a/b/", "a/b/c", "a/b/c/", "a/b/d/e", "a/b/z"};
        const char *prefix = "a/b/";
        size_t len = strlen(prefix), got = 0;
        for (struct avl_node *n = avl_lower_bound(&t, prefix, cmp_str_item);
             n && strncmp(name_of(n), prefix, len) == 0; n = avl_next(n)) {
                ck_assert_uint_lt(got, N_ELEMS(want));
                ck_assert_str_eq(name_of(n), want[got]);
                got++;
        }
        ck_assert_uint_eq(got, N_ELEMS(want));

        /* Without the exact-prefix entry the scan starts at the next name. */
        struct avl_node *exact = avl_find(&t, "a/b/", cmp_str_item);
        ck_assert_ptr_nonnull(exact);
        avl_remove(&t, exact);
        check_tree(&t, cmp_str_item, str_key);
        struct avl_node *n = avl_lower_bound(&t, prefix, cmp_str_item);
        ck_assert_str_eq(name_of(n), "a/b/c");
        ck_assert_str_eq(name_of(avl_prev(n)), "a/b.x");

        /* Upper bound of the prefix skips names equal to it only. */
        ck_assert_str_eq(name_of(avl_upper_bound(&t, "a/b/c", cmp_str_item)), "a/b/c/");
        ck_assert_str_eq(name_of(avl_upper_bound(&t, "a/b/zz", cmp_str_item)), "a/b0");

        /* A prefix matching nothing yields an empty scan. */
        n = avl_lower_bound(&t, "a/q/", cmp_str_item);
        ck_assert(n == NULL || strncmp(name_of(n), "a/q/", 4) != 0);
        ck_assert_str_eq(name_of(n), "b");

        /* Prefix past every name, and the empty prefix that matches all. */
        ck_assert_ptr_null(avl_lower_bound(&t, "zz", cmp_str_item));
        ck_assert_str_eq(name_of(avl_lower_bound(&t, "", cmp_str_item)), "");
        ck_assert_str_eq(name_of(avl_upper_bound(&t, "", cmp_str_item)), "a");
}
END_TEST

Suite *avl_suite(void)
{
        Suite *s = suite_create("avl");
        TCase *tc = tcase_create("core");

        /* The randomized test runs its checker ~200 times; give ASan room. */
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_cmp_u64);
        tcase_add_test(tc, test_empty);
        tcase_add_test(tc, test_single);
        tcase_add_test(tc, test_duplicate);
        tcase_add_test(tc, test_bounds);
        tcase_add_test(tc, test_iterate);
        tcase_add_test(tc, test_remove_while_iterating);
        tcase_add_test(tc, test_sequential_height);
        tcase_add_test(tc, test_string_prefix);
        tcase_add_test(tc, test_random);
        suite_add_tcase(s, tc);
        return s;
}
