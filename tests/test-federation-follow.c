/* SPDX-License-Identifier: MIT */
/*
 * dlxfed --follow @ALIAS/PREFIX on loopback: what the README and
 * dlxfed --help promise a user of host B that follows a prefix of host A:
 *  - what A exports under it is mirrored on B without anyone acquiring it:
 *    what is there when following begins, then each new version;
 *  - a name A unpublishes goes from B too (copies held stay readable);
 *  - nothing A does not export comes, and a follow of such a prefix is
 *    refused, loudly, in B's log;
 *  - a follow that cannot reach its peer yet asks again until it can.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fedhosts.h"

/* A exports model/ to b; B follows follow (its alias's peer is A). */
static void follow_up(const char *follow)
{
        const char *a_args[] = {"--export", "model/", NULL};
        const char *b_args[] = {"--follow", follow, NULL};

        pair_up(a_args, b_args);
}

START_TEST(a_followed_prefix_is_mirrored_as_it_changes)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *held;
        struct dlx_acquire_options now = {.timeout_ms = 0};
        struct dlx_info in;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "looker-b");
        /* there before following begins; and a name A does not export */
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        publish_ok(pa, "secret/k", fx_vec_f32(pa, 64, 1), NULL, NULL);
        follow_up("@a/");
        in = wait_for(pb, "@a/model/w", 1);
        ck_assert_msg(strstr(in.origin, "\xe2\x86\x90 a v1") != NULL, "origin '%s'", in.origin);
        /* nobody acquired it: it came by the follow */
        ck_assert_uint_eq(in.leases, 0);

        /* a new version, a new name */
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 2), NULL, NULL);
        publish_ok(pa, "model/b", fx_vec_f32(pa, 16, 7), NULL, NULL);
        wait_for(pb, "@a/model/w", 2);
        wait_for(pb, "@a/model/b", 1);
        DLXV(dlx_acquire(pb, "@a/model/w", &now, &held));
        ck_assert(fx_vec_is(held, 64, 2));
        /* small ones came with their news: B asked A for neither */
        ck_assert_int_eq(log_count(&B, "@a/model/w v2: 256 bytes from a, with its news"), 1);
        ck_assert_int_eq(log_count(&B, "@a/model/b v1: 64 bytes from a, with its news"), 1);
        /* a big one is asked for, and comes the same */
        publish_ok(pa, "model/big", fx_vec_f32(pa, 8192, 3), NULL, NULL);
        wait_for(pb, "@a/model/big", 1);
        ck_assert_int_eq(log_count(&B, "@a/model/big v1: 32768 bytes from a"), 1);
        ck_assert_int_eq(log_count(&B, "@a/model/big v1: 32768 bytes from a, with"), 0);
        DLManagedTensorVersioned *big;
        DLXV(dlx_acquire(pb, "@a/model/big", &now, &big));
        ck_assert(fx_vec_is(big, 8192, 3));
        big->deleter(big);

        /* unpublished at A: gone from B, while the copy held stays readable */
        DLXV(dlx_unpublish(pa, "model/w"));
        wait_for(pb, "@a/model/w", 0);
        ck_assert(fx_vec_is(held, 64, 2));
        held->deleter(held);
        ck_assert_int_eq(dlx_stat(pb, "@a/secret/k", &in), -ENOENT);
        ck_assert_int_eq(log_count(&A, "secret/k"), 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(a_follow_of_what_is_not_exported_is_refused)
{
        dlx_client *pa, *pb;
        struct dlx_info in;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "looker-b");
        publish_ok(pa, "secret/k", fx_vec_f32(pa, 64, 1), NULL, NULL);
        follow_up("@a/secret/");
        for (int i = 0; i < 100 && log_count(&B, "will not let us follow") == 0; i++)
                fx_sleep_ms(50);
        ck_assert_int_eq(log_count(&B, "will not let us follow 'secret/'"), 1);
        ck_assert_int_eq(dlx_stat(pb, "@a/secret/k", &in), -ENOENT);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

START_TEST(a_follow_needs_a_peer_of_the_list)
{
        const char *unknown[] = {"--peer", peer_a, "--follow", "@zz/model/", NULL};
        const char *not_mount[] = {"--peer", peer_a, "--follow", "model/", NULL};

        hosts_up();
        set_peers();
        ck_assert_int_eq(fed_start(&B, "b", FED_SECRET, unknown), 2);
        ck_assert_int_eq(fed_start(&B, "b", FED_SECRET, not_mount), 2);
        hosts_down();
}
END_TEST

START_TEST(a_follow_asks_again_until_its_peer_is_there)
{
        const char *a_args[] = {"--export", "model/", "--peer", peer_b, NULL};
        const char *b_args[] = {"--peer", peer_a, "--follow", "@a/model/", NULL};
        dlx_client *pa, *pb;

        hosts_up();
        set_peers();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "looker-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 3), NULL, NULL);
        /* B first: nobody listens at A's port yet */
        ck_assert_int_eq(fed_start(&B, "b", FED_SECRET, b_args), 0);
        fx_sleep_ms(1500);
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, a_args), 0);
        wait_for(pb, "@a/model/w", 1);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * A's bridge stopped while A changes much: A's dlxd drops the events it
 * cannot queue (--max-queued 4096), A's bridge lists the prefix again, and
 * B ends with what A has, no more (what went while events were dropped goes).
 */
