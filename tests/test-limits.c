/* SPDX-License-Identifier: MIT */
/*
 * dlxd's limits, each set on the command line of a daemon of its own: what a
 * client that reaches one gets (errno and message), that others and other uids
 * are not affected, that the room comes back once freed, and that dlx_stats
 * reports the limits and the caller's uid usage.
 *
 * Another uid is played by a forked child that drops to nobody (65534), in
 * group nogroup (65534), which those daemons are shared with (--group); the
 * test runs as root for that, and skips those parts otherwise.
 */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"

#define NOBODY 65534

/* A uint8 tensor of n bytes from the client's allocator, filled with v. */
static DLManagedTensorVersioned *bytes_of(dlx_client *c, int64_t n, uint8_t v)
{
        int64_t shape[1] = {n};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        DLManagedTensorVersioned *t = NULL;

        proto.shape = shape;
        ck_assert_msg(dlx_alloc(c, &proto, &t) == 0, "dlx_alloc: %s", dlx_last_error());
        memset(t->dl_tensor.data, v, (size_t)n);
        return t;
}

static int publish(dlx_client *c, const char *name)
{
        return dlx_publish(c, name, bytes_of(c, 64, 1), NULL, NULL);
}

/* Lets uid nobody reach the fixture's socket. */
static void open_to_others(void)
{
        ck_assert_int_eq(chmod(fx.dir, 0711), 0);
        ck_assert_int_eq(chmod(fx.socket, 0666), 0);
}

static bool can_switch_uid(void)
{
        return geteuid() == 0;
}

static dlx_client *connect_as_self(void)
{
        struct dlx_connect_options o = {.socket_path = fx.socket};
        dlx_client *c = NULL;

        return dlx_connect(&o, &c) == 0 ? c : NULL;
}

struct as_nobody {
        int (*body)(dlx_client *c); /* its result is the child's exit status */
        uid_t uid;
};

/* In a child (fx_spawn): drops to the uid (group nobody), connects, runs the body, closes. */
static int nobody_main(void *p)
{
        const struct as_nobody *a = p;
        dlx_client *c;
        int rc;

        if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(a->uid) != 0)
                return 90;
        c = connect_as_self();
        if (!c)
                return 91;
        rc = a->body(c);
        dlx_close(c);
        return rc;
}

/* Runs body as uid (group nobody) against the fixture's daemon; returns its result. */
static int run_as(uid_t uid, int (*body)(dlx_client *c))
{
        struct as_nobody a = {body, uid};

        open_to_others();
        return fx_wait(fx_spawn(nobody_main, &a));
}

/* Runs body as uid nobody against the fixture's daemon; returns its result. */
static int run_as_nobody(int (*body)(dlx_client *c))
{
        return run_as(NOBODY, body);
}

/* ---- clients ------------------------------------------------------------------------------- */

static int just_connected(dlx_client *c)
{
        return dlx_ping(c) == 0 ? 0 : 1;
}

START_TEST(clients_per_uid)
{
        static const char *const args[] = {"--max-clients-per-uid", "2", "--group", "65534", NULL};
        dlx_client *a, *b, *c;
        struct dlx_stats st;

        dlxd_start(&fx, args);
        a = fx_connect(&fx, "a");
        b = fx_connect(&fx, "b");
        ck_assert_ptr_null(connect_as_self());
        expect_last_error("too many clients of uid");
        ck_assert_int_eq(dlx_stats(a, &st), 0);
        ck_assert_uint_eq(st.limits.max_clients_per_uid, 2);
        ck_assert_uint_eq(st.uid, (uint32_t)getuid());
        ck_assert_uint_eq(st.uid_clients, 2);
        if (can_switch_uid()) {
                /* another uid has its own allowance */
                ck_assert_int_eq(run_as_nobody(just_connected), 0);
        }
        /* the room comes back once one leaves */
        dlx_close(b);
        c = NULL;
        for (int i = 0; i < 200 && !(c = connect_as_self()); i++)
                fx_sleep_ms(5);
        ck_assert_ptr_nonnull(c);
        dlx_close(c);
        dlx_close(a);
        dlxd_stop(&fx);
}
END_TEST

/* ---- bytes --------------------------------------------------------------------------------- */

