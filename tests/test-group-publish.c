/* SPDX-License-Identifier: MIT */
/*
 * Group publishing, read by a second reader: dlx_publish_group() and the
 * daemon's check of a group segment attacked where they changed last (the
 * client's kept working memory and its name sort, dlxd's mapped table
 * check, dlxd's deferred close of big segments). Each test names the
 * promise of dlx.h or README.md it checks; test-group.c and
 * test-group-attacks.c are not repeated.
 *
 *  P1 dlx.h conventions: "A dlx_client is thread-safe: any number of threads
 *     may call into the same client at once"; groups: "a consumer sees every
 *     member of version N or none of it"; "Takes ownership of every
 *     member's tensor on every path: each deleter has run when this
 *     returns, once per tensor (one given under two names, tied, is deleted
 *     once), and members[i].tensor is NULL."
 *  P2 README fork(): "every call on such a client fails with -ESTALE ... The
 *     child connects clients of its own ... A fork while other threads are
 *     inside libdlx is safe: the child finds none of its locks held."
 *  P3 proto/group.h: members sorted by name (bytewise), distinct; "two
 *     members of one name" is -EINVAL.
 *  P4 README groups: dlxd checks the table; a hostile table is refused,
 *     dlxd never crashes, allocates nothing for a sparse memfd's holes, and
 *     keeps serving.
 *  P5 dlxd closes a destroyed segment's descriptor (no leak, no double
 *     close), whatever destroys it and whenever it is stopped.
 *  P6 dlx_close(): "calls still running in other threads fail with
 *     -ECONNRESET"; "-ECONNRESET / -EPIPE the daemon went away"; "-ENOSPC
 *     the daemon's shared-bytes limit is reached".
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "group.h"
#include "rawpeer.h"
#include "tensors.h"

#define DLXV(call)                                                                                 \
        do {                                                                                       \
                int dlxv_err__ = (call);                                                           \
                ck_assert_msg(dlxv_err__ == 0, "%s: %s (%s)", #call, dlx_strerror(dlxv_err__),     \
                              dlx_last_error());                                                   \
        } while (0)
#define REPLY_MS 10000

/* ---- tensors whose deleters count, atomically (threads and shared pages) ------------------- */

/*
 * No ck_assert*() in what threads and forked children call: a passing one
 * takes Check's lock, which a fork could find held by another thread.
 */
static void *xcalloc(size_t n, size_t size)
{
        void *p = calloc(n ? n : 1, size ? size : 1);

        if (!p)
                abort();
        return p;
}

/* A 1-D tensor over bytes the view owns (malloc'd), or over borrowed bytes. */
struct cview {
        DLManagedTensorVersioned mt;
        int64_t shape[1];
        atomic_int *count; /* deleter runs; may be NULL */
        void *own;         /* freed by the deleter */
};

static void cview_deleter(DLManagedTensorVersioned *t)
{
        struct cview *v = t->manager_ctx;

        if (v->count)
                atomic_fetch_add(v->count, 1);
        free(v->own);
        free(v);
}

/* A view of n elements of dt over data (borrowed when own is NULL, else own is freed). */
static DLManagedTensorVersioned *cview_new(void *data, void *own, DLDataType dt, int64_t n,
                                           atomic_int *count)
{
        struct cview *v = xcalloc(1, sizeof(*v));

        v->shape[0] = n;
        v->count = count;
        v->own = own;
        v->mt.version.major = DLPACK_MAJOR_VERSION;
        v->mt.version.minor = DLPACK_MINOR_VERSION;
        v->mt.manager_ctx = v;
        v->mt.deleter = cview_deleter;
        v->mt.dl_tensor = (DLTensor){.data = data,
                                     .device = {kDLCPU, 0},
                                     .ndim = 1,
                                     .dtype = dt,
                                     .shape = v->shape,
                                     .strides = NULL,
                                     .byte_offset = 0};
        return &v->mt;
}

/* n uint32 values all equal to tag, in memory of its own. */
static DLManagedTensorVersioned *tagged_u32(uint32_t tag, int64_t n, atomic_int *count)
{
        uint32_t *p = xcalloc((size_t)n, sizeof(*p));

        for (int64_t i = 0; i < n; i++)
                p[i] = tag;
        return cview_new(p, p, DT(kDLUInt, 32, 1), n, count);
}

/* A uint8 tensor holding the bytes of s (without its NUL), in memory of its own. */
static DLManagedTensorVersioned *bytes_of(const char *s, atomic_int *count)
{
        size_t n = strlen(s);
        char *p = xcalloc(n, 1);

        memcpy(p, s, n);
        return cview_new(p, p, DT(kDLUInt, 8, 1), (int64_t)n, count);
}

static dlx_group *acquire_group_ok(dlx_client *c, const char *name,
                                   const struct dlx_acquire_options *o)
{
        dlx_group *g = NULL;
        int err = dlx_acquire_group(c, name, NULL, 0, o, &g);

        ck_assert_msg(err == 0, "acquire group %s: %s (%s)", name, dlx_strerror(err),
                      dlx_last_error());
        return g;
}

/* Names ordered as proto/group.h says: bytewise, a name before those it begins. */
static int cmp_bytes(const char *a, const char *b)
{
        size_t la = strlen(a), lb = strlen(b);
        int c = memcmp(a, b, la < lb ? la : lb);
        return c ? c : (la > lb) - (la < lb);
}

static int cmp_name_ptrs(const void *a, const void *b)
{
        return cmp_bytes(*(const char *const *)a, *(const char *const *)b);
}

/*
 * Whether group g holds exactly the names (n of them) in byte order, and
 * each member is uint8 whose bytes are its own name: a member that maps to
 * another's bytes is found here. Describes the first difference in why.
 */
static bool group_is_named_bytes(const dlx_group *g, const char *const *names, size_t n, char *why,
                                 size_t whysz)
{
        const char **want = xcalloc(n, sizeof(*want));

        memcpy(want, names, n * sizeof(*want));
        qsort(want, n, sizeof(*want), cmp_name_ptrs);
        if (dlx_group_count(g) != n) {
                snprintf(why, whysz, "%zu members, %zu published", dlx_group_count(g), n);
                free(want);
                return false;
        }
        for (size_t i = 0; i < n; i++) {
                const char *got = dlx_group_name(g, i);
                const DLTensor *t = dlx_group_tensor(g, i);
                size_t len = strlen(want[i]);
                if (!got || strcmp(got, want[i]) != 0) {
                        snprintf(why, whysz, "member %zu is '%s', byte order wants '%s'", i,
                                 got ? got : "(null)", want[i]);
                        free(want);
                        return false;
                }
                if (!t || t->ndim != 1 || t->shape[0] != (int64_t)len || t->dtype.code != kDLUInt ||
                    t->dtype.bits != 8 ||
                    memcmp((const char *)t->data + t->byte_offset, want[i], len) != 0) {
                        snprintf(why, whysz, "member '%s' does not hold its own bytes", want[i]);
                        free(want);
                        return false;
                }
                if (dlx_group_find(g, want[i]) != (int64_t)i) {
                        snprintf(why, whysz, "find('%s') is %lld, not %zu", want[i],
                                 (long long)dlx_group_find(g, want[i]), i);
                        free(want);
                        return false;
                }
        }
        free(want);
        return true;
}

static void shuffle_ptrs(const char **v, size_t n, uint64_t *rng)
{
        for (size_t i = n; i > 1; i--) {
                size_t j = (size_t)rng_below(rng, i);
                const char *t = v[i - 1];
                v[i - 1] = v[j];
                v[j] = t;
        }
}

/* ---- P1: threads publishing groups on one client -------------------------------------------- */

enum { TH = 8, TH_ITERS = 24 };

/* What thread th's iteration it publishes, worked out again by whoever reads it. */
static size_t th_members(unsigned th, unsigned it)
{
        uint64_t s = ((uint64_t)th << 32) | it;
        uint64_t r = rng_next(&s);
        /* mostly small, now and then big: the kept working memory grows and shrinks */
        return (size_t)(r % 8 == 0 ? 1500 + r % 1500 : 1 + r % 120);
}

static int64_t th_elems(unsigned th, unsigned it, size_t j)
{
        return (int64_t)(1 + (th * 131 + it * 17 + j * 7) % 40);
}

/* Member j is tied to member j - 1 (one tensor, two names) when this says so. */
static bool th_tied(size_t j)
{
        return j % 37 == 5;
}

static uint32_t th_tag(unsigned th, unsigned it, size_t j)
{
        return ((uint32_t)th << 28) | ((uint32_t)it << 16) | (uint32_t)j;
}

struct th_arg {
        dlx_client *p, *q;
        unsigned th;
        char fail[512];
};

/* The member names of thread th, iteration it: sorted input for some, not for others. */
static void th_name(char *buf, size_t sz, unsigned th, unsigned it, size_t j)
{
        /* a long shared prefix, so the sort compares past 16 bytes */
        snprintf(buf, sz, "model.layers.shared.prefix.%u.%u.w%05zu", th, it, j);
}

/*
 * Whether g is, whole, the group thread th published in iteration it (both
 * read from the group's first member's tag): no member of another call.
 */
