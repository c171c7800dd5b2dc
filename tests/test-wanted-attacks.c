/* SPDX-License-Identifier: MIT */
/*
 * Independent tester: wants of one name, coalesced. The promises of dlx.h
 * dlx_mount(), dlx_fetch_failed(), DLX_EVENT_WANTED, dlx_publish_options
 * origin_version/origin, and README.md "Federation: tensors across hosts
 * (dlxfed)", attacked at two levels:
 *  - dlxd alone, this test process acting as the bridge (dlx_mount() on a
 *    dlxd started with --federation-uid <our uid>);
 *  - two hosts on the loopback, each a dlxd and a dlxfed (fedhosts.h).
 * Each test quotes the promise it checks; a failing test is a finding.
 * WANTED_ATTACKS_ONLY=<test name> runs one test alone.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fedhosts.h"
#include "rawpeer.h"

#define EVENT_MS 3000
#define QUIET_MS 300

/* How long drain() waits for the next event. */
static int quiet_ms = QUIET_MS;

/* ---- helpers: dlxd alone ------------------------------------------------------------------ */

static void start_fed(const char *const *more)
{
        char uid[16];
        const char *args[16] = {"--federation-uid", uid};
        int n = 2;

        snprintf(uid, sizeof(uid), "%u", (unsigned)getuid());
        for (int i = 0; more && more[i] && n < 15; i++)
                args[n++] = more[i];
        args[n] = NULL;
        dlxd_start(&fx, args);
}

static int mirror(dlx_client *b, const char *name, uint64_t ov, uint64_t *ret_version)
{
        struct dlx_publish_options o = {.origin_version = ov, .origin = "test mirror"};

        return dlx_publish(b, name, fx_plain_f32(8, 1, NULL), &o, ret_version);
}

static void expect_wanted(dlx_client *b, const char *name, uint64_t version)
{
        struct dlx_event ev;
        int r = dlx_next_event(b, &ev, EVENT_MS * fx_slowdown());

        ck_assert_msg(r == 0, "no WANTED for %s v%llu (%d)", name, (unsigned long long)version, r);
        ck_assert_msg(
                ev.kind == DLX_EVENT_WANTED && strcmp(ev.name, name) == 0 && ev.version == version,
                "expected WANTED %s v%llu, got kind %d '%s' v%llu", name,
                (unsigned long long)version, ev.kind, ev.name, (unsigned long long)ev.version);
}

static void expect_no_event(dlx_client *b, int ms)
{
        struct dlx_event ev;
        int r = dlx_next_event(b, &ev, ms);

        ck_assert_msg(r == -ETIMEDOUT || r == -EAGAIN, "unexpected event kind %d '%s' v%llu",
                      ev.kind, r == 0 ? ev.name : "", (unsigned long long)ev.version);
}

/* Every WANTED of name until QUIET_MS pass without an event: counts per version in cnt[0..n). */
static int drain(dlx_client *b, const char *name, int *cnt, int n, int *lost, int *other)
{
        struct dlx_event ev;
        int got = 0;

        while (dlx_next_event(b, &ev, quiet_ms * fx_slowdown()) == 0) {
                if (ev.kind == DLX_EVENT_LOST) {
                        if (lost)
                                (*lost)++;
                        continue;
                }
                if (ev.kind == DLX_EVENT_WANTED && strcmp(ev.name, name) == 0 &&
                    ev.version < (uint64_t)n) {
                        cnt[ev.version]++;
                        got++;
                } else if (other) {
                        (*other)++;
                }
        }
        return got;
}

/* drain() for per-name wants "<prefix>/<i>" (at version 0): counts per i. */
static int drain_names(dlx_client *b, const char *prefix, int *cnt, int n, int *lost)
{
        struct dlx_event ev;
        size_t pl = strlen(prefix);
        int got = 0;

        while (dlx_next_event(b, &ev, quiet_ms * fx_slowdown()) == 0) {
                if (ev.kind == DLX_EVENT_LOST) {
                        (*lost)++;
                        continue;
                }
                if (ev.kind == DLX_EVENT_WANTED && strncmp(ev.name, prefix, pl) == 0 &&
                    ev.name[pl] == '/') {
                        int i = atoi(ev.name + pl + 1);
                        if (i >= 0 && i < n)
                                cnt[i]++;
                        got++;
                }
        }
        return got;
}

/* An acquire in a thread, on a client of its own. */
struct waiter {
        pthread_t th;
        dlx_client *c;
        char name[64];
        uint64_t min_version;
        int64_t timeout_ms;
        int rc;
        uint64_t version;
        int64_t took_ms;
        char err[300];
        struct dlxd_fixture *d;
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
                t->deleter(t);
        } else {
                snprintf(w->err, sizeof(w->err), "%s", dlx_last_error());
        }
        return NULL;
}

static void waiter_start_on(struct waiter *w, struct dlxd_fixture *d, const char *name,
                            uint64_t min_version, int64_t timeout_ms)
{
        memset(w, 0, sizeof(*w));
        snprintf(w->name, sizeof(w->name), "%s", name);
        w->min_version = min_version;
        w->timeout_ms = timeout_ms;
        w->rc = 12345;
        w->d = d;
        w->c = fx_connect(d, "waiter");
        ck_assert_int_eq(pthread_create(&w->th, NULL, waiter_run, w), 0);
}

static void waiter_start(struct waiter *w, const char *name, uint64_t min_version,
                         int64_t timeout_ms)
{
        waiter_start_on(w, &fx, name, min_version, timeout_ms);
}

static void waiter_join(struct waiter *w)
{
        pthread_join(w->th, NULL);
        dlx_close(w->c);
        w->c = NULL;
}

/* Whether w's thread has ended, waiting up to ms. */
static bool waiter_done(struct waiter *w, int ms)
{
        int64_t end = fx_now_ms() + ms;

        do {
                if (__atomic_load_n(&w->rc, __ATOMIC_ACQUIRE) != 12345)
                        return true;
                fx_sleep_ms(5);
        } while (fx_now_ms() < end);
        return false;
}

/* Raw waiters: one socket, acquires of one name pipelined, id = index. */
#define RAW_MAX 32
struct raw {
        int sock;
        int n;
        uint64_t ver[RAW_MAX];
        int status[RAW_MAX]; /* -1: no answer yet */
        uint64_t got[RAW_MAX];
};

/* per_name: acquires of "<name>/<vers[i]>" at min_version 0 instead. */
static void raw_wants_x(struct raw *r, const char *name, const uint64_t *vers, int n,
                        int64_t timeout_ms, bool per_name)
{
        char each[300];

        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;

        ck_assert_int_le(n, RAW_MAX);
        memset(r, 0, sizeof(*r));
        r->sock = rp_connect(fx.socket, "raw-waiter");
        r->n = n;
        for (int i = 0; i < n; i++) {
                struct wire_request req;

                r->ver[i] = vers[i];
                r->status[i] = -1;
                snprintf(each, sizeof(each), "%s/%llu", name, (unsigned long long)vers[i]);
                rp_acquire_req(&req, (uint64_t)i + 1, per_name ? each : name);
                req.acquire.timeout_ms = timeout_ms;
                req.acquire.min_version = per_name ? 0 : vers[i];
                rp_frame_append(&buf, &len, &cap, &req);
        }
        ck_assert_int_eq(rp_send_until_stalled(r->sock, buf, len, 2000), 0);
        free(buf);
}

