/* SPDX-License-Identifier: MIT */
/*
 * The daemon going away under its clients, stopped (SIGTERM) or killed
 * (SIGKILL): every call fails with -ECONNRESET and says the daemon is gone,
 * calls blocked at that moment included; tensors already acquired stay
 * readable; a daemon started again on the same socket path accepts a new
 * connection and starts empty (persistent names are gone too).
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"

/* How the daemon went: stopped (SIGTERM) or killed. */
static int gone_by;

/*
 * What a call on a client whose daemon has gone must say: -ESHUTDOWN ("the
 * daemon is stopping", its goodbye) when it was stopped; -ECONNRESET (the
 * header's "the daemon went away"; -EPIPE is its documented twin) when it
 * died; and a dlx_last_error() that says so in words.
 */
static void assert_gone(int err, const char *why, const char *call)
{
        if (gone_by == SIGTERM)
                ck_assert_msg(err == -ESHUTDOWN,
                              "%s after the daemon stopped: %d (%s), not -ESHUTDOWN", call, err,
                              dlx_strerror(err));
        else
                ck_assert_msg(err == -ECONNRESET || err == -EPIPE,
                              "%s after the daemon went away: %d (%s), not -ECONNRESET", call, err,
                              dlx_strerror(err));
        ck_assert_msg(strstr(why, "daemon") != NULL,
                      "%s after the daemon went away: dlx_last_error() says \"%s\"", call, why);
}

/* A call waiting in the daemon when it goes: an acquire of a name nobody publishes. */
struct blocked {
        dlx_client *c;
        int err;
        char why[512];
};

static void *acquire_blocked(void *arg)
{
        struct blocked *b = arg;
        struct dlx_acquire_options o = {.timeout_ms = 60000};
        DLManagedTensorVersioned *t = NULL;

        b->err = dlx_acquire(b->c, "restart/never", &o, &t);
        /* dlx_last_error() is per thread: keep this one's words */
        snprintf(b->why, sizeof(b->why), "%s", dlx_last_error());
        if (b->err == 0)
                t->deleter(t);
        return NULL;
}

static void daemon_goes_away(int sig)
{
        struct dlx_connect_options o = {.socket_path = fx.socket};
        struct dlx_publish_options persist = {.persist = true};
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *c = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *kept, *plain, *t = NULL;
        struct blocked b = {.c = c, .err = 1};
        struct timespec limit;
        struct dlx_info info;
        struct dlx_stats st;
        dlx_client *n = NULL;
        int deleted = 0, status, err;
        uint64_t version = 0;
        pthread_t th;

        publish_ok(p, "restart/persist", fx_counted(fx_vec_f32(p, 1000, 1.0f), &deleted), &persist,
                   NULL);
        publish_ok(p, "restart/plain", fx_counted(fx_vec_f32(p, 10, 5.0f), &deleted), NULL, NULL);
        kept = acquire_ok(c, "restart/persist", NULL);
        plain = acquire_ok(c, "restart/plain", NULL);
        ck_assert_int_eq(pthread_create(&th, NULL, acquire_blocked, &b), 0);
        /* let it reach the daemon (it fails the same way if it has not yet) */
        fx_sleep_ms(100);

        gone_by = sig;
        ck_assert_int_eq(kill(fx.pid, sig), 0);
        ck_assert_int_eq(waitpid(fx.pid, &status, 0), fx.pid);
        fx.pid = 0;
        if (sig == SIGTERM)
                ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                              "dlxd did not exit 0 on SIGTERM (status 0x%x)", status);

        /* the blocked call ends at once, with the error */
        clock_gettime(CLOCK_REALTIME, &limit);
        limit.tv_sec += 5;
        ck_assert_msg(pthread_timedjoin_np(th, NULL, &limit) == 0,
                      "an acquire blocked when the daemon went away is still blocked 5 s later");
        assert_gone(b.err, b.why, "a blocked dlx_acquire()");

        /* the next call on every client, of any kind, and the one after */
        err = dlx_ping(c);
        assert_gone(err, dlx_last_error(), "dlx_ping()");
        err = dlx_acquire(c, "restart/persist", NULL, &t);
        assert_gone(err, dlx_last_error(), "dlx_acquire()");
        err = dlx_stat(p, "restart/persist", &info);
        assert_gone(err, dlx_last_error(), "dlx_stat()");
        err = dlx_unpublish(p, "restart/plain");
        assert_gone(err, dlx_last_error(), "dlx_unpublish()");
        err = dlx_ping(p);
        assert_gone(err, dlx_last_error(), "a second call");

        /* what was acquired is still mapped, and intact */
        ck_assert(fx_vec_is(kept, 1000, 1.0f));
        ck_assert(fx_vec_is(plain, 10, 5.0f));

        /* nobody listens: a stopped daemon removed its socket, a killed one left it stale */
        err = dlx_connect(&o, &n);
        ck_assert_msg(err == (sig == SIGTERM ? -ENOENT : -ECONNREFUSED),
                      "connect with no daemon: %d (%s: %s)", err, dlx_strerror(err),
                      dlx_last_error());
        ck_assert_ptr_null(n);

        /* a new daemon on the same path: a reconnect works, and it starts empty */
        dlxd_restart(&fx, NULL);
        n = fx_connect(&fx, "reconnected");
        ck_assert_int_eq(dlx_acquire(n, "restart/persist", NULL, &t), -ENOENT);
        ck_assert_int_eq(dlx_acquire(n, "restart/plain", NULL, &t), -ENOENT);
        ck_assert_int_eq(dlx_stat(n, "restart/persist", &info), -ENOENT);
        ck_assert_int_eq(dlx_stats(n, &st), 0);
        ck_assert_uint_eq(st.names, 0);
        ck_assert_uint_eq(st.versions, 0);
        ck_assert_uint_eq(st.leases, 0);
        ck_assert_uint_eq(st.segments, 0);
        ck_assert_uint_eq(st.clients, 1);

        /* the old clients never talk to the new daemon */
        assert_gone(dlx_ping(c), dlx_last_error(), "dlx_ping() after the restart");

        /* the old name is free again: a new version 1 */
        publish_ok(n, "restart/persist", fx_vec_f32(n, 4, 9.0f), &persist, &version);
        ck_assert_uint_eq(version, 1);
        t = acquire_ok(n, "restart/persist", NULL);
        ck_assert(fx_vec_is(t, 4, 9.0f));
        t->deleter(t);

        /* releasing the old daemon's leases, before and after closing: nothing reaches it */
        plain->deleter(plain);
        dlx_close(c);
        ck_assert(fx_vec_is(kept, 1000, 1.0f));
        kept->deleter(kept);
        ck_assert_int_eq(fx_wait_leases(n, 0, 1000), 0);

        /* the producer's zero-copy tensors: their deleters run at close, daemon or not */
        ck_assert_int_eq(deleted, 0);
        dlx_close(p);
        ck_assert_int_eq(deleted, 2);
        ck_assert_int_eq(dlx_ping(n), 0);
        dlx_close(n);
}

START_TEST(stopped_daemon)
{
        daemon_goes_away(SIGTERM);
}
END_TEST

START_TEST(killed_daemon)
{
        daemon_goes_away(SIGKILL);
}
END_TEST

Suite *restart_suite(void)
{
        Suite *s = suite_create("restart");
        TCase *tc = tcase_create("restart");

        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, stopped_daemon);
        tcase_add_test(tc, killed_daemon);
        suite_add_tcase(s, tc);
        return s;
}