static bool th_group_whole(const dlx_group *g, char *why, size_t whysz)
{
        const DLTensor *t0 = dlx_group_tensor(g, 0);
        char name[96];

        if (!t0) {
                snprintf(why, whysz, "an empty group");
                return false;
        }
        uint32_t tag0 = *(const uint32_t *)t0->data;
        unsigned th = tag0 >> 28, it = (tag0 >> 16) & 0xfff;
        size_t n = th_members(th, it);
        if (th >= TH || it >= TH_ITERS || dlx_group_count(g) != n) {
                snprintf(why, whysz, "tag %08x: %zu members, wanted %zu", tag0, dlx_group_count(g),
                         n);
                return false;
        }
        for (size_t j = 0; j < n; j++) {
                size_t src = th_tied(j) ? j - 1 : j;
                th_name(name, sizeof(name), th, it, j);
                int64_t k = dlx_group_find(g, name);
                if (k < 0 || (size_t)k != j) { /* zero-padded numbers: byte order is j's order */
                        snprintf(why, whysz, "'%s' at %lld, wanted %zu", name, (long long)k, j);
                        return false;
                }
                const DLTensor *t = dlx_group_tensor(g, (size_t)k);
                int64_t ne = th_elems(th, it, src);
                if (t->ndim != 1 || t->shape[0] != ne || t->dtype.bits != 32) {
                        snprintf(why, whysz, "'%s': shape %lld, wanted %lld", name,
                                 (long long)t->shape[0], (long long)ne);
                        return false;
                }
                for (int64_t e = 0; e < ne; e++)
                        if (((const uint32_t *)t->data)[e] != th_tag(th, it, src)) {
                                snprintf(why, whysz, "'%s'[%lld] is %08x, wanted %08x", name,
                                         (long long)e, ((const uint32_t *)t->data)[e],
                                         th_tag(th, it, src));
                                return false;
                        }
        }
        return true;
}

static void *th_publisher(void *arg_)
{
        struct th_arg *a = arg_;
        char gname[64], why[200];
        uint64_t rng = 0x1234 + a->th;

        for (unsigned it = 0; it < TH_ITERS && !a->fail[0]; it++) {
                size_t n = th_members(a->th, it);
                struct dlx_member *ms = calloc(n, sizeof(*ms));
                char(*names)[96] = calloc(n, sizeof(*names));
                atomic_int *counts = calloc(n, sizeof(*counts));
                size_t *order = calloc(n, sizeof(*order));
                uint64_t v = 0;

                if (!ms || !names || !counts || !order) {
                        snprintf(a->fail, sizeof(a->fail), "out of memory");
                        break;
                }
                for (size_t j = 0; j < n; j++)
                        order[j] = j;
                if (it % 3) /* in order for a third, shuffled otherwise */
                        for (size_t j = n; j > 1; j--) {
                                size_t k = (size_t)rng_below(&rng, j), t = order[j - 1];
                                order[j - 1] = order[k];
                                order[k] = t;
                        }
                /* tensors made in member order, then placed in the input order */
                DLManagedTensorVersioned **ts = calloc(n, sizeof(*ts));
                for (size_t j = 0; j < n; j++)
                        ts[j] = th_tied(j) ? ts[j - 1]
                                           : tagged_u32(th_tag(a->th, it, j),
                                                        th_elems(a->th, it, j), &counts[j]);
                for (size_t x = 0; x < n; x++) {
                        size_t j = order[x];
                        th_name(names[j], sizeof(names[j]), a->th, it, j);
                        ms[x] = (struct dlx_member){names[j], ts[j]};
                }
                free(ts);
                bool shared = it % 2;
                if (shared)
                        snprintf(gname, sizeof(gname), "shared/group");
                else
                        snprintf(gname, sizeof(gname), "own/group/%u", a->th);
                int err = dlx_publish_group(a->p, gname, ms, n, NULL, &v);
                if (err != 0)
                        snprintf(a->fail, sizeof(a->fail),
                                 "thread %u iteration %u: publish: %s (%s)", a->th, it,
                                 dlx_strerror(err), dlx_last_error());
                for (size_t j = 0; j < n && !a->fail[0]; j++) {
                        if (ms[j].tensor)
                                snprintf(a->fail, sizeof(a->fail),
                                         "thread %u iteration %u: members[%zu].tensor not NULL",
                                         a->th, it, j);
                        else if (!th_tied(j) && atomic_load(&counts[j]) != 1)
                                snprintf(a->fail, sizeof(a->fail),
                                         "thread %u iteration %u: deleter of member %zu ran %d "
                                         "times",
                                         a->th, it, j, atomic_load(&counts[j]));
                        else if (th_tied(j) && atomic_load(&counts[j]) != 0)
                                snprintf(a->fail, sizeof(a->fail), "tied slot counted");
                }
                if (!a->fail[0]) {
                        struct dlx_acquire_options o = {.min_version = v};
                        dlx_group *g = NULL;
                        err = dlx_acquire_group(a->q, gname, NULL, 0, &o, &g);
                        if (err != 0)
                                snprintf(a->fail, sizeof(a->fail), "acquire %s v%llu: %s (%s)",
                                         gname, (unsigned long long)v, dlx_strerror(err),
                                         dlx_last_error());
                        else if (!shared && dlx_group_version(g) != v)
                                snprintf(a->fail, sizeof(a->fail), "%s: version %llu, not %llu",
                                         gname, (unsigned long long)dlx_group_version(g),
                                         (unsigned long long)v);
                        else if (!th_group_whole(g, why, sizeof(why)))
                                snprintf(a->fail, sizeof(a->fail),
                                         "thread %u iteration %u: %s v%llu mixed: %s", a->th, it,
                                         gname, (unsigned long long)dlx_group_version(g), why);
                        else if (!shared) {
                                uint32_t tag0 = *(const uint32_t *)dlx_group_tensor(g, 0)->data;
                                if (tag0 != th_tag(a->th, it, 0))
                                        snprintf(a->fail, sizeof(a->fail),
                                                 "%s v%llu holds tag %08x, wanted %08x", gname,
                                                 (unsigned long long)v, tag0, th_tag(a->th, it, 0));
                        }
                        dlx_group_release(g);
                }
                free(ms);
                free(names);
                free(counts);
                free(order);
        }
        return NULL;
}

/* P1: eight threads publish groups of 1 to 3000 members on one client, to their own names and
 * to one they share; every call succeeds, every deleter runs once, every version read back is one
 * call's members and bytes, whole. */
START_TEST(threads_publish_groups_on_one_client)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        pthread_t t[TH];
        struct th_arg args[TH];

        for (unsigned i = 0; i < TH; i++) {
                args[i] = (struct th_arg){.p = p, .q = q, .th = i};
                ck_assert_int_eq(pthread_create(&t[i], NULL, th_publisher, &args[i]), 0);
        }
        for (unsigned i = 0; i < TH; i++)
                ck_assert_int_eq(pthread_join(t[i], NULL), 0);
        for (unsigned i = 0; i < TH; i++)
                ck_assert_msg(args[i].fail[0] == '\0', "%s", args[i].fail);
        dlx_close(p);
        dlx_close(q);
}
END_TEST

/* ---- P2: forked children -----------------------------------------------------------------------
 */

struct fork_ctx {
        dlx_client *parent;
        atomic_bool stop;
        atomic_int published;
        atomic_bool park;   /* the parent asks the background publisher to stop inside a publish */
        atomic_bool parked; /* it has: it waits in a deleter, inside dlx_publish_group() */
        char fail[200];
};

/*
 * The last member of each background group: its deleter runs inside
 * dlx_publish_group() and, when asked, waits there while the parent forks.
 * The fork then lands inside a publish on the parent's client at a point
 * where no thread is inside malloc, which matters under AddressSanitizer:
 * its allocator's locks are not reset in a forked child, and a fork while
 * another thread allocates leaves the child hung in its first malloc.
 */
struct park_view {
        DLManagedTensorVersioned mt;
        int64_t shape[1];
        uint32_t value;
        struct fork_ctx *f;
};

static void park_deleter(DLManagedTensorVersioned *t)
{
        struct park_view *v = t->manager_ctx;
        struct fork_ctx *f = v->f;

        if (atomic_load(&f->park)) {
                atomic_store(&f->parked, true);
                while (atomic_load(&f->park))
                        fx_sleep_ms(1);
                atomic_store(&f->parked, false);
        }
        free(v);
}

static DLManagedTensorVersioned *park_tensor(struct fork_ctx *f)
{
        struct park_view *v = xcalloc(1, sizeof(*v));

        v->shape[0] = 1;
        v->value = 0x5041524b;
        v->f = f;
        v->mt.version.major = DLPACK_MAJOR_VERSION;
        v->mt.version.minor = DLPACK_MINOR_VERSION;
        v->mt.manager_ctx = v;
        v->mt.deleter = park_deleter;
        v->mt.dl_tensor = (DLTensor){.data = &v->value,
                                     .device = {kDLCPU, 0},
                                     .ndim = 1,
                                     .dtype = DT(kDLUInt, 32, 1),
                                     .shape = v->shape};
        return &v->mt;
}

static void *fork_background(void *arg)
{
        struct fork_ctx *f = arg;
        char name[32];

        for (unsigned it = 0; !atomic_load(&f->stop); it++) {
                size_t n = 200 + it % 700;
                struct dlx_member *ms = calloc(n, sizeof(*ms));
                char(*names)[32] = calloc(n, sizeof(*names));
                for (size_t j = 0; j < n; j++) {
                        snprintf(names[j], sizeof(names[j]), "w%zu", n - j);
                        ms[j] = (struct dlx_member){names[j], tagged_u32((uint32_t)j, 16, NULL)};
                }
                ms[n - 1].tensor->deleter(ms[n - 1].tensor);
                ms[n - 1].tensor = park_tensor(f); /* "w1", deleted last or near it */
                snprintf(name, sizeof(name), "bg/%u", it % 4);
                int err = dlx_publish_group(f->parent, name, ms, n, NULL, NULL);
                if (err != 0 && !f->fail[0])
                        snprintf(f->fail, sizeof(f->fail), "background publish: %s (%s)",
                                 dlx_strerror(err), dlx_last_error());
                atomic_fetch_add(&f->published, 1);
                free(ms);
                free(names);
        }
        return NULL;
}

static int fork_child_no;

