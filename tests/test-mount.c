/* SPDX-License-Identifier: MIT */
/*
 * Federation mounts (dlx.h, "federation bridges"; protocol 1.5): what dlxd
 * promises the bridge and everyone else on the host.
 *  - Only dlxd's --federation-uid mounts, only "@<alias>/" prefixes, one
 *    client per prefix; nobody else publishes under '@'.
 *  - An acquire that waits for a name under a mount sends the bridge one
 *    WANTED per name and version, also for acquires that waited before the
 *    mount came; one that does not wait sends nothing.
 *  - A mirror keeps its origin's version (it must increase) and shows where
 *    it came from; dlx_fetch_failed() fails exactly the waiters it covers,
 *    with the bridge's errno and message.
 *  - A mirror goes with its bridge; a consumer's lease keeps it readable.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"

#define DLXV(call) ck_assert_int_eq((call), 0)

static void start_federated(uid_t uid)
{
        char arg[32];
        const char *extra[] = {"--federation-uid", arg, NULL};

        snprintf(arg, sizeof(arg), "%u", (unsigned)uid);
        dlxd_start(&fx, extra);
}

static void fed_setup(void)
{
        start_federated(getuid());
}

/* A mirror as a bridge publishes it: the origin's version, and where it came from. */
static int publish_mirror(dlx_client *c, const char *name, uint64_t origin_version, float base,
                          uint64_t *ret_version)
{
        struct dlx_publish_options o = {.origin_version = origin_version,
                                        .origin = "test \xe2\x86\x90 peer v7"};

        return dlx_publish(c, name, fx_vec_f32(c, 8, base), &o, ret_version);
}

static void expect_wanted(dlx_client *bridge, const char *name, uint64_t version)
{
        struct dlx_event ev;

        DLXV(dlx_next_event(bridge, &ev, 5000 * fx_slowdown()));
        ck_assert_int_eq(ev.kind, DLX_EVENT_WANTED);
        ck_assert_str_eq(ev.name, name);
        ck_assert_uint_eq(ev.version, version);
        ck_assert_uint_eq(ev.watch, 0);
}

static void expect_no_event(dlx_client *bridge, int ms)
{
        struct dlx_event ev;
        int err = dlx_next_event(bridge, &ev, ms);

        ck_assert_msg(err == -ETIMEDOUT, "unexpected event %d on '%s' v%llu (err %d)", ev.kind,
                      ev.name, (unsigned long long)ev.version, err);
}

/* An acquire in a thread of its own, on a client of its own. */
struct waiter {
        pthread_t thread;
        char name[64];
        uint64_t min_version;
        int64_t timeout_ms;
        int err;
        uint64_t version;
        bool bytes_ok;
        char error[256];
};

static void *wait_thread(void *arg)
{
        struct waiter *w = arg;
        dlx_client *c = fx_connect(&fx, "waiter");
        struct dlx_acquire_options o = {.min_version = w->min_version, .timeout_ms = w->timeout_ms};
        DLManagedTensorVersioned *t = NULL;

        w->err = dlx_acquire(c, w->name, &o, &t);
        if (w->err == 0) {
                dlx_tensor_info(t, NULL, &w->version, NULL);
                w->bytes_ok = fx_vec_is(t, 8, (float)w->version);
                t->deleter(t);
        } else {
                snprintf(w->error, sizeof(w->error), "%s", dlx_last_error());
        }
        dlx_close(c);
        return NULL;
}

static void waiter_start(struct waiter *w, const char *name, uint64_t min_version)
{
        memset(w, 0, sizeof(*w));
        snprintf(w->name, sizeof(w->name), "%s", name);
        w->min_version = min_version;
        w->timeout_ms = 20000;
        ck_assert_int_eq(pthread_create(&w->thread, NULL, wait_thread, w), 0);
}

static void waiter_join(struct waiter *w)
{
        ck_assert_int_eq(pthread_join(w->thread, NULL), 0);
        ck_assert_msg(w->err != 0 || w->bytes_ok, "'%s' v%llu: wrong bytes", w->name,
                      (unsigned long long)w->version);
}

