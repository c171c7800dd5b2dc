/* SPDX-License-Identifier: MIT */
/*
 * Groups across hosts, on loopback. What the README and dlx.h promise a
 * user of host B when host A exports a group:
 *  - "@a/NAME" is acquired on B with dlx_acquire_group(), as at A: every
 *    member, its name, dtype, shape, strides and bytes, tied members still
 *    tied, and A's version number;
 *  - it comes as one transfer (one lease at A, one pull at B), and a
 *    consumer on B sees every member of one version or none of it;
 *  - a group made with dlx_group_alloc() lands in place, without a copy;
 *  - followed, a group is mirrored as it changes;
 *  - a peer that speaks an older protocol hears, at once, that groups need
 *    protocol 1.2.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fedhosts.h"

/*
 * A dlx_group_alloc() group on A: w f32 [64, 128], b i8 [7], e f32 [0]; bytes
 * of w and b: v. Persistent: it stays when its producer goes.
 */
static void publish_alloc_group(dlx_client *pa, const char *name, int v, uint64_t *ret_version)
{
        static const int64_t ws[] = {64, 128}, bs[] = {7}, es[] = {0};
        const struct dlx_member_layout ls[] = {
                {"w", {kDLFloat, 32, 1}, 2, ws},
                {"b", {kDLInt, 8, 1}, 1, bs},
                {"e", {kDLFloat, 32, 1}, 1, es},
        };
        dlx_group *g;

        DLXV(dlx_group_alloc(pa, ls, 3, &g));
        for (size_t i = 0; i < dlx_group_count(g); i++) {
                const DLTensor *t = dlx_group_tensor(g, i);
                size_t n = (size_t)(t->dtype.bits / 8);
                for (int d = 0; d < t->ndim; d++)
                        n *= (size_t)t->shape[d];
                memset((uint8_t *)t->data + t->byte_offset, v, n);
        }
        struct dlx_publish_options o = {.persist = true};
        DLXV(dlx_group_publish(pa, name, g, &o, ret_version));
        dlx_group_release(g);
}

/* Every member of g (on B) and of its origin's (on A) holds the same. */
static void expect_same_group(dlx_group *there, dlx_group *here)
{
        ck_assert_uint_eq(dlx_group_count(there), dlx_group_count(here));
        ck_assert_uint_eq(dlx_group_version(there), dlx_group_version(here));
        for (size_t i = 0; i < dlx_group_count(here); i++) {
                ck_assert_str_eq(dlx_group_name(there, i), dlx_group_name(here, i));
                expect_same(dlx_group_tensor(here, i), dlx_group_tensor(there, i),
                            dlx_group_name(here, i));
        }
}

static dlx_group *group_at(dlx_client *c, const char *name, uint64_t min_version, int *ret_err)
{
        struct dlx_acquire_options o = {.min_version = min_version,
                                        .timeout_ms = 15000 * fx_slowdown()};
        dlx_group *g = NULL;

        *ret_err = dlx_acquire_group(c, name, NULL, 0, &o, &g);
        return g;
}

