/* SPDX-License-Identifier: MIT */
/*
 * Flow control between dlxd and its peers: a client that follows the
 * protocol is never dropped, however it pipelines or however slowly it
 * reads; only a peer that reads nothing for the timeout while something
 * waits for it is; a half-closed peer gets every reply it asked for; idle
 * peers holding descriptors unread cannot stop new clients; and a watcher
 * that falls behind loses events, is told so, and stays connected.
 *
 * Most peers here are raw (tests/rawpeer.h) so that they can misbehave
 * exactly; the well-behaved side is libdlx.
 */
#include <errno.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <signal.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "rawpeer.h"

#define FLOW_REPLY_MS 5000

/* Publishes n names prefix/0 .. prefix/n-1, each a copy in a segment of its own. */
static void publish_copies(dlx_client *c, const char *prefix, int n)
{
        char name[DLX_NAME_MAX + 1];

        for (int i = 0; i < n; i++) {
                snprintf(name, sizeof(name), "%s/%d", prefix, i);
                publish_ok(c, name, fx_plain_f32(4, (float)i, NULL), NULL, NULL);
        }
}

/* ---- pipelining ---------------------------------------------------------------------------- */

/*
 * n acquires of n different segments, each reply carrying an fd, written in
 * one go; then every reply is read: all n come, in order, each with its fd,
 * and the peer stays connected.
 */
static void pipelined_acquires(int n)
{
        dlx_client *good = fx_connect(&fx, "producer");
        int sock = rp_connect(fx.socket, "pipeliner");
        size_t cap = (size_t)n * 512, off = 0;
        uint8_t *buf = malloc(cap);
        char name[DLX_NAME_MAX + 1];
        struct wire_request req;
        struct wire_reply rep;

        ck_assert_ptr_nonnull(buf);
        publish_copies(good, "flow/pipe", n);
        for (int i = 0; i < n; i++) {
                snprintf(name, sizeof(name), "flow/pipe/%d", i);
                rp_acquire_req(&req, 100 + (uint64_t)i, name);
                off += rp_frame(&req, 0, buf + off, cap - off);
        }
        ck_assert_int_eq(rp_send_raw(sock, buf, off, NULL, 0), 0);
        free(buf);
        for (int i = 0; i < n; i++) {
                int fd = -1;
                int r = rp_read(sock, &rep, 10000, &fd);
                ck_assert_msg(r == 1, "%d acquires in one write: reply %d is %s", n, i,
                              r == 0 ? "EOF (dropped)" : strerror(-r));
                ck_assert_msg(rep.id == 100 + (uint64_t)i && rep.status == WIRE_OK,
                              "reply %d: id %llu status %d '%s'", i, (unsigned long long)rep.id,
                              rep.status, rep.error);
                ck_assert_msg(fd >= 0, "reply %d carries no fd", i);
                close(fd);
        }
        /* still connected and served */
        req = (struct wire_request){.id = 7, .type = WIRE_REQ_PING};
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, 7, WIRE_REP_PONG, NULL, NULL);
        close(sock);
        ck_assert_int_eq(fx_wait_leases(good, 0, 5000), 0);
        dlx_close(good);
}

START_TEST(pipelined_fd_replies_70)
{
        dlxd_start(&fx, NULL);
        pipelined_acquires(70);
        dlxd_stop(&fx);
}
END_TEST

/* Past every per-connection count of queued and unread descriptors. */
START_TEST(pipelined_fd_replies_300)
{
        dlxd_start(&fx, NULL);
        pipelined_acquires(300);
        dlxd_stop(&fx);
}
END_TEST

#define THREADS 100

struct racer {
        dlx_client *c;
        int i;
        int err;
        char why[256];
};

static void *race_acquire(void *p)
{
        struct racer *r = p;
        char name[DLX_NAME_MAX + 1];
        DLManagedTensorVersioned *t = NULL;
        struct dlx_acquire_options o = {.timeout_ms = 10000};

        snprintf(name, sizeof(name), "flow/threads/%d", r->i);
        r->err = dlx_acquire(r->c, name, &o, &t);
        if (r->err == 0) {
                if (!fx_vec_is(t, 4, (float)r->i))
                        r->err = -EILSEQ;
                t->deleter(t);
        } else {
                snprintf(r->why, sizeof(r->why), "%s", dlx_last_error());
        }
        return NULL;
}

/* 100 threads of one client acquire 100 fresh segments at once, several rounds. */
START_TEST(threads_acquire_fresh_segments)
{
        dlx_client *prod, *cons;
        struct racer r[THREADS];
        pthread_t th[THREADS];

        dlxd_start(&fx, NULL);
        prod = fx_connect(&fx, "producer");
        cons = fx_connect(&fx, "threads");
        for (int round = 0; round < 3; round++) {
                /* new versions each round: new segments, every reply carries an fd */
                publish_copies(prod, "flow/threads", THREADS);
                for (int i = 0; i < THREADS; i++) {
                        r[i] = (struct racer){.c = cons, .i = i};
                        ck_assert_int_eq(pthread_create(&th[i], NULL, race_acquire, &r[i]), 0);
                }
                for (int i = 0; i < THREADS; i++) {
                        pthread_join(th[i], NULL);
                        ck_assert_msg(r[i].err == 0, "round %d thread %d: %s (%s)", round, i,
                                      dlx_strerror(r[i].err), r[i].why);
                }
        }
        ck_assert_int_eq(dlx_ping(cons), 0);
        dlx_close(cons);
        dlx_close(prod);
        dlxd_stop(&fx);
}
END_TEST

