/* SPDX-License-Identifier: MIT */
/*
 * Acceptance tests of the group feature, black-box, written from the
 * promises in include/dlx/dlx.h and README.md only (an independent tester's).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "tensors.h"

#define DLXV(call)                                                                                 \
        do {                                                                                       \
                int err_ = (call);                                                                 \
                ck_assert_msg(err_ == 0, "%s: %s (%s)", #call, dlx_strerror(err_),                 \
                              dlx_last_error());                                                   \
        } while (0)

/* ---- helpers ---------------------------------------------------------------------------- */

struct view {
        DLManagedTensorVersioned mt;
        int *deleted;
        int64_t shape[4], strides[4];
};

static void view_deleter(DLManagedTensorVersioned *t)
{
        struct view *v = t->manager_ctx;
        if (v->deleted)
                __atomic_add_fetch(v->deleted, 1, __ATOMIC_SEQ_CST);
        free(v);
}

/*
 * A view of data, or NULL (no memory, or more than 4 dimensions). Without
 * Check's assertions: a child that is killed must not be inside one, since
 * each writes to the channel its test reports through, and a write cut short
 * corrupts it ("Bad message type").
 */
static DLManagedTensorVersioned *view_make(void *data, DLDataType dt, int32_t ndim,
                                           const int64_t *shape, const int64_t *strides,
                                           uint64_t byte_offset, uint64_t flags, int *deleted)
{
        struct view *v = ndim <= 4 ? calloc(1, sizeof(*v)) : NULL;

        if (!v)
                return NULL;
        if (ndim)
                memcpy(v->shape, shape, (size_t)ndim * sizeof(int64_t));
        if (strides)
                memcpy(v->strides, strides, (size_t)ndim * sizeof(int64_t));
        v->deleted = deleted;
        v->mt.version.major = DLPACK_MAJOR_VERSION;
        v->mt.version.minor = DLPACK_MINOR_VERSION;
        v->mt.manager_ctx = v;
        v->mt.deleter = view_deleter;
        v->mt.flags = flags;
        v->mt.dl_tensor = (DLTensor){.data = data,
                                     .device = {kDLCPU, 0},
                                     .ndim = ndim,
                                     .dtype = dt,
                                     .shape = ndim ? v->shape : NULL,
                                     .strides = strides ? v->strides : NULL,
                                     .byte_offset = byte_offset};
        return &v->mt;
}

static DLManagedTensorVersioned *view_of(void *data, DLDataType dt, int32_t ndim,
                                         const int64_t *shape, const int64_t *strides,
                                         uint64_t byte_offset, uint64_t flags, int *deleted)
{
        DLManagedTensorVersioned *t =
                view_make(data, dt, ndim, shape, strides, byte_offset, flags, deleted);

        ck_assert_msg(t, "no view of %d dimensions", (int)ndim);
        return t;
}

static DLManagedTensorVersioned *vec_f32(float *data, int64_t n, int *deleted)
{
        return view_of(data, DT(kDLFloat, 32, 1), 1, &n, NULL, 0, 0, deleted);
}

static dlx_group *acquire_group_ok(dlx_client *c, const char *name, const char *const *names,
                                   size_t n, const struct dlx_acquire_options *o)
{
        dlx_group *g = NULL;
        int err = dlx_acquire_group(c, name, names, n, o, &g);
        ck_assert_msg(err == 0, "acquire group %s: %s (%s)", name, dlx_strerror(err),
                      dlx_last_error());
        ck_assert_ptr_nonnull(g);
        return g;
}

static float g_a[4] = {1, 2, 3, 4}, g_b[4] = {5, 6, 7, 8};

/* publishes {"a": g_a, "b": g_b} (copied) as a new version of name */
static uint64_t publish_ab(dlx_client *p, const char *name, const struct dlx_publish_options *o)
{
        struct dlx_member ms[] = {{"a", vec_f32(g_a, 4, NULL)}, {"b", vec_f32(g_b, 4, NULL)}};
        uint64_t v = 0;
        DLXV(dlx_publish_group(p, name, ms, 2, o, &v));
        return v;
}

static bool name_visible(dlx_client *c, const char *name)
{
        struct dlx_info info;
        int err = dlx_stat(c, name, &info);
        ck_assert_msg(err == 0 || err == -ENOENT, "stat: %s", dlx_strerror(err));
        return err == 0;
}

static int count_cb(void *ctx, const struct dlx_info *info)
{
        (void)info;
        ++*(int *)ctx;
        return 0;
}

static int list_count(dlx_client *c, const char *prefix)
{
        int n = 0;
        int r = dlx_list(c, prefix, count_cb, &n);
        ck_assert_int_ge(r, 0);
        return n;
}

/* ---- subset acquire --------------------------------------------------------------------- */

/* dlx.h: "A name listed twice is in the group twice." */
START_TEST(subset_duplicate_name_twice)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        const char *want[] = {"b", "a", "b"};

        publish_ab(p, "dup", NULL);
        dlx_group *g = acquire_group_ok(q, "dup", want, 3, NULL);
        ck_assert_uint_eq(dlx_group_count(g), 3);
        ck_assert_str_eq(dlx_group_name(g, 0), "b");
        ck_assert_str_eq(dlx_group_name(g, 1), "a");
        ck_assert_str_eq(dlx_group_name(g, 2), "b");
        ck_assert_ptr_eq(dlx_group_tensor(g, 0)->data, dlx_group_tensor(g, 2)->data);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 2)->data)[3], 8);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 1)->data)[0], 1);
        ck_assert_uint_eq(fx_stats(q).leases, 1);
        dlx_group_release(g);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A NULL among member_names is -EINVAL; a listed name not in the group -ENOENT naming it. */
START_TEST(subset_bad_lists)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        const char *with_null[] = {"a", NULL};
        const char *missing[] = {"a", "nothere"};
        const char *missing_wait[] = {"nothere2"};
        struct dlx_acquire_options wait = {.timeout_ms = 300};
        dlx_group *g = NULL;

        publish_ab(p, "bad", NULL);
        ck_assert_int_eq(dlx_acquire_group(q, "bad", with_null, 2, NULL, &g), -EINVAL);
        ck_assert_ptr_null(g);
        ck_assert_int_eq(dlx_acquire_group(q, "bad", missing, 2, NULL, &g), -ENOENT);
        ck_assert_ptr_null(g);
        ck_assert_ptr_nonnull(strstr(dlx_last_error(), "nothere"));
        /* with a wait asked: the member is not in the group either way */
        int r = dlx_acquire_group(q, "bad", missing_wait, 1, &wait, &g);
        ck_assert_msg(r == -ENOENT, "missing member with a wait: %s (%s)", dlx_strerror(r),
                      dlx_last_error());
        ck_assert_ptr_null(g);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- waiting: timeout_ms and min_version ------------------------------------------------- */

struct later {
        const char *name;
        int delay_ms;
        int kind; /* 0: group, 1: tensor */
};

static void *publish_later(void *arg)
{
        struct later *l = arg;
        dlx_client *p = fx_connect(&fx, "later");
        struct dlx_publish_options persist = {.persist = true};

        fx_sleep_ms(l->delay_ms);
        if (l->kind == 0)
                publish_ab(p, l->name, &persist);
        else
                publish_ok(p, l->name, fx_vec_f32(p, 4, 0), &persist, NULL);
        dlx_close(p);
        return NULL;
}

/* A group not yet published is waited for. */
START_TEST(wait_for_unpublished_group)
{
        dlx_client *q = fx_connect(&fx, "q");
        struct dlx_acquire_options wait = {.timeout_ms = 10000};
        struct later l = {"later", 300, 0};
        pthread_t th;
        dlx_group *g = NULL;

        ck_assert_int_eq(dlx_acquire_group(q, "later", NULL, 0, NULL, &g), -ENOENT);
        ck_assert_int_eq(pthread_create(&th, NULL, publish_later, &l), 0);
        int64_t t0 = fx_now_ms();
        g = acquire_group_ok(q, "later", NULL, 0, &wait);
        ck_assert_int_lt(fx_now_ms() - t0, 5000);
        ck_assert_uint_eq(dlx_group_version(g), 1);
        ck_assert_uint_eq(dlx_group_count(g), 2);
        dlx_group_release(g);
        pthread_join(th, NULL);
        /* a subset, waited for, too */
        const char *want[] = {"b"};
        struct later l2 = {"later2", 300, 0};
        ck_assert_int_eq(pthread_create(&th, NULL, publish_later, &l2), 0);
        g = acquire_group_ok(q, "later2", want, 1, &wait);
        ck_assert_uint_eq(dlx_group_count(g), 1);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 0)->data)[0], 5);
        dlx_group_release(g);
        pthread_join(th, NULL);
        dlx_close(q);
}
END_TEST

