/* SPDX-License-Identifier: MIT */
/*
 * Publish/acquire between processes against a real dlxd: shared pages,
 * persistence, replacement and removal under leases, crashes, waiting,
 * watching, ownership, the mapping cache, limits and the socket's life.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"
#include "internal.h" /* forgotten_segment_unmapped_after_crossing_reply: when a request is out */
#include "rawpeer.h"
#include "ring.h" /* release_after_idle_reaches_producer: whether the daemon sleeps on it */
#include "wire_limits.h"

/* ---- helpers ------------------------------------------------------------------------- */

static int *shared_counter(void)
{
        int *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

        ck_assert_ptr_ne(p, MAP_FAILED);
        *p = 0;
        return p;
}

/* Lets p take in events (by a blocking ping when by_ping) until the deleter ran: once, in 1 s. */
static void wait_deleter_ran(dlx_client *p, const int *count, bool by_ping)
{
        for (int i = 0; i < 200 && *count == 0; i++) {
                fx_sleep_ms(5);
                if (by_ping)
                        ck_assert_int_eq(dlx_ping(p), 0);
                else
                        ck_assert_int_ge(dlx_process_events(p), 0);
        }
        ck_assert_int_eq(*count, 1);
}

/* A pipe used to say "I'm there" between processes. */
struct gate {
        int fd[2];
};

static void gate_init(struct gate *g)
{
        ck_assert_int_eq(pipe2(g->fd, O_CLOEXEC), 0);
}

static void gate_open(struct gate *g)
{
        (void)!write(g->fd[1], "x", 1);
}

static bool gate_wait(struct gate *g, int timeout_ms)
{
        struct pollfd p = {.fd = g->fd[0], .events = POLLIN};
        char b;

        return poll(&p, 1, timeout_ms) == 1 && read(g->fd[0], &b, 1) == 1;
}

static void gate_done(struct gate *g)
{
        close(g->fd[0]);
        close(g->fd[1]);
}

/* ---- cross-process sharing ------------------------------------------------------------- */

struct share_arg {
        const char *name;
        int64_t n;
};

static int consumer_writes(void *p)
{
        struct share_arg *a = p;
        dlx_client *c = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t = acquire_ok(c, a->name, NULL);
        const char *storage = NULL;
        int rc = 0;

        if (!fx_vec_is(t, a->n, 1.0f))
                rc = 10;
        if (t->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
                rc = 11;
        if (t->version.major != 1 || t->version.minor != 3)
                rc = 12;
        if (dlx_tensor_info(t, NULL, NULL, &storage) != 0 || strcmp(storage, "memfd") != 0)
                rc = 13;
        /* write through the mapping: the producer must see it in its own pages */
        ((float *)t->dl_tensor.data)[0] = -42.0f;
        t->deleter(t);
        dlx_close(c);
        return rc;
}

START_TEST(publish_acquire_same_pages)
{
        struct dlx_publish_options o = {.writable = true};
        struct share_arg a = {.name = "share/vec", .n = 1000};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = fx_vec_f32(c, a.n, 1.0f);
        volatile float *mine = t->dl_tensor.data;
        uint64_t v = 0;

        publish_ok(c, a.name, t, &o, &v);
        ck_assert_uint_eq(v, 1);
        ck_assert_int_eq(fx_wait(fx_spawn(consumer_writes, &a)), 0);
        /* the producer still holds its tensor (published zero-copy): same memory */
        ck_assert(mine[0] == -42.0f);
        ck_assert(mine[1] == 2.0f);
        dlx_close(c);
}
END_TEST

static int consumer_tries_write(void *p)
{
        struct share_arg *a = p;
        dlx_client *c = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t = acquire_ok(c, a->name, NULL);
        uintptr_t page = (uintptr_t)t->dl_tensor.data & ~(uintptr_t)4095;
        int rc = 0;

        if (!(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY))
                rc = 10;
        else if (!fx_vec_is(t, a->n, 5.0f))
                rc = 11;
        /* a read-only tensor arrives through a read-only fd: no way to make it writable */
        else if (mprotect((void *)page, 4096, PROT_READ | PROT_WRITE) == 0)
                rc = 12;
        t->deleter(t);
        dlx_close(c);
        return rc;
}

static void free_struct_deleter(DLManagedTensorVersioned *t)
{
        free(t);
}

START_TEST(read_only_is_enforced)
{
        struct share_arg a = {.name = "share/ro", .n = 64};
        dlx_client *c = fx_connect(&fx, "producer");

        publish_ok(c, a.name, fx_vec_f32(c, a.n, 5.0f), NULL, NULL);
        ck_assert_int_eq(fx_wait(fx_spawn(consumer_tries_write, &a)), 0);

        /* the copy path seals the memfd against writes altogether */
        float *plain = malloc(64 * sizeof(float));
        int64_t *shape = malloc(sizeof(int64_t));
        for (int i = 0; i < 64; i++)
                plain[i] = 5.0f + (float)i;
        shape[0] = 64;
        DLManagedTensorVersioned *mt = calloc(1, sizeof(*mt));
        mt->version.major = 1;
        mt->version.minor = 3;
        mt->dl_tensor = (DLTensor){.data = plain,
                                   .device = {kDLCPU, 0},
                                   .ndim = 1,
                                   .dtype = {kDLFloat, 32, 1},
                                   .shape = shape};
        mt->deleter = free_struct_deleter;
        struct dlx_publish_options o = {.copy = DLX_COPY_ALWAYS};
        int *count = shared_counter();
        publish_ok(c, "share/ro-copy", fx_counted(mt, count), &o, NULL);
        ck_assert_int_eq(*count, 1); /* the copy path deletes at once */
        a.name = "share/ro-copy";
        ck_assert_int_eq(fx_wait(fx_spawn(consumer_tries_write, &a)), 0);
        free(plain);
        free(shape);
        dlx_close(c);
        munmap(count, 4096);
}
END_TEST

static int producer_then_exit(void *p)
{
        (void)p;
        dlx_client *c = fx_connect(&fx, "short-lived");
        struct dlx_publish_options keep = {.persist = true};

        publish_ok(c, "life/persist", fx_vec_f32(c, 16, 3.0f), &keep, NULL);
        publish_ok(c, "life/temp", fx_vec_f32(c, 16, 4.0f), NULL, NULL);
        dlx_close(c);
        return 0;
}

START_TEST(persist_outlives_producer)
{
        dlx_client *c = fx_connect(&fx, "reader");
        DLManagedTensorVersioned *t = NULL;
        struct dlx_info info;

        ck_assert_int_eq(fx_wait(fx_spawn(producer_then_exit, NULL)), 0);
        t = acquire_ok(c, "life/persist", NULL);
        ck_assert(fx_vec_is(t, 16, 3.0f));
        ck_assert_int_eq(dlx_stat(c, "life/persist", &info), 0);
        ck_assert(info.persist);
        ck_assert_int_eq(info.producer_pid, 0);
        ck_assert_uint_eq(info.leases, 1);
        t->deleter(t);
        ck_assert_int_eq(dlx_acquire(c, "life/temp", NULL, &t), -ENOENT);
        ck_assert_int_eq(dlx_stat(c, "life/temp", &info), -ENOENT);
        dlx_close(c);
}
END_TEST

/* ---- lifetimes under leases ------------------------------------------------------------- */

START_TEST(replace_while_leased)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        int *count = shared_counter();
        DLManagedTensorVersioned *old, *cur;
        uint64_t v = 0;

        publish_ok(p, "r/x", fx_counted(fx_vec_f32(p, 32, 1.0f), count), NULL, &v);
        ck_assert_uint_eq(v, 1);
        old = acquire_ok(q, "r/x", NULL);
        publish_ok(p, "r/x", fx_vec_f32(p, 32, 100.0f), NULL, &v);
        ck_assert_uint_eq(v, 2);

        /* the old version is still readable by its lease holder */
        ck_assert(fx_vec_is(old, 32, 1.0f));
        cur = acquire_ok(q, "r/x", NULL);
        ck_assert(fx_vec_is(cur, 32, 100.0f));
        dlx_process_events(p);
        ck_assert_int_eq(*count, 0);

        old->deleter(old);
        /* RELEASED reaches the producer; its deleter runs exactly once */
        wait_deleter_ran(p, count, false);
        dlx_process_events(p);
        ck_assert_int_eq(*count, 1);
        cur->deleter(cur);
        dlx_close(q);
        dlx_close(p);
        ck_assert_int_eq(*count, 1);
        munmap(count, 4096);
}
END_TEST