/* In a child forked while the parent's thread publishes groups on the parent's client. */
static int fork_child(void *arg)
{
        struct fork_ctx *f = arg;
        atomic_int counts[3] = {0};
        struct dlx_member ms[] = {{"x", tagged_u32(1, 4, &counts[0])},
                                  {"y", tagged_u32(2, 4, &counts[1])},
                                  {"z", NULL}};
        char name[32], why[200];
        int err;

        ms[2].tensor = ms[0].tensor; /* tied */
        /* the parent's client: -ESTALE, and the tensors are still the child's to delete */
        err = dlx_publish_group(f->parent, "from-child", ms, 3, NULL, NULL);
        if (err != -ESTALE)
                return child_fail("publish on the parent's client: %d, not -ESTALE", err);
        if (atomic_load(&counts[0]) != 1 || atomic_load(&counts[1]) != 1 || ms[0].tensor ||
            ms[1].tensor || ms[2].tensor)
                return child_fail("ESTALE publish: deleters ran %d and %d times",
                                  atomic_load(&counts[0]), atomic_load(&counts[1]));
        /* a client of its own works, whatever the parent's threads held at the fork */
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "child"};
        dlx_client *c = NULL;
        if ((err = dlx_connect(&o, &c)) != 0)
                return child_fail("child connect: %s", dlx_strerror(err));
        for (int round = 0; round < 3; round++) {
                enum { N = 800 };
                static const char *names[N];
                static char buf[N][48];
                struct dlx_member big[N];
                for (int j = 0; j < N; j++) {
                        snprintf(buf[j], sizeof(buf[j]), "child.%d.r%d.member.%d", fork_child_no,
                                 round, (j * 7919) % N);
                        names[j] = buf[j];
                        big[j] = (struct dlx_member){buf[j], bytes_of(buf[j], NULL)};
                }
                snprintf(name, sizeof(name), "child/%d", fork_child_no);
                if ((err = dlx_publish_group(c, name, big, N, NULL, NULL)) != 0)
                        return child_fail("child publish: %s (%s)", dlx_strerror(err),
                                          dlx_last_error());
                dlx_group *g = NULL;
                if ((err = dlx_acquire_group(c, name, NULL, 0, NULL, &g)) != 0)
                        return child_fail("child acquire: %s", dlx_strerror(err));
                if (!group_is_named_bytes(g, names, N, why, sizeof(why)))
                        return child_fail("child's group: %s", why);
                dlx_group_release(g);
        }
        dlx_close(c);
        return 0;
}

/* P2: children forked while another thread is inside dlx_publish_group() on the parent's client
 * get -ESTALE there (their tensors deleted once, in the child), and publish groups of their own. */
START_TEST(forked_children_publish_groups_of_their_own)
{
        struct fork_ctx f = {0};
        pthread_t bg;
        pid_t kids[6];

        f.parent = fx_connect(&fx, "parent");
        ck_assert_int_eq(pthread_create(&bg, NULL, fork_background, &f), 0);
        for (int k = 0; k < (int)N_ELEMS(kids); k++) {
                fork_child_no = k;
                if (k % 2 == 0 || TOOLKIT_SANITIZED) {
                        /* fork while the other thread is parked inside a publish */
                        atomic_store(&f.park, true);
                        while (!atomic_load(&f.parked) && !f.fail[0])
                                fx_sleep_ms(1);
                        kids[k] = fx_spawn(fork_child, &f);
                        atomic_store(&f.park, false);
                        continue;
                }
                int seen = atomic_load(&f.published);
                while (atomic_load(&f.published) == seen && !f.fail[0])
                        fx_sleep_ms(1); /* fork somewhere inside the next publish, or near */
                kids[k] = fx_spawn(fork_child, &f);
        }
        int status[N_ELEMS(kids)];
        for (int k = 0; k < (int)N_ELEMS(kids); k++)
                status[k] = fx_wait(kids[k]);
        atomic_store(&f.stop, true);
        ck_assert_int_eq(pthread_join(bg, NULL), 0);
        ck_assert_msg(f.fail[0] == '\0', "%s", f.fail);
        for (int k = 0; k < (int)N_ELEMS(kids); k++)
                ck_assert_msg(status[k] == 0, "child %d exited %d", k, status[k]);
        /* the parent's client still works after its children */
        atomic_int c1 = 0;
        struct dlx_member ms[] = {{"a", tagged_u32(7, 3, &c1)}};
        DLXV(dlx_publish_group(f.parent, "after-fork", ms, 1, NULL, NULL));
        ck_assert_int_eq(atomic_load(&c1), 1);
        dlx_close(f.parent);
}
END_TEST

/* ---- P3: name order, duplicates, ties and NULLs --------------------------------------------- */

/* Names built to trouble a sort on 16-byte keys; valid names, distinct. */
static const char **tricky_names(size_t *ret_n)
{
        static char store[2048][DLX_NAME_MAX + 1];
        static const char *v[2048];
        size_t n = 0;
        const char *p16 = "abcdefghijklmnop"; /* exactly 16 bytes */
        static const char *const tails[] = {
                "",
                "a",
                "aa",
                "b",
                "\xc3\xa9",
                ("\xc3\xa9" /* é, then 'a': split so that 'a' is no hex digit */
                 "a"),
                "~",
                "/x",
                " ",
                "0",
                "00",
                "\xe6\x97\xa5\xe6\x9c\xac",
                "A",
                "\xce\xa9",
                "z",
                "\xc3\xbc",
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        };

#define ADD(...)                                                                                   \
        do {                                                                                       \
                snprintf(store[n], sizeof(store[n]), __VA_ARGS__);                                 \
                v[n] = store[n];                                                                   \
                n++;                                                                               \
        } while (0)
        /* a 16-byte prefix and tails: prefixes of each other, UTF-8 past byte 16 */
        for (size_t i = 0; i < N_ELEMS(tails); i++)
                ADD("%s%s", p16, tails[i]);
        /* every prefix of a 40-byte name: each begins the next */
        for (int len = 1; len <= 40; len++)
                ADD("%.*s", len, "qwertyuiopasdfghjklzxcvbnmQWERTYUIOPASDF");
        /* 15, 16, 17 and 32-byte names alike but for their last byte */
        for (int len = 15; len <= 17; len++)
                for (char last = 'a'; last <= 'e'; last++)
                        ADD("%.*s%c", len - 1, "mmmmmmmmmmmmmmmmmmmmm", last);
        for (char last = 'a'; last <= 'e'; last++)
                ADD("%.31s%c", "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn", last);
        /* names of 255 bytes differing only at byte 17, 100 and 254 */
        for (int at = 0; at < 3; at++) {
                int pos = at == 0 ? 17 : at == 1 ? 100 : 254;
                for (char c = 'a'; c <= 'c'; c++) {
                        memset(store[n], 'k', DLX_NAME_MAX);
                        store[n][DLX_NAME_MAX] = '\0';
                        store[n][pos] = c;
                        if (pos != 254)
                                store[n][254] = (char)('0' + at);
                        v[n] = store[n];
                        n++;
                }
        }
        /* UTF-8 at the start: bytes over 0x7f sort after ASCII, as unsigned bytes do */
        ADD("\xc3\xa9");
        ADD("\xc3\xa9"
            "t\xc3\xa9");
        ADD("\xe2\x82\xac"
            "/eur");
        ADD("\xf0\x9f\x98\x80");
        ADD("\xc2\xa0x"); /* U+00A0, may or may not be printable: the publish tells */
        ADD("Z");
        ADD("a");
        ADD("a/b");
        ADD("a/b/c");
        ADD("a.b");
        /* a state dict's worth of names with long shared prefixes */
        for (int l = 0; l < 12; l++)
                for (int k = 0; k < 6; k++)
                        ADD("model.layers.%d.self_attn.%s.weight", l,
                            (const char *[]){"q_proj", "k_proj", "v_proj", "o_proj", "q", "q_"}[k]);
#undef ADD
        *ret_n = n;
        return v;
}

/* Publishes names (each member its own bytes) in the given order; returns the error. */
static int publish_named_bytes(dlx_client *p, const char *group, const char *const *names, size_t n,
                               atomic_int *counts)
{
        struct dlx_member *ms = calloc(n, sizeof(*ms));
        int err;

        ck_assert_ptr_nonnull(ms);
        for (size_t i = 0; i < n; i++)
                ms[i] = (struct dlx_member){names[i],
                                            bytes_of(names[i], counts ? &counts[i] : NULL)};
        err = dlx_publish_group(p, group, ms, n, NULL, NULL);
        for (size_t i = 0; i < n; i++)
                ck_assert_msg(ms[i].tensor == NULL, "members[%zu].tensor left", i);
        free(ms);
        return err;
}

/* P3: tricky names (16-byte prefixes, names that begin others, UTF-8, differing past byte 16
 * only) come back sorted by bytes, each holding its own bytes, from shuffled, sorted, reversed
 * and almost sorted input, on one client whose working memory each call reuses. */