/* min_version: not there and no wait is -ENOENT; a later version is waited for; a timeout is
 * -ETIMEDOUT after about timeout_ms. */
START_TEST(min_version_semantics)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        dlx_group *g = NULL;

        ck_assert_uint_eq(publish_ab(p, "mv", NULL), 1);
        struct dlx_acquire_options now = {.min_version = 2};
        ck_assert_int_eq(dlx_acquire_group(q, "mv", NULL, 0, &now, &g), -ENOENT);
        ck_assert_ptr_null(g);
        struct dlx_acquire_options brief = {.min_version = 2, .timeout_ms = 300};
        int64_t t0 = fx_now_ms();
        ck_assert_int_eq(dlx_acquire_group(q, "mv", NULL, 0, &brief, &g), -ETIMEDOUT);
        int64_t took = fx_now_ms() - t0;
        ck_assert_msg(took >= 250 && took < 3000, "timed out after %" PRId64 " ms", took);
        ck_assert_ptr_null(g);
        /* min_version 1 with v1 there: at once */
        struct dlx_acquire_options one = {.min_version = 1};
        g = acquire_group_ok(q, "mv", NULL, 0, &one);
        ck_assert_uint_eq(dlx_group_version(g), 1);
        dlx_group_release(g);

        struct later l = {"mv", 300, 0};
        pthread_t th;
        ck_assert_int_eq(pthread_create(&th, NULL, publish_later, &l), 0);
        struct dlx_acquire_options forever = {.min_version = 2, .timeout_ms = -1};
        g = acquire_group_ok(q, "mv", NULL, 0, &forever);
        ck_assert_uint_eq(dlx_group_version(g), 2);
        dlx_group_release(g);
        pthread_join(th, NULL);
        /* a leases count of 0 in the end */
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* Waiting for a group under a name that then gets a tensor: -ENOTDIR; and a tensor wait that
 * gets a group: -EISDIR. Neither waits out its timeout nor hands out the wrong kind. */
START_TEST(wait_sees_wrong_kind)
{
        dlx_client *q = fx_connect(&fx, "q");
        struct dlx_acquire_options wait = {.timeout_ms = 3000};
        pthread_t th;
        dlx_group *g = NULL;
        DLManagedTensorVersioned *t = NULL;

        struct later l = {"kind1", 200, 1};
        ck_assert_int_eq(pthread_create(&th, NULL, publish_later, &l), 0);
        int64_t t0 = fx_now_ms();
        int r = dlx_acquire_group(q, "kind1", NULL, 0, &wait, &g);
        int64_t took = fx_now_ms() - t0;
        pthread_join(th, NULL);
        ck_assert_msg(r == -ENOTDIR, "group wait got a tensor: %s (%s) after %" PRId64 " ms",
                      dlx_strerror(r), dlx_last_error(), took);
        ck_assert_int_lt(took, 2500);

        struct later l2 = {"kind2", 200, 0};
        ck_assert_int_eq(pthread_create(&th, NULL, publish_later, &l2), 0);
        t0 = fx_now_ms();
        r = dlx_acquire(q, "kind2", &wait, &t);
        took = fx_now_ms() - t0;
        pthread_join(th, NULL);
        ck_assert_msg(r == -EISDIR, "tensor wait got a group: %s (%s) after %" PRId64 " ms",
                      dlx_strerror(r), dlx_last_error(), took);
        ck_assert_int_lt(took, 2500);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
}
END_TEST

/* ---- lifetimes ---------------------------------------------------------------------------- */

/* Unpublished while leased: the held version stays readable, and new acquires fail. */
START_TEST(unpublish_while_leased)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        dlx_group *g = NULL, *g2 = NULL;

        publish_ab(p, "up", NULL);
        g = acquire_group_ok(q, "up", NULL, 0, NULL);
        DLXV(dlx_unpublish(p, "up"));
        ck_assert(!name_visible(q, "up"));
        ck_assert_int_eq(dlx_acquire_group(q, "up", NULL, 0, NULL, &g2), -ENOENT);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 1)->data)[3], 8);
        dlx_group_release(g);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        struct dlx_stats s = fx_stats(q);
        for (int i = 0; i < 200 && s.segments; i++) {
                fx_sleep_ms(10);
                s = fx_stats(q);
        }
        ck_assert_uint_eq(s.segments, 0);
        ck_assert_uint_eq(s.bytes, 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A group held across dlx_close() of its client: close says acquired things stay valid. */
START_TEST(group_outlives_close)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        struct dlx_info info;

        publish_ab(p, "oc", NULL);
        dlx_group *g = acquire_group_ok(q, "oc", NULL, 0, NULL);
        dlx_close(q);
        ck_assert_uint_eq(dlx_group_count(g), 2);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 0)->data)[2], 3);
        DLXV(dlx_stat(p, "oc", &info));
        ck_assert_uint_eq(info.leases, 1);
        DLManagedTensorVersioned *t = NULL;
        DLXV(dlx_group_take(g, 1, &t));
        dlx_group_release(g);
        ck_assert_float_eq(((const float *)t->dl_tensor.data)[0], 5);
        t->deleter(t);
        for (int i = 0; i < 300; i++) {
                DLXV(dlx_stat(p, "oc", &info));
                if (!info.leases)
                        break;
                fx_sleep_ms(10);
        }
        ck_assert_uint_eq(info.leases, 0);
        dlx_close(p);
}
END_TEST

/* A forked child reads the parent's group; the parent's lease is not the child's to end. */
START_TEST(fork_after_acquire)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        struct dlx_info info;

        publish_ab(p, "fk", NULL);
        dlx_group *g = acquire_group_ok(q, "fk", NULL, 0, NULL);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int bad = 0;
                if (((const float *)dlx_group_tensor(g, 1)->data)[1] != 6)
                        bad = 1;
                dlx_group *g2 = NULL;
                if (dlx_acquire_group(q, "fk", NULL, 0, NULL, &g2) != -ESTALE)
                        bad = 2;
                dlx_group_release(g);
                dlx_close(q);
                fx_child_exit(bad);
        }
        ck_assert_int_eq(fx_wait(pid), 0);
        fx_sleep_ms(100);
        DLXV(dlx_stat(p, "fk", &info));
        ck_assert_uint_eq(info.leases, 1);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 0)->data)[0], 1);
        dlx_group_release(g);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* An older version stays readable, whole, while held, after newer ones replaced it. */
START_TEST(old_version_held)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        float x[2] = {10, 11};
        struct dlx_info info;

        publish_ab(p, "ov", NULL);
        dlx_group *g = acquire_group_ok(q, "ov", NULL, 0, NULL);
        struct dlx_member m = {"a", vec_f32(x, 2, NULL)};
        DLXV(dlx_publish_group(p, "ov", &m, 1, NULL, NULL));
        DLXV(dlx_stat(q, "ov", &info));
        ck_assert_uint_eq(info.version, 2);
        ck_assert_uint_eq(info.members, 1);
        ck_assert_uint_eq(info.live_versions, 2);
        ck_assert_uint_eq(dlx_group_count(g), 2);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 1)->data)[3], 8);
        dlx_group_release(g);
        for (int i = 0; i < 300; i++) {
                DLXV(dlx_stat(q, "ov", &info));
                if (info.live_versions == 1)
                        break;
                fx_sleep_ms(10);
        }
        ck_assert_uint_eq(info.live_versions, 1);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A non-persistent group goes with its publisher, a persistent one stays. */
START_TEST(persist_and_not)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        struct dlx_publish_options persist = {.persist = true};
        struct dlx_info info;

        publish_ab(p, "gone", NULL);
        publish_ab(p, "kept", &persist);
        dlx_close(p);
        ck_assert(!name_visible(q, "gone"));
        DLXV(dlx_stat(q, "kept", &info));
        ck_assert(info.persist);
        ck_assert_uint_eq(info.members, 2);
        dlx_group *g = acquire_group_ok(q, "kept", NULL, 0, NULL);
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 0)->data)[3], 4);
        dlx_group_release(g);
        dlx_close(q);
}
END_TEST

/* ---- watches and tracks ------------------------------------------------------------------- */

/* One event per group version: published, replaced, unpublished; a group replacing a tensor is
 * one "replaced". */