START_TEST(unpublish_while_leased)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        int *count = shared_counter();
        DLManagedTensorVersioned *held, *t;

        publish_ok(p, "u/x", fx_counted(fx_vec_f32(p, 8, 7.0f), count), NULL, NULL);
        held = acquire_ok(q, "u/x", NULL);
        ck_assert_int_eq(dlx_unpublish(p, "u/x"), 0);
        ck_assert_int_eq(dlx_acquire(q, "u/x", NULL, &t), -ENOENT);
        ck_assert_int_eq(dlx_unpublish(p, "u/x"), -ENOENT);
        ck_assert(fx_vec_is(held, 8, 7.0f));
        dlx_process_events(p);
        ck_assert_int_eq(*count, 0);
        held->deleter(held);
        /* a blocking call also delivers pending events */
        wait_deleter_ran(p, count, true);
        dlx_close(q);
        dlx_close(p);
        ck_assert_int_eq(*count, 1);
        munmap(count, 4096);
}
END_TEST

START_TEST(close_runs_held_deleters)
{
        dlx_client *p = fx_connect(&fx, "producer");
        int *count = shared_counter();

        publish_ok(p, "c/a", fx_counted(fx_vec_f32(p, 8, 1.0f), count), NULL, NULL);
        publish_ok(p, "c/b", fx_counted(fx_vec_f32(p, 8, 2.0f), count), NULL, NULL);
        ck_assert_int_eq(*count, 0);
        dlx_close(p);
        ck_assert_int_eq(*count, 2);
        munmap(count, 4096);
}
END_TEST

struct holder_arg {
        struct gate ready;
};

static int hold_forever(void *p)
{
        struct holder_arg *a = p;
        dlx_client *c = fx_connect(&fx, "holder");
        DLManagedTensorVersioned *t = acquire_ok(c, "k/x", NULL);

        (void)t;
        gate_open(&a->ready);
        for (;;)
                pause();
        return 0;
}

START_TEST(kill9_releases_leases)
{
        dlx_client *p = fx_connect(&fx, "producer");
        int *count = shared_counter();
        struct holder_arg a;
        pid_t pid;

        gate_init(&a.ready);
        publish_ok(p, "k/x", fx_counted(fx_vec_f32(p, 8, 1.0f), count), NULL, NULL);
        pid = fx_spawn(hold_forever, &a);
        ck_assert(gate_wait(&a.ready, 5000));
        ck_assert_int_eq(fx_wait_leases(p, 1, 1000), 1);
        publish_ok(p, "k/x", fx_vec_f32(p, 8, 2.0f), NULL, NULL);
        ck_assert_int_eq(*count, 0);

        kill(pid, SIGKILL);
        ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
        ck_assert_int_eq(fx_wait_leases(p, 0, 5000), 0);
        wait_deleter_ran(p, count, false);
        gate_done(&a.ready);
        dlx_close(p);
        munmap(count, 4096);
}
END_TEST

/* ---- waiting --------------------------------------------------------------------------- */

START_TEST(acquire_timeout)
{
        dlx_client *c = fx_connect(&fx, "waiter");
        struct dlx_acquire_options o = {.timeout_ms = 150};
        DLManagedTensorVersioned *t = NULL;
        int64_t start = fx_now_ms();

        ck_assert_int_eq(dlx_acquire(c, "w/none", &o, &t), -ETIMEDOUT);
        ck_assert_int_ge(fx_now_ms() - start, 140);
        ck_assert_ptr_null(t);
        expect_last_error("w/none");
        ck_assert_int_eq(dlx_acquire(c, "w/none", NULL, &t), -ENOENT);
        dlx_close(c);
}
END_TEST

struct late_arg {
        const char *name;
        int delay_ms;
        int count;
};

static int publish_late(void *p)
{
        struct late_arg *a = p;
        dlx_client *c = fx_connect(&fx, "late");

        for (int i = 0; i < a->count; i++) {
                fx_sleep_ms(a->delay_ms);
                publish_ok(c, a->name, fx_vec_f32(c, 4, (float)(i + 1) * 10.0f),
                           &(struct dlx_publish_options){.persist = true}, NULL);
        }
        dlx_close(c);
        return 0;
}

START_TEST(acquire_waits_for_publish)
{
        dlx_client *c = fx_connect(&fx, "waiter");
        struct late_arg a = {.name = "w/late", .delay_ms = 50, .count = 1};
        struct dlx_acquire_options o = {.timeout_ms = 5000};
        pid_t pid = fx_spawn(publish_late, &a);
        DLManagedTensorVersioned *t = acquire_ok(c, "w/late", &o);

        ck_assert(fx_vec_is(t, 4, 10.0f));
        t->deleter(t);
        ck_assert_int_eq(fx_wait(pid), 0);
        dlx_close(c);
}
END_TEST

START_TEST(acquire_min_version)
{
        dlx_client *c = fx_connect(&fx, "waiter");
        struct late_arg a = {.name = "w/mv", .delay_ms = 30, .count = 3};
        struct dlx_acquire_options o = {.timeout_ms = 5000, .min_version = 3};
        pid_t pid = fx_spawn(publish_late, &a);
        DLManagedTensorVersioned *t = acquire_ok(c, "w/mv", &o);
        uint64_t v = 0;

        ck_assert_int_eq(dlx_tensor_info(t, NULL, &v, NULL), 0);
        ck_assert_uint_eq(v, 3);
        ck_assert(fx_vec_is(t, 4, 30.0f));
        t->deleter(t);
        ck_assert_int_eq(fx_wait(pid), 0);

        /* already satisfied: no wait; beyond the current one with no wait: ENOENT */
        o.min_version = 2;
        o.timeout_ms = 0;
        t = acquire_ok(c, "w/mv", &o);
        t->deleter(t);
        o.min_version = 4;
        ck_assert_int_eq(dlx_acquire(c, "w/mv", &o, &t), -ENOENT);
        o.timeout_ms = 100;
        ck_assert_int_eq(dlx_acquire(c, "w/mv", &o, &t), -ETIMEDOUT);
        dlx_close(c);
}
END_TEST

/* ---- watching -------------------------------------------------------------------------- */

static void expect_event(dlx_client *c, enum dlx_event_kind kind, const char *name,
                         uint64_t version)
{
        struct dlx_event ev;
        int err = dlx_next_event(c, &ev, 2000);

        ck_assert_msg(err == 0, "next_event: %s", dlx_strerror(err));
        ck_assert_int_eq(ev.kind, kind);
        ck_assert_str_eq(ev.name, name);
        ck_assert_uint_eq(ev.version, version);
}

START_TEST(watch_events)
{
        dlx_client *w = fx_connect(&fx, "watcher");
        dlx_client *p = fx_connect(&fx, "producer");
        struct dlx_event ev;
        uint64_t id = 0;

        ck_assert_int_eq(dlx_watch(w, "sensors/", &id), 0);
        ck_assert_uint_gt(id, 0);
        publish_ok(p, "sensors/a", fx_vec_f32(p, 2, 0), NULL, NULL);
        publish_ok(p, "other/b", fx_vec_f32(p, 2, 0), NULL, NULL);
        publish_ok(p, "sensors/a", fx_vec_f32(p, 2, 0), NULL, NULL);
        ck_assert_int_eq(dlx_unpublish(p, "sensors/a"), 0);
        publish_ok(p, "sensors/c", fx_vec_f32(p, 2, 0), NULL, NULL);

        expect_event(w, DLX_EVENT_PUBLISHED, "sensors/a", 1);
        expect_event(w, DLX_EVENT_REPLACED, "sensors/a", 2);
        expect_event(w, DLX_EVENT_UNPUBLISHED, "sensors/a", 2);
        expect_event(w, DLX_EVENT_PUBLISHED, "sensors/c", 1);
        ck_assert_int_eq(dlx_next_event(w, &ev, 0), -EAGAIN);

        /* the producer leaving unpublishes its tensor: watchers hear of it */
        dlx_close(p);
        expect_event(w, DLX_EVENT_UNPUBLISHED, "sensors/c", 1);
        ck_assert_int_eq(dlx_unwatch(w, id), 0);
        ck_assert_int_eq(dlx_unwatch(w, id), -ENOENT);
        dlx_close(w);
}
END_TEST

