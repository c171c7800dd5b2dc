/* SPDX-License-Identifier: MIT */
/*
 * Crash and soak: one real dlxd and DLX_SOAK_CLIENTS (64) client processes
 * that publish (zero-copy and one-copy, persistent or not), replace, unpublish,
 * acquire with and without waiting, hold leases for a while, release, list and
 * watch, for DLX_SOAK_SECONDS (60), while a killer SIGKILLs a random client
 * every 100-300 ms and starts a fresh one in its slot.
 *
 * Every tensor's bytes are a pure function of its name and version, with a
 * checksum in its header, so every read (at acquire, again at release, and the
 * producer's own bytes when its deleter runs) is verified by whoever reads it.
 * Afterwards the daemon must hold no lease of a dead client, and its open fds
 * and RSS must be back at their baseline.
 *
 * Not part of the default `meson test` run (the 'default' test setup excludes
 * the 'soak' suite): `meson test -C build --suite soak --verbose`.
 *
 * Environment: DLX_SOAK_SECONDS (default 60), DLX_SOAK_CLIENTS (default 64, 4 to
 * 256), DLX_SOAK_WARMUP (seconds of the same load before the baseline is
 * taken, default 5), DLX_SOAK_SEED (random seed, default from the clock).
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"

#define MAX_SLOTS 256
#define KEYS 6        /* names a producer keeps at once */
#define MAX_HELD 16   /* leases a consumer holds at once */
#define CACHE 64      /* names a consumer remembers from dlx_list() */
#define MAX_ERRNO 160 /* errors are counted by errno below this */
#define MAX_NOTES 24
#define HUNG_MS 15000 /* a client without a heartbeat this long is stuck */
#define RSS_TOLERANCE 0.05
/*
 * ... or this many KiB, whichever is more: a baseline of 3.4 MiB leaves 5% at
 * 170 KiB, within what malloc keeps of a busy minute's peaks (seen: +188 KiB
 * after peaks of +700). A leak of even a byte an operation is megabytes.
 */
#define RSS_SLACK_KIB 512

/*
 * Under AddressSanitizer (the build the daemon and this test share) freed
 * memory waits in ASan's quarantine (256 MiB by default) with its shadow
 * mapped: the daemon's RSS then says nothing about its own heap. Reported,
 * not checked.
 */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_CHECKED false
#else
#define RSS_CHECKED true
#endif

/* ---- shared between the test and its clients ----------------------------------------------- */

struct counters {
        uint64_t ops;       /* libdlx calls made, dlx_next_event() apart */
        uint64_t publishes; /* successful; by kind: */
        uint64_t pub_zero, pub_copy_always, pub_plain; /* zero-copy, DLX_COPY_ALWAYS, malloc() */
        uint64_t unpublishes;
        uint64_t acquires;  /* successful */
        uint64_t reads;     /* verifications of tensor bytes begun (acquire, release, deleter) */
        uint64_t verified;  /* ended and passed */
        uint64_t bad_reads; /* ended with a checksum, pattern or metadata mismatch */
        uint64_t releases;  /* deleters of acquired tensors */
        uint64_t held;      /* acquires kept for a while before release */
        uint64_t prod_deleters; /* zero-copy publishes whose deleter ran */
        uint64_t events;
        uint64_t lists;
        uint64_t anomalies; /* failures that are not an errno: a wrong version, a late deleter */
        uint64_t fatal;     /* clients that lost their connection or died on their own */
        uint64_t expected[MAX_ERRNO];
        uint64_t unexpected[MAX_ERRNO];
        uint32_t nnotes;
        char notes[MAX_NOTES][240];
};

struct shared {
        struct counters n;
        /* a producer slot's names: gen << 32 | incarnation << 8 | 1 (published once), per key */
        uint64_t adv[MAX_SLOTS][KEYS];
        int64_t beat[MAX_SLOTS]; /* CLOCK_MONOTONIC ms of each client's last loop */
        int stop[MAX_SLOTS];     /* 1: release, close and exit 0 */
};

static struct shared *sh;
static int nclients;

#define ADD(field, v) __atomic_add_fetch(&sh->n.field, (v), __ATOMIC_RELAXED)

/* Keeps the first MAX_NOTES failures' words, for the report. */
static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
        uint32_t i = __atomic_fetch_add(&sh->n.nnotes, 1, __ATOMIC_RELAXED);
        va_list ap;

        if (i >= MAX_NOTES)
                return;
        va_start(ap, fmt);
        vsnprintf(sh->n.notes[i], sizeof(sh->n.notes[i]), fmt, ap);
        va_end(ap);
}

static const char *errname(int e)
{
        const char *s = strerrorname_np(e);
        return s ? s : "?";
}

/* ---- tensor contents: a function of (name, version) ------------------------------------------ */

/* header words; the payload follows */
enum { H_MAGIC, H_NAME, H_VERSION, H_WORDS, H_SUM, H_PID, HDR = 8 };
#define MAGIC UINT64_C(0x316b616f73786c64) /* "dlxsoak1" */

/* A hash of x: splitmix64's next output from state x (toolkit.h). */
static uint64_t mix64(uint64_t x)
{
        return rng_next(&x);
}

static uint64_t name_hash(const char *s)
{
        uint64_t h = UINT64_C(0xcbf29ce484222325);

        while (*s)
                h = (h ^ (uint8_t)*s++) * UINT64_C(0x100000001b3);
        return h;
}

static uint64_t tensor_seed(const char *name, uint64_t version)
{
        return mix64(name_hash(name) ^ mix64(version));
}

/* Mostly up to 8 KiB, one in sixteen up to 256 KiB. */
static int64_t tensor_words(uint64_t seed)
{
        uint64_t h = mix64(seed ^ 0x5a5a5a5a);

        if (h % 16 == 0)
                return HDR + 4096 + (int64_t)((h >> 8) % 28672);
        return HDR + 1 + (int64_t)((h >> 8) % 1024);
}

static uint64_t sum_step(uint64_t sum, uint64_t w)
{
        return (sum ^ w) * UINT64_C(0x100000001b3);
}