START_TEST(a_group_crosses_as_one_transfer)
{
        dlx_client *pa, *pb;
        dlx_group *here, *there;
        struct dlx_info in;
        uint64_t v;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_alloc_group(pa, "model/g", 5, &v);
        there = group_at(pb, "@a/model/g", 0, &err);
        ck_assert_msg(err == 0, "%s (%s)", dlx_strerror(err), dlx_last_error());
        here = group_at(pa, "model/g", 0, &err);
        DLXV(err);
        ck_assert_uint_eq(dlx_group_version(there), v);
        expect_same_group(there, here);
        DLXV(dlx_stat(pb, "@a/model/g", &in));
        ck_assert_uint_eq(in.members, 3);
        ck_assert_msg(strstr(in.origin, "ucx tcp/lo") && strstr(in.origin, " a v1"), "origin '%s'",
                      in.origin);
        /* one lease at A, one pull at B, into the group itself */
        ck_assert_int_eq(log_count(&A, ", a group)"), 1);
        ck_assert_int_eq(log_count(&B, "@a/model/g v1: a group of 3"), 1);
        ck_assert_int_eq(log_count(&B, "in place"), 1);
        /* a member taken from it outlives the group's handle, and is read-only */
        DLManagedTensorVersioned *w;
        DLXV(dlx_group_take(there, (size_t)dlx_group_find(there, "w"), &w));
        dlx_group_release(there);
        dlx_group_release(here);
        ck_assert(w->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert_uint_eq(((const uint8_t *)w->dl_tensor.data)[100], 5);
        w->deleter(w);
        /* min_version means the same: v2 is waited for at the origin */
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                dlx_client *p = fx_connect(&A.d, "later");
                fx_sleep_ms(300);
                publish_alloc_group(p, "model/g", 6, NULL);
                dlx_close(p);
                fx_child_exit(0);
        }
        there = group_at(pb, "@a/model/g", 2, &err);
        ck_assert_msg(err == 0, "%s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(fx_wait(child), 0);
        ck_assert_uint_eq(dlx_group_version(there), 2);
        ck_assert_uint_eq(((const uint8_t *)dlx_group_tensor(there, 0)->data)[0], 6);
        dlx_group_release(there);
        /* a group is not a tensor, on B as on A */
        DLManagedTensorVersioned *t = acquire_at(pb, "@a/model/g", 0, 0, &err);
        ck_assert_ptr_null(t);
        ck_assert_int_eq(err, -EISDIR);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/* A tensor from raw_new() whose bytes are another's: only its shell goes. */
static void shell_deleter(DLManagedTensorVersioned *t)
{
        free(t->manager_ctx);
}

/*
 * A group published from tensors of the producer's (dlx_publish_group()):
 * strided, offset, tied members. B gets each as A has it, tied ones tied.
 */
START_TEST(any_layout_crosses_and_tied_members_stay_tied)
{
        static const int64_t s2[] = {64, 48}, st[] = {1, 48}, s1[] = {3000}, s0[] = {0};
        dlx_client *pa, *pb;
        dlx_group *here, *there;
        struct dlx_member m[5];
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        /* "t" is "w" transposed: one buffer, two members */
        DLManagedTensorVersioned *w =
                raw_new((DLDataType){kDLFloat, 32, 1}, 2, s2, NULL, 64 * 48 * 4, 0);
        DLManagedTensorVersioned *t = raw_new((DLDataType){kDLFloat, 32, 1}, 2, s2, st, 0, 0);
        free(t->dl_tensor.data);
        t->dl_tensor.data = w->dl_tensor.data;
        t->dl_tensor.shape[0] = 48;
        t->dl_tensor.shape[1] = 64;
        /* t holds nothing of its own: w's bytes go with w */
        t->deleter = shell_deleter;
        m[0] = (struct dlx_member){"w", w};
        m[1] = (struct dlx_member){"t", t};
        m[2] = (struct dlx_member){"off",
                                   raw_new((DLDataType){kDLUInt, 16, 1}, 1, s1, NULL, 6016, 16)};
        m[3] = (struct dlx_member){"e", raw_new((DLDataType){kDLFloat, 64, 1}, 1, s0, NULL, 0, 0)};
        m[4] = (struct dlx_member){"c", raw_new((DLDataType){kDLComplex, 64, 1}, 1,
                                                (const int64_t[]){5}, NULL, 40, 0)};
        DLXV(dlx_publish_group(pa, "model/mix", m, 5, NULL, NULL));
        there = group_at(pb, "@a/model/mix", 0, &err);
        ck_assert_msg(err == 0, "%s (%s)", dlx_strerror(err), dlx_last_error());
        here = group_at(pa, "model/mix", 0, &err);
        DLXV(err);
        expect_same_group(there, here);
        const DLTensor *tw = dlx_group_tensor(there, (size_t)dlx_group_find(there, "w"));
        const DLTensor *tt = dlx_group_tensor(there, (size_t)dlx_group_find(there, "t"));
        ck_assert_ptr_eq((uint8_t *)tw->data + tw->byte_offset,
                         (uint8_t *)tt->data + tt->byte_offset);
        ck_assert_int_eq(log_count(&A, ", a group)"), 1);
        ck_assert_int_eq(log_count(&B, "@a/model/mix v1: a group of 5"), 1);
        dlx_group_release(there);
        dlx_group_release(here);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * "a consumer sees every member of version N or none of it", across hosts:
 * A replaces a group 59 times in about a second, each version's bytes all
 * its number; every group B acquires is one version, whole.
 */
START_TEST(a_group_stays_atomic_across_hosts)
{
        dlx_client *pa, *pb;
        int err, seen = 0;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_alloc_group(pa, "model/g", 1, NULL);
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                dlx_client *p = fx_connect(&A.d, "replacer");
                for (int v = 2; v <= 60; v++) {
                        publish_alloc_group(p, "model/g", v, NULL);
                        fx_sleep_ms(v % 3 ? 0 : 20);
                }
                dlx_close(p);
                fx_child_exit(0);
        }
        for (uint64_t want = 1; want < 60;) {
                dlx_group *g = group_at(pb, "@a/model/g", want, &err);
                ck_assert_msg(err == 0, "v%llu+: %s (%s)", (unsigned long long)want,
                              dlx_strerror(err), dlx_last_error());
                uint64_t v = dlx_group_version(g);
                for (size_t i = 0; i < dlx_group_count(g); i++) {
                        const DLTensor *t = dlx_group_tensor(g, i);
                        if (t->shape[0] == 0)
                                continue;
                        const uint8_t *p = (const uint8_t *)t->data + t->byte_offset;
                        ck_assert_msg(p[0] == (uint8_t)v && p[6] == (uint8_t)v,
                                      "v%llu: member %s holds %u", (unsigned long long)v,
                                      dlx_group_name(g, i), p[0]);
                }
                dlx_group_release(g);
                seen++;
                want = v + 1;
        }
        ck_assert_int_eq(fx_wait(child), 0);
        ck_assert_int_gt(seen, 1);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * A group of 4,000 members: its Describe is far over UCX's eager size, and
 * must still go as one message (control messages never go by rendezvous).
 */
START_TEST(a_group_of_many_members_crosses)
{
        enum { N = 4000 };
        static int64_t shape[] = {3};
        struct dlx_member_layout *ls = calloc(N, sizeof(*ls));
        char(*names)[48] = calloc(N, sizeof(*names));
        dlx_client *pa, *pb;
        dlx_group *g;
        int err;

        ck_assert(ls && names);
        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < N; i++) {
                snprintf(names[i], sizeof(names[i]), "layers.%d.attention.weight", i);
                ls[i] = (struct dlx_member_layout){names[i], {kDLFloat, 32, 1}, 1, shape};
        }
        DLXV(dlx_group_alloc(pa, ls, N, &g));
        for (size_t i = 0; i < N; i++)
                ((float *)dlx_group_tensor(g, i)->data)[2] = (float)i;
        DLXV(dlx_group_publish(pa, "model/big", g, NULL, NULL));
        dlx_group_release(g);
        g = group_at(pb, "@a/model/big", 0, &err);
        ck_assert_msg(err == 0, "%s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_uint_eq(dlx_group_count(g), N);
        int64_t at = dlx_group_find(g, "layers.3999.attention.weight");
        ck_assert_int_ge(at, 0);
        ck_assert(((const float *)dlx_group_tensor(g, (size_t)at)->data)[2] == (float)at);
        dlx_group_release(g);
        free(ls);
        free(names);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(a_followed_group_is_mirrored_as_it_changes)
{
        const char *a_args[] = {"--export", "model/", NULL};
        const char *b_args[] = {"--follow", "@a/model/", NULL};
        dlx_client *pa, *pb;
        struct dlx_info in;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "looker-b");
        publish_alloc_group(pa, "model/g", 1, NULL);
        pair_up(a_args, b_args);
        in = wait_for(pb, "@a/model/g", 1);
        ck_assert_uint_eq(in.members, 3);
        ck_assert_uint_eq(in.leases, 0); /* nobody acquired it: it came by the follow */
        publish_alloc_group(pa, "model/g", 2, NULL);
        wait_for(pb, "@a/model/g", 2);
        /* a tensor becomes a group, and a group a tensor */
        publish_ok(pa, "model/t", fx_vec_f32(pa, 8, 1), NULL, NULL);
        wait_for(pb, "@a/model/t", 1);
        publish_alloc_group(pa, "model/t", 2, NULL);
        in = wait_for(pb, "@a/model/t", 2);
        ck_assert_uint_eq(in.members, 3);
        DLXV(dlx_unpublish(pa, "model/g"));
        wait_for(pb, "@a/model/g", 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * A bridge that speaks protocol 1.1 (DLXFED_TEST_CLAIM) is told, at once,
 * that groups cross from 1.2: the acquire fails with -ENOTSUP, naming the
 * peer and the protocol, and waits for nothing.
 */
START_TEST(an_older_peer_hears_that_groups_need_1_2)
{
        const char *a_args[] = {"--export", "model/", "--allow-ucx-mismatch", NULL};
        const char *b_args[] = {"--allow-ucx-mismatch", NULL};
        dlx_client *pa, *pb;
        dlx_group *g;
        int err;

        hosts_up();
        set_peers();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_alloc_group(pa, "model/g", 1, NULL);
        setenv("DLXFED_TEST_CLAIM", "1.1 1.0.0", 1);
        pair_up(a_args, b_args);
        unsetenv("DLXFED_TEST_CLAIM");
        g = group_at(pb, "@a/model/g", 0, &err);
        ck_assert_ptr_null(g);
        ck_assert_msg(err == -ENOTSUP && strstr(dlx_last_error(), "protocol 1.2") &&
                              strstr(dlx_last_error(), " on a "),
                      "%s (%s)", dlx_strerror(err), dlx_last_error());
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

Suite *federation_groups_suite(void)
{
        Suite *s = suite_create("federation-groups");
        TCase *tc = tcase_create("loopback");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, a_group_crosses_as_one_transfer);
        tcase_add_test(tc, any_layout_crosses_and_tied_members_stay_tied);
        tcase_add_test(tc, a_group_stays_atomic_across_hosts);
        tcase_add_test(tc, a_group_of_many_members_crosses);
        tcase_add_test(tc, a_followed_group_is_mirrored_as_it_changes);
        tcase_add_test(tc, an_older_peer_hears_that_groups_need_1_2);
        suite_add_tcase(s, tc);
        return s;
}
