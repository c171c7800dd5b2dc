/* SPDX-License-Identifier: MIT */
/*
 * How long things live, whatever happens to the client that made them: a
 * view outlives its client's dlx_close() with its lease (so its producer
 * cannot reuse the pages under it), a forked child cannot release or close
 * its parent's leases and connection, and no call waits forever on a daemon
 * that stopped answering.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "rawpeer.h"

#define N 4096 /* floats: 16 KiB */

/* Publishes n floats of value v from the producer's allocator, zero-copy. */
static uint64_t publish_filled(dlx_client *p, const char *name, float v)
{
        DLManagedTensorVersioned *t = fx_alloc_f32(p, N);
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER};
        uint64_t version;

        for (int i = 0; i < N; i++)
                ((float *)t->dl_tensor.data)[i] = v;
        publish_ok(p, name, t, &o, &version);
        return version;
}

/* The producer reuses its memory as a producer would: n new tensors of the same size. */
static void cycle_memory(dlx_client *p, const char *prefix, int n, float v)
{
        char name[64];

        for (int i = 0; i < n; i++) {
                snprintf(name, sizeof(name), "%s/%d", prefix, i);
                publish_filled(p, name, v);
        }
}

static bool all_equal(const DLManagedTensorVersioned *t, float v)
{
        const float *d =
                (const float *)((const char *)t->dl_tensor.data + t->dl_tensor.byte_offset);

        for (int i = 0; i < N; i++)
                if (d[i] != v)
                        return false;
        return true;
}

/* ---- views outlive their client ---------------------------------------------------------- */

/*
 * The consumer closes its client but keeps the tensor: the lease stays, so
 * the producer, unpublishing and allocating again as fast as it likes, never
 * gets those pages back until the tensor is gone.
 */
START_TEST(view_outlives_close)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t;
        uint64_t v1 = publish_filled(p, "life/a", 1.0f);

        t = acquire_ok(q, "life/a", NULL);
        dlx_close(q);
        /* the lease is still the daemon's to count */
        ck_assert_uint_eq(fx_stats(p).leases, 1);
        ck_assert_int_eq(dlx_wait_released(p, "life/a", v1, NULL, 0), -ETIMEDOUT);
        /* the producer cycles its memory: new versions, new tensors of the same size */
        ck_assert_int_eq(dlx_unpublish(p, "life/a"), 0);
        cycle_memory(p, "life/b", 20, 9.0f);
        ck_assert_msg(all_equal(t, 1.0f), "a view whose client closed was overwritten");
        ck_assert_int_eq(dlx_wait_released(p, "life/a", v1, NULL, 0), -ETIMEDOUT);
        /* its last view gone, the lease goes, and the connection with it */
        t->deleter(t);
        ck_assert_int_eq(dlx_wait_released(p, "life/a", v1, NULL, 5000), 0);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        ck_assert_uint_eq(fx_wait_clients(p, 1, 5000), 1);
        dlx_close(p);
}
END_TEST

/*
 * Closing with a view alive is still a close: the client's own names, watches
 * and allocations go at once; only the leases of its live tensors stay.
 */
START_TEST(close_with_views_lets_go_of_the_rest)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t, *mine;
        struct dlx_info info;
        uint64_t watch;
        int deleted = 0;

        publish_filled(p, "life/x", 2.0f);
        t = acquire_ok(q, "life/x", NULL);
        ck_assert_int_eq(dlx_publish(q, "life/q-own", fx_plain_f32(4, 0.0f, &deleted), NULL, NULL),
                         0);
        ck_assert_int_eq(dlx_publish(q, "life/q-zero", fx_alloc_f32(q, 4), NULL, NULL), 0);
        ck_assert_int_eq(dlx_watch(q, "", &watch), 0);
        mine = acquire_ok(q, "life/q-zero", NULL);
        ck_assert_uint_eq(fx_stats(p).watchers, 1);

        dlx_close(q);
        /* its names went with the close, and nothing waits for it */
        ck_assert_int_eq(dlx_stat(p, "life/q-own", &info), -ENOENT);
        ck_assert_int_eq(dlx_stat(p, "life/q-zero", &info), -ENOENT);
        ck_assert_uint_eq(fx_stats(p).watchers, 0);
        ck_assert_uint_eq(fx_stats(p).clients, 2);
        ck_assert_uint_eq(fx_stats(p).leases, 2);
        ck_assert(all_equal(t, 2.0f));
        /* a view of its own zero-copy tensor is a view like any other */
        ck_assert(fx_vec_is(mine, 4, 0.0f) || mine->dl_tensor.data != NULL);
        mine->deleter(mine);
        ck_assert_int_eq(fx_wait_leases(p, 1, 5000), 1);
        ck_assert_uint_eq(fx_stats(p).clients, 2);
        t->deleter(t);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        ck_assert_uint_eq(fx_wait_clients(p, 1, 5000), 1);
        dlx_close(p);
}
END_TEST

