/* SPDX-License-Identifier: MIT */
/*
 * Second-reader suite for libdlx: each test reproduces one suspected bug in
 * the client library against a real dlxd. A failing test is a bug proven.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"
#include "internal.h" /* only to see when a request has been sent */

/* ---- helpers ------------------------------------------------------------------------- */

/* The /proc/self/maps line containing addr: start and end, or false. */
static bool mapping_of(const void *addr, uintptr_t *ret_start, uintptr_t *ret_end)
{
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        bool found = false;

        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f)) {
                uintptr_t s, e;
                if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR, &s, &e) != 2)
                        continue;
                if ((uintptr_t)addr >= s && (uintptr_t)addr < e) {
                        *ret_start = s;
                        *ret_end = e;
                        found = true;
                        break;
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

/* ---- 1. a failed mmap leaves the daemon believing we hold the segment ------------------ */

/*
 * segment.c dlx__map_get(): when mmap() of a freshly received fd fails, the
 * mapping record is destroyed and the fd closed, but nothing tells the daemon,
 * which recorded the fd as delivered (known->ro). Every later acquire of any
 * tensor in that segment comes back without an fd and fails with -EPROTO
 * ("the daemon thinks we hold a segment we do not"), for the session's life.
 */
START_TEST(mmap_failure_poisons_segment)
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

/* ---- 2. zero-copy missed for a tensor at the start of a segment ------------------------ */

/*
 * segment.c dlx__arena_find(): the first arena segment whose [base, base+size]
 * (end inclusive) holds the data pointer wins, and a failed extent check there
 * returns NULL instead of trying the next segment. mmap places a new segment
 * right below the previous one, so the data pointer of a tensor at offset 0 of
 * an older segment equals the end of the newer one: the newer one is found
 * first, the extent check fails, and the tensor is treated as foreign memory
 * (copied, or -EXDEV with DLX_COPY_NEVER).
 */
START_TEST(zero_copy_at_segment_start)
{
        enum { MAXSEG = 8 };
        dlx_client *c = fx_connect(&fx, "producer");
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        DLManagedTensorVersioned *t[MAXSEG];
        uintptr_t start[MAXSEG], end[MAXSEG];
        int n = 0, victim = -1, err;

        /*
         * The allocator's segments are 256 KiB, 512 KiB, 1 MiB...: one tensor
         * filling each sits at offset 0 of its own segment. Stop as soon as a
         * newer segment ends exactly where an older one begins.
         */
        while (n < MAXSEG && victim < 0) {
                t[n] = fx_alloc_f32(c, ((int64_t)256 << 10 << n) / 4);
                ck_assert(mapping_of(t[n]->dl_tensor.data, &start[n], &end[n]));
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

/* ---- 3. the pollable fd goes quiet while an event is queued ---------------------------- */

/*
 * client.c pump(): any call that reads the socket (a ping, an acquire...)
 * also swallows watch events and queues them. The fd then no longer polls
 * readable although an event waits, so a caller that follows dlx_fd()'s
 * contract ("polls readable when the daemon has sent something") and only
 * calls dlx_process_events()/dlx_next_event() when it is readable stalls.
 */
START_TEST(pollable_fd_quiet_with_event_queued)
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

/* ---- 4. dlx_close while other threads are blocked in calls ----------------------------- */

struct blocked {
        dlx_client *c;
        char name[32];
        int err;
};

static void *acquire_forever(void *arg)
{
        struct blocked *b = arg;
        struct dlx_acquire_options o = {.timeout_ms = -1};
        DLManagedTensorVersioned *t = NULL;

        b->err = dlx_acquire(b->c, b->name, &o, &t);
        if (b->err == 0)
                t->deleter(t);
        return NULL;
}

/*
 * client.c dlx_close(): it waits only until no thread is *reading*, then frees
 * the client. Threads that wait for their reply (pthread_cond_wait on
 * c->cond) or that are on their way out of dlx__call() still touch c->lock,
 * c->cond and c->broken_why after the free. Run under ASan to see the
 * use-after-free; without ASan it shows as a crash or hang now and then.
 */
START_TEST(close_with_blocked_callers)
{
        enum { N = 8 };
        dlx_client *obs = fx_connect(&fx, "observer");

        for (int round = 0; round < 50; round++) {
                dlx_client *c = fx_connect(&fx, "closer");
                struct blocked b[N];
                pthread_t th[N];
                struct dlx_stats st;
                uint64_t r0, calls = 0;

                ck_assert_int_eq(dlx_stats(obs, &st), 0);
                r0 = st.requests;
                for (int i = 0; i < N; i++) {
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
                } while (st.requests - r0 - calls < N);
                dlx_close(c);
                for (int i = 0; i < N; i++) {
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

/* ---- 5. an fd-less reply crossing a Forget leaves a mapping the daemon forgot ---------- */

/* The inode of the file mapped at addr (a memfd), or 0. */
static unsigned long inode_of(const void *addr)
{
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        unsigned long ino = 0;

        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f)) {
                uintptr_t s, e;
                unsigned long i;
                if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %lu", &s, &e, &i) != 3)
                        continue;
                if ((uintptr_t)addr >= s && (uintptr_t)addr < e) {
                        ino = i;
                        break;
                }
        }
        fclose(f);
        return ino;
}

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
 * segment.c dlx__map_get() / dlx__map_forgotten(): thread A acquires a tensor
 * in idle segment S while thread B's release evicts S from the idle cache
 * (Forget sent). The daemon grants A first (S is known: no fd), then handles
 * the Forget and drops S from what this session holds. The client revives S
 * from the fd-less reply, then the Forget reply clears forget_id and keeps S
 * as an ordinary cached mapping. From then on the two sides disagree: when S
 * dies the daemon sends SEGMENT_GONE only to sessions holding it, so this
 * process keeps a mapping of a destroyed segment (its pages pinned, not
 * counted by the daemon) until 32 other segments push it out of the cache.
 */
START_TEST(forget_crossing_fdless_reply)
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
                unsigned long ino;
                uint64_t id0;
                pthread_t th;

                publish_ok(p, "x/s", fx_plain_f32(16, 100.0f, NULL), NULL, NULL);
                /* S first in the idle cache, then 31 others: 32 idle, one held */
                t = acquire_ok(q, "x/s", NULL);
                ino = inode_of(t->dl_tensor.data);
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

/* ---- 6. a read-only tensor served through a writable mapping --------------------------- */

/* The permission string ("r--s", "rw-s"...) of the mapping holding addr. */
static void perms_of(const void *addr, char perms[5])
{
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];

        ck_assert_ptr_nonnull(f);
        perms[0] = '\0';
        while (fgets(line, sizeof(line), f)) {
                uintptr_t s, e;
                char p[5];
                if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &s, &e, p) != 3)
                        continue;
                if ((uintptr_t)addr >= s && (uintptr_t)addr < e) {
                        memcpy(perms, p, 5);
                        break;
                }
        }
        fclose(f);
}

/*
 * tensor.c build_acquired() / segment.c dlx__map_get(): a producer publishes
 * two tensors from one dlx_alloc() segment, one writable and one read-only. A
 * consumer that acquires the writable one first holds only a writable mapping
 * of the segment; the read-only one then comes without an fd and is handed out
 * inside that writable mapping. Its READ_ONLY flag is set, but nothing stops a
 * (buggy) consumer from scribbling over the producer's read-only tensor, unlike
 * the same acquire done in the other order, which maps through a read-only fd.
 */
START_TEST(read_only_tensor_in_writable_mapping)
{
        dlx_client *p = fx_connect(&fx, "producer");
        dlx_client *q = fx_connect(&fx, "consumer");
        DLManagedTensorVersioned *w, *r;
        char perms[5];

        publish_ok(p, "mix/w", fx_alloc_f32(p, 1024),
                   &(struct dlx_publish_options){.writable = true}, NULL);
        publish_ok(p, "mix/r", fx_alloc_f32(p, 1024), NULL, NULL);

        w = acquire_ok(q, "mix/w", NULL);
        r = acquire_ok(q, "mix/r", NULL);
        ck_assert(!(w->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
        ck_assert(r->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        perms_of(r->dl_tensor.data, perms);
        ck_assert_msg(perms[1] != 'w',
                      "the read-only tensor 'mix/r' is mapped %s in the consumer: writes go "
                      "straight into the producer's memory",
                      perms);
        r->deleter(r);
        w->deleter(w);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- 7. dlx_alloc()'s size-overflow check does not catch the wrap ---------------------- */

/*
 * tensor.c dlx_alloc(): bytes = numel * itemsize is computed in 64 bits and
 * then checked with `bytes / numel > 64`, which cannot see a wrap (a wrapped
 * product is smaller than the true one, never larger). 2^61 float64 elements
 * are 2^64 bytes, which wraps to 0: the call succeeds with a 64-byte chunk
 * behind a tensor that claims 16 EiB, and writing its 9th element already
 * tramples the next allocation.
 */
START_TEST(alloc_size_wraps)
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

/* ---- 8. dlx_wait_released(timeout 0) never looks at what the daemon sent ---------------- */

/*
 * client.c dlx_wait_released(): with timeout_ms == 0 the loop sets
 * -ETIMEDOUT before it ever calls pump(), so a RELEASED notice already sitting
 * in the socket is never read. A producer that polls without blocking (the
 * "0: do not wait" of the header, as dlx_acquire() understands it: ask, but do
 * not wait) is told "still has readers" forever, unless some other call
 * happens to read the socket for it.
 */
START_TEST(wait_released_poll_never_reads)
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

Suite *review_client_suite(void)
{
        Suite *s = suite_create("review-client");
        TCase *tc = tcase_create("bugs");

        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, mmap_failure_poisons_segment);
        tcase_add_test(tc, zero_copy_at_segment_start);
        tcase_add_test(tc, pollable_fd_quiet_with_event_queued);
        tcase_add_test(tc, forget_crossing_fdless_reply);
        tcase_add_test(tc, read_only_tensor_in_writable_mapping);
        tcase_add_test(tc, alloc_size_wraps);
        tcase_add_test(tc, wait_released_poll_never_reads);
        suite_add_tcase(s, tc);

        tc = tcase_create("close");
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, close_with_blocked_callers);
        suite_add_tcase(s, tc);
        return s;
}
