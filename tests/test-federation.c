/* SPDX-License-Identifier: MIT */
/*
 * Federation on loopback: two hosts, each a dlxd and a dlxfed, UCX over TCP
 * on lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo, always pinned). What the README
 * and dlxfed --help promise a user of host B:
 *  - a name N that host A exports is acquired on B as "@a/N": its bytes,
 *    dtype, shape and strides whatever the layout, read-only, with A's
 *    version number, and an origin saying how it came;
 *  - min_version means the same on both hosts; a version not there yet is
 *    waited for at the origin;
 *  - what A does not export is refused, naming the peer; so is a peer
 *    without the shared secret, or off the allow-list;
 *  - a peer that dies takes its mirrors with it (leased copies stay
 *    readable), and its waiters hear which peer went; an importer that
 *    dies leaves the exporter holding nothing;
 *  - both bridges stop cleanly on SIGTERM.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fedhosts.h"

START_TEST(every_dtype_and_layout_crosses)
{
        static const struct {
                const char *name;
                DLDataType dt;
                int ndim;
                int64_t shape[3], strides[3];
                bool strided;
                uint64_t byte_offset;
                size_t nbytes;
        } rows[] = {
                {"model/f32", {kDLFloat, 32, 1}, 2, {3, 5}, {0}, false, 0, 60},
                {"model/f64-t", {kDLFloat, 64, 1}, 2, {4, 3}, {1, 4}, true, 0, 96},
                {"model/i8-3d", {kDLInt, 8, 1}, 3, {2, 3, 4}, {0}, false, 0, 24},
                {"model/u16-off", {kDLUInt, 16, 1}, 1, {5}, {0}, false, 6, 16},
                {"model/bf16", {kDLBfloat, 16, 1}, 1, {7}, {0}, false, 0, 14},
                {"model/bool", {kDLBool, 8, 1}, 1, {9}, {0}, false, 0, 9},
                {"model/c64-step", {kDLComplex, 64, 1}, 1, {4}, {2}, true, 8, 72},
                {"model/fp8", {kDLFloat8_e4m3fn, 8, 1}, 2, {2, 2}, {0}, false, 0, 4},
                {"model/scalar", {kDLFloat, 32, 1}, 0, {0}, {0}, false, 0, 4},
                {"model/empty", {kDLFloat, 32, 1}, 2, {0, 3}, {0}, false, 0, 0},
                {"model/broadcast", {kDLInt, 32, 1}, 2, {3, 4}, {0, 1}, true, 0, 16},
        };
        dlx_client *pa, *pb;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
                DLManagedTensorVersioned *src = raw_new(rows[i].dt, rows[i].ndim, rows[i].shape,
                                                        rows[i].strided ? rows[i].strides : NULL,
                                                        rows[i].nbytes, rows[i].byte_offset);
                DLManagedTensorVersioned *here, *there;
                char remote[128];
                uint64_t v, rv;
                int err;

                DLXV(dlx_publish(pa, rows[i].name, src, NULL, &v));
                here = acquire_ok(pa, rows[i].name, NULL);
                snprintf(remote, sizeof(remote), "@a/%s", rows[i].name);
                there = acquire_at(pb, remote, 0, 10000 * fx_slowdown(), &err);
                ck_assert_msg(err == 0, "%s: %s (%s)", remote, dlx_strerror(err), dlx_last_error());
                expect_same(&here->dl_tensor, &there->dl_tensor, remote);
                ck_assert(there->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
                DLXV(dlx_tensor_info(there, NULL, &rv, NULL));
                ck_assert_uint_eq(rv, v);
                struct dlx_info in;
                DLXV(dlx_stat(pb, remote, &in));
                ck_assert_msg(strstr(in.origin, "ucx tcp/lo") && strstr(in.origin, " a v1"),
                              "origin '%s'", in.origin);
                here->deleter(here);
                there->deleter(there);
        }
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(versions_mean_the_same_on_both_hosts)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        uint64_t v;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < 3; i++)
                publish_ok(pa, "model/w", fx_vec_f32(pa, 64, (float)i), NULL, &v);
        ck_assert_uint_eq(v, 3);
        t = acquire_at(pb, "@a/model/w", 2, 10000 * fx_slowdown(), &err);
        DLXV(err);
        ck_assert(fx_vec_is(t, 64, 2));
        DLXV(dlx_tensor_info(t, NULL, &v, NULL));
        ck_assert_uint_eq(v, 3);
        t->deleter(t);
        /* a version not there yet is waited for at the origin */
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                dlx_client *p = fx_connect(&A.d, "later");
                fx_sleep_ms(300);
                publish_ok(p, "model/w", fx_vec_f32(p, 64, 4), NULL, NULL);
                dlx_close(p);
                fx_child_exit(0);
        }
        t = acquire_at(pb, "@a/model/w", 4, 10000 * fx_slowdown(), &err);
        DLXV(err);
        ck_assert_int_eq(fx_wait(child), 0);
        DLXV(dlx_tensor_info(t, NULL, &v, NULL));
        ck_assert_uint_eq(v, 4);
        ck_assert(fx_vec_is(t, 64, 4));
        t->deleter(t);
        /* the mirror is a cache: an acquire of any version takes it, no pull */
        t = acquire_at(pb, "@a/model/w", 0, 0, &err);
        DLXV(err);
        t->deleter(t);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(what_is_not_exported_is_refused)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "secret/w", fx_vec_f32(pa, 8, 0), NULL, NULL);
        t = acquire_at(pb, "@a/secret/w", 0, 10000 * fx_slowdown(), &err);
        ck_assert_ptr_null(t);
        ck_assert_int_eq(err, -ENOENT);
        expect_last_error("not exported by a");
        /* writable versions are not exported */
        struct dlx_publish_options w = {.writable = true};
        publish_ok(pa, "model/rw", fx_vec_f32(pa, 8, 0), &w, NULL);
        t = acquire_at(pb, "@a/model/rw", 0, 10000 * fx_slowdown(), &err);
        ck_assert_int_eq(err, -ENOTSUP);
        expect_last_error("read-only");
        /* nothing was mirrored */
        struct dlx_info in;
        ck_assert_int_eq(dlx_stat(pb, "@a/secret/w", &in), -ENOENT);
        ck_assert_int_eq(dlx_stat(pb, "@a/model/rw", &in), -ENOENT);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(a_peer_without_the_secret_gets_nothing)
{
        const char *a_args[] = {"--export", "model/", "--allow", "127.0.0.1", NULL};
        const char *b_args[] = {"--peer", peer_a, NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        set_peers();
        ck_assert_int_eq(fed_start(&A, "a", "the secret of host a's cluster", a_args), 0);
        ck_assert_int_eq(fed_start(&B, "b", "another cluster's secret here", b_args), 0);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 8, 0), NULL, NULL);
        t = acquire_at(pb, "@a/model/w", 0, 10000 * fx_slowdown(), &err);
        ck_assert_ptr_null(t);
        ck_assert_msg(err == -EACCES || err == -EHOSTUNREACH, "err %d (%s)", err, dlx_last_error());
        expect_last_error("HMAC");
        struct dlx_stats st = fx_stats(pa);
        ck_assert_uint_eq(st.leases, 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(a_peer_off_the_allow_list_gets_nothing)
{
        const char *a_args[] = {"--export", "model/", "--allow", "192.0.2.0/24", NULL};
        const char *b_args[] = {"--peer", peer_a, "--pull-ms", "3000", "--wait-ms", "1000", NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        set_peers();
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, a_args), 0);
        ck_assert_int_eq(fed_start(&B, "b", FED_SECRET, b_args), 0);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 8, 0), NULL, NULL);
        t = acquire_at(pb, "@a/model/w", 0, 20000 * fx_slowdown(), &err);
        ck_assert_ptr_null(t);
        ck_assert_msg(err == -EHOSTUNREACH || err == -ETIMEDOUT, "err %d (%s)", err,
                      dlx_last_error());
        expect_last_error("peer a");
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(bad_configurations_are_refused)
{
        const char *at_export[] = {"--export", "@b/x", NULL};
        const char *bad_peer[] = {"--peer", "no-address", NULL};
        const char *bad_allow[] = {"--allow", "300.1.1.1/8", NULL};
        char secret_path[160];

        hosts_up();
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, at_export), 2);
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, bad_peer), 2);
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, bad_allow), 2);
        ck_assert_int_eq(fed_start(&A, "a@b", FED_SECRET, NULL), 2);
        /* a short secret, and one others may read */
        ck_assert_int_eq(fed_start(&A, "a", "short", NULL), 1);
        snprintf(secret_path, sizeof(secret_path), "%s/secret-a", A.d.dir);
        ck_assert_int_eq(chmod(secret_path, 0640), 0);
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, NULL), 1);
        ck_assert_int_eq(chmod(secret_path, 0600), 0);
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, NULL), 0);
        fed_stop(&A);
        hosts_down();
}
END_TEST

