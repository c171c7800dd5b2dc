/* SPDX-License-Identifier: MIT */
/*
 * Independent tester: README.md "Federation: tensors across hosts (dlxfed)",
 * the handshake and the exporter's limits on peers' lookups. Each test
 * quotes the promise it checks; a failing test is a finding.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "fedhosts.h"

/* A (--export model/, peer b, extra a_extra), B with alias b_alias (peer a). */
static void pair_as(const char *b_alias, const char *a_extra_k, const char *a_extra_v)
{
        const char *a_args[] = {"--export", "model/", "--peer", peer_b, a_extra_k, a_extra_v, NULL};
        const char *b_args[] = {"--peer", peer_a, NULL};

        set_peers();
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, a_args), 0);
        ck_assert_int_eq(fed_start(&B, b_alias, FED_SECRET, b_args), 0);
}

/*
 * README: "A client must use an alias of the server's peer list". A lists
 * only "b"; B (same secret, allowed address) calls itself "mallory".
 */
START_TEST(an_alias_not_in_the_peer_list_is_refused)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        pair_as("mallory", NULL, NULL);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        t = acquire_at(pb, "@a/model/w", 0, 5000 * fx_slowdown(), &err);
        ck_assert_msg(
                t == NULL && err != 0,
                "A served model/w to a client calling itself 'mallory', not in its peer list");
        ck_assert_msg(err != -ETIMEDOUT, "refused, but silently: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "A peer's lookup waits for a version no longer than the exporter's
 * own --wait-ms"; "Whatever the bridge cannot fetch fails the waiting
 * acquires with its errno". A waits 500 ms; B's consumer waits 20 s for a
 * name A publishes only after 4 s.
 */
START_TEST(a_lookup_waits_no_longer_than_wait_ms)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;
        int64_t t0, took;
        pid_t child;

        hosts_up();
        pair_as("b", "--wait-ms", "500");
        child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                dlx_client *c = fx_connect(&A.d, "late-producer");
                fx_sleep_ms(4000);
                publish_ok(c, "model/late", fx_vec_f32(c, 64, 1), NULL, NULL);
                fx_child_exit(0);
        }
        pb = fx_connect(&B.d, "consumer-b");
        t0 = fx_now_ms();
        t = acquire_at(pb, "@a/model/late", 0, 20000 * fx_slowdown(), &err);
        took = fx_now_ms() - t0;
        pa = fx_connect(&A.d, "producer-a");
        ck_assert_int_eq(fx_wait(child), 0);
        if (t)
                t->deleter(t);
        ck_assert_msg(
                took < 3000 * fx_slowdown(),
                "the acquire took %lld ms (%s) with A's --wait-ms 500; A logged 'wait' %d times",
                (long long)took, t ? "got the tensor" : dlx_strerror(err), log_count(&A, "wait"));
        fprintf(stderr, "lookup: %s after %lld ms (%s)\n", t ? "got it" : dlx_strerror(err),
                (long long)took, t ? "" : dlx_last_error());
        ck_assert_msg(t == NULL && err != 0 && strstr(dlx_last_error(), "a") != NULL,
                      "the lookup's end did not fail the acquire naming the peer: %s",
                      t ? "got it" : dlx_strerror(err));
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "SIGTERM ends waiting lookups at once." A waits up to 60 s for a
 * name; B wants it; A's bridge gets SIGTERM: it must exit at once, and B's
 * waiter must hear of it (not sit out its own 30 s).
 */
START_TEST(sigterm_ends_waiting_lookups_at_once)
{
        dlx_client *pb;
        DLManagedTensorVersioned *t;
        int err, status;
        int64_t t0, stop_took, wait_took;
        pid_t child;

        hosts_up();
        pair_as("b", "--wait-ms", "60000");
        child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                int e;
                int64_t s = fx_now_ms();
                dlx_client *c = fx_connect(&B.d, "waiter");
                DLManagedTensorVersioned *x = acquire_at(c, "@a/model/never", 0, 30000, &e);
                if (x)
                        x->deleter(x);
                fprintf(stderr, "waiter: %s after %lld ms\n", x ? "got it" : dlx_strerror(e),
                        (long long)(fx_now_ms() - s));
                fx_child_exit(x == NULL && fx_now_ms() - s < 8000 ? 0 : 1);
        }
        fx_sleep_ms(1500);
        t0 = fx_now_ms();
        ck_assert_int_eq(kill(A.fed, SIGTERM), 0);
        ck_assert_int_eq(waitpid(A.fed, &status, 0), A.fed);
        stop_took = fx_now_ms() - t0;
        A.fed = 0;
        t0 = fx_now_ms();
        err = fx_wait(child);
        wait_took = fx_now_ms() - t0;
        ck_assert_msg(stop_took < 2000 * fx_slowdown(),
                      "dlxfed took %lld ms to exit on SIGTERM with a lookup waiting",
                      (long long)stop_took);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "dlxfed exited 0x%x", status);
        ck_assert_msg(err == 0, "B's waiter was not failed promptly (%lld ms more)",
                      (long long)wait_took);
        (void)t;
        (void)pb;
        hosts_down();
}
END_TEST