START_TEST(tricky_names_sort_as_bytes_and_keep_their_bytes)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        size_t n0;
        const char **all = tricky_names(&n0);
        const char **v = calloc(n0, sizeof(*v));
        uint64_t rng = 42;
        size_t n = 0;
        char why[300];

        /* drop the names this daemon calls invalid (one at a time: the publish says) */
        for (size_t i = 0; i < n0; i++) {
                int err = publish_named_bytes(p, "probe", &all[i], 1, NULL);
                if (err == 0)
                        v[n++] = all[i];
                else
                        ck_assert_msg(err == -EINVAL, "'%s': %s", all[i], dlx_strerror(err));
        }
        ck_assert_uint_ge(n, n0 - 5);
        for (int order = 0; order < 6; order++) {
                const char **in = calloc(n, sizeof(*in));
                atomic_int *counts = calloc(n, sizeof(*counts));
                memcpy(in, v, n * sizeof(*in));
                if (order == 0 || order == 5)
                        shuffle_ptrs(in, n, &rng);
                if (order == 1 || order == 2 || order == 3)
                        qsort(in, n, sizeof(*in), cmp_name_ptrs);
                if (order == 2)
                        for (size_t i = 0; i < n / 2; i++) {
                                const char *t = in[i];
                                in[i] = in[n - 1 - i];
                                in[n - 1 - i] = t;
                        }
                if (order == 3) { /* sorted but for one pair far apart */
                        const char *t = in[3];
                        in[3] = in[n - 4];
                        in[n - 4] = t;
                }
                size_t use = order == 5 ? n / 3 : n; /* a smaller call after bigger ones */
                int err = publish_named_bytes(p, "tricky", in, use, counts);
                ck_assert_msg(err == 0, "order %d: %s (%s)", order, dlx_strerror(err),
                              dlx_last_error());
                for (size_t i = 0; i < use; i++)
                        ck_assert_int_eq(atomic_load(&counts[i]), 1);
                dlx_group *g = acquire_group_ok(q, "tricky", NULL);
                ck_assert_msg(group_is_named_bytes(g, in, use, why, sizeof(why)), "order %d: %s",
                              order, why);
                dlx_group_release(g);
                free(in);
                free(counts);
        }
        free(v);
        dlx_close(p);
        dlx_close(q);
}
END_TEST

/* P3: thousands of members with random names share 16+ byte prefixes: all sorted, all their own. */
START_TEST(thousands_of_members_keep_their_bytes)
{
        enum { N = 12000 };
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        static char buf[N][80];
        const char **names = calloc(N, sizeof(*names));
        uint64_t rng = 7;
        char why[300];

        for (int round = 0; round < 2; round++) {
                for (int i = 0; i < N; i++) {
                        /* distinct by i; most differ only past byte 16, some are prefixes */
                        int pre = (int)rng_below(&rng, 3);
                        snprintf(buf[i], sizeof(buf[i]), "%s%d%s",
                                 pre == 0   ? "encoder.block.attention."
                                 : pre == 1 ? "encoder.block.attention.k"
                                            : "\xc3\xa9ncoder.block.x.",
                                 i, rng_below(&rng, 4) ? "" : ".bias");
                        names[i] = buf[i];
                }
                shuffle_ptrs(names, N, &rng);
                atomic_int *counts = calloc(N, sizeof(*counts));
                ck_assert_int_eq(publish_named_bytes(p, "many", names, N, counts), 0);
                for (int i = 0; i < N; i++)
                        ck_assert_int_eq(atomic_load(&counts[i]), 1);
                free(counts);
                dlx_group *g = acquire_group_ok(q, "many", NULL);
                ck_assert_msg(group_is_named_bytes(g, names, N, why, sizeof(why)), "round %d: %s",
                              round, why);
                dlx_group_release(g);
        }
        free(names);
        dlx_close(p);
        dlx_close(q);
}
END_TEST

/* P3: a name given twice is refused with -EINVAL wherever the two are (first and last of 5000,
 * adjacent in sorted input, alike past 16 bytes), every tensor deleted once, nothing published. */
START_TEST(a_name_twice_is_refused_wherever_it_is)
{
        enum { N = 5000 };
        dlx_client *p = fx_connect(&fx, "producer");
        static char buf[N][64];
        const char **names = calloc(N, sizeof(*names));
        struct dlx_info info;
        uint64_t rng = 99;

        for (int i = 0; i < N; i++) {
                snprintf(buf[i], sizeof(buf[i]), "transformer.h.%d.mlp.c_fc.weight", i);
                names[i] = buf[i];
        }
        static const struct {
                const char *what;
                bool sorted;
                int a, b; /* positions given the same name (after the sort, when sorted) */
        } rows[] = {
                {"first and last, shuffled", false, 0, N - 1},
                {"last and first, shuffled", false, N - 1, 0},
                {"adjacent in sorted input", true, 2500, 2501},
                {"first two of sorted input", true, 0, 1},
                {"last two of sorted input", true, N - 2, N - 1},
                {"far apart in sorted input", true, 10, N - 10},
                {"in the same 16-run", false, 17, 30},
        };
        for (size_t r = 0; r < N_ELEMS(rows); r++) {
                const char **in = calloc(N, sizeof(*in));
                atomic_int *counts = calloc(N, sizeof(*counts));
                memcpy(in, names, N * sizeof(*in));
                if (rows[r].sorted)
                        qsort(in, N, sizeof(*in), cmp_name_ptrs);
                else
                        shuffle_ptrs(in, N, &rng);
                in[rows[r].b] = in[rows[r].a];
                int err = publish_named_bytes(p, "twice", in, N, counts);
                ck_assert_msg(err == -EINVAL, "%s: %s, not -EINVAL", rows[r].what,
                              dlx_strerror(err));
                expect_last_error("twice");
                for (int i = 0; i < N; i++)
                        ck_assert_msg(atomic_load(&counts[i]) == 1, "%s: deleter %d ran %d times",
                                      rows[r].what, i, atomic_load(&counts[i]));
                ck_assert_int_eq(dlx_stat(p, "twice", &info), -ENOENT);
                free(in);
                free(counts);
        }
        /* control: the same names, each once, publish */
        ck_assert_int_eq(publish_named_bytes(p, "twice", names, N, NULL), 0);
        free(names);
        dlx_close(p);
}
END_TEST

/* P1: one tensor under many names, far apart, is deleted once, and every name reads its bytes. */
START_TEST(tied_tensor_under_many_names_deleted_once)
{
        enum { N = 3000 };
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        static char buf[N][32];
        struct dlx_member *ms = calloc(N, sizeof(*ms));
        atomic_int shared = 0, *counts = calloc(N, sizeof(*counts));
        DLManagedTensorVersioned *one = tagged_u32(0xabcdef01, 1000, &shared);

        for (int i = 0; i < N; i++) {
                snprintf(buf[i], sizeof(buf[i]), "tied.%05d", (i * 1237) % N);
                /* every third member is the shared tensor; the rest are their own */
                ms[i] = (struct dlx_member){
                        buf[i], i % 3 == 0 ? one : tagged_u32((uint32_t)i, 3, &counts[i])};
        }
        DLXV(dlx_publish_group(p, "tied", ms, N, NULL, NULL));
        ck_assert_int_eq(atomic_load(&shared), 1);
        for (int i = 0; i < N; i++) {
                ck_assert_ptr_null(ms[i].tensor);
                if (i % 3)
                        ck_assert_int_eq(atomic_load(&counts[i]), 1);
        }
        dlx_group *g = acquire_group_ok(q, "tied", NULL);
        const void *data = NULL;
        for (int i = 0; i < N; i++) {
                int64_t k = dlx_group_find(g, buf[i]);
                ck_assert_int_ge(k, 0);
                const DLTensor *t = dlx_group_tensor(g, (size_t)k);
                if (i % 3 == 0) {
                        ck_assert_int_eq(t->shape[0], 1000);
                        for (int e = 0; e < 1000; e++)
                                ck_assert_uint_eq(((const uint32_t *)t->data)[e], 0xabcdef01);
                        if (data) /* tied storage stays tied: one copy */
                                ck_assert_ptr_eq(t->data, data);
                        data = t->data;
                } else {
                        ck_assert_int_eq(t->shape[0], 3);
                        ck_assert_uint_eq(((const uint32_t *)t->data)[2], (uint32_t)i);
                }
        }
        dlx_group_release(g);
        free(ms);
        free(counts);
        dlx_close(p);
        dlx_close(q);
}
END_TEST

/* P1: a NULL tensor or name anywhere (first, middle, last), among tied tensors, is -EINVAL; every
 * other tensor is deleted once, members[i].tensor is NULL, and a second call deletes nothing. */
START_TEST(null_members_anywhere_delete_the_rest_once)
{
        enum { N = 600 };
        dlx_client *p = fx_connect(&fx, "producer");
        static char buf[N][24];
        struct dlx_info info;
        static const struct {
                const char *what;
                int at;
                bool null_name;
        } rows[] = {
                {"NULL tensor first", 0, false},
                {"NULL tensor in the middle", N / 2, false},
                {"NULL tensor last", N - 1, false},
                {"NULL name first", 0, true},
                {"NULL name in the middle", N / 2, true},
                {"NULL name last", N - 1, true},
        };
        for (size_t r = 0; r < N_ELEMS(rows); r++) {
                struct dlx_member *ms = calloc(N, sizeof(*ms));
                atomic_int *counts = calloc(N, sizeof(*counts));
                for (int i = 0; i < N; i++) {
                        snprintf(buf[i], sizeof(buf[i]), "n%d", N - i);
                        /* members 2k and 2k+1 are one tensor, tied, except at the edges */
                        ms[i] = (struct dlx_member){
                                buf[i], i % 2 && i != N - 1 && i - 1 != rows[r].at
                                                ? ms[i - 1].tensor
                                                : tagged_u32((uint32_t)i, 2, &counts[i])};
                }
                if (rows[r].null_name) {
                        ms[rows[r].at].name = NULL;
                } else {
                        /* the tensor given there goes too, unless another member holds it */
                        DLManagedTensorVersioned *t = ms[rows[r].at].tensor;
                        bool tied = (rows[r].at + 1 < N && ms[rows[r].at + 1].tensor == t) ||
                                    (rows[r].at > 0 && ms[rows[r].at - 1].tensor == t);
                        ms[rows[r].at].tensor = NULL;
                        if (!tied) {
                                t->deleter(t);
                                atomic_store(&counts[rows[r].at], 0);
                        }
                }
                int err = dlx_publish_group(p, "nulls", ms, N, NULL, NULL);
                ck_assert_msg(err == -EINVAL, "%s: %s", rows[r].what, dlx_strerror(err));
                for (int i = 0; i < N; i++) {
                        ck_assert_msg(ms[i].tensor == NULL, "%s: members[%d].tensor left",
                                      rows[r].what, i);
                        bool own = !(i % 2 && i != N - 1 && i - 1 != rows[r].at);
                        bool gone = !rows[r].null_name && i == rows[r].at;
                        int want = own && !gone ? 1 : 0;
                        ck_assert_msg(atomic_load(&counts[i]) == want,
                                      "%s: deleter of member %d ran %d times, not %d", rows[r].what,
                                      i, atomic_load(&counts[i]), want);
                }
                /* a second call on the same array: nothing left to delete, nothing deleted */
                ck_assert_int_eq(dlx_publish_group(p, "nulls", ms, N, NULL, NULL), -EINVAL);
                for (int i = 0; i < N; i++) {
                        bool own = !(i % 2 && i != N - 1 && i - 1 != rows[r].at);
                        bool gone = !rows[r].null_name && i == rows[r].at;
                        ck_assert_int_eq(atomic_load(&counts[i]), own && !gone ? 1 : 0);
                }
                ck_assert_int_eq(dlx_stat(p, "nulls", &info), -ENOENT);
                free(ms);
                free(counts);
        }
        dlx_close(p);
}
END_TEST