START_TEST(event_loop_integration)
{
        dlx_client *w = fx_connect(&fx, "loop");
        dlx_client *p = fx_connect(&fx, "producer");
        struct pollfd pfd = {.fd = dlx_fd(w), .events = POLLIN};
        struct dlx_event ev;
        int n = 0;

        ck_assert_int_ge(pfd.fd, 0);
        ck_assert_int_eq(dlx_watch(w, "", NULL), 0);
        ck_assert_int_eq(dlx_process_events(w), 0);
        publish_ok(p, "loop/x", fx_vec_f32(p, 2, 0), NULL, NULL);
        for (int i = 0; i < 100 && n == 0; i++) {
                ck_assert_int_ge(poll(&pfd, 1, 50), 0);
                n = dlx_process_events(w);
                ck_assert_int_ge(n, 0);
        }
        ck_assert_int_eq(n, 1);
        ck_assert_int_eq(dlx_next_event(w, &ev, 0), 0);
        ck_assert_str_eq(ev.name, "loop/x");
        dlx_close(p);
        dlx_close(w);
}
END_TEST

/* ---- mapping cache and threads ------------------------------------------------------------- */

static int count_dlx_maps(void)
{
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        int n = 0;

        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f))
                if (strstr(line, "memfd:dlx"))
                        n++;
        fclose(f);
        return n;
}

/*
 * A consumer cycling through more segments than it keeps idle forgets the
 * oldest in batches; what it forgot comes back with an fd, with the right
 * contents, and nothing stays mapped after close.
 */
START_TEST(idle_maps_forgotten_in_batches)
{
        enum { N = 48 };
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        struct dlx_publish_options copy = {.copy = DLX_COPY_ALWAYS};
        char name[32];
        int maps0 = count_dlx_maps(), fds0 = count_fds(0);

        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "forget/%d", i);
                publish_ok(p, name, fx_plain_f32(64, (float)(i * 100), NULL), &copy, NULL);
        }
        maps0 = count_dlx_maps();
        for (int round = 0; round < 3; round++) {
                struct dlx_stats st0, st1;
                ck_assert_int_eq(dlx_stats(p, &st0), 0);
                for (int i = 0; i < N; i++) {
                        DLManagedTensorVersioned *t;
                        snprintf(name, sizeof(name), "forget/%d", i);
                        t = acquire_ok(q, name, NULL);
                        ck_assert(fx_vec_is(t, 64, (float)(i * 100)));
                        t->deleter(t);
                }
                /* the Forget replies read: what is mapped is the idle cache, at most 32 */
                ck_assert_int_eq(dlx_ping(q), 0);
                ck_assert_int_le(count_dlx_maps(), maps0 + 32);
                ck_assert_int_ge(count_dlx_maps(), maps0 + 16);
                ck_assert_int_eq(count_fds(0), fds0);
                /* N acquires, the ping, this stats, and a Forget per 16 segments at most */
                ck_assert_int_eq(dlx_stats(p, &st1), 0);
                ck_assert_uint_le(st1.requests - st0.requests, N + 2 + N / 16 + 1);
        }
        dlx_close(q);
        ck_assert_int_eq(count_dlx_maps(), maps0);
        dlx_close(p);
}
END_TEST

/*
 * dlxd closes a destroyed big segment's descriptor (which frees its pages)
 * once the reply that destroyed it has gone: a replaced version's goes, and
 * every one of a session's big segments goes when it ends, more at once
 * than dlxd defers (64), with nothing more asked of it.
 */
START_TEST(big_segments_close_after_the_reply)
{
        enum { N = 80, FLOATS = 1 << 18 }; /* 1 MiB each: big enough to be deferred */
        int fds0 = count_fds(fx.pid), fds1;
        dlx_client *p = fx_connect(&fx, "producer");
        struct dlx_publish_options copy = {.copy = DLX_COPY_ALWAYS};
        char name[32];

        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "big/%d", i);
                publish_ok(p, name, fx_plain_f32(FLOATS, (float)i, NULL), &copy, NULL);
        }
        ck_assert_int_eq(dlx_ping(p), 0);
        fds1 = count_fds(fx.pid);
        ck_assert_int_ge(fds1, fds0 + N);
        for (int k = 0; k < 3; k++)
                publish_ok(p, "big/0", fx_plain_f32(FLOATS, -1.0f, NULL), &copy, NULL);
        ck_assert_int_eq(wait_daemon_fds(&fx, fds1, 5000), fds1);
        dlx_close(p);
        ck_assert_int_eq(wait_daemon_fds(&fx, fds0, 5000), fds0);
}
END_TEST

/* An empty small segment does not make every larger allocation ask for (and give back) its own. */
START_TEST(allocator_keeps_the_larger_empty_segment)
{
        enum { SMALL = 1024, LARGE = 256 * 1024, ROUNDS = 10 }; /* floats: 4 KiB, 1 MiB */
        dlx_client *p = fx_connect(&fx, "allocator");
        DLManagedTensorVersioned *t;
        struct dlx_stats st0, st1;

        t = fx_vec_f32(p, SMALL, 0);
        t->deleter(t);
        t = fx_vec_f32(p, LARGE, 1);
        t->deleter(t);
        ck_assert_int_eq(dlx_stats(p, &st0), 0);
        for (int i = 0; i < ROUNDS; i++) {
                t = fx_vec_f32(p, LARGE, (float)i);
                t->deleter(t);
        }
        ck_assert_int_eq(dlx_stats(p, &st1), 0);
        /* no Alloc or Free in between: only the second stats itself */
        ck_assert_uint_le(st1.requests - st0.requests, 1);
        /* one empty segment is kept, the larger: the small one went back */
        ck_assert_uint_eq(st1.segments, 1);
        ck_assert_uint_ge(st1.uid_bytes, (uint64_t)LARGE * sizeof(float));
        dlx_close(p);
}
END_TEST

/* A tensor of n floats in shared memory with only its first and last elements set. */
static DLManagedTensorVersioned *make_sparse(dlx_client *c, int64_t n, float first, float last)
{
        DLManagedTensorVersioned *t = fx_alloc_f32(c, n);

        ((float *)t->dl_tensor.data)[0] = first;
        ((float *)t->dl_tensor.data)[n - 1] = last;
        return t;
}

/*
 * A producer that allocates a fresh tensor per version (each larger than the
 * allocator's segments, so each in a segment of its own), publishes it and moves
 * on reuses the segments of versions already released instead of asking for new
 * ones, though it reads no reply between its allocations: the versions after
 * the warm-up live in two segments (ids only grow: a fresh one is a new id),
 * and the daemon hears no Alloc, Free or Forget.
 */
START_TEST(fresh_allocations_reuse_released_segments)
{
        enum { ROUNDS = 20 };
        const int64_t n = (80 << 20) / sizeof(float); /* 80 MiB: over the 64 MiB arena segments */
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        struct dlx_publish_options zero = {.copy = DLX_COPY_NEVER};
        struct dlx_acquire_options want = {.timeout_ms = 5000};
        struct dlx_stats st0, st1;
        uint64_t v = 0, ids[ROUNDS];
        size_t nids = 0;

        /* the consumer reads version i while the producer publishes i + 1 */
        DLManagedTensorVersioned *held = NULL;
        for (int i = 0; i < ROUNDS + 4; i++) {
                if (i == 4) /* warmed up: the segments the cycle needs exist */
                        ck_assert_int_eq(dlx_stats(p, &st0), 0);
                publish_ok(p, "fresh/x", make_sparse(p, n, (float)i, (float)-i), &zero, &v);
                if (held)
                        held->deleter(held);
                ck_assert_int_eq(dlx_ping(q), 0); /* the release reaches the daemon */
                /*
                 * ... and the producer: its RELEASED event is in flight, read by
                 * its own thread, and the next allocation may come first (it did
                 * under valgrind). Waiting sends nothing.
                 */
                if (i > 0)
                        ck_assert_int_eq(dlx_wait_released(p, "fresh/x", v - 1, NULL, 10000), 0);
                want.min_version = v;
                held = acquire_ok(q, "fresh/x", &want);
                ck_assert(((float *)held->dl_tensor.data)[0] == (float)i);
                ck_assert(((float *)held->dl_tensor.data)[n - 1] == (float)-i);
                if (i >= 4) {
                        struct dlx_info info;
                        size_t k = 0;
                        ck_assert_int_eq(dlx_stat(p, "fresh/x", &info), 0);
                        while (k < nids && ids[k] != info.segment)
                                k++;
                        if (k == nids)
                                ids[nids++] = info.segment;
                }
        }
        held->deleter(held);
        ck_assert_int_eq(dlx_stats(p, &st1), 0);
        ck_assert_msg(nids <= 2, "%zu segments for %d versions: not reused", nids, ROUNDS);
        /*
         * Per round a publish, an acquire, a ping and a stat; and perhaps a
         * release of lease 0 that wakes a daemon asleep on the consumer's
         * release ring (a request, counted, unanswered). No Alloc, Free or
         * Forget.
         */
        ck_assert_uint_eq(st1.publishes - st0.publishes, ROUNDS);
        ck_assert_uint_eq(st1.acquires - st0.acquires, ROUNDS);
        ck_assert_uint_le(st1.requests - st0.requests, 5 * ROUNDS + 1);
        ck_assert_uint_le(st1.segments, 2);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

START_TEST(mapping_cache)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t[100];
        int maps0, fds0;

        publish_ok(p, "m/a", fx_vec_f32(p, 256, 0), NULL, NULL);
        publish_ok(p, "m/b", fx_vec_f32(p, 256, 1), NULL, NULL);
        maps0 = count_dlx_maps();
        t[0] = acquire_ok(q, "m/a", NULL);
        /* one new mapping (read-only) for the segment */
        ck_assert_int_eq(count_dlx_maps(), maps0 + 1);
        fds0 = count_fds(0);
        for (int i = 1; i < 100; i++)
                t[i] = acquire_ok(q, i % 2 ? "m/b" : "m/a", NULL);
        /* both names live in one segment: no new mapping, no fd kept */
        ck_assert_int_eq(count_dlx_maps(), maps0 + 1);
        ck_assert_int_eq(count_fds(0), fds0);
        for (int i = 0; i < 100; i++) {
                ck_assert(fx_vec_is(t[i], 256, i % 2 ? 1.0f : 0.0f));
                t[i]->deleter(t[i]);
        }
        /* released but cached: acquiring again maps nothing */
        t[0] = acquire_ok(q, "m/a", NULL);
        ck_assert_int_eq(count_dlx_maps(), maps0 + 1);
        t[0]->deleter(t[0]);
        dlx_close(q);
        ck_assert_int_eq(count_dlx_maps(), maps0);
        dlx_close(p);
}
END_TEST