START_TEST(mount_needs_the_federation_uid)
{
        dlx_client *c;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "not-a-bridge");
        ck_assert_int_eq(dlx_mount(c, "@gpu3/"), -EACCES);
        expect_last_error("--federation-uid");
        dlx_close(c);
        dlxd_stop(&fx);

        start_federated(getuid() + 1);
        c = fx_connect(&fx, "other-uid");
        ck_assert_int_eq(dlx_mount(c, "@gpu3/"), -EACCES);
        expect_last_error("only uid");
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(mount_prefixes_and_owners)
{
        static const char *const bad[] = {
                "gpu3/", "@gpu3", "@", "@/", "@a/b/", "", "@abcdefghijklmnopqrstuvwxyz0123456/"};
        dlx_client *a = fx_connect(&fx, "bridge-a"), *b = fx_connect(&fx, "bridge-b");

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                ck_assert_msg(dlx_mount(a, bad[i]) == -EINVAL, "prefix '%s' mounted", bad[i]);
        ck_assert_int_eq(dlx_mount(a, NULL), -EINVAL);
        ck_assert_int_eq(dlx_mount(NULL, "@gpu3/"), -EINVAL);
        DLXV(dlx_mount(a, "@gpu3/"));
        DLXV(dlx_mount(a, "@gpu3/")); /* again: fine */
        DLXV(dlx_mount(a, "@abcdefghijklmnopqrstuvwxyz012345/"));
        ck_assert_int_eq(dlx_mount(b, "@gpu3/"), -EBUSY);
        DLXV(dlx_mount(b, "@gpu30/")); /* another alias, not a prefix of a prefix */
        dlx_close(a);
        /* the mount went with its client */
        DLXV(dlx_mount(b, "@gpu3/"));
        dlx_close(b);
}
END_TEST

START_TEST(only_the_bridge_publishes_under_at)
{
        dlx_client *bridge = fx_connect(&fx, "bridge"), *other = fx_connect(&fx, "other");
        struct dlx_publish_options o = {.origin_version = 3};
        uint64_t v;

        /* unmounted: nobody */
        ck_assert_int_eq(dlx_publish(other, "@gpu3/w", fx_vec_f32(other, 8, 0), NULL, NULL),
                         -EACCES);
        ck_assert_int_eq(publish_mirror(bridge, "@gpu3/w", 1, 1, NULL), -EACCES);
        DLXV(dlx_mount(bridge, "@gpu3/"));
        /* mounted: the bridge alone, under its own prefix alone */
        ck_assert_int_eq(dlx_publish(other, "@gpu3/w", fx_vec_f32(other, 8, 0), NULL, NULL),
                         -EACCES);
        ck_assert_int_eq(publish_mirror(bridge, "@gpu4/w", 1, 1, NULL), -EACCES);
        ck_assert_int_eq(publish_mirror(bridge, "@gpu3", 1, 1, NULL), -EACCES);
        /* origins are for mirrors only */
        ck_assert_int_eq(dlx_publish(other, "plain", fx_vec_f32(other, 8, 0), &o, NULL), -EINVAL);
        ck_assert_int_eq(publish_mirror(bridge, "plain", 3, 3, NULL), -EINVAL);
        DLXV(publish_mirror(bridge, "@gpu3/w", 3, 3, &v));
        ck_assert_uint_eq(v, 3);
        dlx_close(other);
        dlx_close(bridge);
}
END_TEST