START_TEST(a_dead_exporter_takes_its_mirrors)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t, *held;
        struct dlx_info in;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 256, 7), NULL, NULL);
        held = acquire_at(pb, "@a/model/w", 0, 10000 * fx_slowdown(), &err);
        DLXV(err);
        fed_kill(&A);
        /* the mirror goes; the copy held stays readable */
        for (int i = 0; i < 200 && dlx_stat(pb, "@a/model/w", &in) == 0; i++)
                fx_sleep_ms(50);
        ck_assert_int_eq(dlx_stat(pb, "@a/model/w", &in), -ENOENT);
        ck_assert(fx_vec_is(held, 256, 7));
        held->deleter(held);
        /* a new want hears which peer is gone */
        t = acquire_at(pb, "@a/model/w", 0, 20000 * fx_slowdown(), &err);
        ck_assert_ptr_null(t);
        ck_assert_int_eq(err, -EHOSTUNREACH);
        expect_last_error("peer a");
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(an_importer_killed_mid_pull_leaves_the_exporter_nothing)
{
        dlx_client *pa, *pb;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_big(pa, "model/big");
        pid_t child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                dlx_client *c = fx_connect(&B.d, "doomed");
                /* its bridge dies under it: the wait ends at its timeout */
                DLManagedTensorVersioned *x = acquire_at(c, "@a/model/big", 0, 3000, &err);
                (void)x;
                fx_child_exit(0);
        }
        wait_pull_started(pa);
        fed_kill(&B);
        fx_wait(child);
        /* the exporter's lease ends with the endpoint; its bridge lives on and serves */
        ck_assert_uint_eq(fx_wait_leases(pa, 0, 20000 * fx_slowdown()), 0);
        ck_assert_int_eq(kill(A.fed, 0), 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(an_exporter_killed_mid_pull_leaves_the_importer_nothing)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        struct dlx_stats before;
        struct dlx_info in;
        int err;

        hosts_up();
        feds_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        before = fx_stats(pb);
        publish_big(pa, "model/big");
        pid_t killer = fork();
        ck_assert_int_ge(killer, 0);
        if (killer == 0) {
                dlx_client *c = fx_connect(&A.d, "killer");
                wait_pull_started(c);
                kill(A.fed, SIGKILL);
                dlx_close(c);
                fx_child_exit(0);
        }
        t = acquire_at(pb, "@a/model/big", 0, 30000 * fx_slowdown(), &err);
        ck_assert_int_eq(fx_wait(killer), 0);
        ck_assert_int_eq(waitpid(A.fed, NULL, 0), A.fed);
        A.fed = 0;
        if (err == 0) {
                /* the pull won the race: the whole of it, then */
                ck_assert_uint_eq(t->dl_tensor.shape[0], (fx_slowdown() > 1 ? 256 : 1024) << 20);
                t->deleter(t);
        } else {
                ck_assert_int_eq(err, -EHOSTUNREACH);
                expect_last_error("peer a");
        }
        /*
         * Nothing of a half pull stays: no mirror, and no bytes but the one
         * empty segment a client keeps for reuse (dlx.h, dlx_alloc).
         */
        for (int i = 0; i < 200 && dlx_stat(pb, "@a/model/big", &in) == 0; i++)
                fx_sleep_ms(50);
        ck_assert_int_eq(dlx_stat(pb, "@a/model/big", &in), -ENOENT);
        uint64_t big = (uint64_t)(fx_slowdown() > 1 ? 256 : 1024) << 20;
        for (int i = 0; i < 200 && fx_stats(pb).bytes > before.bytes + big + (1u << 20); i++)
                fx_sleep_ms(50);
        ck_assert_uint_le(fx_stats(pb).bytes, before.bytes + big + (1u << 20));
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * B's bridge claims versions of its own (DLXFED_TEST_CLAIM) to A, which
 * exports model/; extra (may be NULL) goes to both.
 */
static void pair_claiming(const char *claim, const char *extra)
{
        const char *a_args[] = {"--export", "model/", "--peer", peer_b, extra, NULL};
        const char *b_args[] = {"--peer", peer_a, extra, NULL};

        set_peers();
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, a_args), 0);
        setenv("DLXFED_TEST_CLAIM", claim, 1);
        ck_assert_int_eq(fed_start(&B, "b", FED_SECRET, b_args), 0);
        unsetenv("DLXFED_TEST_CLAIM");
}