static void fill(uint64_t *w, int64_t n, const char *name, uint64_t version)
{
        uint64_t seed = tensor_seed(name, version);
        uint64_t sum = UINT64_C(0xcbf29ce484222325);

        for (int64_t i = HDR; i < n; i++) {
                w[i] = mix64(seed + (uint64_t)i);
                sum = sum_step(sum, w[i]);
        }
        w[H_MAGIC] = MAGIC;
        w[H_NAME] = name_hash(name);
        w[H_VERSION] = version;
        w[H_WORDS] = (uint64_t)n;
        w[H_SUM] = sum;
        w[H_PID] = (uint64_t)getpid();
        w[6] = w[7] = 0;
}

/*
 * Checks the bytes against the checksum in their header, and both against
 * what (name, version) must hold. Returns true, or false with why.
 */
static bool check_words(const uint64_t *w, int64_t n, const char *name, uint64_t version, char *why,
                        size_t whysz)
{
        uint64_t seed = tensor_seed(name, version);
        uint64_t sum = UINT64_C(0xcbf29ce484222325);
        int64_t bad = -1;

        if (n != tensor_words(seed)) {
                snprintf(why, whysz, "%" PRId64 " words, %" PRId64 " expected", n,
                         tensor_words(seed));
                return false;
        }
        if (w[H_MAGIC] != MAGIC || w[H_NAME] != name_hash(name) || w[H_VERSION] != version ||
            w[H_WORDS] != (uint64_t)n) {
                snprintf(why, whysz,
                         "header says magic %016" PRIx64 " name %016" PRIx64 " v%" PRIu64
                         " words %" PRIu64 " (pid %" PRIu64 ")",
                         w[H_MAGIC], w[H_NAME], w[H_VERSION], w[H_WORDS], w[H_PID]);
                return false;
        }
        for (int64_t i = HDR; i < n; i++) {
                sum = sum_step(sum, w[i]);
                if (bad < 0 && w[i] != mix64(seed + (uint64_t)i))
                        bad = i;
        }
        if (sum != w[H_SUM] || bad >= 0) {
                snprintf(why, whysz,
                         "checksum %016" PRIx64 " computed, %016" PRIx64
                         " stored; first bad word %" PRId64 " of %" PRId64 " (producer pid %" PRIu64
                         ")",
                         sum, w[H_SUM], bad, n, w[H_PID]);
                return false;
        }
        return true;
}

/* Verifies an acquired tensor: metadata, then bytes. Counts the read. */
static bool verify_tensor(const DLManagedTensorVersioned *t, const char *want, const char *when)
{
        const DLTensor *d = &t->dl_tensor;
        const char *name = NULL, *storage = NULL;
        uint64_t version = 0;
        char why[200] = "";
        bool ok = false;

        ADD(reads, 1);
        if (dlx_tensor_info(t, &name, &version, &storage) < 0)
                snprintf(why, sizeof(why), "dlx_tensor_info: %s", dlx_last_error());
        else if (want && strcmp(want, name) != 0)
                snprintf(why, sizeof(why), "asked for %s", want);
        else if (strcmp(storage, "memfd") != 0)
                snprintf(why, sizeof(why), "storage %s", storage);
        else if (d->device.device_type != kDLCPU || d->ndim != 1 || d->dtype.code != kDLUInt ||
                 d->dtype.bits != 64 || d->dtype.lanes != 1 || (d->strides && d->strides[0] != 1))
                snprintf(why, sizeof(why), "layout: device %d ndim %d dtype %u/%u/%u",
                         (int)d->device.device_type, d->ndim, d->dtype.code, d->dtype.bits,
                         d->dtype.lanes);
        else if (!(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY))
                snprintf(why, sizeof(why), "not read-only");
        else
                ok = check_words((const uint64_t *)((const char *)d->data + d->byte_offset),
                                 d->shape[0], name, version, why, sizeof(why));
        if (ok) {
                ADD(verified, 1);
                return true;
        }
        ADD(bad_reads, 1);
        note("pid %d: bad read %s of %s v%" PRIu64 ": %s", (int)getpid(), when, name ? name : "?",
             version, why);
        return false;
}

/* ---- a client process ------------------------------------------------------------------------ */

struct key {
        uint32_t inc;     /* incarnation: a fresh name after each unpublish */
        uint64_t version; /* last published, 0 none */
        bool persist;
        char name[64];
};

struct hold {
        DLManagedTensorVersioned *t;
        int64_t until;
};

struct client {
        dlx_client *c;
        int slot;
        uint32_t gen;
        uint64_t rng;
        bool producer, consumer, watcher, poller;
        uint64_t watch;
        int64_t next_cleanup;
        struct key keys[KEYS];
        struct hold held[MAX_HELD];
        int nheld;
        char cache[CACHE][DLX_NAME_MAX + 1];
        int ncache;
        uint64_t listed;
        char event_name[DLX_NAME_MAX + 1];
        uint64_t event_version;
};

static unsigned rnd(struct client *cl, unsigned n)
{
        cl->rng = mix64(cl->rng);
        return (unsigned)(cl->rng % n);
}

/* Slots that produce: a quarter pure producers, a quarter both. */
static bool slot_produces(int slot)
{
        return slot % 4 == 0 || slot % 4 == 3;
}

static void fatal_exit(struct client *cl, const char *what, int err)
{
        ADD(fatal, 1);
        note("pid %d slot %d: %s: %s (%s): client unusable", (int)getpid(), cl->slot, what,
             dlx_strerror(err), dlx_last_error());
        _exit(3);
}

/*
 * Counts one call's outcome. allowed lists the errnos that are part of the
 * game (0-terminated), counted but not failures. A lost connection ends the
 * client: it can do nothing more.
 */