START_TEST(origin_versions_increase)
{
        dlx_client *bridge = fx_connect(&fx, "bridge");
        struct dlx_info in;
        uint64_t v;

        DLXV(dlx_mount(bridge, "@gpu3/"));
        DLXV(publish_mirror(bridge, "@gpu3/w", 7, 7, &v));
        ck_assert_uint_eq(v, 7);
        DLXV(dlx_stat(bridge, "@gpu3/w", &in));
        ck_assert_uint_eq(in.version, 7);
        ck_assert_str_eq(in.origin, "test \xe2\x86\x90 peer v7");
        ck_assert_int_eq(publish_mirror(bridge, "@gpu3/w", 7, 7, NULL), -EEXIST);
        ck_assert_int_eq(publish_mirror(bridge, "@gpu3/w", 5, 5, NULL), -EEXIST);
        expect_last_error("not above");
        DLXV(publish_mirror(bridge, "@gpu3/w", UINT64_MAX - 1, 1, &v));
        ck_assert_uint_eq(v, UINT64_MAX - 1);
        /* without one: the next, as for any name */
        DLXV(dlx_publish(bridge, "@gpu3/w", fx_vec_f32(bridge, 8, 0), NULL, &v));
        ck_assert_uint_eq(v, UINT64_MAX);
        DLXV(dlx_stat(bridge, "@gpu3/w", &in));
        ck_assert_str_eq(in.origin, "");
        /* a bad origin */
        struct dlx_publish_options o = {.origin = "two\nlines"};
        ck_assert_int_eq(dlx_publish(bridge, "@gpu3/x", fx_vec_f32(bridge, 8, 0), &o, NULL),
                         -EINVAL);
        char longest[200];
        memset(longest, 'o', sizeof(longest));
        longest[128] = '\0';
        o.origin = longest;
        ck_assert_int_eq(dlx_publish(bridge, "@gpu3/x", fx_vec_f32(bridge, 8, 0), &o, NULL),
                         -EINVAL);
        longest[127] = '\0';
        DLXV(dlx_publish(bridge, "@gpu3/x", fx_vec_f32(bridge, 8, 0), &o, NULL));
        DLXV(dlx_stat(bridge, "@gpu3/x", &in));
        ck_assert_str_eq(in.origin, longest);
        dlx_close(bridge);
}
END_TEST

START_TEST(a_waiting_acquire_is_wanted_once)
{
        dlx_client *bridge = fx_connect(&fx, "bridge");
        struct waiter w1, w2, w3, w4;
        uint64_t v;

        DLXV(dlx_mount(bridge, "@gpu3/"));
        waiter_start(&w1, "@gpu3/w", 7);
        expect_wanted(bridge, "@gpu3/w", 7);
        /* the same version: asked already; a lower one is asked for too (the peer may have it) */
        waiter_start(&w2, "@gpu3/w", 7);
        expect_no_event(bridge, 300);
        waiter_start(&w3, "@gpu3/w", 2);
        expect_wanted(bridge, "@gpu3/w", 2);
        expect_no_event(bridge, 300);
        DLXV(publish_mirror(bridge, "@gpu3/w", 7, 7, &v));
        waiter_join(&w1);
        waiter_join(&w2);
        waiter_join(&w3);
        ck_assert_int_eq(w1.err, 0);
        ck_assert_uint_eq(w1.version, 7);
        ck_assert_int_eq(w2.err, 0);
        ck_assert_int_eq(w3.err, 0);
        ck_assert_uint_eq(w3.version, 7);

        /* a higher one is asked for; once published, the same version again too */
        waiter_start(&w1, "@gpu3/w", 9);
        expect_wanted(bridge, "@gpu3/w", 9);
        waiter_start(&w2, "@gpu3/w", 12);
        expect_wanted(bridge, "@gpu3/w", 12);
        DLXV(publish_mirror(bridge, "@gpu3/w", 10, 10, NULL));
        waiter_join(&w1);
        ck_assert_uint_eq(w1.version, 10);
        /* 12 is still outstanding: not asked again; 11 is new */
        waiter_start(&w4, "@gpu3/w", 12);
        expect_no_event(bridge, 300);
        waiter_start(&w3, "@gpu3/w", 11);
        expect_wanted(bridge, "@gpu3/w", 11);
        DLXV(publish_mirror(bridge, "@gpu3/w", 12, 12, NULL));
        waiter_join(&w2);
        waiter_join(&w3);
        waiter_join(&w4);
        ck_assert_uint_eq(w4.version, 12);
        ck_assert_uint_eq(w2.version, 12);
        ck_assert_uint_eq(w3.version, 12);
        dlx_close(bridge);
}
END_TEST