/* The acquire of @a/model/w on B: 0, or its error with its message in why. */
static int acquire_w(dlx_client *pb, char *why, size_t len)
{
        DLManagedTensorVersioned *t;
        int err;

        t = acquire_at(pb, "@a/model/w", 0, 10000 * fx_slowdown(), &err);
        snprintf(why, len, "%s", err ? dlx_last_error() : "");
        if (t)
                t->deleter(t);
        return err;
}

/*
 * README: "A peer of another UCX minor version is refused
 * (--allow-ucx-mismatch overrides)"; fed.proto: "a peer of another major is
 * refused". B claims UCX 1.0.0, then protocol 2.0: they are refused, and
 * B's consumer hears why, at once; with --allow-ucx-mismatch (on both) the
 * UCX minor passes, another protocol major never does.
 */
START_TEST(another_version_is_refused)
{
        static const struct {
                const char *claim, *extra, *expect;
        } cases[] = {
                {"1.1 1.0.0", NULL, "minors must match"},
                {"2.0 1.0.0", "--allow-ucx-mismatch", "protocol 2"},
                {"1.1 1.0.0", "--allow-ucx-mismatch", NULL},
        };
        char why[300];

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                dlx_client *pa, *pb;
                int err;

                hosts_up();
                pair_claiming(cases[i].claim, cases[i].extra);
                pa = fx_connect(&A.d, "producer-a");
                pb = fx_connect(&B.d, "consumer-b");
                publish_ok(pa, "model/w", fx_vec_f32(pa, 8, 0), NULL, NULL);
                err = acquire_w(pb, why, sizeof(why));
                if (cases[i].expect)
                        ck_assert_msg(err == -EHOSTUNREACH && strstr(why, cases[i].expect),
                                      "claim %s: %s (%s)", cases[i].claim, dlx_strerror(err), why);
                else
                        ck_assert_msg(err == 0, "claim %s with --allow-ucx-mismatch: %s (%s)",
                                      cases[i].claim, dlx_strerror(err), why);
                dlx_close(pb);
                dlx_close(pa);
                hosts_down();
        }
}
END_TEST

