/* SPDX-License-Identifier: MIT */
/*
 * Groups (dlx.h, "groups"): many named tensors published and acquired as one
 * version. What the header promises: a consumer sees every member of version
 * N or none; one lease for the whole group; members keep dtype, shape,
 * strides, byte_offset and read-only; tied storage stays tied; a subset
 * comes in the order asked; tensors taken from a group outlive it; a tensor
 * is not a group and a group not a tensor; limits hold and a refused publish
 * leaves nothing behind.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <check.h>

#include "fixture.h"
#include "frame.h"
#include "group.h"
#include "rawpeer.h"
#include "tensors.h"
#include "wire.h"

#define DLXV(call) ck_assert_int_eq((call), 0)

/* A view over a buffer the test owns: its deleter frees the view, not the bytes. */
struct view {
        DLManagedTensorVersioned mt;
        int *deleted;
        int64_t shape[4], strides[4];
};

static void view_deleter(DLManagedTensorVersioned *t)
{
        struct view *v = t->manager_ctx;
        if (v->deleted)
                ++*v->deleted;
        free(v);
}

static DLManagedTensorVersioned *view_of(void *data, DLDataType dt, int32_t ndim,
                                         const int64_t *shape, const int64_t *strides,
                                         uint64_t byte_offset, int *deleted)
{
        struct view *v = calloc(1, sizeof(*v));

        ck_assert_ptr_nonnull(v);
        ck_assert_int_le(ndim, 4);
        memcpy(v->shape, shape, (size_t)ndim * sizeof(int64_t));
        if (strides)
                memcpy(v->strides, strides, (size_t)ndim * sizeof(int64_t));
        v->deleted = deleted;
        v->mt.version.major = DLPACK_MAJOR_VERSION;
        v->mt.version.minor = DLPACK_MINOR_VERSION;
        v->mt.manager_ctx = v;
        v->mt.deleter = view_deleter;
        v->mt.dl_tensor = (DLTensor){.data = data,
                                     .device = {kDLCPU, 0},
                                     .ndim = ndim,
                                     .dtype = dt,
                                     .shape = ndim ? v->shape : NULL,
                                     .strides = strides ? v->strides : NULL,
                                     .byte_offset = byte_offset};
        return &v->mt;
}

static DLManagedTensorVersioned *vec_f32(float *data, int64_t n, int *deleted)
{
        return view_of(data, DT(kDLFloat, 32, 1), 1, &n, NULL, 0, deleted);
}

static dlx_group *acquire_group_ok(dlx_client *c, const char *name, const char *const *names,
                                   size_t n, const struct dlx_acquire_options *o)
{
        dlx_group *g = NULL;
        int err = dlx_acquire_group(c, name, names, n, o, &g);
        ck_assert_msg(err == 0, "acquire group %s: %s (%s)", name, dlx_strerror(err),
                      dlx_last_error());
        return g;
}

static const float *member_f32(const dlx_group *g, const char *name)
{
        int64_t i = dlx_group_find(g, name);
        ck_assert_msg(i >= 0, "no member %s", name);
        return dlx_group_tensor(g, (size_t)i)->data;
}

/* A write of a byte at p, in a child, dies of SIGSEGV. */
static void expect_write_faults(void *p)
{
        pid_t pid = fork();

        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                /* the default action, not a sanitizer's handler, and no core */
                struct rlimit no_core = {0, 0};
                setrlimit(RLIMIT_CORE, &no_core);
                signal(SIGSEGV, SIG_DFL);
                *(volatile uint8_t *)p = 9;
                _exit(0);
        }
        ck_assert_int_eq(fx_wait(pid), 128 + SIGSEGV);
}