START_TEST(an_acquire_that_does_not_wait_is_not_wanted)
{
        dlx_client *bridge = fx_connect(&fx, "bridge"), *c = fx_connect(&fx, "consumer");
        struct dlx_acquire_options o = {.timeout_ms = 0};
        DLManagedTensorVersioned *t;

        DLXV(dlx_mount(bridge, "@gpu3/"));
        ck_assert_int_eq(dlx_acquire(c, "@gpu3/w", &o, &t), -ENOENT);
        expect_last_error("waits");
        /* nor does a name outside every mount, nor a stat */
        struct waiter w;
        waiter_start(&w, "@gpu4/w", 0);
        struct dlx_info in;
        ck_assert_int_eq(dlx_stat(c, "@gpu3/w", &in), -ENOENT);
        expect_no_event(bridge, 300);
        DLXV(dlx_mount(bridge, "@gpu4/"));
        expect_wanted(bridge, "@gpu4/w", 0);
        DLXV(dlx_fetch_failed(bridge, "@gpu4/w", 0, -ENOENT, "gpu4 has no such name"));
        waiter_join(&w);
        ck_assert_int_eq(w.err, -ENOENT);
        ck_assert_str_eq(w.error, "gpu4 has no such name");
        dlx_close(c);
        dlx_close(bridge);
}
END_TEST

START_TEST(waiters_before_the_mount_are_announced)
{
        dlx_client *bridge;
        struct waiter w1, w2;

        waiter_start(&w1, "@gpu3/a", 4);
        waiter_start(&w2, "@gpu3/b/c", 0);
        /* nobody to tell yet: give both time to wait */
        fx_sleep_ms(200);
        bridge = fx_connect(&fx, "bridge");
        DLXV(dlx_mount(bridge, "@gpu3/"));
        expect_wanted(bridge, "@gpu3/a", 4);
        expect_wanted(bridge, "@gpu3/b/c", 0);
        /* a bridge that restarts hears of them again */
        dlx_close(bridge);
        bridge = fx_connect(&fx, "bridge-again");
        DLXV(dlx_mount(bridge, "@gpu3/"));
        expect_wanted(bridge, "@gpu3/a", 4);
        expect_wanted(bridge, "@gpu3/b/c", 0);
        /* one that mounts again hears of those whose WANTED was dropped: none here */
        DLXV(dlx_mount(bridge, "@gpu3/"));
        expect_no_event(bridge, 200);
        DLXV(publish_mirror(bridge, "@gpu3/a", 4, 4, NULL));
        DLXV(publish_mirror(bridge, "@gpu3/b/c", 1, 1, NULL));
        waiter_join(&w1);
        waiter_join(&w2);
        ck_assert_uint_eq(w1.version, 4);
        ck_assert_uint_eq(w2.version, 1);
        dlx_close(bridge);
}
END_TEST

START_TEST(fetch_failed_fails_the_waiters_it_covers)
{
        dlx_client *bridge = fx_connect(&fx, "bridge"), *other = fx_connect(&fx, "other");
        struct waiter low, high;

        DLXV(dlx_mount(bridge, "@gpu3/"));
        waiter_start(&low, "@gpu3/w", 3);
        expect_wanted(bridge, "@gpu3/w", 3);
        waiter_start(&high, "@gpu3/w", 10);
        expect_wanted(bridge, "@gpu3/w", 10);
        /* not the other client's to fail, nor a non-error */
        ck_assert_int_eq(dlx_fetch_failed(other, "@gpu3/w", 10, -EIO, NULL), -EACCES);
        ck_assert_int_eq(dlx_fetch_failed(bridge, "@gpu3/w", 10, 0, NULL), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(bridge, "@gpu3/w", 10, -EIO, "bad\x1b[0m"), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(bridge, "@gpu4/w", 10, -EIO, NULL), -EACCES);
        ck_assert_int_eq(dlx_fetch_failed(bridge, NULL, 10, -EIO, NULL), -EINVAL);

        DLXV(dlx_fetch_failed(bridge, "@gpu3/w", 5, -EHOSTUNREACH,
                              "peer gpu3 lost during the pull of '@gpu3/w'"));
        waiter_join(&low);
        ck_assert_int_eq(low.err, -EHOSTUNREACH);
        ck_assert_str_eq(low.error, "peer gpu3 lost during the pull of '@gpu3/w'");
        /* the other goes on waiting, and is served */
        expect_no_event(bridge, 200);
        DLXV(publish_mirror(bridge, "@gpu3/w", 11, 11, NULL));
        waiter_join(&high);
        ck_assert_int_eq(high.err, 0);
        ck_assert_uint_eq(high.version, 11);
        /* failing a name nobody waits for is no error; one without a message gets one */
        DLXV(dlx_fetch_failed(bridge, "@gpu3/nobody", 0, -ETIMEDOUT, NULL));
        waiter_start(&low, "@gpu3/z", 0);
        expect_wanted(bridge, "@gpu3/z", 0);
        DLXV(dlx_fetch_failed(bridge, "@gpu3/z", UINT64_MAX, -ETIMEDOUT, NULL));
        waiter_join(&low);
        ck_assert_int_eq(low.err, -ETIMEDOUT);
        ck_assert_msg(strstr(low.error, "@gpu3/z") != NULL, "error: %s", low.error);
        /* the failure was final for that want: a new acquire asks again */
        waiter_start(&low, "@gpu3/z", 0);
        expect_wanted(bridge, "@gpu3/z", 0);
        DLXV(publish_mirror(bridge, "@gpu3/z", 1, 1, NULL));
        waiter_join(&low);
        ck_assert_int_eq(low.err, 0);
        dlx_close(other);
        dlx_close(bridge);
}
END_TEST