static void *acquire_loop(void *arg)
{
        dlx_client *c = arg;

        for (int i = 0; i < 500; i++) {
                DLManagedTensorVersioned *t = NULL;
                if (dlx_acquire(c, "t/x", NULL, &t) != 0 || !fx_vec_is(t, 64, 9.0f))
                        return (void *)1;
                t->deleter(t);
        }
        return NULL;
}

START_TEST(threads_share_a_client)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        pthread_t th[4];

        publish_ok(p, "t/x", fx_vec_f32(p, 64, 9.0f), NULL, NULL);
        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(pthread_create(&th[i], NULL, acquire_loop, q), 0);
        for (int i = 0; i < 4; i++) {
                void *r;
                pthread_join(th[i], &r);
                ck_assert_ptr_null(r);
        }
        ck_assert_int_eq(fx_wait_leases(p, 0, 2000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

START_TEST(tensor_outlives_close)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t;

        publish_ok(p, "o/x", fx_vec_f32(p, 16, 2.0f),
                   &(struct dlx_publish_options){.persist = true}, NULL);
        t = acquire_ok(q, "o/x", NULL);
        dlx_close(q);
        ck_assert(fx_vec_is(t, 16, 2.0f));
        t->deleter(t);
        dlx_close(p);
}
END_TEST

struct list_acc {
        int n;
        char last[DLX_NAME_MAX + 1];
        bool sorted;
};

static int list_collect(void *ctx, const struct dlx_info *in)
{
        struct list_acc *a = ctx;

        if (strcmp(in->name, a->last) <= 0)
                a->sorted = false;
        snprintf(a->last, sizeof(a->last), "%s", in->name);
        a->n++;
        return 0;
}

START_TEST(stats_and_list)
{
        dlx_client *c = fx_connect(&fx, "stats");
        struct dlx_stats s;
        char names[8][16];

        for (int i = 0; i < 8; i++) {
                snprintf(names[i], sizeof(names[i]), "l/%d", 7 - i);
                publish_ok(c, names[i], fx_vec_f32(c, 4, 0), NULL, NULL);
        }
        publish_ok(c, "z/other", fx_vec_f32(c, 4, 0), NULL, NULL);
        ck_assert_int_eq(dlx_stats(c, &s), 0);
        ck_assert_uint_eq(s.names, 9);
        ck_assert_uint_eq(s.versions, 9);
        ck_assert_uint_eq(s.leases, 0);
        ck_assert_uint_ge(s.clients, 1);
        ck_assert_uint_eq(s.publishes, 9);

        struct list_acc acc = {0, "", true};
        int visited = dlx_list(c, "l/", list_collect, &acc);
        ck_assert_int_eq(visited, 8);
        ck_assert_int_eq(acc.n, 8);
        ck_assert(acc.sorted);
        ck_assert_str_eq(acc.last, "l/7");
        dlx_close(c);
}
END_TEST

START_TEST(many_names_page_through_list)
{
        dlx_client *c = fx_connect(&fx, "many");
        struct list_acc acc = {0, "", true};
        char name[32];

        /* more than one list page (256 by default) */
        for (int i = 0; i < 600; i++) {
                snprintf(name, sizeof(name), "many/%04d", i);
                publish_ok(c, name, fx_vec_f32(c, 1, 0), NULL, NULL);
        }
        int n = dlx_list(c, "many/", list_collect, &acc);
        ck_assert_int_eq(n, 600);
        ck_assert_int_eq(acc.n, 600);
        ck_assert(acc.sorted);
        dlx_close(c);
}
END_TEST

/* ---- limits and the daemon's own life -------------------------------------------------------- */

START_TEST(max_bytes_limit)
{
        const char *args[] = {"--max-bytes", "1M", NULL};
        DLManagedTensorVersioned *t = NULL;
        int64_t shape[1] = {512 * 1024};
        DLTensor proto = {
                .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = shape};
        dlx_client *c;
        struct dlx_stats s;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "big");
        ck_assert_int_eq(dlx_alloc(c, &proto, &t), -ENOSPC);
        expect_last_error("limit");
        ck_assert_int_eq(dlx_stats(c, &s), 0);
        ck_assert_uint_eq(s.max_bytes, 1 << 20);
        /* small ones still fit */
        publish_ok(c, "b/small", fx_vec_f32(c, 16, 0), NULL, NULL);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(max_clients_limit)
{
        const char *args[] = {"--max-clients", "2", NULL};
        struct dlx_connect_options o;
        dlx_client *a, *b, *c = NULL;

        dlxd_start(&fx, args);
        o = (struct dlx_connect_options){.socket_path = fx.socket};
        a = fx_connect(&fx, "a");
        b = fx_connect(&fx, "b");
        ck_assert_int_eq(dlx_connect(&o, &c), -EAGAIN);
        ck_assert_ptr_null(c);
        expect_last_error("too many clients");
        dlx_close(b);
        /* a slot frees up once the daemon has seen b go */
        for (int i = 0; i < 200 && dlx_connect(&o, &c) != 0; i++)
                fx_sleep_ms(5);
        ck_assert_ptr_nonnull(c);
        dlx_close(c);
        dlx_close(a);
        dlxd_stop(&fx);
}
END_TEST

static int run_dlxd(const char *socket, int *ret_status)
{
        const char *dlxd = getenv("DLXD");
        int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
        pid_t pid = fork();
        int status;

        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                dup2(devnull, 2);
                execl(dlxd, "dlxd", "--socket", socket, (char *)NULL);
                _exit(127);
        }
        close(devnull);
        /* a refused start exits at once; a started one is stopped after a moment */
        for (int i = 0; i < 100; i++) {
                if (waitpid(pid, &status, WNOHANG) == pid) {
                        *ret_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
                        return 0;
                }
                fx_sleep_ms(10);
        }
        kill(pid, SIGINT);
        waitpid(pid, &status, 0);
        *ret_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        return 1; /* it ran */
}