/* As nobody: a 600 KiB tensor fits in its own quota even when root's is full. */
static int nobody_allocates(dlx_client *c)
{
        struct dlx_publish_options persist = {.persist = true};

        /* persistent: it stays, charged to nobody, once this client has gone */
        return dlx_publish(c, "nobody/big", bytes_of(c, 600 << 10, 3), &persist, NULL) == 0 ? 0 : 2;
}

START_TEST(bytes_per_uid)
{
        static const char *const args[] = {"--max-bytes-per-uid", "1M", "--group", "65534", NULL};
        int64_t shape[1] = {600 << 10};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        DLManagedTensorVersioned *t, *t2 = NULL;
        struct dlx_stats st;
        dlx_client *c;

        proto.shape = shape;
        dlxd_start(&fx, args);
        c = fx_connect(&fx, "big");
        ck_assert_int_eq(dlx_publish(c, "b/1", bytes_of(c, 600 << 10, 1), NULL, NULL), 0);
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.limits.max_bytes_per_uid, 1 << 20);
        ck_assert_uint_ge(st.uid_bytes, 600 << 10);
        ck_assert_uint_eq(st.uid_bytes, st.bytes);
        /* a second 600 KiB passes this uid's MiB */
        ck_assert_int_eq(dlx_alloc(c, &proto, &t2), -ENOSPC);
        ck_assert_ptr_null(t2);
        expect_last_error("limit of 1048576 shared bytes");
        expect_last_error("uid");
        if (can_switch_uid()) {
                ck_assert_int_eq(run_as_nobody(nobody_allocates), 0);
                ck_assert_int_eq(dlx_stats(c, &st), 0);
                ck_assert_uint_gt(st.bytes, st.uid_bytes); /* nobody's are not ours */
                ck_assert_int_eq(dlx_unpublish(c, "nobody/big"), 0);
        }
        /* freed, the room comes back */
        ck_assert_int_eq(dlx_unpublish(c, "b/1"), 0);
        dlx_close(c);
        c = fx_connect(&fx, "big-again");
        ck_assert_int_eq(dlx_alloc(c, &proto, &t), 0);
        t->deleter(t);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ---- dlx_alloc under a byte limit ------------------------------------------------------- */

/* A uint8 tensor of n bytes from the allocator, or its error (*ret untouched then). */
static int alloc_bytes(dlx_client *c, uint64_t n, DLManagedTensorVersioned **ret)
{
        int64_t shape[1] = {(int64_t)n};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};

        proto.shape = shape;
        return dlx_alloc(c, &proto, ret);
}

/* What the limit leaves, as dlx_stats() tells it: for this uid (per_uid) or for everyone. */
static uint64_t room_left(dlx_client *c, bool per_uid)
{
        struct dlx_stats st;

        ck_assert_int_eq(dlx_stats(c, &st), 0);
        if (per_uid)
                return st.limits.max_bytes_per_uid - st.uid_bytes;
        return st.limits.max_bytes - st.bytes;
}

static void free_all(DLManagedTensorVersioned **t, int n)
{
        for (int i = 0; i < n; i++) {
                if (t[i])
                        t[i]->deleter(t[i]);
                t[i] = NULL;
        }
}

/*
 * dlx_alloc's promise: a tensor whose bytes fit in what the limit leaves
 * succeeds. Six tensors of 174700 bytes (1048200) fit in a MiB only if each
 * segment is within 63 bytes of its tensor; five of 200 KiB (1024000) fit
 * too, and a sixth does not, and says which limit it met.
 */
START_TEST(alloc_fills_per_uid_limit)
{
        static const char *const args[] = {"--max-bytes-per-uid", "1M", NULL};
        DLManagedTensorVersioned *t[6] = {NULL};
        struct dlx_stats st;
        dlx_client *c;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "filler");
        for (int i = 0; i < 6; i++)
                ck_assert_msg(alloc_bytes(c, 174700, &t[i]) == 0, "174700-byte tensor %d: %s", i,
                              dlx_last_error());
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.uid_bytes, 6 * 174720);
        /* the empty segment kept for reuse makes way for the 200 KiB ones below */
        free_all(t, 6);
        for (int i = 0; i < 5; i++)
                ck_assert_msg(alloc_bytes(c, 204800, &t[i]) == 0, "200 KiB tensor %d: %s", i,
                              dlx_last_error());
        /* each has a segment sized to it: nothing of the MiB goes to waste */
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.uid_bytes, 5 * 204800);
        ck_assert_int_eq(alloc_bytes(c, 204800, &t[5]), -ENOSPC);
        ck_assert_ptr_null(t[5]);
        expect_last_error("limit of 1048576 shared bytes");
        expect_last_error("uid");
        /*
         * Freed, the room comes back, all of it: the empty segment the client
         * keeps for reuse is given back for a tensor of the whole MiB.
         */
        free_all(t, 5);
        ck_assert_msg(alloc_bytes(c, 1 << 20, &t[0]) == 0, "the whole MiB: %s", dlx_last_error());
        ck_assert_int_eq(alloc_bytes(c, 64, &t[1]), -ENOSPC);
        free_all(t, 2);
        for (int i = 0; i < 5; i++)
                ck_assert_msg(alloc_bytes(c, 204800, &t[i]) == 0, "again, tensor %d: %s", i,
                              dlx_last_error());
        free_all(t, 5);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Limits below the allocator's smallest growth segment, one not a multiple of
 * 64 or of the page, and one too small for segments shared by small tensors.
 */
