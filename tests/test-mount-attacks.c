/* SPDX-License-Identifier: MIT */
/*
 * Federation mounts (protocol 1.5), read by a second reader: the promises of
 * dlx.h "federation bridges", DLX_EVENT_WANTED, dlx_publish_options.origin_*,
 * dlx_info.origin, proto/dlx.proto Mount/FetchFailed and dlxd --help
 * --federation-uid, attacked. test-mount.c is the author's suite.
 */
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "rawpeer.h"

#define NOBODY 65534
#define REPLY_MS 10000

/* ---- helpers -------------------------------------------------------------------------------- */

static void start_fed(const char *fed_uid)
{
        const char *args[] = {"--federation-uid", fed_uid, "--group", "65534", NULL};

        dlxd_start(&fx, args);
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        ck_assert_int_eq(chmod(fx.socket, 0666), 0);
}

static dlx_client *connect_as(uid_t uid)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "other-uid"};
        dlx_client *c = NULL;

        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(uid) != 0)
                return NULL;
        return dlx_connect(&o, &c) == 0 ? c : NULL;
}

static void publish_copy(dlx_client *c, const char *name, uint64_t *ret_version)
{
        publish_ok(c, name, fx_plain_f32(16, 1, NULL), NULL, ret_version);
}

static int mirror(dlx_client *c, const char *name, uint64_t ov, const char *origin,
                  uint64_t *ret_version)
{
        struct dlx_publish_options o = {.origin_version = ov, .origin = origin};

        return dlx_publish(c, name, fx_plain_f32(16, 1, NULL), &o, ret_version);
}

/* The next event, which must be WANTED for name at version. */
static void expect_wanted(dlx_client *b, const char *name, uint64_t version)
{
        struct dlx_event ev;
        int r = dlx_next_event(b, &ev, REPLY_MS * fx_slowdown());

        ck_assert_msg(r == 0, "no WANTED for %s (%d)", name, r);
        ck_assert_int_eq(ev.kind, DLX_EVENT_WANTED);
        ck_assert_str_eq(ev.name, name);
        ck_assert_uint_eq(ev.version, version);
        ck_assert_uint_eq(ev.watch, 0);
}

static void expect_no_event(dlx_client *b, int ms)
{
        struct dlx_event ev;
        int r = dlx_next_event(b, &ev, ms);

        ck_assert_msg(r == -ETIMEDOUT || r == -EAGAIN, "unexpected event kind %d name '%s' v%llu",
                      ev.kind, r == 0 ? ev.name : "", (unsigned long long)ev.version);
}

/* A waiter: its own client, acquiring name in a thread. */
struct waiter {
        const char *name;
        uint64_t min_version;
        int64_t timeout_ms;
        bool group;
        dlx_client *c;
        pthread_t th;
        int rc;
        uint64_t version;
        char err[512];
};

static void *waiter_run(void *arg)
{
        struct waiter *w = arg;
        struct dlx_acquire_options o = {.timeout_ms = w->timeout_ms, .min_version = w->min_version};

        if (w->group) {
                dlx_group *g = NULL;

                w->rc = dlx_acquire_group(w->c, w->name, NULL, 0, &o, &g);
                if (w->rc == 0) {
                        w->version = dlx_group_version(g);
                        dlx_group_release(g);
                } else {
                        snprintf(w->err, sizeof(w->err), "%s", dlx_last_error());
                }
                return NULL;
        }
        DLManagedTensorVersioned *t = NULL;

        w->rc = dlx_acquire(w->c, w->name, &o, &t);
        if (w->rc == 0) {
                const char *n;
                dlx_tensor_info(t, &n, &w->version, NULL);
                t->deleter(t);
        } else {
                snprintf(w->err, sizeof(w->err), "%s", dlx_last_error());
        }
        return NULL;
}

static void waiter_start(struct waiter *w, const char *name, uint64_t min_version,
                         int64_t timeout_ms)
{
        memset(w, 0, sizeof(*w));
        w->name = name;
        w->min_version = min_version;
        w->timeout_ms = timeout_ms;
        w->rc = 12345;
        w->c = fx_connect(&fx, "waiter");
        ck_assert_int_eq(pthread_create(&w->th, NULL, waiter_run, w), 0);
}

static void waiter_join(struct waiter *w)
{
        pthread_join(w->th, NULL);
        dlx_close(w->c);
        w->c = NULL;
}

/* Waits until the daemon counts n waiting acquires... we have no counter: sleep a bit. */
static void settle(void)
{
        fx_sleep_ms(150 * fx_slowdown());
}

/* ---- who may mount ----------------------------------------------------------------------------
 */

START_TEST(no_federation_uid_nobody_mounts)
{
        dlx_client *c;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "root");
        ck_assert_int_eq(dlx_mount(c, "@a/"), -EACCES);
        ck_assert_int_eq(mirror(c, "@a/x", 0, NULL, NULL), -EACCES);
        ck_assert_int_eq(dlx_publish(c, "@a/x", fx_plain_f32(4, 0, NULL), NULL, NULL), -EACCES);
        ck_assert_int_eq(dlx_publish(c, "@", fx_plain_f32(4, 0, NULL), NULL, NULL), -EACCES);
        ck_assert_int_eq(dlx_publish(c, "@a", fx_plain_f32(4, 0, NULL), NULL, NULL), -EACCES);
        ck_assert_int_eq(dlx_fetch_failed(c, "@a/x", 0, -EHOSTUNREACH, NULL), -EACCES);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* root is not special: with --federation-uid nobody, root may not mount. */
