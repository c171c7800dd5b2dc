/* SPDX-License-Identifier: MIT */
/*
 * Second reader: the small versions a follow brings with its news (protocol
 * 1.2, "offers"), against README.md's federation section and fed.proto's
 * Change and Describe. Each test says the promise it checks; a failing test
 * is a finding.
 *
 * The promises under test:
 *  - "--follow @a/PREFIX: B's bridge asks A's to tell it of the names A
 *    exports under PREFIX: first what is there, then each publish, replace
 *    and unpublish as it happens. Each new version is pulled at once
 *    (sixteen pulls at a time; a consumer's want of the same version shares
 *    the pull), so a consumer on B finds it there. A small version (16 KiB
 *    at most) comes with its news, its bytes inside the message, and B asks
 *    for nothing (protocol 1.2; a consumer's want already on its way to A is
 *    answered by it, and A's answer to that want, crossing it, is dropped:
 *    the bytes then cross twice, the mirror is made once). A name
 *    unpublished on A is unpublished on B (copies held stay readable)."
 *  - "A want of a higher version than one A has not answered yet waits for
 *    that answer, and asks on its own only if what comes is older; a want of
 *    a lower version asks A on its own, and a failure to get v2 fails only
 *    the acquires that asked for more than what came."
 *  - "one network copy per host per version"; "min_version means the same
 *    on both hosts".
 *  - "only read-only versions are exported" (fed.proto: a Change's describe
 *    is "a small version ... as a Lookup of it would be answered");
 *    every dtype and layout arrives as it is.
 *
 * B logs each mirror it makes as "@a/<name> v<N>: <bytes> bytes from a"
 * (", with its news" when it came inside a Change); a watch on B sees each
 * mirror publish as an event; A's bridge counts what it served to B
 * (`dlxctl peers --json`: clients' served and bytes_out).
 *
 * Findings (failing when written):
 *  - news_read_late_carry_the_last_version_once and
 *    a_storm_of_small_replaces_crosses_each_version_once: the news of vK
 *    carries whatever A has then (exporter.c fed_export_offer() acquires at
 *    min_version K), so news read late each carry the same newest version:
 *    50 news read at once sent v50 50 times; B drops 49 (one mirror).
 *  - a_refused_writable_v2_does_not_fail_the_want_of_v3: a want of v3 waiting
 *    behind an unanswered want of v2 fails with v2's -ENOTSUP ("read-only
 *    versions only") when v2 is writable, though read-only v3 comes later
 *    (importer.c want_end() fails up to the highest "then" version).
 *  - a_want_of_the_old_life_leaves_the_new_life_alone: a want asked before
 *    its name's unpublish ("gone") is answered with the new life's version:
 *    that version crosses twice, and, when the gone want lands first, B
 *    mirrors it, unpublishes it (publish_mirror(): w->gone) and mirrors it
 *    again.
 */
#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fedhosts.h"
#include "tensors.h"

static const char *const A_EXPORT[] = {"--export", "model/", NULL};
static const char *const B_FOLLOW[] = {"--follow", "@a/model/", NULL};

/* ---- helpers -------------------------------------------------------------------------------- */

/* B's follows stand: each has been listed by A once (n of them). */
static void follows_stand(int n)
{
        for (int t = 0; t < 10000 * fx_slowdown(); t += 20) {
                if (log_count(&B, "listed by peer a") >= n)
                        return;
                fx_sleep_ms(20);
        }
        ck_abort_msg("B's %d follows were not listed by A in 10 s", n);
}

/* Both hosts, A exporting model/, B following @a/model/ (once listed: changes come). */
static void followed_up(void)
{
        hosts_up();
        pair_up(A_EXPORT, B_FOLLOW);
        follows_stand(1);
}

/* OA_DUMP set: h's bridge's log on stderr (before hosts_down() removes it). */
static void dump_log(struct host *h)
{
        char line[512];
        FILE *in;

        if (!getenv("OA_DUMP"))
                return;
        in = fopen(h->log, "re");
        while (in && fgets(line, sizeof(line), in))
                fprintf(stderr, "  %c| %s", h == &A ? 'A' : 'B', line);
        if (in)
                fclose(in);
}

static uint8_t u8_at(int64_t i, unsigned seed)
{
        return (uint8_t)(seed * 31u + (uint64_t)i * 7u + 1u);
}

/* n bytes (uint8) of c's dlx_alloc() memory, byte i u8_at(i, seed). */
static DLManagedTensorVersioned *u8_new(dlx_client *c, int64_t n, unsigned seed)
{
        int64_t shape = n;
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = {kDLUInt, 8, 1}};
        DLManagedTensorVersioned *t;

        proto.shape = &shape;
        DLXV(dlx_alloc(c, &proto, &t));
        for (int64_t i = 0; i < n; i++)
                ((uint8_t *)t->dl_tensor.data)[i] = u8_at(i, seed);
        return t;
}

