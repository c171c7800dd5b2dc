/* SPDX-License-Identifier: MIT */
/*
 * Tracking (dlx.h, "tracking"): the current version of a name read from the
 * client's version page without a round trip, and waited for on its futex.
 * What the header promises: the version is there once the publish (or
 * unpublish) that made it has returned, in every process; a track of the same
 * name twice is one track; waits end on a change, a timeout, or the end of the
 * session, whatever ended it; and the page is the client's alone and
 * read-only: a raw peer that has its descriptor can neither write it, nor map
 * it writable, nor resize it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "rawpeer.h"
#include "verpage.h"

#define DLXV(call) ck_assert_int_eq((call), 0)

static void publish_vec(dlx_client *c, const char *name, uint64_t *ret_version)
{
        publish_ok(c, name, fx_vec_f32(c, 16, 1), NULL, ret_version);
}

/* Every change is there when the call that made it returns: publish, replace, unpublish. */
START_TEST(version_follows_every_change)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint64_t v;
        uint32_t t;

        publish_vec(p, "tr/a", &v);
        ck_assert_uint_eq(v, 1);
        t = track_ok(q, "tr/a");
        ck_assert_uint_eq(tracked_version(q, t), 1);
        for (uint64_t want = 2; want < 50; want++) {
                publish_vec(p, "tr/a", &v);
                ck_assert_uint_eq(v, want);
                ck_assert_uint_eq(tracked_version(q, t), want);
        }
        DLXV(dlx_unpublish(p, "tr/a"));
        ck_assert_uint_eq(tracked_version(q, t), 0);
        /* a tracked name keeps counting: the next version is not 1 again */
        publish_vec(p, "tr/a", &v);
        ck_assert_uint_eq(v, 50);
        ck_assert_uint_eq(tracked_version(q, t), 50);
        DLXV(dlx_untrack(q, t));
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A name tracked before it exists; a producer that leaves takes its version with it. */
START_TEST(tracked_before_published_and_after_producer)
{
        dlx_client *q = fx_connect(&fx, "tracker"), *p;
        uint32_t t = track_ok(q, "tr/later");

        ck_assert_uint_eq(tracked_version(q, t), 0);
        p = fx_connect(&fx, "producer");
        publish_vec(p, "tr/later", NULL);
        ck_assert_uint_eq(tracked_version(q, t), 1);
        /* not persistent: gone with its producer, once dlx_close() has returned */
        dlx_close(p);
        ck_assert_uint_eq(tracked_version(q, t), 0);
        dlx_close(q);
}
END_TEST