/* Every layout a member may have comes back as it went, with its bytes. */
START_TEST(members_keep_their_layout)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        static const struct {
                const char *name;
                DLDataType dt;
                int32_t ndim;
                int64_t shape[3];
                int64_t strides[3]; /* all 0: NULL strides */
                uint64_t byte_offset;
        } rows[] = {
                {"layers.0.weight", DT(kDLFloat, 32, 1), 2, {3, 5}, {0}, 0},
                {"layers.0.bias", DT(kDLFloat, 16, 1), 1, {7}, {0}, 0},
                {"embed", DT(kDLBfloat, 16, 1), 2, {4, 6}, {0}, 0},
                {"fp8", DT(kDLFloat8_e4m3fn, 8, 1), 1, {9}, {0}, 0},
                {"transposed", DT(kDLInt, 64, 1), 2, {4, 3}, {1, 4}, 0},
                {"reversed", DT(kDLInt, 16, 1), 1, {5}, {-1}, 8},
                {"scalar", DT(kDLFloat, 64, 1), 0, {0}, {0}, 0},
                {"empty", DT(kDLFloat, 32, 1), 2, {0, 4}, {0}, 0},
                {"offset", DT(kDLUInt, 8, 1), 1, {10}, {0}, 24},
                {"mask", DT(kDLBool, 8, 1), 1, {13}, {0}, 0},
                {"c64", DT(kDLComplex, 64, 1), 1, {2}, {0}, 0},
        };
        const size_t n = N_ELEMS(rows);
        struct dlx_member ms[N_ELEMS(rows)];
        struct owned *own[N_ELEMS(rows)];
        uint64_t v;

        for (size_t i = 0; i < n; i++) {
                const int64_t *st = rows[i].strides[0] ? rows[i].strides : NULL;
                /* room for negative strides and offsets either side */
                own[i] = owned_new(rows[i].dt, rows[i].ndim, rows[i].shape, st, rows[i].byte_offset,
                                   0, 512, 256);
                pattern_fill(&own[i]->mt.dl_tensor, 0, (uint8_t)(i + 1));
                ms[i] = (struct dlx_member){rows[i].name, &own[i]->mt};
        }
        deleter_runs = 0;
        DLXV(dlx_publish_group(p, "model", ms, n, NULL, &v));
        ck_assert_uint_eq(v, 1);
        ck_assert_int_eq(deleter_runs, (int)n); /* copied: every deleter ran */
        for (size_t i = 0; i < n; i++)
                ck_assert_ptr_null(ms[i].tensor);

        dlx_group *g = acquire_group_ok(q, "model", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_version(g), 1);
        ck_assert_uint_eq(dlx_group_count(g), n);
        /* in name order */
        for (size_t i = 1; i < n; i++)
                ck_assert_int_lt(strcmp(dlx_group_name(g, i - 1), dlx_group_name(g, i)), 0);
        for (size_t i = 0; i < n; i++) {
                int64_t k = dlx_group_find(g, rows[i].name);
                ck_assert_int_ge(k, 0);
                const DLTensor *t = dlx_group_tensor(g, (size_t)k);
                ck_assert_str_eq(dlx_group_name(g, (size_t)k), rows[i].name);
                ck_assert_int_eq(t->device.device_type, kDLCPU);
                ck_assert_int_eq(t->ndim, rows[i].ndim);
                ck_assert(memcmp(&t->dtype, &rows[i].dt, sizeof(t->dtype)) == 0);
                ck_assert_uint_eq(t->byte_offset, rows[i].byte_offset);
                for (int d = 0; d < t->ndim; d++) {
                        ck_assert_int_eq(t->shape[d], rows[i].shape[d]);
                        if (rows[i].strides[0])
                                ck_assert_int_eq(t->strides[d], rows[i].strides[d]);
                }
                ck_assert_uint_eq(pattern_check(t, 0, (uint8_t)(i + 1)), 0);
        }
        ck_assert_ptr_null(dlx_group_tensor(g, n));
        ck_assert_ptr_null(dlx_group_name(g, n));
        ck_assert_int_eq(dlx_group_find(g, "nope"), -ENOENT);

        /* one lease for the whole group, gone with it */
        ck_assert_uint_eq(fx_stats(q).leases, 1);
        dlx_group_release(g);
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A group's pages are sealed and mapped read-only: a write through them faults. */
START_TEST(members_are_read_only)
{
        dlx_client *p = fx_connect(&fx, "producer");
        float a[4] = {1, 2, 3, 4};
        struct dlx_member m = {"a", vec_f32(a, 4, NULL)};
        DLManagedTensorVersioned *t;

        DLXV(dlx_publish_group(p, "ro", &m, 1, NULL, NULL));
        dlx_group *g = acquire_group_ok(p, "ro", NULL, 0, NULL);
        DLXV(dlx_group_take(g, 0, &t));
        ck_assert(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert_int_eq(dlx_tensor_write_protected(t), 1);
        expect_write_faults(t->dl_tensor.data);
        t->deleter(t);
        dlx_group_release(g);
        dlx_close(p);
}
END_TEST

/* Tied weights and views of one buffer share their bytes after the trip, at the same distance. */
START_TEST(tied_storage_stays_tied)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        float *buf = calloc(64, sizeof(float)), *other = calloc(8, sizeof(float));
        int64_t n16 = 16, n8 = 8, half = 32;
        int deleted = 0;

        ck_assert_ptr_nonnull(buf);
        ck_assert_ptr_nonnull(other);
        for (int i = 0; i < 64; i++)
                buf[i] = (float)i;
        for (int i = 0; i < 8; i++)
                other[i] = 100.0f + (float)i;
        struct dlx_member ms[] = {
                {"embed.weight", vec_f32(buf, 64, &deleted)},
                /* the output layer tied to the embedding: the same bytes */
                {"lm_head.weight", vec_f32(buf, 64, &deleted)},
                /* views inside it, overlapping each other */
                {"q", view_of(buf + 8, DT(kDLFloat, 32, 1), 1, &n16, NULL, 0, &deleted)},
                {"k", view_of(buf + 16, DT(kDLFloat, 32, 1), 1, &n16, NULL, 0, &deleted)},
                /* two halves of one buffer that only touch */
                {"h0", view_of(other, DT(kDLFloat, 32, 1), 1, (int64_t[]){4}, NULL, 0, &deleted)},
                {"h1",
                 view_of(other + 4, DT(kDLFloat, 32, 1), 1, (int64_t[]){4}, NULL, 0, &deleted)},
                {"alone", view_of(buf, DT(kDLFloat, 32, 1), 1, &half, (int64_t[]){2}, 0, &deleted)},
        };
        (void)n8;
        DLXV(dlx_publish_group(p, "tied", ms, N_ELEMS(ms), NULL, NULL));
        ck_assert_int_eq(deleted, (int)N_ELEMS(ms));
        /* one tensor under two names, as C code ties weights: deleted once */
        int once = 0;
        DLManagedTensorVersioned *shared = vec_f32(other, 8, &once);
        struct dlx_member two[] = {{"enc.embed", shared}, {"dec.embed", shared}};
        DLXV(dlx_publish_group(p, "tied2", two, 2, NULL, NULL));
        ck_assert_int_eq(once, 1);
        ck_assert_ptr_null(two[0].tensor);
        ck_assert_ptr_null(two[1].tensor);
        free(buf);
        free(other);

        dlx_group *g = acquire_group_ok(q, "tied", NULL, 0, NULL);
        const float *e = member_f32(g, "embed.weight"), *h = member_f32(g, "lm_head.weight");
        const float *qq = member_f32(g, "q"), *kk = member_f32(g, "k");
        const float *h0 = member_f32(g, "h0"), *h1 = member_f32(g, "h1");
        const float *al = member_f32(g, "alone");
        ck_assert_ptr_eq(e, h);
        ck_assert_ptr_eq(qq, e + 8);
        ck_assert_ptr_eq(kk, e + 16);
        ck_assert_ptr_eq(al, e);
        ck_assert_ptr_eq(h1, h0 + 4);
        for (int i = 0; i < 64; i++)
                ck_assert_float_eq(e[i], (float)i);
        for (int i = 0; i < 8; i++)
                ck_assert_float_eq(h0[i], 100.0f + (float)i);
        /* shared bytes counted once: 64 + 8 floats, and the data area is no bigger than that
         * and its alignment padding */
        struct dlx_info info;
        DLXV(dlx_stat(q, "tied", &info));
        ck_assert_uint_eq(info.members, N_ELEMS(ms));
        ck_assert_uint_ge(info.nbytes, 72 * sizeof(float));
        ck_assert_uint_le(info.nbytes, 72 * sizeof(float) + 2 * GROUP_MEMBER_ALIGN);
        dlx_group_release(g);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A byte_offset far past the data pointer comes back as it went, the room for it a hole. */
START_TEST(large_byte_offset_kept)
{
        dlx_client *p = fx_connect(&fx, "producer");
        static float vals[4] = {1, 2, 3, 4};
        const uint64_t off = UINT64_C(1) << 20;
        int64_t n = 4;
        /* the data pointer lies 1 MiB before the elements, as DLPack allows */
        void *data = (void *)((uintptr_t)vals - off);
        struct dlx_member ms[] = {
                {"far", view_of(data, DT(kDLFloat, 32, 1), 1, &n, NULL, off, NULL)},
                {"near", vec_f32(vals, 4, NULL)},
        };
        struct dlx_info info;

        DLXV(dlx_publish_group(p, "far", ms, 2, NULL, NULL));
        dlx_group *g = acquire_group_ok(p, "far", NULL, 0, NULL);
        const DLTensor *t = dlx_group_tensor(g, (size_t)dlx_group_find(g, "far"));
        ck_assert_uint_eq(t->byte_offset, off);
        const float *x = (const float *)((const uint8_t *)t->data + t->byte_offset);
        for (int i = 0; i < 4; i++)
                ck_assert_float_eq(x[i], vals[i]);
        /* tied to "near": the same bytes */
        ck_assert_ptr_eq(x, member_f32(g, "near"));
        DLXV(dlx_stat(p, "far", &info));
        ck_assert_uint_ge(info.segment_size, off);
        dlx_group_release(g);
        dlx_close(p);
}
END_TEST

/* A group allocated in shared memory, filled in place, goes out without a copy and then is
 * read-only. */
START_TEST(allocated_group_publishes_in_place)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        static const int64_t s_w[2] = {3, 5}, s_b[1] = {7}, s_e[1] = {0};
        const struct dlx_member_layout layouts[] = {
                {"w", DT(kDLFloat, 32, 1), 2, s_w},
                {"b", DT(kDLFloat, 64, 1), 1, s_b},
                {"empty", DT(kDLInt, 8, 1), 1, s_e},
                {"scalar", DT(kDLInt, 32, 1), 0, NULL},
        };
        DLManagedTensorVersioned *taken = NULL, *after = NULL;
        dlx_group *g = NULL;
        uint64_t v;

        DLXV(dlx_group_alloc(p, layouts, N_ELEMS(layouts), &g));
        ck_assert_uint_eq(dlx_group_count(g), 4);
        ck_assert_uint_eq(dlx_group_version(g), 0);
        /* zeroed, 64-byte aligned, writable: fill in place */
        for (size_t i = 0; i < dlx_group_count(g); i++) {
                const DLTensor *t = dlx_group_tensor(g, i);
                ck_assert_uint_eq((uintptr_t)t->data % 64, 0);
                ck_assert(is_compact(t));
        }
        float *w = dlx_group_tensor(g, (size_t)dlx_group_find(g, "w"))->data;
        double *b = dlx_group_tensor(g, (size_t)dlx_group_find(g, "b"))->data;
        for (int i = 0; i < 15; i++) {
                ck_assert_float_eq(w[i], 0);
                w[i] = (float)i;
        }
        for (int i = 0; i < 7; i++)
                b[i] = 0.5 * i;
        *(int32_t *)dlx_group_tensor(g, (size_t)dlx_group_find(g, "scalar"))->data = 42;
        /* a taken tensor is writable until the group is published */
        DLXV(dlx_group_take(g, (size_t)dlx_group_find(g, "w"), &taken));
        ck_assert(!(taken->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
        ck_assert_int_eq(dlx_tensor_write_protected(taken), 0);
        ((float *)taken->dl_tensor.data)[14] = 99;

        DLXV(dlx_group_publish(p, "alloc", g, NULL, &v));
        ck_assert_uint_eq(v, 1);
        ck_assert_uint_eq(dlx_group_version(g), 1);
        /* the same pages, read-only now, here too */
        ck_assert_float_eq(w[14], 99);
        DLXV(dlx_group_take(g, (size_t)dlx_group_find(g, "w"), &after));
        ck_assert(after->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        expect_write_faults(w);

        /* a consumer sees what was written */
        dlx_group *r = acquire_group_ok(q, "alloc", NULL, 0, NULL);
        ck_assert_uint_eq(dlx_group_count(r), 4);
        const float *rw = member_f32(r, "w");
        for (int i = 0; i < 14; i++)
                ck_assert_float_eq(rw[i], (float)i);
        ck_assert_float_eq(rw[14], 99);
        const double *rb = dlx_group_tensor(r, (size_t)dlx_group_find(r, "b"))->data;
        ck_assert(rb[6] == 3.0);
        ck_assert_int_eq(
                *(const int32_t *)dlx_group_tensor(r, (size_t)dlx_group_find(r, "scalar"))->data,
                42);
        dlx_group_release(r);

        /* published again, as it is: another version of the same bytes */
        DLXV(dlx_group_publish(p, "alloc", g, NULL, &v));
        ck_assert_uint_eq(v, 2);
        DLXV(dlx_group_publish(p, "alloc/copy2", g, NULL, &v));
        ck_assert_uint_eq(v, 1);
        /* the group and its tensors go in any order */
        dlx_group_release(g);
        ck_assert_float_eq(((const float *)after->dl_tensor.data)[1], 1);
        after->deleter(after);
        taken->deleter(taken);
        r = acquire_group_ok(q, "alloc", NULL, 0, NULL);
        ck_assert_float_eq(member_f32(r, "w")[3], 3);
        dlx_group_release(r);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* What dlx_group_alloc() and dlx_group_publish() refuse. */
START_TEST(allocated_group_refusals)
{
        dlx_client *p = fx_connect(&fx, "producer");
        static const int64_t n4[1] = {4}, neg[1] = {-1};
        const struct dlx_member_layout twice[] = {{"a", DT(kDLFloat, 32, 1), 1, n4},
                                                  {"a", DT(kDLFloat, 32, 1), 1, n4}};
        const struct dlx_member_layout bad_dtype[] = {{"a", DT(kDLFloat, 0, 1), 1, n4}};
        const struct dlx_member_layout bad_shape[] = {{"a", DT(kDLFloat, 32, 1), 1, neg}};
        const struct dlx_member_layout bad_name[] = {{"../a", DT(kDLFloat, 32, 1), 1, n4}};
        const struct dlx_member_layout one[] = {{"a", DT(kDLFloat, 32, 1), 1, n4}};
        struct dlx_publish_options always = {.copy = DLX_COPY_ALWAYS};
        struct dlx_publish_options writable = {.writable = true};
        dlx_group *g = NULL, *acq = NULL;
        float a[1] = {1};
        struct dlx_member m = {"a", vec_f32(a, 1, NULL)};

        ck_assert_int_eq(dlx_group_alloc(p, twice, 2, &g), -EINVAL);
        ck_assert_int_eq(dlx_group_alloc(p, bad_dtype, 1, &g), -EINVAL);
        ck_assert_int_eq(dlx_group_alloc(p, bad_shape, 1, &g), -EINVAL);
        ck_assert_int_eq(dlx_group_alloc(p, bad_name, 1, &g), -EINVAL);
        ck_assert_int_eq(dlx_group_alloc(p, one, 0, &g), -EINVAL);
        ck_assert_int_eq(dlx_group_alloc(p, NULL, 1, &g), -EINVAL);
        /* sizes that would wrap 64 bits between them, not one by one */
        static const int64_t huge[1] = {INT64_C(1) << 62};
        const struct dlx_member_layout wrap[] = {{"a", DT(kDLUInt, 8, 1), 1, huge},
                                                 {"b", DT(kDLUInt, 8, 1), 1, huge},
                                                 {"c", DT(kDLUInt, 8, 1), 1, huge},
                                                 {"d", DT(kDLUInt, 8, 1), 1, huge}};
        ck_assert_int_eq(dlx_group_alloc(p, wrap, 4, &g), -EOVERFLOW);
        ck_assert_ptr_null(g);
        DLXV(dlx_group_alloc(p, one, 1, &g));
        ck_assert_int_eq(dlx_group_publish(p, "x", g, &always, NULL), -EINVAL);
        ck_assert_int_eq(dlx_group_publish(p, "x", g, &writable, NULL), -ENOTSUP);
        ck_assert_int_eq(dlx_group_publish(p, "x//y", g, NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_group_publish(p, "x", NULL, NULL, NULL), -EINVAL);
        /* an acquired group is not one to publish */
        DLXV(dlx_publish_group(p, "acq", &m, 1, NULL, NULL));
        acq = acquire_group_ok(p, "acq", NULL, 0, NULL);
        ck_assert_int_eq(dlx_group_publish(p, "x", acq, NULL, NULL), -EINVAL);
        dlx_group_release(acq);
        /* the refusals above published nothing and left the group writable */
        struct dlx_info info;
        ck_assert_int_eq(dlx_stat(p, "x", &info), -ENOENT);
        ((float *)dlx_group_tensor(g, 0)->data)[0] = 5;
        DLXV(dlx_group_publish(p, "x", g, NULL, NULL));
        dlx_group_release(g);
        dlx_close(p);
}
END_TEST

/* A subset comes in the order asked, under one lease; a missing member fails and leases nothing. */
START_TEST(subset_in_order_asked)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        float a[2] = {1, 2}, b[2] = {3, 4}, c[2] = {5, 6};
        struct dlx_member ms[] = {
                {"a", vec_f32(a, 2, NULL)}, {"b", vec_f32(b, 2, NULL)}, {"c", vec_f32(c, 2, NULL)}};
        const char *want[] = {"c", "a"};
        const char *bad[] = {"a", "zz"};
        dlx_group *g = NULL;

        DLXV(dlx_publish_group(p, "sub", ms, 3, NULL, NULL));
        g = acquire_group_ok(q, "sub", want, 2, NULL);
        ck_assert_uint_eq(dlx_group_count(g), 2);
        ck_assert_str_eq(dlx_group_name(g, 0), "c");
        ck_assert_str_eq(dlx_group_name(g, 1), "a");
        ck_assert_float_eq(((const float *)dlx_group_tensor(g, 0)->data)[1], 6);
        ck_assert_int_eq(dlx_group_find(g, "a"), 1);
        ck_assert_int_eq(dlx_group_find(g, "b"), -ENOENT);
        dlx_group_release(g);

        g = NULL;
        ck_assert_int_eq(dlx_acquire_group(q, "sub", bad, 2, NULL, &g), -ENOENT);
        ck_assert_ptr_null(g);
        ck_assert_ptr_nonnull(strstr(dlx_last_error(), "zz"));
        ck_assert_int_eq(fx_wait_leases(q, 0, 5000), 0);
        dlx_close(q);
        dlx_close(p);
}
END_TEST

/* A tensor's name is not a group's, nor the other way round; either may become the other. */
START_TEST(tensor_and_group_kinds)
{
        dlx_client *p = fx_connect(&fx, "producer");
        float a[2] = {1, 2};
        struct dlx_member m = {"a", vec_f32(a, 2, NULL)};
        DLManagedTensorVersioned *t = NULL;
        dlx_group *g = NULL;
        uint64_t v;

        publish_ok(p, "kind", fx_vec_f32(p, 4, 0), NULL, NULL);
        ck_assert_int_eq(dlx_acquire_group(p, "kind", NULL, 0, NULL, &g), -ENOTDIR);
        expect_last_error("not a group");
        DLXV(dlx_publish_group(p, "kind", &m, 1, NULL, &v));
        ck_assert_uint_eq(v, 2);
        ck_assert_int_eq(dlx_acquire(p, "kind", NULL, &t), -EISDIR);
        expect_last_error("group");
        g = acquire_group_ok(p, "kind", NULL, 0, NULL);
        dlx_group_release(g);
        publish_ok(p, "kind", fx_vec_f32(p, 4, 0), NULL, &v);
        ck_assert_uint_eq(v, 3);
        t = acquire_ok(p, "kind", NULL);
        t->deleter(t);
        ck_assert_int_eq(dlx_acquire_group(p, "missing", NULL, 0, NULL, &g), -ENOENT);
        dlx_close(p);
}
END_TEST

/* A tensor taken from a group keeps the group's lease until it goes, past release and close. */
START_TEST(taken_tensors_outlive_group_and_client)
{
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        float a[3] = {7, 8, 9};
        struct dlx_member m = {"w", vec_f32(a, 3, NULL)};
        DLManagedTensorVersioned *t = NULL, *t2 = NULL;
        const char *name;
        const char *storage;
        uint64_t v;

        DLXV(dlx_publish_group(p, "take", &m, 1, NULL, NULL));
        dlx_group *g = acquire_group_ok(q, "take", NULL, 0, NULL);
        DLXV(dlx_group_take(g, 0, &t));
        DLXV(dlx_group_take(g, 0, &t2));
        ck_assert_ptr_ne(t, t2);
        ck_assert_int_eq(dlx_group_take(g, 1, &t2), -EINVAL);
        DLXV(dlx_tensor_info(t, &name, &v, &storage));
        ck_assert_str_eq(name, "w");
        ck_assert_uint_eq(v, 1);
        ck_assert_str_eq(storage, "memfd");
        dlx_group_release(g);
        dlx_close(q);
        /* still mapped and still leased: the producer sees the lease */
        ck_assert_float_eq(((const float *)t->dl_tensor.data)[2], 9);
        struct dlx_info info;
        DLXV(dlx_stat(p, "take", &info));
        ck_assert_uint_eq(info.leases, 1);
        t->deleter(t);
        ck_assert_float_eq(((const float *)t2->dl_tensor.data)[0], 7);
        t2->deleter(t2);
        for (int i = 0; i < 500; i++) {
                DLXV(dlx_stat(p, "take", &info));
                if (info.leases == 0)
                        break;
                fx_sleep_ms(10);
        }
        ck_assert_uint_eq(info.leases, 0);
        dlx_close(p);
}
END_TEST

/* Watches see one event per group version, whatever the member count. */
START_TEST(one_event_per_group_version)
{
        dlx_client *p = fx_connect(&fx, "producer"), *w = fx_connect(&fx, "watcher");
        struct dlx_member ms[64];
        float data[64];
        char names[64][8];
        struct dlx_event ev;
        uint64_t watch;

        DLXV(dlx_watch(w, "ev", &watch));
        for (int round = 0; round < 3; round++) {
                for (int i = 0; i < 64; i++) {
                        snprintf(names[i], sizeof(names[i]), "m%02d", i);
                        data[i] = (float)i;
                        ms[i] = (struct dlx_member){names[i], vec_f32(&data[i], 1, NULL)};
                }
                DLXV(dlx_publish_group(p, "ev/model", ms, 64, NULL, NULL));
        }
        for (uint64_t v = 1; v <= 3; v++) {
                DLXV(dlx_next_event(w, &ev, 5000));
                ck_assert_str_eq(ev.name, "ev/model");
                ck_assert_uint_eq(ev.version, v);
        }
        ck_assert_int_eq(dlx_next_event(w, &ev, 200), -ETIMEDOUT);
        dlx_close(w);
        dlx_close(p);
}
END_TEST

/* A reader in a tight loop never sees two versions in one group while a writer publishes. */
#define ATOM_MEMBERS 48
#define ATOM_VERSIONS 2000

static int atomic_writer(void *arg)
{
        dlx_client *p = fx_connect(&fx, "writer");
        /* persistent: the last version stays for the reader after the writer has gone */
        struct dlx_publish_options persist = {.persist = true};
        (void)arg;
        static float vals[ATOM_MEMBERS][4];
        char names[ATOM_MEMBERS][16];
        for (int v = 1; v <= ATOM_VERSIONS; v++) {
                struct dlx_member ms[ATOM_MEMBERS];
                for (int i = 0; i < ATOM_MEMBERS; i++) {
                        snprintf(names[i], sizeof(names[i]), "layer.%d", i);
                        for (int k = 0; k < 4; k++)
                                vals[i][k] = (float)v;
                        ms[i] = (struct dlx_member){names[i], vec_f32(vals[i], 4, NULL)};
                }
                int err = dlx_publish_group(p, "atom", ms, ATOM_MEMBERS, &persist, NULL);
                if (err != 0) {
                        fprintf(stderr, "writer: publish v%d: %s\n", v, dlx_last_error());
                        return 2;
                }
        }
        dlx_close(p);
        return 0;
}

START_TEST(readers_never_see_mixed_versions)
{
        dlx_client *q = fx_connect(&fx, "reader");
        struct dlx_acquire_options wait = {.timeout_ms = 10000};
        uint64_t seen = 0, reads = 0;
        pid_t pid = fx_spawn(atomic_writer, NULL);

        while (seen < ATOM_VERSIONS) {
                dlx_group *g = acquire_group_ok(q, "atom", NULL, 0, &wait);
                uint64_t v = dlx_group_version(g);
                ck_assert_uint_ge(v, seen);
                ck_assert_uint_eq(dlx_group_count(g), ATOM_MEMBERS);
                for (size_t i = 0; i < ATOM_MEMBERS; i++) {
                        const float *x = dlx_group_tensor(g, i)->data;
                        for (int k = 0; k < 4; k++)
                                ck_assert_msg(x[k] == (float)v,
                                              "group v%" PRIu64 " member %zu holds %g", v, i,
                                              (double)x[k]);
                }
                seen = v;
                reads++;
                dlx_group_release(g);
        }
        ck_assert_int_eq(fx_wait(pid), 0);
        ck_assert_uint_gt(reads, 1);
        dlx_close(q);
}
END_TEST

/* Bad arguments fail clearly, and every member's deleter has run whatever the failure. */
START_TEST(bad_publishes_delete_every_member)
{
        dlx_client *p = fx_connect(&fx, "producer");
        float a[2] = {1, 2};
        int deleted = 0;
        struct dlx_member ms[2];
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        struct dlx_publish_options writable = {.writable = true};
        dlx_group *g = NULL;

#define TWO(n0, n1)                                                                                \
        do {                                                                                       \
                ms[0] = (struct dlx_member){(n0), vec_f32(a, 2, &deleted)};                        \
                ms[1] = (struct dlx_member){(n1), vec_f32(a, 2, &deleted)};                        \
        } while (0)

        TWO("x", "x");
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, NULL, NULL), -EINVAL);
        expect_last_error("twice");
        TWO("x", "../y");
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, NULL, NULL), -EINVAL);
        TWO("x", "");
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, NULL, NULL), -EINVAL);
        TWO("x", "y");
        ck_assert_int_eq(dlx_publish_group(p, "bad//name", ms, 2, NULL, NULL), -EINVAL);
        TWO("x", "y");
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, &never, NULL), -EXDEV);
        TWO("x", "y");
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, &writable, NULL), -ENOTSUP);
        TWO("x", "y");
        ms[1].tensor->dl_tensor.device.device_type = kDLCUDA;
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, NULL, NULL), -ENOTSUP);
        TWO("x", "y");
        ms[0].tensor->dl_tensor.ndim = DLX_MAX_NDIM + 1;
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, NULL, NULL), -EINVAL);
        TWO("x", "y");
        ms[0].tensor->dl_tensor.dtype.bits = 0;
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, NULL, NULL), -EINVAL);
        TWO("x", NULL);
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 2, NULL, NULL), -EINVAL);
        TWO("x", "y");
        ck_assert_int_eq(dlx_publish_group(NULL, "bad", ms, 2, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleted, 22);
        ck_assert_int_eq(dlx_publish_group(p, "bad", NULL, 0, NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_publish_group(p, "bad", ms, 0, NULL, NULL), -EINVAL);
#undef TWO
        /* nothing became visible, and nothing is held */
        struct dlx_info info;
        ck_assert_int_eq(dlx_stat(p, "bad", &info), -ENOENT);
        struct dlx_stats st = fx_stats(p);
        ck_assert_uint_eq(st.names, 0);
        ck_assert_uint_eq(st.bytes, 0);
        ck_assert_int_eq(dlx_acquire_group(p, NULL, NULL, 0, NULL, &g), -EINVAL);
        ck_assert_int_eq(dlx_acquire_group(p, "x", NULL, 3, NULL, &g), -EINVAL);
        ck_assert_int_eq(dlx_acquire_group(NULL, "x", NULL, 0, NULL, &g), -EINVAL);
        dlx_group_release(NULL);
        ck_assert_uint_eq(dlx_group_count(NULL), 0);
        dlx_close(p);
}
END_TEST

/* Byte order, the shorter first where one name begins the other: the order a group's table keeps.
 */
static int cmp_names(const void *a, const void *b)
{
        const char *x = *(const char *const *)a, *y = *(const char *const *)b;
        size_t lx = strlen(x), ly = strlen(y);
        int c = memcmp(x, y, lx < ly ? lx : ly);

        return c ? c : (lx > ly) - (lx < ly);
}

/*
 * n distinct names in a random order, made to stress a name sort: long
 * names that agree in their first 16 bytes or more, short ones, names that
 * begin others, and UTF-8 (bytes over 0x7f must order as unsigned).
 */
static char **random_names(size_t n, uint64_t seed)
{
        static const char *const stems[] = {"model.layers.",
                                            "model.layers.1",
                                            "a",
                                            "é.",
                                            "layers.",
                                            "z",
                                            "model.layers.10.self_attn."};
        static const char *const tails[] = {"", ".weight", ".bias", ".q_proj.weight", "ü", "/x"};
        char **names = calloc(n, sizeof(*names));
        uint64_t rng = seed;

        ck_assert_ptr_nonnull(names);
        for (size_t i = 0; i < n; i++) {
                char buf[128];
                /* the index and the stem's number make it distinct; where it goes varies */
                unsigned stem = (unsigned)rng_below(&rng, 7);
                snprintf(buf, sizeof(buf), "%s%zu:%u%s", stems[stem], i, stem,
                         tails[rng_below(&rng, 6)]);
                names[i] = strdup(buf);
        }
        for (size_t i = n - 1; i > 0; i--) {
                size_t j = rng_below(&rng, i + 1);
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
        }
        return names;
}

/*
 * Thousands of members in a random order come back sorted as bytes, each
 * with its own bytes; a name given twice is refused wherever the two sort,
 * and every member's deleter runs once either way.
 */
START_TEST(names_sort_as_bytes)
{
        enum { N = 3000 };
        dlx_client *p = fx_connect(&fx, "producer"), *q = fx_connect(&fx, "consumer");
        char **names = random_names(N, 0x5eed);
        struct dlx_member *ms = calloc(N, sizeof(*ms));
        int32_t *vals = calloc(N, sizeof(*vals));
        int deleted = 0;

        ck_assert_ptr_nonnull(ms);
        ck_assert_ptr_nonnull(vals);
        for (int i = 0; i < N; i++) {
                int64_t one = 1;
                vals[i] = i;
                ms[i] = (struct dlx_member){
                        names[i], view_of(&vals[i], DT(kDLInt, 32, 1), 1, &one, NULL, 0, &deleted)};
        }
        DLXV(dlx_publish_group(p, "sorted", ms, N, NULL, NULL));
        ck_assert_int_eq(deleted, N);

        dlx_group *g = acquire_group_ok(q, "sorted", NULL, 0, NULL);
        const char **want = calloc(N, sizeof(*want));
        ck_assert_ptr_nonnull(want);
        memcpy(want, names, N * sizeof(*want));
        qsort(want, N, sizeof(*want), cmp_names);
        ck_assert_uint_eq(dlx_group_count(g), N);
        for (size_t i = 0; i < N; i++)
                ck_assert_str_eq(dlx_group_name(g, i), want[i]);
        for (int i = 0; i < N; i++) {
                int64_t at = dlx_group_find(g, names[i]);
                ck_assert_int_ge(at, 0);
                ck_assert_int_eq(*(const int32_t *)dlx_group_tensor(g, (size_t)at)->data, i);
        }
        dlx_group_release(g);

        /* a name twice: sorting next to each other, among names alike for 16 bytes and more */
        static const char *const twice[] = {"model.layers.10.self_attn.17:6.bias", "a5", "é.42ü",
                                            "z0:5"};
        for (size_t k = 0; k < sizeof(twice) / sizeof(twice[0]); k++) {
                deleted = 0;
                for (int i = 0; i < N; i++) {
                        int64_t one = 1;
                        ms[i] = (struct dlx_member){names[i], view_of(&vals[i], DT(kDLInt, 32, 1),
                                                                      1, &one, NULL, 0, &deleted)};
                }
                ms[k * 700].name = twice[k];
                ms[k * 700 + 1].name = twice[k];
                ck_assert_int_eq(dlx_publish_group(p, "twice", ms, N, NULL, NULL), -EINVAL);
                expect_last_error("names member"); /* found here, not left to dlxd's check */
                ck_assert_int_eq(deleted, N);
        }
        struct dlx_info info;
        ck_assert_int_eq(dlx_stat(p, "twice", &info), -ENOENT);
        for (int i = 0; i < N; i++)
                free(names[i]);
        free(names);
        free(want);
        free(ms);
        free(vals);
        dlx_close(p);
        dlx_close(q);
}
END_TEST

/* list and stat show a group with its member count and its data bytes. */
START_TEST(stat_and_list_show_groups)
{
        dlx_client *p = fx_connect(&fx, "producer");
        float a[100] = {0};
        struct dlx_member ms[] = {{"a", vec_f32(a, 100, NULL)}, {"b", vec_f32(a + 50, 10, NULL)}};
        struct dlx_info info;

        DLXV(dlx_publish_group(p, "ls/g", ms, 2, NULL, NULL));
        publish_ok(p, "ls/t", fx_vec_f32(p, 4, 0), NULL, NULL);
        DLXV(dlx_stat(p, "ls/g", &info));
        ck_assert_uint_eq(info.members, 2);
        ck_assert_uint_eq(info.version, 1);
        /* b lies inside a: 400 bytes, after up to 63 that keep a's alignment */
        ck_assert_uint_ge(info.nbytes, 400);
        ck_assert_uint_lt(info.nbytes, 400 + GROUP_MEMBER_ALIGN);
        ck_assert(info.flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        DLXV(dlx_stat(p, "ls/t", &info));
        ck_assert_uint_eq(info.members, 0);
        dlx_close(p);
}
END_TEST

/* A daemon of protocol 1.2: greets, then reads and answers nothing until the client hangs up. */
static void *old_daemon(void *arg)
{
        int lfd = *(int *)arg, s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        uint8_t hdr[FRAME_HEADER_SIZE], payload[4096], out[4096];
        struct wire_request req;
        struct wire_reply rep = {.type = WIRE_REP_HELLO};
        uint32_t len = 0;
        unsigned nfds = 0;
        size_t n = 0;
        char why[128];

        if (s < 0)
                return NULL;
        if (recv(s, hdr, sizeof(hdr), MSG_WAITALL) == (ssize_t)sizeof(hdr) &&
            frame_header_get(hdr, &len, &nfds) == 0 && len <= sizeof(payload) &&
            recv(s, payload, len, MSG_WAITALL) == (ssize_t)len &&
            wire_request_decode(payload, len, &req, why, sizeof(why)) == 0) {
                rep.id = req.id;
                rep.hello.major = 1;
                rep.hello.minor = 2;
                rep.hello.session = 1;
                rep.hello.max_frame = DLX_MAX_FRAME;
                rep.hello.max_inflight = DLX_MAX_INFLIGHT;
                snprintf(rep.hello.server, sizeof(rep.hello.server), "dlxd 0.0 (1.2)");
                if (wire_reply_encode(&rep, out + FRAME_HEADER_SIZE,
                                      sizeof(out) - FRAME_HEADER_SIZE, &n) == 0) {
                        frame_header_put(out, (uint32_t)n, 0);
                        send(s, out, FRAME_HEADER_SIZE + n, MSG_NOSIGNAL);
                }
        }
        while (recv(s, payload, sizeof(payload), 0) > 0)
                ; /* whatever comes, no answer: the group calls must not send any */
        close(s);
        return NULL;
}

/* Against a daemon older than groups, every group call says so and sends nothing. */
START_TEST(old_daemon_has_no_groups)
{
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        char dir[] = "/tmp/dlx-old-XXXXXX";
        int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        pthread_t th;
        dlx_client *c = NULL;
        dlx_group *g = NULL;
        float a[2] = {1, 2};
        int deleted = 0;
        struct dlx_member m = {"a", vec_f32(a, 2, &deleted)};
        static const int64_t two[1] = {2};
        const struct dlx_member_layout l = {"a", DT(kDLFloat, 32, 1), 1, two};

        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/s", dir);
        ck_assert_int_eq(bind(lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
        ck_assert_int_eq(listen(lfd, 1), 0);
        ck_assert_int_eq(pthread_create(&th, NULL, old_daemon, &lfd), 0);
        struct dlx_connect_options o = {.socket_path = addr.sun_path, .timeout_ms = 300};
        DLXV(dlx_connect(&o, &c));
        ck_assert_int_eq(dlx_publish_group(c, "g", &m, 1, NULL, NULL), -ENOTSUP);
        expect_last_error("1.3");
        ck_assert_int_eq(deleted, 1);
        ck_assert_int_eq(dlx_acquire_group(c, "g", NULL, 0, NULL, &g), -ENOTSUP);
        /* alloc needs no daemon; its publish does */
        DLXV(dlx_group_alloc(c, &l, 1, &g));
        ck_assert_int_eq(dlx_group_publish(c, "g", g, NULL, NULL), -ENOTSUP);
        dlx_group_release(g);
        dlx_close(c);
        pthread_join(th, NULL);
        close(lfd);
        unlink(addr.sun_path);
        rmdir(dir);
}
END_TEST

/* --max-group-members and --max-group-table hold, at their edges. */
START_TEST(group_limits)
{
        static const char *const args[] = {"--max-group-members", "4", NULL};
        struct dlx_member ms[20];
        char names[20][DLX_NAME_MAX + 1];
        float a[1] = {1};
        int deleted = 0;

        dlxd_start(&fx, args);
        dlx_client *p = fx_connect(&fx, "producer");
        ck_assert_uint_eq(fx_stats(p).limits.max_group_members, 4);
        for (int i = 0; i < 20; i++)
                snprintf(names[i], sizeof(names[i]), "m%d", i);
        for (int i = 0; i < 5; i++)
                ms[i] = (struct dlx_member){names[i], vec_f32(a, 1, &deleted)};
        ck_assert_int_eq(dlx_publish_group(p, "lim", ms, 5, NULL, NULL), -E2BIG);
        ck_assert_int_eq(deleted, 5);
        for (int i = 0; i < 4; i++)
                ms[i] = (struct dlx_member){names[i], vec_f32(a, 1, &deleted)};
        DLXV(dlx_publish_group(p, "lim", ms, 4, NULL, NULL));
        dlx_close(p);
        dlxd_stop(&fx);

        /* 10 names of 250 bytes make a table under 4 KiB (padded to it); 20 one over */
        static const char *const small[] = {"--max-group-table", "4K", NULL};
        dlxd_start(&fx, small);
        p = fx_connect(&fx, "producer");
        ck_assert_uint_eq(fx_stats(p).limits.max_group_table, 4096);
        for (int i = 0; i < 20; i++) {
                memset(names[i], 'a' + i, 250);
                names[i][250] = '\0';
        }
        for (int i = 0; i < 10; i++)
                ms[i] = (struct dlx_member){names[i], vec_f32(a, 1, &deleted)};
        DLXV(dlx_publish_group(p, "lim", ms, 10, NULL, NULL));
        for (int i = 0; i < 20; i++)
                ms[i] = (struct dlx_member){names[i], vec_f32(a, 1, &deleted)};
        ck_assert_int_eq(dlx_publish_group(p, "lim", ms, 20, NULL, NULL), -E2BIG);
        expect_last_error("table");
        ck_assert_int_eq(deleted, 39);
        dlx_close(p);
        dlxd_stop(&fx);
}
END_TEST

Suite *group_suite(void)
{
        Suite *s = suite_create("group");
        TCase *tc = tcase_create("group");
        TCase *own = tcase_create("own-daemon");

        tcase_add_unchecked_fixture(tc, fx_reaper_init, fx_reaper_run);
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, members_keep_their_layout);
        tcase_add_test(tc, members_are_read_only);
        tcase_add_test(tc, tied_storage_stays_tied);
        tcase_add_test(tc, large_byte_offset_kept);
        tcase_add_test(tc, allocated_group_publishes_in_place);
        tcase_add_test(tc, allocated_group_refusals);
        tcase_add_test(tc, subset_in_order_asked);
        tcase_add_test(tc, tensor_and_group_kinds);
        tcase_add_test(tc, taken_tensors_outlive_group_and_client);
        tcase_add_test(tc, one_event_per_group_version);
        tcase_add_test(tc, readers_never_see_mixed_versions);
        tcase_add_test(tc, bad_publishes_delete_every_member);
        tcase_add_test(tc, names_sort_as_bytes);
        tcase_add_test(tc, stat_and_list_show_groups);
        tcase_add_test(tc, old_daemon_has_no_groups);
        suite_add_tcase(s, tc);
        tcase_add_unchecked_fixture(own, fx_reaper_init, fx_reaper_run);
        tcase_add_test(own, group_limits);
        suite_add_tcase(s, own);
        return s;
}