static bool u8_is(const DLManagedTensorVersioned *t, int64_t n, unsigned seed)
{
        const uint8_t *p = (const uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset;

        if (t->dl_tensor.ndim != 1 || t->dl_tensor.shape[0] != n || t->dl_tensor.dtype.bits != 8)
                return false;
        for (int64_t i = 0; i < n; i++)
                if (p[i] != u8_at(i, seed))
                        return false;
        return true;
}

/* B holds name at version with n bytes of seed (acquired and checked). */
static void b_has(dlx_client *pb, const char *name, uint64_t version, int64_t n, unsigned seed)
{
        struct dlx_acquire_options o = {.min_version = version, .timeout_ms = 0};
        DLManagedTensorVersioned *t = NULL;
        uint64_t v = 0;
        int err = dlx_acquire(pb, name, &o, &t);

        ck_assert_msg(err == 0, "%s v%llu on B: %s (%s)", name, (unsigned long long)version,
                      dlx_strerror(err), dlx_last_error());
        DLXV(dlx_tensor_info(t, NULL, &v, NULL));
        ck_assert_msg(v == version, "%s on B is v%llu, not v%llu", name, (unsigned long long)v,
                      (unsigned long long)version);
        ck_assert_msg(u8_is(t, n, seed), "%s v%llu on B: not the bytes A published", name,
                      (unsigned long long)v);
        t->deleter(t);
}

/* What a watch on B saw of one name: the versions of its mirror publishes, in order. */
struct hist {
        uint64_t v[4096];
        int n, unpublished, lost;
};

static void hist_drain(dlx_client *w, const char *name, struct hist *h)
{
        struct dlx_event ev;

        /* until 300 ms of quiet: events the daemon still holds come meanwhile */
        while (dlx_next_event(w, &ev, 300) == 0) {
                if (ev.kind == DLX_EVENT_LOST) {
                        h->lost++;
                        continue;
                }
                if (strcmp(ev.name, name) != 0)
                        continue;
                if (ev.kind == DLX_EVENT_UNPUBLISHED)
                        h->unpublished++;
                else if (h->n < (int)(sizeof(h->v) / sizeof(h->v[0])))
                        h->v[h->n++] = ev.version;
        }
}

/* Each mirror version made once, never one lower after a higher. */
static void hist_rising(const struct hist *h, const char *name)
{
        ck_assert_msg(h->lost == 0, "the watch on B lost events");
        for (int i = 1; i < h->n; i++)
                ck_assert_msg(h->v[i] > h->v[i - 1],
                              "%s on B: mirror v%llu made after v%llu (event %d of %d)", name,
                              (unsigned long long)h->v[i], (unsigned long long)h->v[i - 1], i,
                              h->n);
}

/* A watcher of @a/ on B. */
static dlx_client *b_watcher(void)
{
        dlx_client *w = fx_connect(&B.d, "watcher-b");

        DLXV(dlx_watch(w, "@a/", NULL));
        return w;
}

/* Mirrors B made of name's version v ("@a/<name> v<v>:" in B's log). */
static int made(const char *name, uint64_t v)
{
        char needle[DLX_NAME_MAX + 40];

        snprintf(needle, sizeof(needle), "@a/%s v%llu:", name, (unsigned long long)v);
        return log_count(&B, needle);
}

/* Of them, those that came inside a Change. */
static int made_with_news(const char *name, uint64_t v)
{
        char needle[DLX_NAME_MAX + 80];
        char line[512];
        int n = 0;
        FILE *in = fopen(B.log, "re");

        snprintf(needle, sizeof(needle), "@a/%s v%llu:", name, (unsigned long long)v);
        while (in && fgets(line, sizeof(line), in))
                n += strstr(line, needle) && strstr(line, "with its news");
        if (in)
                fclose(in);
        return n;
}

/*
 * A's leases go back to 0 (its bridge holds nothing), and B's (the test
 * released what it took: nothing else holds a mirror).
 */
static void holds_nothing(dlx_client *pa, dlx_client *pb)
{
        long n = fx_wait_leases(pa, 0, 5000 * fx_slowdown());

        ck_assert_msg(n == 0, "A's dlxd still holds %ld leases 5 s later", n);
        n = fx_wait_leases(pb, 0, 5000 * fx_slowdown());
        ck_assert_msg(n == 0, "B's dlxd still holds %ld leases 5 s later", n);
}

/* What `dlxctl peers --json` on h prints. */
static const char *peers_json(const struct host *h)
{
        static char out[16384];
        char cmd[700];
        size_t n;
        FILE *p;

        snprintf(cmd, sizeof(cmd), "timeout 20 %s --socket %s --json peers 2>&1", getenv("DLXCTL"),
                 h->d.socket);
        p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = '\0';
        pclose(p);
        return out;
}

/* The number after "key": in the first object of section ("clients"); -1: none. */
static long long jnum0(const char *json, const char *section, const char *key)
{
        char pat[64];
        const char *at, *end;

        snprintf(pat, sizeof(pat), "\"%s\":[", section);
        at = strstr(json, pat);
        if (!at || !(at = strchr(at, '{')))
                return -1;
        end = strchr(at, '}');
        snprintf(pat, sizeof(pat), "\"%s\":", key);
        at = strstr(at, pat);
        if (!at || (end && at > end))
                return -1;
        return strtoll(at + strlen(pat), NULL, 10);
}

/* A consumer on B in a thread of ours: an acquire of name at min_version. */
struct waiter {
        pthread_t th;
        dlx_client *c;
        char name[96];
        uint64_t min_version;
        int64_t timeout_ms, n;
        int rc;
        uint64_t version;
        bool bytes_ok; /* the bytes are those of the version it got (seed = version) */
        int64_t took_ms;
        char err[300];
};

static void *waiter_run(void *arg)
{
        struct waiter *w = arg;
        struct dlx_acquire_options o = {.timeout_ms = w->timeout_ms, .min_version = w->min_version};
        DLManagedTensorVersioned *t = NULL;
        int64_t t0 = fx_now_ms();

        w->rc = dlx_acquire(w->c, w->name, &o, &t);
        w->took_ms = fx_now_ms() - t0;
        if (w->rc == 0) {
                dlx_tensor_info(t, NULL, &w->version, NULL);
                w->bytes_ok = u8_is(t, w->n, (unsigned)w->version);
                t->deleter(t);
        } else {
                snprintf(w->err, sizeof(w->err), "%s", dlx_last_error());
        }
        return NULL;
}

static void waiter_start(struct waiter *w, const char *name, uint64_t min_version, int64_t n,
                         int64_t timeout_ms)
{
        memset(w, 0, sizeof(*w));
        snprintf(w->name, sizeof(w->name), "%s", name);
        w->min_version = min_version;
        w->timeout_ms = timeout_ms;
        w->n = n;
        w->rc = 12345;
        w->c = fx_connect(&B.d, "waiter-b");
        ck_assert_int_eq(pthread_create(&w->th, NULL, waiter_run, w), 0);
}

static void waiter_join(struct waiter *w)
{
        pthread_join(w->th, NULL);
        dlx_close(w->c);
        w->c = NULL;
}

/* For ms, name stays on c at version (polled every 10 ms). */
static void stays(dlx_client *c, const char *name, uint64_t version, int ms)
{
        struct dlx_info in;

        for (int t = 0; t < ms; t += 10) {
                int err = dlx_stat(c, name, &in);
                ck_assert_msg(err == 0 && in.version == version,
                              "'%s' on B: %s v%llu after %d ms, not v%llu", name,
                              err ? dlx_strerror(err) : "at", (unsigned long long)in.version, t,
                              (unsigned long long)version);
                fx_sleep_ms(10);
        }
}

static int count_one(void *ctx, const struct dlx_info *in)
{
        (void)in;
        (*(int *)ctx)++;
        return 0;
}

/* Names on c under prefix. */
static int names_under(dlx_client *c, const char *prefix)
{
        int n = 0;

        ck_assert_int_ge(dlx_list(c, prefix, count_one, &n), 0);
        return n;
}

static int64_t stride_of(const DLTensor *t, int i);

/* ---- 1. the 16 KiB line --------------------------------------------------------------------- */

/*
 * "A small version (16 KiB at most) comes with its news, its bytes inside the
 * message, and B asks for nothing". 16384 bytes come with the news (B logs
 * ", with its news"), 16385 are asked for; so do a tensor whose elements
 * take little but whose extent (what travels) is 16388 bytes, and one whose
 * extent is exactly 16384. Each arrives byte-exact, once; then each
 * crosses the line the other way at v2. A holds nothing after.
 */
START_TEST(sixteen_kib_comes_with_its_news_one_more_byte_is_asked)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *here, *there;
        int err;

        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/e/at", u8_new(pa, 16384, 1), NULL, NULL);
        publish_ok(pa, "model/e/over", u8_new(pa, 16385, 2), NULL, NULL);
        {
                int64_t shape = 2, strides = 8193, shape2 = 2, strides2 = 8191;
                publish_ok(pa, "model/e/wide",
                           raw_new((DLDataType){kDLUInt, 16, 1}, 1, &shape, &strides, 16388, 0),
                           NULL, NULL);
                publish_ok(pa, "model/e/wide-in",
                           raw_new((DLDataType){kDLUInt, 16, 1}, 1, &shape2, &strides2, 16384, 0),
                           NULL, NULL);
        }
        wait_for(pb, "@a/model/e/at", 1);
        wait_for(pb, "@a/model/e/over", 1);
        wait_for(pb, "@a/model/e/wide", 1);
        wait_for(pb, "@a/model/e/wide-in", 1);
        b_has(pb, "@a/model/e/at", 1, 16384, 1);
        b_has(pb, "@a/model/e/over", 1, 16385, 2);
        for (const char *const *nm = (const char *const[]){"model/e/wide", "model/e/wide-in", NULL};
             *nm; nm++) {
                char remote[64];
                snprintf(remote, sizeof(remote), "@a/%s", *nm);
                here = acquire_ok(pa, *nm, NULL);
                there = acquire_at(pb, remote, 1, 0, &err);
                ck_assert_msg(there, "%s: %s", remote, dlx_strerror(err));
                expect_same(&here->dl_tensor, &there->dl_tensor, remote);
                here->deleter(here);
                there->deleter(there);
        }
        fx_sleep_ms(200);
        ck_assert_int_eq(made("model/e/at", 1), 1);
        ck_assert_int_eq(made_with_news("model/e/at", 1), 1);
        ck_assert_int_eq(made("model/e/over", 1), 1);
        ck_assert_int_eq(made_with_news("model/e/over", 1), 0);
        ck_assert_int_eq(made("model/e/wide", 1), 1);
        ck_assert_int_eq(made_with_news("model/e/wide", 1), 0);
        ck_assert_int_eq(made_with_news("model/e/wide-in", 1), 1);
        /* the other way round */
        publish_ok(pa, "model/e/at", u8_new(pa, 16385, 3), NULL, NULL);
        publish_ok(pa, "model/e/over", u8_new(pa, 16384, 4), NULL, NULL);
        wait_for(pb, "@a/model/e/at", 2);
        wait_for(pb, "@a/model/e/over", 2);
        b_has(pb, "@a/model/e/at", 2, 16385, 3);
        b_has(pb, "@a/model/e/over", 2, 16384, 4);
        fx_sleep_ms(200);
        ck_assert_int_eq(made("model/e/at", 2), 1);
        ck_assert_int_eq(made_with_news("model/e/at", 2), 0);
        ck_assert_int_eq(made_with_news("model/e/over", 2), 1);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/*
 * The biggest Change there is: a name as long as B can mirror (252 bytes on
 * A, "@a/" making 255 on B), 16384 bytes in 14 dimensions (2 each), and the
 * same in 32 dimensions (DLX_MAX_NDIM; 18 of them 1), strided in reverse. It
 * comes with its news, exactly, and the bridges live.
 */
START_TEST(the_longest_name_the_most_dimensions_at_sixteen_kib)
{
        char name[253], remote[260];
        int64_t shape[DLX_MAX_NDIM], strides[DLX_MAX_NDIM];
        DLManagedTensorVersioned *here, *there;
        dlx_client *pa, *pb;
        int err;

        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int round = 0; round < 2; round++) {
                int ndim = round ? DLX_MAX_NDIM : 14;
                int64_t s = 1;
                memset(name, 'a' + round, sizeof(name) - 1);
                memcpy(name, "model/", 6);
                name[252] = '\0';
                for (int d = 0; d < ndim; d++) {
                        shape[d] = d < 14 ? 2 : 1;
                        strides[d] = s; /* reversed: dimension 0 moves fastest */
                        s *= shape[d];
                }
                struct owned *o = owned_new((DLDataType){kDLUInt, 8, 1}, ndim, shape,
                                            round ? strides : NULL, 0, 0, 16384, 0);
                pattern_fill(&o->mt.dl_tensor, 0, (uint8_t)round);
                publish_ok(pa, name, &o->mt, NULL, NULL);
                snprintf(remote, sizeof(remote), "@a/%s", name);
                ck_assert_uint_eq(strlen(remote), 255);
                wait_for(pb, remote, 1);
                here = acquire_ok(pa, name, NULL);
                there = acquire_at(pb, remote, 1, 0, &err);
                ck_assert_msg(there, "%s", dlx_strerror(err));
                expect_same(&here->dl_tensor, &there->dl_tensor, "the longest");
                for (int d = 0; d < ndim; d++)
                        if (shape[d] > 1)
                                ck_assert_int_eq(stride_of(&here->dl_tensor, d),
                                                 stride_of(&there->dl_tensor, d));
                here->deleter(here);
                there->deleter(there);
                ck_assert_int_eq(made_with_news(name, 1), 1);
        }
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 2. every dtype and layout inside a Change ---------------------------------------------- */

#define PADDED DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED
static const struct {
        const char *name;
        DLDataType dt;
        uint64_t flags;
} dtypes[] = {
        {"int8", {kDLInt, 8, 1}, 0},
        {"int16", {kDLInt, 16, 1}, 0},
        {"int32", {kDLInt, 32, 1}, 0},
        {"int64", {kDLInt, 64, 1}, 0},
        {"uint8", {kDLUInt, 8, 1}, 0},
        {"uint16", {kDLUInt, 16, 1}, 0},
        {"uint32", {kDLUInt, 32, 1}, 0},
        {"uint64", {kDLUInt, 64, 1}, 0},
        {"float16", {kDLFloat, 16, 1}, 0},
        {"float32", {kDLFloat, 32, 1}, 0},
        {"float64", {kDLFloat, 64, 1}, 0},
        {"bfloat16", {kDLBfloat, 16, 1}, 0},
        {"complex32", {kDLComplex, 32, 1}, 0},
        {"complex64", {kDLComplex, 64, 1}, 0},
        {"complex128", {kDLComplex, 128, 1}, 0},
        {"bool", {kDLBool, 8, 1}, 0},
        {"f8e3m4", {kDLFloat8_e3m4, 8, 1}, 0},
        {"f8e4m3", {kDLFloat8_e4m3, 8, 1}, 0},
        {"f8e4m3b11fnuz", {kDLFloat8_e4m3b11fnuz, 8, 1}, 0},
        {"f8e4m3fn", {kDLFloat8_e4m3fn, 8, 1}, 0},
        {"f8e4m3fnuz", {kDLFloat8_e4m3fnuz, 8, 1}, 0},
        {"f8e5m2", {kDLFloat8_e5m2, 8, 1}, 0},
        {"f8e5m2fnuz", {kDLFloat8_e5m2fnuz, 8, 1}, 0},
        {"f8e8m0fnu", {kDLFloat8_e8m0fnu, 8, 1}, 0},
        {"f6e2m3fn", {kDLFloat6_e2m3fn, 6, 1}, 0},
        {"f6e3m2fn", {kDLFloat6_e3m2fn, 6, 1}, 0},
        {"f4e2m1fn", {kDLFloat4_e2m1fn, 4, 1}, 0},
        {"int4", {kDLInt, 4, 1}, 0},
        {"uint4", {kDLUInt, 4, 1}, 0},
        {"float32x4", {kDLFloat, 32, 4}, 0},
        {"int8x3", {kDLInt, 8, 3}, 0},
        {"int4x2", {kDLInt, 4, 2}, 0},
        {"f6e3m2fnx4", {kDLFloat6_e3m2fn, 6, 4}, 0},
        {"uint2", {kDLUInt, 2, 1}, 0},
        {"int1", {kDLInt, 1, 1}, 0},
        {"f4e2m1fnx3", {kDLFloat4_e2m1fn, 4, 3}, 0},
        {"int4-padded", {kDLInt, 4, 1}, PADDED},
        {"uint4-padded", {kDLUInt, 4, 1}, PADDED},
        {"f4e2m1fn-padded", {kDLFloat4_e2m1fn, 4, 1}, PADDED},
        {"f6e2m3fn-padded", {kDLFloat6_e2m3fn, 6, 1}, PADDED},
        {"f6e3m2fn-padded", {kDLFloat6_e3m2fn, 6, 1}, PADDED},
};
#define NDTYPES ((int)(sizeof(dtypes) / sizeof(dtypes[0])))

/* The layouts each byte-addressable dtype is tried in (packed ones: compact 3x5 alone). */
enum lay { L_COMPACT, L_TRANSPOSED, L_OFFSET, L_SCALAR, L_EMPTY, L_BROADCAST, NLAYS };
static const char *const lay_names[NLAYS] = {"compact", "transposed", "offset",
                                             "scalar",  "empty",      "broadcast"};

/* A's tensor for dtype d in layout l, filled with the pattern for seed. */
static DLManagedTensorVersioned *layout_new(int d, enum lay l, uint8_t seed)
{
        static const int64_t s35[2] = {3, 5}, s53[2] = {5, 3}, tr[2] = {1, 5}, s03[2] = {0, 3},
                             s34[2] = {3, 4}, bc[2] = {0, 1};
        DLDataType dt = dtypes[d].dt;
        uint64_t fl = dtypes[d].flags, es = elem_size(dt, fl);
        struct owned *o = NULL;

        switch (l) {
        case L_COMPACT:
                o = owned_compact(dt, 2, s35, fl, seed);
                return &o->mt;
        case L_TRANSPOSED:
                o = owned_new(dt, 2, s53, tr, 0, fl, 15 * es, 0);
                break;
        case L_OFFSET:
                o = owned_new(dt, 2, s35, NULL, 3 * es, fl, 18 * es, 0);
                break;
        case L_SCALAR:
                o = owned_new(dt, 0, NULL, NULL, 0, fl, es, 0);
                break;
        case L_EMPTY:
                o = owned_new(dt, 2, s03, NULL, 0, fl, 0, 0);
                break;
        case L_BROADCAST:
                o = owned_new(dt, 2, s34, bc, 0, fl, 4 * es, 0);
                break;
        default:
                break;
        }
        ck_assert_ptr_nonnull(o);
        pattern_fill(&o->mt.dl_tensor, fl, seed);
        return &o->mt;
}

/* t's stride in dimension i (compact when it has none). */
static int64_t stride_of(const DLTensor *t, int i)
{
        int64_t s = 1;

        if (t->strides)
                return t->strides[i];
        for (int k = t->ndim - 1; k > i; k--)
                s *= t->shape[k];
        return s;
}

/*
 * "every dtype and layout must arrive exactly": through the inline path (each
 * comes with its news). 41 dtypes (sub-byte packed and padded, vectors,
 * fp8/fp6/fp4) compact; each byte-addressable one also transposed, at a byte
 * offset, as a scalar, empty (0 x 3) and broadcast (stride 0). On B: the
 * same dtype, shape and strides (where there are two or more elements along
 * a dimension), the same padded flag, read-only, A's version, every
 * element's bytes A's, and it came with its news.
 */
START_TEST(every_dtype_and_layout_comes_exactly_with_its_news)
{
        dlx_client *pa, *pb;
        char name[96], remote[100];
        int n = 0;

        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int d = 0; d < NDTYPES; d++)
                for (int l = 0; l < NLAYS; l++) {
                        if (l != L_COMPACT && elem_size(dtypes[d].dt, dtypes[d].flags) == 0)
                                continue;
                        snprintf(name, sizeof(name), "model/dt/%s/%s", dtypes[d].name,
                                 lay_names[l]);
                        publish_ok(pa, name, layout_new(d, (enum lay)l, (uint8_t)(d * 7 + l)), NULL,
                                   NULL);
                        n++;
                }
        for (int d = 0; d < NDTYPES; d++)
                for (int l = 0; l < NLAYS; l++) {
                        DLManagedTensorVersioned *here, *there;
                        uint64_t hf, tf, v = 0;
                        int err;
                        if (l != L_COMPACT && elem_size(dtypes[d].dt, dtypes[d].flags) == 0)
                                continue;
                        snprintf(name, sizeof(name), "model/dt/%s/%s", dtypes[d].name,
                                 lay_names[l]);
                        snprintf(remote, sizeof(remote), "@a/%s", name);
                        wait_for(pb, remote, 1);
                        here = acquire_ok(pa, name, NULL);
                        there = acquire_at(pb, remote, 1, 0, &err);
                        ck_assert_msg(there, "%s: %s (%s)", remote, dlx_strerror(err),
                                      dlx_last_error());
                        const DLTensor *h = &here->dl_tensor, *t = &there->dl_tensor;
                        ck_assert_msg(
                                h->dtype.code == t->dtype.code && h->dtype.bits == t->dtype.bits &&
                                        h->dtype.lanes == t->dtype.lanes && h->ndim == t->ndim,
                                "%s: dtype or rank differs", remote);
                        for (int i = 0; i < h->ndim; i++) {
                                ck_assert_msg(h->shape[i] == t->shape[i], "%s: shape[%d]", remote,
                                              i);
                                if (h->shape[i] > 1)
                                        ck_assert_msg(stride_of(h, i) == stride_of(t, i),
                                                      "%s: stride[%d] %lld on A, %lld on B", remote,
                                                      i, (long long)stride_of(h, i),
                                                      (long long)stride_of(t, i));
                        }
                        hf = here->flags & PADDED;
                        tf = there->flags & PADDED;
                        ck_assert_msg(hf == tf && hf == dtypes[d].flags,
                                      "%s: padded flag %llu on A, %llu on B", remote,
                                      (unsigned long long)hf, (unsigned long long)tf);
                        ck_assert(there->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
                        if (elem_size(h->dtype, here->flags) == 0) {
                                /* packed: compact, the pattern runs over its bytes */
                                ck_assert_msg(
                                        pattern_check(t, there->flags, (uint8_t)(d * 7 + l)) == 0,
                                        "%s: bytes differ from A's", remote);
                                ck_assert_msg(pattern_check(h, here->flags, (uint8_t)(d * 7 + l)) ==
                                                      0,
                                              "%s: A's own bytes differ", name);
                        } else {
                                /* element by element (a broadcast's elements share bytes) */
                                expect_same(h, t, remote);
                        }
                        DLXV(dlx_tensor_info(there, NULL, &v, NULL));
                        ck_assert_uint_eq(v, 1);
                        ck_assert_msg(made_with_news(name, 1) == 1,
                                      "%s: did not come with its news (%d mirrors)", remote,
                                      made(name, 1));
                        here->deleter(here);
                        there->deleter(there);
                }
        fprintf(stderr, "offer-attacks: %d dtype/layout names came with their news\n", n);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 3. writable versions ------------------------------------------------------------------- */

/*
 * "Only read-only versions are exported" (README: -ENOTSUP for a writable
 * version), "also not inside a Change". Under the followed prefix: a
 * writable model/rw (small: it would fit a Change); model/x read-only v1
 * replaced at once by writable v2 and v3, then read-only v4. B never has
 * model/rw, never has model/x at v2 or v3, no writable version came with its
 * news, and v4 comes with its bytes. A consumer on B that waits for
 * @a/model/rw fails (not with bytes).
 */
START_TEST(a_writable_version_never_rides_a_change)
{
        struct dlx_publish_options w = {.writable = true};
        dlx_client *pa, *pb, *wb, *wx;
        static struct hist hx, hrw;
        struct dlx_info in;
        int err;

        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        memset(&hx, 0, sizeof(hx));
        memset(&hrw, 0, sizeof(hrw));
        wb = b_watcher();
        wx = b_watcher();
        publish_ok(pa, "model/rw", u8_new(pa, 64, 9), &w, NULL);
        publish_ok(pa, "model/x", u8_new(pa, 64, 1), NULL, NULL);
        publish_ok(pa, "model/x", u8_new(pa, 64, 2), &w, NULL);
        publish_ok(pa, "model/x", u8_new(pa, 64, 3), &w, NULL);
        publish_ok(pa, "model/mark", u8_new(pa, 64, 1), NULL, NULL);
        wait_for(pb, "@a/model/mark", 1);
        fx_sleep_ms(300);
        ck_assert_int_eq(dlx_stat(pb, "@a/model/rw", &in), -ENOENT);
        err = dlx_stat(pb, "@a/model/x", &in);
        ck_assert_msg(err == -ENOENT || in.version == 1, "writable v%llu of model/x reached B",
                      (unsigned long long)in.version);
        DLManagedTensorVersioned *t = acquire_at(pb, "@a/model/rw", 1, 3000, &err);
        ck_assert_msg(!t, "B acquired the writable model/rw");
        fprintf(stderr, "offer-attacks: a wait for the writable model/rw on B: %s (%s)\n",
                dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(made("model/rw", 1), 0);
        ck_assert_int_eq(made("model/x", 2), 0);
        ck_assert_int_eq(made("model/x", 3), 0);
        publish_ok(pa, "model/x", u8_new(pa, 64, 4), NULL, NULL);
        wait_for(pb, "@a/model/x", 4);
        b_has(pb, "@a/model/x", 4, 64, 4);
        hist_drain(wb, "@a/model/rw", &hrw);
        ck_assert_int_eq(hrw.n, 0);
        hist_drain(wx, "@a/model/x", &hx);
        for (int i = 0; i < hx.n; i++)
                ck_assert_msg(hx.v[i] != 2 && hx.v[i] != 3, "writable v%llu of model/x on B",
                              (unsigned long long)hx.v[i]);
        dlx_close(wx);
        dlx_close(wb);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 4. a replace storm of small versions --------------------------------------------------- */

/* A reader on B during a storm: each newer version as it comes, its bytes checked. */
struct reader {
        pthread_t th;
        dlx_client *c;
        const char *name;
        uint64_t last, top;
        int64_t n;
        int got, rc;
        char bad[200];
};

static void *reader_run(void *arg)
{
        struct reader *r = arg;

        while (r->last < r->top) {
                struct dlx_acquire_options o = {.min_version = r->last + 1, .timeout_ms = 5000};
                DLManagedTensorVersioned *t = NULL;
                uint64_t v = 0;
                r->rc = dlx_acquire(r->c, r->name, &o, &t);
                if (r->rc < 0) {
                        snprintf(r->bad, sizeof(r->bad), "after v%llu: %s (%s)",
                                 (unsigned long long)r->last, dlx_strerror(r->rc),
                                 dlx_last_error());
                        return NULL;
                }
                dlx_tensor_info(t, NULL, &v, NULL);
                if (v <= r->last || !u8_is(t, r->n, (unsigned)v)) {
                        snprintf(r->bad, sizeof(r->bad), "v%llu after v%llu: %s",
                                 (unsigned long long)v, (unsigned long long)r->last,
                                 v <= r->last ? "went back" : "not its bytes");
                        t->deleter(t);
                        r->rc = -EPROTO;
                        return NULL;
                }
                r->last = v;
                r->got++;
                t->deleter(t);
        }
        return NULL;
}

/*
 * A storm of n replaces of a 1 KiB model/s as fast as A takes them, B
 * following; with a reader on B (taking each newer version once it is
 * there, its bytes checked), or none. B must end at v(n) with its bytes,
 * keep it, its mirrors made once each and never going back. Returns what
 * A's bridge served B (dlxctl peers --json: clients' bytes_out, in
 * versions' worth) and, in *mirrors, the mirrors B made.
 */
static long long storm(int n, bool reader, int *mirrors, int *read)
{
        enum { SIZE = 1024 };
        dlx_client *pa, *pb, *wb;
        static struct hist h;
        struct reader rd = {0};
        long long served, bytes_out;
        const char *json;

        memset(&h, 0, sizeof(h));
        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        wb = b_watcher();
        publish_ok(pa, "model/s", u8_new(pa, SIZE, 1), NULL, NULL);
        wait_for(pb, "@a/model/s", 1);
        if (reader) {
                rd.c = fx_connect(&B.d, "reader-b");
                rd.name = "@a/model/s";
                rd.last = 1;
                rd.top = (uint64_t)n;
                rd.n = SIZE;
                ck_assert_int_eq(pthread_create(&rd.th, NULL, reader_run, &rd), 0);
        }
        for (int i = 2; i <= n; i++)
                publish_ok(pa, "model/s", u8_new(pa, SIZE, (unsigned)i), NULL, NULL);
        wait_for(pb, "@a/model/s", (uint64_t)n);
        if (reader) {
                pthread_join(rd.th, NULL);
                dlx_close(rd.c);
                ck_assert_msg(rd.rc == 0, "a reader on B: %s", rd.bad);
        }
        b_has(pb, "@a/model/s", (uint64_t)n, SIZE, (unsigned)n);
        hist_drain(wb, "@a/model/s", &h);
        hist_rising(&h, "@a/model/s");
        stays(pb, "@a/model/s", (uint64_t)n, 300);
        json = peers_json(&A);
        served = jnum0(json, "clients", "served");
        bytes_out = jnum0(json, "clients", "bytes_out");
        ck_assert_msg(served >= 0 && bytes_out >= 0, "no clients in A's peers: %s", json);
        fprintf(stderr,
                "offer-attacks: storm of %d%s: B made %d mirrors (a reader took %d); A served "
                "%lld times, %lld bytes (%lld versions' worth)\n",
                n, reader ? " with a reader" : "", h.n, rd.got, served, bytes_out,
                bytes_out / SIZE);
        holds_nothing(pa, pb);
        dlx_close(wb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
        *mirrors = h.n;
        *read = rd.got;
        return bytes_out / SIZE;
}

/*
 * "Each new version is pulled at once ... A small version comes with its
 * news" and "one network copy per host per version (except the crossing
 * case)": 1000 replaces, nobody on B wanting any (so no crossing). What A
 * sent B must be no more than the versions B mirrored: each version's bytes
 * crossed once.
 */
START_TEST(a_storm_of_small_replaces_crosses_each_version_once)
{
        int mirrors, read;
        long long sent = storm(1000, false, &mirrors, &read);

        ck_assert_msg(sent <= mirrors,
                      "A sent B %lld versions' worth of model/s for the %d versions B mirrored: "
                      "versions crossed more than once",
                      sent, mirrors);
}
END_TEST

/*
 * The same storm with a reader on B acquiring each newer version as it comes
 * (min_version one above what it has): every version it gets is above the
 * last and has its own bytes ("min_version means the same on both hosts");
 * with the reader's wants the crossing case may double a version's bytes,
 * no more.
 */
START_TEST(a_reader_on_b_during_a_storm_sees_versions_rise_with_their_bytes)
{
        int mirrors, read;
        long long sent = storm(1000, true, &mirrors, &read);

        ck_assert_msg(sent <= 2LL * mirrors,
                      "A sent B %lld versions' worth of model/s for the %d versions B mirrored",
                      sent, mirrors);
}
END_TEST

/*
 * The same promise, made deterministic: A's bridge is paused (SIGSTOP) while
 * A replaces model/p 50 times, then resumed, so that it reads 50 events at
 * once, all of them older than what A has. B needs one copy (v50); the
 * news of v1..v49 may say that they were, but each small version's bytes
 * cross once at most: A may send no more versions' worth than B mirrored.
 */
START_TEST(news_read_late_carry_the_last_version_once)
{
        enum { SIZE = 1024, N = 50 };
        dlx_client *pa, *pb, *wb;
        static struct hist h;
        long long before, after;

        memset(&h, 0, sizeof(h));
        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/mark", u8_new(pa, 64, 1), NULL, NULL);
        wait_for(pb, "@a/model/mark", 1);
        fx_sleep_ms(200);
        wb = b_watcher();
        before = jnum0(peers_json(&A), "clients", "bytes_out");
        ck_assert_int_eq(kill(A.fed, SIGSTOP), 0);
        for (int i = 1; i <= N; i++)
                publish_ok(pa, "model/p", u8_new(pa, SIZE, (unsigned)i), NULL, NULL);
        ck_assert_int_eq(kill(A.fed, SIGCONT), 0);
        wait_for(pb, "@a/model/p", N);
        b_has(pb, "@a/model/p", N, SIZE, N);
        hist_drain(wb, "@a/model/p", &h);
        hist_rising(&h, "@a/model/p");
        after = jnum0(peers_json(&A), "clients", "bytes_out");
        fprintf(stderr,
                "offer-attacks: %d news read late: B made %d mirrors (v%llu..v%llu); A sent "
                "%lld bytes (%lld versions' worth)\n",
                N, h.n, (unsigned long long)(h.n ? h.v[0] : 0),
                (unsigned long long)(h.n ? h.v[h.n - 1] : 0), after - before,
                (after - before) / SIZE);
        ck_assert_msg((after - before) / SIZE <= h.n,
                      "A sent B %lld versions' worth of model/p for the %d versions B mirrored: "
                      "the same version's bytes crossed %lld times",
                      (after - before) / SIZE, h.n, (after - before) / SIZE / (h.n ? h.n : 1));
        stays(pb, "@a/model/p", N, 200);
        holds_nothing(pa, pb);
        dlx_close(wb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 5. replace, then unpublish at once ----------------------------------------------------- */

/*
 * "A name unpublished on A is unpublished on B". 40 names each published,
 * replaced and unpublished at once (small: their news carry bytes), and 8
 * the same at 32 KiB (asked for); then a mark. Once the mark is on B, none
 * of the 48 may be there (nor come back in the next 500 ms), and A holds
 * nothing.
 */
START_TEST(a_replace_then_unpublish_leaves_no_mirror)
{
        dlx_client *pa, *pb;
        char name[64];

        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < 48; i++) {
                int64_t n = i < 40 ? 512 : 32768;
                snprintf(name, sizeof(name), "model/ru/%02d", i);
                publish_ok(pa, name, u8_new(pa, n, 1), NULL, NULL);
                publish_ok(pa, name, u8_new(pa, n, 2), NULL, NULL);
                DLXV(dlx_unpublish(pa, name));
        }
        publish_ok(pa, "model/ru-mark", u8_new(pa, 64, 1), NULL, NULL);
        wait_for(pb, "@a/model/ru-mark", 1);
        for (int t = 0; t < 3000 && names_under(pb, "@a/model/ru/") > 0; t += 50)
                fx_sleep_ms(50);
        for (int t = 0; t < 500; t += 50) {
                int left = names_under(pb, "@a/model/ru/");
                ck_assert_msg(left == 0, "%d of 48 names unpublished on A are still on B", left);
                fx_sleep_ms(50);
        }
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 6. tensor, group, tensor --------------------------------------------------------------- */

static void group_of_two(dlx_client *pa, const char *name, unsigned seed, uint64_t *v)
{
        struct dlx_member m[2] = {{"a", u8_new(pa, 100, seed)}, {"b", u8_new(pa, 60, seed + 1)}};

        DLXV(dlx_publish_group(pa, name, m, 2, NULL, v));
}

static void b_has_group(dlx_client *pb, const char *name, uint64_t version, unsigned seed)
{
        struct dlx_acquire_options o = {.min_version = version, .timeout_ms = 0};
        DLManagedTensorVersioned *t;
        dlx_group *g = NULL;
        int err = dlx_acquire_group(pb, name, NULL, 0, &o, &g);

        ck_assert_msg(err == 0, "group %s v%llu on B: %s (%s)", name, (unsigned long long)version,
                      dlx_strerror(err), dlx_last_error());
        ck_assert_uint_eq(dlx_group_version(g), version);
        ck_assert_uint_eq(dlx_group_count(g), 2);
        DLXV(dlx_group_take(g, (size_t)dlx_group_find(g, "a"), &t));
        ck_assert_msg(u8_is(t, 100, seed), "%s member a: not A's bytes", name);
        t->deleter(t);
        DLXV(dlx_group_take(g, (size_t)dlx_group_find(g, "b"), &t));
        ck_assert_msg(u8_is(t, 60, seed + 1), "%s member b: not A's bytes", name);
        t->deleter(t);
        dlx_group_release(g);
}

/*
 * Groups never ride a Change ("a small version ... as a Lookup of it would
 * be answered", and a group is none of dlx_acquire()'s): a name that flips
 * tensor -> group -> tensor -> group must still come each time, as what it
 * is, with its bytes. Slowly (each waited for on B), then the same flips
 * back to back on another name: B ends at the last, a group of 2.
 */
START_TEST(a_name_flipping_between_tensor_and_group_still_comes)
{
        dlx_client *pa, *pb;
        struct dlx_info in;
        uint64_t v;

        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/f", u8_new(pa, 64, 1), NULL, NULL);
        in = wait_for(pb, "@a/model/f", 1);
        ck_assert_uint_eq(in.members, 0);
        b_has(pb, "@a/model/f", 1, 64, 1);
        group_of_two(pa, "model/f", 2, &v);
        ck_assert_uint_eq(v, 2);
        in = wait_for(pb, "@a/model/f", 2);
        ck_assert_uint_eq(in.members, 2);
        b_has_group(pb, "@a/model/f", 2, 2);
        publish_ok(pa, "model/f", u8_new(pa, 64, 3), NULL, NULL);
        in = wait_for(pb, "@a/model/f", 3);
        ck_assert_uint_eq(in.members, 0);
        b_has(pb, "@a/model/f", 3, 64, 3);
        group_of_two(pa, "model/f", 4, &v);
        in = wait_for(pb, "@a/model/f", 4);
        ck_assert_uint_eq(in.members, 2);
        b_has_group(pb, "@a/model/f", 4, 4);
        /* back to back */
        for (unsigned i = 1; i <= 8; i++) {
                if (i % 2)
                        publish_ok(pa, "model/ff", u8_new(pa, 64, i), NULL, NULL);
                else
                        group_of_two(pa, "model/ff", i, &v);
        }
        in = wait_for(pb, "@a/model/ff", 8);
        ck_assert_uint_eq(in.members, 2);
        b_has_group(pb, "@a/model/ff", 8, 8);
        stays(pb, "@a/model/ff", 8, 300);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 7. consumers waiting when the news comes ----------------------------------------------- */

/*
 * "A want of a higher version than one A has not answered yet waits for that
 * answer"; "a consumer's want already on its way to A is answered by it
 * [the news], and A's answer to that want, crossing it, is dropped: ... the
 * mirror is made once". B has model/w v1; a consumer on B waits for
 * min_version 3 (its want is on its way to A, waiting there); A publishes v2
 * and v3 back to back. The consumer gets v3 with v3's bytes, each version's
 * mirror is made at most once (v3 exactly once), B ends at v3, A holds
 * nothing.
 */
START_TEST(a_consumer_waiting_for_n_plus_1_while_a_publishes_n_then_n_plus_1)
{
        dlx_client *pa, *pb;
        struct waiter w;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/w", u8_new(pa, 256, 1), NULL, NULL);
        pair_up(A_EXPORT, B_FOLLOW);
        follows_stand(1);
        wait_for(pb, "@a/model/w", 1);
        waiter_start(&w, "@a/model/w", 3, 256, 10000);
        fx_sleep_ms(400);
        publish_ok(pa, "model/w", u8_new(pa, 256, 2), NULL, NULL);
        publish_ok(pa, "model/w", u8_new(pa, 256, 3), NULL, NULL);
        waiter_join(&w);
        ck_assert_msg(w.rc == 0, "the wait for v3: %s (%s) after %lld ms", dlx_strerror(w.rc),
                      w.err, (long long)w.took_ms);
        ck_assert_uint_eq(w.version, 3);
        ck_assert_msg(w.bytes_ok, "v3 on B: not v3's bytes");
        wait_for(pb, "@a/model/w", 3);
        fx_sleep_ms(300);
        ck_assert_int_le(made("model/w", 2), 1);
        ck_assert_int_eq(made("model/w", 3), 1);
        stays(pb, "@a/model/w", 3, 200);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/*
 * The same rules with many consumers: B has model/v v1; consumers on B wait
 * for min_version 1 to 8 (1 is there); A publishes v2..v8 back to back. Each
 * consumer gets a version at least its own, with that version's bytes, none
 * fails; B's mirrors rise and are each made once; B ends at v8.
 */
START_TEST(consumers_waiting_for_every_version_when_the_news_comes)
{
        enum { TOP = 8 };
        dlx_client *pa, *pb, *wb;
        struct waiter w[TOP];
        struct hist h = {0};

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/v", u8_new(pa, 128, 1), NULL, NULL);
        pair_up(A_EXPORT, B_FOLLOW);
        follows_stand(1);
        wait_for(pb, "@a/model/v", 1);
        wb = b_watcher();
        for (int i = 0; i < TOP; i++)
                waiter_start(&w[i], "@a/model/v", (uint64_t)i + 1, 128, 10000);
        fx_sleep_ms(400);
        for (unsigned v = 2; v <= TOP; v++)
                publish_ok(pa, "model/v", u8_new(pa, 128, v), NULL, NULL);
        for (int i = 0; i < TOP; i++) {
                waiter_join(&w[i]);
                ck_assert_msg(w[i].rc == 0, "the wait for v%d: %s (%s) after %lld ms", i + 1,
                              dlx_strerror(w[i].rc), w[i].err, (long long)w[i].took_ms);
                ck_assert_uint_ge(w[i].version, (uint64_t)i + 1);
                ck_assert_msg(w[i].bytes_ok, "the wait for v%d got v%llu: not its bytes", i + 1,
                              (unsigned long long)w[i].version);
        }
        wait_for(pb, "@a/model/v", TOP);
        fx_sleep_ms(300);
        hist_drain(wb, "@a/model/v", &h);
        hist_rising(&h, "@a/model/v");
        for (int v = 1; v <= TOP; v++)
                ck_assert_msg(made("model/v", (uint64_t)v) <= 1, "v%d made %d times", v,
                              made("model/v", (uint64_t)v));
        holds_nothing(pa, pb);
        dlx_close(wb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/*
 * "A want of a higher version than one A has not answered yet waits for that
 * answer, and asks on its own only if what comes is older; ... a failure to
 * get v2 fails only the acquires that asked for more than what came"; "only
 * read-only versions are exported". B has model/t v1; consumers on B wait
 * for v2 and for v3; A publishes v2 writable (refused: -ENOTSUP), then,
 * 500 ms later, v3 read-only (small: it comes with its news). The want of
 * v2 may fail (-ENOTSUP); the want of v3 asked for nothing A refused: it
 * must get v3.
 */
START_TEST(a_refused_writable_v2_does_not_fail_the_want_of_v3)
{
        struct dlx_publish_options wr = {.writable = true};
        dlx_client *pa, *pb;
        struct waiter w2, w3;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/t", u8_new(pa, 128, 1), NULL, NULL);
        pair_up(A_EXPORT, B_FOLLOW);
        follows_stand(1);
        wait_for(pb, "@a/model/t", 1);
        waiter_start(&w2, "@a/model/t", 2, 128, 8000);
        fx_sleep_ms(150);
        waiter_start(&w3, "@a/model/t", 3, 128, 8000);
        fx_sleep_ms(400);
        publish_ok(pa, "model/t", u8_new(pa, 128, 2), &wr, NULL);
        fx_sleep_ms(500);
        publish_ok(pa, "model/t", u8_new(pa, 128, 3), NULL, NULL);
        waiter_join(&w2);
        waiter_join(&w3);
        fprintf(stderr,
                "offer-attacks: writable v2: want of v2 %s v%llu (%s); of v3 %s v%llu (%s)\n",
                dlx_strerror(w2.rc), (unsigned long long)w2.version, w2.err, dlx_strerror(w3.rc),
                (unsigned long long)w3.version, w3.err);
        ck_assert_msg(w2.rc == 0 || w2.rc == -ENOTSUP, "want of v2: %s (%s)", dlx_strerror(w2.rc),
                      w2.err);
        ck_assert_msg(w3.rc == 0,
                      "the want of v3 failed with %s (%s) after %lld ms: A's refusal of the "
                      "writable v2 failed it, though v3 (read-only) came 500 ms later",
                      dlx_strerror(w3.rc), w3.err, (long long)w3.took_ms);
        ck_assert_uint_eq(w3.version, 3);
        ck_assert(w3.bytes_ok);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/*
 * "a consumer's want already on its way to A is answered by it, and A's
 * answer to that want, crossing it, is dropped: the bytes then cross twice,
 * the mirror is made once". B has model/c v1; three consumers wait for v2
 * (one want, asked, waiting at A); A publishes v2 (small). All get v2's
 * bytes, v2's mirror is made once, and at most two copies of v2 crossed
 * (A's served bytes for v2: at most 2 x 200).
 */
START_TEST(the_crossing_answer_is_dropped_the_mirror_made_once)
{
        dlx_client *pa, *pb;
        struct waiter w[3];
        long long before, after;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/c", u8_new(pa, 200, 1), NULL, NULL);
        pair_up(A_EXPORT, B_FOLLOW);
        follows_stand(1);
        wait_for(pb, "@a/model/c", 1);
        fx_sleep_ms(200);
        before = jnum0(peers_json(&A), "clients", "bytes_out");
        for (int i = 0; i < 3; i++)
                waiter_start(&w[i], "@a/model/c", 2, 200, 8000);
        fx_sleep_ms(400);
        publish_ok(pa, "model/c", u8_new(pa, 200, 2), NULL, NULL);
        for (int i = 0; i < 3; i++) {
                waiter_join(&w[i]);
                ck_assert_msg(w[i].rc == 0, "want of v2: %s (%s)", dlx_strerror(w[i].rc), w[i].err);
                ck_assert_uint_eq(w[i].version, 2);
                ck_assert(w[i].bytes_ok);
        }
        fx_sleep_ms(400);
        after = jnum0(peers_json(&A), "clients", "bytes_out");
        fprintf(stderr, "offer-attacks: crossing: A sent %lld bytes for v2 (200 each)\n",
                after - before);
        ck_assert_int_eq(made("model/c", 2), 1);
        ck_assert_msg(after - before <= 400, "v2 crossed %lld times", (after - before) / 200);
        stays(pb, "@a/model/c", 2, 200);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 8. B short of memory ------------------------------------------------------------------- */

/*
 * "What can fail, fails clearly": B's dlxd --max-bytes 8192, smaller than a
 * 16 KiB version that comes with its news. A consumer on B waiting for it
 * fails at once with -ENOSPC (not at its own 6 s timeout); the bridges live;
 * a 256-byte version then comes; A holds nothing; B holds no more than its
 * limit.
 */
START_TEST(a_small_version_larger_than_bs_limit_fails_clearly)
{
        char uid[16];
        const char *a_extra[] = {"--federation-uid", uid, NULL};
        const char *b_extra[] = {"--federation-uid", uid, "--max-bytes", "8192", NULL};
        dlx_client *pa, *pb;
        struct waiter w;
        struct dlx_stats s;

        snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
        dlxd_start(&A.d, a_extra);
        dlxd_start(&B.d, b_extra);
        A.port = free_port();
        B.port = free_port();
        A.fed = B.fed = 0;
        pair_up(A_EXPORT, B_FOLLOW);
        follows_stand(1);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        waiter_start(&w, "@a/model/m/big", 1, 16384, 6000);
        fx_sleep_ms(300);
        publish_ok(pa, "model/m/big", u8_new(pa, 16384, 1), NULL, NULL);
        waiter_join(&w);
        fprintf(stderr, "offer-attacks: 16 KiB into an 8 KiB B: %s after %lld ms (%s)\n",
                dlx_strerror(w.rc), (long long)w.took_ms, w.err);
        ck_assert_msg(w.rc == -ENOSPC && w.took_ms < 4000,
                      "the wait for a version B has no room for: %s (%s) after %lld ms",
                      dlx_strerror(w.rc), w.err, (long long)w.took_ms);
        publish_ok(pa, "model/m/small", u8_new(pa, 256, 2), NULL, NULL);
        wait_for(pb, "@a/model/m/small", 1);
        b_has(pb, "@a/model/m/small", 1, 256, 2);
        DLXV(dlx_stats(pb, &s));
        ck_assert_uint_le(s.bytes, 8192);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 9. overlapping follows ----------------------------------------------------------------- */

/*
 * "one network copy per host per version" and "A name unpublished on A is
 * unpublished on B", with B following @a/model/ and @a/model/x/ (each change
 * under model/x/ comes twice). 300 small replaces of model/x/w: B's mirrors
 * rise, each made once, and B ends at v300. model/x/r unpublished and
 * published again 20 times (each life two versions): B ends with it at A's
 * last version, with its bytes, and keeps it. No mirror publish fails.
 */
START_TEST(overlapping_follows_make_each_mirror_once)
{
        const char *b_args[] = {"--follow", "@a/model/", "--follow", "@a/model/x/", NULL};
        dlx_client *pa, *pb, *wb;
        static struct hist h;
        uint64_t v = 0;

        memset(&h, 0, sizeof(h));
        hosts_up();
        pair_up(A_EXPORT, b_args);
        follows_stand(2);
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        wb = b_watcher();
        for (int i = 1; i <= 300; i++)
                publish_ok(pa, "model/x/w", u8_new(pa, 512, (unsigned)i), NULL, NULL);
        wait_for(pb, "@a/model/x/w", 300);
        b_has(pb, "@a/model/x/w", 300, 512, 300);
        for (int i = 0; i < 20; i++) {
                if (i)
                        DLXV(dlx_unpublish(pa, "model/x/r"));
                publish_ok(pa, "model/x/r", u8_new(pa, 256, 100u + (unsigned)i), NULL, NULL);
                publish_ok(pa, "model/x/r", u8_new(pa, 256, 200u + (unsigned)i), NULL, &v);
        }
        fx_sleep_ms(300);
        wait_for(pb, "@a/model/x/r", v);
        stays(pb, "@a/model/x/r", v, 500);
        b_has(pb, "@a/model/x/r", v, 256, 219);
        hist_drain(wb, "@a/model/x/w", &h);
        hist_rising(&h, "@a/model/x/w");
        ck_assert_int_eq(log_count(&B, "cannot publish"), 0);
        holds_nothing(pa, pb);
        dlx_close(wb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 10. bridges killed --------------------------------------------------------------------- */

/*
 * "A restarted bridge mounts its prefixes again"; the follow's listing.
 * 20 small names and a 4 MiB one published on A, B's bridge killed (-9) at
 * once: A's bridge holds nothing a moment later (its lease ended with the
 * failed send), and B's bridge started again ends with every name at A's
 * version and bytes.
 */
START_TEST(bs_bridge_killed_right_after_publishes)
{
        dlx_client *pa, *pb;
        char name[64];

        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < 20; i++) {
                snprintf(name, sizeof(name), "model/k/%02d", i);
                publish_ok(pa, name, u8_new(pa, 512, (unsigned)i), NULL, NULL);
                publish_ok(pa, name, u8_new(pa, 512, (unsigned)i + 50), NULL, NULL);
        }
        publish_ok(pa, "model/k/big", u8_new(pa, 4 << 20, 7), NULL, NULL);
        fed_kill(&B);
        holds_nothing(pa, pb);
        b_again(B_FOLLOW);
        for (int i = 0; i < 20; i++) {
                char remote[64];
                snprintf(remote, sizeof(remote), "@a/model/k/%02d", i);
                wait_for(pb, remote, 2);
                b_has(pb, remote, 2, 512, (unsigned)i + 50);
        }
        wait_for(pb, "@a/model/k/big", 1);
        b_has(pb, "@a/model/k/big", 1, 4 << 20, 7);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/*
 * "A peer that dies takes its mirrors with it (copies consumers hold stay
 * readable)". B follows; 20 small names on A, mirrored; a consumer on B holds
 * one; A publishes v2 of each and its bridge is killed (-9) at once. Every
 * mirror goes from B, the held copy stays readable, A's dlxd holds no lease
 * of the dead bridge, and B's bridge lives (it stops cleanly).
 */
START_TEST(as_bridge_killed_right_after_publishes)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *held;
        char name[64];

        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < 20; i++) {
                snprintf(name, sizeof(name), "model/k/%02d", i);
                publish_ok(pa, name, u8_new(pa, 512, (unsigned)i), NULL, NULL);
        }
        wait_for(pb, "@a/model/k/19", 1);
        held = acquire_ok(pb, "@a/model/k/00", NULL);
        for (int i = 0; i < 20; i++) {
                snprintf(name, sizeof(name), "model/k/%02d", i);
                publish_ok(pa, name, u8_new(pa, 512, (unsigned)i + 50), NULL, NULL);
        }
        fed_kill(&A);
        for (int t = 0; t < 5000 && names_under(pb, "@a/") > 0; t += 50)
                fx_sleep_ms(50);
        ck_assert_int_eq(names_under(pb, "@a/"), 0);
        ck_assert(u8_is(held, 512, 0));
        held->deleter(held);
        holds_nothing(pa, pb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* ---- 11. a life that ended while its want waited -------------------------------------------- */

/*
 * "A name unpublished on A is unpublished on B", "then each publish ... as it
 * happens ... so a consumer on B finds it there", and the mirror made once.
 * B has model/r v2; a consumer on B waits for v5 (its want waits at A). A
 * unpublishes model/r (B's mirror goes) and publishes it again up to v5,
 * back to back (A's bridge's own waiting lookup keeps the name's count
 * there: the new life begins at v3, small: each comes with its news). The
 * consumer gets v5 with the new life's v5 bytes; B then has model/r at v5
 * and keeps it (never gone, even for a moment), the new life's mirrors
 * rising, v5 made once.
 */
START_TEST(a_new_life_while_a_want_of_the_old_waits)
{
        dlx_client *pa, *pb, *wb;
        struct waiter w;
        struct hist h = {0};
        uint64_t v = 0;

        hosts_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        publish_ok(pa, "model/r", u8_new(pa, 128, 1), NULL, NULL);
        publish_ok(pa, "model/r", u8_new(pa, 128, 2), NULL, NULL);
        pair_up(A_EXPORT, B_FOLLOW);
        follows_stand(1);
        wait_for(pb, "@a/model/r", 2);
        waiter_start(&w, "@a/model/r", 5, 128, 10000);
        fx_sleep_ms(400);
        DLXV(dlx_unpublish(pa, "model/r"));
        wait_for(pb, "@a/model/r", 0);
        wb = b_watcher();
        holds_nothing(pa, pb);
        /* A's own waiting lookup keeps the count: the new life starts at v3 there */
        publish_ok(pa, "model/r", u8_new(pa, 128, 0), NULL, &v);
        fprintf(stderr, "offer-attacks: model/r's new life begins at v%llu on A\n",
                (unsigned long long)v);
        while (v < 5)
                publish_ok(pa, "model/r", u8_new(pa, 128, (unsigned)v + 1), NULL, &v);
        waiter_join(&w);
        ck_assert_msg(w.rc == 0, "the wait for v5: %s (%s)", dlx_strerror(w.rc), w.err);
        ck_assert_uint_eq(w.version, 5);
        ck_assert(w.bytes_ok);
        wait_for(pb, "@a/model/r", 5);
        stays(pb, "@a/model/r", 5, 800);
        hist_drain(wb, "@a/model/r", &h);
        hist_rising(&h, "@a/model/r");
        ck_assert_msg(h.unpublished == 0, "B's mirror of the new life went %d times",
                      h.unpublished);
        holds_nothing(pa, pb);
        dlx_close(wb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/*
 * The same, the new life's first version being the very one the old life's
 * want waits for, at 64 KiB (asked for: no news carries it) and at 1 KiB
 * (its news carries it). B has model/n1 (and model/n2) v1; a consumer on B
 * waits for v2 of each (its want waits at A); A unpublishes both (B's
 * mirrors go) and publishes them again: A's own waiting lookups kept the
 * count, so the new lives begin at v2. Each consumer gets v2, with the new
 * bytes; B has both at v2 and keeps them (never gone, even for a moment),
 * v2 mirrored once ("one network copy per host per version").
 */
START_TEST(a_want_of_the_old_life_leaves_the_new_life_alone)
{
        static const char *const names[2] = {"model/n1", "model/n2"};
        static const int64_t sizes[2] = {65536, 1024};
        dlx_client *pa, *pb, *wb;
        struct waiter w[2];
        static struct hist h[2];
        char remote[2][32];
        uint64_t v;

        memset(h, 0, sizeof(h));
        followed_up();
        pa = fx_connect(&A.d, "producer-a");
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < 2; i++) {
                snprintf(remote[i], sizeof(remote[i]), "@a/%s", names[i]);
                publish_ok(pa, names[i], u8_new(pa, sizes[i], 1), NULL, NULL);
                wait_for(pb, remote[i], 1);
                waiter_start(&w[i], remote[i], 2, sizes[i], 10000);
        }
        fx_sleep_ms(400);
        for (int i = 0; i < 2; i++) {
                DLXV(dlx_unpublish(pa, names[i]));
                wait_for(pb, remote[i], 0);
        }
        holds_nothing(pa, pb);
        wb = b_watcher();
        for (int i = 0; i < 2; i++) {
                publish_ok(pa, names[i], u8_new(pa, sizes[i], 2), NULL, &v);
                ck_assert_msg(v == 2, "%s's new life begins at v%llu on A, not v2", names[i],
                              (unsigned long long)v);
        }
        for (int i = 0; i < 2; i++) {
                waiter_join(&w[i]);
                ck_assert_msg(w[i].rc == 0, "the wait for %s v2: %s (%s)", remote[i],
                              dlx_strerror(w[i].rc), w[i].err);
                ck_assert_uint_eq(w[i].version, 2);
                ck_assert(w[i].bytes_ok);
        }
        for (int i = 0; i < 2; i++) {
                wait_for(pb, remote[i], 2);
                stays(pb, remote[i], 2, 500);
        }
        hist_drain(wb, remote[0], &h[0]);
        /* A's bridge logs each lease it serves a big one from: "lease N on v2 (65536 bytes)" */
        int crossed = log_count(&A, "on v2 (65536 bytes)");
        fprintf(stderr,
                "offer-attacks: old life's want: %s v2 sent %d times, mirrored %d times, "
                "unpublished on B %d times\n",
                remote[0], crossed, h[0].n, h[0].unpublished);
        ck_assert_msg(made(names[0], 2) == 1 && h[0].unpublished == 0 && crossed <= 1,
                      "%s v2 of the new life: A sent it %d times, B mirrored it %d times and "
                      "unpublished it %d times (A never unpublished it)",
                      remote[0], crossed, made(names[0], 2), h[0].unpublished);
        ck_assert_msg(made(names[1], 2) == 1, "%s v2 of the new life: mirrored %d times", remote[1],
                      made(names[1], 2));
        holds_nothing(pa, pb);
        dlx_close(wb);
        dlx_close(pb);
        dlx_close(pa);
        dump_log(&A);
        dump_log(&B);
        hosts_down();
}
END_TEST

/* OA_ONLY=word: only the tests whose name holds word (to reproduce one). */
#define ADD(fn)                                                                                    \
        do {                                                                                       \
                if (!getenv("OA_ONLY") || strstr(#fn, getenv("OA_ONLY")))                          \
                        tcase_add_test(tc, fn);                                                    \
        } while (0)

Suite *offer_attacks_suite(void)
{
        Suite *s = suite_create("offer-attacks");
        TCase *tc = tcase_create("loopback");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 120);
        ADD(sixteen_kib_comes_with_its_news_one_more_byte_is_asked);
        ADD(the_longest_name_the_most_dimensions_at_sixteen_kib);
        ADD(every_dtype_and_layout_comes_exactly_with_its_news);
        ADD(a_writable_version_never_rides_a_change);
        ADD(a_storm_of_small_replaces_crosses_each_version_once);
        ADD(a_reader_on_b_during_a_storm_sees_versions_rise_with_their_bytes);
        ADD(news_read_late_carry_the_last_version_once);
        ADD(a_replace_then_unpublish_leaves_no_mirror);
        ADD(a_name_flipping_between_tensor_and_group_still_comes);
        ADD(a_consumer_waiting_for_n_plus_1_while_a_publishes_n_then_n_plus_1);
        ADD(consumers_waiting_for_every_version_when_the_news_comes);
        ADD(a_refused_writable_v2_does_not_fail_the_want_of_v3);
        ADD(the_crossing_answer_is_dropped_the_mirror_made_once);
        ADD(a_small_version_larger_than_bs_limit_fails_clearly);
        ADD(overlapping_follows_make_each_mirror_once);
        ADD(bs_bridge_killed_right_after_publishes);
        ADD(as_bridge_killed_right_after_publishes);
        ADD(a_new_life_while_a_want_of_the_old_waits);
        ADD(a_want_of_the_old_life_leaves_the_new_life_alone);
        suite_add_tcase(s, tc);
        return s;
}