static void raw_wants(struct raw *r, const char *name, const uint64_t *vers, int n,
                      int64_t timeout_ms)
{
        raw_wants_x(r, name, vers, n, timeout_ms, false);
}

/* Reads answers until none comes for ms; returns how many came. */
static int raw_collect(struct raw *r, int ms)
{
        struct wire_reply rep;
        int got = 0;

        for (int i = 0; i < r->n; i++)
                got += r->status[i] != -1;
        if (got == r->n)
                return 0;
        got = 0;
        while (rp_read_answer(r->sock, &rep, ms, NULL) == 1) {
                ck_assert_msg(rep.id >= 1 && rep.id <= (uint64_t)r->n, "answer id %llu",
                              (unsigned long long)rep.id);
                ck_assert_msg(r->status[rep.id - 1] == -1, "two answers to id %llu",
                              (unsigned long long)rep.id);
                r->status[rep.id - 1] = rep.status;
                if (rep.status == 0)
                        r->got[rep.id - 1] = rep.acquire.tensor.version;
                got++;
                {
                        int done = 0;
                        for (int i = 0; i < r->n; i++)
                                done += r->status[i] != -1;
                        if (done == r->n)
                                break;
                }
        }
        return got;
}

static void raw_close(struct raw *r)
{
        if (r->sock >= 0)
                close(r->sock);
        r->sock = -1;
}

static long daemon_rss_kb(pid_t pid)
{
        char path[64], line[256];
        long kb = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        f = fopen(path, "r");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %ld", &kb) == 1)
                        break;
        fclose(f);
        return kb;
}

/* ---- dlxd alone ------------------------------------------------------------------------------ */

/*
 * DLX_EVENT_WANTED: "Sent once per name and version until the name gets such
 * a version or dlx_fetch_failed() is called for it (or a higher one). A
 * version lower than one asked for already is asked for too".
 * dlx_fetch_failed(): "Every acquire waiting for it at a min_version of at
 * most min_version fails ... Acquires waiting for a higher version go on
 * waiting."
 * 100 distinct min_versions of one name (past any 64), each waited for
 * twice: one WANTED each. A mirror v50 serves 1..50 and asks nothing anew;
 * fetch_failed(75) fails 51..75 only and makes exactly those askable again;
 * v100 serves the rest.
 */
#define NV 100
START_TEST(many_versions_each_wanted_once)
{
        dlx_client *b;
        struct raw r[16];
        int nr = 0, cnt[NV + 2], other = 0, twice = 0, twice_lo = 0, twice_hi = 0;
        uint64_t vers[RAW_MAX];

        start_fed(NULL);
        b = fx_connect(&fx, "bridge");
        DLXV(dlx_mount(b, "@a/"));
        /* 1..100 ascending, then again descending */
        for (int pass = 0; pass < 2; pass++)
                for (int base = 0; base < NV; base += 25) {
                        for (int i = 0; i < 25; i++)
                                vers[i] = pass == 0 ? (uint64_t)(base + i + 1)
                                                    : (uint64_t)(NV - base - i);
                        raw_wants(&r[nr++], "@a/w", vers, 25, -1);
                }
        memset(cnt, 0, sizeof(cnt));
        drain(b, "@a/w", cnt, NV + 2, NULL, &other);
        /* recorded, not asserted yet: the phases below are worth running too */
        for (int v = 1; v <= NV; v++)
                if (cnt[v] != 1) {
                        if (!twice_lo)
                                twice_lo = v;
                        twice_hi = v;
                        twice++;
                }
        fprintf(stderr, "many versions: %d of %d versions wanted other than once (v%d..v%d)\n",
                twice, NV, twice_lo, twice_hi);
        ck_assert_int_eq(cnt[0], 0);
        ck_assert_int_eq(other, 0);
        ck_assert_int_le(nr, 16);

        /* v50 serves 1..50 */
        DLXV(mirror(b, "@a/w", 50, NULL));
        for (int i = 0; i < nr; i++)
                raw_collect(&r[i], 200);
        for (int i = 0; i < nr; i++)
                for (int j = 0; j < r[i].n; j++) {
                        if (r[i].ver[j] <= 50)
                                ck_assert_msg(r[i].status[j] == 0 && r[i].got[j] == 50,
                                              "waiter at v%llu after v50: status %d got v%llu",
                                              (unsigned long long)r[i].ver[j], r[i].status[j],
                                              (unsigned long long)r[i].got[j]);
                        else
                                ck_assert_msg(r[i].status[j] == -1,
                                              "waiter at v%llu answered (%d) by v50",
                                              (unsigned long long)r[i].ver[j], r[i].status[j]);
                }
        /* asking again: 51..100 are asked already, 1..50 are there */
        for (int base = 0; base < NV; base += 25) {
                for (int i = 0; i < 25; i++)
                        vers[i] = (uint64_t)(base + i + 1);
                raw_wants(&r[nr++], "@a/w", vers, 25, -1);
        }
        expect_no_event(b, QUIET_MS);

        /* fetch_failed(75): 51..75 fail, 76..100 wait on */
        DLXV(dlx_fetch_failed(b, "@a/w", 75, -EIO, "a failed up to 75"));
        for (int i = 0; i < nr; i++)
                raw_collect(&r[i], 200);
        for (int i = 0; i < nr; i++)
                for (int j = 0; j < r[i].n; j++) {
                        uint64_t v = r[i].ver[j];
                        if (v <= 50)
                                ck_assert_int_eq(r[i].status[j], 0);
                        else if (v <= 75)
                                ck_assert_msg(r[i].status[j] > 0,
                                              "waiter at v%llu not failed by fetch_failed(75): %d",
                                              (unsigned long long)v, r[i].status[j]);
                        else
                                ck_assert_msg(r[i].status[j] == -1,
                                              "waiter at v%llu answered (%d) by fetch_failed(75)",
                                              (unsigned long long)v, r[i].status[j]);
                }
        /* 51..75 are askable again, 76..100 are not */
        for (int base = 50; base < NV; base += 25) {
                for (int i = 0; i < 25; i++)
                        vers[i] = (uint64_t)(base + i + 1);
                raw_wants(&r[nr++], "@a/w", vers, 25, -1);
        }
        memset(cnt, 0, sizeof(cnt));
        drain(b, "@a/w", cnt, NV + 2, NULL, NULL);
        for (int v = 1; v <= NV; v++)
                ck_assert_msg(cnt[v] == (v > 50 && v <= 75),
                              "after fetch_failed(75): v%d wanted %d times", v, cnt[v]);

        /* v100 serves the rest */
        DLXV(mirror(b, "@a/w", 100, NULL));
        for (int i = 0; i < nr; i++)
                raw_collect(&r[i], 200);
        for (int i = 0; i < nr; i++)
                for (int j = 0; j < r[i].n; j++)
                        ck_assert_msg(r[i].status[j] >= 0, "waiter at v%llu never answered",
                                      (unsigned long long)r[i].ver[j]);
        for (int i = 0; i < nr; i++)
                raw_close(&r[i]);
        dlx_close(b);
        dlxd_stop(&fx);
        ck_assert_msg(twice == 0,
                      "100 versions each waited for twice: %d of them (v%d..v%d) were WANTED "
                      "twice (promised once per name and version)",
                      twice, twice_lo, twice_hi);
}
END_TEST

