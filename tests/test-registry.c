/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the registry (daemon/namespace.h lists its files), without sockets. Sessions are
 * created directly and given a fake send that records every reply and event in a per-session log;
 * requests are filled in as struct wire_request and handed to the registry_* handlers. Published
 * segments are real sealed memfds, so the store's seal and size checks run as in the daemon.
 *
 * Every test runs in a checked fixture that counts the open fds before the
 * loop, store and registry are created and after they are all torn down: a
 * leaked segment, read-only reopen or rejected publish fd fails the test.
 */
#include "registry.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "invariant.h"
#include "log.h"
#include "namespace.h"
#include "session.h"
#include "store.h"
#include "toolkit.h"
#include "watch.h"
#include "wire.h"

/* ---- a fake connection: records what the registry sends --------------------------------- */

/* One reply or event as the session's peer would have received it. */
struct sent {
        struct wire_reply rep; /* list entries are a private copy, owned by the log */
        bool had_fd;
        bool fd_valid;   /* fcntl(F_GETFD) succeeded on it while it was being sent */
        bool fd_cloexec; /* and it was close-on-exec */
        int fd_accmode;  /* O_RDONLY / O_RDWR of its open file description */
        int64_t fd_size; /* fstat size, -1 when unknown */
        /* a shared writable mapping of it could be made, or one through /proc reopened O_RDWR */
        bool fd_maps_writable;
};

/* Fixed capacity so pointers into the log stay valid for a whole test. */
#define LOG_CAP 1024

struct client {
        struct session *s; /* NULL once freed */
        struct sent *log;
        size_t n;
        unsigned ended; /* times the session asked its connection to end */
};

#define MAX_CLIENTS 16

static struct {
        int fds_before;
        uv_loop_t loop;
        struct store store;
        struct registry reg;
        struct client clients[MAX_CLIENTS];
        size_t nclients;
        uint64_t next_id;
} E;

/*
 * Whether a consumer holding fd could write the memory: map it writable, or
 * reopen it read-write through /proc (what a consumer of the same uid, or
 * root, can do whatever the fd's mode) and map that.
 */
static bool maps_writable(int fd, int64_t size)
{
        char path[64];
        void *p;
        int rw;

        if (size <= 0)
                return false;
        p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
                munmap(p, (size_t)size);
                return true;
        }
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        rw = open(path, O_RDWR | O_CLOEXEC);
        if (rw < 0)
                return false;
        p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        close(rw);
        if (p == MAP_FAILED)
                return false;
        munmap(p, (size_t)size);
        return true;
}

static int fake_send(void *ctx, const struct wire_reply *rep, int fd_arg, struct segment *seg)
{
        /* a segment's fd is what the connection would attach */
        int fd = seg ? seg->fd : fd_arg;
        struct client *c = ctx;
        struct sent *e;

        ck_assert_msg(c->n < LOG_CAP, "reply log full");
        e = &c->log[c->n++];
        memset(e, 0, sizeof(*e));
        e->rep = *rep;
        e->fd_size = -1;
        if (rep->type == WIRE_REP_LIST) {
                size_t sz = (rep->list.count ? rep->list.count : 1) * sizeof(struct wire_info);
                e->rep.list.entries = malloc(sz);
                ck_assert_ptr_nonnull(e->rep.list.entries);
                if (rep->list.count)
                        memcpy(e->rep.list.entries, rep->list.entries, sz);
        }
        if (rep->type == WIRE_REP_EVENT) {
                /* the events belong to the version, which may be gone after the send */
                size_t sz = (size_t)(rep->event.nevents ? rep->event.nevents : 1) * DLX_CUDA_HANDLE;
                e->rep.event.events = malloc(sz);
                ck_assert_ptr_nonnull(e->rep.event.events);
                if (rep->event.nevents)
                        memcpy(e->rep.event.events, rep->event.events, sz);
        }
        if (fd >= 0) {
                struct stat sb;
                int fl = fcntl(fd, F_GETFD);

                e->had_fd = true;
                e->fd_valid = fl >= 0;
                e->fd_cloexec = fl >= 0 && (fl & FD_CLOEXEC);
                fl = fcntl(fd, F_GETFL);
                e->fd_accmode = fl >= 0 ? (fl & O_ACCMODE) : -1;
                if (fstat(fd, &sb) == 0)
                        e->fd_size = sb.st_size;
                e->fd_maps_writable = maps_writable(fd, e->fd_size);
        }
        return 0;
}

static void fake_end(void *ctx)
{
        ((struct client *)ctx)->ended++;
}

static struct client *client_new(uid_t uid, gid_t gid, pid_t pid, const char *name)
{
        struct client *c;

        ck_assert_uint_lt(E.nclients, MAX_CLIENTS);
        c = &E.clients[E.nclients++];
        c->log = calloc(LOG_CAP, sizeof(*c->log));
        ck_assert_ptr_nonnull(c->log);
        c->n = 0;
        c->s = registry_session_new(&E.reg, uid, gid, pid);
        ck_assert_ptr_nonnull(c->s);
        c->s->greeted = true;
        c->s->io.send = fake_send;
        c->s->io.end = fake_end;
        c->s->io.ctx = c;
        snprintf(c->s->name, sizeof(c->s->name), "%s", name);
        return c;
}

static void client_close(struct client *c)
{
        registry_session_free(c->s);
        c->s = NULL;
}

static void setup(void)
{
        log_level = LOG_DEBUG; /* every log line's format runs under the sanitizers too */
        memset(&E, 0, sizeof(E));
        E.next_id = 1;
        /*
         * libuv opens a process-wide signal pipe on its first uv_loop_init and
         * keeps it for the life of the process: have it open before counting.
         */
        ck_assert_int_eq(uv_loop_init(&E.loop), 0);
        ck_assert_int_eq(uv_loop_close(&E.loop), 0);
        E.fds_before = count_fds(0);
        ck_assert_int_eq(uv_loop_init(&E.loop), 0);
        store_init(&E.store);
        struct wire_limit_set lim;
        registry_default_limits(&lim);
        lim.max_bytes = 1 << 20;
        lim.max_clients = 64;
        registry_init(&E.reg, &E.loop, &E.store, &lim);
}

/* Forgets what c was sent so far (its log has a fixed capacity). */
static void log_clear(struct client *c)
{
        for (size_t j = 0; j < c->n; j++) {
                if (c->log[j].rep.type == WIRE_REP_LIST)
                        free(c->log[j].rep.list.entries);
                if (c->log[j].rep.type == WIRE_REP_EVENT)
                        free(c->log[j].rep.event.events);
        }
        c->n = 0;
}

static void teardown(void)
{
        registry_done(&E.reg);
        /* every per-uid count went back to zero, and its record with it */
        ck_assert_uint_eq(E.store.uids.count, 0);
        store_done(&E.store);
        ck_assert_uint_eq(E.store.segments.count, 0);
        ck_assert_uint_eq(E.store.bytes, 0);
        /* closing waiter timers finish here */
        uv_run(&E.loop, UV_RUN_DEFAULT);
        ck_assert_int_eq(uv_loop_close(&E.loop), 0);
        for (size_t i = 0; i < E.nclients; i++) {
                log_clear(&E.clients[i]);
                free(E.clients[i].log);
        }
        ck_assert_int_eq(count_fds(0), E.fds_before);
}

/* ---- reading the logs -------------------------------------------------------------------- */

/* The one reply addressed to request id, or NULL; a second one fails the test. */
static const struct sent *reply_for(const struct client *c, uint64_t id)
{
        const struct sent *found = NULL;

        for (size_t i = 0; i < c->n; i++) {
                if (c->log[i].rep.type == WIRE_REP_EVENT || c->log[i].rep.id != id)
                        continue;
                ck_assert_msg(!found, "two replies to request %llu", (unsigned long long)id);
                found = &c->log[i];
        }
        return found;
}

static unsigned count_replies_to(const struct client *c, uint64_t id)
{
        unsigned n = 0;

        for (size_t i = 0; i < c->n; i++)
                if (c->log[i].rep.type != WIRE_REP_EVENT && c->log[i].rep.id == id)
                        n++;
        return n;
}

static unsigned count_events(const struct client *c, enum wire_event_kind kind)
{
        unsigned n = 0;

        for (size_t i = 0; i < c->n; i++)
                if (c->log[i].rep.type == WIRE_REP_EVENT && c->log[i].rep.event.kind == kind)
                        n++;
        return n;
}

static unsigned count_all_events(const struct client *c)
{
        unsigned n = 0;

        for (size_t i = 0; i < c->n; i++)
                if (c->log[i].rep.type == WIRE_REP_EVENT)
                        n++;
        return n;
}

/* Events of a kind about a name (watch events). */
static unsigned count_name_events(const struct client *c, enum wire_event_kind kind,
                                  const char *name)
{
        unsigned n = 0;

        for (size_t i = 0; i < c->n; i++) {
                const struct wire_reply *r = &c->log[i].rep;
                if (r->type == WIRE_REP_EVENT && r->event.kind == kind &&
                    strcmp(r->event.name, name) == 0)
                        n++;
        }
        return n;
}

/* The last event of a kind about a name, or NULL. */
static const struct wire_reply *last_name_event(const struct client *c, enum wire_event_kind kind,
                                                const char *name)
{
        for (size_t i = c->n; i-- > 0;) {
                const struct wire_reply *r = &c->log[i].rep;
                if (r->type == WIRE_REP_EVENT && r->event.kind == kind &&
                    strcmp(r->event.name, name) == 0)
                        return r;
        }
        return NULL;
}

static unsigned count_released(const struct client *c, uint64_t token)
{
        unsigned n = 0;

        for (size_t i = 0; i < c->n; i++) {
                const struct wire_reply *r = &c->log[i].rep;
                if (r->type == WIRE_REP_EVENT && r->event.kind == WIRE_EVENT_RELEASED &&
                    r->event.token == token)
                        n++;
        }
        return n;
}

static unsigned count_gone(const struct client *c, uint64_t segment)
{
        unsigned n = 0;

        for (size_t i = 0; i < c->n; i++) {
                const struct wire_reply *r = &c->log[i].rep;
                if (r->type == WIRE_REP_EVENT && r->event.kind == WIRE_EVENT_SEGMENT_GONE &&
                    r->event.segment == segment)
                        n++;
        }
        return n;
}

/* The reply must exist, be OK and have the given type. */
static const struct sent *expect_ok(const struct sent *r, enum wire_reply_type type)
{
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->rep.status == WIRE_OK, "status %d: %s", r->rep.status, r->rep.error);
        ck_assert_int_eq(r->rep.type, type);
        return r;
}

/* The reply must exist and be a status-only failure with exactly this status. */
static void expect_status(const struct sent *r, enum wire_status status)
{
        ck_assert_ptr_nonnull(r);
        ck_assert_msg(r->rep.status == (int)status, "status %d, expected %d (%s)", r->rep.status,
                      (int)status, r->rep.error);
        ck_assert_int_eq(r->rep.type, WIRE_REP_NONE);
        ck_assert_msg(!r->had_fd, "a failure carried an fd");
        ck_assert_msg(r->rep.error[0] != '\0', "a failure without a message");
}

/* ---- segments and descriptors ------------------------------------------------------------ */

/* A 1-D compact float32 tensor of n elements at offset, length bytes long. */
static void tensor_f32(struct wire_tensor *t, const char *name, int64_t n, uint64_t offset,
                       uint64_t length)
{
        memset(t, 0, sizeof(*t));
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->dtype.code = kDLFloat;
        t->dtype.bits = 32;
        t->dtype.lanes = 1;
        t->ndim = 1;
        t->shape[0] = n;
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->offset = offset;
        t->length = length;
}

/* The registry's handler of each request type but publish and alloc, which take an fd. */
static void (*const handlers[WIRE_REQ_COUNT])(struct session *, const struct wire_request *) = {
        [WIRE_REQ_ACQUIRE] = registry_acquire,     [WIRE_REQ_RELEASE] = registry_release,
        [WIRE_REQ_UNPUBLISH] = registry_unpublish, [WIRE_REQ_LIST] = registry_list,
        [WIRE_REQ_STAT] = registry_stat,           [WIRE_REQ_WATCH] = registry_watch,
        [WIRE_REQ_UNWATCH] = registry_unwatch,     [WIRE_REQ_FREE] = registry_free,
        [WIRE_REQ_FORGET] = registry_forget,       [WIRE_REQ_STATS] = registry_stats,
};

/*
 * Gives req the next id and hands it to its registry handler, with fd (-1:
 * none; publish and alloc only); returns the reply, or NULL for none.
 */
static const struct sent *submit(struct client *c, struct wire_request *req, int fd)
{
        req->id = E.next_id++;
        if (req->type == WIRE_REQ_PUBLISH) {
                registry_publish(c->s, req, fd);
        } else if (req->type == WIRE_REQ_ALLOC) {
                registry_alloc(c->s, req, fd);
        } else {
                ck_assert_int_eq(fd, -1);
                ck_assert_ptr_nonnull(handlers[req->type]);
                handlers[req->type](c->s, req);
        }
        return reply_for(c, req->id);
}

/* ---- requests ---------------------------------------------------------------------------- */

static const struct sent *publish_t(struct client *c, const struct wire_tensor *t, int fd,
                                    bool persist, uint64_t token)
{
        struct wire_request req = {.type = WIRE_REQ_PUBLISH,
                                   .publish = {.tensor = *t, .persist = persist, .token = token}};

        return submit(c, &req, fd);
}

#define SEG_BYTES 64

/* Publishes 16 float32 over a fresh 64-byte memfd; returns the reply (checked OK). */
static const struct sent *publish_flags(struct client *c, const char *name, bool persist,
                                        uint64_t token, uint64_t flags)
{
        struct wire_tensor t;

        tensor_f32(&t, name, 16, 0, SEG_BYTES);
        t.flags = flags;
        return expect_ok(publish_t(c, &t, sealed_memfd(SEG_BYTES), persist, token),
                         WIRE_REP_PUBLISH);
}

static const struct sent *publish(struct client *c, const char *name, bool persist, uint64_t token)
{
        return publish_flags(c, name, persist, token, 0);
}

