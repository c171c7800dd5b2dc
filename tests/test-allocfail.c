/* SPDX-License-Identifier: MIT */
/*
 * Allocation failure: the codec and the registry run with their Nth
 * allocation failing, for N = 1, 2, ... until a run reaches no injected
 * failure, and must come back with an error (never a crash) having freed
 * every block and closed every fd they took on the way.
 *
 * This executable interposes malloc, calloc, realloc and free over glibc's
 * own (__libc_*). Only attempts made while the interposer is armed are
 * counted, may be failed and have their blocks tracked: Check's and the
 * test's own allocations outside the operation under test are left alone,
 * while inside it everything counts, protobuf-c, libuv and libc included.
 * Two modes: only the Nth attempt fails, or the Nth and every later one.
 *
 * AddressSanitizer and valgrind replace the allocator themselves, so under
 * either the suite is skipped (exit 77).
 */
#include "registry.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "dlx.pb-c.h"
#include "toolkit.h"
#include "log.h"
#include "session.h"
#include "store.h"
#include "wire.h"

#if TOOLKIT_SANITIZED
#define ALLOCFAIL_OFF "built with a sanitizer that owns malloc"
#endif

#ifndef ALLOCFAIL_OFF

/* ---- the interposer ---------------------------------------------------------------------- */

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);

enum af_mode {
        AF_ONE,  /* only the Nth attempt fails */
        AF_FROM, /* the Nth and every later one fail */
};

static struct {
        bool armed;
        enum af_mode mode;
        unsigned fail_at;  /* 1-based; 0 counts without failing */
        unsigned calls;    /* attempts while armed: malloc, calloc, realloc alike */
        unsigned injected; /* failures injected */
        unsigned live;     /* blocks taken while armed and not freed yet */
} af;

/*
 * Blocks taken while armed, with the attempt that took them: an open
 * addressing table (linear probing, backward-shift deletion) in static
 * storage, since it can allocate nothing itself.
 */
#define AF_BITS 17
#define AF_SLOTS (1u << AF_BITS)

static struct af_slot {
        void *p;
        unsigned seq;
} af_table[AF_SLOTS];

static size_t af_hash(const void *p)
{
        return (size_t)(((uint64_t)(uintptr_t)p * UINT64_C(0x9e3779b97f4a7c15)) >> (64 - AF_BITS));
}