/*
 * dlxfed --help: "--require-rdma  refuse a peer reached without RDMA (UCX's
 * software-emulated RMA over TCP, say)". On loopback (tcp/lo) a bridge that
 * requires RDMA, on either side, pulls nothing, and the consumer hears why
 * at once, naming the transport.
 */
START_TEST(a_bridge_that_requires_rdma_refuses_tcp)
{
        const char *rdma[] = {"--require-rdma", NULL};
        const char *exp[] = {"--export", "model/", NULL};
        const char *exp_rdma[] = {"--export", "model/", "--require-rdma", NULL};
        char why[300];

        for (int side = 0; side < 2; side++) {
                dlx_client *pa, *pb;
                int err;

                hosts_up();
                pair_up(side ? exp_rdma : exp, side ? NULL : rdma);
                pa = fx_connect(&A.d, "producer-a");
                pb = fx_connect(&B.d, "consumer-b");
                publish_ok(pa, "model/w", fx_vec_f32(pa, 8, 0), NULL, NULL);
                err = acquire_w(pb, why, sizeof(why));
                ck_assert_msg(
                        err == -EHOSTUNREACH && strstr(why, "not RDMA") && strstr(why, "tcp/lo"),
                        "%s requiring RDMA: %s (%s)", side ? "A" : "B", dlx_strerror(err), why);
                ck_assert_int_ge(log_count(side ? &A : &B, "--require-rdma"), 1);
                dlx_close(pb);
                dlx_close(pa);
                hosts_down();
        }
}
END_TEST

Suite *federation_suite(void)
{
        Suite *s = suite_create("federation");
        TCase *tc = tcase_create("loopback");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, every_dtype_and_layout_crosses);
        tcase_add_test(tc, versions_mean_the_same_on_both_hosts);
        tcase_add_test(tc, what_is_not_exported_is_refused);
        tcase_add_test(tc, a_peer_without_the_secret_gets_nothing);
        tcase_add_test(tc, a_peer_off_the_allow_list_gets_nothing);
        tcase_add_test(tc, bad_configurations_are_refused);
        tcase_add_test(tc, another_version_is_refused);
        tcase_add_test(tc, a_bridge_that_requires_rdma_refuses_tcp);
        tcase_add_test(tc, a_dead_exporter_takes_its_mirrors);
        tcase_add_test(tc, an_importer_killed_mid_pull_leaves_the_exporter_nothing);
        tcase_add_test(tc, an_exporter_killed_mid_pull_leaves_the_importer_nothing);
        suite_add_tcase(s, tc);
        return s;
}