/* Publishes 16 float32 at offset 0 of a segment the session allocated (no fd). */
static const struct sent *publish_seg(struct client *c, const char *name, uint64_t segment,
                                      uint64_t flags, uint64_t token)
{
        struct wire_tensor t;

        tensor_f32(&t, name, 16, 0, SEG_BYTES);
        t.segment = segment;
        t.flags = flags;
        return publish_t(c, &t, -1, false, token);
}

/* Returns the reply, or NULL when the acquire is waiting. */
static const struct sent *acquire(struct client *c, const char *name, uint64_t min_version,
                                  int64_t timeout_ms, uint64_t *ret_id)
{
        struct wire_request req = {
                .type = WIRE_REQ_ACQUIRE,
                .acquire = {.min_version = min_version, .timeout_ms = timeout_ms}};
        const struct sent *r;

        snprintf(req.acquire.name, sizeof(req.acquire.name), "%s", name);
        r = submit(c, &req, -1);
        if (ret_id)
                *ret_id = req.id;
        return r;
}

/* An immediate acquire that must succeed; returns the reply. */
static const struct sent *acquire_ok(struct client *c, const char *name)
{
        const struct sent *r = expect_ok(acquire(c, name, 0, 0, NULL), WIRE_REP_ACQUIRE);
        ck_assert_uint_ne(r->rep.acquire.lease, 0);
        return r;
}

/* Success is silent: returns NULL then. */
static const struct sent *release(struct client *c, uint64_t lease)
{
        struct wire_request req = {.type = WIRE_REQ_RELEASE, .release.lease = lease};

        return submit(c, &req, -1);
}

static void release_ok(struct client *c, uint64_t lease)
{
        const struct sent *r = release(c, lease);
        ck_assert_msg(!r, "release of lease %llu answered: status %d (%s)",
                      (unsigned long long)lease, r ? r->rep.status : 0, r ? r->rep.error : "");
}

static const struct sent *unpublish(struct client *c, const char *name)
{
        struct wire_request req = {.type = WIRE_REQ_UNPUBLISH};

        snprintf(req.unpublish.name, sizeof(req.unpublish.name), "%s", name);
        return submit(c, &req, -1);
}

static const struct sent *list(struct client *c, const char *prefix, const char *after,
                               uint32_t limit)
{
        struct wire_request req = {.type = WIRE_REQ_LIST};

        snprintf(req.list.prefix, sizeof(req.list.prefix), "%s", prefix);
        snprintf(req.list.after, sizeof(req.list.after), "%s", after);
        req.list.limit = limit;
        return submit(c, &req, -1);
}

static const struct sent *stat_(struct client *c, const char *name)
{
        struct wire_request req = {.type = WIRE_REQ_STAT};

        snprintf(req.stat.name, sizeof(req.stat.name), "%s", name);
        return submit(c, &req, -1);
}

static const struct wire_info *stat_ok(struct client *c, const char *name)
{
        return &expect_ok(stat_(c, name), WIRE_REP_STAT)->rep.stat.info;
}

static uint64_t watch(struct client *c, const char *prefix)
{
        struct wire_request req = {.type = WIRE_REQ_WATCH};
        const struct sent *r;

        snprintf(req.watch.prefix, sizeof(req.watch.prefix), "%s", prefix);
        r = expect_ok(submit(c, &req, -1), WIRE_REP_WATCH);
        ck_assert_uint_ne(r->rep.watch.watch, 0);
        return r->rep.watch.watch;
}

static const struct sent *unwatch(struct client *c, uint64_t id)
{
        struct wire_request req = {.type = WIRE_REQ_UNWATCH, .unwatch.watch = id};

        return submit(c, &req, -1);
}

static const struct sent *alloc(struct client *c, uint64_t size)
{
        struct wire_request req = {.type = WIRE_REQ_ALLOC, .alloc.size = size};

        return submit(c, &req, -1);
}

static uint64_t alloc_ok(struct client *c, uint64_t size)
{
        const struct sent *r = expect_ok(alloc(c, size), WIRE_REP_ALLOC);

        ck_assert_uint_ne(r->rep.alloc.segment, 0);
        ck_assert_uint_eq(r->rep.alloc.size, size);
        ck_assert(r->had_fd && r->fd_valid && r->fd_cloexec);
        ck_assert_int_eq(r->fd_accmode, O_RDWR);
        ck_assert_int_eq(r->fd_size, (int64_t)size);
        return r->rep.alloc.segment;
}

static const struct sent *free_seg(struct client *c, uint64_t segment)
{
        struct wire_request req = {.type = WIRE_REQ_FREE, .free.segment = segment};

        return submit(c, &req, -1);
}

static const struct sent *forget(struct client *c, uint64_t segment)
{
        struct wire_request req = {.type = WIRE_REQ_FORGET,
                                   .forget = {.segments = {segment}, .count = 1}};

        return submit(c, &req, -1);
}

static struct wire_stats stats(struct client *c)
{
        struct wire_request req = {.type = WIRE_REQ_STATS};

        return expect_ok(submit(c, &req, -1), WIRE_REP_STATS)->rep.stats;
}

/* ---- publish, republish, watch events ---------------------------------------------------- */

static unsigned defer_asked;

static void count_defer(void *ctx)
{
        (void)ctx;
        defer_asked++;
}

/*
 * Descriptors of destroyed big segments wait to be closed, and are then
 * closed off the loop: neither counts against max_fds, so together they are
 * at most STORE_DEFER_MAX, however many are destroyed before a close runs.
 */
START_TEST(test_deferred_closes_are_bounded)
{
        struct store *st = &E.store;
        const struct {
                uint64_t size;
                int n;
        } rounds[] = {{STORE_DEFER_BYTES, 3 * STORE_DEFER_MAX}, {STORE_DEFER_BYTES - 1, 8}};
        int base, taken[STORE_DEFER_MAX];
        unsigned ntaken;

        st->max_bytes = st->max_bytes_per_uid = 0;
        st->on_defer = count_defer;
        base = count_fds(0);
        for (size_t r = 0; r < N_ELEMS(rounds); r++) {
                for (int i = 0; i < rounds[r].n; i++) {
                        struct segment *seg;
                        const char *why = NULL;
                        ck_assert_int_eq(store_alloc(st, rounds[r].size, 1000, &seg, &why), 0);
                        segment_unref(st, seg);
                }
        }
        /* big ones wait, up to the bound; the rest, and every small one, closed at once */
        ck_assert_uint_eq(st->ndeferred, STORE_DEFER_MAX);
        ck_assert_uint_gt(defer_asked, 0);
        ck_assert_int_eq(count_fds(0), base + STORE_DEFER_MAX);
        ck_assert_uint_eq(st->fds, 0);
        /* a closer takes the half of them that it will close on another thread */
        ntaken = STORE_DEFER_MAX / 2;
        st->ndeferred -= ntaken;
        memcpy(taken, st->deferred + st->ndeferred, ntaken * sizeof(int));
        st->deferred_closing += ntaken;
        for (int i = 0; i < STORE_DEFER_MAX; i++) {
                struct segment *seg;
                const char *why = NULL;
                ck_assert_int_eq(store_alloc(st, STORE_DEFER_BYTES, 1000, &seg, &why), 0);
                segment_unref(st, seg);
        }
        /* those being closed still count: no more wait than the bound */
        ck_assert_uint_eq(st->ndeferred + st->deferred_closing, STORE_DEFER_MAX);
        ck_assert_int_eq(count_fds(0), base + STORE_DEFER_MAX);
        for (unsigned i = 0; i < ntaken; i++)
                close(taken[i]);
        st->deferred_closing -= ntaken;
        store_close_deferred(st);
        ck_assert_int_eq(count_fds(0), base);
        st->on_defer = NULL;
}
END_TEST

/*
 * Near the descriptor limit (RLIMIT_NOFILE, which another process may lower
 * under dlxd), a destroyed big segment's descriptor closes at once: the
 * descriptors a peer sends next need its room before any closer could run.
 */
START_TEST(test_deferred_closes_not_near_the_fd_limit)
{
        struct store *st = &E.store;
        struct rlimit saved, low;
        struct segment *seg;
        const char *why = NULL;
        int base, next;

        st->max_bytes = st->max_bytes_per_uid = 0;
        st->on_defer = count_defer;
        base = count_fds(0);
        next = dup(0); /* the number the next descriptor gets */
        ck_assert_int_ge(next, 0);
        close(next);
        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
        low = saved;
        low.rlim_cur = (rlim_t)next + 2 * STORE_DEFER_MAX;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
        ck_assert_int_eq(store_alloc(st, STORE_DEFER_BYTES, 1000, &seg, &why), 0);
        segment_unref(st, seg);
        ck_assert_uint_eq(st->ndeferred, 0);
        ck_assert_int_eq(count_fds(0), base);
        /* with room, the same waits for the closer */
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &saved), 0);
        ck_assert_int_eq(store_alloc(st, STORE_DEFER_BYTES, 1000, &seg, &why), 0);
        segment_unref(st, seg);
        ck_assert_uint_eq(st->ndeferred, 1);
        store_close_deferred(st);
        ck_assert_int_eq(count_fds(0), base);
        st->on_defer = NULL;
}
END_TEST

START_TEST(test_publish_versions_and_watch_events)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *wa = client_new(1000, 1000, 101, "watch-a");
        struct client *wb = client_new(1000, 1000, 102, "watch-b");
        struct client *wall = client_new(1001, 1001, 103, "watch-all");
        uint64_t ida = watch(wa, "a/"), idb = watch(wb, "b/"), idall = watch(wall, "");
        const struct sent *r;
        const struct wire_reply *ev;

        ck_assert_uint_ne(ida, idb);
        r = publish(p, "a/x", false, 7);
        ck_assert_uint_eq(r->rep.publish.version, 1);
        ck_assert_uint_ne(r->rep.publish.segment, 0);
        ck_assert(!r->had_fd);

        ev = last_name_event(wa, WIRE_EVENT_PUBLISHED, "a/x");
        ck_assert_ptr_nonnull(ev);
        ck_assert_uint_eq(ev->id, 0);
        ck_assert_uint_eq(ev->event.watch, ida);
        ck_assert_uint_eq(ev->event.version, 1);
        ck_assert_uint_eq(count_all_events(wa), 1);
        ck_assert_uint_eq(count_name_events(wall, WIRE_EVENT_PUBLISHED, "a/x"), 1);
        ck_assert_uint_eq(last_name_event(wall, WIRE_EVENT_PUBLISHED, "a/x")->event.watch, idall);
        ck_assert_uint_eq(count_all_events(wb), 0);

        /* republish: v2, REPLACED; v1 had no lease, so it dies at once */
        r = publish(p, "a/x", false, 8);
        ck_assert_uint_eq(r->rep.publish.version, 2);
        ev = last_name_event(wa, WIRE_EVENT_REPLACED, "a/x");
        ck_assert_ptr_nonnull(ev);
        ck_assert_uint_eq(ev->event.watch, ida);
        ck_assert_uint_eq(ev->event.version, 2);
        ck_assert_uint_eq(count_name_events(wa, WIRE_EVENT_PUBLISHED, "a/x"), 1);
        ck_assert_uint_eq(count_name_events(wa, WIRE_EVENT_REPLACED, "a/x"), 1);
        ck_assert_uint_eq(count_name_events(wall, WIRE_EVENT_REPLACED, "a/x"), 1);
        ck_assert_uint_eq(count_all_events(wb), 0);
        ck_assert_uint_eq(count_released(p, 7), 1);
        ck_assert_uint_eq(count_released(p, 8), 0);

        /* a prefix matches whole-string prefixes only: "a/" does not match "a" or "ab/x" */
        publish(p, "ab/x", false, 9);
        publish(p, "b/y", false, 10);
        ck_assert_uint_eq(count_all_events(wa), 2);
        ck_assert_uint_eq(count_name_events(wb, WIRE_EVENT_PUBLISHED, "b/y"), 1);
        ck_assert_uint_eq(count_all_events(wb), 1);
        ck_assert_uint_eq(count_all_events(wall), 4);

        /* unwatch stops events; an unknown or foreign watch id is NOT_FOUND */
        expect_ok(unwatch(wa, ida), WIRE_REP_NONE);
        expect_status(unwatch(wa, ida), WIRE_NOT_FOUND);
        expect_status(unwatch(wa, idb), WIRE_NOT_FOUND);
        r = publish(p, "a/x", false, 11);
        ck_assert_uint_eq(r->rep.publish.version, 3);
        ck_assert_uint_eq(count_all_events(wa), 2);
        ck_assert_uint_eq(count_name_events(wall, WIRE_EVENT_REPLACED, "a/x"), 2);
        ck_assert_uint_eq(stats(p).watchers, 2);
        /* the producer watches nothing and gets no watch events */
        ck_assert_uint_eq(count_events(p, WIRE_EVENT_PUBLISHED), 0);
        ck_assert_uint_eq(count_events(p, WIRE_EVENT_REPLACED), 0);
}
END_TEST

/* ---- watches: the prefix index ----------------------------------------------------------- */

/* Buckets in the registry's watch index, of every prefix length: one per distinct prefix. */
static size_t index_buckets(void)
{
        size_t n = 0;

        for (size_t l = 0; l <= DLX_NAME_MAX; l++)
                n += E.reg.watches.by_len[l].count;
        return n;
}

/*
 * Everything c was sent from log position from on must be events of kind
 * about name, for the watches want[0..nwant), in that order.
 */
static void expect_events_since(const struct client *c, size_t from, enum wire_event_kind kind,
                                const char *name, const uint64_t *want, size_t nwant)
{
        const char *who = c->s ? c->s->name : "a closed session";
        size_t k = 0;

        for (size_t i = from; i < c->n; i++) {
                const struct wire_reply *r = &c->log[i].rep;

                ck_assert_msg(r->type == WIRE_REP_EVENT, "%s: a reply of type %d among events", who,
                              r->type);
                ck_assert_msg(r->event.kind == kind && strcmp(r->event.name, name) == 0,
                              "%s: event %d about '%s', expected %d about '%s'", who, r->event.kind,
                              r->event.name, kind, name);
                ck_assert_msg(k < nwant, "%s: more than %zu events about '%s'", who, nwant, name);
                ck_assert_msg(r->event.watch == want[k],
                              "%s: event %zu about '%s' for watch %llu, expected %llu", who, k,
                              name, (unsigned long long)r->event.watch,
                              (unsigned long long)want[k]);
                ck_assert_uint_eq(r->id, 0);
                k++;
        }
        ck_assert_msg(k == nwant, "%s: %zu events about '%s', expected %zu", who, k, name, nwant);
}