START_TEST(watch_one_event_per_version)
{
        dlx_client *p = fx_connect(&fx, "p"), *w = fx_connect(&fx, "w");
        struct dlx_event ev;

        DLXV(dlx_watch(w, "wg", NULL));
        /* a big group: 2000 members */
        enum { N = 2000 };
        static float vals[N];
        static char names[N][16];
        struct dlx_member *ms = calloc(N, sizeof(*ms));
        ck_assert_ptr_nonnull(ms);
        for (int i = 0; i < N; i++) {
                snprintf(names[i], sizeof(names[i]), "layer.%d.w", i);
                vals[i] = (float)i;
                ms[i] = (struct dlx_member){names[i], vec_f32(&vals[i], 1, NULL)};
        }
        DLXV(dlx_publish_group(p, "wg/model", ms, N, NULL, NULL));
        publish_ab(p, "wg/model", NULL);
        DLXV(dlx_unpublish(p, "wg/model"));
        publish_ok(p, "wg/t", fx_vec_f32(p, 4, 0), NULL, NULL);
        publish_ab(p, "wg/t", NULL);

        const struct {
                enum dlx_event_kind kind;
                const char *name;
                uint64_t version;
        } want[] = {
                {DLX_EVENT_PUBLISHED, "wg/model", 1},   {DLX_EVENT_REPLACED, "wg/model", 2},
                {DLX_EVENT_UNPUBLISHED, "wg/model", 0}, {DLX_EVENT_PUBLISHED, "wg/t", 1},
                {DLX_EVENT_REPLACED, "wg/t", 2},
        };
        for (size_t i = 0; i < N_ELEMS(want); i++) {
                DLXV(dlx_next_event(w, &ev, 5000));
                ck_assert_msg(ev.kind == want[i].kind && !strcmp(ev.name, want[i].name),
                              "event %zu: kind %d name %s v%" PRIu64, i, ev.kind, ev.name,
                              ev.version);
                if (want[i].version)
                        ck_assert_uint_eq(ev.version, want[i].version);
        }
        ck_assert_int_eq(dlx_next_event(w, &ev, 300), -ETIMEDOUT);
        free(ms);
        dlx_close(w);
        dlx_close(p);
}
END_TEST

/* Tracks see one version per group version. */
START_TEST(track_sees_group_versions)
{
        dlx_client *p = fx_connect(&fx, "p"), *w = fx_connect(&fx, "w");
        uint32_t tr = track_ok(w, "tg");

        ck_assert_uint_eq(tracked_version(w, tr), 0);
        publish_ab(p, "tg", NULL);
        ck_assert_uint_eq(tracked_version(w, tr), 1);
        publish_ab(p, "tg", NULL);
        ck_assert_uint_eq(tracked_version(w, tr), 2);
        DLXV(dlx_unpublish(p, "tg"));
        ck_assert_uint_eq(tracked_version(w, tr), 0);
        DLXV(dlx_untrack(w, tr));
        dlx_close(w);
        dlx_close(p);
}
END_TEST

/* ---- stat and list ----------------------------------------------------------------------- */

/* dlx.h dlx_info.members: "A group is described as its data: dtype uint8, ndim 1, nbytes the
 * bytes its members' data takes (storage they share counted once)." Members are 64 bytes each
 * here, so no alignment question arises. Member names make no names of their own. */