static const struct {
        const char *option, *value;
        uint64_t bytes;
} small_limits[] = {
        {"--max-bytes-per-uid", "100K", 100 << 10}, {"--max-bytes-per-uid", "64K", 64 << 10},
        {"--max-bytes-per-uid", "10000", 10000},    {"--max-bytes", "100K", 100 << 10},
        {"--max-bytes", "64K", 64 << 10},           {"--max-bytes", "10000", 10000},
        {"--max-bytes-per-uid", "1000", 1000},
};

/*
 * Under each: a small tensor, then one of exactly what is left, then nothing
 * that needs a new segment; freed, one tensor of the whole limit.
 */
START_TEST(alloc_under_small_limits)
{
        const char *const args[] = {small_limits[_i].option, small_limits[_i].value, NULL};
        const uint64_t limit = small_limits[_i].bytes;
        const bool per_uid = strcmp(args[0], "--max-bytes-per-uid") == 0;
        DLManagedTensorVersioned *t[3] = {NULL};
        char msg[64];
        uint64_t left;
        dlx_client *c;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "small");
        ck_assert_msg(alloc_bytes(c, 100, &t[0]) == 0, "100 bytes under %s %s: %s", args[0],
                      args[1], dlx_last_error());
        left = room_left(c, per_uid);
        ck_assert_uint_gt(left, limit / 2);
        ck_assert_msg(alloc_bytes(c, left, &t[1]) == 0, "%llu bytes, what %s %s leaves: %s",
                      (unsigned long long)left, args[0], args[1], dlx_last_error());
        ck_assert_uint_eq(room_left(c, per_uid), 0);
        /* full: a tensor the segments have no room for fails, and says which limit */
        ck_assert_int_eq(alloc_bytes(c, limit / 2, &t[2]), -ENOSPC);
        ck_assert_ptr_null(t[2]);
        snprintf(msg, sizeof(msg), "limit of %llu shared bytes", (unsigned long long)limit);
        expect_last_error(msg);
        /* freed, the room comes back: the whole limit in one tensor */
        free_all(t, 2);
        ck_assert_msg(alloc_bytes(c, limit, &t[0]) == 0, "%llu bytes, all of %s %s: %s",
                      (unsigned long long)limit, args[0], args[1], dlx_last_error());
        ck_assert_uint_eq(room_left(c, per_uid), 0);
        free_all(t, 1);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* How many segments the daemon holds once n tensors of size bytes are allocated. */
static uint64_t segments_for(dlx_client *c, int n, uint64_t size, DLManagedTensorVersioned **t)
{
        struct dlx_stats st;

        for (int i = 0; i < n; i++)
                ck_assert_msg(alloc_bytes(c, size, &t[i]) == 0, "tensor %d: %s", i,
                              dlx_last_error());
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        return st.segments;
}

/*
 * Small tensors share segments, so most allocations cost no round trip: with
 * no limit a thousand fit in the first segment (as before limits shaped the
 * segments), and under a limit below that segment's size they share segments
 * of a sixteenth of the limit.
 */
START_TEST(alloc_packs_small_tensors)
{
        static const char *const args[] = {"--max-bytes-per-uid", "200K", NULL};
        static DLManagedTensorVersioned *t[1000];
        dlx_client *c;
        uint64_t n;

        dlxd_start(&fx, NULL);
        c = fx_connect(&fx, "packer");
        ck_assert_uint_eq(segments_for(c, 1000, 100, t), 1);
        free_all(t, 1000);
        dlx_close(c);
        dlxd_stop(&fx);

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "packer");
        n = segments_for(c, 1000, 100, t);
        ck_assert_msg(n <= 16, "1000 tensors of 100 bytes took %llu segments",
                      (unsigned long long)n);
        free_all(t, 1000);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ---- names --------------------------------------------------------------------------------- */