START_TEST(socket_live_and_stale)
{
        int status;
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        int fd;

        /* a live daemon on the path: refuse */
        ck_assert_int_eq(run_dlxd(fx.socket, &status), 0);
        ck_assert_int_eq(status, 1);
        dlxd_stop(&fx);

        /* a stale socket file (nobody listening): replaced; SIGINT stops it with 0 */
        char dir[] = "/tmp/dlx-stale-XXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(dir));
        ck_assert_int_eq(chmod(dir, 0700), 0);
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/s.sock", dir);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
        close(fd);
        ck_assert_int_eq(run_dlxd(addr.sun_path, &status), 1);
        ck_assert_int_eq(status, 0);
        ck_assert_int_ne(access(addr.sun_path, F_OK), 0);

        /* a path that is not a socket: never touched */
        fd = open(addr.sun_path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        close(fd);
        ck_assert_int_eq(run_dlxd(addr.sun_path, &status), 0);
        ck_assert_int_eq(status, 1);
        ck_assert_int_eq(access(addr.sun_path, F_OK), 0);
        unlink(addr.sun_path);

        /* a directory others may write to: refused */
        ck_assert_int_eq(chmod(dir, 0777), 0);
        ck_assert_int_eq(run_dlxd(addr.sun_path, &status), 0);
        ck_assert_int_eq(status, 1);
        rmdir(dir);
}
END_TEST

START_TEST(default_socket_from_environment)
{
        dlx_client *c = NULL;

        setenv("DLX_SOCKET", fx.socket, 1);
        ck_assert_int_eq(dlx_connect(NULL, &c), 0);
        ck_assert_int_eq(dlx_ping(c), 0);
        ck_assert_ptr_nonnull(strstr(dlx_server_version(c), "dlxd"));
        dlx_close(c);
        setenv("DLX_SOCKET", "/nonexistent/dlx.sock", 1);
        ck_assert_int_eq(dlx_connect(NULL, &c), -ENOENT);
        expect_last_error("/nonexistent/dlx.sock");
        unsetenv("DLX_SOCKET");
}
END_TEST

/* Requires dlx_connect(path) to fail with err, saying so in the system's words and naming path. */
static void connect_fails(const char *path, int err)
{
        struct dlx_connect_options o = {.socket_path = path};
        dlx_client *c = NULL;
        int got = dlx_connect(&o, &c);

        ck_assert_msg(got == err, "connect to %s: %s (%s), expected %s", path, dlx_strerror(got),
                      dlx_last_error(), dlx_strerror(err));
        ck_assert_ptr_null(c);
        if (err != -ENAMETOOLONG)
                ck_assert_msg(strstr(dlx_last_error(), path) &&
                                      strstr(dlx_last_error(), strerror(-err)),
                              "connect to %s: the message does not say '%s' about the path: %s",
                              path, strerror(-err), dlx_last_error());
}

/* Each way of not reaching a daemon keeps its own errno, and the message matches it. */
START_TEST(connect_errors)
{
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        char dir[] = "/tmp/dlx-connect-XXXXXX", path[64], file[64];
        char longer[sizeof(addr.sun_path) + 16];
        int fd;

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/none.sock", dir);
        connect_fails(path, -ENOENT);
        expect_last_error("is dlxd running");

        /* a path through a regular file */
        snprintf(file, sizeof(file), "%s/file", dir);
        fd = open(file, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        ck_assert_int_ge(fd, 0);
        close(fd);
        snprintf(path, sizeof(path), "%s/file/dlxd.sock", dir);
        connect_fails(path, -ENOTDIR);

        /* a socket file nobody listens on: what a daemon killed with SIGKILL leaves behind */
        snprintf(path, sizeof(path), "%s/stale.sock", dir);
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
        close(fd);
        connect_fails(path, -ECONNREFUSED);
        expect_last_error("no daemon listens");

        /* one byte more than a socket address holds */
        memset(longer, 'x', sizeof(longer));
        longer[0] = '/';
        longer[sizeof(addr.sun_path)] = '\0';
        connect_fails(longer, -ENAMETOOLONG);
        ck_assert_msg(strstr(dlx_last_error(), "too long") && strstr(dlx_last_error(), "107"), "%s",
                      dlx_last_error());

        unlink(path);
        unlink(file);
        ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(bad_arguments)
{
        dlx_client *c = fx_connect(&fx, "args");
        DLManagedTensorVersioned *t = NULL;
        int *count = shared_counter();
        struct dlx_info info;

        ck_assert_int_eq(dlx_acquire(c, "", NULL, &t), -EINVAL);
        ck_assert_int_eq(dlx_acquire(c, "a//b", NULL, &t), -EINVAL);
        ck_assert_int_eq(dlx_acquire(c, "a/../b", NULL, &t), -EINVAL);
        ck_assert_int_eq(dlx_acquire(NULL, "a", NULL, &t), -EINVAL);
        ck_assert_int_eq(dlx_stat(c, "bad\x01name", &info), -EINVAL);
        ck_assert_int_eq(dlx_unpublish(c, "/lead"), -EINVAL);
        ck_assert_int_eq(dlx_watch(c, "\xff", NULL), -EINVAL);
        /* a bad name still consumes the tensor */
        ck_assert_int_eq(
                dlx_publish(c, "trail/", fx_counted(fx_vec_f32(c, 2, 0), count), NULL, NULL),
                -EINVAL);
        ck_assert_int_eq(*count, 1);
        ck_assert_int_eq(dlx_publish(c, "x", NULL, NULL, NULL), -EINVAL);
        ck_assert_str_ne(dlx_strerror(-ENOENT), "");
        ck_assert_str_eq(dlx_strerror(-EXDEV), "the memory is not shareable without a copy");
        dlx_close(c);
        dlx_close(NULL);
        munmap(count, 4096);
}
END_TEST

/* dlx_tensor_info() needs no daemon: a forked child of the acquirer asks it. */
static int child_reads_info(void *arg)
{
        const char *name = NULL;
        uint64_t version = 0;

        if (dlx_tensor_info(arg, &name, &version, NULL) != 0)
                return 2;
        return strcmp(name, "contract/x") == 0 && version == 1 ? 0 : 3;
}

/* What dlx.h promises of dlx_tensor_info(), dlx_stats() and dlx_watch(), edges included. */
START_TEST(info_stats_watch_contracts)
{
        const int64_t shape[1] = {4};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}};
        dlx_client *p = fx_connect(&fx, "producer"), *c = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t, *a = NULL;
        const char *name = NULL, *storage = NULL;
        char prefix[DLX_NAME_MAX + 2];
        struct dlx_stats st;
        uint64_t version = 0, w = 0;

        publish_ok(p, "contract/x", fx_plain_f32(4, 1.0f, NULL), NULL, NULL);
        t = acquire_ok(c, "contract/x", NULL);
        ck_assert_int_eq(dlx_tensor_info(t, NULL, NULL, NULL), 0);
        ck_assert_int_eq(dlx_tensor_info(t, &name, &version, &storage), 0);
        ck_assert_str_eq(name, "contract/x");
        ck_assert_uint_eq(version, 1);
        ck_assert_str_eq(storage, "memfd");
        /* an allocation is not an acquired tensor */
        proto.shape = (int64_t *)shape;
        ck_assert_int_eq(dlx_alloc(p, &proto, &a), 0);
        ck_assert_int_eq(dlx_tensor_info(a, &name, NULL, NULL), -EINVAL);
        a->deleter(a);

        ck_assert_int_eq(dlx_stats(c, NULL), -EINVAL);
        ck_assert_int_eq(dlx_stats(NULL, &st), -EINVAL);
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_ge(st.leases, 1);

        ck_assert_int_eq(dlx_watch(NULL, "", &w), -EINVAL);
        ck_assert_int_eq(dlx_watch(c, NULL, NULL), 0);
        memset(prefix, 'a', sizeof(prefix) - 1);
        prefix[sizeof(prefix) - 1] = '\0';
        ck_assert_int_eq(dlx_watch(c, prefix, &w), -EINVAL);
        ck_assert_ptr_nonnull(strstr(dlx_last_error(), "prefix"));
        prefix[DLX_NAME_MAX] = '\0'; /* exactly DLX_NAME_MAX bytes: a name may be that long */
        ck_assert_int_eq(dlx_watch(c, prefix, &w), 0);

        /* after close, and in a forked child, the tensor still says what it is */
        dlx_close(c);
        name = NULL;
        ck_assert_int_eq(dlx_tensor_info(t, &name, NULL, NULL), 0);
        ck_assert_str_eq(name, "contract/x");
        ck_assert_int_eq(fx_wait(fx_spawn(child_reads_info, t)), 0);
        t->deleter(t);
        dlx_close(p);
}
END_TEST

/* A release posted after the daemon stopped watching the release ring still arrives promptly. */
START_TEST(release_after_idle_reaches_producer)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        int *count = shared_counter();
        DLManagedTensorVersioned *t;
        int64_t start;

        publish_ok(p, "idle/x", fx_counted(fx_vec_f32(p, 8, 1.0f), count), NULL, NULL);
        t = acquire_ok(q, "idle/x", NULL);
        ck_assert_int_eq(dlx_unpublish(p, "idle/x"), 0);
        /*
         * Until the daemon has put the consumer's ring to sleep (the consumer
         * says nothing meanwhile): a nap of 100 ms was not always long enough.
         * Once asleep, the daemon looks at the ring again only if the release
         * wakes it, so the release arriving at all is the test; how soon is
         * the machine's business.
         */
        for (int i = 0; i < 2000 && !__atomic_load_n(&q->ring->asleep, __ATOMIC_SEQ_CST); i++)
                fx_sleep_ms(5);
        ck_assert_msg(q->ring->asleep, "the daemon never put a quiet consumer's ring to sleep");
        start = fx_now_ms();
        t->deleter(t);
        while (*count == 0 && fx_now_ms() - start < 10000) {
                fx_sleep_ms(2);
                ck_assert_int_ge(dlx_process_events(p), 0);
        }
        ck_assert_int_eq(*count, 1);
        /* and one released while it is awake, with the consumer then going quiet */
        publish_ok(p, "idle/y", fx_counted(fx_vec_f32(p, 8, 2.0f), count), NULL, NULL);
        t = acquire_ok(q, "idle/y", NULL);
        ck_assert_int_eq(dlx_unpublish(p, "idle/y"), 0);
        t->deleter(t);
        start = fx_now_ms();
        while (*count == 1 && fx_now_ms() - start < 10000) {
                fx_sleep_ms(2);
                ck_assert_int_ge(dlx_process_events(p), 0);
        }
        ck_assert_int_eq(*count, 2);
        dlx_close(q);
        dlx_close(p);
        munmap(count, 4096);
}
END_TEST