/* With no view alive, a close ends the connection at once, as it always did. */
START_TEST(close_without_views_ends_connection)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t;

        publish_filled(p, "life/y", 3.0f);
        t = acquire_ok(q, "life/y", NULL);
        t->deleter(t);
        dlx_close(q);
        ck_assert_uint_eq(fx_wait_clients(p, 1, 5000), 1);
        ck_assert_uint_eq(fx_stats(p).leases, 0);
        dlx_close(p);
}
END_TEST

/* An export through the exchange API is a view: it keeps the lease past the close too. */
START_TEST(exchange_export_outlives_close)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t, *view = NULL;
        dlx_tensor *h = NULL;

        publish_filled(p, "life/e", 4.0f);
        t = acquire_ok(q, "life/e", NULL);
        ck_assert_int_eq(dlx_tensor_wrap(t, &h), 0);
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(h, &view), 0);
        dlx_tensor_unref(h); /* only the export holds it now */
        dlx_close(q);
        ck_assert_int_eq(dlx_unpublish(p, "life/e"), 0);
        cycle_memory(p, "life/f", 10, 8.0f);
        ck_assert(all_equal(view, 4.0f));
        ck_assert_uint_eq(fx_stats(p).leases, 1);
        view->deleter(view);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        ck_assert_uint_eq(fx_wait_clients(p, 1, 5000), 1);
        dlx_close(p);
}
END_TEST

/* Calls blocked in other threads when dlx_close() comes fail with -ECONNRESET, and nothing
 * touches the client after it is freed (ASan and valgrind runs would see it). */
struct blocked {
        dlx_client *c;
        int which;
        int started; /* set just before the call: close must come while it runs */
        int err;
        char name[32];
};

static void *block_in(void *arg)
{
        struct blocked *b = arg;
        struct dlx_acquire_options forever = {.timeout_ms = -1};
        DLManagedTensorVersioned *t = NULL;
        struct dlx_event ev;

        __atomic_store_n(&b->started, 1, __ATOMIC_SEQ_CST);
        if (b->which == 0)
                b->err = dlx_next_event(b->c, &ev, -1);
        else if (b->which == 1)
                b->err = dlx_acquire(b->c, "life/never", &forever, &t);
        else
                b->err = dlx_wait_released(b->c, b->name, 1, NULL, -1);
        return NULL;
}

START_TEST(close_ends_blocked_calls)
{
        dlx_client *p = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t;
        struct blocked b[3];
        pthread_t th[3];
        uint64_t watch;

        for (int round = 0; round < 20; round++) {
                dlx_client *c = fx_connect(&fx, "blocked");
                char name[32];
                snprintf(name, sizeof(name), "life/w/%d", round);
                ck_assert_int_eq(dlx_watch(c, "life/none/", &watch), 0);
                ck_assert_int_eq(publish_filled(c, name, 1.0f), 1);
                t = acquire_ok(p, name, NULL); /* so that v1 is not released */
                for (int i = 0; i < 3; i++) {
                        b[i] = (struct blocked){.c = c, .which = i};
                        snprintf(b[i].name, sizeof(b[i].name), "%s", name);
                        ck_assert_int_eq(pthread_create(&th[i], NULL, block_in, &b[i]), 0);
                }
                /* a call that has not begun when dlx_close() comes is the caller's bug */
                for (int i = 0; i < 3; i++)
                        while (!__atomic_load_n(&b[i].started, __ATOMIC_SEQ_CST))
                                fx_sleep_ms(1);
                fx_sleep_ms(20 + round % 4 * 5);
                dlx_close(c);
                for (int i = 0; i < 3; i++) {
                        pthread_join(th[i], NULL);
                        ck_assert_msg(b[i].err == -ECONNRESET, "round %d call %d: %s", round, i,
                                      dlx_strerror(b[i].err));
                }
                t->deleter(t);
        }
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        dlx_close(p);
}
END_TEST

struct acquirer {
        dlx_client *c;
        char name[32];
        int err;
};

static void *acquire_forever(void *arg)
{
        struct acquirer *b = arg;
        struct dlx_acquire_options o = {.timeout_ms = -1};
        DLManagedTensorVersioned *t = NULL;

        b->err = dlx_acquire(b->c, b->name, &o, &t);
        if (b->err == 0)
                t->deleter(t);
        return NULL;
}

/*
 * dlx_close() with many threads blocked in acquires that have reached the
 * daemon: every one returns -ECONNRESET or -EPIPE within seconds, and none
 * touches the client after it is freed (under ASan, a use after free shows).
 */