static int nobody_publishes(dlx_client *c)
{
        return publish(c, "nobody/x") == 0 ? 0 : 2;
}

START_TEST(names_per_uid)
{
        static const char *const args[] = {"--max-names-per-uid", "3", "--group", "65534", NULL};
        struct dlx_stats st;
        dlx_client *c;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "namer");
        ck_assert_int_eq(publish(c, "n/1"), 0);
        ck_assert_int_eq(publish(c, "n/2"), 0);
        ck_assert_int_eq(publish(c, "n/3"), 0);
        ck_assert_int_eq(publish(c, "n/4"), -EAGAIN);
        expect_last_error("owns 3 names (the limit)");
        /* replacing a name it owns is no new name */
        ck_assert_int_eq(publish(c, "n/2"), 0);
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.uid_names, 3);
        ck_assert_uint_eq(st.limits.max_names_per_uid, 3);
        if (can_switch_uid()) {
                ck_assert_int_eq(run_as_nobody(nobody_publishes), 0);
        }
        ck_assert_int_eq(dlx_unpublish(c, "n/1"), 0);
        ck_assert_int_eq(publish(c, "n/4"), 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(names_in_all)
{
        static const char *const args[] = {"--max-names", "2", NULL};
        dlx_client *a, *b;

        dlxd_start(&fx, args);
        a = fx_connect(&fx, "a");
        b = fx_connect(&fx, "b");
        ck_assert_int_eq(publish(a, "g/1"), 0);
        ck_assert_int_eq(publish(b, "g/2"), 0);
        ck_assert_int_eq(publish(b, "g/3"), -EAGAIN);
        expect_last_error("the daemon holds 2 names (the limit)");
        /* names of a client that leaves go with it, and so does the count */
        dlx_close(a);
        int err = -EAGAIN;
        for (int i = 0; i < 200 && (err = publish(b, "g/3")) == -EAGAIN; i++)
                fx_sleep_ms(5);
        ck_assert_int_eq(err, 0);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/*
 * By default a uid's share of names is 7/8 of what the other uids leave of
 * --max-names: one uid cannot take them all, nor can two, and a limit under
 * 8 is one uid's to fill.
 */
static int persist_until_refused(dlx_client *c, const char *prefix, int *ret_err)
{
        struct dlx_publish_options o = {.persist = true};
        char name[64];
        int n = 0;

        for (; n < 1000; n++) {
                snprintf(name, sizeof(name), "%s/%d", prefix, n);
                *ret_err = dlx_publish(c, name, fx_plain_f32(1, 1.0f, NULL), &o, NULL);
                if (*ret_err < 0)
                        break;
        }
        return n;
}

/* 8 of 64 left: 7 for this uid, refused for its share */
static int names_of_nobody(dlx_client *c)
{
        int err, n = persist_until_refused(c, "fair/nobody", &err);

        return n == 7 && err == -EAGAIN && strstr(dlx_last_error(), "fair share") ? 0 : 1;
}

/* and the last one for a third uid */
static int names_of_third(dlx_client *c)
{
        int err, n = persist_until_refused(c, "fair/third", &err);

        return n == 1 && err == -EAGAIN && strstr(dlx_last_error(), "the daemon holds 64") ? 0 : 1;
}

START_TEST(names_fair_share)
{
        static const char *const args[] = {"--max-names", "64", "--group", "65534", NULL};
        struct dlx_stats st;
        dlx_client *c;
        int err;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "hog");
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.limits.max_names, 64);
        ck_assert_uint_eq(st.limits.max_names_per_uid, 56);
        ck_assert_int_eq(persist_until_refused(c, "fair/hog", &err), 56);
        ck_assert_int_eq(err, -EAGAIN);
        expect_last_error("its fair share, 7/8 of what other uids leave of 64");
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.uid_names, 56);
        if (can_switch_uid()) {
                ck_assert_int_eq(run_as(NOBODY, names_of_nobody), 0);
                ck_assert_int_eq(run_as(1001, names_of_third), 0);
        }
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* Under 8, the limit in all is one uid's to fill, and it says which limit it met. */
START_TEST(names_small_limit_is_whole)
{
        static const char *const args[] = {"--max-names", "5", NULL};
        struct dlx_stats st;
        dlx_client *c;
        int err;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "small");
        ck_assert_int_eq(persist_until_refused(c, "small", &err), 5);
        ck_assert_int_eq(err, -EAGAIN);
        expect_last_error("the daemon holds 5 names (the limit)");
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.limits.max_names_per_uid, 5);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Clients likewise: 7/8 of what the other uids leave of --max-clients, so
 * that two uids cannot take every slot from a third.
 */