/*
 * README: "no more than 16 lookups of one peer (48 in all) wait at once".
 * 20 consumers on B want 20 names A does not have (A --wait-ms 8000); A
 * publishes them all after 3 s. At most 16 can have been waiting on A, so at
 * least 4 wants cannot be served by those publishes as waited-for lookups: they
 * must have been refused (and failed) before, not waited.
 */
#define NWANT 20
START_TEST(at_most_16_lookups_of_one_peer_wait)
{
        dlx_client *pa;
        pid_t kids[NWANT];
        int early = 0, got = 0, other = 0;

        hosts_up();
        pair_as("b", "--wait-ms", "8000");
        pa = fx_connect(&A.d, "producer-a");
        for (int i = 0; i < NWANT; i++) {
                kids[i] = fork();
                ck_assert_int_ge(kids[i], 0);
                if (kids[i] == 0) {
                        char name[64];
                        int e;
                        int64_t s = fx_now_ms();
                        dlx_client *c = fx_connect(&B.d, "waiter");
                        snprintf(name, sizeof(name), "@a/model/n%d", i);
                        DLManagedTensorVersioned *x = acquire_at(c, name, 0, 15000, &e);
                        int64_t took = fx_now_ms() - s;
                        if (x)
                                x->deleter(x);
                        fprintf(stderr, "waiter %d: %s after %lld ms (%s)\n", i,
                                x ? "got it" : dlx_strerror(e), (long long)took,
                                x ? "" : dlx_last_error());
                        fx_child_exit(x ? 0 : took < 2500 ? 2 : 3);
                }
        }
        fx_sleep_ms(3000);
        for (int i = 0; i < NWANT; i++) {
                char name[64];
                snprintf(name, sizeof(name), "model/n%d", i);
                publish_ok(pa, name, fx_vec_f32(pa, 16, 1), NULL, NULL);
        }
        for (int i = 0; i < NWANT; i++) {
                int st;
                ck_assert_int_eq(waitpid(kids[i], &st, 0), kids[i]);
                int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
                got += code == 0;
                early += code == 2;
                other += code != 0 && code != 2;
        }
        ck_assert_msg(early >= NWANT - 16,
                      "%d wants of one peer: %d served, %d refused at once, %d failed late; "
                      "all waited on A at once",
                      NWANT, got, early, other);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "one network copy per host per version. Wants of one name are
 * coalesced into one pull." A has model/w v1; on B one consumer wants any
 * version while two others want v2 or later (A waits for it); A then
 * publishes v2. A must send v1 once and v2 once.
 */
START_TEST(wants_of_two_min_versions_are_one_copy_each)
{
        dlx_client *pa;
        pid_t kids[3];
        const uint64_t mins[3] = {0, 2, 2};

        hosts_up();
        pair_as("b", "--wait-ms", "8000");
        pa = fx_connect(&A.d, "producer-a");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        for (int i = 0; i < 3; i++) {
                kids[i] = fork();
                ck_assert_int_ge(kids[i], 0);
                if (kids[i] == 0) {
                        int e;
                        dlx_client *c = fx_connect(&B.d, "waiter");
                        if (mins[i] == 0)
                                fx_sleep_ms(300); /* after the v2 wants */
                        int64_t s0 = fx_now_ms();
                        DLManagedTensorVersioned *x =
                                acquire_at(c, "@a/model/w", mins[i], 15000, &e);
                        fprintf(stderr, "waiter min %d: %s v%llu after %lld ms (%s)\n",
                                (int)mins[i], x ? "got it" : dlx_strerror(e),
                                x ? (unsigned long long)(x->dl_tensor.data
                                                                 ? ((float *)x->dl_tensor.data)[0]
                                                                 : 0)
                                  : 0ULL,
                                (long long)(fx_now_ms() - s0), x ? "" : dlx_last_error());
                        if (x)
                                x->deleter(x);
                        fx_child_exit(x ? 0 : 1);
                }
        }
        fx_sleep_ms(1500);
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 2), NULL, NULL);
        for (int i = 0; i < 3; i++)
                ck_assert_int_eq(fx_wait(kids[i]), 0);
        /* the bridge logs the pull after publishing it: let the line land */
        for (int i = 0; i < 40 && log_count(&B, "@a/model/w v2:") == 0; i++)
                fx_sleep_ms(50);
        fx_sleep_ms(200);
        ck_assert_msg(log_count(&B, "@a/model/w v1:") <= 1 && log_count(&B, "@a/model/w v2:") == 1,
                      "B pulled v1 %d times and v2 %d times", log_count(&B, "@a/model/w v1:"),
                      log_count(&B, "@a/model/w v2:"));
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "(a bridge that lists no peers only serves, and takes any)". A
 * lists no peers (and --allow 127.0.0.1, as its default would be no one):
 * B, alias "anyone", pulls.
 */