/* A member's deleter that publishes another group on the same client (deleters run inside the
 * call, after the copy, while the call holds the client's working memory). */
static dlx_client *reenter_client;
static atomic_int reenter_err = 1;

static void reentering_deleter(DLManagedTensorVersioned *t)
{
        struct dlx_member ms[300];
        char names[300][16];

        for (int i = 0; i < 300; i++) {
                snprintf(names[i], sizeof(names[i]), "inner.%d", 299 - i);
                ms[i] = (struct dlx_member){names[i], tagged_u32(0x1000u + (uint32_t)i, 5, NULL)};
        }
        atomic_store(&reenter_err, dlx_publish_group(reenter_client, "inner", ms, 300, NULL, NULL));
        cview_deleter(t);
}

/* P1: a deleter may publish a group on the client whose publish runs it; both groups whole. */
START_TEST(deleter_publishes_on_the_same_client)
{
        dlx_client *p = fx_connect(&fx, "producer");
        struct dlx_member ms[200];
        char names[200][16];
        atomic_int outer = 0;

        reenter_client = p;
        for (int i = 0; i < 200; i++) {
                snprintf(names[i], sizeof(names[i]), "outer.%d", i);
                ms[i] = (struct dlx_member){names[i], tagged_u32((uint32_t)i, 7, &outer)};
        }
        ms[100].tensor->deleter = reentering_deleter;
        DLXV(dlx_publish_group(p, "outer", ms, 200, NULL, NULL));
        ck_assert_int_eq(atomic_load(&reenter_err), 0);
        ck_assert_int_eq(atomic_load(&outer), 200);
        dlx_group *g = acquire_group_ok(p, "outer", NULL);
        ck_assert_uint_eq(dlx_group_count(g), 200);
        for (int i = 0; i < 200; i++) {
                int64_t k = dlx_group_find(g, names[i]);
                ck_assert_int_ge(k, 0);
                ck_assert_uint_eq(((const uint32_t *)dlx_group_tensor(g, (size_t)k)->data)[6],
                                  (uint32_t)i);
        }
        dlx_group_release(g);
        g = acquire_group_ok(p, "inner", NULL);
        ck_assert_uint_eq(dlx_group_count(g), 300);
        for (int i = 0; i < 300; i++) {
                char nm[16];
                snprintf(nm, sizeof(nm), "inner.%d", 299 - i);
                int64_t k = dlx_group_find(g, nm);
                ck_assert_int_ge(k, 0);
                ck_assert_uint_eq(*(const uint32_t *)dlx_group_tensor(g, (size_t)k)->data,
                                  0x1000u + (uint32_t)i);
        }
        dlx_group_release(g);
        dlx_close(p);
}
END_TEST

/* ---- P4: hand-made group segments --------------------------------------------------------- */

/*
 * A hand-made group segment of count uint8 members "m0".."m<count-1>", member
 * i holding len bytes at data_off + 64 i, its areas where the caller says,
 * written with pwrite into a memfd of size bytes: only the areas written
 * (and, when fill_data, the data) hold pages; everything else is a hole.
 */
struct rawg {
        uint32_t count;
        uint64_t len;
        uint64_t members_off, dims_off, names_off, data_off, size;
        bool fill_data;
        bool hole_names; /* leave the names unwritten: a hole */
        int extra_seals;
};

static uint64_t rawg_names_size(const struct rawg *r)
{
        uint64_t s = 0;
        char nm[16];
        for (uint32_t i = 0; i < r->count; i++)
                s += (uint64_t)snprintf(nm, sizeof(nm), "m%u", i) + 1;
        return s;
}

static int rawg_memfd(const struct rawg *r)
{
        int fd = memfd_create("hand-made-group", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        struct group_head h = {.format = GROUP_FORMAT};
        uint64_t name_at = 0;

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, (off_t)r->size), 0);
        memcpy(h.magic, GROUP_MAGIC, 8);
        h.count = r->count;
        h.members_off = r->members_off;
        h.dims_off = r->dims_off;
        h.ndims = 2 * (uint64_t)r->count;
        h.names_off = r->names_off;
        h.names_size = rawg_names_size(r);
        h.data_off = r->data_off;
        if (r->size >= sizeof(h))
                ck_assert_int_eq(pwrite(fd, &h, sizeof(h), 0), (ssize_t)sizeof(h));
        else
                ck_assert_int_eq(pwrite(fd, &h, r->size, 0), (ssize_t)r->size);
        for (uint32_t i = 0; i < r->count; i++) {
                char nm[16];
                int len = snprintf(nm, sizeof(nm), "m%u", i);
                struct group_member m = {
                        .offset = r->data_off + (r->len ? 64 * (uint64_t)i : 0),
                        .flags = DLPACK_FLAG_BITMASK_READ_ONLY,
                        .dims = 2 * (uint64_t)i,
                        .name_off = (uint32_t)name_at,
                        .name_len = (uint16_t)len,
                        .ndim = 1,
                        .dtype_code = kDLUInt,
                        .dtype_bits = 8,
                        .dtype_lanes = 1,
                };
                int64_t dims[2] = {(int64_t)r->len, 1};
                if (r->members_off + (i + 1) * sizeof(m) <= r->size)
                        ck_assert_int_eq(
                                pwrite(fd, &m, sizeof(m), (off_t)(r->members_off + i * sizeof(m))),
                                (ssize_t)sizeof(m));
                if (r->dims_off + (2 * i + 2) * 8 <= r->size)
                        ck_assert_int_eq(
                                pwrite(fd, dims, sizeof(dims), (off_t)(r->dims_off + 2 * i * 8)),
                                (ssize_t)sizeof(dims));
                if (!r->hole_names && r->names_off + name_at + (uint64_t)len + 1 <= r->size)
                        ck_assert_int_eq(
                                pwrite(fd, nm, (size_t)len + 1, (off_t)(r->names_off + name_at)),
                                len + 1);
                name_at += (uint64_t)len + 1;
                if (r->fill_data && r->len) {
                        uint8_t b[64];
                        memset(b, (int)(0x40 + i % 64), sizeof(b));
                        ck_assert_int_le(r->len, 64);
                        ck_assert_int_eq(pwrite(fd, b, r->len, (off_t)m.offset), (ssize_t)r->len);
                }
        }
        ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | r->extra_seals), 0);
        return fd;
}

static int raw_call(int sock, const struct wire_request *req, int fd, struct wire_reply *rep)
{
        int r;

        rp_send(sock, req, fd);
        r = rp_read_answer(sock, rep, REPLY_MS * fx_slowdown(), NULL);
        ck_assert_msg(r == 1, "request %llu: no answer (%d): is the daemon alive?",
                      (unsigned long long)req->id, r);
        ck_assert_uint_eq(rep->id, req->id);
        return rep->status;
}

/* Publishes r under name from a raw peer; returns the status. *ret_blocks: the memfd's bytes
 * allocated before and after the call. */
static int rawg_publish(int sock, uint64_t id, const char *name, const struct rawg *r,
                        uint64_t *ret_before, uint64_t *ret_after, struct wire_reply *rep)
{
        struct wire_request req = {.id = id, .type = WIRE_REQ_PUBLISH};
        struct wire_tensor *t = &req.publish.tensor;
        int fd = rawg_memfd(r), st;
        struct stat sb;

        snprintf(t->name, sizeof(t->name), "%s", name);
        t->dtype = (DLDataType){kDLUInt, 8, 1};
        t->ndim = 1;
        t->shape[0] = (int64_t)(r->size > r->data_off ? r->size - r->data_off : 0);
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->offset = r->data_off <= r->size ? r->data_off : 0;
        t->length = (uint64_t)t->shape[0];
        t->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        t->members = r->count;
        ck_assert_int_eq(fstat(fd, &sb), 0);
        if (ret_before)
                *ret_before = (uint64_t)sb.st_blocks * 512;
        st = raw_call(sock, &req, fd, rep);
        ck_assert_int_eq(fstat(fd, &sb), 0);
        if (ret_after)
                *ret_after = (uint64_t)sb.st_blocks * 512;
        close(fd);
        return st;
}