static int outcome(struct client *cl, const char *what, const char *name, int err,
                   const int *allowed)
{
        int e = -err;

        ADD(ops, 1);
        if (err >= 0)
                return err;
        for (; allowed && *allowed; allowed++) {
                if (e == *allowed) {
                        ADD(expected[e < MAX_ERRNO ? e : 0], 1);
                        return err;
                }
        }
        ADD(unexpected[e < MAX_ERRNO ? e : 0], 1);
        note("pid %d slot %d: %s %s: %s (%s)", (int)getpid(), cl->slot, what, name ? name : "",
             errname(e), dlx_last_error());
        if (e == ECONNRESET || e == EPIPE || e == EPROTO || e == ESHUTDOWN)
                fatal_exit(cl, what, err);
        return err;
}

#define ALLOW(...) ((const int[]){__VA_ARGS__, 0})

/* Set by the deleter of a tensor published by copy, which must run before dlx_publish() returns. */
static int copy_deleted;

/* A producer's zero-copy tensor, wrapped so its deleter checks nobody wrote into it. */
struct guarded {
        DLManagedTensorVersioned mt;
        DLManagedTensorVersioned *inner;
        uint64_t version;
        bool copied; /* published with DLX_COPY_ALWAYS: the deleter runs inside dlx_publish() */
        char name[64];
};

static void guarded_deleter(DLManagedTensorVersioned *t)
{
        struct guarded *g = t->manager_ctx;
        const DLTensor *d = &g->inner->dl_tensor;
        char why[200];

        ADD(reads, 1);
        if (check_words((const uint64_t *)((const char *)d->data + d->byte_offset), d->shape[0],
                        g->name, g->version, why, sizeof(why))) {
                ADD(verified, 1);
        } else {
                ADD(bad_reads, 1);
                note("pid %d: producer's own %s v%" PRIu64 " changed while published: %s",
                     (int)getpid(), g->name, g->version, why);
        }
        if (g->copied)
                copy_deleted = 1;
        else
                ADD(prod_deleters, 1);
        g->inner->deleter(g->inner);
        free(g);
}

/* Plain malloc() memory: published by one copy. */
struct plain {
        DLManagedTensorVersioned mt;
        int64_t shape[1];
        uint64_t words[];
};

static void plain_deleter(DLManagedTensorVersioned *t)
{
        copy_deleted = 1;
        free(t->manager_ctx);
}

static void key_name(struct client *cl, int k)
{
        snprintf(cl->keys[k].name, sizeof(cl->keys[k].name), "soak/%d/%u/%d.%u", cl->slot, cl->gen,
                 k, cl->keys[k].inc);
}

static void advertise(struct client *cl, int k)
{
        uint64_t v = (uint64_t)cl->gen << 32 | (uint64_t)cl->keys[k].inc << 8 |
                     (cl->keys[k].version > 0);

        __atomic_store_n(&sh->adv[cl->slot][k], v, __ATOMIC_RELAXED);
}

static void publish_next(struct client *cl, int k)
{
        struct key *key = &cl->keys[k];
        uint64_t want = key->version + 1, got = 0;
        int64_t n = tensor_words(tensor_seed(key->name, want));
        struct dlx_publish_options o = {.persist = key->persist};
        DLManagedTensorVersioned *t;
        unsigned mode = rnd(cl, 10);
        int err;

        if (key->version == 0)
                o.persist = key->persist = rnd(cl, 3) == 0;
        if (mode < 7) {
                /* dlx_alloc() memory: zero-copy, or (1 in 7) DLX_COPY_ALWAYS */
                DLTensor proto = {
                        .device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 64, 1}, .shape = &n};
                struct guarded *g;

                err = outcome(cl, "alloc", key->name, dlx_alloc(cl->c, &proto, &t), NULL);
                if (err < 0)
                        return;
                fill((uint64_t *)((char *)t->dl_tensor.data + t->dl_tensor.byte_offset), n,
                     key->name, want);
                g = calloc(1, sizeof(*g));
                if (!g) {
                        t->deleter(t);
                        return;
                }
                g->mt = *t;
                g->mt.manager_ctx = g;
                g->mt.deleter = guarded_deleter;
                g->inner = t;
                g->version = want;
                snprintf(g->name, sizeof(g->name), "%s", key->name);
                if (mode == 6) {
                        o.copy = DLX_COPY_ALWAYS;
                        g->copied = true;
                }
                t = &g->mt;
        } else {
                /* plain memory: one copy */
                struct plain *p = malloc(sizeof(*p) + (size_t)n * sizeof(uint64_t));

                if (!p)
                        return;
                memset(&p->mt, 0, sizeof(p->mt));
                p->mt.version.major = DLX_DLPACK_MAJOR;
                p->mt.version.minor = DLX_DLPACK_MINOR;
                p->mt.manager_ctx = p;
                p->mt.deleter = plain_deleter;
                p->mt.dl_tensor.data = p->words;
                p->mt.dl_tensor.device.device_type = kDLCPU;
                p->mt.dl_tensor.ndim = 1;
                p->mt.dl_tensor.dtype.code = kDLUInt;
                p->mt.dl_tensor.dtype.bits = 64;
                p->mt.dl_tensor.dtype.lanes = 1;
                p->shape[0] = n;
                p->mt.dl_tensor.shape = p->shape;
                fill(p->words, n, key->name, want);
                t = &p->mt;
        }
        copy_deleted = 0;
        err = outcome(cl, "publish", key->name, dlx_publish(cl->c, key->name, t, &o, &got), NULL);
        if (mode >= 6 && !copy_deleted) {
                ADD(anomalies, 1);
                note("pid %d: the deleter of copied %s v%" PRIu64 " did not run in dlx_publish()",
                     (int)getpid(), key->name, want);
        }
        if (err < 0)
                return;
        if (got != want) {
                /* only this process ever publishes this name: versions are certain */
                ADD(anomalies, 1);
                note("pid %d: published %s as v%" PRIu64 ", v%" PRIu64 " expected", (int)getpid(),
                     key->name, got, want);
        }
        key->version = got;
        ADD(publishes, 1);
        if (mode < 6)
                ADD(pub_zero, 1);
        else if (mode == 6)
                ADD(pub_copy_always, 1);
        else
                ADD(pub_plain, 1);
        if (got == 1)
                advertise(cl, k);
}