START_TEST(a_bridge_with_no_peers_takes_any)
{
        const char *a_args[] = {"--export", "model/", "--allow", "127.0.0.1", NULL};
        const char *b_args[] = {"--peer", peer_a, NULL};
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;

        hosts_up();
        set_peers();
        ck_assert_int_eq(fed_start(&A, "a", FED_SECRET, a_args), 0);
        ck_assert_int_eq(fed_start(&B, "anyone", FED_SECRET, b_args), 0);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        t = acquire_at(pb, "@a/model/w", 0, 5000 * fx_slowdown(), &err);
        DLXV(err);
        ck_assert(fx_vec_is(t, 64, 1));
        t->deleter(t);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "Wants of one name are coalesced into one pull" and "a version A
 * does not have yet is waited for on A (--wait-ms)". A has model/w v1 and
 * never publishes v2 (--wait-ms 1500). On B one consumer wants v2 or later;
 * 300 ms later another wants any version, which A has: it must get v1, not
 * share the v2 want's fate.
 */
START_TEST(a_want_for_any_version_is_not_failed_by_a_want_for_a_later_one)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;
        int64_t s0, took;
        pid_t child;

        hosts_up();
        pair_as("b", "--wait-ms", "1500");
        pa = fx_connect(&A.d, "producer-a");
        publish_ok(pa, "model/w", fx_vec_f32(pa, 64, 1), NULL, NULL);
        child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                int e;
                dlx_client *c = fx_connect(&B.d, "waiter-v2");
                DLManagedTensorVersioned *x = acquire_at(c, "@a/model/w", 2, 10000, &e);
                fprintf(stderr, "waiter min 2: %s (%s)\n", x ? "got it" : dlx_strerror(e),
                        x ? "" : dlx_last_error());
                fx_child_exit(x ? 1 : 0);
        }
        fx_sleep_ms(300);
        pb = fx_connect(&B.d, "consumer-any");
        s0 = fx_now_ms();
        t = acquire_at(pb, "@a/model/w", 0, 10000 * fx_slowdown(), &err);
        took = fx_now_ms() - s0;
        fprintf(stderr, "waiter min 0: %s after %lld ms (%s)\n", t ? "got it" : dlx_strerror(err),
                (long long)took, t ? "" : dlx_last_error());
        ck_assert_msg(t != NULL, "a want of any version of a name A has failed: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        ck_assert(fx_vec_is(t, 64, 1));
        t->deleter(t);
        ck_assert_int_eq(fx_wait(child), 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * dlx.h dlx_fetch_failed() fails every waiter up to a version. A 1 GiB pull
 * of v1 is under way for a consumer of any version when a want of v2 (which
 * A never gets) times out on A: that failure must not fail the pull's
 * consumer, who gets v1, while the v2 consumer fails naming the peer.
 */
START_TEST(a_failure_of_a_later_version_waits_for_a_pull_under_way)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err;
        int64_t size;
        pid_t child;

        hosts_up();
        pair_as("b", "--wait-ms", "100");
        pa = fx_connect(&A.d, "producer-a");
        size = publish_big(pa, "model/big");
        pb = fx_connect(&B.d, "consumer-any");
        child = fork();
        ck_assert_int_ge(child, 0);
        if (child == 0) {
                int e;
                dlx_client *c = fx_connect(&B.d, "waiter-v2");
                wait_pull_started(fx_connect(&A.d, "looks-at-a"));
                DLManagedTensorVersioned *x = acquire_at(c, "@a/model/big", 2, 60000, &e);
                fprintf(stderr, "waiter min 2: %s (%s)\n", x ? "got it" : dlx_strerror(e),
                        x ? "" : dlx_last_error());
                fx_child_exit(x == NULL && strstr(dlx_last_error(), "peer a") ? 0 : 1);
        }
        t = acquire_at(pb, "@a/model/big", 0, 60000 * fx_slowdown(), &err);
        ck_assert_msg(t != NULL, "the pull's consumer failed: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert_int_eq(t->dl_tensor.shape[0] * (t->dl_tensor.dtype.bits / 8), size);
        t->deleter(t);
        ck_assert_int_eq(fx_wait(child), 0);
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

Suite *federation_promises_suite(void)
{
        Suite *s = suite_create("federation-promises");
        TCase *tc = tcase_create("loopback");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, an_alias_not_in_the_peer_list_is_refused);
        tcase_add_test(tc, a_lookup_waits_no_longer_than_wait_ms);
        tcase_add_test(tc, sigterm_ends_waiting_lookups_at_once);
        tcase_add_test(tc, at_most_16_lookups_of_one_peer_wait);
        tcase_add_test(tc, wants_of_two_min_versions_are_one_copy_each);
        tcase_add_test(tc, a_bridge_with_no_peers_takes_any);
        tcase_add_test(tc, a_want_for_any_version_is_not_failed_by_a_want_for_a_later_one);
        tcase_add_test(tc, a_failure_of_a_later_version_waits_for_a_pull_under_way);
        suite_add_tcase(s, tc);
        return s;
}