static int held_ready[2], held_go[2]; /* the second uid holds its clients until told */

static int clients_of_nobody(dlx_client *c)
{
        struct dlx_connect_options o = {.socket_path = fx.socket};
        dlx_client *more[8];
        int n = 0, rc;
        char b;

        (void)c; /* one of its share already: 8 left of 64, 7 for this uid */
        while (n < 8 && dlx_connect(&o, &more[n]) == 0)
                n++;
        rc = n == 6 && strstr(dlx_last_error(), "fair share") ? 0 : 1;
        (void)!write(held_ready[1], "r", 1);
        (void)!read(held_go[0], &b, 1);
        while (n > 0)
                dlx_close(more[--n]);
        return rc;
}

START_TEST(clients_fair_share)
{
        static const char *const args[] = {"--max-clients", "64", "--group", "65534", NULL};
        dlx_client *c[64];
        struct dlx_stats st;
        int n = 0;

        dlxd_start(&fx, args);
        while (n < 64 && (c[n] = connect_as_self()) != NULL)
                n++;
        ck_assert_int_eq(n, 56);
        expect_last_error("its fair share, 7/8 of what other uids leave of 64");
        ck_assert_int_eq(dlx_stats(c[0], &st), 0);
        ck_assert_uint_eq(st.limits.max_clients_per_uid, 56);
        if (can_switch_uid()) {
                struct as_nobody a = {clients_of_nobody, NOBODY};
                pid_t pid;
                char b;
                ck_assert_int_eq(pipe(held_ready), 0);
                ck_assert_int_eq(pipe(held_go), 0);
                open_to_others();
                pid = fx_spawn(nobody_main, &a);
                ck_assert_int_eq(read(held_ready[0], &b, 1), 1);
                /* with both at their share, a third uid still gets in */
                ck_assert_int_eq(run_as(1001, just_connected), 0);
                ck_assert_int_eq(write(held_go[1], "g", 1), 1);
                ck_assert_int_eq(fx_wait(pid), 0);
                for (int i = 0; i < 2; i++) {
                        close(held_ready[i]);
                        close(held_go[i]);
                }
        }
        while (n > 0)
                dlx_close(c[--n]);
        dlxd_stop(&fx);
}
END_TEST

/* ---- leases and watches -------------------------------------------------------------------- */

START_TEST(leases_per_client)
{
        static const char *const args[] = {"--max-leases", "4", NULL};
        DLManagedTensorVersioned *held[4], *t = NULL;
        dlx_client *p, *q, *r;

        dlxd_start(&fx, args);
        p = fx_connect(&fx, "producer");
        q = fx_connect(&fx, "consumer");
        ck_assert_int_eq(publish(p, "l/x"), 0);
        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(dlx_acquire(q, "l/x", NULL, &held[i]), 0);
        ck_assert_int_eq(dlx_acquire(q, "l/x", NULL, &t), -EAGAIN);
        ck_assert_ptr_null(t);
        expect_last_error("holds 4 leases already");
        /* per client: another has its own */
        r = fx_connect(&fx, "other");
        ck_assert_int_eq(dlx_acquire(r, "l/x", NULL, &t), 0);
        t->deleter(t);
        dlx_close(r);
        /* a release makes room (releases travel on the ring: the daemon sees them first) */
        held[0]->deleter(held[0]);
        ck_assert_int_eq(dlx_acquire(q, "l/x", NULL, &held[0]), 0);
        for (int i = 0; i < 4; i++)
                held[i]->deleter(held[i]);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

START_TEST(watches_per_client)
{
        static const char *const args[] = {"--max-watches", "2", NULL};
        uint64_t w1, w2, w3;
        struct dlx_stats st;
        dlx_client *c;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "watcher");
        ck_assert_int_eq(dlx_watch(c, "a/", &w1), 0);
        ck_assert_int_eq(dlx_watch(c, "b/", &w2), 0);
        ck_assert_int_eq(dlx_watch(c, "c/", &w3), -EAGAIN);
        expect_last_error("has 2 watches already");
        ck_assert_int_eq(dlx_unwatch(c, w1), 0);
        ck_assert_int_eq(dlx_watch(c, "c/", &w3), 0);
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.limits.max_watches, 2);
        ck_assert_uint_eq(st.watchers, 2);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ---- descriptors ---------------------------------------------------------------------------- */