/* The same name twice is the same track, counted: each dlx_track() needs its dlx_untrack(). */
START_TEST(same_name_is_one_track)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t a = track_ok(q, "tr/x"), b = track_ok(q, "tr/x"), c = track_ok(q, "tr/y");
        uint64_t v;

        ck_assert_uint_eq(a, b);
        ck_assert_uint_ne(a, c);
        publish_vec(p, "tr/x", NULL);
        DLXV(dlx_untrack(q, a));
        ck_assert_uint_eq(tracked_version(q, b), 1);
        DLXV(dlx_untrack(q, b));
        ck_assert_int_eq(dlx_track_version(q, a, &v), -EINVAL);
        ck_assert_int_eq(dlx_untrack(q, a), -EINVAL);
        ck_assert_uint_eq(tracked_version(q, c), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

START_TEST(bad_arguments)
{
        dlx_client *q = fx_connect(&fx, "tracker");
        uint32_t t = 0;
        uint64_t v;

        ck_assert_int_eq(dlx_track(NULL, "a", &t), -EINVAL);
        ck_assert_int_eq(dlx_track(q, NULL, &t), -EINVAL);
        ck_assert_int_eq(dlx_track(q, "a", NULL), -EINVAL);
        ck_assert_int_eq(dlx_track(q, "", &t), -EINVAL);
        ck_assert_int_eq(dlx_track(q, "bad\nname", &t), -EINVAL);
        /* no page yet: nothing is a track */
        ck_assert_int_eq(dlx_track_version(q, 1, &v), -EINVAL);
        ck_assert_int_eq(dlx_track_wait(q, 1, 0, 0, &v), -EINVAL);
        t = track_ok(q, "tr/ok");
        ck_assert_int_eq(dlx_track_version(q, 0, &v), -EINVAL);
        ck_assert_int_eq(dlx_track_version(q, t + 1, &v), -EINVAL);
        ck_assert_int_eq(dlx_track_version(q, UINT32_MAX, &v), -EINVAL);
        ck_assert_int_eq(dlx_track_version(q, t, NULL), -EINVAL);
        ck_assert_int_eq(dlx_track_version(NULL, t, &v), -EINVAL);
        ck_assert_int_eq(dlx_track_wait(NULL, t, 0, 0, &v), -EINVAL);
        ck_assert_int_eq(dlx_track_wait(q, t, 0, 0, &v), -EAGAIN);
        ck_assert_int_eq(dlx_untrack(NULL, t), -EINVAL);
        ck_assert_int_eq(dlx_untrack(q, 0), -EINVAL);
        ck_assert_int_eq(dlx_untrack(q, UINT32_MAX), -EINVAL);
        dlx_close(q);
}
END_TEST

struct waiter {
        dlx_client *c;
        uint32_t track;
        uint64_t after;
        int64_t timeout_ms;
        int err;
        uint64_t seen;
};

static void *wait_thread(void *arg)
{
        struct waiter *w = arg;

        w->err = dlx_track_wait(w->c, w->track, w->after, w->timeout_ms, &w->seen);
        return NULL;
}

/* Threads asleep on a track wake for a publish, an unpublish and an untrack, with what changed. */
START_TEST(waits_end_on_every_change)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "tr/w");
        struct waiter w[4];
        pthread_t th[4];

        for (int i = 0; i < 4; i++) {
                w[i] = (struct waiter){.c = q, .track = t, .after = 0, .timeout_ms = -1};
                ck_assert_int_eq(pthread_create(&th[i], NULL, wait_thread, &w[i]), 0);
        }
        fx_sleep_ms(50);
        publish_vec(p, "tr/w", NULL);
        for (int i = 0; i < 4; i++) {
                pthread_join(th[i], NULL);
                ck_assert_int_eq(w[i].err, 0);
                ck_assert_uint_eq(w[i].seen, 1);
        }
        w[0] = (struct waiter){.c = q, .track = t, .after = 1, .timeout_ms = 30000};
        ck_assert_int_eq(pthread_create(&th[0], NULL, wait_thread, &w[0]), 0);
        fx_sleep_ms(50);
        DLXV(dlx_unpublish(p, "tr/w"));
        pthread_join(th[0], NULL);
        ck_assert_int_eq(w[0].err, 0);
        ck_assert_uint_eq(w[0].seen, 0);
        /* untracked under a wait: it ends, and says so */
        w[0] = (struct waiter){.c = q, .track = t, .after = 0, .timeout_ms = 30000};
        ck_assert_int_eq(pthread_create(&th[0], NULL, wait_thread, &w[0]), 0);
        fx_sleep_ms(50);
        DLXV(dlx_untrack(q, t));
        pthread_join(th[0], NULL);
        ck_assert_msg(w[0].err == -EINVAL, "wait under untrack: %s", dlx_strerror(w[0].err));
        dlx_close(q);
        dlx_close(p);
}
END_TEST

START_TEST(wait_times_out)
{
        dlx_client *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "tr/never");
        int64_t t0 = fx_now_ms();
        uint64_t v = 7;

        ck_assert_int_eq(dlx_track_wait(q, t, 0, 150, &v), -ETIMEDOUT);
        ck_assert_int_ge(fx_now_ms() - t0, 150);
        ck_assert_uint_eq(v, 7); /* untouched on failure */
        /* a version other than the current one is news at once */
        ck_assert_int_eq(dlx_track_wait(q, t, 3, -1, &v), 0);
        ck_assert_uint_eq(v, 0);
        dlx_close(q);
}
END_TEST

/* Another process's publish wakes a waiter; the tracker's page is its own. */
static int child_waits(void *arg)
{
        const char *socket = arg;
        struct dlx_connect_options o = {.socket_path = socket, .client_name = "child"};
        dlx_client *c;
        uint32_t t;
        uint64_t v = 0;

        if (dlx_connect(&o, &c) != 0 || dlx_track(c, "tr/proc", &t) != 0)
                return 2;
        /* told the parent it is ready by the daemon itself: it tracks, then waits */
        if (dlx_track_wait(c, t, 0, 30000, &v) != 0 || v != 1)
                return 3;
        dlx_close(c);
        return 0;
}

START_TEST(other_process_wakes_waiter)
{
        dlx_client *p = fx_connect(&fx, "producer");
        pid_t pid = fx_spawn(child_waits, fx.socket);

        fx_sleep_ms(200);
        publish_vec(p, "tr/proc", NULL);
        ck_assert_int_eq(fx_wait(pid), 0);
        dlx_close(p);
}
END_TEST