/* In a child: acquires name with a client of its own and checks rawg's members. */
static int rawg_consume(void *arg)
{
        const struct rawg *r = arg;
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "reader"};
        dlx_client *c = NULL;
        dlx_group *g = NULL;
        int err;

        if ((err = dlx_connect(&o, &c)) != 0)
                return child_fail("connect: %s", dlx_strerror(err));
        if ((err = dlx_acquire_group(c, "raw/ok", NULL, 0, NULL, &g)) != 0)
                return child_fail("acquire: %s (%s)", dlx_strerror(err), dlx_last_error());
        if (dlx_group_count(g) != r->count)
                return child_fail("%zu members", dlx_group_count(g));
        for (uint32_t i = 0; i < r->count; i++) {
                char nm[16];
                snprintf(nm, sizeof(nm), "m%u", i);
                int64_t k = dlx_group_find(g, nm);
                if (k < 0)
                        return child_fail("no %s", nm);
                const DLTensor *t = dlx_group_tensor(g, (size_t)k);
                for (uint64_t b = 0; b < r->len; b++) {
                        uint8_t want = r->fill_data ? (uint8_t)(0x40 + i % 64) : 0;
                        if (((const uint8_t *)t->data)[b] != want)
                                return child_fail("%s[%llu] is %u, not %u", nm,
                                                  (unsigned long long)b,
                                                  ((const uint8_t *)t->data)[b], want);
                }
        }
        dlx_group_release(g);
        dlx_close(c);
        return 0;
}

/* dlxd's peak resident memory, kB. */
static long daemon_hwm_kb(void)
{
        char path[64], line[256];
        long v = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int)fx.pid);
        f = fopen(path, "re");
        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, "VmHWM:", 6) == 0)
                        v = strtol(line + 6, NULL, 10);
        fclose(f);
        return v;
}

/*
 * P4: sparse group segments that are valid (a hole inside the table, between its areas; the
 * table ending exactly where a hole begins; holes all over the data area; no data area at all)
 * are accepted, read back whole by a consumer, and dlxd allocates none of the memfd's holes;
 * broken ones (the names in a hole, tiny segments, areas past data_off) are refused; dlxd
 * serves on.
 */
START_TEST(sparse_group_segments_checked_without_faulting_holes)
{
        dlx_client *c = fx_connect(&fx, "observer");
        int sock = rp_connect(fx.socket, "hostile");
        struct wire_reply rep;
        uint64_t before, after;
        const uint64_t P = 4096;

        static const struct {
                const char *what;
                struct rawg r;
                bool ok;
        } rows[] = {
                /* members in page 0; dims and names 3 pages on: pages 1-2 are a hole */
                {"a hole between the members and the dims",
                 {.count = 4,
                  .len = 16,
                  .members_off = 64,
                  .dims_off = 3 * 4096,
                  .names_off = 3 * 4096 + 64,
                  .data_off = 8 * 4096,
                  .size = 9 * 4096,
                  .fill_data = true},
                 true},
                /* the table's last byte is the last of page 0; data holes from page 1 on */
                {"the table ends exactly where a hole begins",
                 {.count = 3,
                  .len = 8,
                  .members_off = 64,
                  .dims_off = 64 + 3 * 48,
                  .names_off = 4096 - 9,
                  .data_off = 4096,
                  .size = 64 * 4096,
                  .fill_data = false},
                 true},
                /* a big data area that is one hole, members reading zeros */
                {"a data area of 64 MiB of holes",
                 {.count = 2,
                  .len = 64,
                  .members_off = 64,
                  .dims_off = 64 + 2 * 48,
                  .names_off = 64 + 2 * 48 + 32,
                  .data_off = 4096,
                  .size = 4096 + (64u << 20),
                  .fill_data = false},
                 true},
                /* every member empty, no data area: data_off is the segment's end */
                {"data_off at the segment's end",
                 {.count = 2,
                  .len = 0,
                  .members_off = 64,
                  .dims_off = 64 + 2 * 48,
                  .names_off = 64 + 2 * 48 + 32,
                  .data_off = 4096,
                  .size = 4096},
                 true},
                /* the names are in a hole (never written): zeros, no valid name */
                {"the names in a hole",
                 {.count = 2,
                  .len = 8,
                  .members_off = 64,
                  .dims_off = 64 + 2 * 48,
                  .names_off = 5 * 4096,
                  .data_off = 6 * 4096,
                  .size = 7 * 4096,
                  .hole_names = true},
                 false},
                {"names reaching past data_off",
                 {.count = 2,
                  .len = 8,
                  .members_off = 64,
                  .dims_off = 64 + 2 * 48,
                  .names_off = 4096 - 3,
                  .data_off = 4096,
                  .size = 2 * 4096},
                 false},
                {"dims reaching past data_off, into the data",
                 {.count = 2,
                  .len = 8,
                  .members_off = 64,
                  .dims_off = 4096 - 16,
                  .names_off = 200,
                  .data_off = 4096,
                  .size = 2 * 4096},
                 false},
                {"a 63-byte segment",
                 {.count = 1,
                  .len = 0,
                  .members_off = 64,
                  .dims_off = 64,
                  .names_off = 64,
                  .data_off = 63,
                  .size = 63},
                 false},
                {"a head-only segment",
                 {.count = 1,
                  .len = 0,
                  .members_off = 64,
                  .dims_off = 64,
                  .names_off = 64,
                  .data_off = 64,
                  .size = 64},
                 false},
                {"a 1-byte segment", {.count = 1, .size = 1}, false},
                {"data_off past the segment",
                 {.count = 1,
                  .len = 0,
                  .members_off = 64,
                  .dims_off = 112,
                  .names_off = 128,
                  .data_off = 3 * 4096,
                  .size = 2 * 4096},
                 false},
        };
        for (size_t i = 0; i < N_ELEMS(rows); i++) {
                struct rawg r = rows[i].r;
                uint64_t id = 100 + i;
                int st = rawg_publish(sock, id, rows[i].ok ? "raw/ok" : "raw/bad", &r, &before,
                                      &after, &rep);
                if (rows[i].ok) {
                        ck_assert_msg(st == WIRE_OK, "%s: refused (%d: %s)", rows[i].what, st,
                                      rep.error);
                        int status = fx_wait(fx_spawn(rawg_consume, &r));
                        ck_assert_msg(status == 0, "%s: the consumer failed (%d)", rows[i].what,
                                      status);
                        DLXV(dlx_unpublish(c, "raw/ok"));
                } else {
                        ck_assert_msg(st != WIRE_OK, "%s: accepted", rows[i].what);
                }
                ck_assert_msg(after <= before + P,
                              "%s: dlxd's check allocated %llu bytes of "
                              "holes in the memfd (%llu before)",
                              rows[i].what, (unsigned long long)(after - before),
                              (unsigned long long)before);
                ck_assert_int_eq(dlx_ping(c), 0);
        }
        close(sock);
        dlx_close(c);
}
END_TEST

/*
 * P4: a sparse table is read rather than mapped so that its holes cost
 * dlxd nothing (commit 25b9b3e; README: --max-group-table bounds what one
 * publish can make dlxd read). A table of two pages whose second page lies
 * 2 MiB on, with data_off at 128 MiB, needs a few KiB read; dlxd's peak
 * resident memory must not grow by the 128 MiB of padding and holes.
 */
START_TEST(sparse_table_costs_dlxd_no_memory_for_its_holes)
{
        dlx_client *c = fx_connect(&fx, "observer");
        int sock = rp_connect(fx.socket, "hostile");
        struct wire_reply rep;
        const uint64_t MiB = 1 << 20;
        struct rawg r = {.count = 4,
                         .len = 16,
                         .members_off = 64,
                         .dims_off = 2 * MiB,
                         .names_off = 2 * MiB + 64,
                         .data_off = 128 * MiB,
                         .size = 128 * MiB + 4096,
                         .fill_data = true};
        long hwm0, hwm1;

        ck_assert_int_eq(dlx_ping(c), 0);
        hwm0 = daemon_hwm_kb();
        int st = rawg_publish(sock, 7, "raw/ok", &r, NULL, NULL, &rep);
        ck_assert_msg(st == WIRE_OK, "refused (%d: %s)", st, rep.error);
        hwm1 = daemon_hwm_kb();
        ck_assert_msg(hwm1 - hwm0 < 16 * 1024,
                      "dlxd's peak RSS grew by %ld kB checking a sparse table of a few KiB "
                      "(data_off 128 MiB): it read the holes and padding into memory of its own",
                      hwm1 - hwm0);
        int status = fx_wait(fx_spawn(rawg_consume, &r));
        ck_assert_int_eq(status, 0);
        DLXV(dlx_unpublish(c, "raw/ok"));
        close(sock);
        dlx_close(c);
}
END_TEST

/* P4: a group memfd sent without a write seal, and mapped by nobody, is sealed by dlxd before it
 * is checked: once accepted it carries F_SEAL_WRITE, and the sender cannot change the table. */
START_TEST(unsealed_group_segment_is_sealed_before_use)
{
        dlx_client *c = fx_connect(&fx, "observer");
        int sock = rp_connect(fx.socket, "hostile");
        struct wire_request req = {.id = 9, .type = WIRE_REQ_PUBLISH};
        struct wire_tensor *t = &req.publish.tensor;
        struct wire_reply rep;
        struct rawg r = {.count = 2,
                         .len = 8,
                         .members_off = 64,
                         .dims_off = 160,
                         .names_off = 192,
                         .data_off = 4096,
                         .size = 8192,
                         .fill_data = true};
        int fd = rawg_memfd(&r);

        snprintf(t->name, sizeof(t->name), "raw/ok");
        t->dtype = (DLDataType){kDLUInt, 8, 1};
        t->ndim = 1;
        t->shape[0] = 4096;
        t->strides[0] = 1;
        t->device_type = kDLCPU;
        t->storage = WIRE_STORAGE_MEMFD;
        t->offset = 4096;
        t->length = 4096;
        t->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        t->members = 2;
        int st = raw_call(sock, &req, fd, &rep);
        if (st == WIRE_OK) {
                int seals = fcntl(fd, F_GET_SEALS);
                ck_assert_msg(seals & F_SEAL_WRITE, "accepted, but not sealed (seals 0x%x)", seals);
                char z = 'X';
                ck_assert_int_eq(pwrite(fd, &z, 1, 200), -1); /* the names: no change */
                ck_assert_int_eq(fx_wait(fx_spawn(rawg_consume, &r)), 0);
                DLXV(dlx_unpublish(c, "raw/ok"));
        }
        close(fd);
        close(sock);
        ck_assert_int_eq(dlx_ping(c), 0);
        dlx_close(c);
}
END_TEST