START_TEST(root_is_not_the_federation_uid)
{
        dlx_client *c;

        start_fed("65534");
        c = fx_connect(&fx, "root");
        ck_assert_int_eq(dlx_mount(c, "@a/"), -EACCES);
        ck_assert_int_eq(mirror(c, "@a/x", 5, "x", NULL), -EACCES);
        ck_assert_int_eq(dlx_publish(c, "@a/x", fx_plain_f32(4, 0, NULL), NULL, NULL), -EACCES);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(federation_uid_by_name)
{
        dlx_client *c;

        start_fed("nobody");
        c = fx_connect(&fx, "root");
        ck_assert_int_eq(dlx_mount(c, "@a/"), -EACCES);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

static int nobody_meddles(void *arg)
{
        dlx_client *c = connect_as(NOBODY);
        struct dlx_acquire_options o = {.timeout_ms = 0};
        DLManagedTensorVersioned *t = NULL;
        int r;

        (void)arg;
        if (!c)
                return 90;
        if ((r = dlx_mount(c, "@a/")) != -EACCES)
                return 10;
        if ((r = dlx_mount(c, "@b/")) != -EACCES)
                return 11;
        if (mirror(c, "@a/x", 0, NULL, NULL) != -EACCES)
                return 12;
        if (mirror(c, "@a/y", 9, "forged", NULL) != -EACCES)
                return 13;
        if (mirror(c, "@b/y", 0, NULL, NULL) != -EACCES)
                return 14;
        /* an origin forged on a name of its own */
        if ((r = mirror(c, "mine/x", 9, NULL, NULL)) != -EINVAL)
                return 15;
        if ((r = mirror(c, "mine/y", 0, "ucx tcp <- gpu3 v7", NULL)) != -EINVAL)
                return 16;
        if (dlx_fetch_failed(c, "@a/w", 0, -EHOSTUNREACH, "gone") != -EACCES)
                return 17;
        if (dlx_fetch_failed(c, "@a/w", UINT64_MAX, -EHOSTUNREACH, "gone") != -EACCES)
                return 18;
        if (dlx_unpublish(c, "@a/m") != -EACCES)
                return 19;
        /* it may still read the mirror */
        if (dlx_acquire(c, "@a/m", &o, &t) != 0)
                return 20;
        t->deleter(t);
        dlx_close(c);
        return 0;
}

START_TEST(other_uid_cannot_mount_publish_fail_or_unpublish)
{
        dlx_client *b, *waiterc;
        struct waiter w;
        struct dlx_info info;
        int st;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(mirror(b, "@a/m", 3, "o", NULL), 0);
        waiter_start(&w, "@a/w", 0, 3000 * fx_slowdown());
        expect_wanted(b, "@a/w", 0);
        st = fx_wait(fx_spawn(nobody_meddles, NULL));
        ck_assert_int_eq(st, 0);
        waiter_join(&w);
        /* nobody's fetch_failed did not fail the waiter: it timed out */
        ck_assert_int_eq(w.rc, -ETIMEDOUT);
        waiterc = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_stat(waiterc, "@a/m", &info), 0);
        ck_assert_uint_eq(info.version, 3);
        ck_assert_int_eq(dlx_stat(waiterc, "mine/x", &info), -ENOENT);
        dlx_close(waiterc);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* "only this client publishes under prefix (others get -EACCES)": a second client of the
 * bridge's own uid, which has not mounted. */
START_TEST(same_uid_other_client_cannot_publish)
{
        dlx_client *b, *o;
        struct waiter w;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        o = fx_connect(&fx, "same-uid");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(mirror(o, "@a/x", 0, NULL, NULL), -EACCES);
        ck_assert_int_eq(mirror(o, "@a/x", 4, "o", NULL), -EACCES);
        ck_assert_int_eq(dlx_fetch_failed(o, "@a/x", 0, -EHOSTUNREACH, NULL), -EACCES);
        ck_assert_int_eq(dlx_mount(o, "@a/"), -EBUSY);
        /* a prefix nobody mounted: the other client may mount it, not publish elsewhere */
        ck_assert_int_eq(mirror(o, "@b/x", 0, NULL, NULL), -EACCES);
        ck_assert_int_eq(mirror(b, "@b/x", 0, NULL, NULL), -EACCES);
        /* b's mirror: o may not unpublish it */
        ck_assert_int_eq(mirror(b, "@a/m", 0, NULL, NULL), 0);
        ck_assert_int_eq(dlx_unpublish(o, "@a/m"), -EACCES);
        /* o's fetch_failed on b's name fails no waiter */
        waiter_start(&w, "@a/z", 0, 1500 * fx_slowdown());
        expect_wanted(b, "@a/z", 0);
        ck_assert_int_eq(dlx_fetch_failed(o, "@a/z", UINT64_MAX, -EHOSTUNREACH, NULL), -EACCES);
        waiter_join(&w);
        ck_assert_int_eq(w.rc, -ETIMEDOUT);
        dlx_close(o);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(prefix_shapes)
{
        static const char *const bad[] = {
                "@",      "@/",      "@a",
                "a/",     "@a//",    "@a/b/",
                "@a/b",   "@a\x01/", "@a\x7f/",
                "@\xff/", "@\xc3/",  "x@a/",
                " @a/",   "@a/ ",    "@123456789012345678901234567890123/", /* 33 bytes */
        };
        dlx_client *b;
        size_t i;
        int r;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                r = dlx_mount(b, bad[i]);
                ck_assert_msg(r == -EINVAL, "mount('%s') = %d", bad[i], r);
        }
        ck_assert_int_eq(dlx_mount(b, NULL), -EINVAL);
        ck_assert_int_eq(dlx_mount(NULL, "@a/"), -EINVAL);
        ck_assert_int_eq(dlx_mount(b, "@12345678901234567890123456789012/"), 0); /* 32 */
        ck_assert_int_eq(dlx_mount(b, "@h\xc3\xa9t\xc3\xa9/"), 0);
        ck_assert_int_eq(dlx_mount(b, "@@/"), 0);
        ck_assert_int_eq(mirror(b, "@h\xc3\xa9t\xc3\xa9/x", 2, "o", NULL), 0);
        ck_assert_int_eq(mirror(b, "@12345678901234567890123456789012/x/y", 0, NULL, NULL), 0);
        /* names under the mount of a bad shape are still bad */
        ck_assert_int_eq(mirror(b, "@@/./x", 0, NULL, NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "@@//x", 0, NULL, NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "@@/", 0, NULL, NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "@@/x/..", 0, NULL, NULL), -EINVAL);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* "@a/" and "@ab/" are two prefixes: no cross-talk. */
START_TEST(prefix_is_not_a_string_prefix)
{
        dlx_client *b1, *b2;
        struct waiter w;

        start_fed("0");
        b1 = fx_connect(&fx, "b1");
        b2 = fx_connect(&fx, "b2");
        ck_assert_int_eq(dlx_mount(b1, "@a/"), 0);
        ck_assert_int_eq(dlx_mount(b2, "@ab/"), 0);
        ck_assert_int_eq(mirror(b1, "@ab/x", 0, NULL, NULL), -EACCES);
        ck_assert_int_eq(mirror(b2, "@a/x", 0, NULL, NULL), -EACCES);
        ck_assert_int_eq(dlx_fetch_failed(b1, "@ab/x", 0, -EIO, NULL), -EACCES);
        waiter_start(&w, "@ab/x", 0, -1);
        expect_wanted(b2, "@ab/x", 0);
        expect_no_event(b1, 200);
        ck_assert_int_eq(mirror(b2, "@ab/x", 11, "o", NULL), 0);
        waiter_join(&w);
        ck_assert_int_eq(w.rc, 0);
        ck_assert_uint_eq(w.version, 11);
        dlx_close(b1);
        dlx_close(b2);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(too_many_mounts)
{
        dlx_client *b;
        char p[32];
        int i, r;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        for (i = 0; i < 1024; i++) {
                snprintf(p, sizeof(p), "@m%d/", i);
                r = dlx_mount(b, p);
                ck_assert_msg(r == 0, "mount %d = %d", i, r);
        }
        ck_assert_int_eq(dlx_mount(b, "@m0/"), 0); /* again: allowed */
        ck_assert_int_eq(dlx_mount(b, "@over/"), -EAGAIN);
        dlx_close(b);
        /* all freed at close: a new client mounts them */
        b = fx_connect(&fx, "bridge2");
        ck_assert_int_eq(dlx_mount(b, "@m5/"), 0);
        ck_assert_int_eq(dlx_mount(b, "@over/"), 0);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* ---- lazy fetch ----------------------------------------------------------------------------- */

START_TEST(lazy_fetch_publish_completes_waiter)
{
        dlx_client *b, *c;
        struct waiter w1, w2;
        struct dlx_info info;
        uint64_t v = 0;
        uint32_t t;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        t = track_ok(c, "@a/x");
        ck_assert_int_eq(dlx_watch(c, "@a/", NULL), 0);
        waiter_start(&w1, "@a/x", 0, -1);
        expect_wanted(b, "@a/x", 0);
        waiter_start(&w2, "@a/x", 0, -1);
        /* once per name and version */
        expect_no_event(b, 300);
        ck_assert_int_eq(mirror(b, "@a/x", 7, "ucx tcp/eth1 <- gpu3 v7", &v), 0);
        ck_assert_uint_eq(v, 7);
        waiter_join(&w1);
        waiter_join(&w2);
        ck_assert_int_eq(w1.rc, 0);
        ck_assert_uint_eq(w1.version, 7);
        ck_assert_int_eq(w2.rc, 0);
        ck_assert_uint_eq(w2.version, 7);
        ck_assert_int_eq(dlx_stat(c, "@a/x", &info), 0);
        ck_assert_uint_eq(info.version, 7);
        ck_assert_str_eq(info.origin, "ucx tcp/eth1 <- gpu3 v7");
        ck_assert_uint_eq(tracked_version(c, t), 7);
        {
                struct dlx_event ev;
                ck_assert_int_eq(dlx_next_event(c, &ev, 2000), 0);
                ck_assert_int_eq(ev.kind, DLX_EVENT_PUBLISHED);
                ck_assert_uint_eq(ev.version, 7);
        }
        /* origin_version 0: the next */
        ck_assert_int_eq(mirror(b, "@a/x", 0, NULL, &v), 0);
        ck_assert_uint_eq(v, 8);
        ck_assert_int_eq(dlx_stat(c, "@a/x", &info), 0);
        ck_assert_str_eq(info.origin, "");
        ck_assert_int_eq(mirror(b, "@a/x", 8, NULL, NULL), -EEXIST);
        ck_assert_int_eq(mirror(b, "@a/x", 3, NULL, NULL), -EEXIST);
        ck_assert_int_eq(mirror(b, "@a/x", 100, NULL, &v), 0);
        ck_assert_uint_eq(v, 100);
        ck_assert_uint_eq(tracked_version(c, t), 100);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(waiters_before_mount_are_announced)
{
        dlx_client *b;
        struct waiter w;

        start_fed("0");
        waiter_start(&w, "@a/x", 4, -1);
        settle();
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        expect_wanted(b, "@a/x", 4);
        /* mounting again announces what was dropped: nothing here (dlx.h, dlx_mount) */
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        expect_no_event(b, 200);
        ck_assert_int_eq(mirror(b, "@a/x", 3, NULL, NULL), 0);
        expect_no_event(b, 200);
        settle();
        ck_assert_int_eq(w.rc, 12345); /* still waiting: 3 < 4 */
        ck_assert_int_eq(mirror(b, "@a/x", 4, NULL, NULL), 0);
        waiter_join(&w);
        ck_assert_int_eq(w.rc, 0);
        ck_assert_uint_eq(w.version, 4);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(no_wait_no_wanted)
{
        dlx_client *b, *c;
        struct dlx_acquire_options o = {.timeout_ms = 0};
        DLManagedTensorVersioned *t = NULL;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(dlx_acquire(c, "@a/x", &o, &t), -ENOENT);
        expect_no_event(b, 300);
        /* a name not under the mount: no WANTED */
        o.timeout_ms = 100;
        ck_assert_int_eq(dlx_acquire(c, "@a", &o, &t), -ETIMEDOUT);
        ck_assert_int_eq(dlx_acquire(c, "@ab/x", &o, &t), -ETIMEDOUT);
        expect_no_event(b, 200);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(fetch_failed_fails_waiters)
{
        dlx_client *b;
        struct waiter w0, w5, w9, wmax;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        waiter_start(&w0, "@a/x", 0, -1);
        expect_wanted(b, "@a/x", 0);
        waiter_start(&w5, "@a/x", 5, -1);
        expect_wanted(b, "@a/x", 5);
        waiter_start(&w9, "@a/x", 9, -1);
        expect_wanted(b, "@a/x", 9);
        waiter_start(&wmax, "@a/x", UINT64_MAX, -1);
        expect_wanted(b, "@a/x", UINT64_MAX);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EHOSTUNREACH, "peer gpu3 lost"), 0);
        waiter_join(&w0);
        ck_assert_int_eq(w0.rc, -EHOSTUNREACH);
        ck_assert_msg(strstr(w0.err, "peer gpu3 lost"), "message: %s", w0.err);
        settle();
        ck_assert_int_eq(w5.rc, 12345);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 8, -ENOENT, NULL), 0);
        waiter_join(&w5);
        ck_assert_int_eq(w5.rc, -ENOENT);
        settle();
        ck_assert_int_eq(w9.rc, 12345);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", UINT64_MAX, -ETIMEDOUT, "slow"), 0);
        waiter_join(&w9);
        waiter_join(&wmax);
        ck_assert_int_eq(w9.rc, -ETIMEDOUT);
        ck_assert_int_eq(wmax.rc, -ETIMEDOUT);
        /* after a failure, a new waiter is announced again */
        waiter_start(&w0, "@a/x", 0, -1);
        expect_wanted(b, "@a/x", 0);
        ck_assert_int_eq(mirror(b, "@a/x", 2, NULL, NULL), 0);
        waiter_join(&w0);
        ck_assert_int_eq(w0.rc, 0);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/*
 * dlx.h: every acquire "fails with err and message ... err is one of the
 * errnos the protocol carries: ..."; another err is -EINVAL. Every errno a
 * bridge may name: those listed arrive intact, the others are refused.
 */
START_TEST(fetch_failed_every_errno)
{
        static const int errs[] = {EHOSTUNREACH, ENOENT,      EACCES,     ETIMEDOUT, EIO,    EPERM,
                                   ECONNREFUSED, ENETUNREACH, EPROTO,     ENOMEM,    ENOSPC, EAGAIN,
                                   EINVAL,       ESHUTDOWN,   ECONNRESET, 4095,      100000};
        dlx_client *b;
        struct waiter w;
        size_t i;
        char bad[1024];

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        bad[0] = 0;
        for (i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
                int r;

                waiter_start(&w, "@a/e", 0, -1);
                expect_wanted(b, "@a/e", 0);
                r = dlx_fetch_failed(b, "@a/e", 0, -errs[i], "m");
                if (r != 0) {
                        bool listed = errs[i] != EPERM && errs[i] != ECONNREFUSED &&
                                      errs[i] != ENETUNREACH && errs[i] != 4095 &&
                                      errs[i] != 100000;
                        ck_assert_int_eq(r, -EINVAL);
                        ck_assert_int_eq(dlx_fetch_failed(b, "@a/e", 0, -EHOSTUNREACH, "m"), 0);
                        waiter_join(&w);
                        if (listed)
                                snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad),
                                         " [%d refused]", errs[i]);
                        continue;
                }
                waiter_join(&w);
                if (w.rc != -errs[i])
                        snprintf(bad + strlen(bad), sizeof(bad) - strlen(bad), " [%d -> %d]",
                                 errs[i], -w.rc);
        }
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/e", 0, 0, "m"), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/e", 0, 5, "m"), -EINVAL);
        dlx_close(b);
        dlxd_stop(&fx);
        ck_assert_msg(bad[0] == 0, "waiters got another errno:%s", bad);
}
END_TEST

START_TEST(fetch_failed_messages)
{
        dlx_client *b;
        struct waiter w;
        char m255[256], m256[257];

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        memset(m255, 'm', 255);
        m255[255] = 0;
        memset(m256, 'm', 256);
        m256[256] = 0;
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, m256), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, "\x1b[2J"), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, "a\nb"), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, "\xff\xfe"), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, "\xc3"), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, "\xc2\x9b"), -EINVAL); /* C1 CSI */
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, ""), 0);
        ck_assert_int_eq(dlx_fetch_failed(b, NULL, 0, -EIO, NULL), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(NULL, "@a/x", 0, -EIO, NULL), -EINVAL);
        /* names outside the mount, bad names */
        ck_assert_int_eq(dlx_fetch_failed(b, "@b/x", 0, -EIO, NULL), -EACCES);
        ck_assert_int_eq(dlx_fetch_failed(b, "plain", 0, -EIO, NULL), -EACCES);
        {
                int r = dlx_fetch_failed(b, "@a//x", 0, -EIO, NULL);
                ck_assert_msg(r == -EINVAL || r == -EACCES, "bad name: %d", r);
        }
        waiter_start(&w, "@a/x", 0, -1);
        expect_wanted(b, "@a/x", 0);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, m255), 0);
        waiter_join(&w);
        ck_assert_int_eq(w.rc, -EIO);
        ck_assert_msg(strstr(w.err, m255), "message cut: %s", w.err);
        waiter_start(&w, "@a/x", 0, -1);
        expect_wanted(b, "@a/x", 0);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, "caf\xc3\xa9 \xe2\x82\xac"), 0);
        waiter_join(&w);
        ck_assert_msg(strstr(w.err, "caf\xc3\xa9 \xe2\x82\xac"), "message: %s", w.err);
        waiter_start(&w, "@a/x", 0, -1);
        expect_wanted(b, "@a/x", 0);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x", 0, -EIO, NULL), 0);
        waiter_join(&w);
        ck_assert_int_eq(w.rc, -EIO);
        ck_assert_msg(w.err[0], "no generic message");
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(origin_strings)
{
        dlx_client *b, *c;
        struct dlx_info info;
        char o127[128], o128[129];

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        memset(o127, 'o', 127);
        o127[127] = 0;
        memset(o128, 'o', 128);
        o128[128] = 0;
        ck_assert_int_eq(mirror(b, "@a/x", 1, o128, NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "@a/x", 1, "\x1b]0;pwned\x07", NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "@a/x", 1, "a\tb", NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "@a/x", 1, "\xff", NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "@a/x", 1, "\xc2\x9b", NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "@a/x", 1, o127, NULL), 0);
        ck_assert_int_eq(dlx_stat(c, "@a/x", &info), 0);
        ck_assert_str_eq(info.origin, o127);
        /* the bridge's origin fields on a name outside its mount */
        ck_assert_int_eq(mirror(b, "plain/x", 3, NULL, NULL), -EINVAL);
        ck_assert_int_eq(mirror(b, "plain/x", 0, "o", NULL), -EINVAL);
        ck_assert_int_eq(dlx_stat(c, "plain/x", &info), -ENOENT);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* origin_version at UINT64_MAX: what comes next? */
START_TEST(origin_version_max)
{
        dlx_client *b, *c;
        struct dlx_info info;
        uint64_t v = 0;
        int r;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(mirror(b, "@a/x", UINT64_MAX, NULL, &v), 0);
        ck_assert_uint_eq(v, UINT64_MAX);
        r = mirror(b, "@a/x", 0, NULL, &v);
        ck_assert_msg(r != 0, "a version after UINT64_MAX: %llu", (unsigned long long)v);
        ck_assert_int_eq(mirror(b, "@a/x", UINT64_MAX, NULL, NULL), -EEXIST);
        ck_assert_int_eq(dlx_stat(c, "@a/x", &info), 0);
        ck_assert_uint_eq(info.version, UINT64_MAX);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* What the wrap past UINT64_MAX leads to (diagnostic: prints what it sees). */
START_TEST(origin_version_wrap_consequences)
{
        dlx_client *b, *c;
        struct dlx_info info;
        struct dlx_acquire_options o = {.timeout_ms = 0};
        DLManagedTensorVersioned *t = NULL;
        uint64_t v = 0, v2 = 0, tv;
        uint32_t tr;
        int r, r2, ra, rs;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        tr = track_ok(c, "@a/x");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(mirror(b, "@a/x", UINT64_MAX, NULL, &v), 0);
        r = mirror(b, "@a/x", 0, NULL, &v);
        rs = dlx_stat(c, "@a/x", &info);
        tv = tracked_version(c, tr);
        ra = dlx_acquire(c, "@a/x", &o, &t);
        if (ra == 0)
                t->deleter(t);
        r2 = mirror(b, "@a/x", 5, NULL, &v2);
        fprintf(stderr,
                "wrap: publish(0) after MAX = %d v=%llu; stat %d v=%llu; tracked %llu; "
                "acquire %d; publish(5) = %d v=%llu\n",
                r, (unsigned long long)v, rs, (unsigned long long)info.version,
                (unsigned long long)tv, ra, r2, (unsigned long long)v2);
        ck_assert_msg(r != 0 && r2 != 0, "versions wrapped to %llu then went to %llu",
                      (unsigned long long)v, (unsigned long long)v2);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* "must be above the name's last version": an unpublish does not reset it. */
START_TEST(origin_version_after_unpublish)
{
        dlx_client *b, *c;
        uint64_t v = 0;
        uint32_t t;
        int r;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        t = track_ok(c, "@a/x");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(mirror(b, "@a/x", 50, NULL, NULL), 0);
        ck_assert_int_eq(dlx_unpublish(b, "@a/x"), 0);
        r = mirror(b, "@a/x", 10, NULL, &v);
        /* either refused, or the tracker must not see versions go down */
        if (r == 0)
                ck_assert_msg(tracked_version(c, t) >= 50 || v > 50,
                              "version went down after unpublish: %llu", (unsigned long long)v);
        else
                ck_assert_int_eq(r, -EEXIST);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* ---- the bridge goes away -------------------------------------------------------------------- */

START_TEST(bridge_closes_waiters_then_new_bridge)
{
        dlx_client *b, *c;
        struct waiter w;
        struct dlx_info info;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(mirror(b, "@a/m", 5, "o", NULL), 0);
        waiter_start(&w, "@a/x", 0, -1);
        expect_wanted(b, "@a/x", 0);
        dlx_close(b);
        settle();
        c = fx_connect(&fx, "c");
        /* the mirror went with its (non-persistent) publisher */
        ck_assert_int_eq(dlx_stat(c, "@a/m", &info), -ENOENT);
        /* nobody may publish there now */
        ck_assert_int_eq(mirror(c, "@a/x", 0, NULL, NULL), -EACCES);
        b = fx_connect(&fx, "bridge2");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        if (w.rc == 12345) {
                expect_wanted(b, "@a/x", 0);
                ck_assert_int_eq(mirror(b, "@a/x", 1, NULL, NULL), 0);
        }
        waiter_join(&w);
        fprintf(stderr, "bridge closed: waiter %d %s\n", w.rc, w.err);
        /* the waiter either fetched through the new bridge or failed when the old left */
        ck_assert_msg(w.rc == 0 || w.rc == -EHOSTUNREACH, "waiter: %d %s", w.rc, w.err);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

static int bridge_child(void *arg)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "kid"};
        dlx_client *b = NULL;
        int *pfd = arg;
        struct dlx_event ev;
        struct dlx_publish_options po = {.persist = true, .origin_version = 9, .origin = "p"};

        if (dlx_connect(&o, &b) != 0)
                _exit(90);
        if (dlx_mount(b, "@k/") != 0)
                _exit(91);
        if (dlx_publish(b, "@k/persist", fx_plain_f32(4, 0, NULL), &po, NULL) != 0)
                _exit(92);
        if (dlx_next_event(b, &ev, 10000) != 0)
                _exit(93);
        if (write(pfd[1], "x", 1) != 1)
                _exit(94);
        pause();
        _exit(0);
}

START_TEST(bridge_killed_with_waiters)
{
        int pfd[2];
        pid_t kid;
        char ch;
        struct waiter w[8];
        dlx_client *b, *c;
        struct dlx_info info;
        int i;

        start_fed("0");
        ck_assert_int_eq(pipe(pfd), 0);
        kid = fx_spawn(bridge_child, pfd);
        settle();
        for (i = 0; i < 8; i++)
                waiter_start(&w[i], "@k/x", (uint64_t)i, 10000 * fx_slowdown());
        ck_assert_int_eq(read(pfd[0], &ch, 1), 1);
        close(pfd[0]);
        close(pfd[1]);
        settle();
        kill(kid, SIGKILL);
        ck_assert_int_eq(fx_wait(kid), 128 + SIGKILL);
        settle();
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_stat(c, "@k/persist", &info), 0);
        ck_assert_uint_eq(info.version, 9);
        ck_assert_str_eq(info.origin, "p");
        b = fx_connect(&fx, "bridge2");
        ck_assert_int_eq(dlx_mount(b, "@k/"), 0);
        /* persistent mirror's next version must go above 9 */
        ck_assert_int_eq(mirror(b, "@k/persist", 9, NULL, NULL), -EEXIST);
        ck_assert_int_eq(mirror(b, "@k/persist", 0, NULL, NULL), 0);
        /* the new bridge can unpublish the old one's persistent mirror */
        ck_assert_int_eq(dlx_unpublish(b, "@k/persist"), 0);
        ck_assert_int_eq(mirror(b, "@k/x", 20, NULL, NULL), 0);
        for (i = 0; i < 8; i++) {
                waiter_join(&w[i]);
                ck_assert_msg(w[i].rc == 0 || w[i].rc == -EHOSTUNREACH, "waiter %d: %d %s", i,
                              w[i].rc, w[i].err);
        }
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* A waiter's client dies while it waits; the WANTED it caused is harmless. */
static int waiter_child(void *arg)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "kid"};
        struct dlx_acquire_options ao = {.timeout_ms = -1};
        dlx_client *c = NULL;
        DLManagedTensorVersioned *t;

        (void)arg;
        if (dlx_connect(&o, &c) != 0)
                _exit(90);
        dlx_acquire(c, "@a/dies", &ao, &t);
        _exit(1);
}

START_TEST(waiter_dies)
{
        dlx_client *b;
        pid_t kid;
        struct dlx_stats s;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        kid = fx_spawn(waiter_child, NULL);
        expect_wanted(b, "@a/dies", 0);
        kill(kid, SIGKILL);
        fx_wait(kid);
        fx_wait_clients(b, 1, 5000);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/dies", 0, -EIO, NULL), 0);
        ck_assert_int_eq(mirror(b, "@a/dies", 1, NULL, NULL), 0);
        /* re-mount announces nothing: no waiter left */
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        expect_no_event(b, 300);
        s = fx_stats(b);
        ck_assert_uint_eq(s.clients, 1);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(group_acquire_of_mirror)
{
        dlx_client *b;
        struct waiter w;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        memset(&w, 0, sizeof(w));
        w.name = "@a/g";
        w.timeout_ms = -1;
        w.group = true;
        w.rc = 12345;
        w.c = fx_connect(&fx, "gw");
        ck_assert_int_eq(pthread_create(&w.th, NULL, waiter_run, &w), 0);
        expect_wanted(b, "@a/g", 0);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/g", 0, -EHOSTUNREACH, "no peer"), 0);
        waiter_join(&w);
        ck_assert_int_eq(w.rc, -EHOSTUNREACH);
        ck_assert_msg(strstr(w.err, "no peer"), "%s", w.err);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* A bridge that reads no event while many acquires pile up: others are not slowed, the
 * daemon lives, and a re-mount announces the waiters again. */
START_TEST(bridge_never_reads)
{
        enum { CLIENTS = 16, PER = 100 };
        dlx_client *b, *c[CLIENTS], *other;
        int i, j, lost = 0, wanted = 0;
        int64_t t0;
        char name[200];
        struct dlx_event ev;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        other = fx_connect(&fx, "other");
        /* raw waiters: pipelined acquires, never read */
        int socks[CLIENTS];
        for (i = 0; i < CLIENTS; i++) {
                uint8_t *buf = NULL;
                size_t len = 0, cap = 0;

                socks[i] = rp_connect(fx.socket, "flood");
                for (j = 0; j < PER; j++) {
                        struct wire_request req;

                        snprintf(name, sizeof(name), "@a/%d/%d/%0120d", i, j, 0);
                        rp_acquire_req(&req, 100 + j, name);
                        req.acquire.timeout_ms = -1;
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                rp_send_until_stalled(socks[i], buf, len, 2000);
                free(buf);
        }
        (void)c;
        t0 = fx_now_ms();
        for (i = 0; i < 50; i++)
                ck_assert_int_eq(dlx_ping(other), 0);
        ck_assert_msg(fx_now_ms() - t0 < 2000 * fx_slowdown(), "pings slowed");
        /* now read all: WANTED or LOST */
        while (dlx_next_event(b, &ev, 500) == 0) {
                if (ev.kind == DLX_EVENT_LOST)
                        lost++;
                else if (ev.kind == DLX_EVENT_WANTED)
                        wanted++;
        }
        fprintf(stderr, "bridge_never_reads: wanted %d lost %d\n", wanted, lost);
        ck_assert_int_ge(wanted, 1);
        if (lost || wanted < CLIENTS * PER) {
                ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
                wanted = 0;
                while (dlx_next_event(b, &ev, 500) == 0)
                        if (ev.kind == DLX_EVENT_WANTED)
                                wanted++;
                ck_assert_int_eq(wanted, CLIENTS * PER);
        }
        for (i = 0; i < CLIENTS; i++)
                close(socks[i]);
        fx_wait_clients(other, 2, 5000);
        dlx_close(other);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* Pipelined on a raw socket: mount, publish and fetch-failed in one write. */
START_TEST(raw_pipelined_mount_publish_fail)
{
        int s;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        struct wire_request req;
        struct wire_reply rep;
        int r, i, ok = 0, seen = 0;
        dlx_client *c;
        struct dlx_info info;

        start_fed("0");
        s = rp_connect(fx.socket, "raw-bridge");
        memset(&req, 0, sizeof(req));
        req.id = 2;
        req.type = WIRE_REQ_MOUNT;
        strcpy(req.mount.prefix, "@r/");
        rp_frame_append(&buf, &len, &cap, &req);
        memset(&req, 0, sizeof(req));
        req.id = 3;
        req.type = WIRE_REQ_FETCH_FAILED;
        strcpy(req.fetch_failed.name, "@r/x");
        req.fetch_failed.min_version = UINT64_MAX;
        req.fetch_failed.status = WIRE_UNREACHABLE;
        strcpy(req.fetch_failed.error, "lost");
        rp_frame_append(&buf, &len, &cap, &req);
        /* fetch-failed with status OK, and an unknown status */
        req.id = 4;
        req.fetch_failed.status = WIRE_OK;
        rp_frame_append(&buf, &len, &cap, &req);
        req.id = 5;
        req.fetch_failed.status = 999;
        rp_frame_append(&buf, &len, &cap, &req);
        req.id = 6;
        req.fetch_failed.status = WIRE_CLOSED;
        rp_frame_append(&buf, &len, &cap, &req);
        ck_assert_int_eq(rp_send_raw(s, buf, len, NULL, 0), 0);
        free(buf);
        for (i = 0; i < 5; i++) {
                r = rp_read_answer(s, &rep, REPLY_MS, NULL);
                ck_assert_int_eq(r, 1);
                seen++;
                fprintf(stderr, "raw pipelined: id %llu status %d %s\n", (unsigned long long)rep.id,
                        rep.status, rep.error);
                if (rep.id == 2 || rep.id == 3)
                        ck_assert_int_eq(rep.status, WIRE_OK);
                if (rep.id == 4 || rep.id == 5)
                        ck_assert_int_eq(rep.status, WIRE_INVALID);
                ok++;
        }
        ck_assert_int_eq(seen, 5);
        close(s);
        c = fx_connect(&fx, "c");
        fx_wait_clients(c, 1, 5000);
        ck_assert_int_eq(dlx_stat(c, "@r/x", &info), -ENOENT);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* A 1.4 session: Mount is not in its protocol. */
START_TEST(raw_old_protocol_mount)
{
        int s;
        struct wire_request req;
        struct wire_reply rep;
        int r;

        start_fed("0");
        s = rp_connect_minor(fx.socket, "old", 4);
        memset(&req, 0, sizeof(req));
        req.id = 2;
        req.type = WIRE_REQ_MOUNT;
        strcpy(req.mount.prefix, "@o/");
        rp_send(s, &req, -1);
        r = rp_read_answer(s, &rep, REPLY_MS, NULL);
        fprintf(stderr, "1.4 mount: r %d status %d %s\n", r, rep.status, rep.error);
        ck_assert_int_eq(r, 1);
        ck_assert_int_ne(rep.status, WIRE_OK);
        close(s);
        dlxd_stop(&fx);
}
END_TEST

/* A raw publish carrying origin fields outside a mount. */
START_TEST(raw_origin_outside_mount)
{
        int s, fd = -1;
        struct wire_request req;
        struct wire_reply rep;
        uint64_t seg;
        dlx_client *c;
        struct dlx_info info;

        start_fed("0");
        s = rp_connect(fx.socket, "raw");
        seg = rp_alloc(s, 2, 4096, &fd);
        close(fd);
        rp_publish_req(&req, 3, "plain/x", 64, seg, 0);
        req.publish.origin_version = 1000;
        rp_send(s, &req, -1);
        ck_assert_int_eq(rp_read_answer(s, &rep, REPLY_MS, NULL), 1);
        ck_assert_int_eq(rep.status, WIRE_INVALID);
        rp_publish_req(&req, 4, "plain/x", 64, seg, 0);
        strcpy(req.publish.origin, "forged");
        rp_send(s, &req, -1);
        ck_assert_int_eq(rp_read_answer(s, &rep, REPLY_MS, NULL), 1);
        ck_assert_int_eq(rep.status, WIRE_INVALID);
        rp_publish_req(&req, 5, "@z/x", 64, seg, 0);
        rp_send(s, &req, -1);
        ck_assert_int_eq(rp_read_answer(s, &rep, REPLY_MS, NULL), 1);
        ck_assert_int_eq(rep.status, WIRE_PERMISSION);
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_stat(c, "plain/x", &info), -ENOENT);
        dlx_close(c);
        close(s);
        dlxd_stop(&fx);
}
END_TEST

/* Watchers of '@' get no WANTED; watch events carry the origin's number. */
START_TEST(watchers_see_no_wanted)
{
        dlx_client *b, *wc;
        struct waiter w;
        struct dlx_event ev;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        wc = fx_connect(&fx, "watcher");
        ck_assert_int_eq(dlx_watch(wc, "@", NULL), 0);
        ck_assert_int_eq(dlx_watch(wc, "", NULL), 0);
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        waiter_start(&w, "@a/x", 3, -1);
        expect_wanted(b, "@a/x", 3);
        expect_no_event(wc, 300);
        ck_assert_int_eq(mirror(b, "@a/x", 3, NULL, NULL), 0);
        waiter_join(&w);
        ck_assert_int_eq(dlx_next_event(wc, &ev, 2000), 0);
        ck_assert_int_eq(ev.kind, DLX_EVENT_PUBLISHED);
        ck_assert_uint_eq(ev.version, 3);
        /* the bridge, watching its own prefix, also gets only watch events for it */
        ck_assert_int_eq(dlx_watch(b, "@a/", NULL), 0);
        ck_assert_int_eq(mirror(b, "@a/x", 10, NULL, NULL), 0);
        ck_assert_int_eq(dlx_next_event(b, &ev, 2000), 0);
        ck_assert_int_eq(ev.kind, DLX_EVENT_REPLACED);
        ck_assert_uint_eq(ev.version, 10);
        dlx_close(wc);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* A waiter that times out: its WANTED may already be out; a later waiter must still be
 * announced (the daemon must not think it already asked). */
START_TEST(timed_out_waiter_then_new_waiter)
{
        dlx_client *b, *c;
        struct dlx_acquire_options o = {.timeout_ms = 200};
        DLManagedTensorVersioned *t;
        struct waiter w;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(dlx_acquire(c, "@a/x", &o, &t), -ETIMEDOUT);
        expect_wanted(b, "@a/x", 0);
        /* the bridge never answered; a new waiter */
        waiter_start(&w, "@a/x", 0, 3000);
        {
                struct dlx_event ev;
                int r = dlx_next_event(b, &ev, 1000);
                fprintf(stderr, "second WANTED after timeout: %d\n", r);
        }
        ck_assert_int_eq(mirror(b, "@a/x", 1, NULL, NULL), 0);
        waiter_join(&w);
        ck_assert_int_eq(w.rc, 0);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* The bridge says bye (dlx_close) while holding a lease, with waiters pending. */
START_TEST(bridge_bye_with_leases)
{
        dlx_client *b, *c;
        DLManagedTensorVersioned *t;
        struct waiter w;
        struct dlx_info info;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(mirror(b, "@a/m", 2, NULL, NULL), 0);
        publish_copy(c, "local/x", NULL);
        t = acquire_ok(b, "local/x", NULL);
        waiter_start(&w, "@a/x", 0, 3000 * fx_slowdown());
        expect_wanted(b, "@a/x", 0);
        dlx_close(b); /* stays open for t */
        settle();
        /* after bye, the bridge's mount must be gone: a new bridge mounts */
        {
                dlx_client *b2 = fx_connect(&fx, "b2");
                int r = dlx_mount(b2, "@a/");
                ck_assert_msg(r == 0, "mount after bye: %d", r);
                ck_assert_int_eq(dlx_stat(c, "@a/m", &info), -ENOENT);
                if (w.rc == 12345) {
                        expect_wanted(b2, "@a/x", 0);
                        ck_assert_int_eq(mirror(b2, "@a/x", 1, NULL, NULL), 0);
                }
                waiter_join(&w);
                ck_assert_msg(w.rc == 0 || w.rc == -EHOSTUNREACH, "%d", w.rc);
                dlx_close(b2);
        }
        t->deleter(t);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* Racing mounts from many clients: exactly one wins. */
struct racer {
        pthread_t th;
        dlx_client *c;
        int rc;
        pthread_barrier_t *bar;
};

static void *race_run(void *arg)
{
        struct racer *r = arg;

        pthread_barrier_wait(r->bar);
        r->rc = dlx_mount(r->c, "@race/");
        return NULL;
}

START_TEST(racing_mounts)
{
        enum { N = 16 };
        struct racer r[N];
        pthread_barrier_t bar;
        int i, won = 0, round;

        start_fed("0");
        for (round = 0; round < 20; round++) {
                pthread_barrier_init(&bar, NULL, N);
                for (i = 0; i < N; i++) {
                        r[i].c = fx_connect(&fx, "racer");
                        r[i].bar = &bar;
                        pthread_create(&r[i].th, NULL, race_run, &r[i]);
                }
                won = 0;
                for (i = 0; i < N; i++) {
                        pthread_join(r[i].th, NULL);
                        if (r[i].rc == 0)
                                won++;
                        else
                                ck_assert_int_eq(r[i].rc, -EBUSY);
                }
                ck_assert_int_eq(won, 1);
                for (i = 0; i < N; i++)
                        dlx_close(r[i].c);
                pthread_barrier_destroy(&bar);
        }
        dlxd_stop(&fx);
}
END_TEST

/* dlxctl shows a mirror's origin. */
START_TEST(dlxctl_shows_origin)
{
        dlx_client *b;
        char cmd[512], out[4096];
        FILE *p;
        size_t n;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(mirror(b, "@a/x", 7, "ucx tcp/eth1 <- gpu3 v7", NULL), 0);
        snprintf(cmd, sizeof(cmd), "%s -s %s stat @a/x 2>&1; %s -s %s list 2>&1", getenv("DLXCTL"),
                 fx.socket, getenv("DLXCTL"), fx.socket);
        p = popen(cmd, "r");
        n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = 0;
        pclose(p);
        fprintf(stderr, "dlxctl:\n%s\n", out);
        ck_assert_msg(strstr(out, "gpu3 v7"), "no origin in dlxctl stat: %s", out);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* The bridge acquiring a name under its own mount, from another thread: the WANTED comes
 * to itself and it can answer. */
START_TEST(bridge_waits_on_itself)
{
        dlx_client *b;
        struct waiter w;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        memset(&w, 0, sizeof(w));
        w.name = "@a/self";
        w.timeout_ms = 5000;
        w.rc = 12345;
        w.c = b;
        ck_assert_int_eq(pthread_create(&w.th, NULL, waiter_run, &w), 0);
        expect_wanted(b, "@a/self", 0);
        ck_assert_int_eq(mirror(b, "@a/self", 1, NULL, NULL), 0);
        pthread_join(w.th, NULL);
        ck_assert_int_eq(w.rc, 0);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* Many waiters from one client on distinct names: the per-client wait limit applies, and
 * the fetch_failed of each name fails only that one. */
START_TEST(fetch_failed_only_matching_name)
{
        dlx_client *b;
        struct waiter wa, wb;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        waiter_start(&wa, "@a/x", 0, 3000 * fx_slowdown());
        expect_wanted(b, "@a/x", 0);
        waiter_start(&wb, "@a/x/y", 0, -1);
        expect_wanted(b, "@a/x/y", 0);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/x/y", UINT64_MAX, -EIO, NULL), 0);
        waiter_join(&wb);
        ck_assert_int_eq(wb.rc, -EIO);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a/", UINT64_MAX, -EIO, NULL), -EINVAL);
        ck_assert_int_eq(dlx_fetch_failed(b, "@a", UINT64_MAX, -EIO, NULL), -EACCES);
        waiter_join(&wa);
        ck_assert_int_eq(wa.rc, -ETIMEDOUT);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/*
 * With a small --max-queued, a bridge that reads nothing loses WANTED events
 * (LOST), and mounting again announces those dropped (dlx.h, dlx_mount):
 * within a few rounds every waiter has been announced once, without
 * queueing past the limit.
 */
START_TEST(lost_then_remount)
{
        enum { CLIENTS = 16, PER = 100 };
        const char *args[] = {"--federation-uid", "0", "--max-queued", "65536", NULL};
        dlx_client *b, *other;
        int i, j, lost = 0, wanted = 0, rounds;
        int socks[CLIENTS];
        char name[200];
        struct dlx_event ev;
        struct dlx_stats st;

        dlxd_start(&fx, args);
        b = fx_connect(&fx, "bridge");
        other = fx_connect(&fx, "other");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        for (i = 0; i < CLIENTS; i++) {
                uint8_t *buf = NULL;
                size_t len = 0, cap = 0;

                socks[i] = rp_connect(fx.socket, "flood");
                for (j = 0; j < PER; j++) {
                        struct wire_request req;

                        snprintf(name, sizeof(name), "@a/%d/%d/%0180d", i, j, 0);
                        rp_acquire_req(&req, 100 + j, name);
                        req.acquire.timeout_ms = -1;
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                rp_send_until_stalled(socks[i], buf, len, 2000);
                free(buf);
        }
        settle();
        st = fx_stats(other);
        fprintf(stderr, "lost_then_remount: queued %llu\n", (unsigned long long)st.queued);
        while (dlx_next_event(b, &ev, 500) == 0) {
                if (ev.kind == DLX_EVENT_LOST)
                        lost++;
                else if (ev.kind == DLX_EVENT_WANTED)
                        wanted++;
        }
        fprintf(stderr, "lost_then_remount: first wanted %d lost %d\n", wanted, lost);
        ck_assert_int_eq(wanted + (lost ? 0 : 0), wanted);
        /* re-mount while reading: in a few rounds every waiter must have been announced */
        for (rounds = 0; rounds < 5 && wanted < CLIENTS * PER; rounds++) {
                int w2 = 0, l2 = 0;

                ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
                st = fx_stats(other);
                while (dlx_next_event(b, &ev, 500) == 0) {
                        if (ev.kind == DLX_EVENT_LOST)
                                l2++;
                        else if (ev.kind == DLX_EVENT_WANTED)
                                w2++;
                }
                fprintf(stderr,
                        "lost_then_remount: round %d queued-after-mount %llu wanted %d lost %d\n",
                        rounds, (unsigned long long)st.queued, w2, l2);
                wanted += w2;
        }
        ck_assert_int_eq(wanted, CLIENTS * PER);
        for (i = 0; i < CLIENTS; i++)
                close(socks[i]);
        fx_wait_clients(other, 2, 5000);
        dlx_close(other);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* A waiter failed with -ECONNRESET or -ESHUTDOWN by a bridge keeps a working client. */
START_TEST(fetch_failed_connreset_does_not_kill_waiter_client)
{
        static const int errs[] = {ECONNRESET, ESHUTDOWN, EPROTO, EPROTONOSUPPORT,
                                   EBADF,      ETIMEDOUT, ENOMEM};
        dlx_client *b;
        struct waiter w;
        size_t i;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        for (i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
                struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "w"};
                dlx_client *wc = NULL;
                int r;

                ck_assert_int_eq(dlx_connect(&o, &wc), 0);
                memset(&w, 0, sizeof(w));
                w.name = "@a/e";
                w.timeout_ms = -1;
                w.c = wc;
                w.rc = 12345;
                pthread_create(&w.th, NULL, waiter_run, &w);
                expect_wanted(b, "@a/e", 0);
                ck_assert_int_eq(dlx_fetch_failed(b, "@a/e", 0, -errs[i], "m"), 0);
                pthread_join(w.th, NULL);
                r = dlx_ping(wc);
                fprintf(stderr, "errno %d: waiter got %d, then ping %d\n", errs[i], w.rc, r);
                ck_assert_msg(r == 0, "waiter's client broken after fetch_failed(%d): ping %d",
                              errs[i], r);
                dlx_close(wc);
        }
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

static int nobody_group_publish(void *arg)
{
        dlx_client *c = connect_as(NOBODY);
        struct dlx_member m[1] = {{.name = "m", .tensor = fx_plain_f32(4, 0, NULL)}};
        int r;

        (void)arg;
        if (!c)
                return 90;
        r = dlx_publish_group(c, "@a/g", m, 1, NULL, NULL);
        dlx_close(c);
        return r == -EACCES ? 0 : 10;
}

START_TEST(group_publish_under_at)
{
        dlx_client *b, *o;
        struct dlx_member m[1] = {{.name = "m", .tensor = NULL}};
        struct dlx_publish_options po = {.origin_version = 40, .origin = "grp"};
        struct dlx_info info;
        struct waiter w;
        uint64_t v = 0;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        o = fx_connect(&fx, "same-uid");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(fx_wait(fx_spawn(nobody_group_publish, NULL)), 0);
        m[0].tensor = fx_plain_f32(4, 0, NULL);
        ck_assert_int_eq(dlx_publish_group(o, "@a/g", m, 1, NULL, NULL), -EACCES);
        memset(&w, 0, sizeof(w));
        w.name = "@a/g";
        w.timeout_ms = -1;
        w.group = true;
        w.rc = 12345;
        w.c = fx_connect(&fx, "gw");
        pthread_create(&w.th, NULL, waiter_run, &w);
        expect_wanted(b, "@a/g", 0);
        m[0].tensor = fx_plain_f32(4, 0, NULL);
        ck_assert_int_eq(dlx_publish_group(b, "@a/g", m, 1, &po, &v), 0);
        ck_assert_uint_eq(v, 40);
        waiter_join(&w);
        ck_assert_int_eq(w.rc, 0);
        ck_assert_uint_eq(w.version, 40);
        ck_assert_int_eq(dlx_stat(o, "@a/g", &info), 0);
        ck_assert_str_eq(info.origin, "grp");
        dlx_close(o);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* A tensor waiter on a name that is a group (and the reverse): no WANTED, an error. */
START_TEST(wanted_kind_mismatch)
{
        dlx_client *b, *c;
        struct dlx_member m[1] = {{.name = "m", .tensor = NULL}};
        struct dlx_acquire_options o = {.timeout_ms = 500};
        DLManagedTensorVersioned *t = NULL;
        int r;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        m[0].tensor = fx_plain_f32(4, 0, NULL);
        ck_assert_int_eq(dlx_publish_group(b, "@a/g", m, 1, NULL, NULL), 0);
        r = dlx_acquire(c, "@a/g", &o, &t);
        fprintf(stderr, "tensor acquire of mirror group: %d\n", r);
        ck_assert_int_eq(r, -EISDIR);
        o.min_version = 5;
        r = dlx_acquire(c, "@a/g", &o, &t);
        fprintf(stderr, "tensor acquire v5 of mirror group: %d\n", r);
        {
                struct dlx_event ev;
                while (dlx_next_event(b, &ev, 200) == 0)
                        fprintf(stderr, "  event %d %s v%llu\n", ev.kind, ev.name,
                                (unsigned long long)ev.version);
        }
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* Many mount/close cycles of many prefixes with waiters: daemon memory does not grow. */
static long daemon_rss_kb(void)
{
        char path[64], line[256];
        long kb = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)fx.pid);
        f = fopen(path, "r");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %ld", &kb) == 1)
                        break;
        fclose(f);
        return kb;
}

START_TEST(mount_cycles_do_not_grow)
{
        dlx_client *b, *c;
        struct dlx_acquire_options o = {.timeout_ms = 1};
        DLManagedTensorVersioned *t;
        char p[64], n[96];
        long rss0 = 0, rss1;
        int round, i;

        /* memcheck and ASan keep freed memory aside: RSS says nothing there */
        if (getenv("DLX_TEST_VALGRIND"))
                return;
#ifdef __SANITIZE_ADDRESS__
        return;
#endif
        start_fed("0");
        c = fx_connect(&fx, "c");
        for (round = 0; round < 60; round++) {
                b = fx_connect(&fx, "bridge");
                for (i = 0; i < 200; i++) {
                        snprintf(p, sizeof(p), "@p%d/", i);
                        ck_assert_int_eq(dlx_mount(b, p), 0);
                }
                for (i = 0; i < 200; i++) {
                        snprintf(n, sizeof(n), "@p%d/x%d", i, round);
                        dlx_acquire(c, n, &o, &t);
                        dlx_fetch_failed(b, n, 0, -EIO, "x");
                        {
                                int r = mirror(b, n, (uint64_t)round + 1, "o", NULL);
                                ck_assert_msg(r == 0, "round %d i %d: mirror %d: %s", round, i, r,
                                              dlx_last_error());
                        }
                }
                dlx_close(b);
                if (round == 9)
                        rss0 = daemon_rss_kb();
        }
        rss1 = daemon_rss_kb();
        fprintf(stderr, "mount cycles: rss %ld -> %ld kB\n", rss0, rss1);
        ck_assert_msg(rss1 - rss0 < 2048, "daemon grew %ld kB", rss1 - rss0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* --max-queued bounds what waits for a bridge that reads nothing: past it, WANTED events are
 * dropped (DLX_EVENT_LOST: "After a DLX_EVENT_LOST, dlx_mount() again"), not queued without
 * limit. 64 clients x 256 waits on 250-byte names. */
START_TEST(wanted_queue_bounded)
{
        enum { CLIENTS = 64, PER = 256 };
        const char *args[] = {"--federation-uid", "0", "--max-queued", "65536", NULL};
        dlx_client *b, *other;
        int i, j, lost = 0, wanted = 0;
        int socks[CLIENTS];
        char name[300];
        struct dlx_event ev;
        struct dlx_stats st;
        long rss;

        if (getenv("DLX_TEST_VALGRIND"))
                return;
        dlxd_start(&fx, args);
        b = fx_connect(&fx, "bridge");
        other = fx_connect(&fx, "other");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        for (i = 0; i < CLIENTS; i++) {
                uint8_t *buf = NULL;
                size_t len = 0, cap = 0;

                socks[i] = rp_connect(fx.socket, "flood");
                for (j = 0; j < PER; j++) {
                        struct wire_request req;

                        snprintf(name, sizeof(name), "@a/%03d/%03d/%0240d", i, j, 0);
                        rp_acquire_req(&req, 100 + j, name);
                        req.acquire.timeout_ms = -1;
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                rp_send_until_stalled(socks[i], buf, len, 2000);
                free(buf);
        }
        settle();
        st = fx_stats(other);
        {
                char path[64], line[256];
                FILE *f;
                snprintf(path, sizeof(path), "/proc/%d/status", (int)fx.pid);
                f = fopen(path, "r");
                rss = -1;
                while (f && fgets(line, sizeof(line), f))
                        if (sscanf(line, "VmRSS: %ld", &rss) == 1)
                                break;
                if (f)
                        fclose(f);
        }
        fprintf(stderr,
                "wanted_queue_bounded: daemon queued %llu bytes (max-queued 65536), rss %ld kB\n",
                (unsigned long long)st.queued, rss);
        while (dlx_next_event(b, &ev, 1000) == 0) {
                if (ev.kind == DLX_EVENT_LOST)
                        lost++;
                else if (ev.kind == DLX_EVENT_WANTED)
                        wanted++;
        }
        fprintf(stderr, "wanted_queue_bounded: wanted %d lost %d\n", wanted, lost);
        for (i = 0; i < CLIENTS; i++)
                close(socks[i]);
        fx_wait_clients(other, 2, 10000);
        dlx_close(other);
        dlx_close(b);
        dlxd_stop(&fx);
        ck_assert_msg(st.queued <= 4 * 65536,
                      "%llu bytes queued for a bridge that reads nothing (--max-queued 65536), "
                      "%d WANTED, %d LOST",
                      (unsigned long long)st.queued, wanted, lost);
}
END_TEST

/* The same flood from another uid (nobody), past the daemon's queue limits in all. */
static int nobody_floods(void *arg)
{
        int *pfd = arg, i, j;
        static int socks[64];
        char name[300];

        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
                _exit(90);
        for (i = 0; i < 64; i++) {
                uint8_t *buf = NULL;
                size_t len = 0, cap = 0;

                socks[i] = rp_connect(fx.socket, "nobody-flood");
                for (j = 0; j < 256; j++) {
                        struct wire_request req;

                        snprintf(name, sizeof(name), "@a/%03d/%03d/%0240d", i, j, 0);
                        rp_acquire_req(&req, 100 + j, name);
                        req.acquire.timeout_ms = -1;
                        rp_frame_append(&buf, &len, &cap, &req);
                }
                rp_send_until_stalled(socks[i], buf, len, 2000);
                free(buf);
        }
        if (write(pfd[1], "x", 1) != 1)
                _exit(91);
        pause();
        _exit(0);
}

START_TEST(wanted_queue_bounded_other_uid)
{
        const char *args[] = {"--federation-uid", "0",     "--group", "65534",
                              "--max-queued",     "65536", NULL};
        dlx_client *b, *other;
        struct dlx_stats st;
        int pfd[2];
        pid_t kid;
        char ch;
        int64_t t0, dt;

        if (getenv("DLX_TEST_VALGRIND"))
                return;
        dlxd_start(&fx, args);
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        ck_assert_int_eq(chmod(fx.socket, 0666), 0);
        b = fx_connect(&fx, "bridge");
        other = fx_connect(&fx, "other");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        ck_assert_int_eq(pipe(pfd), 0);
        kid = fx_spawn(nobody_floods, pfd);
        ck_assert_int_eq(read(pfd[0], &ch, 1), 1);
        settle();
        st = fx_stats(other);
        t0 = fx_now_ms();
        ck_assert_int_eq(dlx_ping(other), 0);
        dt = fx_now_ms() - t0;
        fprintf(stderr, "other uid flood: daemon queued %llu bytes, ping %lld ms\n",
                (unsigned long long)st.queued, (long long)dt);
        kill(kid, SIGKILL);
        fx_wait(kid);
        close(pfd[0]);
        close(pfd[1]);
        fx_wait_clients(other, 2, 10000);
        dlx_close(other);
        dlx_close(b);
        dlxd_stop(&fx);
        ck_assert_msg(st.queued <= 16 * 65536,
                      "another uid queued %llu bytes on the bridge (16 x --max-queued = %d)",
                      (unsigned long long)st.queued, 16 * 65536);
}
END_TEST

/* DLX_EVENT_WANTED: "Sent once per name and version": a waiter at UINT64_MAX after one at
 * UINT64_MAX - 1 is a new version, and must be announced. */
START_TEST(wanted_max_after_max_minus_one)
{
        dlx_client *b;
        struct waiter w1, w2;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        waiter_start(&w1, "@a/x", UINT64_MAX - 1, -1);
        expect_wanted(b, "@a/x", UINT64_MAX - 1);
        waiter_start(&w2, "@a/x", UINT64_MAX, 3000 * fx_slowdown());
        {
                struct dlx_event ev;
                int r = dlx_next_event(b, &ev, 2000);
                ck_assert_msg(r == 0 && ev.kind == DLX_EVENT_WANTED && ev.version == UINT64_MAX,
                              "no WANTED for UINT64_MAX after UINT64_MAX - 1 (%d)", r);
        }
        ck_assert_int_eq(mirror(b, "@a/x", UINT64_MAX, NULL, NULL), 0);
        waiter_join(&w1);
        waiter_join(&w2);
        ck_assert_int_eq(w1.rc, 0);
        ck_assert_int_eq(w2.rc, 0);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* The same, after the lower one is served: the waiter at UINT64_MAX is still announced once. */
START_TEST(wanted_max_after_max_minus_one_served)
{
        dlx_client *b;
        struct waiter w1, w2;
        struct dlx_event ev;
        int r, got = 0;

        start_fed("0");
        b = fx_connect(&fx, "bridge");
        ck_assert_int_eq(dlx_mount(b, "@a/"), 0);
        waiter_start(&w1, "@a/x", UINT64_MAX - 1, -1);
        expect_wanted(b, "@a/x", UINT64_MAX - 1);
        waiter_start(&w2, "@a/x", UINT64_MAX, 3000 * fx_slowdown());
        settle();
        ck_assert_int_eq(mirror(b, "@a/x", UINT64_MAX - 1, NULL, NULL), 0);
        waiter_join(&w1);
        while ((r = dlx_next_event(b, &ev, 500)) == 0)
                if (ev.kind == DLX_EVENT_WANTED && ev.version == UINT64_MAX)
                        got++;
        waiter_join(&w2);
        dlx_close(b);
        dlxd_stop(&fx);
        ck_assert_msg(got == 1, "waiter at UINT64_MAX announced %d times; it %s", got,
                      w2.rc == -ETIMEDOUT ? "timed out unserved" : "ended");
}
END_TEST

/* MOUNT_ATTACKS_ONLY=<test name> runs that test alone. */
#define ADD(tc, fn)                                                                                \
        do {                                                                                       \
                const char *only = getenv("MOUNT_ATTACKS_ONLY");                                   \
                if (!only || !*only || strcmp(only, #fn) == 0)                                     \
                        tcase_add_test(tc, fn);                                                    \
        } while (0)

Suite *DLX_SUITE(void)
{
        Suite *s = suite_create("mount-attacks");
        TCase *tc = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 120);
        ADD(tc, no_federation_uid_nobody_mounts);
        ADD(tc, root_is_not_the_federation_uid);
        ADD(tc, federation_uid_by_name);
        ADD(tc, other_uid_cannot_mount_publish_fail_or_unpublish);
        ADD(tc, same_uid_other_client_cannot_publish);
        ADD(tc, prefix_shapes);
        ADD(tc, prefix_is_not_a_string_prefix);
        ADD(tc, too_many_mounts);
        ADD(tc, lazy_fetch_publish_completes_waiter);
        ADD(tc, waiters_before_mount_are_announced);
        ADD(tc, no_wait_no_wanted);
        ADD(tc, fetch_failed_fails_waiters);
        ADD(tc, fetch_failed_every_errno);
        ADD(tc, fetch_failed_messages);
        ADD(tc, origin_strings);
        ADD(tc, origin_version_max);
        ADD(tc, origin_version_after_unpublish);
        ADD(tc, origin_version_wrap_consequences);
        ADD(tc, bridge_closes_waiters_then_new_bridge);
        ADD(tc, bridge_killed_with_waiters);
        ADD(tc, waiter_dies);
        ADD(tc, group_acquire_of_mirror);
        ADD(tc, bridge_never_reads);
        ADD(tc, raw_pipelined_mount_publish_fail);
        ADD(tc, raw_old_protocol_mount);
        ADD(tc, raw_origin_outside_mount);
        ADD(tc, watchers_see_no_wanted);
        ADD(tc, timed_out_waiter_then_new_waiter);
        ADD(tc, bridge_bye_with_leases);
        ADD(tc, racing_mounts);
        ADD(tc, dlxctl_shows_origin);
        ADD(tc, bridge_waits_on_itself);
        ADD(tc, fetch_failed_only_matching_name);
        ADD(tc, lost_then_remount);
        ADD(tc, fetch_failed_connreset_does_not_kill_waiter_client);
        ADD(tc, group_publish_under_at);
        ADD(tc, wanted_kind_mismatch);
        ADD(tc, mount_cycles_do_not_grow);
        ADD(tc, wanted_queue_bounded);
        ADD(tc, wanted_queue_bounded_other_uid);
        ADD(tc, wanted_max_after_max_minus_one);
        ADD(tc, wanted_max_after_max_minus_one_served);
        suite_add_tcase(s, tc);
        return s;
}