#define IDS(...)                                                                                   \
        (const uint64_t[]){__VA_ARGS__}, sizeof((uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t)
#define NO_IDS NULL, 0

/* p publishes name; w must hear of it from exactly the watches want, in that order. */
static void publish_heard(struct client *p, const char *name, struct client *w,
                          const uint64_t *want, size_t nwant)
{
        size_t at = w->n;
        uint64_t version = publish(p, name, false, 0)->rep.publish.version;

        expect_events_since(w, at, version == 1 ? WIRE_EVENT_PUBLISHED : WIRE_EVENT_REPLACED, name,
                            want, nwant);
}

/* The same for an unpublish. */
static void unpublish_heard(struct client *p, const char *name, struct client *w,
                            const uint64_t *want, size_t nwant)
{
        size_t at = w->n;

        expect_ok(unpublish(p, name), WIRE_REP_NONE);
        expect_events_since(w, at, WIRE_EVENT_UNPUBLISHED, name, want, nwant);
}

/* A prefix matches a name equal to it, and every name it starts (a string prefix, not a path). */
START_TEST(test_watch_prefix_equal_to_name)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *w = client_new(1000, 1000, 101, "watcher");
        uint64_t id = watch(w, "m/x");

        publish_heard(p, "m/x", w, IDS(id));
        publish_heard(p, "m/x", w, IDS(id)); /* REPLACED */
        publish_heard(p, "m/xy", w, IDS(id));
        unpublish_heard(p, "m/x", w, IDS(id));
        /* one byte short of the prefix, or one different, is no match */
        publish_heard(p, "m/", w, NO_IDS);
        publish_heard(p, "m/y", w, NO_IDS);
        publish_heard(p, "n/x", w, NO_IDS);
        ck_assert_uint_eq(index_buckets(), 1);
}
END_TEST

/* A prefix longer than the name never matches it, however much of it the name shares. */
START_TEST(test_watch_prefix_longer_than_name)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *w = client_new(1000, 1000, 101, "watcher");
        char name[DLX_NAME_MAX + 1];
        uint64_t id;

        watch(w, "long/prefix/");
        publish_heard(p, "long", w, NO_IDS);
        publish_heard(p, "long/prefix", w, NO_IDS);
        /* the longest prefix there is, and a name one byte shorter */
        memset(name, 'z', DLX_NAME_MAX);
        name[DLX_NAME_MAX] = '\0';
        id = watch(w, name);
        name[DLX_NAME_MAX - 1] = '\0';
        publish_heard(p, name, w, NO_IDS);
        name[DLX_NAME_MAX - 1] = 'z';
        publish_heard(p, name, w, IDS(id));
}
END_TEST

/* The empty prefix matches every name, the longest included. */
START_TEST(test_watch_empty_prefix)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *w = client_new(1000, 1000, 101, "watcher");
        uint64_t id = watch(w, "");
        char name[DLX_NAME_MAX + 1];
        size_t at;

        memset(name, 'q', DLX_NAME_MAX);
        name[DLX_NAME_MAX] = '\0';
        publish_heard(p, "x", w, IDS(id));
        publish_heard(p, name, w, IDS(id));
        at = w->n;
        client_close(p); /* its names go, and say so */
        ck_assert_uint_eq(count_name_events(w, WIRE_EVENT_UNPUBLISHED, "x"), 1);
        ck_assert_uint_eq(count_name_events(w, WIRE_EVENT_UNPUBLISHED, name), 1);
        ck_assert_uint_eq(w->n - at, 2);
        ck_assert_uint_eq(E.reg.watches.by_len[0].count, 1);
        ck_assert_uint_eq(index_buckets(), 1);
}
END_TEST

/*
 * One prefix watched by several sessions, and twice by one: a bucket each
 * prefix, an event each watch, in the order the watches were made.
 */
START_TEST(test_watch_one_prefix_many_watches)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *w[4], *twice;
        uint64_t id[4][3], t1, t2;
        size_t at[4];

        for (int i = 0; i < 4; i++)
                w[i] = client_new(1000 + (uid_t)i, 1000, 200 + i, "watcher");
        /* interleaved: ids of one session are not consecutive */
        for (int j = 0; j < 3; j++)
                for (int i = 0; i < 4; i++)
                        id[i][j] = watch(w[i], "many/");
        ck_assert_uint_eq(index_buckets(), 1);
        ck_assert_uint_eq(E.reg.watches.count, 12);
        ck_assert_uint_eq(stats(p).watchers, 12);

        for (int i = 0; i < 4; i++)
                at[i] = w[i]->n;
        publish(p, "many/t", false, 1);
        for (int i = 0; i < 4; i++)
                expect_events_since(w[i], at[i], WIRE_EVENT_PUBLISHED, "many/t",
                                    IDS(id[i][0], id[i][1], id[i][2]));

        /* the same prefix twice by one session: two events, one per watch */
        twice = client_new(1005, 1005, 300, "twice");
        t1 = watch(twice, "two");
        t2 = watch(twice, "two");
        ck_assert_uint_ne(t1, t2);
        ck_assert_uint_eq(index_buckets(), 2);
        publish_heard(p, "two/x", twice, IDS(t1, t2));
        /* either one may go, and the other stays */
        expect_ok(unwatch(twice, t1), WIRE_REP_NONE);
        publish_heard(p, "two/x", twice, IDS(t2));
        ck_assert_uint_eq(index_buckets(), 2);
}
END_TEST

/*
 * Prefixes that are prefixes of each other each match, and a session with
 * several matching watches hears from them in the order it made them, not
 * in the order of their lengths.
 */
START_TEST(test_watch_nested_prefixes)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *w = client_new(1000, 1000, 101, "watcher");
        struct client *v = client_new(1000, 1000, 102, "other");
        uint64_t ab = watch(w, "a/b"), all = watch(w, ""), a = watch(w, "a");
        uint64_t vab = watch(v, "a/b"), aslash = watch(w, "a/"), abcd = watch(w, "a/b/c/d");
        size_t vat = v->n;

        ck_assert_uint_eq(index_buckets(), 5);
        publish_heard(p, "a/b/c", w, IDS(ab, all, a, aslash));
        expect_events_since(v, vat, WIRE_EVENT_PUBLISHED, "a/b/c", IDS(vab));
        publish_heard(p, "a/bc", w, IDS(ab, all, a, aslash));
        publish_heard(p, "a/b/c/d/e", w, IDS(ab, all, a, aslash, abcd));
        publish_heard(p, "a", w, IDS(all, a));
        publish_heard(p, "ab", w, IDS(all, a));
        unpublish_heard(p, "a/b/c", w, IDS(ab, all, a, aslash));
        /* dropping the shortest leaves the longer ones */
        expect_ok(unwatch(w, a), WIRE_REP_NONE);
        expect_ok(unwatch(w, all), WIRE_REP_NONE);
        publish_heard(p, "a/b/c/d/e", w, IDS(ab, aslash, abcd));
        ck_assert_uint_eq(index_buckets(), 3);
}
END_TEST

/* Unwatch and a closing session take watches out of the index: no event after, no bucket left. */
START_TEST(test_watch_removed_from_index)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *a = client_new(1000, 1000, 101, "a");
        struct client *b = client_new(1000, 1000, 102, "b");
        struct client *c;
        uint64_t a1 = watch(a, "u/"), a2 = watch(a, "u/"), b1 = watch(b, "u/");

        watch(b, "v/");
        watch(b, "");
        ck_assert_uint_eq(index_buckets(), 3);
        expect_ok(unwatch(a, a1), WIRE_REP_NONE);
        expect_status(unwatch(a, a1), WIRE_NOT_FOUND);
        /* another session's watch is not ours to end */
        expect_status(unwatch(a, b1), WIRE_NOT_FOUND);
        expect_ok(unwatch(a, a2), WIRE_REP_NONE);
        ck_assert_uint_eq(a->s->nwatches, 0);
        ck_assert_uint_eq(index_buckets(), 3); /* b's "u/" keeps the bucket */
        publish_heard(p, "u/x", a, NO_IDS);
        ck_assert_uint_eq(count_name_events(b, WIRE_EVENT_PUBLISHED, "u/x"), 2);

        client_close(b);
        ck_assert_uint_eq(index_buckets(), 0);
        ck_assert_uint_eq(E.reg.watches.count, 0);
        ck_assert_uint_eq(stats(p).watchers, 0);
        publish_heard(p, "u/x", a, NO_IDS);
        publish_heard(p, "v/y", a, NO_IDS);
        /* a session closing with its watches and its names: it hears nothing of its own */
        c = client_new(1000, 1000, 103, "c");
        watch(c, "c/");
        publish(c, "c/own", false, 4);
        client_close(c);
        ck_assert_uint_eq(index_buckets(), 0);
}
END_TEST

/* A bucket emptied is freed; a watch of its prefix later makes a new one, which works. */
START_TEST(test_watch_bucket_emptied_and_refilled)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *w = client_new(1000, 1000, 101, "watcher");
        struct client *x = client_new(1000, 1000, 102, "other");
        uint64_t first = watch(w, "r/"), again, third;

        expect_ok(unwatch(w, first), WIRE_REP_NONE);
        ck_assert_uint_eq(index_buckets(), 0);
        publish_heard(p, "r/x", w, NO_IDS);

        again = watch(w, "r/");
        ck_assert_uint_gt(again, first); /* ids are never reused */
        ck_assert_uint_eq(index_buckets(), 1);
        publish_heard(p, "r/x", w, IDS(again));

        /* emptied by a closing session, refilled by another */
        client_close(w);
        ck_assert_uint_eq(index_buckets(), 0);
        third = watch(x, "r/");
        publish_heard(p, "r/x", x, IDS(third));
}
END_TEST

/* --max-watches: the same refusal as ever, and the index untouched by it. */
START_TEST(test_watch_limit)
{
        struct client *w = client_new(1000, 1000, 101, "watcher");
        struct client *o = client_new(1000, 1000, 102, "other");
        struct wire_request req;
        const struct sent *r;
        uint64_t first = 0;

        for (unsigned i = 0; i < DLX_DEFAULT_MAX_WATCHES; i++) {
                char prefix[32];
                snprintf(prefix, sizeof(prefix), "lim/%u", i);
                uint64_t id = watch(w, prefix);
                if (i == 0)
                        first = id;
        }
        req = (struct wire_request){.type = WIRE_REQ_WATCH};
        snprintf(req.watch.prefix, sizeof(req.watch.prefix), "lim/over");
        r = submit(w, &req, -1);
        expect_status(r, WIRE_LIMIT);
        ck_assert_str_eq(r->rep.error, "this client has 256 watches already (the limit)");
        ck_assert_uint_eq(index_buckets(), DLX_DEFAULT_MAX_WATCHES);
        ck_assert_uint_eq(E.reg.watches.count, DLX_DEFAULT_MAX_WATCHES);
        /* the limit is per client, and an unwatch makes room */
        watch(o, "lim/over");
        expect_ok(unwatch(w, first), WIRE_REP_NONE);
        watch(w, "lim/over");
        ck_assert_uint_eq(index_buckets(), DLX_DEFAULT_MAX_WATCHES);
}
END_TEST

/*
 * The index against a scan of every watch, which is what it replaces:
 * random watches, unwatches, closing sessions and publishes over prefixes
 * and names that nest, share bytes and miss by one; after each publish every
 * session must have heard exactly from the watches a scan would find, in
 * the order of their ids.
 */
START_TEST(test_watch_index_matches_a_scan)
{
        static const char *const prefixes[] = {"",   "a", "a/",  "a/b",     "a/b/", "a/bc",
                                               "ab", "b", "b/a", "a/b/c/d", "c/"};
        static const char *const names[] = {"a", "ab",  "a/b",     "a/bc", "a/b/c",
                                            "b", "b/a", "a/b/c/d", "c",    "a/b/c/de"};
        enum { NPREFIXES = N_ELEMS(prefixes), NNAMES = N_ELEMS(names), NW = 6, MAXW = 512 };
        struct {
                int who;      /* the slot in w[] */
                unsigned gen; /* which session in that slot: a closed one's are dead */
                uint64_t id;
                const char *prefix;
                bool live;
        } model[MAXW];
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *w[NW];
        unsigned gen[NW] = {0}, seed = 20261201;
        size_t nmodel = 0, distinct = 0;
        int reopen = MAX_CLIENTS - 1 - NW;

        for (int i = 0; i < NW; i++)
                w[i] = client_new(1000, 1000, 200 + i, "watcher");
        for (int step = 0; step < 3000; step++) {
                int op = rand_r(&seed) % 16, k = rand_r(&seed) % NW;

                if (op < 5 && nmodel < MAXW && w[k]->s->nwatches < 12) {
                        const char *prefix = prefixes[rand_r(&seed) % NPREFIXES];
                        model[nmodel].who = k;
                        model[nmodel].gen = gen[k];
                        model[nmodel].prefix = prefix;
                        model[nmodel].live = true;
                        model[nmodel++].id = watch(w[k], prefix);
                } else if (op < 8 && nmodel > 0) {
                        size_t m = (size_t)rand_r(&seed) % nmodel;
                        bool mine = model[m].who == k && model[m].gen == gen[k];
                        const struct sent *r = unwatch(w[k], model[m].id);
                        if (mine && model[m].live) {
                                expect_ok(r, WIRE_REP_NONE);
                                model[m].live = false;
                        } else {
                                expect_status(r, WIRE_NOT_FOUND);
                        }
                } else if (op < 9 && reopen > 0) {
                        client_close(w[k]);
                        for (size_t m = 0; m < nmodel; m++)
                                if (model[m].who == k && model[m].gen == gen[k])
                                        model[m].live = false;
                        w[k] = client_new(1000, 1000, 300 + step, "watcher");
                        gen[k]++;
                        reopen--;
                } else {
                        const char *name = names[rand_r(&seed) % NNAMES];
                        size_t at[NW];
                        enum wire_event_kind kind;
                        uint64_t want[MAXW];

                        for (int i = 0; i < NW; i++) {
                                if (w[i]->n > LOG_CAP / 2)
                                        log_clear(w[i]);
                                at[i] = w[i]->n;
                        }
                        if (p->n > LOG_CAP / 2)
                                log_clear(p);
                        if (op == 15) {
                                const struct sent *r = unpublish(p, name);
                                if (r->rep.status != WIRE_OK)
                                        continue; /* nothing there: nothing to hear */
                                kind = WIRE_EVENT_UNPUBLISHED;
                        } else {
                                kind = publish(p, name, false, 0)->rep.publish.version == 1
                                               ? WIRE_EVENT_PUBLISHED
                                               : WIRE_EVENT_REPLACED;
                        }
                        for (int i = 0; i < NW; i++) {
                                size_t n = 0;
                                for (size_t m = 0; m < nmodel; m++)
                                        if (model[m].live && model[m].who == i &&
                                            model[m].gen == gen[i] &&
                                            strncmp(model[m].prefix, name,
                                                    strlen(model[m].prefix)) == 0)
                                                want[n++] = model[m].id;
                                expect_events_since(w[i], at[i], kind, name, want, n);
                        }
                }
        }
        /* one bucket per distinct prefix still watched, and nothing else */
        for (size_t i = 0; i < NPREFIXES; i++) {
                bool used = false;
                for (size_t m = 0; m < nmodel; m++)
                        used |= model[m].live && model[m].prefix == prefixes[i];
                distinct += used;
        }
        ck_assert_uint_gt(distinct, 0);
        ck_assert_uint_eq(index_buckets(), distinct);
}
END_TEST