/*
 * Publishes persistent copies of heap memory (a memfd, so a daemon descriptor,
 * each) until refused.
 */
static int fill_with_copies(dlx_client *c, const char *prefix, int max, int *ret_err)
{
        struct dlx_publish_options o = {.persist = true};
        char name[64];
        int n = 0;

        *ret_err = 0;
        for (; n < max; n++) {
                snprintf(name, sizeof(name), "%s/%d", prefix, n);
                *ret_err = dlx_publish(c, name, fx_plain_f32(2, 1.0f, NULL), &o, NULL);
                if (*ret_err < 0)
                        break;
        }
        return n;
}

/* As nobody: its own copies go in beside root's, and root's names can be acquired. */
static int nobody_copies(dlx_client *c)
{
        DLManagedTensorVersioned *t;
        int err, n = fill_with_copies(c, "nobody/fd", 5, &err);

        if (n != 5)
                return 2;
        if (dlx_acquire(c, "fd/0", NULL, &t) < 0)
                return 3;
        t->deleter(t);
        for (int i = 0; i < 5; i++) {
                char name[64];
                snprintf(name, sizeof(name), "nobody/fd/%d", i);
                if (dlx_unpublish(c, name) < 0)
                        return 4;
        }
        return 0;
}

/*
 * Every descriptor dlxd holds for a segment is charged to a uid: persistent
 * versions outlive the session that sent them, so reconnecting does not get
 * round the limit; the offender gets -EAGAIN naming it, everyone else
 * (other uids, and acquires of what exists) goes on.
 */
START_TEST(fds_per_uid)
{
        static const char *const args[] = {"--max-fds-per-uid", "20", "--group", "65534", NULL};
        DLManagedTensorVersioned *t;
        struct dlx_stats st;
        dlx_client *c;
        int total = 0, err;

        dlxd_start(&fx, args);
        /* a few sessions, each leaving persistent tensors behind */
        for (int round = 0; round < 4; round++) {
                char prefix[16];
                c = fx_connect(&fx, "hog");
                snprintf(prefix, sizeof(prefix), "fd/r%d", round);
                total += fill_with_copies(c, prefix, 8, &err);
                dlx_close(c);
        }
        ck_assert_int_eq(total, 20);
        ck_assert_int_eq(err, -EAGAIN);
        c = fx_connect(&fx, "hog-again");
        ck_assert_int_eq(fill_with_copies(c, "fd", 1, &err), 0);
        ck_assert_int_eq(err, -EAGAIN);
        expect_last_error("--max-fds-per-uid");
        /* an allocation needs a descriptor too */
        int64_t shape[1] = {8};
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        proto.shape = shape;
        t = NULL;
        ck_assert_int_eq(dlx_alloc(c, &proto, &t), -EAGAIN);
        ck_assert_ptr_null(t);
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.limits.max_fds_per_uid, 20);
        ck_assert_uint_eq(st.uid_fds, 20);
        ck_assert_uint_eq(st.fds, 20);
        /* what exists can still be acquired, by this uid and others */
        ck_assert_int_eq(dlx_acquire(c, "fd/r0/0", NULL, &t), 0);
        t->deleter(t);
        if (can_switch_uid()) {
                ck_assert_int_eq(dlx_unpublish(c, "fd/r2/3"), 0); /* fd/0 for nobody to read */
                ck_assert_int_eq(dlx_publish(c, "fd/0", fx_plain_f32(2, 1.0f, NULL), NULL, NULL),
                                 0);
                ck_assert_int_eq(run_as_nobody(nobody_copies), 0);
        }
        /* freed, the room comes back */
        ck_assert_int_eq(dlx_unpublish(c, "fd/r0/0"), 0);
        ck_assert_int_eq(fill_with_copies(c, "fd/again", 1, &err), 1);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* The limit in all: one uid under its own limit can still meet it, with its own message. */