/* Per-session bounds on what pins daemon memory and descriptors. */
START_TEST(session_bounds)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        static DLManagedTensorVersioned *held[DLX_MAX_LEASES_PER_SESSION];
        DLManagedTensorVersioned *t = NULL;

        /* descriptors are bounded per uid (test-limits); leases per session */
        publish_ok(p, "fdv/zero-copy", fx_vec_f32(p, 1, 0), NULL, NULL);
        for (int i = 0; i < DLX_MAX_LEASES_PER_SESSION; i++)
                held[i] = acquire_ok(q, "fdv/zero-copy", NULL);
        ck_assert_int_eq(dlx_acquire(q, "fdv/zero-copy", NULL, &t), -EAGAIN);
        ck_assert_ptr_null(t);
        held[0]->deleter(held[0]);
        ck_assert_int_eq(fx_wait_leases(q, DLX_MAX_LEASES_PER_SESSION - 1, 5000),
                         DLX_MAX_LEASES_PER_SESSION - 1);
        held[0] = acquire_ok(q, "fdv/zero-copy", NULL);
        for (int i = 0; i < DLX_MAX_LEASES_PER_SESSION; i++)
                held[i]->deleter(held[i]);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- mappings: placement, permissions, failures ------------------------------------------ */

/* The /proc/self/maps line of the mapping holding addr. */
struct mapping {
        uintptr_t start, end;
        char perms[5];
        unsigned long inode;
};

static bool mapping_of(const void *addr, struct mapping *ret)
{
        FILE *f = fopen("/proc/self/maps", "re");
        char line[512];
        bool found = false;

        ck_assert_ptr_nonnull(f);
        while (!found && fgets(line, sizeof(line), f)) {
                struct mapping m;

                if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %*s %*s %lu", &m.start, &m.end,
                           m.perms, &m.inode) != 4)
                        continue;
                if ((uintptr_t)addr >= m.start && (uintptr_t)addr < m.end) {
                        *ret = m;
                        found = true;
                }
        }
        fclose(f);
        return found;
}

static long vm_size_bytes(void)
{
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        long kb = -1;

        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmSize: %ld kB", &kb) == 1)
                        break;
        fclose(f);
        return kb * 1024;
}

/*
 * An acquire whose mmap() fails (here: a transient shortage of address space)
 * fails with -ENOMEM and leaves nothing behind: the daemon is told, and the
 * same acquire works once the shortage is over.
 */