/* ---- acquire and fd passing -------------------------------------------------------------- */

START_TEST(test_acquire_fd_once_then_after_forget)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *c = client_new(1001, 1001, 200, "consumer");
        struct client *c2 = client_new(1001, 1001, 201, "consumer2");
        const struct sent *pub = publish(p, "t", false, 1), *r1, *r2, *r3, *r4;
        uint64_t seg = pub->rep.publish.segment;

        r1 = acquire_ok(c, "t");
        ck_assert(r1->had_fd);
        ck_assert(r1->fd_valid);
        ck_assert(r1->fd_cloexec);
        ck_assert_int_eq(r1->fd_size, SEG_BYTES);
        ck_assert(r1->rep.acquire.writable);
        ck_assert_int_eq(r1->fd_accmode, O_RDWR);
        ck_assert_uint_eq(r1->rep.acquire.segment_size, SEG_BYTES);
        /* the descriptor comes back as published, with the daemon's version and segment */
        ck_assert_str_eq(r1->rep.acquire.tensor.name, "t");
        ck_assert_uint_eq(r1->rep.acquire.tensor.version, 1);
        ck_assert_uint_eq(r1->rep.acquire.tensor.segment, seg);
        ck_assert_uint_eq(r1->rep.acquire.tensor.dtype.code, kDLFloat);
        ck_assert_uint_eq(r1->rep.acquire.tensor.dtype.bits, 32);
        ck_assert_uint_eq(r1->rep.acquire.tensor.dtype.lanes, 1);
        ck_assert_int_eq(r1->rep.acquire.tensor.ndim, 1);
        ck_assert_int_eq(r1->rep.acquire.tensor.shape[0], 16);
        ck_assert_int_eq(r1->rep.acquire.tensor.strides[0], 1);
        ck_assert_int_eq(r1->rep.acquire.tensor.device_type, kDLCPU);
        ck_assert_uint_eq(r1->rep.acquire.tensor.storage, WIRE_STORAGE_MEMFD);
        ck_assert_uint_eq(r1->rep.acquire.tensor.offset, 0);
        ck_assert_uint_eq(r1->rep.acquire.tensor.length, SEG_BYTES);
        ck_assert_uint_eq(r1->rep.acquire.tensor.flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);

        /* the same session already holds the fd: none this time, a new lease */
        r2 = acquire_ok(c, "t");
        ck_assert(!r2->had_fd);
        ck_assert(r2->rep.acquire.writable);
        ck_assert_uint_ne(r2->rep.acquire.lease, r1->rep.acquire.lease);
        ck_assert_uint_eq(r2->rep.acquire.tensor.segment, seg);

        /* another session gets its own copy */
        r3 = acquire_ok(c2, "t");
        ck_assert(r3->had_fd && r3->fd_valid);

        /* after forget, the fd comes again, once */
        expect_ok(forget(c, seg), WIRE_REP_NONE);
        r4 = acquire_ok(c, "t");
        ck_assert(r4->had_fd && r4->fd_valid);
        ck_assert(!acquire_ok(c, "t")->had_fd);
        /* forgetting an unknown segment is fine */
        expect_ok(forget(c, 999), WIRE_REP_NONE);

        ck_assert_uint_eq(stats(c).leases, 5);
        ck_assert_uint_eq(stat_ok(c, "t")->leases, 5);
}
END_TEST

START_TEST(test_read_only_and_writable)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *c = client_new(1001, 1001, 200, "consumer");
        struct client *c2 = client_new(1001, 1001, 201, "consumer2");
        const struct sent *r;
        struct wire_tensor t;
        uint64_t seg, seg2;

        publish_flags(p, "ro", false, 1, DLPACK_FLAG_BITMASK_READ_ONLY);
        publish_flags(p, "rw", false, 2, 0);

        r = acquire_ok(c, "ro");
        ck_assert(!r->rep.acquire.writable);
        ck_assert(r->rep.acquire.tensor.flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert(r->had_fd && r->fd_valid && r->fd_cloexec);
        /* sealed: no fd, reopened or not, maps a read-only version writable */
        ck_assert(!r->fd_maps_writable);

        r = acquire_ok(c, "rw");
        ck_assert(r->rep.acquire.writable);
        ck_assert_uint_eq(r->rep.acquire.tensor.flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
        ck_assert(r->had_fd);
        ck_assert(r->fd_maps_writable);

        /* a memfd sealed against writes cannot carry a writable version, and says why */
        tensor_f32(&t, "sealed", 16, 0, SEG_BYTES);
        r = publish_t(p, &t, make_memfd(SEG_BYTES, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE),
                      false, 3);
        expect_status(r, WIRE_BUSY);
        ck_assert_ptr_nonnull(strstr(r->rep.error, "sealed against writing"));
        t.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        expect_ok(publish_t(p, &t,
                            make_memfd(SEG_BYTES, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE),
                            false, 3),
                  WIRE_REP_PUBLISH);
        r = acquire_ok(c, "sealed");
        ck_assert(!r->rep.acquire.writable);
        ck_assert(r->rep.acquire.tensor.flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert(r->had_fd && r->fd_valid && !r->fd_maps_writable);

        /*
         * One segment cannot carry both: once a read-only version sealed it,
         * a writable one is refused; once a writable one went out (readers
         * may map it writable), a read-only one is.
         */
        seg = alloc_ok(p, SEG_BYTES);
        expect_ok(publish_seg(p, "seg/ro", seg, DLPACK_FLAG_BITMASK_READ_ONLY, 4),
                  WIRE_REP_PUBLISH);
        expect_status(publish_seg(p, "seg/rw", seg, 0, 5), WIRE_BUSY);
        r = acquire_ok(c, "seg/ro");
        ck_assert(r->had_fd && !r->rep.acquire.writable && !r->fd_maps_writable);
        r = acquire_ok(c2, "seg/ro");
        ck_assert(r->had_fd && !r->fd_maps_writable);
        ck_assert(!acquire_ok(c2, "seg/ro")->had_fd);

        seg2 = alloc_ok(p, SEG_BYTES);
        expect_ok(publish_seg(p, "seg2/rw", seg2, 0, 6), WIRE_REP_PUBLISH);
        r = publish_seg(p, "seg2/ro", seg2, DLPACK_FLAG_BITMASK_READ_ONLY, 7);
        expect_status(r, WIRE_BUSY);
        ck_assert_ptr_nonnull(strstr(r->rep.error, "writable version"));
        r = acquire_ok(c, "seg2/rw");
        ck_assert(r->had_fd && r->rep.acquire.writable && r->fd_maps_writable);
        ck_assert(!acquire_ok(c, "seg2/rw")->had_fd);

        /* the allocating session already holds the fd */
        ck_assert(!acquire_ok(p, "seg2/rw")->had_fd);
        ck_assert(!acquire_ok(p, "seg/ro")->had_fd);
}
END_TEST

/* ---- lifetimes: replace and unpublish while leased --------------------------------------- */

START_TEST(test_replace_while_leased)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *c = client_new(1001, 1001, 200, "consumer");
        const struct sent *r;
        uint64_t lease1, lease2;
        struct wire_stats st;

        publish(p, "x", false, 11);
        r = acquire_ok(c, "x");
        lease1 = r->rep.acquire.lease;
        ck_assert_uint_eq(r->rep.acquire.tensor.version, 1);

        r = publish(p, "x", false, 12);
        ck_assert_uint_eq(r->rep.publish.version, 2);
        /* v1 is leased: alive, no RELEASED yet */
        ck_assert_uint_eq(count_events(p, WIRE_EVENT_RELEASED), 0);
        st = stats(p);
        ck_assert_uint_eq(st.versions, 2);
        ck_assert_uint_eq(st.segments, 2);
        ck_assert_uint_eq(st.bytes, 2 * SEG_BYTES);
        ck_assert_uint_eq(stat_ok(p, "x")->live_versions, 2);
        ck_assert_uint_eq(stat_ok(p, "x")->tensor.version, 2);
        ck_assert_uint_eq(stat_ok(p, "x")->leases, 0);

        r = acquire_ok(c, "x");
        lease2 = r->rep.acquire.lease;
        ck_assert_uint_eq(r->rep.acquire.tensor.version, 2);
        ck_assert(r->had_fd); /* a different segment */

        release_ok(c, lease1);
        ck_assert_uint_eq(count_released(p, 11), 1);
        ck_assert_uint_eq(count_events(p, WIRE_EVENT_RELEASED), 1);
        r = &p->log[p->n - 1];
        ck_assert_int_eq(r->rep.type, WIRE_REP_EVENT);
        ck_assert_int_eq(r->rep.event.kind, WIRE_EVENT_RELEASED);
        ck_assert_str_eq(r->rep.event.name, "x");
        ck_assert_uint_eq(r->rep.event.version, 1);
        ck_assert_uint_eq(r->rep.event.token, 11);
        ck_assert_uint_ne(r->rep.event.segment, 0);
        st = stats(p);
        ck_assert_uint_eq(st.versions, 1);
        ck_assert_uint_eq(st.leases, 1);
        ck_assert_uint_eq(st.segments, 1);
        ck_assert_uint_eq(stat_ok(p, "x")->live_versions, 1);

        /* releasing it again is NOT_FOUND and releases nothing more */
        expect_status(release(c, lease1), WIRE_NOT_FOUND);
        ck_assert_uint_eq(count_released(p, 11), 1);
        /* the current version survives its last lease */
        release_ok(c, lease2);
        ck_assert_uint_eq(count_released(p, 12), 0);
        ck_assert_uint_eq(stats(p).versions, 1);
        ck_assert_uint_eq(acquire_ok(c, "x")->rep.acquire.tensor.version, 2);
}
END_TEST

START_TEST(test_unpublish_while_leased)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *c = client_new(1001, 1001, 200, "consumer");
        struct client *w = client_new(1002, 1002, 300, "watcher");
        uint64_t wid = watch(w, "u");
        const struct wire_reply *ev;
        uint64_t lease, seg;
        struct wire_stats st;

        seg = publish(p, "u", false, 21)->rep.publish.segment;
        lease = acquire_ok(c, "u")->rep.acquire.lease;

        expect_ok(unpublish(p, "u"), WIRE_REP_NONE);
        ev = last_name_event(w, WIRE_EVENT_UNPUBLISHED, "u");
        ck_assert_ptr_nonnull(ev);
        ck_assert_uint_eq(ev->event.watch, wid);
        ck_assert_uint_eq(ev->event.version, 1);
        ck_assert_uint_eq(count_name_events(w, WIRE_EVENT_UNPUBLISHED, "u"), 1);
        /* gone from the namespace, alive for its lease */
        expect_status(stat_(p, "u"), WIRE_NOT_FOUND);
        expect_status(acquire(c, "u", 0, 0, NULL), WIRE_NOT_FOUND);
        expect_status(unpublish(p, "u"), WIRE_NOT_FOUND);
        ck_assert_uint_eq(list(c, "", "", 0)->rep.list.count, 0);
        ck_assert_uint_eq(count_released(p, 21), 0);
        st = stats(p);
        ck_assert_uint_eq(st.versions, 1);
        ck_assert_uint_eq(st.segments, 1);
        ck_assert_uint_eq(st.leases, 1);

        release_ok(c, lease);
        ck_assert_uint_eq(count_released(p, 21), 1);
        ck_assert_uint_eq(count_events(p, WIRE_EVENT_RELEASED), 1);
        /* the consumer held the segment's fd: it is told the segment is gone */
        ck_assert_uint_eq(count_gone(c, seg), 1);
        st = stats(p);
        ck_assert_uint_eq(st.names, 0);
        ck_assert_uint_eq(st.versions, 0);
        ck_assert_uint_eq(st.segments, 0);
        ck_assert_uint_eq(st.bytes, 0);
        ck_assert_uint_eq(st.leases, 0);

        /* unpublish with no lease: the version dies at once */
        publish(p, "u2", false, 22);
        expect_ok(unpublish(p, "u2"), WIRE_REP_NONE);
        ck_assert_uint_eq(count_released(p, 22), 1);
        ck_assert_uint_eq(stats(p).versions, 0);
        /* a token of 0 asks for no RELEASED */
        publish(p, "u3", false, 0);
        expect_ok(unpublish(p, "u3"), WIRE_REP_NONE);
        ck_assert_uint_eq(count_events(p, WIRE_EVENT_RELEASED), 2);
}
END_TEST

/* ---- ownership --------------------------------------------------------------------------- */