/* ---- half-closed peers and slow readers ------------------------------------------------------ */

/* 512 names of 200 bytes: a list page of them is over 100 KiB, more than a socket holds. */
static void publish_long_names(dlx_client *c, int n)
{
        DLManagedTensorVersioned *t;
        char name[DLX_NAME_MAX + 1];

        for (int i = 0; i < n; i++) {
                memset(name, 'n', 200);
                snprintf(name, sizeof(name), "flow/long/%04d/", i);
                name[strlen(name)] = 'n';
                name[200] = '\0';
                t = fx_alloc_f32(c, 4);
                publish_ok(c, name, t, NULL, NULL);
        }
}

static void list_req(struct wire_request *req, uint64_t id)
{
        memset(req, 0, sizeof(*req));
        req->id = id;
        req->type = WIRE_REQ_LIST;
        req->list.limit = DLX_LIST_PAGE_MAX;
        snprintf(req->list.prefix, sizeof(req->list.prefix), "flow/long/");
}

/*
 * A peer asks for big lists, shuts down its sending side and only then
 * reads, slowly: it gets every reply whole, then EOF.
 */
START_TEST(half_closed_peer_gets_every_reply)
{
        dlx_client *good;
        struct wire_request req;
        struct wire_reply rep;
        uint8_t buf[4096];
        size_t off = 0;
        int sock;

        dlxd_start(&fx, NULL);
        good = fx_connect(&fx, "producer");
        publish_long_names(good, 512);
        sock = rp_connect(fx.socket, "half-closed");
        for (uint64_t id = 10; id < 13; id++) {
                list_req(&req, id);
                off += rp_frame(&req, 0, buf + off, sizeof(buf) - off);
        }
        ck_assert_int_eq(rp_send_raw(sock, buf, off, NULL, 0), 0);
        ck_assert_int_eq(shutdown(sock, SHUT_WR), 0);
        /* long enough for the daemon to fill the socket and find it full */
        fx_sleep_ms(200);
        for (uint64_t id = 10; id < 13; id++) {
                int r = rp_read(sock, &rep, 10000, NULL);
                ck_assert_msg(r == 1, "list %llu after SHUT_WR: %s", (unsigned long long)id,
                              r == 0 ? "EOF before the reply" : strerror(-r));
                ck_assert_msg(rep.id == id && rep.status == WIRE_OK && rep.type == WIRE_REP_LIST,
                              "list %llu: id %llu status %d '%s'", (unsigned long long)id,
                              (unsigned long long)rep.id, rep.status, rep.error);
                fx_sleep_ms(20);
        }
        ck_assert_int_eq(rp_read(sock, &rep, 10000, NULL), 0);
        close(sock);
        ck_assert_uint_eq(fx_wait_clients(good, 1, 5000), 1);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/* A half-closed peer that never reads is dropped after the timeout, like any other. */
START_TEST(half_closed_nonreader_dropped)
{
        static const char *const args[] = {"--timeout-ms", "300", NULL};
        dlx_client *good;
        struct wire_request req;
        int sock;

        dlxd_start(&fx, args);
        good = fx_connect(&fx, "producer");
        publish_long_names(good, 512);
        sock = rp_connect(fx.socket, "mute");
        for (uint64_t id = 10; id < 20; id++) {
                list_req(&req, id);
                rp_send(sock, &req, -1);
        }
        ck_assert_int_eq(shutdown(sock, SHUT_WR), 0);
        ck_assert_uint_eq(fx_wait_clients(good, 1, 5000), 1);
        close(sock);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A peer that pipelines list requests and reads its replies steadily but
 * slowly, for several times the timeout, is never dropped: it reads. Only the
 * gaps between its reads are timed, and the daemon rightly drops a peer that
 * reads nothing for the whole timeout, whatever the reason: a test process a
 * busy machine leaves unscheduled that long is one. So the gaps are a small
 * fraction of the timeout (a read every 10 ms against 2 s; 50 ms against
 * 300 ms failed on a loaded 2-CPU machine), and there are enough of them to
 * outlast the timeout three times. (Under valgrind the timeout is ten times
 * longer: the reader must not be slower than meant.)
 */
START_TEST(slow_reader_not_dropped)
{
        enum { TIMEOUT_MS = 2000, GAP_MS = 10 };
        char timeout[16];
        const char *const args[] = {"--timeout-ms", timeout, "--max-queued", "256K", NULL};
        const int lists = 3 * TIMEOUT_MS / GAP_MS;
        dlx_client *good;
        struct wire_request req;
        struct wire_reply rep;
        int sock;

        snprintf(timeout, sizeof(timeout), "%d", TIMEOUT_MS * fx_slowdown());
        dlxd_start(&fx, args);
        good = fx_connect(&fx, "producer");
        publish_long_names(good, 128);
        sock = rp_connect(fx.socket, "slow");
        /* 40 requests ahead of the replies (more would fill the socket the other way) */
        for (int i = 0; i < 40; i++) {
                list_req(&req, 100 + (uint64_t)i);
                rp_send(sock, &req, -1);
        }
        /* 600 replies of ~28 KiB, a read every 10 ms at most: over three timeouts */
        for (int i = 0; i < lists; i++) {
                int r = rp_read(sock, &rep, 10000 * fx_slowdown(), NULL);
                ck_assert_msg(r == 1, "reply %d: %s", i, r == 0 ? "EOF (dropped)" : strerror(-r));
                ck_assert_uint_eq(rep.id, 100 + (uint64_t)i);
                ck_assert_int_eq(rep.status, WIRE_OK);
                if (i + 40 < lists) {
                        list_req(&req, 100 + (uint64_t)(i + 40));
                        rp_send(sock, &req, -1);
                }
                fx_sleep_ms(GAP_MS);
        }
        req = (struct wire_request){.id = 7, .type = WIRE_REQ_PING};
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, 7, WIRE_REP_PONG, NULL, NULL);
        close(sock);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/* ---- idle peers and the descriptor budget ------------------------------------------------------
 */

/* The hogs: connections of uid nobody acquiring PER_HOG fresh segments each, never reading. */
enum { HOGS = 8, PER_HOG = 40 };

struct hogs {
        int ready[2];
};

static int hog_main(void *arg)
{
        struct hogs *h = arg;
        struct wire_request req;
        char name[DLX_NAME_MAX + 1];
        int socks[HOGS];

        if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
                return 90;
        for (int i = 0; i < HOGS; i++) {
                socks[i] = rp_connect(fx.socket, "hog");
                for (int k = 0; k < PER_HOG; k++) {
                        snprintf(name, sizeof(name), "flow/hog/%d", k);
                        rp_acquire_req(&req, 100 + (uint64_t)k, name);
                        rp_send(socks[i], &req, -1);
                }
        }
        (void)!write(h->ready[1], "r", 1);
        pause(); /* holds them, reading nothing, until killed */
        return 0;
}

/*
 * Peers of one uid that acquire segments and never read their replies hold
 * descriptors in flight, which the kernel charges to dlxd. However many
 * there are, another uid's new client connects at once and its acquires go
 * through: a uid holds at most half of what the others leave of the budget.
 * The hogs' own uid gets -EAGAIN, saying why, rather than a wait that could
 * last for ever (dropping the hogs would not help: what they hold unread
 * stays in flight until they read or close, and stays charged to them).
 */
START_TEST(idle_fd_hogs_cannot_stop_new_clients)
{
        /* a long timeout: a late client that waited for the hogs to go would show */
        static const char *const args[] = {"--timeout-ms", "5000", "--group", "65534", NULL};
        struct rlimit low = {.rlim_cur = 256, .rlim_max = 256};
        struct wire_request req;
        struct wire_reply rep;
        struct hogs h;
        dlx_client *prod, *late;
        DLManagedTensorVersioned *t;
        struct dlx_acquire_options o = {.timeout_ms = 0};
        pid_t hog;
        int64_t t0;
        char byte;
        int err;

        struct rlimit saved;

        /* valgrind keeps its own descriptors and refuses a lower limit: nothing to see there */
        if (getenv("DLX_TEST_VALGRIND") || geteuid() != 0)
                return;
        /* dlxd inherits 256 descriptors: a budget of 128 in flight */
        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        if (saved.rlim_max < low.rlim_max)
                low = saved;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
        dlxd_start(&fx, args);
        setrlimit(RLIMIT_NOFILE, &saved);
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        prod = fx_connect(&fx, "producer");
        publish_copies(prod, "flow/hog", PER_HOG);
        ck_assert_int_eq(pipe(h.ready), 0);
        hog = fx_spawn(hog_main, &h);
        ck_assert_int_eq(read(h.ready[0], &byte, 1), 1);
        ck_assert_int_eq(dlx_ping(prod), 0);

        /* another uid's new client connects at once, and acquires a fresh segment */
        t0 = fx_now_ms();
        late = fx_connect(&fx, "late");
        ck_assert_msg(fx_now_ms() - t0 < 2500, "connecting took %lld ms behind idle peers",
                      (long long)(fx_now_ms() - t0));
        ck_assert_int_eq(dlx_publish(prod, "flow/late", fx_plain_f32(4, 9.0f, NULL), NULL, NULL),
                         0);
        err = dlx_acquire(late, "flow/late", &o, &t);
        ck_assert_msg(err == 0, "acquire behind idle peers: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert(fx_vec_is(t, 4, 9.0f));
        ck_assert_msg(fx_now_ms() - t0 < 4000, "the acquire took %lld ms",
                      (long long)(fx_now_ms() - t0));
        t->deleter(t);

        /*
         * The hogs' uid, on a new connection, is told. Its share is half of
         * what root leaves, and root's own fds in flight come and go: the hogs
         * may have stopped one short of the share it is now. So this peer asks
         * for fresh segments, all at once, as a hog would: the share fills,
         * and then it is refused, saying why.
         */
        if (fork() == 0) {
                char name[DLX_NAME_MAX + 1];
                int sock;
                if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
                        _exit(90);
                sock = rp_connect(fx.socket, "hog-again");
                for (int k = 0; k < PER_HOG; k++) {
                        snprintf(name, sizeof(name), "flow/hog/%d", k);
                        rp_acquire_req(&req, 100 + (uint64_t)k, name);
                        rp_send(sock, &req, -1);
                }
                for (int k = 0; k < PER_HOG; k++) {
                        if (rp_read(sock, &rep, 5000, NULL) != 1)
                                _exit(91);
                        if (rep.status == WIRE_LIMIT && strstr(rep.error, "unread"))
                                _exit(0);
                        if (rep.status != WIRE_OK) {
                                fprintf(stderr, "hog-again: %d: %s\n", rep.status, rep.error);
                                _exit(92);
                        }
                }
                _exit(93); /* every one granted: the uid's share did not hold */
        }
        int status;
        ck_assert_int_ge(wait(&status), 0);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "hog uid's acquire: %d",
                      WEXITSTATUS(status));

        /* once the hogs are gone, what they held is free again */
        kill(hog, SIGKILL);
        fx_wait(hog);
        ck_assert_uint_eq(fx_wait_clients(prod, 2, 5000), 2);
        ck_assert_int_eq(dlx_ping(late), 0);
        close(h.ready[0]);
        close(h.ready[1]);
        dlx_close(late);
        dlx_close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A peer that holds the per-connection number of descriptors unread and a
 * further fd reply waiting is dropped after the timeout; a peer with fewer
 * unread and nothing waiting is left alone (it may simply be idle).
 */
START_TEST(peer_at_fd_cap_not_reading_dropped)
{
        static const char *const args[] = {"--timeout-ms", "300", NULL};
        dlx_client *prod;
        struct wire_request req;
        struct wire_reply rep;
        char name[DLX_NAME_MAX + 1];
        int capped, idle;

        dlxd_start(&fx, args);
        prod = fx_connect(&fx, "producer");
        publish_copies(prod, "flow/cap", 40);
        capped = rp_connect(fx.socket, "capped");
        idle = rp_connect(fx.socket, "idle");
        for (int i = 0; i < 40; i++) {
                snprintf(name, sizeof(name), "flow/cap/%d", i);
                rp_acquire_req(&req, 100 + (uint64_t)i, name);
                rp_send(capped, &req, -1);
                if (i < 4)
                        rp_send(idle, &req, -1);
        }
        ck_assert_uint_eq(fx_wait_clients(prod, 2, 5000), 2);
        /* the idle one was not: it reads what it asked for, hours later as it may */
        for (int i = 0; i < 4; i++) {
                int fd = -1;
                ck_assert_int_eq(rp_read(idle, &rep, 5000, &fd), 1);
                ck_assert_int_eq(rep.status, WIRE_OK);
                ck_assert_int_ge(fd, 0);
                close(fd);
        }
        close(capped);
        close(idle);
        ck_assert_int_eq(fx_wait_leases(prod, 0, 5000), 0);
        dlx_close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A peer dropped while it holds descriptors unread keeps its client slot
 * (and its uid's charge) until it reads them or closes: getting dropped
 * sheds nothing. Then the slot comes back.
 */
START_TEST(dropped_peer_keeps_its_charge_until_it_closes)
{
        static const char *const args[] = {"--timeout-ms", "300", "--max-clients", "3", NULL};
        struct dlx_connect_options o;
        dlx_client *prod, *second, *third = NULL;
        struct wire_request req;
        char name[DLX_NAME_MAX + 1];
        int capped;

        dlxd_start(&fx, args);
        o = (struct dlx_connect_options){.socket_path = fx.socket};
        prod = fx_connect(&fx, "producer");
        publish_copies(prod, "flow/keep", 40);
        capped = rp_connect(fx.socket, "capped");
        for (int i = 0; i < 40; i++) {
                snprintf(name, sizeof(name), "flow/keep/%d", i);
                rp_acquire_req(&req, 100 + (uint64_t)i, name);
                rp_send(capped, &req, -1);
        }
        /* dropped for not reading: gone from the clients, not from the slots */
        ck_assert_uint_eq(fx_wait_clients(prod, 1, 5000), 1);
        second = fx_connect(&fx, "second");
        ck_assert_int_eq(dlx_connect(&o, &third), -EAGAIN);
        ck_assert_ptr_null(third);
        /* it closes: what it held goes, and the slot comes back */
        close(capped);
        for (int i = 0; i < 300 && dlx_connect(&o, &third) != 0; i++)
                fx_sleep_ms(10);
        ck_assert_ptr_nonnull(third);
        dlx_close(third);
        dlx_close(second);
        dlx_close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Output queued for slow readers is bounded for the whole daemon, not only
 * per connection: the connections of one uid get at most half of what the
 * others leave of 16 x --max-queued (here 64 MiB), and past it their
 * requests wait. Forty connections asking for some 140 MiB of lists (within
 * --max-queued each) and reading none get a little over 32 MiB queued, and
 * another client is served meanwhile.
 */
START_TEST(queued_output_bounded_per_uid)
{
        static const char *const args[] = {"--max-queued", "4M", NULL};
        enum { CONNS = 40, LISTS = 128 };
        dlx_client *good;
        struct wire_request req;
        struct dlx_stats st;
        int socks[CONNS];
        uint64_t last = 0;

        dlxd_start(&fx, args);
        good = fx_connect(&fx, "good");
        publish_long_names(good, 512);
        for (int i = 0; i < CONNS; i++) {
                socks[i] = rp_connect(fx.socket, "slow");
                ck_assert_int_eq(fcntl(socks[i], F_SETFL, O_NONBLOCK), 0);
                for (int k = 0; k < LISTS; k++) {
                        uint8_t buf[512];
                        list_req(&req, 100 + (uint64_t)k);
                        size_t n = rp_frame(&req, 0, buf, sizeof(buf));
                        (void)!send(socks[i], buf, n, MSG_NOSIGNAL);
                }
        }
        /* until the daemon has done what it will: what it queues stops growing */
        for (;;) {
                fx_sleep_ms(300);
                st = fx_stats(good);
                if (st.queued == last)
                        break;
                last = st.queued;
        }
        /* a uid's share is 32 MiB, and each connection may go one reply over */
        ck_assert_msg(st.queued > 16u << 20 && st.queued < 40u << 20,
                      "%llu bytes queued for slow readers", (unsigned long long)st.queued);
        ck_assert_uint_eq(st.uid_queued, st.queued);
        for (int i = 0; i < CONNS; i++)
                close(socks[i]);
        ck_assert_uint_eq(fx_wait_clients(good, 1, 5000), 1);
        ck_assert_uint_eq(fx_stats(good).queued, 0);
        dlx_close(good);
        dlxd_stop(&fx);
}
END_TEST

/* Descriptors sent before hello are not parked in the daemon: said, and hung up on. */
START_TEST(descriptors_before_hello_refused)
{
        dlx_client *good;
        struct wire_reply rep;
        int sock, fds[4];
        uint8_t byte = 0;

        dlxd_start(&fx, NULL);
        good = fx_connect(&fx, "good");
        sock = fx_raw_connect(&fx);
        for (int i = 0; i < 4; i++)
                fds[i] = memfd_create("early", MFD_CLOEXEC);
        ck_assert_int_eq(rp_send_raw(sock, &byte, 1, fds, 4), 0);
        for (int i = 0; i < 4; i++)
                close(fds[i]);
        ck_assert_int_eq(rp_read(sock, &rep, 5000, NULL), 1);
        ck_assert_int_eq(rep.status, WIRE_PROTOCOL);
        ck_assert_ptr_nonnull(strstr(rep.error, "before hello"));
        ck_assert_int_le(rp_read(sock, &rep, 5000, NULL), 0);
        close(sock);
        ck_assert_int_eq(dlx_ping(good), 0);
        dlx_close(good);
        dlxd_stop(&fx); /* and its descriptors are back to what they were */
}
END_TEST

/* ---- watchers that fall behind ----------------------------------------------------------------
 */

/*
 * A watcher that reads nothing while thousands of names are published gets
 * its events dropped past --max-queued instead of being disconnected, and a
 * LOST event once it reads; it stays connected and later events arrive.
 */
START_TEST(slow_watcher_loses_events_not_connection)
{
        static const char *const args[] = {"--max-queued", "64K", NULL};
        dlx_client *prod, *w;
        struct dlx_event ev;
        uint64_t id;
        int published = 0, events = 0, lost = 0, err;

        dlxd_start(&fx, args);
        prod = fx_connect(&fx, "producer");
        w = fx_connect(&fx, "watcher");
        ck_assert_int_eq(dlx_watch(w, "flow/w/", &id), 0);
        /* several MiB of events: far past the 64 KiB queue and the socket */
        for (int round = 0; round < 4; round++) {
                for (int i = 0; i < 2000; i++) {
                        char name[DLX_NAME_MAX + 1];
                        snprintf(name, sizeof(name), "flow/w/%d/%0200d", i, 0);
                        ck_assert_int_eq(dlx_publish(prod, name, fx_alloc_f32(prod, 1), NULL, NULL),
                                         0);
                        published++;
                }
        }
        ck_assert_uint_eq(fx_stats(prod).clients, 2);
        while ((err = dlx_next_event(w, &ev, 200)) == 0) {
                if (ev.kind == DLX_EVENT_LOST)
                        lost++;
                else
                        events++;
        }
        ck_assert_int_eq(err, -ETIMEDOUT);
        ck_assert_msg(lost >= 1 && events < published, "%d events and %d LOST for %d publishes",
                      events, lost, published);
        /* connected, and what comes now arrives */
        ck_assert_int_eq(dlx_publish(prod, "flow/w/after", fx_alloc_f32(prod, 1), NULL, NULL), 0);
        ck_assert_int_eq(dlx_next_event(w, &ev, 5000), 0);
        ck_assert_int_eq(ev.kind, DLX_EVENT_PUBLISHED);
        ck_assert_str_eq(ev.name, "flow/w/after");
        dlx_close(w);
        dlx_close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A client out of libdlx longer than the timeout (computing) while events
 * and releases pile up for it is idle, not stalled: it stays connected, and
 * when it comes back it finds what was kept and a LOST for what was not.
 */
START_TEST(idle_client_outlives_timeout_with_notifications)
{
        static const char *const args[] = {"--timeout-ms", "300", "--max-queued", "64K", NULL};
        dlx_client *prod, *w, *busy;
        DLManagedTensorVersioned *t;
        struct dlx_event ev;
        uint64_t id, v1;
        int lost = 0, err;

        dlxd_start(&fx, args);
        prod = fx_connect(&fx, "producer");
        w = fx_connect(&fx, "watcher");
        busy = fx_connect(&fx, "busy-producer");
        ck_assert_int_eq(dlx_watch(w, "flow/idle/", &id), 0);
        /* the busy producer publishes, a reader holds it, then the producer goes quiet */
        ck_assert_int_eq(dlx_publish(busy, "flow/idle-own", fx_alloc_f32(busy, 4), NULL, &v1), 0);
        ck_assert_int_eq(dlx_acquire(prod, "flow/idle-own", NULL, &t), 0);
        for (int i = 0; i < 2000; i++) {
                char name[DLX_NAME_MAX + 1];
                snprintf(name, sizeof(name), "flow/idle/%d/%0150d", i, 0);
                ck_assert_int_eq(dlx_publish(prod, name, fx_alloc_f32(prod, 1), NULL, NULL), 0);
                if (i == 1000) {
                        /* a release the busy producer will only hear of later */
                        ck_assert_int_eq(dlx_unpublish(busy, "flow/idle-own"), 0);
                        t->deleter(t);
                }
        }
        fx_sleep_ms(1000); /* three timeouts, nobody reading */
        ck_assert_uint_eq(fx_stats(prod).clients, 3);
        while ((err = dlx_next_event(w, &ev, 200)) == 0)
                lost += ev.kind == DLX_EVENT_LOST;
        ck_assert_int_eq(err, -ETIMEDOUT);
        ck_assert_int_ge(lost, 1);
        ck_assert_int_eq(dlx_wait_released(busy, "flow/idle-own", v1, NULL, 5000), 0);
        ck_assert_int_eq(dlx_ping(w), 0);
        ck_assert_int_eq(dlx_ping(busy), 0);
        dlx_close(busy);
        dlx_close(w);
        dlx_close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A consumer that only lets its tensors go, one now and then, calling nothing
 * else: each release finds the daemon asleep on the release ring and wakes
 * it, and nothing comes back for it to read. (Answered wake-ups piled up
 * unread until its socket was full and it was dropped, with the leases of
 * its live views.)
 */
START_TEST(quiet_releases_leave_nothing_to_read)
{
        static const char *const args[] = {"--timeout-ms", "300", NULL};
        enum { N = 40 };
        DLManagedTensorVersioned *v[N + 1];
        dlx_client *p, *c;
        struct pollfd pfd;

        dlxd_start(&fx, args);
        p = fx_connect(&fx, "producer");
        c = fx_connect(&fx, "quiet");
        ck_assert_int_eq(dlx_publish(p, "flow/quiet", fx_plain_f32(4, 3.0f, NULL), NULL, NULL), 0);
        for (int i = 0; i <= N; i++)
                ck_assert_int_eq(dlx_acquire(c, "flow/quiet", NULL, &v[i]), 0);
        pfd = (struct pollfd){.fd = dlx_fd(c), .events = POLLIN};
        for (int i = 0; i < N; i++) {
                fx_sleep_ms(40); /* quiet: the daemon goes to sleep on the ring */
                v[i]->deleter(v[i]);
                fx_sleep_ms(20); /* what it answered would be here by now */
                ck_assert_msg(poll(&pfd, 1, 0) == 0, "release %d got an answer", i);
        }
        ck_assert_uint_eq(fx_stats(p).leases, 1);
        ck_assert(fx_vec_is(v[N], 4, 3.0f));
        v[N]->deleter(v[N]);
        dlx_close(c);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/* ---- one peer and the daemon's descriptor table --------------------------------------------- */

/* Asks the daemon for an allocation and tells how it went; closes any fd. */
static int try_alloc(int sock, uint64_t id, int timeout_ms, struct wire_reply *rep)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_ALLOC};
        int fd = -1, r;

        req.alloc.size = 4096;
        rp_send(sock, &req, -1);
        r = rp_read_answer(sock, rep, timeout_ms, &fd);
        if (fd >= 0)
                close(fd);
        return r;
}

static const char *outcome(int r)
{
        return r == 1 ? "an error" : r == 0 ? "EOF" : strerror(-r);
}

/*
 * Allocates 4 KiB segments on sock until the daemon refuses (or stops
 * answering); returns how many it got.
 */
static long hog_allocations(int sock, long max)
{
        struct wire_reply rep;
        long held = 0;

        for (uint64_t id = 1000; held < max; id++) {
                int r = try_alloc(sock, id, 2000, &rep);
                if (r != 1 || rep.status != WIRE_OK)
                        break;
                held++;
        }
        return held;
}

/*
 * A single client allocating 4 KiB segments meets a limit while others still
 * have room: however many it holds, another client's alloc succeeds (each
 * segment is a descriptor in dlxd, and the table must not fill for everyone).
 */
START_TEST(one_client_cannot_fill_the_fd_table)
{
        long limit = dlxd_start_fd_limit(&fx, 1024), held;
        int hog, good, r;
        struct wire_reply rep;

        good = rp_connect(fx.socket, "good");
        hog = rp_connect(fx.socket, "hog");
        held = hog_allocations(hog, limit + 64);
        r = try_alloc(good, 2, FLOW_REPLY_MS, &rep);
        ck_assert_msg(r == 1 && rep.status == WIRE_OK,
                      "after one client took %ld segments (dlxd allows itself %ld fds), another "
                      "client's alloc gets %s (status %d: '%s')",
                      held, limit, outcome(r), rep.status, rep.error);
        close(hog);
        close(good);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A peer that repeats acquire + forget on one tensor and reads none of the
 * replies, each of which carries a descriptor, cannot make dlxd hold a dup per
 * reply until its table is full: another client's alloc still succeeds.
 */
START_TEST(unread_fd_replies_cannot_fill_the_fd_table)
{
        long limit = dlxd_start_fd_limit(&fx, 1024), pairs = limit + 1000, fds;
        struct wire_request req;
        struct wire_reply rep;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        int prod, hog, good, r, sr;
        uint64_t seg;

        prod = rp_connect(fx.socket, "producer");
        good = rp_connect(fx.socket, "good");
        seg = rp_alloc(prod, 2, 4096, NULL);
        rp_publish_req(&req, 3, "flow/hot", 4096, seg, 0);
        rp_send(prod, &req, -1);
        rp_expect_ok(prod, 3, WIRE_REP_PUBLISH, NULL, NULL);

        hog = rp_connect(fx.socket, "hog");
        for (long i = 0; i < pairs; i++) {
                rp_acquire_req(&req, 100 + 2 * (uint64_t)i, "flow/hot");
                rp_frame_append(&buf, &len, &cap, &req);
                req = (struct wire_request){.id = 101 + 2 * (uint64_t)i, .type = WIRE_REQ_FORGET};
                req.forget.segments[0] = seg;
                req.forget.count = 1;
                rp_frame_append(&buf, &len, &cap, &req);
        }
        sr = rp_send_until_stalled(hog, buf, len, 2000);
        free(buf);
        /* the good client's pings go through after the daemon has read the flood */
        rp_ping(good, 3);
        rp_ping(good, 4);
        fds = count_fds(fx.pid);

        r = try_alloc(good, 5, FLOW_REPLY_MS, &rep);
        ck_assert_msg(r == 1 && rep.status == WIRE_OK,
                      "a peer that reads none of its %ld acquire replies (send: %s) left dlxd "
                      "with %ld of %ld fds open; another client's alloc then gets %s "
                      "(status %d: '%s')",
                      pairs, sr ? strerror(-sr) : "all sent", fds, limit, outcome(r), rep.status,
                      rep.error);
        close(hog);
        close(good);
        close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Descriptors in flight on a Unix socket (sent, not yet received) are charged
 * to the sending user, and the kernel refuses more than RLIMIT_NOFILE of them
 * (ETOOMANYREFS; root is exempt, so the test drops to nobody). Peers that
 * request fds and never read cannot use that up: a connection has a bounded
 * number unread, and a well-behaved client's acquire still gets its fd.
 */
START_TEST(unread_fds_in_flight_cannot_starve_others)
{
        enum { NHOGS = 4, PAIRS = 100, BURST = 20 };
        int hogs[NHOGS], prod, good, r, fd = -1;
        struct wire_request req;
        struct wire_reply rep;
        uint64_t seg;
        long limit;

        if (geteuid() == 0) {
                ck_assert_int_eq(setgroups(0, NULL), 0);
                ck_assert_int_eq(setresgid(65534, 65534, 65534), 0);
                ck_assert_int_eq(setresuid(65534, 65534, 65534), 0);
        }
        limit = dlxd_start_fd_limit(&fx, 256);

        prod = rp_connect(fx.socket, "producer");
        good = rp_connect(fx.socket, "good");
        seg = rp_alloc(prod, 2, 4096, NULL);
        rp_publish_req(&req, 3, "flow/inflight", 4096, seg, 0);
        rp_send(prod, &req, -1);
        rp_expect_ok(prod, 3, WIRE_REP_PUBLISH, NULL, NULL);

        for (int h = 0; h < NHOGS; h++)
                hogs[h] = rp_connect(fx.socket, "hog");
        /* in small bursts, so that dlxd writes each batch out before the next */
        for (int b = 0; b < PAIRS / BURST; b++) {
                for (int h = 0; h < NHOGS; h++) {
                        uint8_t *buf = NULL;
                        size_t len = 0, cap = 0;
                        for (int i = 0; i < BURST; i++) {
                                uint64_t id = 100 + 2 * (uint64_t)(b * BURST + i);
                                rp_acquire_req(&req, id, "flow/inflight");
                                rp_frame_append(&buf, &len, &cap, &req);
                                req = (struct wire_request){.id = id + 1, .type = WIRE_REQ_FORGET};
                                req.forget.segments[0] = seg;
                                req.forget.count = 1;
                                rp_frame_append(&buf, &len, &cap, &req);
                        }
                        rp_send_until_stalled(hogs[h], buf, len, 1000);
                        free(buf);
                }
                fx_sleep_ms(20);
        }
        rp_ping(prod, 4);

        rp_acquire_req(&req, 2, "flow/inflight");
        rp_send(good, &req, -1);
        r = rp_read_answer(good, &rep, FLOW_REPLY_MS, &fd);
        if (fd >= 0)
                close(fd);
        ck_assert_msg(r == 1 && rep.status == WIRE_OK && fd >= 0,
                      "%d peers not reading %d fd-carrying replies each (dlxd's limit: %ld fds "
                      "in flight); a well-behaved client's acquire then gets %s",
                      NHOGS, PAIRS, limit, r == 1 ? "a reply without its fd" : outcome(r));
        for (int h = 0; h < NHOGS; h++)
                close(hogs[h]);
        close(good);
        close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A dlxd out of descriptors still answers every request, with an error if the
 * reply's fd cannot be had, or ends the session: an acquire never goes
 * unanswered, and a refused one leaves no lease behind.
 */
START_TEST(out_of_fds_acquire_answered_or_hung_up)
{
        long limit = dlxd_start_fd_limit(&fx, 64);
        int conns[256], nconns = 0;
        struct wire_request req;
        struct wire_reply rep;
        int prod, cons, r, fd = -1;
        uint64_t seg;

        prod = rp_connect(fx.socket, "producer");
        cons = rp_connect(fx.socket, "consumer");
        seg = rp_alloc(prod, 2, 4096, NULL);
        /* writable: its acquire reply carries the segment's own fd, a dup */
        rp_publish_req(&req, 3, "flow/lost", 4096, seg, 0);
        rp_send(prod, &req, -1);
        rp_expect_ok(prod, 3, WIRE_REP_PUBLISH, NULL, NULL);

        /* other clients connect until dlxd has no descriptor left for the next one */
        while (nconns < (int)(N_ELEMS(conns))) {
                struct wire_request h = {.id = 1, .type = WIRE_REQ_HELLO};
                int c = fx_raw_connect(&fx);
                h.hello.major = DLX_PROTO_MAJOR;
                rp_send(c, &h, -1);
                conns[nconns++] = c;
                if (rp_read_answer(c, &rep, 500, NULL) != 1)
                        break; /* not accepted: the table is full */
        }
        ck_assert_msg(nconns < (int)(N_ELEMS(conns)), "dlxd (limit %ld fds) kept accepting", limit);

        rp_acquire_req(&req, 2, "flow/lost");
        rp_send(cons, &req, -1);
        r = rp_read_answer(cons, &rep, FLOW_REPLY_MS, &fd);
        if (fd >= 0)
                close(fd);
        ck_assert_msg(r != -ETIMEDOUT,
                      "with dlxd out of fds (%d clients connected), an acquire got neither a "
                      "reply nor a hang-up in %d ms",
                      nconns, FLOW_REPLY_MS);
        for (int i = 0; i < nconns; i++)
                close(conns[i]);
        if (r != 1 || rep.status != WIRE_OK) {
                /* refused or hung up on: it must not hold a lease it never heard of */
                req = (struct wire_request){.id = 4, .type = WIRE_REQ_STATS};
                rp_send(prod, &req, -1);
                rp_expect_ok(prod, 4, WIRE_REP_STATS, &rep, NULL);
                ck_assert_uint_eq(rep.stats.leases, 0);
        }
        close(cons);
        close(prod);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A one-shot client (`printf ... | socat`) writes its requests and shuts down
 * its sending side at once: when dlxd reads the requests and the end of the
 * stream in the same wakeup, it still answers every request before closing.
 */
START_TEST(half_closed_in_one_wakeup_gets_replies)
{
        struct wire_request req = {.id = 1, .type = WIRE_REQ_HELLO};
        struct wire_reply rep;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        int sock, r;

        dlxd_start(&fx, NULL);
        sock = fx_raw_connect(&fx);

        req.hello.major = DLX_PROTO_MAJOR;
        snprintf(req.hello.client_name, sizeof(req.hello.client_name), "oneshot");
        rp_frame_append(&buf, &len, &cap, &req);
        req = (struct wire_request){.id = 2, .type = WIRE_REQ_STATS};
        rp_frame_append(&buf, &len, &cap, &req);
        /* the daemon finds the requests and the end of the stream in one wakeup */
        fx_stop_daemon(&fx);
        ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
        free(buf);
        ck_assert_int_eq(shutdown(sock, SHUT_WR), 0);
        ck_assert_int_eq(kill(fx.pid, SIGCONT), 0);

        r = rp_read_answer(sock, &rep, FLOW_REPLY_MS, NULL);
        ck_assert_msg(r == 1 && rep.id == 1 && rep.type == WIRE_REP_HELLO,
                      "a half-closed client got %s instead of its hello reply",
                      r == 0  ? "EOF"
                      : r < 0 ? strerror(-r)
                              : "another reply");
        r = rp_read_answer(sock, &rep, FLOW_REPLY_MS, NULL);
        ck_assert_msg(r == 1 && rep.id == 2 && rep.type == WIRE_REP_STATS,
                      "a half-closed client got %s instead of its stats reply",
                      r == 0  ? "EOF"
                      : r < 0 ? strerror(-r)
                              : "another reply");
        close(sock);
        dlxd_stop(&fx);
}
END_TEST

Suite *flow_suite(void)
{
        Suite *s = suite_create("flow");
        TCase *pipe = tcase_create("pipelining");
        TCase *slow = tcase_create("slow");
        TCase *idle = tcase_create("idle");
        TCase *watch = tcase_create("watchers");
        TCase *budget = tcase_create("fd budget");

        tcase_set_timeout(pipe, 120);
        tcase_add_test(pipe, pipelined_fd_replies_70);
        tcase_add_test(pipe, pipelined_fd_replies_300);
        tcase_add_test(pipe, threads_acquire_fresh_segments);
        suite_add_tcase(s, pipe);

        tcase_set_timeout(slow, 120);
        /* a stopped dlxd left by a failed case is killed */
        tcase_add_unchecked_fixture(slow, fx_reaper_init, fx_reaper_run);
        tcase_add_test(slow, half_closed_peer_gets_every_reply);
        tcase_add_test(slow, half_closed_nonreader_dropped);
        tcase_add_test(slow, slow_reader_not_dropped);
        tcase_add_test(slow, quiet_releases_leave_nothing_to_read);
        tcase_add_test(slow, half_closed_in_one_wakeup_gets_replies);
        suite_add_tcase(s, slow);

        tcase_set_timeout(idle, 120);
        tcase_add_test(idle, idle_fd_hogs_cannot_stop_new_clients);
        tcase_add_test(idle, peer_at_fd_cap_not_reading_dropped);
        tcase_add_test(idle, dropped_peer_keeps_its_charge_until_it_closes);
        tcase_add_test(idle, queued_output_bounded_per_uid);
        tcase_add_test(idle, descriptors_before_hello_refused);
        suite_add_tcase(s, idle);

        tcase_set_timeout(watch, 120);
        tcase_add_test(watch, slow_watcher_loses_events_not_connection);
        tcase_add_test(watch, idle_client_outlives_timeout_with_notifications);
        suite_add_tcase(s, watch);

        /* each starts its own daemon with few fds; the reaper ends those a failed test left */
        tcase_set_timeout(budget, 120);
        tcase_add_unchecked_fixture(budget, fx_reaper_init, fx_reaper_run);
        tcase_add_test(budget, one_client_cannot_fill_the_fd_table);
        tcase_add_test(budget, unread_fd_replies_cannot_fill_the_fd_table);
        tcase_add_test(budget, out_of_fds_acquire_answered_or_hung_up);
        tcase_add_test(budget, unread_fds_in_flight_cannot_starve_others);
        suite_add_tcase(s, budget);
        return s;
}