/* ---- P5: big segments destroyed ------------------------------------------------------------ */

/* A group of two members over n floats each (4n bytes a member), copied: one segment of its own. */
static void publish_big_group(dlx_client *p, const char *name, int64_t n, uint32_t tag,
                              uint64_t *ret_version)
{
        struct dlx_member ms[] = {{"a", tagged_u32(tag, n, NULL)},
                                  {"b", tagged_u32(tag + 1, n, NULL)}};
        int err = dlx_publish_group(p, name, ms, 2, NULL, ret_version);

        ck_assert_msg(err == 0, "publish %s: %s (%s)", name, dlx_strerror(err), dlx_last_error());
}

enum { BIG = 1 << 17 }; /* 2 x 512 KiB a group, over 1 MiB with its table: closed deferred */

/*
 * P5: big segments destroyed every way at once (replaced, unpublished, leases released, a
 * session's end, 150 at a time: more than the 64 deferred) all close, and only once: dlxd's
 * descriptors come back to where they were, and it keeps serving.
 */
START_TEST(big_segments_destroyed_every_way_all_close)
{
        enum { N = 150 };
        int fds0 = count_fds(fx.pid);
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        dlx_group *held[N];
        char name[32];
        int fds1;

        /* replaced */
        for (int i = 0; i < 100; i++)
                publish_big_group(p, "big/replaced", BIG, (uint32_t)i, NULL);
        /* leased, then unpublished, then released all at once */
        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "big/%d", i);
                publish_big_group(p, name, BIG, (uint32_t)i, NULL);
                held[i] = acquire_group_ok(q, name, NULL);
        }
        ck_assert_int_eq(dlx_ping(p), 0);
        fds1 = count_fds(fx.pid);
        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "big/%d", i);
                DLXV(dlx_unpublish(p, name));
        }
        for (int i = 0; i < N; i++) {
                ck_assert_uint_eq(*(const uint32_t *)dlx_group_tensor(held[i], 0)->data,
                                  (uint32_t)i);
                dlx_group_release(held[i]);
        }
        ck_assert_int_eq(dlx_ping(q), 0);
        ck_assert_int_eq(wait_daemon_fds(&fx, fds1 - N, 5000), fds1 - N);
        /* a session's end: 150 big groups at once */
        for (int i = 0; i < N; i++) {
                snprintf(name, sizeof(name), "big/s%d", i);
                publish_big_group(p, name, BIG, (uint32_t)i, NULL);
        }
        dlx_close(p);
        dlx_close(q);
        ck_assert_int_eq(wait_daemon_fds(&fx, fds0, 5000), fds0);
        p = fx_connect(&fx, "after");
        publish_big_group(p, "big/after", BIG, 5, NULL);
        dlx_group *g = acquire_group_ok(p, "big/after", NULL);
        ck_assert_uint_eq(*(const uint32_t *)dlx_group_tensor(g, 1)->data, 6);
        dlx_group_release(g);
        dlx_close(p);
        ck_assert_int_eq(wait_daemon_fds(&fx, fds0, 5000), fds0);
}
END_TEST

/* P5: SIGTERM right after a session's end destroyed 100 big segments: dlxd exits 0. */
START_TEST(sigterm_right_after_big_segments_destroyed)
{
        char name[32];
        int status;

        dlxd_start(&fx, NULL);
        dlx_client *p = fx_connect(&fx, "producer");
        for (int i = 0; i < 100; i++) {
                snprintf(name, sizeof(name), "big/%d", i);
                publish_big_group(p, name, BIG, (uint32_t)i, NULL);
        }
        /* a raw peer's end, unconfirmed: its segments die while the signal is on its way */
        int sock = rp_connect(fx.socket, "raw");
        for (int i = 0; i < 70; i++) {
                struct wire_request req;
                struct wire_reply rep;
                int fd = make_memfd(2u << 20, F_SEAL_SHRINK | F_SEAL_GROW);
                snprintf(name, sizeof(name), "raw/%d", i);
                rp_publish_req(&req, 10 + (uint64_t)i, name, 4096, 0,
                               DLPACK_FLAG_BITMASK_READ_ONLY);
                ck_assert_int_eq(raw_call(sock, &req, fd, &rep), WIRE_OK);
                close(fd);
        }
        dlx_close(p);
        close(sock);
        ck_assert_int_eq(kill(fx.pid, SIGTERM), 0);
        ck_assert_int_eq(waitpid(fx.pid, &status, 0), fx.pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "dlxd did not exit 0 on SIGTERM (status 0x%x)", status);
        fx.pid = 0;
        rmdir(fx.dir);
}
END_TEST

/*
 * P5, limits: a destroyed segment's descriptor no longer counts against --max-fds (accounting
 * drops at once): with --max-fds 8, eight big groups unpublished make room for eight more at once.
 */