START_TEST(test_unpublish_permissions)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *same = client_new(1000, 1000, 101, "same-uid");
        struct client *other = client_new(1001, 1001, 200, "other");
        struct client *root = client_new(0, 0, 1, "root");

        publish(p, "perm", false, 1);
        publish(p, "perm2", false, 2);

        expect_status(unpublish(other, "perm"), WIRE_PERMISSION);
        ck_assert_uint_eq(stat_ok(other, "perm")->tensor.version, 1);
        ck_assert_uint_eq(count_released(p, 1), 0);

        expect_status(unpublish(other, "nope"), WIRE_NOT_FOUND);

        expect_ok(unpublish(root, "perm"), WIRE_REP_NONE);
        expect_status(stat_(other, "perm"), WIRE_NOT_FOUND);
        ck_assert_uint_eq(count_released(p, 1), 1);

        /* the owner is a uid, not a session */
        expect_ok(unpublish(same, "perm2"), WIRE_REP_NONE);
        ck_assert_uint_eq(count_released(p, 2), 1);
}
END_TEST

START_TEST(test_publish_permissions)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *same = client_new(1000, 1000, 101, "same-uid");
        struct client *other = client_new(1001, 1001, 200, "other");
        struct client *root = client_new(0, 0, 1, "root");
        struct wire_tensor t;
        const struct sent *r;
        int fd;

        publish(p, "owned", false, 1);

        tensor_f32(&t, "owned", 16, 0, SEG_BYTES);
        fd = sealed_memfd(SEG_BYTES);
        expect_status(publish_t(other, &t, fd, false, 2), WIRE_PERMISSION);
        /* the fd was consumed: closed */
        ck_assert(!fd_is_open(fd));
        ck_assert_uint_eq(stat_ok(p, "owned")->tensor.version, 1);
        ck_assert_uint_eq(stats(p).segments, 1);

        /* by segment id too */
        {
                uint64_t seg = alloc_ok(other, SEG_BYTES);
                expect_status(publish_seg(other, "owned", seg, 0, 3), WIRE_PERMISSION);
                ck_assert_uint_eq(stats(p).segments, 2);
                expect_ok(free_seg(other, seg), WIRE_REP_NONE);
        }

        r = publish(same, "owned", false, 4);
        ck_assert_uint_eq(r->rep.publish.version, 2);
        r = publish(root, "owned", false, 5);
        ck_assert_uint_eq(r->rep.publish.version, 3);
        /* replacing does not transfer the name */
        ck_assert_uint_eq(stat_ok(p, "owned")->owner_uid, 1000);
        expect_status(publish_t(other, &t, sealed_memfd(SEG_BYTES), false, 6), WIRE_PERMISSION);
        ck_assert_uint_eq(stats(p).segments, 1);

        /* once unpublished, the name is free for anyone */
        expect_ok(unpublish(p, "owned"), WIRE_REP_NONE);
        r = publish(other, "owned", false, 7);
        ck_assert_uint_eq(stat_ok(p, "owned")->owner_uid, 1001);
        expect_status(unpublish(p, "owned"), WIRE_PERMISSION);
}
END_TEST

/* ---- session close ------------------------------------------------------------------------ */

START_TEST(test_session_free_releases_and_unpublishes)
{
        struct client *q = client_new(1000, 1000, 100, "q");
        struct client *p = client_new(1000, 1000, 101, "p");
        struct client *c = client_new(1001, 1001, 200, "c");
        struct client *d = client_new(1001, 1001, 201, "d");
        struct client *w = client_new(1002, 1002, 300, "w");
        uint64_t lease_np;
        const struct wire_info *info;
        struct wire_stats st;

        watch(w, "");

        /* closing a session releases its leases: an old version dies, its producer hears */
        publish(q, "q", false, 41);
        acquire_ok(c, "q");
        acquire_ok(c, "q");
        publish(q, "q", false, 42);
        ck_assert_uint_eq(count_released(q, 41), 0);
        client_close(c);
        ck_assert_uint_eq(count_released(q, 41), 1);
        ck_assert_uint_eq(count_released(q, 42), 0);
        st = stats(q);
        ck_assert_uint_eq(st.leases, 0);
        ck_assert_uint_eq(st.versions, 1);
        ck_assert_uint_eq(st.clients, 4);

        /* closing a producer: non-persistent versions go, persistent ones stay */
        publish(p, "np", false, 31);
        publish(p, "per", true, 32);
        lease_np = acquire_ok(d, "np")->rep.acquire.lease;
        client_close(p);
        ck_assert_uint_eq(count_name_events(w, WIRE_EVENT_UNPUBLISHED, "np"), 1);
        ck_assert_uint_eq(last_name_event(w, WIRE_EVENT_UNPUBLISHED, "np")->event.version, 1);
        ck_assert_uint_eq(count_name_events(w, WIRE_EVENT_UNPUBLISHED, "per"), 0);
        ck_assert_uint_eq(count_events(w, WIRE_EVENT_UNPUBLISHED), 1);
        expect_status(stat_(d, "np"), WIRE_NOT_FOUND);
        expect_status(acquire(d, "np", 0, 0, NULL), WIRE_NOT_FOUND);

        info = stat_ok(d, "per");
        ck_assert(info->persist);
        ck_assert_uint_eq(info->owner_uid, 1000);
        ck_assert_int_eq(info->producer_pid, 0);
        ck_assert_uint_eq(acquire_ok(d, "per")->rep.acquire.tensor.version, 1);

        /* the leased non-persistent version is still alive for d */
        st = stats(d);
        ck_assert_uint_eq(st.versions, 3); /* q v2, np v1 (leased), per v1 */
        release_ok(d, lease_np);
        ck_assert_uint_eq(stats(d).versions, 2);

        /* the persistent name can be taken over only by its owner's uid */
        {
                struct client *p2 = client_new(1000, 1000, 102, "p2");
                ck_assert_uint_eq(publish(p2, "per", false, 33)->rep.publish.version, 2);
                client_close(p2);
                expect_status(stat_(d, "per"), WIRE_NOT_FOUND);
        }

        /* a closed session's watches are gone */
        client_close(w);
        ck_assert_uint_eq(stats(d).watchers, 0);
        publish(q, "after", false, 43);
}
END_TEST

/*
 * A producer that leases its own versions, publishes from its own allocation
 * and waits and watches, all at once: closing it must untangle everything
 * it holds in one pass, and send it nothing.
 */
START_TEST(test_session_free_self_references)
{
        struct client *p = client_new(1000, 1000, 100, "p");
        struct client *c = client_new(1001, 1001, 200, "c");
        uint64_t seg, seg_p, lease, seg_a2;
        struct wire_tensor t;
        size_t before;
        struct wire_stats st;

        seg = alloc_ok(p, SEG_BYTES);
        seg_p = alloc_ok(p, SEG_BYTES);
        expect_ok(publish_seg(p, "self/a", seg, 0, 1), WIRE_REP_PUBLISH);
        acquire_ok(p, "self/a");
        seg_a2 = publish(p, "self/a", false, 2)->rep.publish.segment;
        tensor_f32(&t, "self/p", 16, 0, SEG_BYTES);
        t.segment = seg_p;
        t.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        expect_ok(publish_t(p, &t, -1, true, 3), WIRE_REP_PUBLISH);
        ck_assert_ptr_null(acquire(p, "self/none", 0, 60000, NULL));
        watch(p, "self/");
        watch(c, "");
        lease = acquire_ok(c, "self/a")->rep.acquire.lease;
        acquire_ok(p, "self/a");

        before = p->n;
        client_close(p);
        ck_assert_uint_eq(p->n, before);
        ck_assert_uint_eq(count_name_events(c, WIRE_EVENT_UNPUBLISHED, "self/a"), 1);
        ck_assert_uint_eq(last_name_event(c, WIRE_EVENT_UNPUBLISHED, "self/a")->event.version, 2);
        ck_assert_uint_eq(count_name_events(c, WIRE_EVENT_UNPUBLISHED, "self/p"), 0);
        ck_assert_uint_eq(count_events(c, WIRE_EVENT_SEGMENT_GONE), 0);

        st = stats(c);
        ck_assert_uint_eq(st.versions, 2); /* self/a v2 (c's lease), self/p v1 (persistent) */
        ck_assert_uint_eq(st.segments, 2);
        ck_assert_uint_eq(st.bytes, 2 * SEG_BYTES);
        ck_assert_uint_eq(st.leases, 1);
        ck_assert_uint_eq(st.watchers, 1);
        ck_assert_uint_eq(st.clients, 1);

        release_ok(c, lease);
        ck_assert_uint_eq(count_gone(c, seg_a2), 1);
        st = stats(c);
        ck_assert_uint_eq(st.versions, 1);
        ck_assert_uint_eq(st.segments, 1);
        ck_assert_uint_eq(st.names, 1);
        ck_assert(!acquire_ok(c, "self/p")->rep.acquire.writable);
        ck_assert_uint_eq(stat_ok(c, "self/p")->tensor.segment, seg_p);
}
END_TEST

/* ---- acquire: min_version, waiting, timeouts, limits ------------------------------------- */

START_TEST(test_min_version_no_wait)
{
        struct client *p = client_new(1000, 1000, 100, "p");
        struct client *c = client_new(1001, 1001, 200, "c");

        expect_status(acquire(c, "mv", 0, 0, NULL), WIRE_NOT_FOUND);
        publish(p, "mv", false, 1);
        expect_status(acquire(c, "mv", 2, 0, NULL), WIRE_NOT_FOUND);
        expect_status(acquire(c, "mv", UINT64_MAX, 0, NULL), WIRE_NOT_FOUND);
        ck_assert_uint_eq(expect_ok(acquire(c, "mv", 1, 0, NULL), WIRE_REP_ACQUIRE)
                                  ->rep.acquire.tensor.version,
                          1);
        publish(p, "mv", false, 2);
        ck_assert_uint_eq(expect_ok(acquire(c, "mv", 2, 0, NULL), WIRE_REP_ACQUIRE)
                                  ->rep.acquire.tensor.version,
                          2);
        /* an older min_version gets the current one */
        ck_assert_uint_eq(expect_ok(acquire(c, "mv", 1, 0, NULL), WIRE_REP_ACQUIRE)
                                  ->rep.acquire.tensor.version,
                          2);
        ck_assert_uint_eq(stats(c).leases, 3);
        /* nothing is left waiting */
        ck_assert_uint_eq(c->s->nwaiters, 0);
}
END_TEST

START_TEST(test_waiting_acquire_granted)
{
        struct client *p = client_new(1000, 1000, 100, "p");
        struct client *c = client_new(1001, 1001, 200, "c");
        struct client *c2 = client_new(1001, 1001, 201, "c2");
        struct client *c3 = client_new(1001, 1001, 202, "c3");
        const struct sent *r;
        uint64_t id1, id2, id3;

        ck_assert_ptr_null(acquire(c, "w", 0, 1000, &id1));
        ck_assert_ptr_null(acquire(c2, "w", 2, -1, &id2));
        /* the longest timeout there is must not overflow the timer */
        ck_assert_ptr_null(acquire(c3, "w", 0, INT64_MAX, &id3));
        ck_assert_uint_eq(c->s->nwaiters, 1);
        /* a name only waited for is not listed and cannot be stat'ed */
        ck_assert_uint_eq(list(p, "", "", 0)->rep.list.count, 0);
        expect_status(stat_(p, "w"), WIRE_NOT_FOUND);

        publish(p, "w", false, 1);
        r = expect_ok(reply_for(c, id1), WIRE_REP_ACQUIRE);
        ck_assert_uint_eq(r->rep.acquire.tensor.version, 1);
        ck_assert(r->had_fd && r->fd_valid);
        ck_assert_uint_ne(r->rep.acquire.lease, 0);
        r = expect_ok(reply_for(c3, id3), WIRE_REP_ACQUIRE);
        ck_assert_uint_eq(r->rep.acquire.tensor.version, 1);
        ck_assert_ptr_null(reply_for(c2, id2));
        ck_assert_uint_eq(c->s->nwaiters, 0);
        ck_assert_uint_eq(c2->s->nwaiters, 1);
        ck_assert_uint_eq(stat_ok(p, "w")->leases, 2);

        publish(p, "w", false, 2);
        r = expect_ok(reply_for(c2, id2), WIRE_REP_ACQUIRE);
        ck_assert_uint_eq(r->rep.acquire.tensor.version, 2);
        ck_assert_uint_eq(c2->s->nwaiters, 0);

        /* waiting with a current version below min_version */
        ck_assert_ptr_null(acquire(c, "w", 3, 1000, &id1));
        publish(p, "w", false, 3);
        ck_assert_uint_eq(
                expect_ok(reply_for(c, id1), WIRE_REP_ACQUIRE)->rep.acquire.tensor.version, 3);

        /* granted waiters' timers were stopped: running the loop answers nothing more */
        uv_run(&E.loop, UV_RUN_DEFAULT);
        ck_assert_uint_eq(count_replies_to(c, id1), 1);
        ck_assert_uint_eq(count_replies_to(c3, id3), 1);
        ck_assert_uint_eq(stats(p).publishes, 3);
}
END_TEST

START_TEST(test_waiting_acquire_timeout)
{
        struct client *c = client_new(1001, 1001, 200, "c");
        struct client *gone = client_new(1001, 1001, 201, "gone");
        struct client *p = client_new(1000, 1000, 100, "p");
        uint64_t id, id_gone, t0;
        struct wire_stats st;

        ck_assert_ptr_null(acquire(c, "late", 0, 20, &id));
        ck_assert_ptr_null(acquire(gone, "late", 0, 20, &id_gone));
        /* a session closing with a timed waiter: no reply, no timer left behind */
        client_close(gone);
        ck_assert_uint_eq(count_replies_to(gone, id_gone), 0);

        t0 = uv_now(&E.loop);
        uv_run(&E.loop, UV_RUN_DEFAULT);
        ck_assert_uint_ge(uv_now(&E.loop) - t0, 20);
        expect_status(reply_for(c, id), WIRE_TIMEOUT);
        ck_assert_uint_eq(c->s->nwaiters, 0);
        st = stats(c);
        ck_assert_uint_eq(st.names, 0); /* the placeholder entry went with its waiter */
        ck_assert_uint_eq(st.leases, 0);

        /* timed out with a current version below min_version */
        publish(p, "late", false, 1);
        ck_assert_ptr_null(acquire(c, "late", 5, 20, &id));
        uv_run(&E.loop, UV_RUN_DEFAULT);
        expect_status(reply_for(c, id), WIRE_TIMEOUT);
        ck_assert_uint_eq(stats(c).leases, 0);
        ck_assert_uint_eq(stat_ok(c, "late")->tensor.version, 1);
}
END_TEST