START_TEST(close_ends_many_blocked_acquires)
{
        enum { NTHREADS = 8 };
        dlx_client *obs = fx_connect(&fx, "observer");

        for (int round = 0; round < 50; round++) {
                dlx_client *c = fx_connect(&fx, "closer");
                struct acquirer b[NTHREADS];
                pthread_t th[NTHREADS];
                struct dlx_stats st;
                uint64_t r0, calls = 0;

                ck_assert_int_eq(dlx_stats(obs, &st), 0);
                r0 = st.requests;
                for (int i = 0; i < NTHREADS; i++) {
                        b[i].c = c;
                        snprintf(b[i].name, sizeof(b[i].name), "never/%d", i);
                        b[i].err = 1;
                        ck_assert_int_eq(pthread_create(&th[i], NULL, acquire_forever, &b[i]), 0);
                }
                /*
                 * Close only once every thread's acquire has reached the daemon:
                 * a thread that only starts after dlx_close() would be using a
                 * closed client, which no caller may do.
                 */
                do {
                        fx_sleep_ms(5);
                        ck_assert_int_eq(dlx_stats(obs, &st), 0);
                        calls++;
                } while (st.requests - r0 - calls < NTHREADS);
                dlx_close(c);
                for (int i = 0; i < NTHREADS; i++) {
                        struct timespec limit;
                        clock_gettime(CLOCK_REALTIME, &limit);
                        limit.tv_sec += 10;
                        ck_assert_msg(pthread_timedjoin_np(th[i], NULL, &limit) == 0,
                                      "round %d: a thread blocked in dlx_acquire() is still "
                                      "stuck 10 s after dlx_close() (waiting on the freed "
                                      "client's mutex/condition)",
                                      round);
                        ck_assert_msg(b[i].err == -ECONNRESET || b[i].err == -EPIPE,
                                      "blocked acquire ended with %d", b[i].err);
                }
        }
        dlx_close(obs);
}
END_TEST

/*
 * After a bye the session holds leases alone: anything but a release or a
 * ping is answered with CLOSED (-ECONNRESET, what a call racing dlx_close()
 * must say), never with SHUTDOWN, which means the daemon is stopping.
 */
START_TEST(request_after_bye_is_closed)
{
        int sock = rp_connect(fx.socket, "bye-then-more");
        struct wire_request req = {.id = 2, .type = WIRE_REQ_BYE};
        struct wire_reply rep;

        rp_send(sock, &req, -1);
        req = (struct wire_request){.id = 3, .type = WIRE_REQ_STATS};
        rp_send(sock, &req, -1);
        req = (struct wire_request){.id = 4, .type = WIRE_REQ_PING};
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, 2, WIRE_REP_NONE, NULL, NULL);
        rp_expect_error(sock, 3, WIRE_CLOSED, &rep);
        ck_assert_int_eq(wire_status_errno(WIRE_CLOSED), ECONNRESET);
        rp_expect_ok(sock, 4, WIRE_REP_PONG, NULL, NULL);
        close(sock);
}
END_TEST

/*
 * Calls running when dlx_close() comes from another thread complete or fail
 * with -ECONNRESET, wherever the close lands: a long list goes in pages, one
 * round trip each, and the bye may come between two.
 */
struct racer {
        dlx_client *c;
        int err;
        int started;
};

static int count_entry(void *ctx, const struct dlx_info *info)
{
        (void)info;
        ++*(int *)ctx;
        return 0;
}

static void *race_close(void *arg)
{
        struct racer *r = arg;
        int n = 0;

        __atomic_store_n(&r->started, 1, __ATOMIC_SEQ_CST);
        r->err = dlx_list(r->c, "life/race/", count_entry, &n);
        return NULL;
}

START_TEST(calls_racing_close_say_reset)
{
        dlx_client *p = fx_connect(&fx, "producer");
        char name[64];

        for (int i = 0; i < 1500; i++) {
                snprintf(name, sizeof(name), "life/race/%d", i);
                ck_assert_int_eq(dlx_publish(p, name, fx_plain_f32(1, 1.0f, NULL), NULL, NULL), 0);
        }
        for (int round = 0; round < 100; round++) {
                struct racer r[4];
                pthread_t th[4];
                dlx_client *c = fx_connect(&fx, "racer");
                for (int i = 0; i < 4; i++) {
                        r[i] = (struct racer){.c = c};
                        ck_assert_int_eq(pthread_create(&th[i], NULL, race_close, &r[i]), 0);
                }
                /* a call that has not begun when dlx_close() comes is the caller's bug */
                for (int i = 0; i < 4; i++)
                        while (!__atomic_load_n(&r[i].started, __ATOMIC_SEQ_CST))
                                fx_sleep_ms(1);
                fx_sleep_ms(1 + round % 3);
                dlx_close(c);
                for (int i = 0; i < 4; i++) {
                        pthread_join(th[i], NULL);
                        ck_assert_msg(r[i].err == 1500 || r[i].err == -ECONNRESET,
                                      "round %d: %d, %s", round, r[i].err, dlx_strerror(r[i].err));
                }
        }
        dlx_close(p);
}
END_TEST