#define NNEW 1500
START_TEST(a_follow_catches_up_after_events_were_dropped)
{
        dlx_client *pa, *pb;
        char name[DLX_NAME_MAX + 1];

        hosts_up_a("--max-queued", "4096");
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "looker-b");
        for (int i = 0; i < 10; i++) {
                snprintf(name, sizeof(name), "model/old%d", i);
                publish_ok(pa, name, fx_vec_f32(pa, 4, (float)i), NULL, NULL);
        }
        follow_up("@a/model/");
        wait_for(pb, "@a/model/old9", 1);
        ck_assert_int_eq(kill(A.fed, SIGSTOP), 0);
        /* more than the socket's buffers take, then the unpublishes, whose events are dropped */
        for (int i = 0; i < NNEW; i++) {
                snprintf(name, sizeof(name), "model/new%04d-%0200d", i, 0);
                publish_ok(pa, name, fx_vec_f32(pa, 4, (float)i), NULL, NULL);
        }
        for (int i = 0; i < 5; i++) {
                snprintf(name, sizeof(name), "model/old%d", i);
                DLXV(dlx_unpublish(pa, name));
        }
        ck_assert_int_eq(kill(A.fed, SIGCONT), 0);
        for (int i = 0; i < NNEW; i++) {
                snprintf(name, sizeof(name), "@a/model/new%04d-%0200d", i, 0);
                wait_for(pb, name, 1);
        }
        for (int i = 0; i < 10; i++) {
                snprintf(name, sizeof(name), "@a/model/old%d", i);
                wait_for(pb, name, i < 5 ? 0 : 1);
        }
        ck_assert_int_ge(log_count(&A, "were dropped: listing it again"), 1);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/* What `dlxctl [--json] peers` prints for h, its exit status in *rc. */
static char *peers_of(struct host *h, bool as_json, int *rc)
{
        static char out[8192];
        char cmd[512];
        size_t n;
        FILE *p;

        snprintf(cmd, sizeof(cmd), "%s --socket %s %s peers 2>&1", getenv("DLXCTL"), h->d.socket,
                 as_json ? "--json" : "");
        p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        *rc = pclose(p);
        return out;
}

/*
 * README: "dlxctl peers: who is connected, via what, and bytes moved". B
 * follows A's model/ and pulls model/w (256 bytes): B reports peer a,
 * connected over tcp/lo, one version and 256 bytes in, one follow; A reports
 * client b, one version and 256 bytes out, one follow.
 */
START_TEST(dlxctl_peers_says_who_is_connected_and_what_moved)
{
        dlx_client *pa, *pb;
        char *out;
        int rc;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "looker-b");
        /* no bridge yet: a clear error */
        out = peers_of(&B, false, &rc);
        ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && strstr(out, "no dlxfed answers"),
                      "%s", out);
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        follow_up("@a/model/");
        wait_for(pb, "@a/model/w", 1);
        out = peers_of(&B, true, &rc);
        ck_assert_msg(rc == 0, "%s", out);
        ck_assert_msg(
                strstr(out, "\"alias\":\"b\"") && strstr(out, "\"peers\":[{\"alias\":\"a\"") &&
                        strstr(out, "\"state\":\"connected\"") &&
                        strstr(out, "\"transport\":\"tcp/lo\"") &&
                        strstr(out, "\"pulls\":1,\"bytes_in\":256,\"failures\":0,\"follows\":1"),
                "B: %s", out);
        out = peers_of(&A, true, &rc);
        ck_assert_msg(rc == 0, "%s", out);
        ck_assert_msg(strstr(out, "\"clients\":[{\"alias\":\"b\"") &&
                              strstr(out, "\"served\":1,\"bytes_out\":256,\"follows\":1"),
                      "A: %s", out);
        out = peers_of(&B, false, &rc);
        ck_assert_msg(rc == 0 && strstr(out, "PEER") && strstr(out, "pull") &&
                              strstr(out, "connected") && strstr(out, "127.0.0.1"),
                      "B: %s", out);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * fed.proto: a Change carries a small version's bytes from protocol 1.2 on.
 * A follower that speaks 1.1 (DLXFED_TEST_CLAIM) gets none, asks, and is
 * mirrored all the same.
 */
START_TEST(a_follower_of_1_1_asks_and_gets_the_same)
{
        const char *a_args[] = {"--export", "model/", "--allow-ucx-mismatch", NULL};
        const char *b_args[] = {"--follow", "@a/model/", "--allow-ucx-mismatch", NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "looker-b");
        setenv("DLXFED_TEST_CLAIM", "1.1 1.0.0", 1);
        pair_up(a_args, b_args);
        unsetenv("DLXFED_TEST_CLAIM");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        wait_for(pb, "@a/model/w", 1);
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 2), NULL, NULL);
        wait_for(pb, "@a/model/w", 2);
        t = acquire_ok(pb, "@a/model/w", NULL);
        ck_assert(fx_vec_is(t, 64, 2));
        t->deleter(t);
        ck_assert_int_eq(log_count(&B, "with its news"), 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

Suite *federation_follow_suite(void)
{
        Suite *s = suite_create("federation-follow");
        TCase *tc = tcase_create("loopback");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, a_followed_prefix_is_mirrored_as_it_changes);
        tcase_add_test(tc, a_follow_of_what_is_not_exported_is_refused);
        tcase_add_test(tc, a_follow_needs_a_peer_of_the_list);
        tcase_add_test(tc, a_follow_asks_again_until_its_peer_is_there);
        tcase_add_test(tc, a_follow_catches_up_after_events_were_dropped);
        tcase_add_test(tc, dlxctl_peers_says_who_is_connected_and_what_moved);
        tcase_add_test(tc, a_follower_of_1_1_asks_and_gets_the_same);
        suite_add_tcase(s, tc);
        return s;
}