START_TEST(test_waiting_acquire_limit)
{
        struct client *c = client_new(1001, 1001, 200, "c");
        struct client *c2 = client_new(1001, 1001, 201, "c2");
        struct client *p = client_new(1000, 1000, 100, "p");
        char name[32];
        uint64_t id;

        for (int i = 0; i < DLX_MAX_INFLIGHT; i++) {
                snprintf(name, sizeof(name), "lim/%d", i % 8);
                /* half wait forever, half with a timer */
                ck_assert_ptr_null(acquire(c, name, 0, i % 2 ? -1 : 60000, NULL));
        }
        ck_assert_uint_eq(c->s->nwaiters, DLX_MAX_INFLIGHT);
        expect_status(acquire(c, "lim/x", 0, -1, NULL), WIRE_LIMIT);
        expect_status(acquire(c, "lim/0", 0, 1000, NULL), WIRE_LIMIT);
        /* an immediate acquire neither waits nor counts */
        expect_status(acquire(c, "lim/x", 0, 0, NULL), WIRE_NOT_FOUND);
        /* the limit is per session */
        ck_assert_ptr_null(acquire(c2, "lim/0", 0, -1, NULL));

        /* granting some frees room */
        publish(p, "lim/0", false, 1);
        ck_assert_uint_eq(c->s->nwaiters, DLX_MAX_INFLIGHT - DLX_MAX_INFLIGHT / 8);
        ck_assert_uint_eq(stats(p).leases, DLX_MAX_INFLIGHT / 8 + 1);
        ck_assert_ptr_null(acquire(c, "lim/x", 0, -1, &id));
        ck_assert_ptr_null(reply_for(c, id));

        /* closing the session ends all of its waiters and their timers */
        client_close(c);
        client_close(c2);
        ck_assert_uint_eq(stats(p).names, 1);
        ck_assert_uint_eq(stats(p).leases, 0);
}
END_TEST

/* ---- list and stat ------------------------------------------------------------------------ */

static void expect_names(const struct sent *r, const char *const *names, uint32_t count,
                         const char *next)
{
        expect_ok(r, WIRE_REP_LIST);
        ck_assert_uint_eq(r->rep.list.count, count);
        for (uint32_t i = 0; i < count; i++)
                ck_assert_str_eq(r->rep.list.entries[i].tensor.name, names[i]);
        ck_assert_str_eq(r->rep.list.next, next);
}

START_TEST(test_list_prefix_and_pages)
{
        struct client *p = client_new(1000, 1000, 100, "p");
        struct client *c = client_new(1001, 1001, 200, "c");
        static const char *const order[] = {"l/d", "l/a", "m/z", "l/e", "l/c", "l", "l/b"};
        static const char *const page1[] = {"l/a", "l/b"}, *const page2[] = {"l/c", "l/d"},
                                 *const page3[] = {"l/e"};
        static const char *const all[] = {"l", "l/a", "l/b", "l/c", "l/d", "l/e", "m/z"};
        const struct sent *r;
        uint64_t lease;

        for (size_t i = 0; i < N_ELEMS(order); i++)
                publish(p, order[i], i == 2, 100 + i);
        /* names without a current version: waited for, and unpublished but leased */
        ck_assert_ptr_null(acquire(c, "l/bb", 0, -1, NULL));
        ck_assert_ptr_null(acquire(c, "l/f", 0, -1, NULL));
        publish(p, "l/g", false, 200);
        lease = acquire_ok(c, "l/g")->rep.acquire.lease;
        expect_ok(unpublish(p, "l/g"), WIRE_REP_NONE);

        r = list(c, "l/", "", 2);
        expect_names(r, page1, 2, "l/b");
        r = list(c, "l/", r->rep.list.next, 2);
        expect_names(r, page2, 2, "l/d");
        r = list(c, "l/", r->rep.list.next, 2);
        expect_names(r, page3, 1, "");

        /* everything, default page size, sorted */
        expect_names(list(c, "", "", 0), all, 7, "");
        /* a cursor before the prefix starts at the prefix */
        expect_names(list(c, "l/", "a", 2), page1, 2, "l/b");
        /* nothing under an unknown prefix, nor after the last name */
        expect_names(list(c, "zzz", "", 0), NULL, 0, "");
        expect_names(list(c, "l/", "l/e", 10), NULL, 0, "");

        /* entries carry the same info as stat */
        r = list(c, "m/", "", 0);
        ck_assert_uint_eq(r->rep.list.count, 1);
        ck_assert(r->rep.list.entries[0].persist);
        ck_assert_uint_eq(r->rep.list.entries[0].owner_uid, 1000);
        ck_assert_int_eq(r->rep.list.entries[0].producer_pid, 100);
        ck_assert_uint_eq(r->rep.list.entries[0].tensor.version, 1);
        ck_assert_uint_eq(r->rep.list.entries[0].segment_size, SEG_BYTES);
        ck_assert_str_eq(r->rep.list.entries[0].producer_name, "p");
        release_ok(c, lease);
}
END_TEST

START_TEST(test_stat_fields)
{
        struct client *p = client_new(1000, 1000, 4242, "the-producer");
        struct client *c = client_new(1001, 1001, 200, "c");
        const struct wire_info *info;
        struct wire_tensor t;
        uint64_t l1, l2;

        expect_status(stat_(c, "s"), WIRE_NOT_FOUND);
        /* 4 x 3 float32, rows 16 bytes apart, at offset 64 of a 256-byte memfd */
        tensor_f32(&t, "s", 4, 64, 128);
        t.ndim = 2;
        t.shape[0] = 4;
        t.shape[1] = 3;
        t.strides[0] = 4;
        t.strides[1] = 1;
        t.byte_offset = 8;
        expect_ok(publish_t(p, &t, sealed_memfd(256), true, 5), WIRE_REP_PUBLISH);

        info = stat_ok(c, "s");
        ck_assert_str_eq(info->tensor.name, "s");
        ck_assert_uint_eq(info->tensor.version, 1);
        ck_assert_int_eq(info->tensor.ndim, 2);
        ck_assert_int_eq(info->tensor.shape[0], 4);
        ck_assert_int_eq(info->tensor.shape[1], 3);
        ck_assert_int_eq(info->tensor.strides[0], 4);
        ck_assert_int_eq(info->tensor.strides[1], 1);
        ck_assert_uint_eq(info->tensor.byte_offset, 8);
        ck_assert_uint_eq(info->tensor.offset, 64);
        ck_assert_uint_eq(info->tensor.length, 128);
        ck_assert_uint_eq(info->owner_uid, 1000);
        ck_assert_int_eq(info->producer_pid, 4242);
        ck_assert_str_eq(info->producer_name, "the-producer");
        ck_assert(info->persist);
        ck_assert_uint_eq(info->leases, 0);
        ck_assert_uint_eq(info->live_versions, 1);
        ck_assert_uint_eq(info->segment_size, 256);
        ck_assert_uint_gt(info->published_ns, 0);

        l1 = acquire_ok(c, "s")->rep.acquire.lease;
        l2 = acquire_ok(c, "s")->rep.acquire.lease;
        ck_assert_uint_eq(stat_ok(c, "s")->leases, 2);

        publish(p, "s", false, 6);
        info = stat_ok(c, "s");
        ck_assert_uint_eq(info->tensor.version, 2);
        ck_assert(!info->persist);
        ck_assert_uint_eq(info->leases, 0);
        ck_assert_uint_eq(info->live_versions, 2);
        ck_assert_uint_eq(info->segment_size, SEG_BYTES);

        release_ok(c, l1);
        ck_assert_uint_eq(stat_ok(c, "s")->live_versions, 2);
        release_ok(c, l2);
        ck_assert_uint_eq(stat_ok(c, "s")->live_versions, 1);
        ck_assert_uint_eq(count_released(p, 5), 1);
}
END_TEST

/* ---- alloc, free, publish by segment, segment death --------------------------------------- */

START_TEST(test_alloc_and_publish_by_segment)
{
        struct client *a = client_new(1000, 1000, 100, "a");
        struct client *b = client_new(1000, 1000, 101, "b");
        const struct sent *r;
        uint64_t seg, seg2;
        struct wire_stats st;

        seg = alloc_ok(a, 4096);
        st = stats(a);
        ck_assert_uint_eq(st.segments, 1);
        ck_assert_uint_eq(st.bytes, 4096);
        ck_assert_uint_eq(st.max_bytes, 1 << 20);

        expect_status(alloc(a, 1 << 20), WIRE_NO_SPACE);
        expect_status(alloc(a, 0), WIRE_INVALID);
        seg2 = alloc_ok(a, (1 << 20) - 4096);
        ck_assert_uint_ne(seg2, seg);
        expect_status(alloc(a, 1), WIRE_NO_SPACE);
        /* a published memfd counts against the same limit */
        {
                struct wire_tensor t;
                int fd = sealed_memfd(SEG_BYTES);
                tensor_f32(&t, "nospace", 16, 0, SEG_BYTES);
                expect_status(publish_t(a, &t, fd, false, 1), WIRE_NO_SPACE);
                ck_assert(!fd_is_open(fd));
        }
        expect_ok(free_seg(a, seg2), WIRE_REP_NONE);
        ck_assert_uint_eq(stats(a).bytes, 4096);

        r = expect_ok(publish_seg(a, "bs", seg, 0, 1), WIRE_REP_PUBLISH);
        ck_assert_uint_eq(r->rep.publish.segment, seg);
        ck_assert_uint_eq(r->rep.publish.version, 1);
        ck_assert_uint_eq(stats(a).segments, 1);

        /* another session's segment cannot be published by id, nor an unknown one */
        expect_status(publish_seg(b, "bs2", seg, 0, 2), WIRE_BAD_FD);
        expect_status(publish_seg(b, "bs2", 12345, 0, 2), WIRE_BAD_FD);
        expect_status(stat_(b, "bs2"), WIRE_NOT_FOUND);

        /* b gets the fd on acquire, a already holds it */
        r = acquire_ok(b, "bs");
        ck_assert(r->had_fd && r->fd_valid);
        ck_assert_int_eq(r->fd_size, 4096);
        ck_assert_uint_eq(r->rep.acquire.tensor.segment, seg);
        ck_assert(!acquire_ok(a, "bs")->had_fd);

        /* free drops the hold; the version keeps the segment */
        expect_ok(free_seg(a, seg), WIRE_REP_NONE);
        expect_status(free_seg(a, seg), WIRE_NOT_FOUND);
        expect_status(free_seg(b, seg), WIRE_NOT_FOUND);
        expect_status(publish_seg(a, "bs3", seg, 0, 3), WIRE_BAD_FD);
        st = stats(a);
        ck_assert_uint_eq(st.segments, 1);
        ck_assert_uint_eq(st.bytes, 4096);
        ck_assert_uint_eq(count_gone(a, seg), 0);

        /* a segment freed with no version on it dies at once */
        seg2 = alloc_ok(a, 100);
        expect_ok(free_seg(a, seg2), WIRE_REP_NONE);
        st = stats(a);
        ck_assert_uint_eq(st.segments, 1);
        ck_assert_uint_eq(st.bytes, 4096);
        ck_assert_uint_eq(count_gone(a, seg2), 1);

        /* one segment, several versions: it lives while any does */
        seg2 = alloc_ok(b, 4096);
        expect_ok(publish_seg(b, "multi/1", seg2, 0, 4), WIRE_REP_PUBLISH);
        expect_ok(publish_seg(b, "multi/2", seg2, 0, 5), WIRE_REP_PUBLISH);
        expect_ok(free_seg(b, seg2), WIRE_REP_NONE);
        expect_ok(unpublish(b, "multi/1"), WIRE_REP_NONE);
        ck_assert_uint_eq(count_gone(b, seg2), 0);
        ck_assert_uint_eq(stats(b).segments, 2);
        expect_ok(unpublish(b, "multi/2"), WIRE_REP_NONE);
        ck_assert_uint_eq(count_gone(b, seg2), 1);
        ck_assert_uint_eq(stats(b).segments, 1);
}
END_TEST

START_TEST(test_segment_gone)
{
        struct client *a = client_new(1000, 1000, 100, "a");
        struct client *b = client_new(1001, 1001, 200, "b");
        struct client *c = client_new(1001, 1001, 201, "c");
        struct client *d = client_new(1001, 1001, 202, "d");
        uint64_t seg, seg2, l;
        const struct wire_reply *ev = NULL;

        seg = alloc_ok(a, SEG_BYTES);
        expect_ok(publish_seg(a, "g", seg, 0, 1), WIRE_REP_PUBLISH);
        release_ok(b, acquire_ok(b, "g")->rep.acquire.lease);
        l = acquire_ok(c, "g")->rep.acquire.lease;
        expect_ok(forget(c, seg), WIRE_REP_NONE);
        release_ok(c, l);
        expect_ok(free_seg(a, seg), WIRE_REP_NONE);
        ck_assert_uint_eq(stats(a).segments, 1);

        expect_ok(unpublish(a, "g"), WIRE_REP_NONE);
        ck_assert_uint_eq(stats(a).segments, 0);
        ck_assert_uint_eq(count_gone(a, seg), 1);
        ck_assert_uint_eq(count_gone(b, seg), 1);
        ck_assert_uint_eq(count_gone(c, seg), 0); /* forgot it */
        ck_assert_uint_eq(count_gone(d, seg), 0); /* never had it */
        for (size_t i = 0; i < b->n; i++)
                if (b->log[i].rep.type == WIRE_REP_EVENT)
                        ev = &b->log[i].rep;
        ck_assert_ptr_nonnull(ev);
        ck_assert_int_eq(ev->event.kind, WIRE_EVENT_SEGMENT_GONE);
        ck_assert_uint_eq(ev->id, 0);
        ck_assert(!b->log[b->n - 1].had_fd);

        /* a published memfd: the consumer hears SEGMENT_GONE, the producer RELEASED */
        seg2 = publish(a, "h", false, 2)->rep.publish.segment;
        l = acquire_ok(b, "h")->rep.acquire.lease;
        acquire_ok(d, "h");
        publish(a, "h", false, 3);
        release_ok(b, l);
        ck_assert_uint_eq(count_gone(b, seg2), 0); /* d still leases it */
        client_close(d);
        ck_assert_uint_eq(count_gone(b, seg2), 1);
        ck_assert_uint_eq(count_released(a, 2), 1);

        /* a known segment dying while its session still leases it is impossible: leases keep
         * versions, versions keep segments. After forget, a re-acquire re-registers it. */
        l = acquire_ok(c, "h")->rep.acquire.lease;
        expect_ok(forget(c, acquire_ok(c, "h")->rep.acquire.tensor.segment), WIRE_REP_NONE);
        ck_assert(acquire_ok(c, "h")->had_fd);
        release_ok(c, l);
}
END_TEST