START_TEST(acquire_works_again_after_failed_mmap)
{
        const int64_t n = (64 << 20) / 4; /* 64 MiB */
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t = NULL;
        struct rlimit old, low;
        int err;

        publish_ok(p, "poison/big", fx_plain_f32(n, 1.0f, NULL), NULL, NULL);

        /* a transient shortage of address space: this mmap cannot succeed */
        ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
        low = old;
        low.rlim_cur = (rlim_t)vm_size_bytes() + (16 << 20);
        ck_assert_int_eq(setrlimit(RLIMIT_AS, &low), 0);
        err = dlx_acquire(q, "poison/big", NULL, &t);
        ck_assert_int_eq(setrlimit(RLIMIT_AS, &old), 0);
        ck_assert_msg(err == -ENOMEM, "acquire under RLIMIT_AS: %s (%s)", dlx_strerror(err),
                      dlx_last_error());

        /* the shortage is over: acquiring again must work */
        t = NULL;
        err = dlx_acquire(q, "poison/big", NULL, &t);
        ck_assert_msg(err == 0, "acquire after the shortage: %d %s (%s)", err, dlx_strerror(err),
                      dlx_last_error());
        ck_assert(((float *)t->dl_tensor.data)[7] == 8.0f);
        t->deleter(t);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/*
 * dlx_alloc() memory is published zero-copy wherever it lies in the
 * allocator's segments, at offset 0 of one too, even when mmap placed a newer
 * segment so that it ends exactly where the older one begins.
 */
START_TEST(zero_copy_at_start_of_any_segment)
{
        enum { MAXSEG = 8 };
        dlx_client *c = fx_connect(&fx, "producer");
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        DLManagedTensorVersioned *t[MAXSEG];
        uintptr_t start[MAXSEG], end[MAXSEG];
        struct mapping m;
        int n = 0, victim = -1, err;

        /*
         * The allocator's segments are 256 KiB, 512 KiB, 1 MiB...: one tensor
         * filling each sits at offset 0 of its own segment. Stop as soon as a
         * newer segment ends exactly where an older one begins.
         */
        while (n < MAXSEG && victim < 0) {
                t[n] = fx_alloc_f32(c, ((int64_t)256 << 10 << n) / 4);
                ck_assert(mapping_of(t[n]->dl_tensor.data, &m));
                start[n] = m.start;
                end[n] = m.end;
                ck_assert_msg(start[n] == (uintptr_t)t[n]->dl_tensor.data,
                              "tensor %d is not at the start of its segment", n);
                for (int i = 0; i < n; i++)
                        if (end[n] == start[i])
                                victim = i;
                n++;
        }
        if (victim < 0 && getenv("DLX_TEST_VALGRIND")) {
                /* valgrind places mappings its own way: nothing to test here */
                for (int i = 0; i < n; i++)
                        t[i]->deleter(t[i]);
                dlx_close(c);
                return;
        }
        ck_assert_msg(victim >= 0, "precondition: no two allocator segments are adjacent here");

        /* t[victim] lies wholly inside dlx_alloc() memory of this client: no copy needed */
        err = dlx_publish(c, "adj/victim", t[victim], &never, NULL);
        t[victim] = NULL;
        ck_assert_msg(err == 0, "publish of dlx_alloc() memory with DLX_COPY_NEVER: %s (%s)",
                      dlx_strerror(err), dlx_last_error());
        for (int i = 0; i < n; i++)
                if (t[i])
                        t[i]->deleter(t[i]);
        dlx_close(c);
}
END_TEST

/*
 * A read-only tensor is handed out in a read-only mapping, even when the
 * consumer already maps its segment writable for a writable tensor of the
 * same dlx_alloc() segment acquired first.
 */
START_TEST(read_only_tensor_never_mapped_writable)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *w, *r;
        struct mapping m;

        publish_ok(p, "mix/w", fx_alloc_f32(p, 1024),
                   &(struct dlx_publish_options){.writable = true}, NULL);
        publish_ok(p, "mix/r", fx_alloc_f32(p, 1024), NULL, NULL);

        w = acquire_ok(q, "mix/w", NULL);
        r = acquire_ok(q, "mix/r", NULL);
        ck_assert(!(w->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
        ck_assert(r->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert(mapping_of(r->dl_tensor.data, &m));
        ck_assert_msg(m.perms[1] != 'w',
                      "the read-only tensor 'mix/r' is mapped %s in the consumer: writes go "
                      "straight into the producer's memory",
                      m.perms);
        r->deleter(r);
        w->deleter(w);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- the mapping cache and what the daemon thinks this session holds ------------------------ */

static bool inode_mapped(unsigned long ino)
{
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        bool found = false;

        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f)) {
                unsigned long i;
                if (sscanf(line, "%*s %*s %*s %*s %lu", &i) == 1 && i == ino)
                        found = true;
        }
        fclose(f);
        return found;
}

struct crossing {
        dlx_client *c;
        DLManagedTensorVersioned *t;
        int err;
};

static void *acquire_s(void *arg)
{
        struct crossing *x = arg;

        x->err = dlx_acquire(x->c, "x/s", NULL, &x->t);
        return NULL;
}

/*
 * Thread A acquires a tensor in an idle cached segment S while thread B's
 * release evicts S from the cache (a Forget goes out): whatever order the
 * daemon handles them in, client and daemon agree on whether this session
 * holds S, so when S dies this process unmaps it.
 */
START_TEST(forgotten_segment_unmapped_after_crossing_reply)
{
        dlx_client *p = fx_connect(&fx, "producer");
        char name[32];
        int stale = 0;

        for (int i = 0; i < 32; i++) {
                snprintf(name, sizeof(name), "x/d%d", i);
                publish_ok(p, name, fx_plain_f32(16, (float)i, NULL), NULL, NULL);
        }
        for (int trial = 0; trial < 100; trial++) {
                dlx_client *q = fx_connect(&fx, "consumer");
                DLManagedTensorVersioned *t, *hold;
                struct crossing x = {.c = q};
                struct mapping m;
                unsigned long ino;
                uint64_t id0;
                pthread_t th;

                publish_ok(p, "x/s", fx_plain_f32(16, 100.0f, NULL), NULL, NULL);
                /* S first in the idle cache, then 31 others: 32 idle, one held */
                t = acquire_ok(q, "x/s", NULL);
                ck_assert(mapping_of(t->dl_tensor.data, &m));
                ino = m.inode;
                ck_assert_uint_ne(ino, 0);
                t->deleter(t);
                for (int i = 0; i < 31; i++) {
                        snprintf(name, sizeof(name), "x/d%d", i);
                        t = acquire_ok(q, name, NULL);
                        t->deleter(t);
                }
                hold = acquire_ok(q, "x/d31", NULL);

                /* A asks for S; as soon as its request is out, B releases (S evicted) */
                pthread_mutex_lock(&q->lock);
                id0 = q->next_id;
                pthread_mutex_unlock(&q->lock);
                ck_assert_int_eq(pthread_create(&th, NULL, acquire_s, &x), 0);
                while (__atomic_load_n(&q->next_id, __ATOMIC_ACQUIRE) == id0)
                        ;
                hold->deleter(hold);
                pthread_join(th, NULL);
                ck_assert_msg(x.err == 0, "acquire x/s: %s", dlx_strerror(x.err));
                x.t->deleter(x.t);
                ck_assert_int_eq(dlx_ping(q), 0);

                /* S dies: the consumer must not keep it mapped */
                publish_ok(p, "x/s", fx_plain_f32(16, 200.0f, NULL), NULL, NULL);
                ck_assert_int_eq(dlx_ping(q), 0);
                ck_assert_int_eq(dlx_ping(q), 0);
                if (inode_mapped(ino))
                        stale++;
                dlx_close(q);
                if (stale)
                        break;
        }
        ck_assert_msg(stale == 0,
                      "a destroyed segment is still mapped by a client that holds no tensor in it");
        dlx_close(p);
}
END_TEST

/* ---- the pollable fd and dlx_wait_released() ----------------------------------------------- */

/*
 * dlx_fd() polls readable while an event is queued, even one that another
 * call (here a ping) read off the socket: an event loop that waits for it
 * never misses the event.
 */
START_TEST(pollable_fd_readable_while_event_queued)
{
        dlx_client *w = fx_connect(&fx, "loop");
        dlx_client *p = fx_connect(&fx, "producer");
        struct pollfd pfd = {.fd = dlx_fd(w), .events = POLLIN};
        struct dlx_event ev;

        ck_assert_int_eq(dlx_watch(w, "q/", NULL), 0);
        publish_ok(p, "q/x", fx_alloc_f32(p, 4), NULL, NULL);
        /* the daemon has sent the event: the fd is readable */
        ck_assert_int_eq(poll(&pfd, 1, 5000), 1);
        /* the loop's own work makes one call before getting back to poll() */
        ck_assert_int_eq(dlx_ping(w), 0);
        /* an event is waiting... */
        int readable = poll(&pfd, 1, 200);
        int got = dlx_next_event(w, &ev, 0);
        ck_assert_int_eq(got, 0);
        /* ...so the descriptor must say so, or the event loop never comes back for it */
        ck_assert_msg(readable == 1, "an event is queued but dlx_fd() does not poll readable");
        dlx_close(p);
        dlx_close(w);
}
END_TEST

/*
 * dlx_wait_released() with timeout 0 asks without waiting: a RELEASED notice
 * already sent is seen, without any other call reading the socket first.
 */
START_TEST(wait_released_poll_sees_release)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *t;
        uint64_t v1 = 0;
        int err = -1;

        ck_assert_int_eq(dlx_publish(p, "db/x", fx_alloc_f32(p, 64), NULL, &v1), 0);
        t = acquire_ok(q, "db/x", NULL);
        publish_ok(p, "db/x", fx_alloc_f32(p, 64), NULL, NULL); /* v2: v1 lives on for its reader */
        t->deleter(t);                    /* last lease of v1: RELEASED goes out */
        ck_assert_int_eq(dlx_ping(q), 0); /* the daemon has handled the release */

        for (int i = 0; i < 100 && err != 0; i++) {
                err = dlx_wait_released(p, "db/x", v1, NULL, 0);
                if (err != 0)
                        fx_sleep_ms(10);
        }
        ck_assert_msg(err == 0,
                      "v1 was released a second ago, dlx_wait_released(timeout 0) still says %s",
                      dlx_strerror(err));
        /* with a timeout the same call sees it at once */
        ck_assert_int_eq(dlx_wait_released(p, "db/x", v1, NULL, 1000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/*
 * dlx_alloc() refuses a size whose byte count wraps 64 bits: 2^61 float64
 * elements are 2^64 bytes, which must not become a 0-byte allocation.
 */
START_TEST(alloc_refuses_size_that_wraps)
{
        dlx_client *c = fx_connect(&fx, "alloc");
        int64_t shape[1] = {INT64_C(1) << 61};
        DLTensor proto = {
                .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 64, 1}, .shape = shape};
        DLManagedTensorVersioned *t = NULL;
        int err = dlx_alloc(c, &proto, &t);

        if (err == 0)
                t->deleter(t);
        ck_assert_msg(err < 0, "dlx_alloc of 2^61 float64 (2^64 bytes) succeeded");
        dlx_close(c);
}
END_TEST

/* ---- release events ----------------------------------------------------------------------- */

static void handle_fill(uint8_t h[DLX_CUDA_HANDLE], uint32_t seed)
{
        for (int i = 0; i < DLX_CUDA_HANDLE; i++)
                h[i] = (uint8_t)(seed >> (8 * (i % 4)));
        h[0] ^= 0x5a;
}

/* Acquires name and releases it with a release event made from seed. */
static void acquire_release_with_event(int sock, uint64_t id, const char *name, uint32_t seed)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_ACQUIRE};
        struct wire_reply rep;

        snprintf(req.acquire.name, sizeof(req.acquire.name), "%s", name);
        rp_send(sock, &req, -1);
        rp_expect_ok(sock, id, WIRE_REP_ACQUIRE, &rep, NULL);
        req = (struct wire_request){.id = id + 1, .type = WIRE_REQ_RELEASE};
        req.release.lease = rep.acquire.lease;
        req.release.has_event = true;
        handle_fill(req.release.event, seed);
        rp_send(sock, &req, -1);
}

/*
 * Every consumer's release event reaches the producer: one consumer that
 * acquires and releases with a fresh event more often than a version keeps
 * events (DLX_MAX_RELEASE_EVENTS) cannot crowd out another consumer's, whose
 * GPU work the producer must wait for before reusing its memory. Checked with
 * a cuda-ipc tensor, which the daemon handles without a GPU.
 */
START_TEST(release_events_of_every_consumer_kept)
{
        int prod = rp_connect(fx.socket, "producer"), hog = rp_connect(fx.socket, "hog"),
            good = rp_connect(fx.socket, "good");
        uint8_t mine[DLX_CUDA_HANDLE];
        struct wire_request req;
        struct wire_reply rep;
        bool found = false;
        uint32_t nevents = 0;

        rp_publish_req(&req, 2, "pubsub/gpu", 4096, 0, 0);
        req.publish.tensor.storage = WIRE_STORAGE_CUDA_IPC;
        req.publish.tensor.device_type = kDLCUDA;
        req.publish.tensor.has_ipc_handle = true;
        handle_fill(req.publish.tensor.ipc_handle, 0xabcdef);
        req.publish.segment_size = 4096;
        req.publish.token = 99;
        rp_send(prod, &req, -1);
        rp_expect_ok(prod, 2, WIRE_REP_PUBLISH, NULL, NULL);

        for (uint32_t i = 0; i < DLX_MAX_RELEASE_EVENTS + 8; i++)
                acquire_release_with_event(hog, 10 + 2 * (uint64_t)i, "pubsub/gpu", i + 1);
        rp_ping(hog, 5);
        acquire_release_with_event(good, 10, "pubsub/gpu", 0xfeedface);
        rp_ping(good, 20);
        handle_fill(mine, 0xfeedface);

        req = (struct wire_request){.id = 3, .type = WIRE_REQ_UNPUBLISH};
        snprintf(req.unpublish.name, sizeof(req.unpublish.name), "pubsub/gpu");
        rp_send(prod, &req, -1);
        for (;;) {
                int r = rp_read_keep(prod, &rep, 5000, NULL);
                ck_assert_msg(r == 1, "no RELEASED for the producer (%s)",
                              r == 0 ? "EOF" : strerror(-r));
                if (rep.type == WIRE_REP_EVENT && rep.event.kind == WIRE_EVENT_RELEASED) {
                        nevents = rep.event.nevents;
                        for (uint32_t i = 0; i < rep.event.nevents; i++)
                                if (memcmp(rep.event.events[i], mine, DLX_CUDA_HANDLE) == 0)
                                        found = true;
                        wire_reply_done(&rep);
                        break;
                }
                wire_reply_done(&rep);
        }
        ck_assert_msg(found,
                      "RELEASED hands the producer %u release events, all from one consumer; "
                      "another consumer's event was dropped",
                      nevents);
        close(good);
        close(hog);
        close(prod);
}
END_TEST

/* dlx_tensor_unref()s a view from another thread, after a pause: while the producer waits. */
static void *release_later(void *arg)
{
        fx_sleep_ms(100);
        DLManagedTensorVersioned *t = arg;
        t->deleter(t);
        return NULL;
}

/*
 * dlx_wait_released(): a version qualifies once it is no longer current and
 * its last lease is gone, never while current (anyone may acquire it next).
 */
START_TEST(wait_released_only_when_replaced_and_unleased)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *c = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *held;
        uint64_t v1, v2, v3;
        pthread_t th;
        int64_t t0;

        publish_ok(p, "wr/a", fx_vec_f32(p, 16, 1), NULL, &v1);
        /* current and unleased: still not released */
        ck_assert_int_eq(dlx_wait_released(p, "wr/a", v1, NULL, 0), -ETIMEDOUT);
        expect_last_error("still current");
        ck_assert_int_eq(dlx_wait_released(p, "wr/a", v1, NULL, 50), -ETIMEDOUT);

        held = acquire_ok(c, "wr/a", NULL);
        publish_ok(p, "wr/a", fx_vec_f32(p, 16, 2), NULL, &v2);
        /* replaced but leased */
        ck_assert_int_eq(dlx_wait_released(p, "wr/a", v1, NULL, 0), -ETIMEDOUT);
        ck_assert_int_eq(dlx_wait_released(p, "wr/a", v1, NULL, 50), -ETIMEDOUT);
        ck_assert(fx_vec_is(held, 16, 1));

        /* released while the producer waits without a limit */
        t0 = fx_now_ms();
        ck_assert_int_eq(pthread_create(&th, NULL, release_later, held), 0);
        ck_assert_int_eq(dlx_wait_released(p, "wr/a", v1, NULL, -1), 0);
        ck_assert_int_ge(fx_now_ms() - t0, 90);
        ck_assert_int_eq(pthread_join(th, NULL), 0);
        /* remembered: asking again answers at once */
        ck_assert_int_eq(dlx_wait_released(p, "wr/a", v1, NULL, 0), 0);

        /* unpublished with no lease: released at once */
        ck_assert_int_eq(dlx_unpublish(p, "wr/a"), 0);
        ck_assert_int_eq(dlx_wait_released(p, "wr/a", v2, NULL, 5000), 0);

        /* a copied publish leaves nothing of the caller's to wait for */
        publish_ok(p, "wr/b", fx_plain_f32(4, 0, NULL), NULL, &v3);
        ck_assert_int_eq(dlx_wait_released(p, "wr/b", v3, NULL, 0), -ENOENT);
        /* a bad name is a bad argument, not an unknown version */
        ck_assert_int_eq(dlx_wait_released(p, "wr//b", 1, NULL, 0), -EINVAL);
        ck_assert_int_eq(dlx_unpublish(p, "wr/b"), 0);
        dlx_close(c);
        dlx_close(p);
}
END_TEST