/* ---- forks ---------------------------------------------------------------------------------- */

struct forked {
        dlx_client *c;
        DLManagedTensorVersioned *t;
};

/*
 * In the child: the parent's tensor reads the same, its deleter releases
 * nothing, every call on the parent's client says -ESTALE, and closing it
 * closes only the child's copies. Exit 0 when all held.
 */
static int child_of_consumer(void *arg)
{
        struct forked *f = arg;
        DLManagedTensorVersioned *t2 = NULL;

        if (!all_equal(f->t, 5.0f))
                return 2;
        if (dlx_ping(f->c) != -ESTALE || dlx_acquire(f->c, "life/k", NULL, &t2) != -ESTALE)
                return 3;
        if (!strstr(dlx_last_error(), "connect again"))
                return 4;
        f->t->deleter(f->t);
        dlx_close(f->c);
        return 0;
}

START_TEST(fork_child_leaves_parent_alone)
{
        dlx_client *p = fx_connect(&fx, "producer");
        struct forked f;
        int rc;

        publish_filled(p, "life/k", 5.0f);
        f.c = fx_connect(&fx, "consumer");
        f.t = acquire_ok(f.c, "life/k", NULL);
        rc = fx_wait(fx_spawn(child_of_consumer, &f));
        ck_assert_msg(rc == 0, "child: %d", rc);
        /* the parent's connection is untouched (and the daemon has read its release ring) */
        ck_assert_int_eq(dlx_ping(f.c), 0);
        ck_assert_uint_eq(fx_stats(p).leases, 1);
        /* and so is its lease: the producer cannot have the pages back */
        ck_assert_int_eq(dlx_unpublish(p, "life/k"), 0);
        cycle_memory(p, "life/m", 10, 7.0f);
        ck_assert(all_equal(f.t, 5.0f));
        f.t->deleter(f.t);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        dlx_close(f.c);
        dlx_close(p);
}
END_TEST

/*
 * A parent that acquired and published, then forked a worker that never
 * touches dlx, is killed: its connection ends at once (the worker holds no
 * copy of it), so its lease is released and its name is gone while the
 * worker lives on.
 */
struct doomed_parent {
        int ready[2];   /* the parent says it is set up */
        int worker_pid; /* written by the parent into a shared page */
};

static int doomed_parent_main(void *arg)
{
        struct doomed_parent *d = arg;
        dlx_client *c = fx_connect(&fx, "doomed");
        DLManagedTensorVersioned *t;
        pid_t worker;

        if (dlx_acquire(c, "life/shared", NULL, &t) < 0 ||
            dlx_publish(c, "life/doomed", fx_plain_f32(4, 1.0f, NULL), NULL, NULL) < 0)
                return 2;
        worker = fork();
        if (worker == 0) {
                sleep(30); /* a worker that never calls dlx; killed by the test */
                _exit(0);
        }
        d->worker_pid = worker;
        (void)!write(d->ready[1], "r", 1);
        for (;;)
                pause(); /* killed by the test */
}