START_TEST(stat_list_members_and_bytes)
{
        dlx_client *p = fx_connect(&fx, "p");
        /* 64-byte aligned, 64 bytes each: no padding question either way */
        float *w = aligned_alloc(64, 64), *x = aligned_alloc(64, 64);
        memset(w, 0, 64);
        memset(x, 0, 64);
        struct dlx_member ms[] = {
                {"w", vec_f32(w, 16, NULL)},
                {"x", vec_f32(x, 16, NULL)},
                {"tied", vec_f32(w, 16, NULL)},
        };
        struct dlx_info info;

        DLXV(dlx_publish_group(p, "sl", ms, 3, NULL, NULL));
        DLXV(dlx_stat(p, "sl", &info));
        ck_assert_uint_eq(info.members, 3);
        ck_assert_uint_eq(info.dtype.code, kDLUInt);
        ck_assert_uint_eq(info.dtype.bits, 8);
        ck_assert_int_eq(info.ndim, 1);
        ck_assert_uint_eq(info.nbytes, 128);
        ck_assert_int_eq(info.shape[0], 128);
        ck_assert(info.flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert_int_eq(list_count(p, "sl"), 1);
        ck_assert(!name_visible(p, "w"));
        ck_assert(!name_visible(p, "sl/w"));
        free(w);
        free(x);
        dlx_close(p);
}
END_TEST

/*
 * nbytes for members of odd sizes: "the bytes its members' data takes ... with
 * the padding between pieces that lay apart: a copied piece keeps the
 * alignment its source had, up to 64 bytes".
 */
START_TEST(stat_nbytes_small_members)
{
        dlx_client *p = fx_connect(&fx, "p");
        enum { N = 100 };
        static uint8_t bytes[N];
        static char names[N][8];
        void *heap[N];
        struct dlx_member ms[N];
        struct dlx_info info;
        int64_t one = 1;

        for (int i = 0; i < N; i++) {
                snprintf(names[i], sizeof(names[i]), "m%03d", i);
                /* separate bytes that do not touch */
                heap[i] = calloc(1, 1); /* copied: defined bytes */
                ms[i] = (struct dlx_member){
                        names[i], view_of(heap[i], DT(kDLUInt, 8, 1), 1, &one, NULL, 0, 0, NULL)};
        }
        (void)bytes;
        DLXV(dlx_publish_group(p, "small", ms, N, NULL, NULL));
        DLXV(dlx_stat(p, "small", &info));
        ck_assert_uint_eq(info.members, N);
        ck_assert_msg(info.nbytes >= N && info.nbytes <= 64 * N,
                      "100 one-byte members: nbytes %" PRIu64, info.nbytes);
        for (int i = 0; i < N; i++)
                free(heap[i]); /* copied: the group does not need them */
        dlx_close(p);
}
END_TEST

/* ---- layout ------------------------------------------------------------------------------- */

/* Every DLPack 1.3 dtype crosses as a group member with its layout and bytes. */
START_TEST(every_dtype_as_member)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        static const struct {
                const char *name;
                DLDataType dt;
                uint64_t flags;
        } rows[] = {
                {"i8", DT(kDLInt, 8, 1), 0},
                {"i16", DT(kDLInt, 16, 1), 0},
                {"i32", DT(kDLInt, 32, 1), 0},
                {"i64", DT(kDLInt, 64, 1), 0},
                {"u8", DT(kDLUInt, 8, 1), 0},
                {"u16", DT(kDLUInt, 16, 1), 0},
                {"u32", DT(kDLUInt, 32, 1), 0},
                {"u64", DT(kDLUInt, 64, 1), 0},
                {"f16", DT(kDLFloat, 16, 1), 0},
                {"f32", DT(kDLFloat, 32, 1), 0},
                {"f64", DT(kDLFloat, 64, 1), 0},
                {"bf16", DT(kDLBfloat, 16, 1), 0},
                {"bool", DT(kDLBool, 8, 1), 0},
                {"c64", DT(kDLComplex, 64, 1), 0},
                {"c128", DT(kDLComplex, 128, 1), 0},
                {"e3m4", DT(kDLFloat8_e3m4, 8, 1), 0},
                {"e4m3", DT(kDLFloat8_e4m3, 8, 1), 0},
                {"e4m3b11", DT(kDLFloat8_e4m3b11fnuz, 8, 1), 0},
                {"e4m3fn", DT(kDLFloat8_e4m3fn, 8, 1), 0},
                {"e4m3fnuz", DT(kDLFloat8_e4m3fnuz, 8, 1), 0},
                {"e5m2", DT(kDLFloat8_e5m2, 8, 1), 0},
                {"e5m2fnuz", DT(kDLFloat8_e5m2fnuz, 8, 1), 0},
                {"e8m0", DT(kDLFloat8_e8m0fnu, 8, 1), 0},
                {"f6a", DT(kDLFloat6_e2m3fn, 6, 1), 0},
                {"f6b", DT(kDLFloat6_e3m2fn, 6, 1), 0},
                {"f4", DT(kDLFloat4_e2m1fn, 4, 1), 0},
                {"f4pad", DT(kDLFloat4_e2m1fn, 4, 1), DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED},
                {"i16x4", DT(kDLInt, 16, 4), 0},
                {"f32x2", DT(kDLFloat, 32, 2), 0},
        };
        const size_t n = N_ELEMS(rows);
        struct dlx_member ms[N_ELEMS(rows)];
        int64_t shape[2] = {3, 5};

        for (size_t i = 0; i < n; i++) {
                struct owned *o =
                        owned_compact(rows[i].dt, 2, shape, rows[i].flags, (uint8_t)(i + 3));
                ms[i] = (struct dlx_member){rows[i].name, &o->mt};
        }
        DLXV(dlx_publish_group(p, "dt", ms, n, NULL, NULL));
        dlx_group *g = acquire_group_ok(q, "dt", NULL, 0, NULL);
        for (size_t i = 0; i < n; i++) {
                int64_t k = dlx_group_find(g, rows[i].name);
                ck_assert_int_ge(k, 0);
                const DLTensor *t = dlx_group_tensor(g, (size_t)k);
                ck_assert_msg(!memcmp(&t->dtype, &rows[i].dt, sizeof(DLDataType)),
                              "%s: dtype %u/%u/%u", rows[i].name, t->dtype.code, t->dtype.bits,
                              t->dtype.lanes);
                ck_assert_int_eq(t->ndim, 2);
                ck_assert_int_eq(t->shape[0], 3);
                ck_assert_int_eq(t->shape[1], 5);
                DLManagedTensorVersioned *mt = NULL;
                DLXV(dlx_group_take(g, (size_t)k, &mt));
                ck_assert(mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
                ck_assert_msg((mt->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) ==
                                      rows[i].flags,
                              "%s: flags %#" PRIx64 ", published with %#" PRIx64, rows[i].name,
                              mt->flags, rows[i].flags);
                ck_assert_msg(pattern_check(&mt->dl_tensor, mt->flags, (uint8_t)(i + 3)) == 0,
                              "%s: bytes differ", rows[i].name);
                mt->deleter(mt);
        }
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* Members that share storage in several ways stay shared (same address of the same bytes). */
START_TEST(tied_in_odd_ways)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        float *buf = malloc(64 * sizeof(float));
        ck_assert_ptr_nonnull(buf);
        for (int i = 0; i < 64; i++)
                buf[i] = (float)i;
        int64_t n64 = 64, s88[2] = {8, 8}, tr[2] = {1, 8}, rev = -1, n256 = 256;
        /* base: 64 floats; t: its transpose; r: reversed view; o: the same bytes through a
         * byte_offset; u8: the bytes as uint8 */
        struct dlx_member ms[] = {
                {"base", vec_f32(buf, 64, NULL)},
                {"t", view_of(buf, DT(kDLFloat, 32, 1), 2, s88, tr, 0, 0, NULL)},
                {"r", view_of(buf + 63, DT(kDLFloat, 32, 1), 1, &n64, &rev, 0, 0, NULL)},
                {"o",
                 view_of((char *)buf - 4096, DT(kDLFloat, 32, 1), 1, &n64, NULL, 4096, 0, NULL)},
                {"u8", view_of(buf, DT(kDLUInt, 8, 1), 1, &n256, NULL, 0, 0, NULL)},
        };
        DLXV(dlx_publish_group(p, "odd", ms, N_ELEMS(ms), NULL, NULL));
        free(buf);
        dlx_group *g = acquire_group_ok(q, "odd", NULL, 0, NULL);
#define ADDR(nm)                                                                                   \
        ((const char *)dlx_group_tensor(g, (size_t)dlx_group_find(g, nm))->data +                  \
         dlx_group_tensor(g, (size_t)dlx_group_find(g, nm))->byte_offset)
        const char *base = ADDR("base");
        ck_assert_ptr_eq(ADDR("t"), base);
        ck_assert_ptr_eq(ADDR("r"), base + 63 * 4);
        ck_assert_ptr_eq(ADDR("o"), base);
        ck_assert_ptr_eq(ADDR("u8"), base);
        const DLTensor *t = dlx_group_tensor(g, (size_t)dlx_group_find(g, "t"));
        ck_assert_ptr_nonnull(t->strides);
        ck_assert_int_eq(t->strides[0], 1);
        ck_assert_int_eq(t->strides[1], 8);
        const DLTensor *r = dlx_group_tensor(g, (size_t)dlx_group_find(g, "r"));
        ck_assert_int_eq(r->strides[0], -1);
        ck_assert_float_eq(((const float *)base)[63], 63);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* Zero-size members (NULL data) beside others, and a zero-size member alone. */
START_TEST(zero_size_members)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        int64_t z[2] = {0, 7};
        struct dlx_member ms[] = {
                {"empty", view_of(NULL, DT(kDLFloat, 32, 1), 2, z, NULL, 0, 0, NULL)},
                {"a", vec_f32(g_a, 4, NULL)},
        };
        DLXV(dlx_publish_group(p, "zs", ms, 2, NULL, NULL));
        struct dlx_member only = {"e", view_of(NULL, DT(kDLInt, 8, 1), 2, z, NULL, 0, 0, NULL)};
        DLXV(dlx_publish_group(p, "zs1", &only, 1, NULL, NULL));
        dlx_group *g = acquire_group_ok(q, "zs", NULL, 0, NULL);
        const DLTensor *t = dlx_group_tensor(g, (size_t)dlx_group_find(g, "empty"));
        ck_assert_int_eq(t->shape[0], 0);
        ck_assert_int_eq(t->shape[1], 7);
        dlx_group_release(g);
        g = acquire_group_ok(q, "zs1", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_count(g), 1);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- refused publishes leave nothing ------------------------------------------------------ */

START_TEST(refusals_leave_nothing)
{
        dlx_client *p = fx_connect(&fx, "p");
        int deleted = 0;
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        struct dlx_publish_options writable = {.writable = true};
        char longname[300];

        memset(longname, 'x', sizeof(longname));
        longname[256] = 0;
        struct {
                const char *group;
                const char *m0, *m1;
                const struct dlx_publish_options *o;
                int err;
        } rows[] = {
                {"r1", "a", "a", NULL, -EINVAL},      {"r2", "a", "", NULL, -EINVAL},
                {"r3", "a", "x//y", NULL, -EINVAL},   {"r4", "a", "..", NULL, -EINVAL},
                {"r5", "a", longname, NULL, -EINVAL}, {"r6", "a", "b\x01", NULL, -EINVAL},
                {"r7", "a", "b", &never, -EXDEV},     {"r8", "a", "b", &writable, -ENOTSUP},
                {"", "a", "b", NULL, -EINVAL},        {"r9/", "a", "b", NULL, -EINVAL},
        };
        for (size_t i = 0; i < N_ELEMS(rows); i++) {
                deleted = 0;
                struct dlx_member ms[] = {{rows[i].m0, vec_f32(g_a, 4, &deleted)},
                                          {rows[i].m1, vec_f32(g_b, 4, &deleted)}};
                int r = dlx_publish_group(p, rows[i].group, ms, 2, rows[i].o, NULL);
                ck_assert_msg(r == rows[i].err, "row %zu: %s, expected %s", i, dlx_strerror(r),
                              dlx_strerror(rows[i].err));
                ck_assert_int_eq(deleted, 2);
                ck_assert_ptr_null(ms[0].tensor);
                ck_assert_ptr_null(ms[1].tensor);
        }
        /* a member that is refused (bad dtype, NULL data) */
        deleted = 0;
        int64_t four = 4;
        struct dlx_member bad[] = {
                {"a", vec_f32(g_a, 4, &deleted)},
                {"b", view_of(g_b, DT(kDLFloat, 7, 1), 1, &four, NULL, 0, 0, &deleted)}};
        ck_assert_int_eq(dlx_publish_group(p, "rb", bad, 2, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleted, 2);
        deleted = 0;
        struct dlx_member bad2[] = {
                {"a", vec_f32(g_a, 4, &deleted)},
                {"b", view_of(NULL, DT(kDLFloat, 32, 1), 1, &four, NULL, 0, 0, &deleted)}};
        ck_assert_int_eq(dlx_publish_group(p, "rb", bad2, 2, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleted, 2);
        /* a member on another device */
        deleted = 0;
        DLManagedTensorVersioned *odd = vec_f32(g_b, 4, &deleted);
        odd->dl_tensor.device.device_type = kDLOpenCL;
        struct dlx_member bad3[] = {{"a", vec_f32(g_a, 4, &deleted)}, {"b", odd}};
        ck_assert_int_eq(dlx_publish_group(p, "rb", bad3, 2, NULL, NULL), -ENOTSUP);
        ck_assert_int_eq(deleted, 2);
        ck_assert_int_eq(dlx_publish_group(p, "rb", NULL, 0, NULL, NULL), -EINVAL);

        ck_assert_int_eq(list_count(p, ""), 0);
        struct dlx_stats s = fx_stats(p);
        ck_assert_uint_eq(s.names, 0);
        ck_assert_uint_eq(s.segments, 0);
        ck_assert_uint_eq(s.bytes, 0);
        dlx_close(p);
}
END_TEST

/* A refused publish over an existing group leaves its version as it was. */
START_TEST(refusal_keeps_old_version)
{
        dlx_client *p = fx_connect(&fx, "p");
        struct dlx_info info;

        publish_ab(p, "keep", NULL);
        struct dlx_member ms[] = {{"a", vec_f32(g_a, 4, NULL)}, {"a", vec_f32(g_b, 4, NULL)}};
        ck_assert_int_eq(dlx_publish_group(p, "keep", ms, 2, NULL, NULL), -EINVAL);
        DLXV(dlx_stat(p, "keep", &info));
        ck_assert_uint_eq(info.version, 1);
        ck_assert_uint_eq(info.members, 2);
        uint64_t v = publish_ab(p, "keep", NULL);
        ck_assert_uint_eq(v, 2);
        dlx_close(p);
}
END_TEST

/* Member names of 255 bytes and '/'-separated state-dict keys are fine. */
START_TEST(member_name_edges)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        char n255[256];

        memset(n255, 'y', 255);
        n255[255] = 0;
        struct dlx_member ms[] = {{n255, vec_f32(g_a, 4, NULL)},
                                  {"layers.0/attn.weight", vec_f32(g_b, 4, NULL)},
                                  {"\xc3\xa9t\xc3\xa9", vec_f32(g_b, 2, NULL)}};
        DLXV(dlx_publish_group(p, "ne", ms, 3, NULL, NULL));
        const char *want[] = {n255, "\xc3\xa9t\xc3\xa9"};
        dlx_group *g = acquire_group_ok(q, "ne", want, 2, NULL);
        ck_assert_str_eq(dlx_group_name(g, 0), n255);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* One descriptor at most per acquire, none for a second acquire of the same version. */
START_TEST(descriptors_per_acquire)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        enum { N = 500 };
        static float vals[N];
        static char names[N][8];
        struct dlx_member ms[N];

        for (int i = 0; i < N; i++) {
                snprintf(names[i], sizeof(names[i]), "m%d", i);
                ms[i] = (struct dlx_member){names[i], vec_f32(&vals[i], 1, NULL)};
        }
        DLXV(dlx_publish_group(p, "fds", ms, N, NULL, NULL));
        int before = count_fds(0);
        dlx_group *g = acquire_group_ok(q, "fds", NULL, 0, NULL);
        int after1 = count_fds(0);
        dlx_group *g2 = acquire_group_ok(q, "fds", NULL, 0, NULL);
        int after2 = count_fds(0);
        ck_assert_int_le(after1 - before, 1);
        ck_assert_int_eq(after2, after1);
        ck_assert_uint_eq(fx_stats(q).leases, 2);
        dlx_group_release(g);
        dlx_group_release(g2);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- allocated groups ---------------------------------------------------------------------- */

START_TEST(group_alloc_edges)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        static const int64_t s3[1] = {3}, s0[2] = {4, 0};
        const struct dlx_member_layout ls[] = {
                {"b", DT(kDLBool, 8, 1), 1, s3},
                {"z", DT(kDLFloat, 32, 1), 2, s0},
                {"s", DT(kDLComplex, 128, 1), 0, NULL},
                {"bf", DT(kDLBfloat, 16, 1), 1, s3},
        };
        dlx_group *g = NULL, *acq = NULL;
        uint64_t v = 0;

        DLXV(dlx_group_alloc(p, ls, N_ELEMS(ls), &g));
        ck_assert_uint_eq(dlx_group_count(g), 4);
        for (size_t i = 0; i < 4; i++) {
                const DLTensor *t = dlx_group_tensor(g, i);
                ck_assert_uint_eq((uintptr_t)((const char *)t->data + t->byte_offset) % 64, 0);
        }
        /* name order: b bf s z */
        ck_assert_str_eq(dlx_group_name(g, 0), "b");
        ck_assert_str_eq(dlx_group_name(g, 3), "z");
        uint8_t *b = dlx_group_tensor(g, 0)->data;
        b[0] = 1, b[2] = 1;
        double *s = dlx_group_tensor(g, 2)->data;
        s[0] = 1.5, s[1] = -2.5;
        DLXV(dlx_group_publish(p, "ga", g, NULL, &v));
        ck_assert_uint_eq(v, 1);
        DLXV(dlx_group_publish(p, "ga2", g, NULL, &v));
        ck_assert_uint_eq(v, 1);
        ck_assert_uint_eq(dlx_group_version(g), 1);
        acq = acquire_group_ok(q, "ga2", NULL, 0, NULL);
        const double *s2 = dlx_group_tensor(acq, (size_t)dlx_group_find(acq, "s"))->data;
        ck_assert(s2[0] == 1.5 && s2[1] == -2.5);
        const uint8_t *b2 = dlx_group_tensor(acq, (size_t)dlx_group_find(acq, "b"))->data;
        ck_assert(b2[0] == 1 && b2[1] == 0 && b2[2] == 1);
        /* an acquired group is not one from dlx_group_alloc() */
        ck_assert_int_eq(dlx_group_publish(q, "ga3", acq, NULL, NULL), -EINVAL);
        ck_assert(!name_visible(q, "ga3"));
        /* copy always is refused */
        struct dlx_publish_options always = {.copy = DLX_COPY_ALWAYS};
        ck_assert_int_eq(dlx_group_publish(p, "ga4", g, &always, NULL), -EINVAL);
        ck_assert(!name_visible(q, "ga4"));
        dlx_group_release(acq);
        dlx_group_release(g);
        /* refusals */
        const struct dlx_member_layout dup[] = {{"a", DT(kDLBool, 8, 1), 1, s3},
                                                {"a", DT(kDLBool, 8, 1), 1, s3}};
        g = NULL;
        ck_assert_int_eq(dlx_group_alloc(p, dup, 2, &g), -EINVAL);
        ck_assert_int_eq(dlx_group_alloc(p, dup, 0, &g), -EINVAL);
        const int64_t neg[1] = {-1};
        const struct dlx_member_layout bad[] = {{"a", DT(kDLBool, 8, 1), 1, neg}};
        ck_assert_int_eq(dlx_group_alloc(p, bad, 1, &g), -EINVAL);
        const int64_t huge[2] = {INT64_C(1) << 31, INT64_C(1) << 31};
        const struct dlx_member_layout big[] = {{"a", DT(kDLFloat, 64, 1), 2, huge}};
        ck_assert_int_eq(dlx_group_alloc(p, big, 1, &g), -EOVERFLOW);
        ck_assert_ptr_null(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* ---- limits -----------------------------------------------------------------------------------
 */

static void start_limited(void)
{
        static const char *const extra[] = {"--max-group-members", "4", "--max-group-table", "8192",
                                            NULL};
        dlxd_start(&fx, extra);
}

static void stop_limited(void)
{
        dlxd_stop(&fx);
}

START_TEST(configured_limits)
{
        dlx_client *p = fx_connect(&fx, "p");
        struct dlx_stats s = fx_stats(p);
        static float v[8];
        char names[8][8];
        struct dlx_member ms[8];
        int deleted = 0;
        dlx_group *g = NULL;

        ck_assert_uint_eq(s.limits.max_group_members, 4);
        ck_assert_uint_eq(s.limits.max_group_table, 8192);
        for (int i = 0; i < 5; i++) {
                snprintf(names[i], sizeof(names[i]), "m%d", i);
                ms[i] = (struct dlx_member){names[i], vec_f32(&v[i], 1, &deleted)};
        }
        ck_assert_int_eq(dlx_publish_group(p, "lim", ms, 5, NULL, NULL), -E2BIG);
        ck_assert_int_eq(deleted, 5);
        ck_assert(!name_visible(p, "lim"));
        for (int i = 0; i < 4; i++)
                ms[i] = (struct dlx_member){names[i], vec_f32(&v[i], 1, NULL)};
        DLXV(dlx_publish_group(p, "lim", ms, 4, NULL, NULL));
        /* a table too big: 4 members with 255-byte names and 32 dims fit 8 KiB? make sure not */
        char big[4][256];
        int64_t shape[32];
        for (int d = 0; d < 32; d++)
                shape[d] = 1;
        deleted = 0;
        for (int i = 0; i < 4; i++) {
                memset(big[i], 'a' + i, 255);
                big[i][255] = 0;
                struct owned *o = owned_compact(DT(kDLUInt, 8, 1), 32, shape, 0, 1);
                ms[i] = (struct dlx_member){big[i], &o->mt};
        }
        deleter_runs = 0;
        int r = dlx_publish_group(p, "lim2", ms, 4, NULL, NULL);
        /* the table of 4 x (255-byte name + 32 dims) is well under 8 KiB or over it: either is
         * fine, as long as over gives -E2BIG and nothing */
        ck_assert_msg(r == 0 || r == -E2BIG, "%s", dlx_strerror(r));
        if (r)
                ck_assert(!name_visible(p, "lim2"));
        static const int64_t s1[1] = {1};
        struct dlx_member_layout ls[5];
        for (int i = 0; i < 5; i++)
                ls[i] = (struct dlx_member_layout){names[i], DT(kDLUInt, 8, 1), 1, s1};
        ck_assert_int_eq(dlx_group_alloc(p, ls, 5, &g), -E2BIG);
        ck_assert_ptr_null(g);
        dlx_close(p);
}
END_TEST

/* ---- a publisher killed mid-publish --------------------------------------------------------- */

struct killme {
        int members;
};

/* Killed at a random moment: it makes no Check assertion (see view_make()). */
static int big_publisher(void *arg)
{
        struct killme *k = arg;
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "doomed"};
        dlx_client *p = NULL;
        struct dlx_publish_options persist = {.persist = true};
        struct dlx_member *ms = calloc((size_t)k->members, sizeof(*ms));
        char(*names)[16] = calloc((size_t)k->members, 16);
        float *vals = calloc((size_t)k->members, sizeof(float));
        int64_t one = 1;

        if (!ms || !names || !vals || dlx_connect(&o, &p) != 0)
                return 4;
        for (int round = 1;; round++) {
                for (int i = 0; i < k->members; i++) {
                        snprintf(names[i], 16, "w.%d", i);
                        vals[i] = (float)round;
                        ms[i] = (struct dlx_member){names[i],
                                                    view_make(&vals[i], DT(kDLFloat, 32, 1), 1,
                                                              &one, NULL, 0, 0, NULL)};
                        if (!ms[i].tensor)
                                return 5;
                }
                if (dlx_publish_group(p, "doomed", ms, (size_t)k->members, &persist, NULL))
                        return 3;
        }
        return 0;
}

START_TEST(killed_publisher_leaves_whole_or_nothing)
{
        dlx_client *q = fx_connect(&fx, "q");
        struct killme k = {200000};

        for (int attempt = 0; attempt < 6; attempt++) {
                pid_t pid = fx_spawn(big_publisher, &k);
                fx_sleep_ms(150 + 137 * attempt);
                kill(pid, SIGKILL);
                ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
                fx_wait_clients(q, 1, 5000);
                dlx_group *g = NULL;
                int r = dlx_acquire_group(q, "doomed", NULL, 0, NULL, &g);
                fprintf(stderr, "attempt %d: %s\n", attempt, r ? dlx_strerror(r) : "visible");
                if (r == -ENOENT)
                        continue;
                ck_assert_msg(r == 0, "%s", dlx_strerror(r));
                ck_assert_uint_eq(dlx_group_count(g), (size_t)k.members);
                float first = *(const float *)dlx_group_tensor(g, 0)->data;
                for (size_t i = 0; i < dlx_group_count(g); i++)
                        expect(*(const float *)dlx_group_tensor(g, i)->data == first,
                               "member %zu of v%" PRIu64, i, dlx_group_version(g));
                dlx_group_release(g);
        }
        /* and nothing leaked: remove it, the daemon holds nothing */
        dlx_unpublish(q, "doomed");
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        struct dlx_stats s = fx_stats(q);
        for (int i = 0; i < 300 && (s.segments || s.bytes); i++) {
                fx_sleep_ms(10);
                s = fx_stats(q);
        }
        ck_assert_uint_eq(s.segments, 0);
        ck_assert_uint_eq(s.bytes, 0);
        ck_assert_uint_eq(s.names, 0);
        dlx_close(q);
}
END_TEST

/* ---- batch 2 ------------------------------------------------------------------------------- */

/* An empty list (member_names non-NULL, count 0): whatever it gives, no crash, no lease kept. */
START_TEST(subset_empty_list)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        const char *none[] = {"a"};
        dlx_group *g = NULL;

        publish_ab(p, "empty", NULL);
        int r = dlx_acquire_group(q, "empty", none, 0, NULL, &g);
        fprintf(stderr, "empty subset: %s (%s) count %zu\n", r ? dlx_strerror(r) : "ok",
                dlx_last_error(), g ? dlx_group_count(g) : (size_t)-1);
        if (r == 0)
                dlx_group_release(g);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        g = NULL;
        ck_assert_int_eq(dlx_acquire_group(q, "empty", NULL, 0, NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_acquire_group(q, "", NULL, 0, NULL, &g), -EINVAL);
        ck_assert_int_eq(dlx_acquire_group(q, "a//b", NULL, 0, NULL, &g), -EINVAL);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* One tensor under two names that collide: -EINVAL, and its deleter runs once. */
START_TEST(same_tensor_dup_name_deleted_once)
{
        dlx_client *p = fx_connect(&fx, "p");
        int deleted = 0;
        DLManagedTensorVersioned *t = vec_f32(g_a, 4, &deleted);
        struct dlx_member ms[] = {{"x", t}, {"y", vec_f32(g_b, 4, &deleted)}, {"x", t}};

        ck_assert_int_eq(dlx_publish_group(p, "dd", ms, 3, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleted, 2);
        for (int i = 0; i < 3; i++)
                ck_assert_ptr_null(ms[i].tensor);
        /* and a NULL tensor among good ones */
        deleted = 0;
        struct dlx_member ms2[] = {{"x", vec_f32(g_a, 4, &deleted)}, {"y", NULL}};
        ck_assert_int_eq(dlx_publish_group(p, "dd", ms2, 2, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleted, 1);
        ck_assert(!name_visible(p, "dd"));
        dlx_close(p);
}
END_TEST

/* A broadcast member (stride 0) keeps its stride and its one element. */
START_TEST(broadcast_member)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        int64_t n = 1000, z = 0, sh2[2] = {3, 4}, st2[2] = {0, 1};
        struct dlx_member ms[] = {
                {"bc", view_of(&g_a[2], DT(kDLFloat, 32, 1), 1, &n, &z, 0, 0, NULL)},
                {"rows", view_of(g_b, DT(kDLFloat, 32, 1), 2, sh2, st2, 0, 0, NULL)},
        };
        struct dlx_info info;

        DLXV(dlx_publish_group(p, "bc", ms, 2, NULL, NULL));
        dlx_group *g = acquire_group_ok(q, "bc", NULL, 0, NULL);
        const DLTensor *t = dlx_group_tensor(g, (size_t)dlx_group_find(g, "bc"));
        ck_assert_int_eq(t->shape[0], 1000);
        ck_assert_ptr_nonnull(t->strides);
        ck_assert_int_eq(t->strides[0], 0);
        ck_assert_float_eq(*(const float *)((const char *)t->data + t->byte_offset), 3);
        t = dlx_group_tensor(g, (size_t)dlx_group_find(g, "rows"));
        ck_assert_int_eq(t->strides[0], 0);
        ck_assert_int_eq(t->strides[1], 1);
        const float *r = (const float *)((const char *)t->data + t->byte_offset);
        ck_assert_float_eq(r[3], 8);
        DLXV(dlx_stat(q, "bc", &info));
        ck_assert_uint_le(info.nbytes, 256);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A group's member names make no names: a watch or list of "grp/" sees nothing of them. */
START_TEST(member_names_make_no_names)
{
        dlx_client *p = fx_connect(&fx, "p"), *w = fx_connect(&fx, "w");
        struct dlx_event ev;
        struct dlx_member ms[] = {{"sub/a", vec_f32(g_a, 4, NULL)}, {"b", vec_f32(g_b, 4, NULL)}};

        DLXV(dlx_watch(w, "grp/", NULL));
        DLXV(dlx_publish_group(p, "grp", ms, 2, NULL, NULL));
        ck_assert_int_eq(dlx_next_event(w, &ev, 300), -ETIMEDOUT);
        ck_assert_int_eq(list_count(w, "grp/"), 0);
        ck_assert_int_eq(list_count(w, "grp"), 1);
        ck_assert(!name_visible(w, "grp/sub/a"));
        ck_assert(!name_visible(w, "sub/a"));
        /* a name below the group's is a name of its own */
        publish_ok(p, "grp/sub/a", fx_vec_f32(p, 2, 0), NULL, NULL);
        DLXV(dlx_next_event(w, &ev, 3000));
        ck_assert_str_eq(ev.name, "grp/sub/a");
        dlx_group *g = acquire_group_ok(w, "grp", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_count(g), 2);
        dlx_group_release(g);
        dlx_close(w);
        dlx_close(p);
}
END_TEST

/* Waiting through an unpublish: the wait goes on and gets the next publish. */
START_TEST(wait_across_unpublish)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        struct dlx_acquire_options wait = {.timeout_ms = 10000, .min_version = 3};
        pthread_t th;

        publish_ab(p, "wau", NULL);
        DLXV(dlx_unpublish(p, "wau"));
        struct later l = {"wau", 300, 0};
        ck_assert_int_eq(pthread_create(&th, NULL, publish_later, &l), 0);
        dlx_group *g = NULL;
        int r = dlx_acquire_group(q, "wau", NULL, 0, &wait, &g);
        pthread_join(th, NULL);
        /* versions after an unpublish: either the numbering goes on (2) or starts over (1) */
        struct dlx_info info;
        DLXV(dlx_stat(q, "wau", &info));
        fprintf(stderr, "republished after unpublish: v%" PRIu64 "; min_version 3 wait: %s\n",
                info.version, r ? dlx_strerror(r) : "ok");
        if (r == 0)
                dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* Byte limit: a group over --max-bytes is -ENOSPC and leaves nothing. (Run under the "bytes"
 * case: dlxd --max-bytes 1 MiB.) */
START_TEST(group_over_byte_limit)
{
        dlx_client *p = fx_connect(&fx, "p");
        int deleted = 0;
        float *big = calloc(512 * 1024, sizeof(float)); /* 2 MiB */
        ck_assert_ptr_nonnull(big);
        struct dlx_member ms[] = {{"a", vec_f32(g_a, 4, &deleted)},
                                  {"big", vec_f32(big, 512 * 1024, &deleted)}};
        int r = dlx_publish_group(p, "nospc", ms, 2, NULL, NULL);
        ck_assert_msg(r == -ENOSPC, "%s", dlx_strerror(r));
        ck_assert_int_eq(deleted, 2);
        ck_assert(!name_visible(p, "nospc"));
        struct dlx_stats s = fx_stats(p);
        ck_assert_uint_eq(s.bytes, 0);
        ck_assert_uint_eq(s.segments, 0);
        free(big);
        /* a small one still goes */
        publish_ab(p, "fits", NULL);
        dlx_close(p);
}
END_TEST

/* --max-leases 2: a group is one lease whatever is taken from it. */
START_TEST(group_is_one_lease)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        DLManagedTensorVersioned *t[8];
        dlx_group *g3 = NULL;

        publish_ab(p, "ol", NULL);
        dlx_group *g1 = acquire_group_ok(q, "ol", NULL, 0, NULL);
        for (int i = 0; i < 8; i++)
                DLXV(dlx_group_take(g1, (size_t)(i % 2), &t[i]));
        dlx_group *g2 = acquire_group_ok(q, "ol", NULL, 0, NULL);
        ck_assert_uint_eq(fx_stats(q).leases, 2);
        int r = dlx_acquire_group(q, "ol", NULL, 0, NULL, &g3);
        ck_assert_msg(r == -EAGAIN, "%s", dlx_strerror(r));
        dlx_group_release(g1);
        dlx_group_release(g2);
        for (int i = 0; i < 8; i++)
                t[i]->deleter(t[i]);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        g3 = acquire_group_ok(q, "ol", NULL, 0, NULL);
        dlx_group_release(g3);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

static void start_bytes(void)
{
        static const char *const extra[] = {"--max-bytes", "1M", "--max-leases", "2", NULL};
        dlxd_start(&fx, extra);
}

/* "Acquire a group ... in one round trip": the daemon counts one request for it. */
START_TEST(acquire_is_one_request)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        enum { N = 3000 };
        static float vals[N];
        static char names[N][8];
        static const char *want[N / 2];
        struct dlx_member *ms = calloc(N, sizeof(*ms));

        for (int i = 0; i < N; i++) {
                snprintf(names[i], sizeof(names[i]), "m%d", i);
                ms[i] = (struct dlx_member){names[i], vec_f32(&vals[i], 1, NULL)};
        }
        for (int i = 0; i < N / 2; i++)
                want[i] = names[N - 1 - 2 * i];
        DLXV(dlx_publish_group(p, "rt", ms, N, NULL, NULL));
        free(ms);
        uint64_t r0 = fx_stats(q).requests;
        dlx_group *g = acquire_group_ok(q, "rt", NULL, 0, NULL);
        uint64_t r1 = fx_stats(q).requests;
        dlx_group *g2 = acquire_group_ok(q, "rt", want, N / 2, NULL);
        uint64_t r2 = fx_stats(q).requests;
        /* each delta: the acquire and the stats call that reads the counter */
        ck_assert_msg(r1 - r0 == 2, "full acquire: %" PRIu64 " requests", r1 - r0 - 1);
        ck_assert_msg(r2 - r1 == 2, "subset acquire: %" PRIu64 " requests", r2 - r1 - 1);
        ck_assert_str_eq(dlx_group_name(g2, 0), names[N - 1]);
        dlx_group_release(g);
        dlx_group_release(g2);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* Threads of one client acquire, take and release the group while it is replaced. */
struct thr {
        dlx_client *c;
        int bad;
};

static void *reader_thread(void *arg)
{
        struct thr *t = arg;
        for (int i = 0; i < 300; i++) {
                dlx_group *g = NULL;
                struct dlx_acquire_options o = {.timeout_ms = 5000};
                if (dlx_acquire_group(t->c, "thr", NULL, 0, &o, &g)) {
                        t->bad = 1;
                        return NULL;
                }
                const float *a = dlx_group_tensor(g, 0)->data, *b = dlx_group_tensor(g, 1)->data;
                if (a[0] != b[0])
                        t->bad = 2;
                DLManagedTensorVersioned *mt = NULL;
                if (dlx_group_take(g, 1, &mt))
                        t->bad = 3;
                dlx_group_release(g);
                if (mt && ((const float *)mt->dl_tensor.data)[0] != a[0])
                        t->bad = 4;
                if (mt)
                        mt->deleter(mt);
        }
        return NULL;
}

START_TEST(threads_share_a_client)
{
        dlx_client *p = fx_connect(&fx, "p"), *q = fx_connect(&fx, "q");
        pthread_t th[6];
        struct thr t[6];
        static float a[1], b[1];

        struct dlx_member m0[] = {{"a", vec_f32(a, 1, NULL)}, {"b", vec_f32(b, 1, NULL)}};
        DLXV(dlx_publish_group(p, "thr", m0, 2, NULL, NULL));
        for (int i = 0; i < 6; i++) {
                t[i] = (struct thr){q, 0};
                ck_assert_int_eq(pthread_create(&th[i], NULL, reader_thread, &t[i]), 0);
        }
        for (int v = 1; v < 200; v++) {
                a[0] = b[0] = (float)v;
                struct dlx_member ms[] = {{"a", vec_f32(a, 1, NULL)}, {"b", vec_f32(b, 1, NULL)}};
                DLXV(dlx_publish_group(p, "thr", ms, 2, NULL, NULL));
        }
        for (int i = 0; i < 6; i++) {
                pthread_join(th[i], NULL);
                ck_assert_msg(t[i].bad == 0, "thread %d: %d", i, t[i].bad);
        }
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* An allocated group published persistently outlives its producer killed outright; one published
 * non-persistently stays readable to a reader holding it after the producer released it. */
static int alloc_and_die(void *arg)
{
        (void)arg;
        dlx_client *p = fx_connect(&fx, "allocer");
        static const int64_t s4[1] = {4};
        const struct dlx_member_layout ls[] = {{"w", DT(kDLInt, 32, 1), 1, s4},
                                               {"v", DT(kDLInt, 32, 1), 1, s4}};
        dlx_group *g = NULL;
        struct dlx_publish_options persist = {.persist = true};
        if (dlx_group_alloc(p, ls, 2, &g))
                return 2;
        for (size_t i = 0; i < 2; i++) {
                int32_t *x = dlx_group_tensor(g, i)->data;
                for (int k = 0; k < 4; k++)
                        x[k] = (int32_t)(10 * i + k);
        }
        if (dlx_group_publish(p, "allocp", g, &persist, NULL))
                return 3;
        raise(SIGKILL);
        return 4;
}

START_TEST(allocated_group_lifetimes)
{
        dlx_client *q = fx_connect(&fx, "q");
        pid_t pid = fx_spawn(alloc_and_die, NULL);
        ck_assert_int_eq(fx_wait(pid), 128 + SIGKILL);
        fx_wait_clients(q, 1, 5000);
        dlx_group *g = acquire_group_ok(q, "allocp", NULL, 0, NULL);
        for (size_t i = 0; i < 2; i++) {
                const int32_t *x = dlx_group_tensor(g, i)->data;
                /* name order: v (i = 0) then w */
                for (int k = 0; k < 4; k++)
                        ck_assert_int_eq(x[k], (int32_t)(10 * i + k));
        }
        dlx_group_release(g);

        dlx_client *p = fx_connect(&fx, "p");
        static const int64_t s2[1] = {2};
        const struct dlx_member_layout l1[] = {{"x", DT(kDLFloat, 64, 1), 1, s2}};
        dlx_group *ag = NULL;
        DLXV(dlx_group_alloc(p, l1, 1, &ag));
        double *d = dlx_group_tensor(ag, 0)->data;
        d[0] = 4.25, d[1] = -1;
        uint64_t v = 0;
        DLXV(dlx_group_publish(p, "allocn", ag, NULL, &v));
        ck_assert_uint_eq(v, 1);
        g = acquire_group_ok(q, "allocn", NULL, 0, NULL);
        DLXV(dlx_group_publish(p, "allocn", ag, NULL, &v));
        ck_assert_uint_eq(v, 2);
        ck_assert_uint_eq(dlx_group_version(ag), 2);
        dlx_group_release(ag);
        DLXV(dlx_unpublish(p, "allocn"));
        const double *e = dlx_group_tensor(g, 0)->data;
        ck_assert(e[0] == 4.25 && e[1] == -1);
        dlx_close(p);
        ck_assert(e[0] == 4.25 && e[1] == -1);
        dlx_group_release(g);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
}
END_TEST

/*
 * The same 4-byte member, copied from two addresses: dlx_stat's nbytes ("the
 * bytes its members' data takes", a piece keeping the alignment its source
 * had) is 4 from a 64-aligned address and from one 60 past it (4-aligned).
 */
START_TEST(stat_nbytes_depends_on_source_address)
{
        dlx_client *p = fx_connect(&fx, "p");
        uint8_t *buf = aligned_alloc(64, 128);
        struct dlx_info i0, i60;

        memset(buf, 0, 128);
        struct dlx_member m0 = {"x", vec_f32((float *)buf, 1, NULL)};
        DLXV(dlx_publish_group(p, "at0", &m0, 1, NULL, NULL));
        struct dlx_member m60 = {"x", vec_f32((float *)(buf + 60), 1, NULL)};
        DLXV(dlx_publish_group(p, "at60", &m60, 1, NULL, NULL));
        DLXV(dlx_stat(p, "at0", &i0));
        DLXV(dlx_stat(p, "at60", &i60));
        free(buf);
        ck_assert_msg(i0.nbytes == 4 && i60.nbytes == 4,
                      "one float32 member: nbytes %" PRIu64 " from a 64-aligned address, %" PRIu64
                      " from address%%64 == 60",
                      i0.nbytes, i60.nbytes);
        dlx_close(p);
}
END_TEST

/*
 * dlxd --max-group-members 0 (dlxd --help: "0 or over 1048576: 1048576"):
 * dlx_stats() gives the limit in force, and 1048577 members are refused
 * with -E2BIG (dlx.h: "dlx_stats() gives both limits").
 */
static void start_zero_members(void)
{
        static const char *const extra[] = {"--max-group-members", "0", NULL};
        dlxd_start(&fx, extra);
}

static void nodelete(DLManagedTensorVersioned *t)
{
        (void)t;
}

START_TEST(zero_member_limit_reported_as_none)
{
        dlx_client *p = fx_connect(&fx, "p");
        struct dlx_stats st = fx_stats(p);
        const size_t n = 1048577;
        static float x[1];
        static int64_t one = 1;
        static DLManagedTensorVersioned t;
        struct dlx_member *ms = calloc(n, sizeof(*ms));
        char *names = calloc(n, 16);

        ck_assert_ptr_nonnull(ms);
        ck_assert_ptr_nonnull(names);
        t.version.major = DLPACK_MAJOR_VERSION;
        t.deleter = nodelete;
        t.dl_tensor = (DLTensor){.data = x,
                                 .device = {kDLCPU, 0},
                                 .ndim = 1,
                                 .dtype = DT(kDLFloat, 32, 1),
                                 .shape = &one};
        for (size_t i = 0; i < n; i++) {
                snprintf(names + 16 * i, 16, "m%zu", i);
                ms[i] = (struct dlx_member){names + 16 * i, &t};
        }
        int r = dlx_publish_group(p, "zm", ms, n, NULL, NULL);
        free(ms);
        free(names);
        if (r == 0)
                DLXV(dlx_unpublish(p, "zm"));
        ck_assert_msg(r == 0 || st.limits.max_group_members != 0,
                      "dlx_stats says max_group_members %u (none), publish of %zu members: %s (%s)",
                      st.limits.max_group_members, n, dlx_strerror(r), dlx_last_error());
        ck_assert_uint_eq(st.limits.max_group_members, 1048576);
        ck_assert_int_eq(r, -E2BIG);
        dlx_close(p);
}
END_TEST

Suite *accept_groups_suite(void)
{
        Suite *s = suite_create("accept-groups");
        TCase *tc = tcase_create("groups");

        tcase_set_timeout(tc, 120);
        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_add_test(tc, subset_duplicate_name_twice);
        tcase_add_test(tc, subset_bad_lists);
        tcase_add_test(tc, wait_for_unpublished_group);
        tcase_add_test(tc, min_version_semantics);
        tcase_add_test(tc, wait_sees_wrong_kind);
        tcase_add_test(tc, unpublish_while_leased);
        tcase_add_test(tc, group_outlives_close);
        tcase_add_test(tc, fork_after_acquire);
        tcase_add_test(tc, old_version_held);
        tcase_add_test(tc, persist_and_not);
        tcase_add_test(tc, watch_one_event_per_version);
        tcase_add_test(tc, track_sees_group_versions);
        tcase_add_test(tc, stat_list_members_and_bytes);
        tcase_add_test(tc, stat_nbytes_small_members);
        tcase_add_test(tc, every_dtype_as_member);
        tcase_add_test(tc, tied_in_odd_ways);
        tcase_add_test(tc, zero_size_members);
        tcase_add_test(tc, refusals_leave_nothing);
        tcase_add_test(tc, refusal_keeps_old_version);
        tcase_add_test(tc, member_name_edges);
        tcase_add_test(tc, descriptors_per_acquire);
        tcase_add_test(tc, group_alloc_edges);
        tcase_add_test(tc, killed_publisher_leaves_whole_or_nothing);
        tcase_add_test(tc, subset_empty_list);
        tcase_add_test(tc, same_tensor_dup_name_deleted_once);
        tcase_add_test(tc, broadcast_member);
        tcase_add_test(tc, member_names_make_no_names);
        tcase_add_test(tc, wait_across_unpublish);
        tcase_add_test(tc, acquire_is_one_request);
        tcase_add_test(tc, threads_share_a_client);
        tcase_add_test(tc, allocated_group_lifetimes);
        tcase_add_test(tc, stat_nbytes_depends_on_source_address);
        suite_add_tcase(s, tc);

        TCase *lim = tcase_create("limits");
        tcase_set_timeout(lim, 60);
        tcase_add_unchecked_fixture(lim, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(lim, start_limited, stop_limited);
        tcase_add_test(lim, configured_limits);
        suite_add_tcase(s, lim);

        TCase *b = tcase_create("bytes");
        tcase_set_timeout(b, 60);
        tcase_add_unchecked_fixture(b, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(b, start_bytes, stop_limited);
        tcase_add_test(b, group_over_byte_limit);
        tcase_add_test(b, group_is_one_lease);
        suite_add_tcase(s, b);

        TCase *zm = tcase_create("zero-members");
        tcase_set_timeout(zm, 120);
        tcase_add_unchecked_fixture(zm, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(zm, start_zero_members, stop_limited);
        tcase_add_test(zm, zero_member_limit_reported_as_none);
        suite_add_tcase(s, zm);
        return s;
}