static int cleanup_one(void *ctx, const struct dlx_info *info)
{
        struct client *cl = ctx;
        unsigned slot, gen;

        /* a name of an earlier process in this slot (persistent ones outlive it) */
        if (sscanf(info->name, "soak/%u/%u/", &slot, &gen) == 2 && (int)slot == cl->slot &&
            gen != cl->gen)
                outcome(cl, "unpublish (cleanup)", info->name, dlx_unpublish(cl->c, info->name),
                        ALLOW(ENOENT));
        return 0;
}

static void produce(struct client *cl)
{
        int k = (int)rnd(cl, KEYS);
        struct key *key = &cl->keys[k];
        unsigned r = rnd(cl, 100);

        if (r < 55) {
                publish_next(cl, k);
        } else if (r < 65 && key->version > 0) {
                if (outcome(cl, "unpublish", key->name, dlx_unpublish(cl->c, key->name), NULL) == 0)
                        ADD(unpublishes, 1);
                /* a fresh name from now on: its versions start at 1 again */
                key->inc++;
                key->version = 0;
                key_name(cl, k);
                advertise(cl, k);
        } else if (r < 73 && key->version > 0) {
                struct dlx_info info;

                if (outcome(cl, "stat", key->name, dlx_stat(cl->c, key->name, &info), NULL) == 0 &&
                    (info.version != key->version || info.producer_pid != getpid() ||
                     info.persist != key->persist)) {
                        ADD(anomalies, 1);
                        note("pid %d: stat %s: v%" PRIu64 " pid %d persist %d; v%" PRIu64
                             " pid %d persist %d expected",
                             (int)getpid(), key->name, info.version, (int)info.producer_pid,
                             info.persist, key->version, (int)getpid(), key->persist);
                }
        } else if (r < 80 && key->version > 1) {
                outcome(cl, "wait_released", key->name,
                        dlx_wait_released(cl->c, key->name, key->version - 1, NULL, rnd(cl, 5)),
                        ALLOW(ETIMEDOUT, ENOENT));
        } else if (r < 88) {
                outcome(cl, "process_events", NULL, dlx_process_events(cl->c), NULL);
        } else if (fx_now_ms() >= cl->next_cleanup) {
                char prefix[32];

                snprintf(prefix, sizeof(prefix), "soak/%d/", cl->slot);
                outcome(cl, "list (cleanup)", prefix, dlx_list(cl->c, prefix, cleanup_one, cl),
                        NULL);
                ADD(lists, 1);
                cl->next_cleanup = fx_now_ms() + 1000 + rnd(cl, 2000);
        } else {
                outcome(cl, "ping", NULL, dlx_ping(cl->c), NULL);
        }
}

static void release(struct client *cl, int i)
{
        DLManagedTensorVersioned *t = cl->held[i].t;

        verify_tensor(t, NULL, "at release");
        t->deleter(t);
        ADD(releases, 1);
        cl->held[i] = cl->held[--cl->nheld];
}

static void release_due(struct client *cl, bool all)
{
        int64_t now = fx_now_ms();

        for (int i = cl->nheld - 1; i >= 0; i--)
                if (all || cl->held[i].until <= now)
                        release(cl, i);
}

static int cache_one(void *ctx, const struct dlx_info *info)
{
        struct client *cl = ctx;
        uint64_t seen = ++cl->listed;

        /* a uniform sample of every name listed */
        if (cl->ncache < CACHE)
                snprintf(cl->cache[cl->ncache++], DLX_NAME_MAX + 1, "%s", info->name);
        else if (rnd(cl, (unsigned)seen) < CACHE)
                snprintf(cl->cache[rnd(cl, CACHE)], DLX_NAME_MAX + 1, "%s", info->name);
        return 0;
}

/* An advertised name of a random producer slot, or false. */
static bool pick_advertised(struct client *cl, char *name, size_t size)
{
        int slot = (int)rnd(cl, (unsigned)nclients);
        int k = (int)rnd(cl, KEYS);
        uint64_t v;

        if (!slot_produces(slot))
                slot = slot - slot % 4;
        v = __atomic_load_n(&sh->adv[slot][k], __ATOMIC_RELAXED);
        if (!v)
                return false;
        snprintf(name, size, "soak/%d/%u/%d.%u", slot, (unsigned)(v >> 32), k,
                 (unsigned)((v >> 8) & 0xffffff));
        return true;
}

static void consume(struct client *cl)
{
        struct dlx_acquire_options o = {0};
        char name[DLX_NAME_MAX + 1];
        DLManagedTensorVersioned *t = NULL;
        unsigned r = rnd(cl, 100);
        int err;

        if (r < 2) {
                struct dlx_stats st;
                outcome(cl, "stats", NULL, dlx_stats(cl->c, &st), NULL);
                return;
        }
        if (r < 4 || cl->ncache == 0) {
                cl->ncache = 0;
                cl->listed = 0;
                outcome(cl, "list", "soak/", dlx_list(cl->c, "soak/", cache_one, cl), NULL);
                ADD(lists, 1);
                return;
        }
        if (r < 15 && cl->event_name[0]) {
                snprintf(name, sizeof(name), "%s", cl->event_name);
                o.min_version = cl->event_version;
                cl->event_name[0] = '\0';
        } else if (r < 30) {
                snprintf(name, sizeof(name), "%s", cl->cache[rnd(cl, (unsigned)cl->ncache)]);
        } else if (!pick_advertised(cl, name, sizeof(name))) {
                return;
        }
        r = rnd(cl, 100);
        if (r < 40) {
                o.timeout_ms = 0;
        } else if (r < 90) {
                o.timeout_ms = 1 + rnd(cl, 30);
        } else {
                /* wait for the next version: the producer may or may not make one in time */
                struct dlx_info info;
                if (outcome(cl, "stat", name, dlx_stat(cl->c, name, &info), ALLOW(ENOENT)) < 0)
                        return;
                o.min_version = info.version + 1;
                o.timeout_ms = 1 + rnd(cl, 30);
        }
        err = outcome(cl, "acquire", name, dlx_acquire(cl->c, name, &o, &t),
                      ALLOW(ENOENT, ETIMEDOUT));
        if (err < 0)
                return;
        ADD(acquires, 1);
        if (verify_tensor(t, name, "at acquire") && o.min_version) {
                uint64_t v = 0;
                dlx_tensor_info(t, NULL, &v, NULL);
                if (v < o.min_version) {
                        ADD(anomalies, 1);
                        note("pid %d: acquired %s v%" PRIu64 " for min_version %" PRIu64,
                             (int)getpid(), name, v, o.min_version);
                }
        }
        if (cl->nheld < MAX_HELD && rnd(cl, 100) < 30) {
                cl->held[cl->nheld].t = t;
                cl->held[cl->nheld].until = fx_now_ms() + 10 + rnd(cl, 400);
                cl->nheld++;
                ADD(held, 1);
        } else {
                t->deleter(t);
                ADD(releases, 1);
        }
}