START_TEST(killed_parent_forked_worker_keeps_nothing)
{
        dlx_client *p = fx_connect(&fx, "producer");
        struct doomed_parent *d =
                mmap(NULL, sizeof(*d), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        struct dlx_info info;
        pid_t parent;
        char byte;

        ck_assert_ptr_ne(d, MAP_FAILED);
        ck_assert_int_eq(pipe(d->ready), 0);
        publish_filled(p, "life/shared", 6.0f);
        parent = fx_spawn(doomed_parent_main, d);
        ck_assert_int_eq(read(d->ready[0], &byte, 1), 1);
        ck_assert_uint_eq(fx_stats(p).leases, 1);
        ck_assert_int_eq(dlx_stat(p, "life/doomed", &info), 0);
        ck_assert_int_eq(kill(parent, SIGKILL), 0);
        ck_assert_int_eq(fx_wait(parent), 128 + SIGKILL);
        /* the worker lives on: the parent's connection must not */
        ck_assert_int_eq(kill(d->worker_pid, 0), 0);
        ck_assert_int_eq(fx_wait_leases(p, 0, 3000), 0);
        ck_assert_uint_eq(fx_wait_clients(p, 1, 3000), 1);
        ck_assert_int_eq(dlx_stat(p, "life/doomed", &info), -ENOENT);
        kill(d->worker_pid, SIGKILL);
        close(d->ready[0]);
        close(d->ready[1]);
        munmap(d, sizeof(*d));
        dlx_close(p);
}
END_TEST

/*
 * fork() while other threads are inside libdlx, holding its process-wide
 * locks (the table of read-only mappings every wrap looks up, the exchange
 * API's default client): the child must find every lock free, connect its
 * own client, map, wrap and allocate through the exchange API, whoever held
 * what when it was made. A child that hangs is killed by its alarm.
 */
struct busy {
        dlx_client *c;
        DLManagedTensorVersioned *held;
        int stop;
        int kind;
};

static void *busy_main(void *arg)
{
        struct busy *b = arg;

        while (!__atomic_load_n(&b->stop, __ATOMIC_RELAXED)) {
                if (b->kind == 0) {
                        /* a copy without flags: libdlx looks the mapping up to restore READ_ONLY */
                        DLManagedTensorVersioned *cp = malloc(sizeof(*cp));
                        dlx_tensor *h;
                        *cp = *b->held;
                        cp->flags = 0;
                        cp->deleter = (void (*)(DLManagedTensorVersioned *))free;
                        if (dlx_tensor_wrap(cp, &h) == 0)
                                dlx_tensor_unref(h);
                } else {
                        dlx_client *x = fx_connect(&fx, "cycling");
                        dlx_close(x);
                        /* under valgrind, let the (as slow) daemon serve the children too */
                        if (fx_slowdown() > 1)
                                fx_sleep_ms(20);
                }
        }
        return NULL;
}

static int child_after_busy_fork(void *arg)
{
        const int64_t shape[1] = {16};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        DLManagedTensorVersioned *t, *a;
        dlx_tensor *h;
        dlx_client *c;

        (void)arg;
        alarm(10);
        c = fx_connect(&fx, "child");
        if (dlx_acquire(c, "life/busy", NULL, &t) < 0)
                return 2;
        if (dlx_tensor_wrap(t, &h) < 0)
                return 3;
        dlx_tensor_unref(h);
        /* the allocator takes this process's client, not a parent's */
        proto.shape = (int64_t *)shape;
        if (dlx_exchange_api()->managed_tensor_allocator(&proto, &a, NULL, NULL) != 0)
                return 4;
        a->deleter(a);
        dlx_close(c);
        return 0;
}

START_TEST(fork_while_threads_hold_locks)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *c = fx_connect(&fx, "busy");
        DLManagedTensorVersioned *held;
        struct busy b[4];
        pthread_t th[4];

        publish_filled(p, "life/busy", 2.0f);
        held = acquire_ok(c, "life/busy", NULL);
        for (int i = 0; i < 4; i++) {
                b[i] = (struct busy){.c = c, .held = held, .kind = i == 3};
                ck_assert_int_eq(pthread_create(&th[i], NULL, busy_main, &b[i]), 0);
        }
        /* under valgrind, which runs one thread at a time, a tenth: each fork takes seconds */
        for (int i = 0; i < 30 / fx_slowdown(); i++) {
                int rc = fx_wait(fx_spawn(child_after_busy_fork, NULL));
                ck_assert_msg(rc == 0, "fork %d: child %s (%d)", i,
                              rc == 128 + SIGALRM ? "hung" : "failed", rc);
        }
        for (int i = 0; i < 4; i++) {
                __atomic_store_n(&b[i].stop, 1, __ATOMIC_RELAXED);
                pthread_join(th[i], NULL);
        }
        held->deleter(held);
        dlx_close(c);
        dlx_close(p);
}
END_TEST

/*
 * The exchange API's allocator in a forked child: a client of the parent's
 * (closed there or not) is not the child's, the child's own is.
 */
static int child_allocates(void *arg)
{
        const int64_t shape[1] = {16};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        DLManagedTensorVersioned *a = NULL;
        dlx_client *inherited = arg, *mine;

        proto.shape = (int64_t *)shape;
        /* none of this process's own yet: the parent's does not count */
        if (dlx_exchange_api()->managed_tensor_allocator(&proto, &a, NULL, NULL) == 0)
                return 2;
        mine = fx_connect(&fx, "child");
        if (dlx_exchange_api()->managed_tensor_allocator(&proto, &a, NULL, NULL) != 0)
                return 3;
        a->deleter(a);
        dlx_close(inherited);
        if (dlx_exchange_api()->managed_tensor_allocator(&proto, &a, NULL, NULL) != 0)
                return 4;
        a->deleter(a);
        dlx_close(mine);
        return 0;
}