START_TEST(fds_in_all)
{
        static const char *const args[] = {"--max-fds", "12", "--max-fds-per-uid", "0", NULL};
        struct dlx_stats st;
        dlx_client *c;
        int err;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "all");
        ck_assert_int_eq(fill_with_copies(c, "all", 100, &err), 12);
        ck_assert_int_eq(err, -EAGAIN);
        expect_last_error("--max-fds)");
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.limits.max_fds, 12);
        ck_assert_uint_eq(st.limits.max_fds_per_uid, 0);
        ck_assert_uint_eq(st.fds, 12);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * By default the limits come from the descriptor limit: a daemon with 1024
 * descriptors keeps half for itself and its connections, gives a uid half of
 * the rest, and a uid publishing persistent memfds until refused leaves
 * others connecting, acquiring and publishing.
 */
START_TEST(fds_default_from_rlimit)
{
        struct rlimit low = {.rlim_cur = 1024, .rlim_max = 1024}, saved;
        DLManagedTensorVersioned *t;
        struct dlx_stats st;
        dlx_client *c, *other;
        int n, err;

        /* valgrind keeps its own descriptors and refuses a lower limit: nothing to see there */
        if (getenv("DLX_TEST_VALGRIND"))
                return;
        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        if (saved.rlim_max < low.rlim_max)
                low = saved;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
        dlxd_start(&fx, NULL);
        setrlimit(RLIMIT_NOFILE, &saved);
        c = fx_connect(&fx, "hog");
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_gt(st.limits.max_fds, 0);
        ck_assert_uint_lt(st.limits.max_fds, low.rlim_cur);
        ck_assert_uint_eq(st.limits.max_fds_per_uid, st.limits.max_fds / 2);
        n = fill_with_copies(c, "hog", 5000, &err);
        ck_assert_int_eq(err, -EAGAIN);
        ck_assert_uint_eq((uint64_t)n, st.limits.max_fds_per_uid);
        /* a hundred more clients connect, acquire what is there, and each another copy */
        for (int i = 0; i < 100; i++) {
                other = fx_connect(&fx, "other");
                ck_assert_int_eq(dlx_acquire(other, "hog/7", NULL, &t), 0);
                ck_assert_msg(t->dl_tensor.data != NULL, "no data");
                t->deleter(t);
                dlx_close(other);
        }
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * Descriptors held for segments: half of what the other uids leave of
 * --max-fds, so that two uids cannot take them all from a third either.
 */
static int fds_of_nobody(dlx_client *c)
{
        int err, n = fill_with_copies(c, "fair/nobody", 100, &err);

        return n == 4 && err == -EAGAIN && strstr(dlx_last_error(), "fair share") ? 0 : 1;
}

static int fds_of_third(dlx_client *c)
{
        int err, n = fill_with_copies(c, "fair/third", 100, &err);

        return n == 2 && err == -EAGAIN ? 0 : 1;
}

START_TEST(fds_fair_share)
{
        static const char *const args[] = {"--max-fds", "16", "--group", "65534", NULL};
        struct dlx_stats st;
        dlx_client *c;
        int err;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "hog");
        ck_assert_int_eq(fill_with_copies(c, "fair/hog", 100, &err), 8);
        ck_assert_int_eq(err, -EAGAIN);
        expect_last_error("its fair share: half of what other uids leave");
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.limits.max_fds_per_uid, 8);
        if (can_switch_uid()) {
                ck_assert_int_eq(run_as(NOBODY, fds_of_nobody), 0);
                ck_assert_int_eq(run_as(1001, fds_of_third), 0);
        }
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A copy publish under a byte limit counts beside nothing of the client's
 * own cache: the empty segments its allocator keeps go back first, as for
 * dlx_alloc().
 */
START_TEST(copy_publish_gives_back_cache)
{
        static const char *const args[] = {"--max-bytes-per-uid", "1M", NULL};
        int64_t shape[1] = {225 * 1024}; /* 900 KiB */
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLFloat, 32, 1}};
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "copy");
        proto.shape = shape;
        ck_assert_int_eq(dlx_alloc(c, &proto, &t), 0);
        t->deleter(t); /* its segment stays with the client, for reuse */
        int err = dlx_publish(c, "copy/900k", fx_plain_f32(shape[0], 1.0f, NULL), NULL, NULL);
        ck_assert_msg(err == 0, "copy publish: %s (%s)", dlx_strerror(err), dlx_last_error());
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ---- configuration ------------------------------------------------------------------------- */