static void drain_events(struct client *cl)
{
        struct dlx_event ev;
        int err;

        if (cl->poller) {
                /* the event-loop way: poll the fd, then process */
                struct pollfd p = {.fd = dlx_fd(cl->c), .events = POLLIN};
                if (poll(&p, 1, 0) != 1)
                        return;
                outcome(cl, "process_events", NULL, dlx_process_events(cl->c), NULL);
        }
        /* events are counted apart: a watch of everything sees thousands a second */
        while ((err = dlx_next_event(cl->c, &ev, 0)) == 0) {
                ADD(events, 1);
                if (strncmp(ev.name, "soak/", 5) != 0 || ev.kind < DLX_EVENT_PUBLISHED ||
                    ev.kind > DLX_EVENT_UNPUBLISHED || ev.version == 0) {
                        ADD(anomalies, 1);
                        note("pid %d: odd event %d %s v%" PRIu64, (int)getpid(), (int)ev.kind,
                             ev.name, ev.version);
                }
                if (ev.kind != DLX_EVENT_UNPUBLISHED) {
                        snprintf(cl->event_name, sizeof(cl->event_name), "%s", ev.name);
                        cl->event_version = ev.version;
                }
        }
        if (err != -EAGAIN)
                outcome(cl, "next_event", NULL, err, NULL);
}

static void start_watch(struct client *cl)
{
        char prefix[32];

        /* some watch everything, others the producer of their group of four slots */
        if (cl->slot % 8 < 4)
                snprintf(prefix, sizeof(prefix), "soak/");
        else
                snprintf(prefix, sizeof(prefix), "soak/%d/", cl->slot & ~3);
        outcome(cl, "watch", prefix, dlx_watch(cl->c, prefix, &cl->watch), NULL);
}

/*
 * One client process; never returns. Roles by slot: 4k produces, 4k+1
 * consumes and watches, 4k+2 consumes, 4k+3 does all three; half the watchers
 * drain their events through dlx_fd() and dlx_process_events().
 */
static void client_main(int slot, uint32_t gen, uint64_t base_seed) __attribute__((noreturn));
static void client_main(int slot, uint32_t gen, uint64_t base_seed)
{
        struct dlx_connect_options co = {.socket_path = fx.socket};
        static struct client cl;
        char cname[32];
        int err;

        cl.slot = slot;
        cl.gen = gen;
        cl.rng = mix64(base_seed ^ ((uint64_t)gen << 20) ^ (uint64_t)slot);
        cl.producer = slot_produces(slot);
        cl.consumer = slot % 4 != 0;
        cl.watcher = slot % 4 == 1 || slot % 4 == 3;
        cl.poller = cl.watcher && slot % 8 >= 4;
        snprintf(cname, sizeof(cname), "soak-%d-%u", slot, gen);
        co.client_name = cname;
        err = dlx_connect(&co, &cl.c);
        if (err < 0) {
                ADD(unexpected[-err < MAX_ERRNO ? -err : 0], 1);
                note("pid %d slot %d: connect: %s (%s)", (int)getpid(), slot, errname(-err),
                     dlx_last_error());
                ADD(fatal, 1);
                _exit(3);
        }
        ADD(ops, 1);
        for (int k = 0; k < KEYS; k++) {
                key_name(&cl, k);
                if (cl.producer)
                        advertise(&cl, k);
        }
        if (cl.watcher)
                start_watch(&cl);
        while (!__atomic_load_n(&sh->stop[slot], __ATOMIC_RELAXED)) {
                __atomic_store_n(&sh->beat[slot], fx_now_ms(), __ATOMIC_RELAXED);
                if (cl.watcher)
                        drain_events(&cl);
                release_due(&cl, false);
                if (cl.producer && (!cl.consumer || rnd(&cl, 2)))
                        produce(&cl);
                else
                        consume(&cl);
                if (cl.watcher && rnd(&cl, 1000) == 0) {
                        outcome(&cl, "unwatch", NULL, dlx_unwatch(cl.c, cl.watch), NULL);
                        start_watch(&cl);
                }
                if (rnd(&cl, 100) < 3)
                        fx_sleep_ms((int)rnd(&cl, 3));
        }
        release_due(&cl, true);
        dlx_close(cl.c);
        _exit(0);
}

/* ---- the test's side -------------------------------------------------------------------- */

struct slot {
        pid_t pid;
        uint32_t gen;
};

static struct slot slots[MAX_SLOTS];
static uint32_t next_gen;
static uint64_t run_seed;
static uint64_t rng;
static unsigned kills;       /* by the killer */
static unsigned other_kills; /* of stuck clients, and of half the clients at the end */

static unsigned prnd(unsigned n)
{
        rng = mix64(rng);
        return (unsigned)(rng % n);
}

static int env_int(const char *name, int def, int lo, int hi)
{
        const char *s = getenv(name);
        int v = s && *s ? atoi(s) : def;

        return v < lo ? lo : v > hi ? hi : v;
}