START_TEST(mirrors_go_with_their_bridge)
{
        dlx_client *bridge = fx_connect(&fx, "bridge"), *c = fx_connect(&fx, "consumer");
        struct dlx_acquire_options o = {.timeout_ms = 0};
        DLManagedTensorVersioned *t, *t2;
        struct dlx_info in;
        int deleted = 0;

        DLXV(dlx_mount(bridge, "@gpu3/"));
        DLXV(publish_mirror(bridge, "@gpu3/w", 5, 5, NULL));
        DLXV(dlx_acquire(c, "@gpu3/w", &o, &t));
        dlx_close(bridge);
        ck_assert_int_eq(dlx_stat(c, "@gpu3/w", &in), -ENOENT);
        ck_assert(fx_vec_is(t, 8, 5));
        /* while that copy is held, the same origin version may be mirrored again, once */
        bridge = fx_connect(&fx, "bridge-again");
        DLXV(dlx_mount(bridge, "@gpu3/"));
        ck_assert_int_eq(publish_mirror(bridge, "@gpu3/w", 4, 4, NULL), -EEXIST);
        DLXV(publish_mirror(bridge, "@gpu3/w", 5, 5, NULL));
        ck_assert_int_eq(publish_mirror(bridge, "@gpu3/w", 5, 5, NULL), -EEXIST);
        dlx_close(bridge);
        t->deleter(t);
        /* another bridge takes over */
        bridge = fx_connect(&fx, "bridge-2");
        DLXV(dlx_mount(bridge, "@gpu3/"));
        DLXV(dlx_publish(bridge, "@gpu3/w", fx_plain_f32(8, 6, &deleted), NULL, NULL));
        DLXV(dlx_acquire(c, "@gpu3/w", &o, &t2));
        ck_assert(fx_vec_is(t2, 8, 6));
        t2->deleter(t2);
        dlx_close(c);
        dlx_close(bridge);
}
END_TEST

Suite *mount_suite(void)
{
        Suite *s = suite_create("mount");
        TCase *tc = tcase_create("mount");
        TCase *own = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fed_setup, fx_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, mount_prefixes_and_owners);
        tcase_add_test(tc, only_the_bridge_publishes_under_at);
        tcase_add_test(tc, origin_versions_increase);
        tcase_add_test(tc, a_waiting_acquire_is_wanted_once);
        tcase_add_test(tc, an_acquire_that_does_not_wait_is_not_wanted);
        tcase_add_test(tc, waiters_before_the_mount_are_announced);
        tcase_add_test(tc, fetch_failed_fails_the_waiters_it_covers);
        tcase_add_test(tc, mirrors_go_with_their_bridge);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(own, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(own, 60);
        tcase_add_test(own, mount_needs_the_federation_uid);
        suite_add_tcase(s, own);
        return s;
}