START_TEST(fork_child_allocates_from_its_own_client)
{
        dlx_client *c = fx_connect(&fx, "parent");
        int rc;

        dlx_set_default_client(c);
        rc = fx_wait(fx_spawn(child_allocates, c));
        ck_assert_msg(rc == 0, "child: %d", rc);
        ck_assert_int_eq(dlx_ping(c), 0);
        dlx_close(c);
}
END_TEST

/* ---- a daemon that stops answering -------------------------------------------------------- */

static dlx_client *connect_timeout(int64_t timeout_ms)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .timeout_ms = timeout_ms};
        dlx_client *c = NULL;
        int err = dlx_connect(&o, &c);

        ck_assert_msg(err == 0, "connect: %s (%s)", dlx_strerror(err), dlx_last_error());
        return c;
}

static void stop_daemon(void)
{
        ck_assert_int_eq(kill(fx.pid, SIGSTOP), 0);
}

static void resume_daemon(void)
{
        ck_assert_int_eq(kill(fx.pid, SIGCONT), 0);
}

/* A call to a stopped daemon fails after its silence and an unanswered ping; so does the next. */
START_TEST(call_to_stopped_daemon_times_out)
{
        dlx_client *c = connect_timeout(300);
        int64_t t0;
        int err;

        stop_daemon();
        t0 = fx_now_ms();
        err = dlx_ping(c);
        int64_t took = fx_now_ms() - t0;
        resume_daemon();
        ck_assert_int_eq(err, -ETIMEDOUT);
        ck_assert_msg(took >= 300 && took < 5000, "gave up after %lld ms", (long long)took);
        expect_last_error("not answered");
        /* unusable from now on, and says why (no second wait: the daemon is running again) */
        ck_assert_int_eq(dlx_ping(c), -ETIMEDOUT);
        expect_last_error("not answered");
        dlx_close(c);
}
END_TEST

/* dlx_connect gives up on a daemon that accepts (the kernel does) but never greets. */
START_TEST(connect_to_stopped_daemon_times_out)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .timeout_ms = 300};
        dlx_client *c = NULL;
        int64_t t0;
        int err;

        stop_daemon();
        t0 = fx_now_ms();
        err = dlx_connect(&o, &c);
        int64_t took = fx_now_ms() - t0;
        resume_daemon();
        ck_assert_int_eq(err, -ETIMEDOUT);
        ck_assert_ptr_null(c);
        ck_assert_msg(took >= 300 && took < 5000, "gave up after %lld ms", (long long)took);
}
END_TEST

/* Nor does it wait on a daemon whose listen backlog is full: connect() itself times out. */
START_TEST(connect_to_full_backlog_times_out)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .timeout_ms = 300};
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        struct rlimit saved, more;
        dlx_client *c = NULL;
        int *socks, n = 0, err;

        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        more = saved;
        more.rlim_cur = more.rlim_max < 65536 ? more.rlim_max : 65536;
        setrlimit(RLIMIT_NOFILE, &more);
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", fx.socket);
        socks = calloc(more.rlim_cur, sizeof(*socks));
        ck_assert_ptr_nonnull(socks);
        stop_daemon();
        for (;;) {
                int s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
                if (s < 0)
                        break;
                if (connect(s, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
                        close(s);
                        break;
                }
                socks[n++] = s;
        }
        if (errno == EAGAIN) {
                int64_t t0 = fx_now_ms();
                err = dlx_connect(&o, &c);
                int64_t took = fx_now_ms() - t0;
                ck_assert_int_eq(err, -ETIMEDOUT);
                ck_assert_ptr_null(c);
                expect_last_error("accepted no connection within 300 ms");
                ck_assert_msg(took >= 250 && took < 5000, "gave up after %lld ms", (long long)took);
        }
        resume_daemon();
        for (int i = 0; i < n; i++)
                close(socks[i]);
        free(socks);
        setrlimit(RLIMIT_NOFILE, &saved);
}
END_TEST

/* The default is a limit too: a stopped daemon fails a default client's call, not hangs it. */
START_TEST(default_timeout_is_finite)
{
        /* the library's own default (fx_connect gives valgrind runs a longer one) */
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "default"};
        dlx_client *c = NULL;
        int64_t t0;
        int err;

        ck_assert_int_eq(dlx_connect(&o, &c), 0);

        stop_daemon();
        t0 = fx_now_ms();
        err = dlx_ping(c);
        int64_t took = fx_now_ms() - t0;
        resume_daemon();
        ck_assert_int_eq(err, -ETIMEDOUT);
        ck_assert_msg(took >= DLX_DEFAULT_TIMEOUT_MS && took < 3 * DLX_DEFAULT_TIMEOUT_MS,
                      "gave up after %lld ms", (long long)took);
        dlx_close(c);
}
END_TEST