static void start_client(int i)
{
        uint32_t gen = ++next_gen;
        pid_t pid;

        sh->stop[i] = 0;
        sh->beat[i] = fx_now_ms();
        for (int k = 0; k < KEYS; k++)
                sh->adv[i][k] = 0;
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                /* a fresh process: nothing of the test's (its client, Check's pipe) */
                close_range(3, ~0u, 0);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                client_main(i, gen, run_seed);
        }
        slots[i].pid = pid;
        slots[i].gen = gen;
}

/* A /proc/<pid>/status field in KiB ("VmRSS", "RssAnon"...), or -1. */
static long status_kib(pid_t pid, const char *field)
{
        char path[64], line[128];
        size_t len = strlen(field);
        long kib = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, field, len) == 0 && line[len] == ':' &&
                    sscanf(line + len + 1, "%ld", &kib) == 1)
                        break;
        fclose(f);
        return kib;
}

static long rss_kib(pid_t pid)
{
        return status_kib(pid, "VmRSS");
}

/* Fails the test at once if dlxd is gone: nothing after would mean anything. */
static void check_daemon_alive(void)
{
        int status;

        if (waitpid(fx.pid, &status, WNOHANG) == fx.pid) {
                fx.pid = 0;
                ck_abort_msg("dlxd died during the soak (status 0x%x: %s)", status,
                             WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exited");
        }
}

/* Clients that ended without being asked: each one is a failure, and gets a successor. */
static void reap_unasked(void)
{
        for (int i = 0; i < nclients; i++) {
                int status;

                if (waitpid(slots[i].pid, &status, WNOHANG) != slots[i].pid)
                        continue;
                if (!(WIFEXITED(status) && WEXITSTATUS(status) == 3)) {
                        /* status 3 counted itself; anything else is a crash */
                        ADD(fatal, 1);
                        note("slot %d pid %d ended by itself: status 0x%x%s%s", i,
                             (int)slots[i].pid, status, WIFSIGNALED(status) ? ": " : "",
                             WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "");
                }
                start_client(i);
        }
}

static void check_heartbeats(void)
{
        int64_t now = fx_now_ms();

        for (int i = 0; i < nclients; i++) {
                int64_t beat = __atomic_load_n(&sh->beat[i], __ATOMIC_RELAXED);
                if (now - beat > HUNG_MS) {
                        ADD(fatal, 1);
                        note("slot %d pid %d: no progress for %lld ms (stuck in a call?)", i,
                             (int)slots[i].pid, (long long)(now - beat));
                        /* one report per stuck client: the killer replaces it */
                        kill(slots[i].pid, SIGKILL);
                        waitpid(slots[i].pid, NULL, 0);
                        other_kills++;
                        start_client(i);
                }
        }
}

struct peaks {
        int fds;
        long rss;
};

static void sample(struct peaks *pk)
{
        int fds = count_fds(fx.pid);
        long rss = rss_kib(fx.pid);

        if (fds > pk->fds)
                pk->fds = fds;
        if (rss > pk->rss)
                pk->rss = rss;
}

static void progress(dlx_client *mon, const char *phase, int64_t t0, const struct peaks *pk)
{
        struct dlx_stats st = {0};
        int err = dlx_stats(mon, &st);

        ck_assert_msg(err == 0, "stats: %s (%s)", dlx_strerror(err), dlx_last_error());
        printf("soak: %s t=%lld s: %" PRIu64 " ops, %u killed; dlxd: %u clients, %" PRIu64
               " names, %" PRIu64 " versions, %" PRIu64 " leases, %" PRIu64
               " segments, %d fds, rss %.1f MiB (peaks %d fds, %.1f MiB)\n",
               phase, (long long)((fx_now_ms() - t0) / 1000), sh->n.ops, kills, st.clients,
               st.names, st.versions, st.leases, st.segments, count_fds(fx.pid),
               rss_kib(fx.pid) / 1024.0, pk->fds, pk->rss / 1024.0);
        fflush(stdout);
}

/* All clients running, the killer at work, for seconds. */
static void run_phase(const char *phase, int seconds, struct peaks *pk)
{
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "soak-monitor"};
        int64_t t0 = fx_now_ms(), end = t0 + (int64_t)seconds * 1000;
        int64_t next_kill = t0 + 100 + prnd(201), next_sample = t0 + 1000, next_print = t0 + 10000;
        dlx_client *mon;
        int err;

        for (int i = 0; i < nclients; i++)
                start_client(i);
        /* clients forked from now on close every fd they inherit, this client's socket too */
        err = dlx_connect(&o, &mon);
        ck_assert_msg(err == 0, "monitor: %s (%s)", dlx_strerror(err), dlx_last_error());
        for (int64_t now = t0; now < end; now = fx_now_ms()) {
                fx_sleep_ms(10);
                reap_unasked();
                if (now >= next_kill) {
                        int i = (int)prnd((unsigned)nclients);

                        kill(slots[i].pid, SIGKILL);
                        waitpid(slots[i].pid, NULL, 0);
                        kills++;
                        start_client(i);
                        next_kill = fx_now_ms() + 100 + prnd(201);
                }
                if (now >= next_sample) {
                        check_daemon_alive();
                        check_heartbeats();
                        sample(pk);
                        next_sample += 1000;
                }
                if (now >= next_print) {
                        progress(mon, phase, t0, pk);
                        next_print += 10000;
                }
        }
        dlx_close(mon);
}

/*
 * Ends every client: odd slots by SIGKILL in mid-flight (with whatever they
 * hold), even slots by asking (they verify and release what they hold, close,
 * and must exit 0 in time).
 */