/* --max-watches bounds tracks (apart from watches); an untrack gives the room back. */
START_TEST(tracks_are_limited)
{
        static const char *const args[] = {"--max-watches", "3", NULL};
        dlx_client *q;
        uint32_t t[3], extra = 0;
        uint64_t w;
        char name[32];

        dlxd_start(&fx, args);
        q = fx_connect(&fx, "tracker");
        for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof(name), "lim/%d", i);
                t[i] = track_ok(q, name);
        }
        ck_assert_int_eq(dlx_track(q, "lim/3", &extra), -EAGAIN);
        expect_last_error("--max-watches");
        /* watches are counted apart */
        DLXV(dlx_watch(q, "lim/", &w));
        /* the same name again takes no slot */
        ck_assert_uint_eq(track_ok(q, "lim/1"), t[1]);
        DLXV(dlx_untrack(q, t[1]));
        DLXV(dlx_untrack(q, t[1]));
        extra = track_ok(q, "lim/3");
        ck_assert_uint_eq(tracked_version(q, extra), 0);
        dlx_close(q);
        dlxd_stop(&fx);
}
END_TEST

/* The daemon stops: a waiter learns the session has ended, and later reads say so. */
START_TEST(daemon_stop_ends_waits)
{
        dlx_client *q;
        struct waiter w;
        pthread_t th;
        uint64_t v;
        int status;

        dlxd_start(&fx, NULL);
        q = fx_connect(&fx, "tracker");
        w = (struct waiter){.c = q, .track = track_ok(q, "tr/stop"), .timeout_ms = -1};
        ck_assert_int_eq(pthread_create(&th, NULL, wait_thread, &w), 0);
        fx_sleep_ms(50);
        kill(fx.pid, SIGTERM);
        pthread_join(th, NULL);
        ck_assert_int_eq(w.err, -ECONNRESET);
        ck_assert_int_eq(dlx_track_version(q, w.track, &v), -ECONNRESET);
        ck_assert_int_eq(waitpid(fx.pid, &status, 0), fx.pid);
        fx.pid = 0;
        dlx_close(q);
        dlxd_restart(&fx, NULL);
        dlxd_stop(&fx);
}
END_TEST

/* A daemon killed outright wakes nobody: the wait notices the connection within its slice. */
START_TEST(daemon_killed_ends_waits)
{
        dlx_client *q;
        struct waiter w;
        pthread_t th;
        int64_t t0;
        int status;

        dlxd_start(&fx, NULL);
        q = fx_connect(&fx, "tracker");
        w = (struct waiter){.c = q, .track = track_ok(q, "tr/kill"), .timeout_ms = 60000};
        ck_assert_int_eq(pthread_create(&th, NULL, wait_thread, &w), 0);
        fx_sleep_ms(50);
        t0 = fx_now_ms();
        kill(fx.pid, SIGKILL);
        ck_assert_int_eq(waitpid(fx.pid, &status, 0), fx.pid);
        fx.pid = 0;
        pthread_join(th, NULL);
        ck_assert_int_eq(w.err, -ECONNRESET);
        ck_assert_int_lt(fx_now_ms() - t0, 30000);
        dlx_close(q);
        dlxd_restart(&fx, NULL);
        dlxd_stop(&fx);
}
END_TEST

/* A child of a fork may not use its parent's client's tracks. */
static int child_reads(void *arg)
{
        dlx_client *q = ((void **)arg)[0];
        uint32_t t = *(uint32_t *)((void **)arg)[1];
        uint64_t v;

        if (dlx_track_version(q, t, &v) != -ESTALE)
                return 2;
        if (dlx_track_wait(q, t, 0, 10, &v) != -ESTALE)
                return 3;
        return 0;
}

START_TEST(forked_child_refused)
{
        dlx_client *q = fx_connect(&fx, "tracker");
        uint32_t t = track_ok(q, "tr/fork");
        void *args[2] = {q, &t};

        ck_assert_int_eq(fx_wait(fx_spawn(child_reads, args)), 0);
        ck_assert_uint_eq(tracked_version(q, t), 0);
        dlx_close(q);
}
END_TEST

/* ---- a hostile peer with the page's descriptor --------------------------------------------- */