/*
 * A daemon silent for long enough that the client gives up on it (a call or
 * dlx_close() times out) is not a reason to let go of a live view's lease:
 * when the daemon comes back, the view still holds its pages, whatever its
 * producer does, until the view is gone.
 */
static void view_survives_timeout(bool close_it)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *c = connect_timeout(150);
        DLManagedTensorVersioned *t;
        uint64_t v1 = publish_filled(p, "life/stall", 3.0f);

        t = acquire_ok(c, "life/stall", NULL);
        ck_assert_int_eq(dlx_publish(c, "life/stall-own", fx_plain_f32(4, 1.0f, NULL), NULL, NULL),
                         0);
        stop_daemon();
        if (close_it)
                dlx_close(c);
        else
                ck_assert_int_eq(dlx_ping(c), -ETIMEDOUT);
        fx_sleep_ms(100);
        resume_daemon();
        ck_assert_uint_eq(fx_stats(p).leases, 1);
        ck_assert_int_eq(dlx_unpublish(p, "life/stall"), 0);
        cycle_memory(p, "life/stall-next", 20, 8.0f);
        ck_assert_msg(all_equal(t, 3.0f), "a view was overwritten after its client timed out");
        ck_assert_int_eq(dlx_wait_released(p, "life/stall", v1, NULL, 0), -ETIMEDOUT);
        if (close_it) {
                /* the bye reached the daemon when it woke: only the lease is left of c */
                struct dlx_info info;
                int64_t until = fx_now_ms() + 5000;
                while (dlx_stat(p, "life/stall-own", &info) == 0 && fx_now_ms() < until)
                        fx_sleep_ms(5);
                ck_assert_int_eq(dlx_stat(p, "life/stall-own", &info), -ENOENT);
        }
        /* the last view gone, the session ends with its lease (a closed client) or stays */
        t->deleter(t);
        if (!close_it)
                dlx_close(c);
        ck_assert_int_eq(dlx_wait_released(p, "life/stall", v1, NULL, 5000), 0);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        ck_assert_uint_eq(fx_wait_clients(p, 1, 5000), 1);
        dlx_close(p);
}

START_TEST(view_survives_call_timeout)
{
        view_survives_timeout(false);
}
END_TEST

START_TEST(view_survives_close_timeout)
{
        view_survives_timeout(true);
}
END_TEST

static int list_count(void *ctx, const struct dlx_info *info)
{
        (void)info;
        ++*(int *)ctx;
        return 0;
}

static void *list_all(void *arg)
{
        int n = 0;

        return (void *)(intptr_t)dlx_list(arg, "", list_count, &n);
}

/*
 * Calls given up on a stopped daemon asked for more than the socket holds:
 * the daemon, resumed, answers into a socket the client never reads again.
 * It must not drop the client for that, with the leases of its live views:
 * the client said bye as it gave up, so nothing is owed.
 */
START_TEST(view_survives_unread_answers)
{
        static const char *const args[] = {"--timeout-ms", "300", NULL};
        DLManagedTensorVersioned *t;
        char name[DLX_NAME_MAX + 1];
        pthread_t th[4];
        dlx_client *p, *c;
        uint64_t v1;

        dlxd_stop(&fx);
        dlxd_start(&fx, args);
        p = fx_connect(&fx, "producer");
        c = connect_timeout(200);
        /* a list page of these is about 100 KiB: four fill the socket twice */
        for (int i = 0; i < 512; i++) {
                memset(name, 'n', 200);
                snprintf(name, sizeof(name), "life/long/%04d/", i);
                name[strlen(name)] = 'n';
                name[200] = '\0';
                publish_filled(p, name, 1.0f);
        }
        v1 = publish_filled(p, "life/stall", 3.0f);
        t = acquire_ok(c, "life/stall", NULL);
        stop_daemon();
        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(pthread_create(&th[i], NULL, list_all, c), 0);
        for (int i = 0; i < 4; i++) {
                void *rc;
                pthread_join(th[i], &rc);
                ck_assert_int_eq((int)(intptr_t)rc, -ETIMEDOUT);
        }
        resume_daemon();
        fx_sleep_ms(300 * 4 * fx_slowdown()); /* four of the daemon's timeouts, nothing read */
        ck_assert_uint_eq(fx_stats(p).clients, 2);
        ck_assert_uint_eq(fx_stats(p).leases, 1);
        ck_assert_int_eq(dlx_unpublish(p, "life/stall"), 0);
        cycle_memory(p, "life/stall-next", 20, 8.0f);
        ck_assert_msg(all_equal(t, 3.0f), "a view was overwritten after its client timed out");
        t->deleter(t);
        dlx_close(c);
        ck_assert_int_eq(dlx_wait_released(p, "life/stall", v1, NULL, 5000), 0);
        ck_assert_uint_eq(fx_wait_clients(p, 1, 5000), 1);
        dlx_close(p);
}
END_TEST