START_TEST(test_release_unknown)
{
        struct client *p = client_new(1000, 1000, 100, "p");
        struct client *c = client_new(1001, 1001, 200, "c");
        struct client *c2 = client_new(1001, 1001, 201, "c2");
        uint64_t lease;

        expect_status(release(c, 999), WIRE_NOT_FOUND);
        /* lease 0 is the release ring's wake-up: never answered, releases nothing */
        release_ok(c, 0);
        publish(p, "r", false, 1);
        lease = acquire_ok(c, "r")->rep.acquire.lease;
        /* a lease belongs to the session that took it */
        expect_status(release(c2, lease), WIRE_NOT_FOUND);
        expect_status(release(p, lease), WIRE_NOT_FOUND);
        ck_assert_uint_eq(stats(c).leases, 1);
        release_ok(c, lease);
        ck_assert_uint_eq(stats(c).leases, 0);
        expect_status(release(c, lease), WIRE_NOT_FOUND);
}
END_TEST

/* ---- descriptor and extent checks ---------------------------------------------------------- */

/* Publishes t over a fresh memfd of size bytes; expects status and a consumed fd. */
static void publish_expect(struct client *c, const struct wire_tensor *t, uint64_t size,
                           enum wire_status status)
{
        int fd = sealed_memfd(size);
        const struct sent *r = publish_t(c, t, fd, false, 1);

        if (status == WIRE_OK) {
                expect_ok(r, WIRE_REP_PUBLISH);
                return; /* the store keeps it */
        }
        expect_status(r, status);
        ck_assert_msg(!fd_is_open(fd), "a rejected publish left fd %d open", fd);
}

/*
 * Tensors that reach outside their region or segment: a 1-D float32 tensor
 * of n elements at offset, length bytes long, over a memfd of size bytes,
 * then changed as the row says.
 */
static const struct extent_row {
        const char *what;
        int64_t n;
        uint64_t offset, length, size, byte_offset;
        int64_t stride0; /* 0: compact */
        int64_t cols;    /* 0: 1-D; else n x cols with strides {stride0, 1} */
        bool int8;       /* int8 instead of float32 */
} extent_rows[] = {
        {"17 float32 in 64 bytes", 17, 0, SEG_BYTES, SEG_BYTES},
        {"17 float32 in a 64-byte region of a bigger segment", 17, 0, SEG_BYTES, 128},
        {"a region past the segment's end", 8, 32, SEG_BYTES, SEG_BYTES},
        {"an empty region starting past the end", 0, SEG_BYTES + 1, 0, SEG_BYTES},
        {"an offset of UINT64_MAX", 1, UINT64_MAX, 4, SEG_BYTES},
        {"a length of UINT64_MAX", 1, 4, UINT64_MAX, SEG_BYTES},
        /* byte_offset moves the elements: 8 float32 + 4 bytes past a 32-byte region */
        {"byte_offset past the region", 8, 32, 32, SEG_BYTES, .byte_offset = 4},
        {"a 4x4 view with rows 8 elements apart (112 bytes)", 4, 0, SEG_BYTES, SEG_BYTES,
         .stride0 = 8, .cols = 4},
        {"a negative stride reaching before the segment", 2, 0, 8, SEG_BYTES, .stride0 = -1},
        {"a negative dimension", -1, 0, SEG_BYTES, SEG_BYTES},
        /*
         * Strides are whatever a peer sends. A stride of INT64_MIN puts the lowest
         * element at exactly INT64_MIN bytes before the data pointer: the check must
         * reject it without negating it (signed overflow; UBSan halts here).
         */
        {"a stride of INT64_MIN", 2, 0, 8, SEG_BYTES, .stride0 = INT64_MIN, .int8 = true},
};

START_TEST(publish_refuses_extent_outside_segment)
{
        const struct extent_row *row = &extent_rows[_i];
        struct client *p = client_new(1000, 1000, 100, "p");
        struct wire_stats st;
        struct wire_tensor t;

        tensor_f32(&t, "e", row->n, row->offset, row->length);
        t.byte_offset = row->byte_offset;
        if (row->stride0)
                t.strides[0] = row->stride0;
        if (row->cols) {
                t.ndim = 2;
                t.shape[1] = row->cols;
                t.strides[1] = 1;
        }
        if (row->int8) {
                t.dtype.code = kDLInt;
                t.dtype.bits = 8;
        }
        publish_expect(p, &t, row->size, WIRE_INVALID);
        /* nothing rejected stayed in the store */
        st = stats(p);
        ck_assert_msg(st.segments == 0 && st.bytes == 0 && st.versions == 0 && st.names == 0,
                      "%s: refused, yet the store holds %llu segments, %llu bytes, %llu versions, "
                      "%llu names",
                      row->what, (unsigned long long)st.segments, (unsigned long long)st.bytes,
                      (unsigned long long)st.versions, (unsigned long long)st.names);
}
END_TEST

START_TEST(test_extent_checks)
{
        struct client *p = client_new(1000, 1000, 100, "p");
        struct wire_tensor t;
        uint64_t seg;
        int fd;

        /* exact fits are fine */
        tensor_f32(&t, "ok/1", 8, 32, 32);
        publish_expect(p, &t, SEG_BYTES, WIRE_OK);
        tensor_f32(&t, "ok/2", 0, SEG_BYTES, 0);
        publish_expect(p, &t, SEG_BYTES, WIRE_OK);
        tensor_f32(&t, "ok/3", 2, 4, 4);
        t.strides[0] = -1; /* elements at offset 0 and 4 */
        publish_expect(p, &t, SEG_BYTES, WIRE_OK);
        ck_assert_uint_eq(stats(p).versions, 3);

        /* what is not a sealed memfd on the CPU is refused, and the fd closed */
        tensor_f32(&t, "bad", 16, 0, SEG_BYTES);
        t.storage = WIRE_STORAGE_UNSPECIFIED;
        publish_expect(p, &t, SEG_BYTES, WIRE_NOT_SUPPORTED);
        tensor_f32(&t, "bad", 16, 0, SEG_BYTES);
        t.device_type = kDLCUDA;
        publish_expect(p, &t, SEG_BYTES, WIRE_INVALID);
        tensor_f32(&t, "bad", 16, 0, SEG_BYTES);
        fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, SEG_BYTES), 0);
        expect_status(publish_t(p, &t, fd, false, 1), WIRE_BAD_FD);
        ck_assert(!fd_is_open(fd));
        {
                int pfd[2];
                ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
                expect_status(publish_t(p, &t, pfd[0], false, 1), WIRE_BAD_FD);
                ck_assert(!fd_is_open(pfd[0]));
                close(pfd[1]);
        }
        /* an empty memfd */
        tensor_f32(&t, "bad", 0, 0, 0);
        publish_expect(p, &t, 0, WIRE_BAD_FD);
        expect_status(stat_(p, "bad"), WIRE_NOT_FOUND);
        ck_assert_uint_eq(stats(p).segments, 3);

        /* by segment: a bad extent leaves the allocation held and intact */
        seg = alloc_ok(p, SEG_BYTES);
        {
                struct wire_tensor t2;
                tensor_f32(&t2, "byseg", 17, 0, SEG_BYTES);
                t2.segment = seg;
                expect_status(publish_t(p, &t2, -1, false, 1), WIRE_INVALID);
        }
        ck_assert_uint_eq(stats(p).segments, 4);
        expect_ok(publish_seg(p, "byseg", seg, 0, 1), WIRE_REP_PUBLISH);
        expect_ok(free_seg(p, seg), WIRE_REP_NONE);
}
END_TEST

/* ---- counters and teardown ---------------------------------------------------------------- */

START_TEST(test_stats_counters)
{
        struct client *p = client_new(1000, 1000, 100, "p");
        struct client *c = client_new(1001, 1001, 200, "c");
        struct client *obs;
        struct wire_stats st;
        uint64_t seg;

        st = stats(p);
        ck_assert_uint_eq(st.names, 0);
        ck_assert_uint_eq(st.versions, 0);
        ck_assert_uint_eq(st.leases, 0);
        ck_assert_uint_eq(st.segments, 0);
        ck_assert_uint_eq(st.bytes, 0);
        ck_assert_uint_eq(st.clients, 2);
        ck_assert_uint_eq(st.max_clients, 64);
        ck_assert_uint_eq(st.max_bytes, 1 << 20);

        publish(p, "a", false, 1);
        publish(p, "b", false, 2);
        publish(p, "a", false, 3); /* v1 of a dies: no lease */
        acquire_ok(c, "a");
        acquire_ok(c, "b");
        publish(p, "b", false, 4); /* v1 of b stays: leased */
        seg = alloc_ok(p, 1000);
        watch(c, "a");

        st = stats(c);
        ck_assert_uint_eq(st.names, 2);
        ck_assert_uint_eq(st.versions, 3);
        ck_assert_uint_eq(st.leases, 2);
        ck_assert_uint_eq(st.segments, 4);
        ck_assert_uint_eq(st.bytes, 3 * SEG_BYTES + 1000);
        ck_assert_uint_eq(st.watchers, 1);
        ck_assert_uint_eq(st.publishes, 4);
        ck_assert_uint_eq(st.acquires, 2);

        expect_ok(publish_seg(p, "c", seg, 0, 5), WIRE_REP_PUBLISH);
        st = stats(c);
        ck_assert_uint_eq(st.names, 3);
        ck_assert_uint_eq(st.versions, 4);
        ck_assert_uint_eq(st.segments, 4);
        ck_assert_uint_eq(st.publishes, 5);

        client_close(c);
        client_close(p);
        obs = client_new(0, 0, 1, "observer");
        st = stats(obs);
        ck_assert_uint_eq(st.names, 0);
        ck_assert_uint_eq(st.versions, 0);
        ck_assert_uint_eq(st.leases, 0);
        ck_assert_uint_eq(st.segments, 0);
        ck_assert_uint_eq(st.bytes, 0);
        ck_assert_uint_eq(st.watchers, 0);
        ck_assert_uint_eq(st.clients, 1);
}
END_TEST

/*
 * Everything left live at shutdown: open sessions with leases, waiters (timed
 * and not), allocations, watches and persistent versions whose producer has
 * gone. The fixture's teardown (registry_done, store_done, loop close) must
 * bring the fd count back; here we also check the store really held fds.
 */
START_TEST(test_done_closes_everything)
{
        struct client *p = client_new(1000, 1000, 100, "p");
        struct client *gone = client_new(1000, 1000, 101, "gone");
        struct client *c = client_new(1001, 1001, 200, "c");
        int during;

        publish(gone, "persist", true, 1);
        client_close(gone);
        publish(p, "x", false, 2);
        publish_flags(p, "ro", true, 3, DLPACK_FLAG_BITMASK_READ_ONLY);
        acquire_ok(c, "x");
        acquire_ok(c, "ro"); /* makes the store open a read-only reopen */
        publish(p, "x", false, 4);
        alloc_ok(c, 4096);
        watch(c, "");
        ck_assert_ptr_null(acquire(c, "never", 0, 60000, NULL));
        ck_assert_ptr_null(acquire(c, "never2", 0, -1, NULL));

        during = count_fds(0);
        /* 5 segments (persist, x v1, ro, x v2, alloc) + the read-only reopen */
        ck_assert_int_ge(during - E.fds_before, 6);
}
END_TEST

/* ---- CUDA descriptors (the daemon stores handles and fds, never touches CUDA) ---------------- */

static void handle_bytes(uint8_t *h, uint8_t seed)
{
        for (int i = 0; i < DLX_CUDA_HANDLE; i++)
                h[i] = (uint8_t)(seed + i);
}

static void tensor_ipc(struct wire_tensor *t, const char *name)
{
        tensor_f32(t, name, 16, 256, 64);
        t->device_type = kDLCUDA;
        t->device_id = 0;
        t->storage = WIRE_STORAGE_CUDA_IPC;
        t->has_ipc_handle = true;
        handle_bytes(t->ipc_handle, 7);
        t->has_event = true;
        handle_bytes(t->event, 100);
}

static const struct sent *publish_ipc(struct client *c, const struct wire_tensor *t,
                                      uint64_t alloc_size, bool persist, uint64_t token)
{
        struct wire_request req = {.type = WIRE_REQ_PUBLISH,
                                   .publish = {.tensor = *t,
                                               .persist = persist,
                                               .token = token,
                                               .segment_size = alloc_size}};

        return submit(c, &req, -1);
}