START_TEST(page_cannot_be_written)
{
        int sock = rp_connect(fx.socket, "hostile"), fd = -1, other;
        struct wire_request req = {.id = 2, .type = WIRE_REQ_TRACK};
        dlx_client *p = fx_connect(&fx, "producer");
        struct version_page *pg;
        struct wire_reply rep;
        size_t size;
        uint8_t byte = 1;

        snprintf(req.track.name, sizeof(req.track.name), "tr/hostile");
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, 2, WIRE_REP_TRACK, &rep, &fd);
        ck_assert(rep.track.page);
        ck_assert_int_ge(fd, 0);
        size = VERPAGE_SIZE(rep.track.slots);
        /* no writable mapping, no write, no resize, no unsealing */
        ck_assert_ptr_eq(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED);
        ck_assert_int_eq(pwrite(fd, &byte, 1, 64), -1);
        ck_assert_int_eq(ftruncate(fd, 0), -1);
        ck_assert_int_eq(ftruncate(fd, (off_t)size * 2), -1);
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
        pg = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        ck_assert_ptr_ne(pg, MAP_FAILED);
        ck_assert_int_eq(mprotect(pg, size, PROT_READ | PROT_WRITE), -1);
        /* a private copy may be written, and changes nothing the daemon keeps */
        void *cow = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        ck_assert_ptr_ne(cow, MAP_FAILED);
        memset(cow, 0xff, size);
        ck_assert_uint_eq(pg->magic, VERPAGE_MAGIC);
        ck_assert_uint_eq(pg->slot[rep.track.slot].version, 0);
        publish_vec(p, "tr/hostile", NULL);
        ck_assert_uint_eq(__atomic_load_n(&pg->slot[rep.track.slot].version, __ATOMIC_ACQUIRE), 1);
        munmap(cow, size);
        /* a second track sends no second page */
        req.id = 3;
        snprintf(req.track.name, sizeof(req.track.name), "tr/hostile2");
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, 3, WIRE_REP_TRACK, &rep, &other);
        ck_assert(!rep.track.page);
        ck_assert_int_eq(other, -1);
        /* slots not its own: refused, the session goes on */
        req = (struct wire_request){.id = 4, .type = WIRE_REQ_UNTRACK};
        req.untrack.slot = rep.track.slots;
        rp_send(sock, &req, -1);
        rp_expect_error(sock, 4, WIRE_NOT_FOUND, &rep);
        req = (struct wire_request){.id = 5, .type = WIRE_REQ_UNTRACK};
        req.untrack.slot = UINT32_MAX;
        rp_send(sock, &req, -1);
        rp_expect_error(sock, 5, WIRE_NOT_FOUND, &rep);
        rp_ping(sock, 6);
        munmap(pg, size);
        close(fd);
        close(sock);
        dlx_close(p);
}
END_TEST

/* Each session has its own page: one peer's tracks do not show in another's. */
START_TEST(pages_are_per_session)
{
        dlx_client *p = fx_connect(&fx, "producer"), *a = fx_connect(&fx, "a"),
                   *b = fx_connect(&fx, "b");
        uint32_t ta = track_ok(a, "tr/only-a"), tb = track_ok(b, "tr/only-b");
        uint64_t v;

        /* both got slot 1 of their own page */
        ck_assert_uint_eq(ta, tb);
        publish_vec(p, "tr/only-a", NULL);
        ck_assert_uint_eq(tracked_version(a, ta), 1);
        ck_assert_uint_eq(tracked_version(b, tb), 0);
        ck_assert_int_eq(dlx_track_wait(b, tb, 0, 50, &v), -ETIMEDOUT);
        dlx_close(a);
        dlx_close(b);
        dlx_close(p);
}
END_TEST

/* Many tracked names, many versions: every slot is the name's own. */
START_TEST(many_names)
{
        enum { N = 200 }; /* under the default --max-watches (256) */
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "tracker");
        uint32_t t[N];
        char name[32];

        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "many/%d", i);
                t[i] = track_ok(q, name);
        }
        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "many/%d", i);
                for (int k = 0; k <= i % 3; k++)
                        publish_vec(p, name, NULL);
        }
        for (int i = 0; i < N; i++)
                ck_assert_uint_eq(tracked_version(q, t[i]), (uint64_t)(i % 3 + 1));
        for (int i = 0; i < N; i += 2)
                DLXV(dlx_untrack(q, t[i]));
        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "many/%d", i);
                DLXV(dlx_unpublish(p, name));
                if (i % 2)
                        ck_assert_uint_eq(tracked_version(q, t[i]), 0);
        }
        dlx_close(q);
        dlx_close(p);
}
END_TEST

Suite *track_suite(void)
{
        Suite *s = suite_create("track");
        TCase *tc = tcase_create("track");
        TCase *own = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, version_follows_every_change);
        tcase_add_test(tc, tracked_before_published_and_after_producer);
        tcase_add_test(tc, same_name_is_one_track);
        tcase_add_test(tc, bad_arguments);
        tcase_add_test(tc, waits_end_on_every_change);
        tcase_add_test(tc, wait_times_out);
        tcase_add_test(tc, other_process_wakes_waiter);
        tcase_add_test(tc, forked_child_refused);
        tcase_add_test(tc, page_cannot_be_written);
        tcase_add_test(tc, pages_are_per_session);
        tcase_add_test(tc, many_names);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(own, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(own, 60);
        tcase_add_test(own, tracks_are_limited);
        tcase_add_test(own, daemon_stop_ends_waits);
        tcase_add_test(own, daemon_killed_ends_waits);
        suite_add_tcase(s, own);
        return s;
}