/*
 * dlx_fetch_failed(): "Every acquire waiting for it at a min_version of at
 * most min_version fails with err and message ... Acquires waiting for a
 * higher version go on waiting." DLX_EVENT_WANTED: "Sent once per name and
 * version until the name gets such a version or dlx_fetch_failed() is called
 * for it (or a higher one)." Intermediate publishes, failures that cover some
 * waiters, a waiter at 1 against fetch_failed(0), UINT64_MAX.
 */
START_TEST(fetch_failed_covers_some_publishes_serve_some)
{
        dlx_client *b;
        struct waiter w0, w1, w3, w8, w4, w6, w6b, wmax;

        start_fed(NULL);
        b = fx_connect(&fx, "bridge");
        DLXV(dlx_mount(b, "@a/"));

        /* fetch_failed(0) covers a waiter at 0, not one at 1 */
        waiter_start(&w0, "@a/x", 0, 20000);
        expect_wanted(b, "@a/x", 0);
        waiter_start(&w1, "@a/x", 1, 20000);
        expect_wanted(b, "@a/x", 1);
        DLXV(dlx_fetch_failed(b, "@a/x", 0, -ENOENT, "x: no v0"));
        waiter_join(&w0);
        ck_assert_int_eq(w0.rc, -ENOENT);
        ck_assert_str_eq(w0.err, "x: no v0");
        ck_assert_msg(!waiter_done(&w1, 300),
                      "a waiter at min_version 1 failed by fetch_failed(0): %d (%s)", w1.rc,
                      w1.err);
        /* "or a higher one": after fetch_failed(0), 0 is asked again, 1 is not */
        waiter_start(&w0, "@a/x", 0, 20000);
        expect_wanted(b, "@a/x", 0);
        expect_no_event(b, QUIET_MS);

        /* an intermediate publish */
        waiter_start(&w3, "@a/x", 3, 20000);
        expect_wanted(b, "@a/x", 3);
        waiter_start(&w8, "@a/x", 8, 20000);
        expect_wanted(b, "@a/x", 8);
        DLXV(mirror(b, "@a/x", 5, NULL));
        waiter_join(&w0);
        waiter_join(&w1);
        waiter_join(&w3);
        ck_assert_int_eq(w0.rc, 0);
        ck_assert_int_eq(w1.rc, 0);
        ck_assert_int_eq(w3.rc, 0);
        ck_assert_uint_eq(w3.version, 5);
        ck_assert(!waiter_done(&w8, 200));
        /* 4 is there; 8 is asked; 6 is new */
        waiter_start(&w4, "@a/x", 4, 20000);
        waiter_join(&w4);
        ck_assert_int_eq(w4.rc, 0);
        ck_assert_uint_eq(w4.version, 5);
        waiter_start(&w4, "@a/x", 8, 20000);
        expect_no_event(b, QUIET_MS);
        waiter_start(&w6, "@a/x", 6, 20000);
        expect_wanted(b, "@a/x", 6);
        /* fetch_failed(7): 6 fails, both 8s wait on; 6 askable again */
        DLXV(dlx_fetch_failed(b, "@a/x", 7, -EHOSTUNREACH, "peer a lost"));
        waiter_join(&w6);
        ck_assert_int_eq(w6.rc, -EHOSTUNREACH);
        ck_assert_str_eq(w6.err, "peer a lost");
        ck_assert_msg(!waiter_done(&w8, 200) && !waiter_done(&w4, 10),
                      "a waiter at 8 failed by fetch_failed(7)");
        waiter_start(&w6b, "@a/x", 6, 20000);
        expect_wanted(b, "@a/x", 6);
        expect_no_event(b, QUIET_MS);
        /* a waiter at UINT64_MAX; fetch_failed(UINT64_MAX - 1) fails 6 and 8s, not it */
        waiter_start(&wmax, "@a/x", UINT64_MAX, 20000);
        expect_wanted(b, "@a/x", UINT64_MAX);
        DLXV(dlx_fetch_failed(b, "@a/x", UINT64_MAX - 1, -ETIMEDOUT, "a timed out"));
        waiter_join(&w8);
        waiter_join(&w4);
        waiter_join(&w6b);
        ck_assert_int_eq(w8.rc, -ETIMEDOUT);
        ck_assert_int_eq(w4.rc, -ETIMEDOUT);
        ck_assert_int_eq(w6b.rc, -ETIMEDOUT);
        ck_assert_msg(!waiter_done(&wmax, 200), "the waiter at UINT64_MAX failed: %d", wmax.rc);
        /* 8 askable again */
        waiter_start(&w8, "@a/x", 8, 20000);
        expect_wanted(b, "@a/x", 8);
        DLXV(mirror(b, "@a/x", 9, NULL));
        waiter_join(&w8);
        ck_assert_int_eq(w8.rc, 0);
        ck_assert_uint_eq(w8.version, 9);
        expect_no_event(b, QUIET_MS);
        DLXV(mirror(b, "@a/x", UINT64_MAX, NULL));
        waiter_join(&wmax);
        ck_assert_int_eq(wmax.rc, 0);
        ck_assert_uint_eq(wmax.version, UINT64_MAX);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/*
 * DLX_EVENT_WANTED: "Sent once per name and version while acquires wait for
 * it: until the name gets such a version, dlx_fetch_failed() fails them (it,
 * or a higher version), or they time out or go; an acquire of it that comes
 * after that is announced again." Waiters alternate between v3 and v5, one
 * at a time, each timing out before the next: each is announced. With one
 * of each waiting, the others are not. A failure of 3 makes 3 askable again.
 */
START_TEST(alternating_and_returning_waiters_wanted_once)
{
        dlx_client *b, *c;
        struct waiter keep3, keep5;
        struct dlx_acquire_options o = {.timeout_ms = 150};
        DLManagedTensorVersioned *t;
        int cnt[8] = {0}, other = 0, first3, first5;

        start_fed(NULL);
        b = fx_connect(&fx, "bridge");
        c = fx_connect(&fx, "c");
        DLXV(dlx_mount(b, "@a/"));
        for (int i = 0; i < 10; i++) {
                o.min_version = i % 2 ? 5 : 3;
                ck_assert_int_eq(dlx_acquire(c, "@a/y", &o, &t), -ETIMEDOUT);
        }
        drain(b, "@a/y", cnt, 8, NULL, &other);
        fprintf(stderr, "alternating, all timed out: WANTED v3 %d times, v5 %d times\n", cnt[3],
                cnt[5]);
        first3 = cnt[3];
        first5 = cnt[5];
        ck_assert_int_eq(other, 0);
        /* with one of each still waiting */
        waiter_start(&keep3, "@a/y", 3, 20000);
        waiter_start(&keep5, "@a/y", 5, 20000);
        /* (their own WANTED, if dlxd forgot the ones above) */
        memset(cnt, 0, sizeof(cnt));
        drain(b, "@a/y", cnt, 8, NULL, &other);
        ck_assert_msg(cnt[3] <= 1 && cnt[5] <= 1, "v3 x%d, v5 x%d", cnt[3], cnt[5]);
        for (int i = 0; i < 6; i++) {
                o.min_version = i % 2 ? 5 : 3;
                ck_assert_int_eq(dlx_acquire(c, "@a/y", &o, &t), -ETIMEDOUT);
        }
        memset(cnt, 0, sizeof(cnt));
        drain(b, "@a/y", cnt, 8, NULL, &other);
        ck_assert_msg(cnt[3] == 0 && cnt[5] == 0, "asked again: v3 x%d, v5 x%d", cnt[3], cnt[5]);
        /* the failure of 3 makes 3 askable again, not 5 */
        DLXV(dlx_fetch_failed(b, "@a/y", 3, -ENOENT, "no"));
        waiter_join(&keep3);
        ck_assert_int_eq(keep3.rc, -ENOENT);
        o.min_version = 3;
        ck_assert_int_eq(dlx_acquire(c, "@a/y", &o, &t), -ETIMEDOUT);
        expect_wanted(b, "@a/y", 3);
        o.min_version = 5;
        ck_assert_int_eq(dlx_acquire(c, "@a/y", &o, &t), -ETIMEDOUT);
        expect_no_event(b, QUIET_MS);
        DLXV(mirror(b, "@a/y", 5, NULL));
        waiter_join(&keep5);
        ck_assert_int_eq(keep5.rc, 0);
        dlx_close(c);
        dlx_close(b);
        dlxd_stop(&fx);
        ck_assert_msg(first3 == 5 && first5 == 5,
                      "10 waits alternating v3/v5, each alone and timing out: WANTED v3 x%d, "
                      "v5 x%d (each was waited for by nobody else: 5 each)",
                      first3, first5);
}
END_TEST

/*
 * DLX_EVENT_WANTED: "Sent once per name and version until the name gets such
 * a version". dlx_publish_options.origin_version: "equal to it while the name
 * has no current version (the same origin version mirrored again)". Once the
 * name got v5 the once is over: after the bridge unpublishes, a new want of 5
 * (and of 3) must be announced, or the waiter waits for nothing.
 */
START_TEST(wanted_again_after_the_version_came_and_went)
{
        dlx_client *b;
        struct waiter w, w3;

        start_fed(NULL);
        b = fx_connect(&fx, "bridge");
        DLXV(dlx_mount(b, "@a/"));
        waiter_start(&w, "@a/z", 5, 20000);
        expect_wanted(b, "@a/z", 5);
        DLXV(mirror(b, "@a/z", 5, NULL));
        waiter_join(&w);
        ck_assert_int_eq(w.rc, 0);
        DLXV(dlx_unpublish(b, "@a/z"));
        waiter_start(&w, "@a/z", 5, 20000);
        expect_wanted(b, "@a/z", 5);
        waiter_start(&w3, "@a/z", 3, 20000);
        expect_wanted(b, "@a/z", 3);
        DLXV(mirror(b, "@a/z", 5, NULL));
        waiter_join(&w);
        waiter_join(&w3);
        ck_assert_int_eq(w.rc, 0);
        ck_assert_uint_eq(w.version, 5);
        ck_assert_int_eq(w3.rc, 0);
        ck_assert_uint_eq(w3.version, 5);
        /* the same at UINT64_MAX */
        waiter_start(&w, "@a/m", UINT64_MAX, 20000);
        expect_wanted(b, "@a/m", UINT64_MAX);
        DLXV(mirror(b, "@a/m", UINT64_MAX, NULL));
        waiter_join(&w);
        ck_assert_int_eq(w.rc, 0);
        DLXV(dlx_unpublish(b, "@a/m"));
        waiter_start(&w, "@a/m", UINT64_MAX, 20000);
        expect_wanted(b, "@a/m", UINT64_MAX);
        DLXV(mirror(b, "@a/m", UINT64_MAX, NULL));
        waiter_join(&w);
        ck_assert_int_eq(w.rc, 0);
        ck_assert_uint_eq(w.version, UINT64_MAX);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/*
 * dlx_mount(): "past dlxd --max-queued ... WANTED events are dropped, and a
 * DLX_EVENT_LOST comes when there is room again. Mounting a prefix this
 * client has mounted already then succeeds and announces every waiting
 * acquire whose WANTED was dropped." DLX_EVENT_WANTED: "Sent once per name
 * and version". 640 distinct versions of one name wait; the bridge reads
 * nothing until they all wait (small --max-queued), then reads and mounts
 * again until quiet: every version announced exactly once.
 */
#define NL 1920
#define PER_SOCK 32
static void lost_and_remount(bool per_name)
{
        const char *more[] = {"--max-queued", "4096", NULL};
        dlx_client *b;
        static struct raw r[NL / PER_SOCK];
        static int cnt[NL + 1];
        int lost = 0, rounds, missing, dup;
        uint64_t vers[RAW_MAX];
        char name[240];

        /* long names: the events outgrow the socket's buffer and the daemon's queue */
        memset(name, 'l', sizeof(name));
        memcpy(name, "@a/", 3);
        name[216] = '\0';
        start_fed(more);
        b = fx_connect(&fx, "bridge");
        DLXV(dlx_mount(b, "@a/"));
        for (int k = 0; k < NL / PER_SOCK; k++) {
                for (int i = 0; i < PER_SOCK; i++)
                        vers[i] = (uint64_t)(k * PER_SOCK + i + 1);
                raw_wants_x(&r[k], name, vers, PER_SOCK, -1, per_name);
        }
        fx_sleep_ms(300 * fx_slowdown());
        memset(cnt, 0, sizeof(cnt));
        if (per_name)
                drain_names(b, name, cnt, NL + 1, &lost);
        else
                drain(b, name, cnt, NL + 1, &lost, NULL);
        /* a re-mount may announce only what fits: go on while it makes progress */
        quiet_ms = 60;
        for (rounds = 0; rounds < 400; rounds++) {
                int l0 = lost, n0 = 0, n1 = 0, w;

                missing = 0;
                for (int v = 1; v <= NL; v++)
                        missing += cnt[v] == 0;
                if (!missing)
                        break;
                for (int v = 1; v <= NL; v++)
                        n0 += cnt[v] > 0;
                DLXV(dlx_mount(b, "@a/"));
                w = per_name ? drain_names(b, name, cnt, NL + 1, &lost)
                             : drain(b, name, cnt, NL + 1, &lost, NULL);
                for (int v = 1; v <= NL; v++)
                        n1 += cnt[v] > 0;
                if (rounds < 3 || n1 == n0)
                        fprintf(stderr,
                                "lost/remount (%s): re-mount %d: %d WANTED (%d new), %d LOST\n",
                                per_name ? "names" : "versions", rounds, w, n1 - n0, lost - l0);
                if (n1 == n0 && rounds >= 3)
                        break; /* no progress in a round */
        }
        quiet_ms = QUIET_MS;
        missing = dup = 0;
        for (int v = 1; v <= NL; v++) {
                missing += cnt[v] == 0;
                dup += cnt[v] > 1;
        }
        fprintf(stderr,
                "lost/remount (%s): %d LOST, %d re-mounts, %d of %d never announced, %d more "
                "than once\n",
                per_name ? "names" : "versions", lost, rounds, missing, NL, dup);
        ck_assert_msg(lost > 0, "no LOST with --max-queued 4096 and %d WANTED unread", NL);
        ck_assert_msg(missing == 0,
                      "%d of %d waiting %s never announced after %d re-mounts (%d announced "
                      "more than once)",
                      missing, NL, per_name ? "names" : "versions of one name", rounds, dup);
        ck_assert_msg(dup == 0, "%d announced more than once", dup);
        /* and all are served */
        if (per_name) {
                for (int v = 1; v <= NL; v++) {
                        char each[300];
                        snprintf(each, sizeof(each), "%s/%d", name, v);
                        DLXV(mirror(b, each, 1, NULL));
                }
        } else {
                DLXV(mirror(b, name, NL, NULL));
        }
        for (int k = 0; k < NL / PER_SOCK; k++) {
                raw_collect(&r[k], 1000);
                for (int i = 0; i < r[k].n; i++)
                        ck_assert_msg(r[k].status[i] == 0, "waiter %llu: %d",
                                      (unsigned long long)r[k].ver[i], r[k].status[i]);
                raw_close(&r[k]);
        }
        dlx_close(b);
        dlxd_stop(&fx);
}

START_TEST(lost_and_remount_announce_each_version_once)
{
        lost_and_remount(false);
}
END_TEST

/* The same promise, 1920 names at version 0 instead of versions of one name. */
START_TEST(lost_and_remount_announce_each_name_once)
{
        lost_and_remount(true);
}
END_TEST

/*
 * DLX_EVENT_WANTED: "Sent once per name and version until the name gets such
 * a version or dlx_fetch_failed() is called for it". The smallest case past
 * 64: versions 1..65 of one name wait; a second acquire of v1 waits too while
 * the first still does. No new WANTED may come.
 */
START_TEST(sixty_five_versions_lowest_not_asked_twice)
{
        dlx_client *b;
        struct raw r[4], again;
        int cnt[70] = {0}, other = 0;
        uint64_t vers[RAW_MAX], one = 1;

        start_fed(NULL);
        b = fx_connect(&fx, "bridge");
        DLXV(dlx_mount(b, "@a/"));
        for (int k = 0; k < 3; k++) {
                for (int i = 0; i < 20; i++)
                        vers[i] = (uint64_t)(k * 20 + i + 1);
                raw_wants(&r[k], "@a/s", vers, 20, -1);
        }
        for (int i = 0; i < 5; i++)
                vers[i] = (uint64_t)(61 + i);
        raw_wants(&r[3], "@a/s", vers, 5, -1);
        drain(b, "@a/s", cnt, 70, NULL, &other);
        for (int v = 1; v <= 65; v++)
                ck_assert_int_eq(cnt[v], 1);
        raw_wants(&again, "@a/s", &one, 1, -1);
        {
                struct dlx_event ev;
                int e = dlx_next_event(b, &ev, QUIET_MS);
                ck_assert_msg(e != 0,
                              "65 versions waiting: a second waiter at v1 made another "
                              "WANTED '%s' v%llu",
                              ev.name, (unsigned long long)ev.version);
        }
        DLXV(mirror(b, "@a/s", 65, NULL));
        raw_collect(&again, 1000);
        ck_assert_int_eq(again.status[0], 0);
        raw_close(&again);
        for (int k = 0; k < 4; k++) {
                raw_collect(&r[k], 1000);
                raw_close(&r[k]);
        }
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/*
 * README: "A restarted bridge mounts its prefixes again and hears of every
 * acquire still waiting." dlx_mount(): "as do the acquires that were already
 * waiting when the mount came". 100 distinct versions (and UINT64_MAX) wait;
 * the first bridge reads them and dies without answering; the next hears each
 * once. A bridge that never answers leaves waiters to their own timeouts.
 */
START_TEST(restarted_bridge_hears_every_version_once)
{
        dlx_client *b;
        struct raw r[5];
        struct waiter wmax, wt;
        int cnt[NV + 2], other = 0;
        uint64_t vers[RAW_MAX];

        start_fed(NULL);
        b = fx_connect(&fx, "bridge-1");
        DLXV(dlx_mount(b, "@a/"));
        for (int k = 0; k < 4; k++) {
                for (int i = 0; i < 25; i++)
                        vers[i] = (uint64_t)(k * 25 + i + 1);
                raw_wants(&r[k], "@a/r", vers, 25, -1);
        }
        waiter_start(&wmax, "@a/r", UINT64_MAX, 30000);
        memset(cnt, 0, sizeof(cnt));
        drain(b, "@a/r", cnt, NV + 2, NULL, &other);
        ck_assert_int_eq(other, 1); /* UINT64_MAX */
        dlx_close(b);
        /* a waiter with a timeout and no bridge: times out on time */
        waiter_start(&wt, "@a/r", NV + 1, 400);
        b = fx_connect(&fx, "bridge-2");
        DLXV(dlx_mount(b, "@a/"));
        memset(cnt, 0, sizeof(cnt));
        other = 0;
        drain(b, "@a/r", cnt, NV + 2, NULL, &other);
        for (int v = 1; v <= NV + 1; v++)
                ck_assert_msg(cnt[v] == 1, "restarted bridge: v%d announced %d times", v, cnt[v]);
        ck_assert_msg(other == 1, "restarted bridge: %d other announcements (UINT64_MAX: 1)",
                      other);
        waiter_join(&wt);
        ck_assert_int_eq(wt.rc, -ETIMEDOUT);
        ck_assert_msg(wt.took_ms < 400 + 1500 * fx_slowdown(), "timeout 400 ms took %lld ms",
                      (long long)wt.took_ms);
        /* nothing was dropped: mounting again announces nothing */
        DLXV(dlx_mount(b, "@a/"));
        memset(cnt, 0, sizeof(cnt));
        other = 0;
        {
                int again = drain(b, "@a/r", cnt, NV + 2, NULL, &other), lo = 0, hi = 0;
                for (int v = 1; v <= NV + 1; v++)
                        if (cnt[v]) {
                                hi = v;
                                if (!lo)
                                        lo = v;
                        }
                fprintf(stderr, "mounted again, nothing dropped: %d WANTED (v%d..v%d)\n",
                        again + other, lo, hi);
                ck_assert_msg(again + other == 0,
                              "mounting again with nothing dropped announced %d wants again "
                              "(v%d..v%d)",
                              again + other, lo, hi);
        }
        DLXV(mirror(b, "@a/r", UINT64_MAX, NULL));
        waiter_join(&wmax);
        ck_assert_int_eq(wmax.rc, 0);
        for (int k = 0; k < 4; k++) {
                raw_collect(&r[k], 200);
                for (int i = 0; i < r[k].n; i++)
                        ck_assert_int_eq(r[k].status[i], 0);
                raw_close(&r[k]);
        }
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/*
 * A hostile client (not the bridge) makes many distinct wants that time out
 * at once, the bridge reads them and never answers: what dlxd keeps for them
 * must not grow without bound (README: "A peer cannot hold the exporter
 * hostage"; the daemon's limits; the WANTED promise says nothing of keeping
 * wants nobody waits for). 60,000 distinct versions and names after a warm-up
 * of 20,000: daemon RSS may not grow by 4 MiB.
 */
START_TEST(distinct_wants_do_not_grow_the_daemon)
{
        dlx_client *b;
        struct raw r;
        uint64_t vers[RAW_MAX];
        long rss0 = 0, rss1;
        uint64_t next = 1;
        char name[64];
        int cnt[2], other = 0;

        if (getenv("DLX_TEST_VALGRIND") || TOOLKIT_SANITIZED)
                return;
        start_fed(NULL);
        b = fx_connect(&fx, "bridge");
        DLXV(dlx_mount(b, "@a/"));
        for (int round = 0; round < 80; round++) {
                for (int batch = 0; batch < 1000 / RAW_MAX; batch++) {
                        for (int i = 0; i < RAW_MAX; i++)
                                vers[i] = next++;
                        /* one name, distinct versions; then distinct names */
                        snprintf(name, sizeof(name), "@a/hostile%d", round % 2 ? round : 0);
                        if (round % 2) {
                                snprintf(name, sizeof(name), "@a/h/%d/%d", round, batch);
                                for (int i = 0; i < RAW_MAX; i++)
                                        vers[i] = (uint64_t)i;
                        }
                        raw_wants(&r, name, vers, RAW_MAX, 1);
                        while (raw_collect(&r, 200) > 0)
                                ;
                        raw_close(&r);
                        {
                                struct dlx_event ev;
                                while (dlx_next_event(b, &ev, 0) == 0)
                                        other++;
                        }
                }
                if (round == 19)
                        rss0 = daemon_rss_kb(fx.pid);
        }
        fx_sleep_ms(200);
        drain(b, "-", cnt, 2, NULL, &other);
        rss1 = daemon_rss_kb(fx.pid);
        fprintf(stderr, "distinct wants: %d events to the bridge; dlxd rss %ld -> %ld kB\n", other,
                rss0, rss1);
        ck_assert_msg(rss1 - rss0 < 4096,
                      "dlxd grew %ld kB over 60,000 distinct wants nobody waits for any more",
                      rss1 - rss0);
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/*
 * DLX_EVENT_WANTED: "Sent once per name and version"; dlx_mount(): "queues a
 * DLX_EVENT_WANTED ... as do the acquires that were already waiting when the
 * mount came"; README: "A restarted bridge mounts its prefixes again and
 * hears of every acquire still waiting." Three acquires of v4 and two of any
 * version wait with no bridge; then one mounts: one WANTED per version.
 */
START_TEST(same_version_waiters_before_the_mount_announced_once)
{
        dlx_client *b;
        struct waiter w[5];
        int cnt[8] = {0}, other = 0;

        start_fed(NULL);
        for (int i = 0; i < 5; i++)
                waiter_start(&w[i], "@a/p", i < 3 ? 4 : 0, 20000);
        fx_sleep_ms(300);
        b = fx_connect(&fx, "bridge");
        DLXV(dlx_mount(b, "@a/"));
        drain(b, "@a/p", cnt, 8, NULL, &other);
        fprintf(stderr, "before the mount: v4 announced %d times, v0 %d times\n", cnt[4], cnt[0]);
        ck_assert_msg(cnt[4] == 1 && cnt[0] == 1 && other == 0,
                      "3 waiters at v4 and 2 at v0 before the mount: WANTED v4 x%d, v0 x%d", cnt[4],
                      cnt[0]);
        /* a restarted bridge: the same */
        dlx_close(b);
        b = fx_connect(&fx, "bridge-2");
        DLXV(dlx_mount(b, "@a/"));
        memset(cnt, 0, sizeof(cnt));
        drain(b, "@a/p", cnt, 8, NULL, &other);
        ck_assert_msg(cnt[4] == 1 && cnt[0] == 1 && other == 0,
                      "restarted bridge: WANTED v4 x%d, v0 x%d", cnt[4], cnt[0]);
        DLXV(mirror(b, "@a/p", 4, NULL));
        for (int i = 0; i < 5; i++) {
                waiter_join(&w[i]);
                ck_assert_int_eq(w[i].rc, 0);
        }
        dlx_close(b);
        dlxd_stop(&fx);
}
END_TEST

/* ---- two hosts ------------------------------------------------------------------------------ */

/* A exports model/, waiting up to wait_ms for a version; B pulls. */
static void pair_waiting(const char *wait_ms)
{
        const char *a_args[] = {"--export", "model/", "--wait-ms", wait_ms, NULL};

        pair_up(a_args, NULL);
}

static void publish_n(dlx_client *pa, const char *name, int64_t n, float base)
{
        publish_ok(pa, name, fx_vec_f32(pa, n, base), NULL, NULL);
}

/* Pulls of name at version v in B's log ("@a/<name> v<N>:"), once the log has settled. */
static int pulls(const char *name, uint64_t v)
{
        char needle[128];

        snprintf(needle, sizeof(needle), "@a/%s v%llu:", name, (unsigned long long)v);
        return log_count(&B, needle);
}

static void dump_log(struct host *h)
{
        char line[512];
        FILE *in = fopen(h->log, "re");

        while (in && fgets(line, sizeof(line), in))
                fprintf(stderr, "  | %s", line);
        if (in)
                fclose(in);
}

/*
 * README: "Every consumer on B then shares the mirror zero-copy: one network
 * copy per host per version. Wants of one name are coalesced: acquires of the
 * version a pull brings, or of a version already asked for, wait for that
 * pull." dlx.h WANTED: "A version lower than one asked for already is asked
 * for too". A has model/w at v5 (16 MiB). On B, wants of 0, 1, 2, 3, 4 and 5
 * come at once: each is a distinct version, all are met by A's v5: B must copy
 * v5 once.
 */
#define NW 6
START_TEST(distinct_lower_wants_met_by_one_version_are_one_copy)
{
        dlx_client *pa;
        struct waiter w[NW];

        hosts_up();
        pair_waiting("5000");
        pa = fx_connect(&A.d, "producer-a");
        for (int v = 1; v <= 5; v++)
                publish_n(pa, "model/w", 4 << 20, (float)v);
        for (int i = 0; i < NW; i++)
                waiter_start_on(&w[i], &B.d, "@a/model/w", (uint64_t)i, 20000);
        for (int i = 0; i < NW; i++) {
                waiter_join(&w[i]);
                ck_assert_msg(w[i].rc == 0, "want of v%d: %s (%s)", i, dlx_strerror(w[i].rc),
                              w[i].err);
                ck_assert_uint_eq(w[i].version, 5);
        }
        fx_sleep_ms(300);
        fprintf(stderr, "distinct lower wants: B pulled v5 %d times\n", pulls("model/w", 5));
        if (pulls("model/w", 5) != 1)
                dump_log(&B);
        ck_assert_msg(pulls("model/w", 5) == 1,
                      "6 wants of v0..v5 met by A's v5: B copied v5 %d times (one network copy "
                      "per host per version)",
                      pulls("model/w", 5));
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "one network copy per host per version", "a version A does not have
 * yet is waited for on A (--wait-ms)", "A want of another version asks A on
 * its own". A has v1; B wants v2, v3, v4 (each waits on A); A then publishes
 * v2, v3, v4 back to back, then v5..v7 each 300 ms apart while wants of v5,
 * v6, v7 wait. Every want gets at least its version; no version is copied
 * twice.
 */
START_TEST(versions_published_during_the_waits_copied_once_each)
{
        dlx_client *pa;
        struct waiter w[7];
        int worst = 0;

        hosts_up();
        pair_waiting("8000");
        pa = fx_connect(&A.d, "producer-a");
        publish_n(pa, "model/v", 1 << 20, 1);
        for (int i = 0; i < 3; i++)
                waiter_start_on(&w[i], &B.d, "@a/model/v", (uint64_t)i + 2, 20000);
        fx_sleep_ms(500);
        for (int v = 2; v <= 4; v++)
                publish_n(pa, "model/v", 1 << 20, (float)v);
        for (int i = 3; i < 6; i++)
                waiter_start_on(&w[i], &B.d, "@a/model/v", (uint64_t)i + 2, 20000);
        waiter_start_on(&w[6], &B.d, "@a/model/v", 0, 20000);
        fx_sleep_ms(300);
        for (int v = 5; v <= 7; v++) {
                publish_n(pa, "model/v", 1 << 20, (float)v);
                fx_sleep_ms(300);
        }
        for (int i = 0; i < 7; i++) {
                waiter_join(&w[i]);
                ck_assert_msg(w[i].rc == 0, "want of v%llu: %s (%s)",
                              (unsigned long long)w[i].min_version, dlx_strerror(w[i].rc),
                              w[i].err);
                ck_assert_uint_ge(w[i].version, w[i].min_version);
        }
        fx_sleep_ms(300);
        for (int v = 1; v <= 7; v++) {
                fprintf(stderr, "published during waits: v%d copied %d times\n", v,
                        pulls("model/v", (uint64_t)v));
                if (pulls("model/v", (uint64_t)v) > worst)
                        worst = pulls("model/v", (uint64_t)v);
        }
        if (worst > 1)
                dump_log(&B);
        ck_assert_msg(worst <= 1, "a version was copied %d times (one network copy per version)",
                      worst);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "a failure to get v2 fails only the acquires that asked for more
 * than what came"; "Whatever the bridge cannot fetch fails the waiting
 * acquires with its errno and a message naming the peer". A has v1 and
 * --wait-ms 800. On B, wants of 0, 1, 2 and 3 at once: 0 and 1 get v1, 2 and
 * 3 fail naming peer a. Then A publishes v2 and a new want of 2 gets it.
 */
START_TEST(a_failure_of_higher_wants_fails_only_them)
{
        dlx_client *pa;
        struct waiter w[4];

        hosts_up();
        pair_waiting("800");
        pa = fx_connect(&A.d, "producer-a");
        publish_n(pa, "model/f", 1 << 20, 1);
        for (int i = 3; i >= 0; i--)
                waiter_start_on(&w[i], &B.d, "@a/model/f", (uint64_t)i, 20000);
        for (int i = 0; i < 4; i++)
                waiter_join(&w[i]);
        for (int i = 0; i < 4; i++)
                fprintf(stderr, "want of v%d: %s v%llu (%s) after %lld ms\n", i,
                        dlx_strerror(w[i].rc), (unsigned long long)w[i].version, w[i].err,
                        (long long)w[i].took_ms);
        for (int i = 0; i < 2; i++) {
                ck_assert_msg(w[i].rc == 0, "want of v%d (A has v1) failed: %s (%s)", i,
                              dlx_strerror(w[i].rc), w[i].err);
                ck_assert_uint_eq(w[i].version, 1);
        }
        for (int i = 2; i < 4; i++) {
                ck_assert_msg(w[i].rc != 0, "want of v%d got v%llu", i,
                              (unsigned long long)w[i].version);
                ck_assert_msg(strstr(w[i].err, "a") != NULL, "message does not name the peer: %s",
                              w[i].err);
                ck_assert_msg(w[i].took_ms < 8000, "want of v%d failed after %lld ms", i,
                              (long long)w[i].took_ms);
        }
        publish_n(pa, "model/f", 1 << 20, 2);
        waiter_start_on(&w[0], &B.d, "@a/model/f", 2, 20000);
        waiter_join(&w[0]);
        ck_assert_msg(w[0].rc == 0, "a new want of v2 after the failure: %s (%s)",
                      dlx_strerror(w[0].rc), w[0].err);
        ck_assert_uint_eq(w[0].version, 2);
        fx_sleep_ms(200);
        ck_assert_int_le(pulls("model/f", 1), 1);
        ck_assert_int_le(pulls("model/f", 2), 1);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "-EHOSTUNREACH "peer a lost during the pull of ..."", "A peer's
 * bridge that is down fails new wants at once (-EHOSTUNREACH)". A has a big
 * v1; on B a want of any version starts its pull, a want of 1 joins it
 * ("acquires of the version a pull brings ... wait for that pull") and a
 * want of 3 waits on A. A's bridge is killed mid-pull: all three fail
 * promptly with -EHOSTUNREACH naming a, and so does a new want.
 */
START_TEST(peer_killed_with_lower_and_higher_wants_pending)
{
        dlx_client *pa, *look;
        struct waiter w0, w1, w3, wn;
        int64_t t0;

        hosts_up();
        pair_waiting("30000");
        pa = fx_connect(&A.d, "producer-a");
        look = fx_connect(&A.d, "looks-at-a");
        publish_big(pa, "model/big");
        waiter_start_on(&w0, &B.d, "@a/model/big", 0, 60000);
        wait_pull_started(look);
        waiter_start_on(&w1, &B.d, "@a/model/big", 1, 60000);
        waiter_start_on(&w3, &B.d, "@a/model/big", 3, 60000);
        fx_sleep_ms(150);
        ck_assert_msg(!waiter_done(&w0, 0), "the 1 GiB pull was over before the kill");
        t0 = fx_now_ms();
        fed_kill(&A);
        waiter_join(&w0);
        waiter_join(&w1);
        waiter_join(&w3);
        {
                struct waiter *ws[] = {&w0, &w1, &w3};
                for (int i = 0; i < 3; i++) {
                        fprintf(stderr, "want of v%llu: %s (%s) %lld ms after the kill\n",
                                (unsigned long long)ws[i]->min_version, dlx_strerror(ws[i]->rc),
                                ws[i]->err, (long long)(fx_now_ms() - t0));
                        ck_assert_msg(ws[i]->rc == -EHOSTUNREACH && strstr(ws[i]->err, "a"),
                                      "want of v%llu: %s (%s), not -EHOSTUNREACH",
                                      (unsigned long long)ws[i]->min_version,
                                      dlx_strerror(ws[i]->rc), ws[i]->err);
                }
        }
        ck_assert_msg(fx_now_ms() - t0 < 10000, "the waiters heard of the kill after %lld ms",
                      (long long)(fx_now_ms() - t0));
        waiter_start_on(&wn, &B.d, "@a/model/big", 0, 20000);
        waiter_join(&wn);
        ck_assert_msg(wn.rc == -EHOSTUNREACH && wn.took_ms < 3000,
                      "a new want while a is down: %s (%s) after %lld ms", dlx_strerror(wn.rc),
                      wn.err, (long long)wn.took_ms);
        dlx_close(look);
        dlx_close(pa);
        hosts_down(); /* A's bridge is gone: only B's is stopped */
}
END_TEST

/*
 * README: "Wants of one name are coalesced: acquires of the version a pull
 * brings, or of a version already asked for, wait for that pull. A want of
 * another version asks A on its own"; "one network copy per host per
 * version". A has a 1 GiB v1; a want of any version starts its pull; during
 * it wants of 0, 1 (what the pull brings) and 2 (A publishes v2 meanwhile)
 * come. v1 crosses once, v2 once; everyone gets at least what they asked.
 */
START_TEST(wants_arriving_during_a_pull_copy_each_version_once)
{
        dlx_client *pa, *look;
        struct waiter w[4];
        static const uint64_t mins[4] = {0, 0, 1, 2};

        hosts_up();
        pair_waiting("20000");
        pa = fx_connect(&A.d, "producer-a");
        look = fx_connect(&A.d, "looks-at-a");
        publish_big(pa, "model/p");
        waiter_start_on(&w[0], &B.d, "@a/model/p", 0, 60000);
        wait_pull_started(look);
        for (int i = 1; i < 4; i++)
                waiter_start_on(&w[i], &B.d, "@a/model/p", mins[i], 60000);
        fx_sleep_ms(100);
        publish_n(pa, "model/p", 16, 2);
        for (int i = 0; i < 4; i++) {
                waiter_join(&w[i]);
                fprintf(stderr, "during a pull: want of v%llu: %s v%llu after %lld ms\n",
                        (unsigned long long)mins[i], dlx_strerror(w[i].rc),
                        (unsigned long long)w[i].version, (long long)w[i].took_ms);
                ck_assert_msg(w[i].rc == 0, "want of v%llu: %s (%s)", (unsigned long long)mins[i],
                              dlx_strerror(w[i].rc), w[i].err);
                ck_assert_uint_ge(w[i].version, mins[i]);
        }
        fx_sleep_ms(300);
        fprintf(stderr, "during a pull: v1 copied %d times, v2 %d times\n", pulls("model/p", 1),
                pulls("model/p", 2));
        if (getenv("WANTED_DUMP"))
                dump_log(&B);
        ck_assert_msg(pulls("model/p", 1) <= 1 && pulls("model/p", 2) <= 1,
                      "v1 copied %d times, v2 %d times", pulls("model/p", 1), pulls("model/p", 2));
        dlx_close(look);
        dlx_close(pa);
        hosts_down();
}
END_TEST

/*
 * README: "one network copy per host per version"; "a version A does not
 * have yet is waited for on A (--wait-ms)"; WANTED "Sent once per name and
 * version until the name gets such a version or dlx_fetch_failed()". A has
 * v1 (--wait-ms 8000). A consumer on B wants v2 with a 250 ms timeout, six
 * times in a row (each times out while A waits), then once more for 10 s; A
 * publishes v2 after about 2 s. v2 must cross once.
 */
START_TEST(a_consumer_retrying_a_want_is_one_copy)
{
        dlx_client *pa, *pb;
        DLManagedTensorVersioned *t;
        int err, timeouts = 0;
        pid_t kid;

        hosts_up();
        pair_waiting("8000");
        pa = fx_connect(&A.d, "producer-a");
        publish_n(pa, "model/r", 1 << 20, 1);
        kid = fork();
        ck_assert_int_ge(kid, 0);
        if (kid == 0) {
                dlx_client *c = fx_connect(&A.d, "late-producer");
                fx_sleep_ms(2000);
                publish_n(c, "model/r", 1 << 20, 2);
                dlx_close(c);
                fx_child_exit(0);
        }
        pb = fx_connect(&B.d, "consumer-b");
        for (int i = 0; i < 6; i++) {
                t = acquire_at(pb, "@a/model/r", 2, 250, &err);
                timeouts += err == -ETIMEDOUT;
                if (t)
                        t->deleter(t);
        }
        t = acquire_at(pb, "@a/model/r", 2, 10000, &err);
        ck_assert_int_eq(fx_wait(kid), 0);
        ck_assert_msg(t != NULL, "the last want of v2: %s (%s)", dlx_strerror(err),
                      dlx_last_error());
        ck_assert(fx_vec_is(t, 1 << 20, 2));
        t->deleter(t);
        fx_sleep_ms(300);
        fprintf(stderr, "retrying consumer: %d timeouts, v2 copied %d times\n", timeouts,
                pulls("model/r", 2));
        ck_assert_msg(pulls("model/r", 2) == 1,
                      "a consumer that retried its want of v2 %d times: B copied v2 %d times",
                      timeouts, pulls("model/r", 2));
        dlx_close(pb);
        dlx_close(pa);
        hosts_down();
}
END_TEST

#define ADD(tc, fn)                                                                                \
        do {                                                                                       \
                const char *only = getenv("WANTED_ATTACKS_ONLY");                                  \
                if (!only || !*only || strcmp(only, #fn) == 0)                                     \
                        tcase_add_test(tc, fn);                                                    \
        } while (0)

Suite *DLX_SUITE(void)
{
        Suite *s = suite_create("wanted-attacks");
        TCase *tc = tcase_create("dlxd");
        TCase *two = tcase_create("two-hosts");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(tc, 60);
        ADD(tc, many_versions_each_wanted_once);
        ADD(tc, fetch_failed_covers_some_publishes_serve_some);
        ADD(tc, alternating_and_returning_waiters_wanted_once);
        ADD(tc, wanted_again_after_the_version_came_and_went);
        ADD(tc, sixty_five_versions_lowest_not_asked_twice);
        ADD(tc, lost_and_remount_announce_each_version_once);
        ADD(tc, lost_and_remount_announce_each_name_once);
        ADD(tc, restarted_bridge_hears_every_version_once);
        ADD(tc, same_version_waiters_before_the_mount_announced_once);
        ADD(tc, distinct_wants_do_not_grow_the_daemon);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(two, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(two, 90);
        ADD(two, distinct_lower_wants_met_by_one_version_are_one_copy);
        ADD(two, versions_published_during_the_waits_copied_once_each);
        ADD(two, a_failure_of_higher_wants_fails_only_them);
        ADD(two, wants_arriving_during_a_pull_copy_each_version_once);
        ADD(two, a_consumer_retrying_a_want_is_one_copy);
        ADD(two, peer_killed_with_lower_and_higher_wants_pending);
        suite_add_tcase(s, two);
        return s;
}