START_TEST(test_cuda_ipc_descriptor)
{
        struct client *p = client_new(1000, 1000, 10, "producer");
        struct client *c = client_new(1000, 1000, 11, "consumer");
        struct wire_request req;
        struct wire_tensor t;
        const struct sent *r;
        uint8_t h[DLX_CUDA_HANDLE];

        tensor_ipc(&t, "gpu/x");
        expect_ok(publish_ipc(p, &t, 4096, false, 5), WIRE_REP_PUBLISH);
        /* the handle and the producer's event travel to the consumer, no fd */
        r = acquire_ok(c, "gpu/x");
        ck_assert(!r->had_fd);
        ck_assert_uint_eq(r->rep.acquire.tensor.storage, WIRE_STORAGE_CUDA_IPC);
        ck_assert(r->rep.acquire.tensor.has_ipc_handle && r->rep.acquire.tensor.has_event);
        ck_assert_mem_eq(r->rep.acquire.tensor.ipc_handle, t.ipc_handle, DLX_CUDA_HANDLE);
        ck_assert_mem_eq(r->rep.acquire.tensor.event, t.event, DLX_CUDA_HANDLE);
        ck_assert_uint_eq(r->rep.acquire.tensor.offset, 256);
        uint64_t lease = r->rep.acquire.lease;

        /* release with the consumer's event: the producer gets it back with RELEASED */
        req = (struct wire_request){.type = WIRE_REQ_RELEASE,
                                    .release = {.lease = lease, .has_event = true}};
        handle_bytes(req.release.event, 200);
        submit(c, &req, -1);
        expect_ok(unpublish(p, "gpu/x"), WIRE_REP_NONE);
        ck_assert_uint_eq(count_released(p, 5), 1);
        const struct wire_reply *ev = NULL;
        for (size_t i = 0; i < p->n; i++)
                if (p->log[i].rep.type == WIRE_REP_EVENT &&
                    p->log[i].rep.event.kind == WIRE_EVENT_RELEASED)
                        ev = &p->log[i].rep;
        ck_assert_ptr_nonnull(ev);
        ck_assert_uint_eq(ev->event.nevents, 1);
        handle_bytes(h, 200);
        ck_assert_mem_eq(ev->event.events[0], h, DLX_CUDA_HANDLE);

        /* refusals: persist, no handle, an fd, the wrong device, beyond the allocation */
        expect_status(publish_ipc(p, &t, 4096, true, 0), WIRE_NOT_SUPPORTED);
        t.has_ipc_handle = false;
        expect_status(publish_ipc(p, &t, 4096, false, 0), WIRE_INVALID);
        tensor_ipc(&t, "gpu/y");
        int fd = sealed_memfd(SEG_BYTES);
        req = (struct wire_request){.type = WIRE_REQ_PUBLISH,
                                    .publish = {.tensor = t, .segment_size = 4096}};
        expect_status(submit(p, &req, fd), WIRE_INVALID);
        ck_assert(!fd_is_open(fd));
        t.device_type = kDLCPU;
        expect_status(publish_ipc(p, &t, 4096, false, 0), WIRE_INVALID);
        tensor_ipc(&t, "gpu/y");
        expect_status(publish_ipc(p, &t, 300, false, 0), WIRE_INVALID);
        expect_status(publish_ipc(p, &t, 0, false, 0), WIRE_INVALID);
        /* an event on a CPU tensor is refused too */
        tensor_f32(&t, "cpu/e", 16, 0, 64);
        t.has_event = true;
        fd = sealed_memfd(SEG_BYTES);
        expect_status(publish_t(p, &t, fd, false, 0), WIRE_INVALID);
        /* IPC segments charge no bytes: the producer's process holds that memory */
        ck_assert_uint_eq(stats(p).bytes, 0);
}
END_TEST

START_TEST(test_release_events_fair_and_bounded)
{
        struct client *p = client_new(1000, 1000, 10, "producer");
        struct client *a = client_new(1000, 1000, 11, "greedy");
        struct client *b = client_new(1000, 1000, 12, "modest");
        struct wire_request req;
        struct wire_tensor t;
        const struct sent *r;

        tensor_ipc(&t, "gpu/f");
        expect_ok(publish_ipc(p, &t, 4096, false, 9), WIRE_REP_PUBLISH);
        /* the greedy consumer releases 100 leases with 100 distinct events */
        for (int i = 0; i < 100; i++) {
                r = acquire_ok(a, "gpu/f");
                req = (struct wire_request){
                        .type = WIRE_REQ_RELEASE,
                        .release = {.lease = r->rep.acquire.lease, .has_event = true}};
                handle_bytes(req.release.event, (uint8_t)i);
                req.release.event[0] = 0xa0;
                req.release.event[1] = (uint8_t)i;
                submit(a, &req, -1);
        }
        /* the modest one's single event still counts */
        r = acquire_ok(b, "gpu/f");
        req = (struct wire_request){.type = WIRE_REQ_RELEASE,
                                    .release = {.lease = r->rep.acquire.lease, .has_event = true}};
        handle_bytes(req.release.event, 0xb0);
        submit(b, &req, -1);
        /* the same event twice is kept once */
        r = acquire_ok(b, "gpu/f");
        req.release.lease = r->rep.acquire.lease;
        submit(b, &req, -1);
        expect_ok(unpublish(p, "gpu/f"), WIRE_REP_NONE);
        for (size_t i = 0; i < p->n; i++) {
                const struct wire_reply *ev = &p->log[i].rep;
                if (ev->type != WIRE_REP_EVENT || ev->event.kind != WIRE_EVENT_RELEASED)
                        continue;
                ck_assert_uint_eq(ev->event.nevents, DLX_MAX_RELEASE_EVENTS_PER_SESSION + 1);
                uint8_t want[DLX_CUDA_HANDLE];
                handle_bytes(want, 0xb0);
                ck_assert_mem_eq(ev->event.events[ev->event.nevents - 1], want, DLX_CUDA_HANDLE);
                return;
        }
        ck_abort_msg("no RELEASED event");
}
END_TEST

START_TEST(test_cuda_vmm_and_host_segments)
{
        struct client *p = client_new(1000, 1000, 10, "producer");
        struct client *c = client_new(1000, 1000, 11, "consumer");
        struct wire_request req;
        struct wire_tensor t;
        const struct sent *r;
        struct stat sb;
        int fd;

        /*
         * A VMM export adopted through alloc at its declared size, held,
         * published by id. It must be a file of the driver's control device
         * (tests/test-badinput.c has the refusals): a /dev/ptmx master stands
         * in for one, and the store is told to take that device.
         */
        ck_assert(E.store.vmm_dev == makedev(STORE_VMM_MAJOR, STORE_VMM_MINOR));
        fd = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(fstat(fd, &sb), 0);
        E.store.vmm_dev = sb.st_rdev;
        req = (struct wire_request){.type = WIRE_REQ_ALLOC,
                                    .alloc = {.size = 1 << 16, .storage = WIRE_STORAGE_CUDA_VMM}};
        r = expect_ok(submit(p, &req, fd), WIRE_REP_ALLOC);
        ck_assert(!r->had_fd); /* the client made it: nothing to send back */
        uint64_t seg = r->rep.alloc.segment;
        ck_assert_uint_eq(r->rep.alloc.size, 1 << 16);
        tensor_f32(&t, "gpu/v", 16, 4096, 64);
        t.device_type = kDLCUDA;
        t.storage = WIRE_STORAGE_CUDA_VMM;
        t.segment = seg;
        expect_ok(publish_t(p, &t, -1, true, 0), WIRE_REP_PUBLISH);
        r = acquire_ok(c, "gpu/v");
        ck_assert(r->had_fd && r->fd_valid);
        ck_assert_uint_eq(r->rep.acquire.tensor.storage, WIRE_STORAGE_CUDA_VMM);
        /* the held VMM segment cannot carry a memfd tensor, nor a memfd one a VMM tensor */
        t.storage = WIRE_STORAGE_MEMFD;
        t.device_type = kDLCPU;
        expect_status(publish_t(p, &t, -1, false, 0), WIRE_BAD_FD);
        /* alloc with a memfd storage and an fd, or a VMM without a size: refused */
        req = (struct wire_request){.type = WIRE_REQ_ALLOC,
                                    .alloc = {.size = 4096, .storage = WIRE_STORAGE_MEMFD}};
        fd = sealed_memfd(4096);
        expect_status(submit(p, &req, fd), WIRE_INVALID);
        ck_assert(!fd_is_open(fd));
        req = (struct wire_request){.type = WIRE_REQ_ALLOC,
                                    .alloc = {.storage = WIRE_STORAGE_CUDA_VMM}};
        int pipefd[2];
        ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
        expect_status(submit(p, &req, pipefd[0]), WIRE_BAD_FD);
        close(pipefd[1]);

        /* cuda-host: a memfd on kDLCUDAHost, from a held memfd segment or an attached one */
        uint64_t mseg = alloc_ok(p, SEG_BYTES);
        tensor_f32(&t, "host/x", 16, 0, 64);
        t.device_type = kDLCUDAHost;
        t.storage = WIRE_STORAGE_CUDA_HOST;
        t.segment = mseg;
        expect_ok(publish_t(p, &t, -1, false, 0), WIRE_REP_PUBLISH);
        r = acquire_ok(c, "host/x");
        ck_assert(r->had_fd);
        ck_assert_uint_eq(r->rep.acquire.tensor.storage, WIRE_STORAGE_CUDA_HOST);
        t.device_type = kDLCPU;
        expect_status(publish_t(p, &t, -1, false, 0), WIRE_INVALID);
}
END_TEST

/* ---- invariants --------------------------------------------------------------------------- */

/*
 * The bug simulated: the version forgets one of its two leases, so the second
 * release finds its count at 0.
 */
static struct client *lease_count_broken(struct client **ret_p, struct client **ret_c)
{
        struct client *p = client_new(1000, 1000, 100, "producer");
        struct client *c = client_new(1001, 1001, 200, "consumer");
        struct client *o = client_new(1002, 1002, 300, "other");
        uint64_t lc, lo;

        publish(p, "x", false, 7);
        lc = acquire_ok(c, "x")->rep.acquire.lease;
        lo = acquire_ok(o, "x")->rep.acquire.lease;
        entry_find(&E.reg, "x")->current->leases = 1;
        release_ok(c, lc);
        release(o, lo);
        *ret_p = p;
        *ret_c = c;
        return o;
}

/* Outside abort builds a broken count ends the session that met it, and only that one. */
START_TEST(test_broken_invariant_ends_only_its_session)
{
        unsigned long before = invariants_broken;
        struct client *p, *c, *o;
        const struct sent *last;

        invariant_abort = false;
        o = lease_count_broken(&p, &c);
        ck_assert_uint_eq(invariants_broken, before + 1);
        ck_assert(o->s->broken);
        ck_assert_uint_eq(o->ended, 1);
        /* the peer is told why, in a failure addressed to no request */
        ck_assert_uint_gt(o->n, 0);
        last = &o->log[o->n - 1];
        ck_assert_uint_eq(last->rep.id, 0);
        ck_assert_int_eq(last->rep.status, WIRE_INTERNAL);
        ck_assert_ptr_nonnull(strstr(last->rep.error, "invariant"));
        /* the others go on: the count stayed at 0, not wrapped, and the version is whole */
        ck_assert(!p->s->broken && !c->s->broken);
        ck_assert_uint_eq(p->ended + c->ended, 0);
        ck_assert_uint_eq(entry_find(&E.reg, "x")->current->leases, 0);
        ck_assert_uint_eq(stats(p).leases, 0);
        acquire_ok(c, "x");
        publish(p, "x", false, 8);
        expect_ok(unpublish(p, "x"), WIRE_REP_NONE);
        /* teardown checks that every count and record went back to zero */
}
END_TEST

/* Abort builds (and tests that ask) stop at the first broken invariant. */
START_TEST(test_broken_invariant_aborts_when_asked)
{
        struct client *p, *c;

        invariant_abort = true;
        lease_count_broken(&p, &c);
        ck_abort_msg("a broken invariant did not abort");
}
END_TEST

/*
 * libuv opens a process-wide signal pipe with the first loop and keeps it for
 * the life of the process: no leak of a test's (see check-main.c).
 */
void suite_open_process_fds(void)
{
        uv_loop_t loop;

        if (uv_loop_init(&loop) == 0)
                uv_loop_close(&loop);
}

Suite *registry_suite(void)
{
        Suite *s = suite_create("registry");
        TCase *tc = tcase_create("registry");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_publish_versions_and_watch_events);
        tcase_add_test(tc, test_watch_prefix_equal_to_name);
        tcase_add_test(tc, test_watch_prefix_longer_than_name);
        tcase_add_test(tc, test_watch_empty_prefix);
        tcase_add_test(tc, test_watch_one_prefix_many_watches);
        tcase_add_test(tc, test_watch_nested_prefixes);
        tcase_add_test(tc, test_watch_removed_from_index);
        tcase_add_test(tc, test_watch_bucket_emptied_and_refilled);
        tcase_add_test(tc, test_watch_limit);
        tcase_add_test(tc, test_watch_index_matches_a_scan);
        tcase_add_test(tc, test_acquire_fd_once_then_after_forget);
        tcase_add_test(tc, test_read_only_and_writable);
        tcase_add_test(tc, test_replace_while_leased);
        tcase_add_test(tc, test_unpublish_while_leased);
        tcase_add_test(tc, test_unpublish_permissions);
        tcase_add_test(tc, test_publish_permissions);
        tcase_add_test(tc, test_session_free_releases_and_unpublishes);
        tcase_add_test(tc, test_session_free_self_references);
        tcase_add_test(tc, test_min_version_no_wait);
        tcase_add_test(tc, test_waiting_acquire_granted);
        tcase_add_test(tc, test_waiting_acquire_timeout);
        tcase_add_test(tc, test_waiting_acquire_limit);
        tcase_add_test(tc, test_list_prefix_and_pages);
        tcase_add_test(tc, test_stat_fields);
        tcase_add_test(tc, test_alloc_and_publish_by_segment);
        tcase_add_test(tc, test_segment_gone);
        tcase_add_test(tc, test_release_unknown);
        tcase_add_rows(tc, publish_refuses_extent_outside_segment, extent_rows);
        tcase_add_test(tc, test_extent_checks);
        tcase_add_test(tc, test_stats_counters);
        tcase_add_test(tc, test_done_closes_everything);
        tcase_add_test(tc, test_cuda_ipc_descriptor);
        tcase_add_test(tc, test_release_events_fair_and_bounded);
        tcase_add_test(tc, test_cuda_vmm_and_host_segments);
        tcase_add_test(tc, test_deferred_closes_are_bounded);
        tcase_add_test(tc, test_deferred_closes_not_near_the_fd_limit);
        tcase_add_test(tc, test_broken_invariant_ends_only_its_session);
        /* a signal ends the test process: only where each test has one of its own */
        if (!getenv("CK_FORK") || strcmp(getenv("CK_FORK"), "no") != 0)
                tcase_add_test_raise_signal(tc, test_broken_invariant_aborts_when_asked, SIGABRT);
        suite_add_tcase(s, tc);
        return s;
}