/* Every limit reaches stats as given, sizes with their suffixes; no limit is 0. */
START_TEST(all_limits_in_stats)
{
        static const char *const args[] = {"--max-clients",
                                           "7",
                                           "--max-clients-per-uid",
                                           "6",
                                           "--max-bytes",
                                           "3G",
                                           "--max-bytes-per-uid",
                                           "2G",
                                           "--max-names",
                                           "500",
                                           "--max-names-per-uid",
                                           "50",
                                           "--max-leases",
                                           "40",
                                           "--max-watches",
                                           "9",
                                           "--max-queued",
                                           "64K",
                                           "--timeout-ms",
                                           "1234",
                                           NULL};
        struct dlx_stats st;
        dlx_client *c;

        dlxd_start(&fx, args);
        c = fx_connect(&fx, "stats");
        ck_assert_int_eq(dlx_stats(c, &st), 0);
        ck_assert_uint_eq(st.limits.max_clients, 7);
        ck_assert_uint_eq(st.max_clients, 7);
        ck_assert_uint_eq(st.limits.max_clients_per_uid, 6);
        ck_assert_uint_eq(st.limits.max_bytes, UINT64_C(3) << 30);
        ck_assert_uint_eq(st.max_bytes, UINT64_C(3) << 30);
        ck_assert_uint_eq(st.limits.max_bytes_per_uid, UINT64_C(2) << 30);
        ck_assert_uint_eq(st.limits.max_names, 500);
        ck_assert_uint_eq(st.limits.max_names_per_uid, 50);
        ck_assert_uint_eq(st.limits.max_leases, 40);
        ck_assert_uint_eq(st.limits.max_watches, 9);
        ck_assert_uint_eq(st.limits.max_queued, 64 << 10);
        ck_assert_uint_eq(st.limits.timeout_ms, 1234);
        ck_assert_uint_eq(st.uid_clients, 1);
        ck_assert_uint_eq(st.uid_bytes, 0);
        ck_assert_uint_eq(st.uid_names, 0);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* 0 turns a limit off: 300 leases pass a daemon told --max-leases 0. */
START_TEST(zero_is_no_limit)
{
        static const char *const args[] = {"--max-leases", "0", "--max-names", "0", NULL};
        static DLManagedTensorVersioned *held[300];
        struct dlx_stats st;
        dlx_client *p, *q;

        dlxd_start(&fx, args);
        p = fx_connect(&fx, "producer");
        q = fx_connect(&fx, "consumer");
        ck_assert_int_eq(publish(p, "z/x"), 0);
        for (int i = 0; i < 300; i++)
                ck_assert_int_eq(dlx_acquire(q, "z/x", NULL, &held[i]), 0);
        ck_assert_int_eq(dlx_stats(q, &st), 0);
        ck_assert_uint_eq(st.limits.max_leases, 0);
        ck_assert_uint_eq(st.limits.max_names, 0);
        ck_assert_uint_eq(st.leases, 300);
        for (int i = 0; i < 300; i++)
                held[i]->deleter(held[i]);
        dlx_close(q);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

Suite *limits_suite(void)
{
        Suite *s = suite_create("limits");
        TCase *tc = tcase_create("limits");

        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, clients_per_uid);
        tcase_add_test(tc, bytes_per_uid);
        tcase_add_test(tc, alloc_fills_per_uid_limit);
        tcase_add_loop_test(tc, alloc_under_small_limits, 0, (int)(N_ELEMS(small_limits)));
        tcase_add_test(tc, alloc_packs_small_tensors);
        tcase_add_test(tc, names_per_uid);
        tcase_add_test(tc, names_in_all);
        tcase_add_test(tc, names_fair_share);
        tcase_add_test(tc, names_small_limit_is_whole);
        tcase_add_test(tc, clients_fair_share);
        tcase_add_test(tc, fds_fair_share);
        tcase_add_test(tc, copy_publish_gives_back_cache);
        tcase_add_test(tc, leases_per_client);
        tcase_add_test(tc, watches_per_client);
        tcase_add_test(tc, fds_per_uid);
        tcase_add_test(tc, fds_in_all);
        tcase_add_test(tc, fds_default_from_rlimit);
        tcase_add_test(tc, all_limits_in_stats);
        tcase_add_test(tc, zero_is_no_limit);
        suite_add_tcase(s, tc);
        return s;
}