START_TEST(max_fds_freed_by_big_segments_at_once)
{
        static const char *const args[] = {"--max-fds", "8", "--max-fds-per-uid", "0", NULL};
        char name[32];
        struct dlx_member ms[1];

        dlxd_start(&fx, args);
        dlx_client *p = fx_connect(&fx, "producer");
        for (int round = 0; round < 4; round++) {
                for (int i = 0; i < 8; i++) {
                        snprintf(name, sizeof(name), "lim/%d", i);
                        publish_big_group(p, name, BIG, (uint32_t)(round * 8 + i), NULL);
                }
                ms[0] = (struct dlx_member){"a", tagged_u32(1, BIG, NULL)};
                ck_assert_int_eq(dlx_publish_group(p, "lim/over", ms, 1, NULL, NULL), -EAGAIN);
                for (int i = 0; i < 8; i++) {
                        snprintf(name, sizeof(name), "lim/%d", i);
                        DLXV(dlx_unpublish(p, name));
                }
        }
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

/*
 * P5 at the kernel's edge: dlxd's RLIMIT_NOFILE lowered to what it holds
 * plus 8. A raw peer holds 30 big segments, then sends in one write 30
 * unpublishes and 30 publishes of fresh big memfds: dlxd's accounting lets
 * every publish in (the 30 it held are gone first), and the descriptors it
 * holds never pass 30 + what it had, unless destroyed ones stay open while
 * new ones come: then the kernel drops a descriptor and dlxd drops the peer.
 */
START_TEST(pipelined_replace_at_the_fd_limit)
{
        enum { N = 30 };
        char name[32];
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0;
        struct wire_request req;
        struct wire_reply rep;
        int fds[N];

        dlxd_start(&fx, NULL);
        dlx_client *c = fx_connect(&fx, "observer");
        int sock = rp_connect(fx.socket, "raw");
        for (int i = 0; i < N; i++) {
                int fd = make_memfd(2u << 20, F_SEAL_SHRINK | F_SEAL_GROW);
                snprintf(name, sizeof(name), "edge/%d", i);
                rp_publish_req(&req, 10 + (uint64_t)i, name, 4096, 0,
                               DLPACK_FLAG_BITMASK_READ_ONLY);
                ck_assert_int_eq(raw_call(sock, &req, fd, &rep), WIRE_OK);
                close(fd);
        }
        ck_assert_int_eq(dlx_ping(c), 0);
        int held = count_fds(fx.pid);
        struct rlimit lim = {.rlim_cur = (rlim_t)held + 8, .rlim_max = (rlim_t)held + 8};
        ck_assert_int_eq(prlimit(fx.pid, RLIMIT_NOFILE, &lim, NULL), 0);
        /* 30 unpublishes, then 30 publishes, each with a descriptor, back to back */
        for (int i = 0; i < N; i++) {
                memset(&req, 0, sizeof(req));
                req.id = 100 + (uint64_t)i;
                req.type = WIRE_REQ_UNPUBLISH;
                snprintf(req.unpublish.name, sizeof(req.unpublish.name), "edge/%d", i);
                rp_frame_append(&buf, &len, &cap, &req);
        }
        fx_stop_daemon(&fx);
        ck_assert_int_eq(rp_send_raw(sock, buf, len, NULL, 0), 0);
        for (int i = 0; i < N; i++) {
                uint8_t f[4096];
                fds[i] = make_memfd(2u << 20, F_SEAL_SHRINK | F_SEAL_GROW);
                snprintf(name, sizeof(name), "edge/%d", i);
                rp_publish_req(&req, 200 + (uint64_t)i, name, 4096, 0,
                               DLPACK_FLAG_BITMASK_READ_ONLY);
                size_t n = rp_frame(&req, 1, f, sizeof(f));
                ck_assert_int_eq(rp_send_raw(sock, f, n, &fds[i], 1), 0);
                close(fds[i]);
        }
        ck_assert_int_eq(kill(fx.pid, SIGCONT), 0);
        int ok = 0;
        for (int i = 0; i < 2 * N; i++) {
                int r = rp_read_answer(sock, &rep, REPLY_MS, NULL);
                ck_assert_msg(r == 1, "reply %d of %d: dlxd dropped the peer (%d)", i, 2 * N, r);
                ck_assert_msg(rep.status == WIRE_OK, "request %llu refused: %s",
                              (unsigned long long)rep.id, rep.error);
                ok++;
        }
        ck_assert_int_eq(ok, 2 * N);
        free(buf);
        close(sock);
        dlx_close(c);
        dlxd_stop(&fx);
}
END_TEST

/* ---- P6: lifetimes ------------------------------------------------------------------------- */

struct close_race {
        dlx_client *p;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool inside, closed;
        atomic_int deleted;
        int err;
};

static struct close_race *race;

/* A member's deleter: runs inside dlx_publish_group(), after the copy; waits for dlx_close(). */
static void blocking_deleter(DLManagedTensorVersioned *t)
{
        pthread_mutex_lock(&race->lock);
        race->inside = true;
        pthread_cond_broadcast(&race->cond);
        while (!race->closed)
                pthread_cond_wait(&race->cond, &race->lock);
        pthread_mutex_unlock(&race->lock);
        atomic_fetch_add(&race->deleted, 1);
        free(t->manager_ctx);
}

static void *racing_publisher(void *arg)
{
        struct close_race *r = arg;
        static uint32_t data[256];
        struct dlx_member ms[40];
        char names[40][8];

        for (int i = 0; i < 40; i++) {
                snprintf(names[i], sizeof(names[i]), "m%d", i);
                ms[i] = (struct dlx_member){names[i],
                                            i == 20 ? NULL : tagged_u32((uint32_t)i, 4, NULL)};
        }
        /* one member whose deleter waits: the call is inside while dlx_close() runs */
        struct cview *v = calloc(1, sizeof(*v));
        v->shape[0] = 256;
        v->mt.version.major = DLPACK_MAJOR_VERSION;
        v->mt.manager_ctx = v;
        v->mt.deleter = blocking_deleter;
        v->mt.dl_tensor = (DLTensor){.data = data,
                                     .device = {kDLCPU, 0},
                                     .ndim = 1,
                                     .dtype = DT(kDLUInt, 32, 1),
                                     .shape = v->shape};
        ms[20].tensor = &v->mt;
        r->err = dlx_publish_group(r->p, "racing", ms, 40, NULL, NULL);
        for (int i = 0; i < 40; i++)
                if (ms[i].tensor)
                        r->err = 1000;
        return NULL;
}

/* P6: dlx_close() while another thread is inside dlx_publish_group(): close returns, the publish
 * fails with -ECONNRESET, its tensors are deleted once, and the group is not left published. */
START_TEST(close_while_publishing_a_group)
{
        struct close_race r = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
        dlx_client *q = fx_connect(&fx, "observer");
        struct dlx_info info;
        pthread_t t;

        race = &r;
        r.p = fx_connect(&fx, "producer");
        ck_assert_int_eq(pthread_create(&t, NULL, racing_publisher, &r), 0);
        pthread_mutex_lock(&r.lock);
        while (!r.inside)
                pthread_cond_wait(&r.cond, &r.lock);
        pthread_mutex_unlock(&r.lock);
        dlx_close(r.p);
        pthread_mutex_lock(&r.lock);
        r.closed = true;
        pthread_cond_broadcast(&r.cond);
        pthread_mutex_unlock(&r.lock);
        ck_assert_int_eq(pthread_join(t, NULL), 0);
        ck_assert_int_eq(atomic_load(&r.deleted), 1);
        ck_assert_msg(r.err == -ECONNRESET, "publish during close: %d (%s), not -ECONNRESET", r.err,
                      dlx_strerror(r.err));
        /* whatever reached the daemon went with the client */
        for (int i = 0; i < 200 && dlx_stat(q, "racing", &info) == 0; i++)
                fx_sleep_ms(10);
        ck_assert_int_eq(dlx_stat(q, "racing", &info), -ENOENT);
        dlx_close(q);
}
END_TEST

static void killing_deleter(DLManagedTensorVersioned *t)
{
        int status;

        if (fx.pid > 0) {
                kill(fx.pid, SIGKILL);
                waitpid(fx.pid, &status, 0);
                fx.pid = 0;
        }
        atomic_fetch_add(&((struct cview *)t->manager_ctx)->count[0], 1);
        free(t->manager_ctx);
}

/* P6: the daemon dies inside a group publish (after the copy, before the send): -ECONNRESET or
 * -EPIPE, every deleter once, and the client reports the same on its next call. */
START_TEST(daemon_dies_inside_a_group_publish)
{
        atomic_int killed = 0, counts[8] = {0};
        struct dlx_member ms[8];
        char names[8][8];

        dlxd_start(&fx, NULL);
        dlx_client *p = fx_connect(&fx, "producer");
        for (int i = 0; i < 8; i++) {
                snprintf(names[i], sizeof(names[i]), "k%d", i);
                ms[i] = (struct dlx_member){names[i], tagged_u32((uint32_t)i, 1000, &counts[i])};
        }
        struct cview *v = calloc(1, sizeof(*v));
        v->shape[0] = 4;
        v->count = &killed;
        v->mt.version.major = DLPACK_MAJOR_VERSION;
        v->mt.manager_ctx = v;
        v->mt.deleter = killing_deleter;
        static uint32_t four[4];
        v->mt.dl_tensor = (DLTensor){.data = four,
                                     .device = {kDLCPU, 0},
                                     .ndim = 1,
                                     .dtype = DT(kDLUInt, 32, 1),
                                     .shape = v->shape};
        cview_deleter(ms[0].tensor);
        atomic_store(&counts[0], 1);
        ms[0].tensor = &v->mt;
        int err = dlx_publish_group(p, "dying", ms, 8, NULL, NULL);
        ck_assert_msg(err == -ECONNRESET || err == -EPIPE, "publish: %d (%s)", err,
                      dlx_strerror(err));
        ck_assert_int_eq(atomic_load(&killed), 1);
        for (int i = 0; i < 8; i++) {
                ck_assert_ptr_null(ms[i].tensor);
                ck_assert_int_eq(atomic_load(&counts[i]), 1);
        }
        err = dlx_ping(p);
        ck_assert_msg(err == -ECONNRESET || err == -EPIPE, "ping after: %d", err);
        dlx_close(p);
        rmdir(fx.dir);
}
END_TEST

/* P6: -ENOSPC under --max-bytes for a big group: every deleter once, the message names the
 * limit, nothing is left charged, and a group that fits publishes after. */
START_TEST(enospc_big_group_leaves_nothing)
{
        static const char *const args[] = {"--max-bytes", "4M", NULL};
        enum { N = 64 };
        struct dlx_member ms[N];
        char names[N][8];
        atomic_int counts[N];

        dlxd_start(&fx, args);
        dlx_client *p = fx_connect(&fx, "producer");
        struct dlx_stats st0 = fx_stats(p);
        for (int i = 0; i < N; i++) {
                snprintf(names[i], sizeof(names[i]), "e%d", i);
                atomic_init(&counts[i], 0);
                ms[i] = (struct dlx_member){names[i],
                                            tagged_u32((uint32_t)i, 32 * 1024, &counts[i])};
        }
        /* 64 x 128 KiB: 8 MiB */
        ck_assert_int_eq(dlx_publish_group(p, "enospc", ms, N, NULL, NULL), -ENOSPC);
        expect_last_error("shared bytes");
        for (int i = 0; i < N; i++) {
                ck_assert_ptr_null(ms[i].tensor);
                ck_assert_int_eq(atomic_load(&counts[i]), 1);
        }
        struct dlx_stats st1 = fx_stats(p);
        ck_assert_uint_eq(st1.bytes, st0.bytes);
        ck_assert_uint_eq(st1.fds, st0.fds);
        struct dlx_info info;
        ck_assert_int_eq(dlx_stat(p, "enospc", &info), -ENOENT);
        /* 16 x 128 KiB fits */
        for (int i = 0; i < 16; i++)
                ms[i] = (struct dlx_member){names[i], tagged_u32((uint32_t)i, 32 * 1024, NULL)};
        DLXV(dlx_publish_group(p, "enospc", ms, 16, NULL, NULL));
        dlx_group *g = acquire_group_ok(p, "enospc", NULL);
        ck_assert_uint_eq(dlx_group_count(g), 16);
        dlx_group_release(g);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

Suite *group_publish_suite(void)
{
        Suite *s = suite_create("group-publish");
        TCase *tc = tcase_create("shared-daemon");
        TCase *own = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, threads_publish_groups_on_one_client);
        tcase_add_test(tc, forked_children_publish_groups_of_their_own);
        tcase_add_test(tc, tricky_names_sort_as_bytes_and_keep_their_bytes);
        tcase_add_test(tc, thousands_of_members_keep_their_bytes);
        tcase_add_test(tc, a_name_twice_is_refused_wherever_it_is);
        tcase_add_test(tc, tied_tensor_under_many_names_deleted_once);
        tcase_add_test(tc, null_members_anywhere_delete_the_rest_once);
        tcase_add_test(tc, deleter_publishes_on_the_same_client);
        tcase_add_test(tc, sparse_group_segments_checked_without_faulting_holes);
        tcase_add_test(tc, sparse_table_costs_dlxd_no_memory_for_its_holes);
        tcase_add_test(tc, unsealed_group_segment_is_sealed_before_use);
        tcase_add_test(tc, big_segments_destroyed_every_way_all_close);
        tcase_add_test(tc, close_while_publishing_a_group);
        suite_add_tcase(s, tc);

        tcase_add_unchecked_fixture(own, fx_reaper_init, fx_reaper_run);
        tcase_set_timeout(own, 120);
        tcase_add_test(own, sigterm_right_after_big_segments_destroyed);
        tcase_add_test(own, max_fds_freed_by_big_segments_at_once);
        tcase_add_test(own, pipelined_replace_at_the_fd_limit);
        tcase_add_test(own, daemon_dies_inside_a_group_publish);
        tcase_add_test(own, enospc_big_group_leaves_nothing);
        suite_add_tcase(s, own);
        return s;
}