/*
 * dlx.h: a timeout is any int64_t; INT64_MAX is one too, and must not overflow
 * the deadline (UBSan caught dlx_track_wait's; these are its siblings). The
 * waits end at once: what they wait for is already there.
 */
START_TEST(largest_timeouts)
{
        dlx_client *p = fx_connect(&fx, "producer"), *w = fx_connect(&fx, "watcher");
        struct dlx_event ev;
        DLManagedTensorVersioned *t;
        uint64_t v1 = 0;

        ck_assert_int_eq(dlx_watch(w, "huge/", NULL), 0);
        publish_ok(p, "huge/x", fx_vec_f32(p, 4, 0), NULL, &v1);
        ck_assert_int_eq(dlx_next_event(w, &ev, INT64_MAX), 0);
        ck_assert_uint_eq(ev.version, v1);
        publish_ok(p, "huge/x", fx_vec_f32(p, 4, 1), NULL, NULL);
        ck_assert_int_eq(dlx_wait_released(p, "huge/x", v1, NULL, INT64_MAX), 0);
        t = acquire_ok(w, "huge/x", NULL);
        ck_assert_int_eq(dlx_tensor_wait(t, INT64_MAX), 0);
        t->deleter(t);
        dlx_close(w);
        dlx_close(p);
}
END_TEST

Suite *pubsub_suite(void)
{
        Suite *s = suite_create("pubsub");
        TCase *tc = tcase_create("daemon");
        TCase *own = tcase_create("own-daemon");

        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, publish_acquire_same_pages);
        tcase_add_test(tc, largest_timeouts);
        tcase_add_test(tc, read_only_is_enforced);
        tcase_add_test(tc, persist_outlives_producer);
        tcase_add_test(tc, replace_while_leased);
        tcase_add_test(tc, unpublish_while_leased);
        tcase_add_test(tc, wait_released_only_when_replaced_and_unleased);
        tcase_add_test(tc, release_after_idle_reaches_producer);
        tcase_add_test(tc, release_events_of_every_consumer_kept);
        tcase_add_test(tc, acquire_works_again_after_failed_mmap);
        tcase_add_test(tc, big_segments_close_after_the_reply);
        tcase_add_test(tc, zero_copy_at_start_of_any_segment);
        tcase_add_test(tc, read_only_tensor_never_mapped_writable);
        tcase_add_test(tc, forgotten_segment_unmapped_after_crossing_reply);
        tcase_add_test(tc, pollable_fd_readable_while_event_queued);
        tcase_add_test(tc, wait_released_poll_sees_release);
        tcase_add_test(tc, alloc_refuses_size_that_wraps);
        tcase_add_test(tc, session_bounds);
        tcase_add_test(tc, close_runs_held_deleters);
        tcase_add_test(tc, kill9_releases_leases);
        tcase_add_test(tc, acquire_timeout);
        tcase_add_test(tc, acquire_waits_for_publish);
        tcase_add_test(tc, acquire_min_version);
        tcase_add_test(tc, watch_events);
        tcase_add_test(tc, event_loop_integration);
        tcase_add_test(tc, mapping_cache);
        tcase_add_test(tc, idle_maps_forgotten_in_batches);
        tcase_add_test(tc, allocator_keeps_the_larger_empty_segment);
        tcase_add_test(tc, fresh_allocations_reuse_released_segments);
        tcase_add_test(tc, threads_share_a_client);
        tcase_add_test(tc, tensor_outlives_close);
        tcase_add_test(tc, stats_and_list);
        tcase_add_test(tc, many_names_page_through_list);
        tcase_add_test(tc, default_socket_from_environment);
        tcase_add_test(tc, connect_errors);
        tcase_add_test(tc, bad_arguments);
        tcase_add_test(tc, info_stats_watch_contracts);
        tcase_add_test(tc, socket_live_and_stale);
        suite_add_tcase(s, tc);

        /* these start their own daemon with options */
        tcase_set_timeout(own, 60);
        tcase_add_test(own, max_bytes_limit);
        tcase_add_test(own, max_clients_limit);
        suite_add_tcase(s, own);
        return s;
}