static void stop_clients(void)
{
        int64_t deadline;

        for (int i = 0; i < nclients; i++) {
                if (i % 2) {
                        kill(slots[i].pid, SIGKILL);
                        other_kills++;
                } else {
                        __atomic_store_n(&sh->stop[i], 1, __ATOMIC_RELAXED);
                }
        }
        deadline = fx_now_ms() + 15000;
        for (int i = 0; i < nclients; i++) {
                int status = 0;
                pid_t r;

                while ((r = waitpid(slots[i].pid, &status, WNOHANG)) == 0 && fx_now_ms() < deadline)
                        fx_sleep_ms(5);
                if (r == 0) {
                        ADD(fatal, 1);
                        note("slot %d pid %d did not stop in 15 s", i, (int)slots[i].pid);
                        kill(slots[i].pid, SIGKILL);
                        other_kills++;
                        waitpid(slots[i].pid, &status, 0);
                } else if (i % 2 == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
                        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 3))
                                ADD(fatal, 1);
                        note("slot %d pid %d ended with status 0x%x when asked to stop", i,
                             (int)slots[i].pid, status);
                }
                slots[i].pid = 0;
        }
}

static int unpublish_one(void *ctx, const struct dlx_info *info)
{
        dlx_unpublish(ctx, info->name);
        return 0;
}

struct settled {
        long leases; /* once every client is gone (killed or closed), before names are removed */
        struct dlx_stats after;
        int fds;
        long rss, anon; /* VmRSS, and its RssAnon part (heap, stacks) */
};

static bool stats_empty(const struct dlx_stats *s)
{
        return s->clients == 1 && s->names == 0 && s->versions == 0 && s->leases == 0 &&
               s->segments == 0 && s->bytes == 0 && s->watchers == 0;
}

/*
 * With every client gone: the leases the daemon still holds (of clients that
 * are gone: none should be left), then every name removed, and the daemon's
 * state, fds and RSS once idle and empty. fd_target: the count to wait for.
 */
static void settle(int fd_target, struct settled *ret)
{
        dlx_client *mon = fx_connect(&fx, "soak-settle");
        int64_t deadline;

        /* sessions of killed clients end as the daemon reads their hangups */
        ret->leases = fx_wait_leases(mon, 0, 5000);
        /* persistent names legitimately outlive their producers: remove them all */
        ck_assert_int_ge(dlx_list(mon, "", unpublish_one, mon), 0);
        deadline = fx_now_ms() + 5000;
        do {
                ck_assert_int_eq(dlx_stats(mon, &ret->after), 0);
                if (stats_empty(&ret->after))
                        break;
                fx_sleep_ms(10);
        } while (fx_now_ms() < deadline);
        dlx_close(mon);
        ret->fds = wait_daemon_fds(&fx, fd_target, 5000);
        ret->rss = rss_kib(fx.pid);
        ret->anon = status_kib(fx.pid, "RssAnon");
}

static void print_errors(const char *what, const uint64_t *counts)
{
        bool any = false;

        printf("soak: %s:", what);
        for (int e = 0; e < MAX_ERRNO; e++) {
                if (!counts[e])
                        continue;
                printf(" %s %" PRIu64, e ? errname(e) : "other", counts[e]);
                any = true;
        }
        printf("%s\n", any ? "" : " none");
}

static uint64_t sum_counts(const uint64_t *counts)
{
        uint64_t n = 0;

        for (int e = 0; e < MAX_ERRNO; e++)
                n += counts[e];
        return n;
}

/* The errors by kind, and the words of the first failures. */
static void print_failures(void)
{
        print_errors("expected errors", sh->n.expected);
        print_errors("unexpected errors", sh->n.unexpected);
        for (uint32_t i = 0; i < sh->n.nnotes && i < MAX_NOTES; i++)
                printf("soak: failure: %s\n", sh->n.notes[i]);
        if (sh->n.nnotes > MAX_NOTES)
                printf("soak: ... and %u more failures\n", sh->n.nnotes - MAX_NOTES);
        fflush(stdout);
}

static bool failed_checks(void)
{
        return sh->n.bad_reads || sum_counts(sh->n.unexpected) || sh->n.anomalies || sh->n.fatal;
}