/* A long wait asked for goes on: the daemon answers the pings meanwhile. */
START_TEST(blocked_acquire_outlives_timeout)
{
        dlx_client *c = connect_timeout(150);
        dlx_client *p = fx_connect(&fx, "producer");
        struct dlx_acquire_options o = {.timeout_ms = 5000};
        DLManagedTensorVersioned *t = NULL;
        pid_t child = fork();

        ck_assert_int_ge(child, 0);
        if (child == 0) {
                /* publishes after 8 client timeouts, from its own connection */
                struct dlx_connect_options co = {.socket_path = fx.socket};
                dlx_client *pc = NULL;
                fx_sleep_ms(1200);
                if (dlx_connect(&co, &pc) < 0 ||
                    dlx_publish(pc, "life/late", fx_plain_f32(4, 1.0f, NULL),
                                &(struct dlx_publish_options){.persist = true}, NULL) < 0)
                        fx_child_exit(1);
                dlx_close(pc);
                fx_child_exit(0);
        }
        t = acquire_ok(c, "life/late", &o);
        ck_assert(fx_vec_is(t, 4, 1.0f));
        t->deleter(t);
        ck_assert_int_eq(fx_wait(child), 0);
        /* and an event wait longer than the timeout, likewise */
        struct dlx_event ev;
        ck_assert_int_eq(dlx_next_event(c, &ev, 700), -ETIMEDOUT);
        ck_assert_int_eq(dlx_ping(c), 0);
        ck_assert_int_eq(dlx_unpublish(p, "life/late"), 0);
        dlx_close(p);
        dlx_close(c);
}
END_TEST

/* A wait for events without limit notices the daemon stopped, and says so. */
START_TEST(event_wait_notices_stopped_daemon)
{
        dlx_client *c = connect_timeout(200);
        struct dlx_event ev;
        uint64_t watch;
        int64_t t0;
        int err;

        ck_assert_int_eq(dlx_watch(c, "life/", &watch), 0);
        stop_daemon();
        t0 = fx_now_ms();
        err = dlx_next_event(c, &ev, -1);
        int64_t took = fx_now_ms() - t0;
        resume_daemon();
        ck_assert_int_eq(err, -ETIMEDOUT);
        ck_assert_msg(took < 5000, "gave up after %lld ms", (long long)took);
        dlx_close(c);
}
END_TEST

Suite *lifetime_suite(void)
{
        Suite *s = suite_create("lifetime");
        TCase *views = tcase_create("views");
        TCase *forks = tcase_create("forks");
        TCase *timeouts = tcase_create("timeouts");

        tcase_add_checked_fixture(views, fx_setup, fx_teardown);
        tcase_add_test(views, view_outlives_close);
        tcase_add_test(views, close_with_views_lets_go_of_the_rest);
        tcase_add_test(views, close_without_views_ends_connection);
        tcase_add_test(views, exchange_export_outlives_close);
        tcase_add_test(views, close_ends_blocked_calls);
        tcase_add_test(views, close_ends_many_blocked_acquires);
        tcase_add_test(views, request_after_bye_is_closed);
        tcase_add_test(views, calls_racing_close_say_reset);
        suite_add_tcase(s, views);

        tcase_add_checked_fixture(forks, fx_setup, fx_teardown);
        /* forks behind four busy threads: slow on a loaded two-CPU machine, not stuck */
        tcase_set_timeout(forks, 240);
        tcase_add_test(forks, fork_child_leaves_parent_alone);
        tcase_add_test(forks, killed_parent_forked_worker_keeps_nothing);
        tcase_add_test(forks, fork_while_threads_hold_locks);
        tcase_add_test(forks, fork_child_allocates_from_its_own_client);
        suite_add_tcase(s, forks);

        tcase_add_checked_fixture(timeouts, fx_setup, fx_teardown);
        tcase_set_timeout(timeouts, 120);
        tcase_add_test(timeouts, call_to_stopped_daemon_times_out);
        tcase_add_test(timeouts, connect_to_stopped_daemon_times_out);
        tcase_add_test(timeouts, connect_to_full_backlog_times_out);
        tcase_add_test(timeouts, default_timeout_is_finite);
        tcase_add_test(timeouts, blocked_acquire_outlives_timeout);
        tcase_add_test(timeouts, event_wait_notices_stopped_daemon);
        tcase_add_test(timeouts, view_survives_call_timeout);
        tcase_add_test(timeouts, view_survives_close_timeout);
        tcase_add_test(timeouts, view_survives_unread_answers);
        suite_add_tcase(s, timeouts);
        return s;
}