static void af_track(void *p, unsigned seq)
{
        size_t i = af_hash(p);

        if (af.live >= AF_SLOTS / 2) {
                static const char msg[] = "allocfail: too many live blocks to track\n";
                (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
                abort();
        }
        while (af_table[i].p)
                i = (i + 1) & (AF_SLOTS - 1);
        af_table[i].p = p;
        af_table[i].seq = seq;
        af.live++;
}

/* Forgets p if it is tracked; returns its attempt number, or 0. */
static unsigned af_untrack(void *p)
{
        size_t i = af_hash(p), j;
        unsigned seq;

        while (af_table[i].p != p) {
                if (!af_table[i].p)
                        return 0;
                i = (i + 1) & (AF_SLOTS - 1);
        }
        seq = af_table[i].seq;
        af.live--;
        /* pull later members of the run back over the hole */
        for (j = i;;) {
                af_table[i].p = NULL;
                for (;;) {
                        size_t home;

                        j = (j + 1) & (AF_SLOTS - 1);
                        if (!af_table[j].p)
                                return seq;
                        home = af_hash(af_table[j].p);
                        /* it stays if its home lies cyclically in (i, j] */
                        if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
                                continue;
                        break;
                }
                af_table[i] = af_table[j];
                i = j;
        }
}

/* Counts an attempt; whether it is one to fail. */
static bool af_fail_now(void)
{
        if (!af.armed)
                return false;
        af.calls++;
        if (af.fail_at == 0 || af.calls < af.fail_at ||
            (af.mode == AF_ONE && af.calls != af.fail_at))
                return false;
        af.injected++;
        errno = ENOMEM;
        return true;
}

/*
 * A zero-size request is an attempt like any other: it is counted and may
 * be failed (a NULL result for malloc(0) is legitimate anyway).
 */
void *malloc(size_t size)
{
        void *p;

        if (af_fail_now())
                return NULL;
        p = __libc_malloc(size);
        if (p && af.armed)
                af_track(p, af.calls);
        return p;
}

void *calloc(size_t n, size_t size)
{
        void *p;

        if (af_fail_now())
                return NULL;
        p = __libc_calloc(n, size);
        if (p && af.armed)
                af_track(p, af.calls);
        return p;
}

/*
 * A failed realloc leaves p as it was. A tracked block stays tracked when it
 * moves; one taken before the operation (a libuv loop's watcher array) stays
 * untracked, whoever resizes it: it is not the operation's to free.
 */
void *realloc(void *p, size_t size)
{
        unsigned seq;
        void *q;

        if (!p)
                return malloc(size);
        if (size == 0) {
                /* glibc frees and returns NULL: a free, not an attempt */
                free(p);
                return NULL;
        }
        if (af_fail_now())
                return NULL;
        q = __libc_realloc(p, size);
        if (!q)
                return NULL;
        seq = af.live ? af_untrack(p) : 0;
        if (seq)
                af_track(q, seq);
        return q;
}

void free(void *p)
{
        if (p && af.live)
                af_untrack(p);
        __libc_free(p);
}

static void af_arm(unsigned fail_at, enum af_mode mode)
{
        ck_assert_uint_eq(af.live, 0);
        af.mode = mode;
        af.fail_at = fail_at;
        af.calls = 0;
        af.injected = 0;
        af.armed = true;
}

static void af_disarm(void)
{
        af.armed = false;
}

/* The attempt that took the oldest block still tracked (for leak messages). */
static unsigned af_oldest(void)
{
        unsigned seq = 0;

        for (size_t i = 0; i < AF_SLOTS; i++)
                if (af_table[i].p && (seq == 0 || af_table[i].seq < seq))
                        seq = af_table[i].seq;
        return seq;
}

static const char *const mode_names[] = {[AF_ONE] = "only #N", [AF_FROM] = "#N on"};

/*
 * The interposer itself: what libc and protobuf-c's shared object allocate
 * is counted, tracked and failed like the rest; a failed realloc leaves its
 * block as it was.
 */
/* Where a pointer escapes, so that no allocation here is optimised away. */
static void *volatile sink;

START_TEST(test_interposer)
{
        Dlxp__Ping ping = DLXP__PING__INIT, *got;
        uint8_t buf[32];
        size_t len;
        char *str;
        void *p, *q;

        af_arm(0, AF_ONE);
        sink = str = strdup("allocfail");
        af_disarm();
        ck_assert_ptr_nonnull(str);
        ck_assert_uint_eq(af.calls, 1);
        ck_assert_uint_eq(af.live, 1);
        free(str);
        ck_assert_uint_eq(af.live, 0);
        af_arm(1, AF_ONE);
        sink = str = strdup("allocfail");
        af_disarm();
        ck_assert_ptr_null(str);
        ck_assert_uint_eq(af.injected, 1);

        af_arm(2, AF_ONE);
        sink = p = malloc(16);
        sink = q = realloc(p, 4096);
        af_disarm();
        ck_assert_ptr_nonnull(p);
        ck_assert_ptr_null(q);
        ck_assert_uint_eq(af.live, 1);
        /* moved while unarmed, still the armed region's block */
        sink = q = realloc(p, 1 << 20);
        ck_assert_ptr_nonnull(q);
        ck_assert_uint_eq(af.live, 1);
        free(q);
        ck_assert_uint_eq(af.live, 0);

        ping.nonce = 7;
        len = dlxp__ping__pack(&ping, buf);
        af_arm(0, AF_ONE);
        got = dlxp__ping__unpack(NULL, len, buf);
        af_disarm();
        ck_assert_ptr_nonnull(got);
        ck_assert_uint_ge(af.calls, 1);
        ck_assert_uint_eq(af.live, af.calls);
        dlxp__ping__free_unpacked(got, NULL);
        ck_assert_uint_eq(af.live, 0);
        af_arm(1, AF_FROM);
        got = dlxp__ping__unpack(NULL, len, buf);
        af_disarm();
        ck_assert_ptr_null(got);
        ck_assert_uint_eq(af.live, 0);
}
END_TEST

/* ---- the codec --------------------------------------------------------------------------- */

#define LIST_ENTRIES 300 /* well past the decoder's 4 KiB stack arena */
#define RELEASE_EVENTS 200
#define CODEC_BUF DLX_MAX_FRAME

struct codec_case {
        char what[32];
        bool request;
        bool allocates; /* has allocated parts: a list page or release events */
        struct wire_request req;
        struct wire_reply rep;
};

static struct codec_case cases[40];
static unsigned ncases;
static struct wire_info *list_entries;
static uint8_t (*release_events)[DLX_CUDA_HANDLE];

static void fill_handle(uint8_t *h, unsigned seed)
{
        for (unsigned i = 0; i < DLX_CUDA_HANDLE; i++)
                h[i] = (uint8_t)(seed * 31 + i);
}

static void fill_tensor(struct wire_tensor *t, const char *name, int32_t ndim)
{
        memset(t, 0, sizeof(*t));
        wire_strcpy(t->name, sizeof(t->name), name);
        t->version = 7;
        t->dtype.code = kDLFloat;
        t->dtype.bits = 32;
        t->dtype.lanes = 1;
        t->ndim = ndim;
        for (int32_t i = 0; i < ndim; i++) {
                t->shape[i] = i + 2;
                t->strides[i] = (int64_t)1 << (i % 20);
        }
        t->byte_offset = 16;
        t->device_type = kDLCPU;
        t->flags = 1;
        t->storage = WIRE_STORAGE_MEMFD;
        t->segment = 3;
        t->offset = 64;
        t->length = 4096;
}

static void fill_info(struct wire_info *info, const char *name, int32_t ndim)
{
        memset(info, 0, sizeof(*info));
        fill_tensor(&info->tensor, name, ndim);
        info->owner_uid = 1000;
        info->producer_pid = 4242;
        info->persist = true;
        info->leases = 3;
        info->segment_size = 8192;
        info->published_ns = UINT64_C(1700000000000000000);
        info->live_versions = 2;
        wire_strcpy(info->producer_name, sizeof(info->producer_name), "producer");
}

/* The next case, cleared and named. */
static struct codec_case *add_case(const char *what)
{
        struct codec_case *k = &cases[ncases++];

        ck_assert_uint_le(ncases, N_ELEMS(cases));
        memset(k, 0, sizeof(*k));
        wire_strcpy(k->what, sizeof(k->what), what);
        return k;
}

static struct wire_request *add_request(const char *what, enum wire_request_type type)
{
        struct codec_case *k = add_case(what);

        k->request = true;
        k->req.id = 1000 + ncases;
        k->req.type = type;
        return &k->req;
}

static struct wire_reply *add_reply(const char *what, enum wire_reply_type type, bool allocates)
{
        struct codec_case *k = add_case(what);

        k->allocates = allocates;
        k->rep.id = 2000 + ncases;
        k->rep.type = type;
        return &k->rep;
}

/* Every request type, and every reply type; built outside any armed region. */
static void build_cases(void)
{
        struct wire_request *q;
        struct wire_reply *p;

        ncases = 0;
        q = add_request("hello", WIRE_REQ_HELLO);
        q->hello.major = DLX_PROTO_MAJOR;
        q->hello.minor = DLX_PROTO_MINOR;
        wire_strcpy(q->hello.client_name, sizeof(q->hello.client_name), "allocfail");
        q->hello.pid = 42;
        q = add_request("publish", WIRE_REQ_PUBLISH);
        fill_tensor(&q->publish.tensor, "allocfail/publish", DLX_MAX_NDIM);
        q->publish.tensor.has_event = true;
        fill_handle(q->publish.tensor.event, 1);
        q->publish.persist = true;
        q->publish.token = 99;
        q->publish.hold = true;
        q->publish.segment_size = 1 << 20;
        q = add_request("acquire", WIRE_REQ_ACQUIRE);
        wire_strcpy(q->acquire.name, sizeof(q->acquire.name), "allocfail/acquire");
        q->acquire.min_version = 3;
        q->acquire.timeout_ms = -1;
        q = add_request("release", WIRE_REQ_RELEASE);
        q->release.lease = 77;
        q->release.has_event = true;
        fill_handle(q->release.event, 2);
        q = add_request("unpublish", WIRE_REQ_UNPUBLISH);
        wire_strcpy(q->unpublish.name, sizeof(q->unpublish.name), "allocfail/unpublish");
        q = add_request("list", WIRE_REQ_LIST);
        wire_strcpy(q->list.prefix, sizeof(q->list.prefix), "allocfail/");
        wire_strcpy(q->list.after, sizeof(q->list.after), "allocfail/m");
        q->list.limit = DLX_LIST_PAGE_MAX;
        q = add_request("stat", WIRE_REQ_STAT);
        wire_strcpy(q->stat.name, sizeof(q->stat.name), "allocfail/stat");
        q = add_request("watch", WIRE_REQ_WATCH);
        wire_strcpy(q->watch.prefix, sizeof(q->watch.prefix), "allocfail/");
        q = add_request("unwatch", WIRE_REQ_UNWATCH);
        q->unwatch.watch = 5;
        q = add_request("alloc", WIRE_REQ_ALLOC);
        q->alloc.size = 1 << 20;
        q->alloc.storage = WIRE_STORAGE_MEMFD;
        q = add_request("free", WIRE_REQ_FREE);
        q->free.segment = 9;
        q = add_request("forget", WIRE_REQ_FORGET);
        q->forget.count = DLX_FORGET_MAX;
        for (uint32_t i = 0; i < DLX_FORGET_MAX; i++)
                q->forget.segments[i] = i + 1;
        add_request("stats", WIRE_REQ_STATS);
        q = add_request("ping", WIRE_REQ_PING);
        q->ping.nonce = UINT64_C(0xfeedfacecafebeef);

        p = add_reply("status", WIRE_REP_NONE, false);
        p->status = WIRE_NOT_FOUND;
        wire_strcpy(p->error, sizeof(p->error), "no tensor named 'allocfail/x'");
        p = add_reply("hello reply", WIRE_REP_HELLO, false);
        p->hello.major = DLX_PROTO_MAJOR;
        p->hello.session = 12;
        wire_strcpy(p->hello.server, sizeof(p->hello.server), "dlxd " DLX_VERSION);
        p->hello.uid = 1000;
        p->hello.max_frame = DLX_MAX_FRAME;
        p->hello.max_inflight = DLX_MAX_INFLIGHT;
        p->hello.release_ring = true;
        p = add_reply("publish reply", WIRE_REP_PUBLISH, false);
        p->publish.version = 4;
        p->publish.segment = 8;
        p = add_reply("acquire reply", WIRE_REP_ACQUIRE, false);
        fill_tensor(&p->acquire.tensor, "allocfail/acquire", 4);
        p->acquire.tensor.device_type = kDLCUDA;
        p->acquire.tensor.storage = WIRE_STORAGE_CUDA_IPC;
        p->acquire.tensor.has_ipc_handle = true;
        fill_handle(p->acquire.tensor.ipc_handle, 3);
        p->acquire.tensor.has_event = true;
        fill_handle(p->acquire.tensor.event, 4);
        p->acquire.lease = 6;
        p->acquire.segment_size = 1 << 16;
        p->acquire.writable = true;
        p = add_reply("list reply (empty)", WIRE_REP_LIST, false);
        p = add_reply("list reply (1)", WIRE_REP_LIST, true);
        p->list.entries = list_entries;
        p->list.count = 1;
        p = add_reply("list reply (300)", WIRE_REP_LIST, true);
        p->list.entries = list_entries;
        p->list.count = LIST_ENTRIES;
        wire_strcpy(p->list.next, sizeof(p->list.next), list_entries[LIST_ENTRIES - 1].tensor.name);
        p = add_reply("stat reply", WIRE_REP_STAT, false);
        fill_info(&p->stat.info, "allocfail/stat", 3);
        p = add_reply("watch reply", WIRE_REP_WATCH, false);
        p->watch.watch = 2;
        p = add_reply("alloc reply", WIRE_REP_ALLOC, false);
        p->alloc.segment = 10;
        p->alloc.size = 1 << 20;
        p = add_reply("stats reply", WIRE_REP_STATS, false);
        p->stats.names = 1;
        p->stats.versions = 2;
        p->stats.leases = 3;
        p->stats.segments = 4;
        p->stats.bytes = 5;
        p->stats.clients = 6;
        p->stats.uptime_ms = 7;
        registry_default_limits(&p->stats.limits);
        p->stats.uid = 1000;
        p->stats.uid_clients = 2;
        p->stats.uid_bytes = 3;
        p->stats.uid_names = 4;
        p = add_reply("pong", WIRE_REP_PONG, false);
        p->pong.nonce = 11;
        p = add_reply("published event", WIRE_REP_EVENT, false);
        p->event.kind = WIRE_EVENT_PUBLISHED;
        p->event.watch = 1;
        wire_strcpy(p->event.name, sizeof(p->event.name), "allocfail/event");
        p->event.version = 2;
        p = add_reply("released event", WIRE_REP_EVENT, false);
        p->event.kind = WIRE_EVENT_RELEASED;
        wire_strcpy(p->event.name, sizeof(p->event.name), "allocfail/event");
        p->event.version = 2;
        p->event.token = 3;
        p->event.segment = 4;
        p = add_reply("released event (1)", WIRE_REP_EVENT, true);
        p->event.kind = WIRE_EVENT_RELEASED;
        wire_strcpy(p->event.name, sizeof(p->event.name), "allocfail/event");
        p->event.token = 3;
        p->event.events = release_events;
        p->event.nevents = 1;
        p = add_reply("released event (200)", WIRE_REP_EVENT, true);
        p->event.kind = WIRE_EVENT_RELEASED;
        wire_strcpy(p->event.name, sizeof(p->event.name), "allocfail/event");
        p->event.token = 3;
        p->event.events = release_events;
        p->event.nevents = RELEASE_EVENTS;
        p = add_reply("segment gone event", WIRE_REP_EVENT, false);
        p->event.kind = WIRE_EVENT_SEGMENT_GONE;
        p->event.segment = 5;
}

static void codec_setup(void)
{
        char name[DLX_NAME_MAX + 1];

        list_entries = calloc(LIST_ENTRIES, sizeof(*list_entries));
        release_events = calloc(RELEASE_EVENTS, sizeof(*release_events));
        ck_assert(list_entries && release_events);
        for (unsigned i = 0; i < LIST_ENTRIES; i++) {
                snprintf(name, sizeof(name), "allocfail/list/%04u", i);
                fill_info(&list_entries[i], name, 1 + (int32_t)(i % 3));
        }
        for (unsigned i = 0; i < RELEASE_EVENTS; i++)
                fill_handle(release_events[i], 100 + i);
        build_cases();
}

static void codec_teardown(void)
{
        free(list_entries);
        free(release_events);
        list_entries = NULL;
        release_events = NULL;
}

enum codec_op { OP_SIZE, OP_PACK, OP_ENCODE, OP_DECODE };

static const char *const op_names[] = {
        [OP_SIZE] = "size", [OP_PACK] = "pack", [OP_ENCODE] = "encode", [OP_DECODE] = "decode"};

/* What a clean run gives, to hold each run's output against. */
static struct {
        uint8_t bytes[CODEC_BUF];
        size_t len;
        struct wire_request req;
        struct wire_reply rep;
} ref;

/* What the run under test gives. */
static struct {
        uint8_t bytes[CODEC_BUF];
        size_t len;
        struct wire_request req;
        struct wire_reply rep;
} out;

/* One operation; only this runs armed. Returns 0 or -errno. */
static int codec_run(const struct codec_case *k, enum codec_op op)
{
        char err[128];

        switch (op) {
        case OP_SIZE:
                return k->request ? wire_request_size(&k->req, &out.len)
                                  : wire_reply_size(&k->rep, &out.len);
        case OP_PACK:
                /* the pack functions say nothing but 0 bytes on failure */
                out.len = k->request ? wire_request_pack(&k->req, out.bytes)
                                     : wire_reply_pack(&k->rep, out.bytes);
                return out.len ? 0 : -ENOMEM;
        case OP_ENCODE:
                return wire_reply_encode(&k->rep, out.bytes, sizeof(out.bytes), &out.len);
        case OP_DECODE:
                if (k->request) {
                        memset(&out.req, 0, sizeof(out.req));
                        return wire_request_decode(ref.bytes, ref.len, &out.req, err, sizeof(err));
                }
                memset(&out.rep, 0, sizeof(out.rep));
                return wire_reply_decode(ref.bytes, ref.len, &out.rep, err, sizeof(err));
        }
        return -EINVAL;
}

static bool replies_equal(const struct wire_reply *a, const struct wire_reply *b)
{
        if (a->type != b->type || a->id != b->id || a->status != b->status ||
            strcmp(a->error, b->error) != 0)
                return false;
        switch (a->type) {
        case WIRE_REP_LIST:
                return a->list.count == b->list.count && strcmp(a->list.next, b->list.next) == 0 &&
                       (a->list.count == 0 ||
                        memcmp(a->list.entries, b->list.entries,
                               a->list.count * sizeof(struct wire_info)) == 0);
        case WIRE_REP_EVENT:
                return a->event.kind == b->event.kind && a->event.watch == b->event.watch &&
                       strcmp(a->event.name, b->event.name) == 0 &&
                       a->event.version == b->event.version && a->event.token == b->event.token &&
                       a->event.segment == b->event.segment &&
                       a->event.nevents == b->event.nevents &&
                       (a->event.nevents == 0 ||
                        memcmp(a->event.events, b->event.events,
                               (size_t)a->event.nevents * DLX_CUDA_HANDLE) == 0);
        default:
                /* both decoded into zeroed structs: no padding differs */
                return memcmp(a, b, sizeof(*a)) == 0;
        }
}

/* Whether a successful run's output is the clean run's. */
static bool codec_output_ok(const struct codec_case *k, enum codec_op op)
{
        switch (op) {
        case OP_SIZE:
                return out.len == ref.len;
        case OP_PACK:
        case OP_ENCODE:
                return out.len == ref.len && memcmp(out.bytes, ref.bytes, ref.len) == 0;
        case OP_DECODE:
                return k->request ? memcmp(&out.req, &ref.req, sizeof(out.req)) == 0
                                  : replies_equal(&out.rep, &ref.rep);
        }
        return false;
}

struct tally {
        unsigned points; /* failure points visited: runs with a failure injected */
        unsigned enomem, eproto;
};

/*
 * Fails the Nth allocation of one operation for N = 1, 2, ... until a run
 * reaches no failure; every run must end in 0 or a negative errno with every
 * block it took freed. Returns the number of failure points.
 */
static unsigned codec_sweep(const struct codec_case *k, enum codec_op op, enum af_mode mode,
                            struct tally *t)
{
        for (unsigned n = 1;; n++) {
                unsigned live, injected, oldest;
                int r;

                ck_assert_uint_lt(n, 1000000);
                af_arm(n, mode);
                r = codec_run(k, op);
                af_disarm();
                live = af.live;
                injected = af.injected;
                oldest = live ? af_oldest() : 0;
                if (r == 0 && op == OP_DECODE) {
                        ck_assert_msg(codec_output_ok(k, op), "%s %s, %s = %u: decoded wrong",
                                      k->what, op_names[op], mode_names[mode], n);
                        if (!k->request)
                                wire_reply_done(&out.rep);
                        live = af.live;
                        oldest = live ? af_oldest() : 0;
                }
                ck_assert_msg(live == 0,
                              "%s %s, %s = %u fails: returned %d, %u blocks leaked (the oldest "
                              "from allocation #%u)",
                              k->what, op_names[op], mode_names[mode], n, r, live, oldest);
                if (!injected) {
                        ck_assert_msg(r == 0, "%s %s: %d without any failure", k->what,
                                      op_names[op], r);
                        /* a decode's output was checked above, before wire_reply_done() */
                        ck_assert_msg(op == OP_DECODE || codec_output_ok(k, op),
                                      "%s %s: wrong output", k->what, op_names[op]);
                        return n - 1;
                }
                if (op != OP_DECODE && r == 0)
                        ck_assert_msg(codec_output_ok(k, op), "%s %s, %s = %u: wrong output",
                                      k->what, op_names[op], mode_names[mode], n);
                /*
                 * protobuf-c answers an allocation failure inside its unpack
                 * with NULL; the decoders' allocator notes the failure, so the
                 * peer's valid frame is not called garbage (-EPROTO).
                 */
                ck_assert_msg(r == 0 || r == -ENOMEM, "%s %s, %s = %u: returned %d", k->what,
                              op_names[op], mode_names[mode], n, r);
                t->points++;
                t->enomem += r == -ENOMEM;
                t->eproto += r == -EPROTO;
        }
}

/* The clean encoding and decoding of a case, made unarmed. */
static void codec_reference(const struct codec_case *k)
{
        char err[128];
        size_t size;

        if (k->request) {
                ck_assert_int_eq(wire_request_size(&k->req, &size), 0);
                ck_assert_uint_le(size, sizeof(ref.bytes));
                ref.len = wire_request_pack(&k->req, ref.bytes);
                ck_assert_uint_eq(ref.len, size);
                memset(&ref.req, 0, sizeof(ref.req));
                ck_assert_int_eq(
                        wire_request_decode(ref.bytes, ref.len, &ref.req, err, sizeof(err)), 0);
        } else {
                ck_assert_int_eq(wire_reply_encode(&k->rep, ref.bytes, sizeof(ref.bytes), &ref.len),
                                 0);
                memset(&ref.rep, 0, sizeof(ref.rep));
                ck_assert_msg(wire_reply_decode(ref.bytes, ref.len, &ref.rep, err, sizeof(err)) ==
                                      0,
                              "%s: %s", k->what, err);
        }
}

static void codec_pass(bool requests, enum af_mode mode)
{
        static const enum codec_op request_ops[] = {OP_SIZE, OP_PACK, OP_DECODE};
        static const enum codec_op reply_ops[] = {OP_SIZE, OP_PACK, OP_ENCODE, OP_DECODE};
        const enum codec_op *ops = requests ? request_ops : reply_ops;
        unsigned nops = requests ? 3 : 4, runs = 0;
        struct tally t = {0};

        for (unsigned i = 0; i < ncases; i++) {
                const struct codec_case *k = &cases[i];
                unsigned encode = 0, decode = 0;

                if (k->request != requests)
                        continue;
                codec_reference(k);
                for (unsigned j = 0; j < nops; j++) {
                        unsigned points = codec_sweep(k, ops[j], mode, &t);

                        if (ops[j] == OP_DECODE)
                                decode += points;
                        else
                                encode += points;
                        runs += points + 1;
                }
                if (!k->request)
                        wire_reply_done(&ref.rep);
                /*
                 * Not vacuous: what has allocated parts reaches failure points
                 * both ways. And the hot path stays off the heap: everything
                 * else encodes from and decodes into the stack.
                 */
                if (k->allocates) {
                        ck_assert_msg(encode > 0 && decode > 0, "%s: %u/%u failure points", k->what,
                                      encode, decode);
                } else {
                        ck_assert_msg(encode == 0 && decode == 0,
                                      "%s: %u/%u allocations on the hot path", k->what, encode,
                                      decode);
                }
                if (encode || decode)
                        fprintf(stderr, "allocfail: %s, %s: %u encode + %u decode failure points\n",
                                k->what, mode_names[mode], encode, decode);
        }
        fprintf(stderr,
                "allocfail: codec %s, %s: %u failure points in %u runs (%u -ENOMEM, %u -EPROTO)\n",
                requests ? "requests" : "replies", mode_names[mode], t.points, runs, t.enomem,
                t.eproto);
        if (!requests)
                ck_assert_uint_gt(t.points, 0);
}

START_TEST(test_codec_requests)
{
        codec_pass(true, AF_ONE);
        codec_pass(true, AF_FROM);
}
END_TEST

START_TEST(test_codec_replies)
{
        codec_pass(false, AF_ONE);
}
END_TEST

START_TEST(test_codec_replies_from)
{
        codec_pass(false, AF_FROM);
}
END_TEST

/* ---- the registry ------------------------------------------------------------------------ */

/* What a session's peer received: enough to pick ids for the next steps. */
struct rec {
        uint64_t id;
        enum wire_reply_type type;
        int status;
        uint64_t a; /* lease, segment, watch or version; an event's token */
        uint64_t b; /* the segment of an acquire, publish or event */
        enum wire_event_kind kind;
        uint32_t nevents;
        bool had_fd;
};

#define REC_CAP 256
#define NCLIENTS 3
#define SEG_BYTES 64

struct rclient {
        struct session *s;
        struct rec log[REC_CAP];
        unsigned n;
        bool overflow;
};

static struct {
        uv_loop_t loop;
        struct store store;
        struct registry reg;
        struct rclient cl[NCLIENTS];
        uint64_t next_id;
        bool memfd_failed;
        unsigned send_failures;
        uint8_t buf[1 << 16];
} R;

/*
 * The peer's side of session_send: the reply is packed as the connection
 * would pack it (allocations included, inside the armed region) and noted in
 * a log sized beforehand, which takes nothing from the heap.
 */
static int rec_send(void *ctx, const struct wire_reply *rep, int fd_arg, struct segment *seg)
{
        /* a segment's fd is what the connection would attach */
        int fd = seg ? seg->fd : fd_arg;
        struct rclient *c = ctx;
        struct rec *r;
        size_t size;
        int err = wire_reply_encode(rep, R.buf, sizeof(R.buf), &size);

        if (err < 0) {
                R.send_failures++;
                return err;
        }
        if (c->n == REC_CAP) {
                c->overflow = true;
                return 0;
        }
        r = &c->log[c->n++];
        memset(r, 0, sizeof(*r));
        r->id = rep->id;
        r->type = rep->type;
        r->status = rep->status;
        r->had_fd = fd >= 0;
        switch (rep->type) {
        case WIRE_REP_ACQUIRE:
                r->a = rep->acquire.lease;
                r->b = rep->acquire.tensor.segment;
                break;
        case WIRE_REP_PUBLISH:
                r->a = rep->publish.version;
                r->b = rep->publish.segment;
                break;
        case WIRE_REP_ALLOC:
                r->a = rep->alloc.segment;
                break;
        case WIRE_REP_WATCH:
                r->a = rep->watch.watch;
                break;
        case WIRE_REP_EVENT:
                r->kind = rep->event.kind;
                r->a = rep->event.token;
                r->b = rep->event.segment;
                r->nevents = rep->event.nevents;
                break;
        default:
                break;
        }
        return 0;
}

/* The reply to request id when it is a success of type, else NULL. */
static const struct rec *ok(const struct rclient *c, uint64_t id, enum wire_reply_type type)
{
        if (!id)
                return NULL;
        for (unsigned i = 0; i < c->n; i++) {
                const struct rec *r = &c->log[i];
                if (r->type != WIRE_REP_EVENT && r->id == id)
                        return r->status == WIRE_OK && r->type == type ? r : NULL;
        }
        return NULL;
}

/* The status of the reply to request id, or -1 when there is none. */
static int status_of(const struct rclient *c, uint64_t id)
{
        for (unsigned i = 0; id && i < c->n; i++)
                if (c->log[i].type != WIRE_REP_EVENT && c->log[i].id == id)
                        return c->log[i].status;
        return -1;
}

static unsigned events_of(const struct rclient *c, enum wire_event_kind kind, uint32_t nevents)
{
        unsigned n = 0;

        for (unsigned i = 0; i < c->n; i++)
                n += c->log[i].type == WIRE_REP_EVENT && c->log[i].kind == kind &&
                     c->log[i].nevents >= nevents;
        return n;
}

static uint64_t start(struct wire_request *req, enum wire_request_type type)
{
        memset(req, 0, sizeof(*req));
        req->id = R.next_id++;
        req->type = type;
        return req->id;
}

static void client_open(struct rclient *c, uid_t uid, pid_t pid, const char *name)
{
        c->s = registry_session_new(&R.reg, uid, uid, pid);
        if (!c->s)
                return;
        c->s->greeted = true;
        c->s->io.send = rec_send;
        c->s->io.ctx = c;
        wire_strcpy(c->s->name, sizeof(c->s->name), name);
}

static void client_close(struct rclient *c)
{
        registry_session_free(c->s);
        c->s = NULL;
}

/* A sealed segment, or -1 noted in R.memfd_failed, which the run asserts at its end. */
static int try_sealed_memfd(void)
{
        int fd = memfd_create("test-allocfail", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        if (fd < 0 || ftruncate(fd, SEG_BYTES) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
                if (fd >= 0)
                        close(fd);
                R.memfd_failed = true;
                return -1;
        }
        return fd;
}

enum source { FROM_FD, FROM_FD_HELD, FROM_SEGMENT, FROM_IPC };

/* Publishes 16 float32; returns the request id, 0 when skipped. */
static uint64_t do_publish(struct rclient *c, const char *name, enum source src, uint64_t segment,
                           bool persist, uint64_t token, uint64_t flags)
{
        struct wire_request req;
        struct wire_tensor *t = &req.publish.tensor;
        uint64_t id;
        int fd = -1;

        if (!c->s || (src == FROM_SEGMENT && !segment))
                return 0;
        id = start(&req, WIRE_REQ_PUBLISH);
        wire_strcpy(t->name, sizeof(t->name), name);
        t->dtype.code = kDLFloat;
        t->dtype.bits = 32;
        t->dtype.lanes = 1;
        t->ndim = 1;
        t->shape[0] = 16;
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->length = SEG_BYTES;
        t->flags = flags;
        req.publish.persist = persist;
        req.publish.token = token;
        switch (src) {
        case FROM_FD_HELD:
                req.publish.hold = true;
                /* fall through */
        case FROM_FD:
                fd = try_sealed_memfd();
                if (fd < 0)
                        return 0;
                break;
        case FROM_SEGMENT:
                t->segment = segment;
                break;
        case FROM_IPC:
                t->device_type = kDLCUDA;
                t->storage = WIRE_STORAGE_CUDA_IPC;
                t->has_ipc_handle = true;
                fill_handle(t->ipc_handle, 7);
                t->has_event = true;
                fill_handle(t->event, 8);
                req.publish.segment_size = 4096;
                break;
        }
        registry_publish(c->s, &req, fd);
        return id;
}

/* Returns the request id (0 when skipped); the reply may come later. */
static uint64_t do_acquire(struct rclient *c, const char *name, uint64_t min_version,
                           int64_t timeout_ms)
{
        struct wire_request req;
        uint64_t id;

        if (!c->s)
                return 0;
        id = start(&req, WIRE_REQ_ACQUIRE);
        wire_strcpy(req.acquire.name, sizeof(req.acquire.name), name);
        req.acquire.min_version = min_version;
        req.acquire.timeout_ms = timeout_ms;
        registry_acquire(c->s, &req);
        return id;
}

static uint64_t lease_of(const struct rclient *c, uint64_t acquire_id)
{
        const struct rec *r = ok(c, acquire_id, WIRE_REP_ACQUIRE);
        return r ? r->a : 0;
}

static void do_release(struct rclient *c, uint64_t lease, unsigned event_seed)
{
        struct wire_request req;

        if (!c->s || !lease)
                return;
        start(&req, WIRE_REQ_RELEASE);
        req.release.lease = lease;
        if (event_seed) {
                req.release.has_event = true;
                fill_handle(req.release.event, event_seed);
        }
        registry_release(c->s, &req);
}

static uint64_t do_alloc(struct rclient *c, uint64_t size)
{
        struct wire_request req;
        const struct rec *r;
        uint64_t id;

        if (!c->s)
                return 0;
        id = start(&req, WIRE_REQ_ALLOC);
        req.alloc.size = size;
        registry_alloc(c->s, &req, -1);
        r = ok(c, id, WIRE_REP_ALLOC);
        return r ? r->a : 0;
}

static uint64_t do_watch(struct rclient *c, const char *prefix)
{
        struct wire_request req;
        const struct rec *r;
        uint64_t id;

        if (!c->s)
                return 0;
        id = start(&req, WIRE_REQ_WATCH);
        wire_strcpy(req.watch.prefix, sizeof(req.watch.prefix), prefix);
        registry_watch(c->s, &req);
        r = ok(c, id, WIRE_REP_WATCH);
        return r ? r->a : 0;
}

/* The requests that take a name, a prefix, an id or nothing. */
static uint64_t do_simple(struct rclient *c, enum wire_request_type type, const char *name,
                          uint64_t arg)
{
        struct wire_request req;
        uint64_t id;

        if (!c->s)
                return 0;
        id = start(&req, type);
        switch (type) {
        case WIRE_REQ_UNPUBLISH:
                wire_strcpy(req.unpublish.name, sizeof(req.unpublish.name), name);
                registry_unpublish(c->s, &req);
                break;
        case WIRE_REQ_STAT:
                wire_strcpy(req.stat.name, sizeof(req.stat.name), name);
                registry_stat(c->s, &req);
                break;
        case WIRE_REQ_LIST:
                wire_strcpy(req.list.prefix, sizeof(req.list.prefix), name);
                req.list.limit = (uint32_t)arg;
                registry_list(c->s, &req);
                break;
        case WIRE_REQ_UNWATCH:
                req.unwatch.watch = arg;
                registry_unwatch(c->s, &req);
                break;
        case WIRE_REQ_FREE:
                req.free.segment = arg;
                registry_free(c->s, &req);
                break;
        case WIRE_REQ_STATS:
                registry_stats(c->s, &req);
                break;
        default:
                ck_abort_msg("not a simple request: %d", type);
        }
        return id;
}

/* Forgets every segment whose fd an acquire reply brought. */
static void do_forget(struct rclient *c)
{
        struct wire_request req;

        if (!c->s)
                return;
        start(&req, WIRE_REQ_FORGET);
        for (unsigned i = 0; i < c->n && req.forget.count < DLX_FORGET_MAX; i++)
                if (c->log[i].type == WIRE_REP_ACQUIRE && c->log[i].had_fd)
                        req.forget.segments[req.forget.count++] = c->log[i].b;
        if (req.forget.count)
                registry_forget(c->s, &req);
}

/* Runs the loop until the reply to id came, for at most a second. */
static void wait_reply(struct rclient *c, uint64_t id)
{
        uint64_t deadline = uv_hrtime() + 1000000000u;
        struct timespec nap = {0, 200000};

        while (id && status_of(c, id) < 0 && uv_hrtime() < deadline) {
                uv_run(&R.loop, UV_RUN_NOWAIT);
                nanosleep(&nap, NULL);
        }
}

/* What the scenario saw go right, for the clean run to check. */
static struct {
        uint64_t wait_id, late_id, eacces_id;
} S;

/*
 * The scenario: every step may fail, and later steps go on with whatever
 * the earlier ones left (a session that could not be made is skipped).
 */
static void scenario(void)
{
        struct rclient *p = &R.cl[0], *c = &R.cl[1], *w = &R.cl[2];
        uint64_t seg, watch_all;

        client_open(p, 1000, 10, "producer");
        client_open(c, 1000, 11, "consumer");
        client_open(w, 2000, 12, "watcher");

        watch_all = do_watch(w, "");
        do_watch(w, "m/");
        /* one acquire waits for a publish, another for nothing and times out */
        S.wait_id = do_acquire(c, "m/a", 1, 10000);
        S.late_id = do_acquire(c, "m/late", 0, 1);

        seg = do_alloc(p, 4096);
        do_publish(p, "m/a", FROM_FD, 0, false, 1, 0);
        do_publish(p, "m/b", FROM_SEGMENT, seg, true, 2, 0);
        do_publish(p, "m/c", FROM_FD_HELD, 0, false, 3, 0);
        do_publish(p, "m/ro", FROM_FD, 0, true, 0, DLPACK_FLAG_BITMASK_READ_ONLY);
        do_publish(p, "p/keep", FROM_FD, 0, true, 0, 0);
        /* a new version of m/a while the waiter's lease holds the old one */
        do_publish(p, "m/a", FROM_FD, 0, false, 4, 0);
        /* another uid may not replace it: the fd is closed all the same */
        S.eacces_id = do_publish(w, "m/a", FROM_FD, 0, false, 0, 0);

        do_acquire(c, "m/a", 0, 0);
        do_acquire(c, "m/b", 0, 0);
        do_acquire(c, "m/c", 0, 0);
        do_acquire(c, "m/ro", 0, 0);
        do_acquire(w, "m/ro", 0, 0);

        /* consumers' release events go back to the producer with RELEASED */
        do_publish(p, "g/x", FROM_IPC, 0, false, 5, 0);
        do_release(c, lease_of(c, do_acquire(c, "g/x", 0, 0)), 20);
        do_release(c, lease_of(c, do_acquire(c, "g/x", 0, 0)), 21);
        do_release(w, lease_of(w, do_acquire(w, "g/x", 0, 0)), 22);
        do_simple(p, WIRE_REQ_UNPUBLISH, "g/x", 0);

        do_simple(c, WIRE_REQ_LIST, "", 0);
        do_simple(c, WIRE_REQ_LIST, "m/", 1);
        do_simple(w, WIRE_REQ_STAT, "m/a", 0);
        do_simple(w, WIRE_REQ_STATS, NULL, 0);

        wait_reply(c, S.late_id);

        /* the old m/a dies with its last lease: RELEASED to the producer */
        do_release(c, lease_of(c, S.wait_id), 0);
        do_forget(c);
        do_simple(p, WIRE_REQ_UNPUBLISH, "m/b", 0);
        if (seg)
                do_simple(p, WIRE_REQ_FREE, NULL, seg);
        if (watch_all)
                do_simple(w, WIRE_REQ_UNWATCH, NULL, watch_all);

        /* the consumer's leases go with it; the producer's versions with it */
        client_close(c);
        client_close(p);
        client_close(w);
}

/* A fresh loop, store and registry (unarmed); returns the fd count before them. */
static int registry_setup(void)
{
        struct wire_limit_set lim;
        int fds_before;

        /*
         * What lives as long as the process is made before anything is
         * counted: libuv's signal pipe, opened by the first loop, and the
         * time zone that the log's gmtime_r() would load on its first line.
         */
        ck_assert_int_eq(uv_loop_init(&R.loop), 0);
        ck_assert_int_eq(uv_loop_close(&R.loop), 0);
        tzset();
        fds_before = count_fds(0);

        memset(&R.cl, 0, sizeof(R.cl));
        R.next_id = 1;
        R.memfd_failed = false;
        R.send_failures = 0;
        ck_assert_int_eq(uv_loop_init(&R.loop), 0);
        store_init(&R.store);
        registry_default_limits(&lim);
        lim.max_bytes = 1 << 20;
        registry_init(&R.reg, &R.loop, &R.store, &lim);
        return fds_before;
}

/* Tears it all down (unarmed) and checks nothing is left: blocks, fds, counts. */
static void registry_teardown(int fds_before, const char *what, unsigned fail_at, enum af_mode mode)
{
        unsigned live;

        for (unsigned i = 0; i < NCLIENTS; i++)
                client_close(&R.cl[i]);
        registry_done(&R.reg);
        ck_assert_uint_eq(R.reg.nsessions, 0);
        ck_assert_uint_eq(R.reg.nnames, 0);
        ck_assert_uint_eq(R.reg.nversions, 0);
        ck_assert_uint_eq(R.reg.nleases, 0);
        ck_assert_uint_eq(R.reg.watches.count, 0);
        ck_assert_uint_eq(R.reg.names.count, 0);
        ck_assert_uint_eq(R.store.uids.count, 0);
        store_done(&R.store);
        ck_assert_uint_eq(R.store.segments.count, 0);
        ck_assert_uint_eq(R.store.bytes, 0);
        /* waiter timers close here */
        for (int i = 0; i < 16 && uv_loop_alive(&R.loop); i++)
                uv_run(&R.loop, UV_RUN_NOWAIT);
        ck_assert_int_eq(uv_loop_close(&R.loop), 0);

        ck_assert(!R.memfd_failed);
        for (unsigned i = 0; i < NCLIENTS; i++)
                ck_assert(!R.cl[i].overflow);
        live = af.live;
        ck_assert_msg(live == 0,
                      "%s, %s = %u fails: %u blocks leaked (the oldest from allocation #%u)", what,
                      mode_names[mode], fail_at, live, live ? af_oldest() : 0);
        ck_assert_msg(count_fds(0) == fds_before, "%s, %s = %u fails: %d fds leaked", what,
                      mode_names[mode], fail_at, count_fds(0) - fds_before);
}

/* The scenario with a fresh registry; returns its attempts and failures. */
static unsigned registry_run(unsigned fail_at, enum af_mode mode, unsigned *ret_injected)
{
        int fds_before = registry_setup();
        unsigned calls;

        af_arm(fail_at, mode);
        scenario();
        af_disarm();
        calls = af.calls;
        *ret_injected = af.injected;
        registry_teardown(fds_before, "registry", fail_at, mode);
        return calls;
}

/* The clean run did what the scenario means to do (so the sweep covers it). */
static void check_clean_run(void)
{
        const struct rclient *p = &R.cl[0], *c = &R.cl[1], *w = &R.cl[2];

        ck_assert_uint_eq(R.send_failures, 0);
        ck_assert_ptr_nonnull(ok(c, S.wait_id, WIRE_REP_ACQUIRE));
        ck_assert_int_eq(status_of(c, S.late_id), WIRE_TIMEOUT);
        ck_assert_int_eq(status_of(w, S.eacces_id), WIRE_PERMISSION);
        /*
         * g/x with three consumer events; m/a v1 and m/b without. m/a v2 and
         * m/c die with their producer, which is told nothing then.
         */
        ck_assert_uint_eq(events_of(p, WIRE_EVENT_RELEASED, 3), 1);
        ck_assert_uint_eq(events_of(p, WIRE_EVENT_RELEASED, 0), 3);
        ck_assert_uint_ge(events_of(p, WIRE_EVENT_SEGMENT_GONE, 0), 1);
        ck_assert_uint_ge(events_of(w, WIRE_EVENT_PUBLISHED, 0), 6);
        ck_assert_uint_ge(events_of(w, WIRE_EVENT_REPLACED, 0), 1);
        ck_assert_uint_ge(events_of(w, WIRE_EVENT_UNPUBLISHED, 0), 2);
        for (unsigned i = 0; i < c->n; i++)
                ck_assert_msg(c->log[i].status == WIRE_OK || (c->log[i].id == S.late_id &&
                                                              c->log[i].status == WIRE_TIMEOUT),
                              "consumer's request %llu failed: %d",
                              (unsigned long long)c->log[i].id, c->log[i].status);
}

static void registry_pass(enum af_mode mode)
{
        unsigned clean_calls, injected, n;
        int saved_stderr, devnull, saved_level = log_level;

        /* every log line's formatting runs under failure too, out of sight */
        log_level = LOG_DEBUG;
        saved_stderr = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
        ck_assert(saved_stderr >= 0 && devnull >= 0);
        ck_assert_int_eq(dup2(devnull, STDERR_FILENO), STDERR_FILENO);
        close(devnull);

        clean_calls = registry_run(0, mode, &injected);
        check_clean_run();
        for (n = 1;; n++) {
                ck_assert_uint_lt(n, 100000);
                registry_run(n, mode, &injected);
                if (!injected)
                        break;
        }

        ck_assert_int_eq(dup2(saved_stderr, STDERR_FILENO), STDERR_FILENO);
        close(saved_stderr);
        log_level = saved_level;
        fprintf(stderr,
                "allocfail: registry scenario, %s: %u failure points (%u allocations in "
                "the clean run)\n",
                mode_names[mode], n - 1, clean_calls);
        ck_assert_uint_gt(n - 1, 0);
        ck_assert_uint_eq(n - 1, clean_calls);
}

START_TEST(test_registry)
{
        registry_pass(AF_ONE);
}
END_TEST

START_TEST(test_registry_from)
{
        registry_pass(AF_FROM);
}
END_TEST

/*
 * A publish or an alloc that fails holds nothing for the session: the peer
 * never learns the segment's id, so it could never free it. Before the fix
 * in registry_publish(), a publish with hold=true whose 3rd allocation (the
 * entry) or 4th (the version) failed left the adopted memfd held, and its
 * bytes charged to the uid, until the session ended.
 */
START_TEST(test_failed_request_holds_nothing)
{
        static const enum wire_request_type types[] = {WIRE_REQ_PUBLISH, WIRE_REQ_ALLOC};

        for (unsigned i = 0; i < N_ELEMS(types); i++) {
                const char *what = wire_request_name(types[i]);
                unsigned n;

                for (n = 1;; n++) {
                        int fds_before = registry_setup();
                        struct rclient *p = &R.cl[0];
                        uint64_t id = R.next_id;
                        unsigned injected;

                        client_open(p, 1000, 10, "producer");
                        ck_assert_ptr_nonnull(p->s);
                        af_arm(n, AF_ONE);
                        if (types[i] == WIRE_REQ_PUBLISH)
                                do_publish(p, "m/held", FROM_FD_HELD, 0, false, 1, 0);
                        else
                                do_alloc(p, 4096);
                        af_disarm();
                        injected = af.injected;
                        if (injected) {
                                ck_assert_int_ne(status_of(p, id), WIRE_OK);
                                ck_assert_msg(p->s->nheld == 0 && R.store.segments.count == 0 &&
                                                      R.store.bytes == 0,
                                              "failed %s, #%u failing: %u held, %llu segments, "
                                              "%llu bytes",
                                              what, n, p->s->nheld,
                                              (unsigned long long)R.store.segments.count,
                                              (unsigned long long)R.store.bytes);
                                ck_assert_uint_eq(R.reg.nversions, 0);
                                ck_assert_uint_eq(R.reg.names.count, 0);
                        } else {
                                ck_assert_int_eq(status_of(p, id), WIRE_OK);
                        }
                        registry_teardown(fds_before, what, n, AF_ONE);
                        if (!injected)
                                break;
                }
                ck_assert_uint_gt(n - 1, 0);
        }
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

Suite *allocfail_suite(void)
{
        Suite *s = suite_create("allocfail");
        TCase *tc;

        if (getenv("DLX_TEST_VALGRIND") || RUNNING_ON_VALGRIND) {
                fprintf(stderr, "allocfail: skipped under valgrind, which owns malloc\n");
                exit(77);
        }
        tc = tcase_create("interposer");
        tcase_add_test(tc, test_interposer);
        suite_add_tcase(s, tc);
        tc = tcase_create("codec");
        tcase_add_checked_fixture(tc, codec_setup, codec_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_codec_requests);
        tcase_add_test(tc, test_codec_replies);
        tcase_add_test(tc, test_codec_replies_from);
        suite_add_tcase(s, tc);
        tc = tcase_create("registry");
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_registry);
        tcase_add_test(tc, test_registry_from);
        tcase_add_test(tc, test_failed_request_holds_nothing);
        suite_add_tcase(s, tc);
        return s;
}

#else /* ALLOCFAIL_OFF */

Suite *allocfail_suite(void)
{
        fprintf(stderr, "allocfail: skipped: %s\n", ALLOCFAIL_OFF);
        exit(77);
}

#endif /* ALLOCFAIL_OFF */