START_TEST(soak)
{
        int seconds = env_int("DLX_SOAK_SECONDS", 60, 1, 86400);
        int warmup = env_int("DLX_SOAK_WARMUP", 5, 0, 3600);
        struct peaks pk = {0}, warm_pk = {0};
        struct settled warm, end;
        int base_fds;
        long base_rss;
        double rss_ratio;
        uint64_t unexpected, unfinished;
        bool rss_ok;

        nclients = env_int("DLX_SOAK_CLIENTS", 64, 4, MAX_SLOTS);
        run_seed = getenv("DLX_SOAK_SEED") ? strtoull(getenv("DLX_SOAK_SEED"), NULL, 0)
                                           : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32;
        rng = mix64(run_seed);
        sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        ck_assert_ptr_ne(sh, MAP_FAILED);
        printf("soak: %d s after %d s of warm-up, %d clients, seed %" PRIu64 ", dlxd pid %d\n",
               seconds, warmup, nclients, run_seed, (int)fx.pid);
        fflush(stdout);

        /*
         * The baseline is the daemon idle and empty (no client, no name) after
         * the warm-up: the same load, kills included, for a few seconds, then
         * every client stopped and every name removed. What the daemon keeps
         * then is its own: the descriptors it opened at start (listening
         * socket, epoll, signal and timer fds...), code pages, and the heap
         * malloc and libuv grew while serving the load. The soak must leave it
         * exactly as many fds and an RSS within 5% of that.
         */
        run_phase("warm-up", warmup, &warm_pk);
        stop_clients();
        settle(fx.daemon_fds, &warm);
        ck_assert_msg(warm.leases == 0, "after the warm-up, dlxd holds %ld leases of dead clients",
                      warm.leases);
        base_fds = warm.fds;
        base_rss = warm.rss;
        printf("soak: baseline after warm-up: %d fds (%d at start), rss %.1f MiB; warm-up: %" PRIu64
               " ops, %u killed, %" PRIu64 " bad reads\n",
               base_fds, fx.daemon_fds, base_rss / 1024.0, sh->n.ops, kills, sh->n.bad_reads);
        fflush(stdout);
        ck_assert_msg(base_fds == fx.daemon_fds,
                      "after the warm-up dlxd holds %d fds, %d right after start", base_fds,
                      fx.daemon_fds);
        /* the warm-up runs the same checks: a failure there ends the test */
        if (failed_checks()) {
                print_failures();
                ck_abort_msg("the warm-up failed: %" PRIu64 " bad reads, %" PRIu64
                             " unexpected errors, %" PRIu64 " anomalies, %" PRIu64 " clients lost",
                             sh->n.bad_reads, sum_counts(sh->n.unexpected), sh->n.anomalies,
                             sh->n.fatal);
        }
        memset(&sh->n, 0, sizeof(sh->n));
        kills = other_kills = 0;

        run_phase("soak", seconds, &pk);
        check_daemon_alive();
        stop_clients();
        settle(base_fds, &end);

        unexpected = sum_counts(sh->n.unexpected);
        /* a client killed in the middle of a verification never ends it: one per kill at most */
        unfinished = sh->n.reads - sh->n.verified - sh->n.bad_reads;
        rss_ratio = base_rss > 0 ? (double)end.rss / (double)base_rss : 0;
        long rss_slack = (long)(base_rss * RSS_TOLERANCE) > RSS_SLACK_KIB
                                 ? (long)(base_rss * RSS_TOLERANCE)
                                 : RSS_SLACK_KIB;
        rss_ok = !RSS_CHECKED ||
                 (end.rss >= base_rss - rss_slack && end.rss <= base_rss + rss_slack);
        printf("soak: %" PRIu64 " publishes (%" PRIu64 " zero-copy, %" PRIu64
               " copied from dlx_alloc, %" PRIu64 " from plain memory), %" PRIu64
               " unpublishes, %" PRIu64 " acquires (%" PRIu64 " held a while), %" PRIu64
               " releases, %" PRIu64 " producer deleters, %" PRIu64 " events, %" PRIu64 " lists\n",
               sh->n.publishes, sh->n.pub_zero, sh->n.pub_copy_always, sh->n.pub_plain,
               sh->n.unpublishes, sh->n.acquires, sh->n.held, sh->n.releases, sh->n.prod_deleters,
               sh->n.events, sh->n.lists);
        printf("soak: %" PRIu64 " reads verified of %" PRIu64 " (%" PRIu64
               " cut short by SIGKILL), %" PRIu64 " bad; %" PRIu64 " anomalies, %" PRIu64
               " clients lost\n",
               sh->n.verified, sh->n.reads, unfinished, sh->n.bad_reads, sh->n.anomalies,
               sh->n.fatal);
        print_failures();
        printf("soak: peaks during the run: %d fds, rss %.1f MiB; after: %u clients, %" PRIu64
               " names, %" PRIu64 " versions, %" PRIu64 " leases, %" PRIu64 " segments, %" PRIu64
               " bytes, %u watchers\n",
               pk.fds, pk.rss / 1024.0, end.after.clients, end.after.names, end.after.versions,
               end.after.leases, end.after.segments, end.after.bytes, end.after.watchers);
        printf("soak: %d s, %d clients, %" PRIu64 " ops, %u clients killed, %" PRIu64
               " checksum errors, leases left %ld, fds %d -> %d, rss %.1f -> %.1f MiB (%+.1f%%; "
               "anon %ld -> %ld KiB%s)\n",
               seconds, nclients, sh->n.ops, kills, sh->n.bad_reads, end.leases, base_fds, end.fds,
               base_rss / 1024.0, end.rss / 1024.0, (rss_ratio - 1) * 100, warm.anon, end.anon,
               RSS_CHECKED ? "" : "; not checked under ASan");
        fflush(stdout);

        ck_assert_msg(sh->n.bad_reads == 0, "%" PRIu64 " reads failed verification",
                      sh->n.bad_reads);
        ck_assert_msg(sh->n.reads > 0 && unfinished <= (uint64_t)kills + other_kills,
                      "%" PRIu64 " of %" PRIu64 " reads verified, %" PRIu64
                      " unfinished with %u clients killed",
                      sh->n.verified, sh->n.reads, unfinished, kills + other_kills);
        ck_assert_msg(unexpected == 0, "%" PRIu64 " unexpected errors", unexpected);
        ck_assert_msg(sh->n.anomalies == 0, "%" PRIu64 " anomalies", sh->n.anomalies);
        ck_assert_msg(sh->n.fatal == 0, "%" PRIu64 " clients lost or stuck", sh->n.fatal);
        ck_assert_msg(sh->n.acquires > 0 && sh->n.publishes > 0, "nothing happened");
        ck_assert_msg(end.leases == 0, "dlxd holds %ld leases of dead clients", end.leases);
        ck_assert_msg(stats_empty(&end.after),
                      "dlxd not empty after every name was removed: %u clients, %" PRIu64
                      " names, %" PRIu64 " versions, %" PRIu64 " leases, %" PRIu64
                      " segments, %" PRIu64 " bytes, %u watchers",
                      end.after.clients, end.after.names, end.after.versions, end.after.leases,
                      end.after.segments, end.after.bytes, end.after.watchers);
        ck_assert_msg(end.fds == base_fds, "dlxd holds %d fds, %d at the baseline", end.fds,
                      base_fds);
        ck_assert_msg(rss_ok, "dlxd's RSS is %ld KiB, %ld KiB at the baseline (%+.1f%%)", end.rss,
                      base_rss, (rss_ratio - 1) * 100);
        munmap(sh, sizeof(*sh));
}
END_TEST

Suite *soak_suite(void)
{
        Suite *s = suite_create("soak");
        TCase *tc = tcase_create("soak");
        int seconds = env_int("DLX_SOAK_SECONDS", 60, 1, 86400);
        int warmup = env_int("DLX_SOAK_WARMUP", 5, 0, 3600);

        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        /* the run, the warm-up, and up to 15 s to stop and 10 s to settle after each */
        tcase_set_timeout(tc, seconds + warmup + 120);
        tcase_add_test(tc, soak);
        suite_add_tcase(s, tc);
        return s;
}
