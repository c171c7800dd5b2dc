/* SPDX-License-Identifier: MIT */
/*
 * Conformance of libdlx's DLPack exchange-API table (DLPack 1.2+ C API):
 * the header, each of the five slots, the dlx_tensor handle behind the
 * "objects" it trades in, and dlx_publish_from() through libdlx's own table
 * and through foreign (hand-written) ones. Consumers run in child processes
 * with clients of their own.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"
#include "tensors.h"

/* ---- SetError ------------------------------------------------------------------------------- */

struct error_sink {
        int calls;
        char kind[64];
        char message[512];
};

static void set_error(void *ctx, const char *kind, const char *message)
{
        struct error_sink *s = ctx;

        s->calls++;
        snprintf(s->kind, sizeof(s->kind), "%s", kind ? kind : "");
        snprintf(s->message, sizeof(s->message), "%s", message ? message : "");
}

/* ---- the table ------------------------------------------------------------------------------- */

START_TEST(test_header)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();

        ck_assert_ptr_nonnull(api);
        ck_assert_ptr_eq(api, dlx_exchange_api());
        ck_assert_uint_eq(api->header.version.major, 1);
        ck_assert_uint_eq(api->header.version.minor, 3);
        ck_assert_ptr_null(api->header.prev_api);
        ck_assert_ptr_nonnull(api->managed_tensor_allocator);
        ck_assert_ptr_nonnull(api->managed_tensor_from_py_object_no_sync);
        ck_assert_ptr_nonnull(api->managed_tensor_to_py_object_no_sync);
        ck_assert_ptr_nonnull(api->dltensor_from_py_object_no_sync);
        ck_assert_ptr_nonnull(api->current_work_stream);
}
END_TEST

START_TEST(test_current_work_stream)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        void *s = &s;

        ck_assert_int_eq(api->current_work_stream(kDLCPU, 0, &s), 0);
        ck_assert_ptr_null(s);
        ck_assert_int_ne(api->current_work_stream(kDLCPU, 0, NULL), 0);
}
END_TEST

/* ---- the allocator ----------------------------------------------------------------------------
 */

static const int64_t shape_3x5[2] = {3, 5};

static DLTensor cpu_prototype(DLDataType dt)
{
        DLTensor p = {.device = {kDLCPU, 0}, .ndim = 2, .dtype = dt};

        p.shape = (int64_t *)shape_3x5;
        return p;
}

/* The allocator refuses proto: SetError called once, with a message, and the out tensor untouched.
 */
static void expect_allocator_refuses(DLTensor *proto, DLManagedTensorVersioned *out)
{
        DLManagedTensorVersioned *was = out;
        struct error_sink sink = {0};

        ck_assert_int_ne(
                dlx_exchange_api()->managed_tensor_allocator(proto, &out, &sink, set_error), 0);
        ck_assert_int_eq(sink.calls, 1);
        ck_assert_str_ne(sink.message, "");
        ck_assert_ptr_eq(out, was);
}

START_TEST(test_allocator_no_client)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLTensor proto = cpu_prototype(DT(kDLFloat, 32, 1));
        DLManagedTensorVersioned *sentinel = (DLManagedTensorVersioned *)&proto, *out = sentinel;
        dlx_client *c;

        /* no client has connected in this (forked) test process yet */
        expect_allocator_refuses(&proto, sentinel);
        /* without a SetError it still fails, quietly */
        ck_assert_int_ne(api->managed_tensor_allocator(&proto, &out, NULL, NULL), 0);

        /* once the only client is closed, there is none again */
        c = fx_connect(&fx, "gone");
        dlx_close(c);
        expect_allocator_refuses(&proto, sentinel);
}
END_TEST

/* Whose allocation a tensor is: only that client publishes it without a copy. */
static void expect_allocated_by(dlx_client *owner, dlx_client *other, const char *name)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLTensor proto = cpu_prototype(DT(kDLFloat, 32, 1));
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        DLManagedTensorVersioned *out = NULL;

        ck_assert_int_eq(api->managed_tensor_allocator(&proto, &out, NULL, NULL), 0);
        if (other) {
                ck_assert_int_eq(dlx_publish(other, name, out, &never, NULL), -EXDEV);
                ck_assert_int_eq(api->managed_tensor_allocator(&proto, &out, NULL, NULL), 0);
        }
        ck_assert_int_eq(dlx_publish(owner, name, out, &never, NULL), 0);
}

/*
 * A client being closed is not the allocator's, even while tensors acquired
 * through it keep its connection open: the oldest other one is.
 */
START_TEST(test_allocator_skips_closing_client)
{
        dlx_client *a = fx_connect(&fx, "older"), *b = fx_connect(&fx, "newer");
        DLManagedTensorVersioned *kept;

        expect_allocated_by(a, b, "ex/closing/1");
        ck_assert_int_eq(dlx_acquire(a, "ex/closing/1", NULL, &kept), 0);
        dlx_close(a);
        expect_allocated_by(b, NULL, "ex/closing/2");
        kept->deleter(kept);
        dlx_close(b);
}
END_TEST

START_TEST(test_allocator_bad_prototypes)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLTensor proto = cpu_prototype(DT(kDLFloat, 32, 1));
        DLManagedTensorVersioned *out = NULL;
        struct error_sink sink = {0};
        dlx_client *c = fx_connect(&fx, "allocator");

        /* a device dlx cannot allocate for */
        proto.device.device_type = kDLOpenCL;
        expect_allocator_refuses(&proto, NULL);
        /* CUDA: refused without a driver, allocated (VMM) where there is one */
        proto.device.device_type = kDLCUDA;
        if (api->managed_tensor_allocator(&proto, &out, &sink, set_error) != 0) {
                ck_assert_int_eq(sink.calls, 1);
                ck_assert_str_ne(sink.message, "");
                ck_assert_ptr_null(out);
        } else {
                ck_assert_int_eq(sink.calls, 0);
                ck_assert_int_eq(out->dl_tensor.device.device_type, kDLCUDA);
                out->deleter(out);
                out = NULL;
        }

        proto = cpu_prototype(DT(kDLFloat, 7, 1));
        expect_allocator_refuses(&proto, NULL);
        dlx_close(c);
}
END_TEST

/* Checks an allocator result: writable, compact, aligned, of the prototype's shape. */
static void check_allocated(const DLManagedTensorVersioned *t, const DLTensor *proto)
{
        const DLTensor *d = &t->dl_tensor;

        ck_assert_ptr_nonnull(t->deleter);
        ck_assert_uint_eq(t->version.major, 1);
        ck_assert_uint_eq(t->version.minor, 3);
        ck_assert_uint_eq(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
        ck_assert_int_eq(d->device.device_type, kDLCPU);
        ck_assert_int_eq(d->ndim, proto->ndim);
        ck_assert_uint_eq(d->dtype.code, proto->dtype.code);
        ck_assert_uint_eq(d->dtype.bits, proto->dtype.bits);
        ck_assert_uint_eq(d->dtype.lanes, proto->dtype.lanes);
        ck_assert_ptr_ne(d->shape, proto->shape); /* the tensor owns its shape */
        for (int32_t i = 0; i < d->ndim; i++)
                ck_assert_int_eq(d->shape[i], proto->shape[i]);
        ck_assert(is_compact(d));
        ck_assert_ptr_nonnull(d->data);
        ck_assert_uint_eq(((uintptr_t)d->data + d->byte_offset) % 64, 0);
}

START_TEST(test_allocator_publish)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLTensor proto = cpu_prototype(DT(kDLFloat, 64, 1));
        DLManagedTensorVersioned *t = NULL, *t2 = NULL;
        struct error_sink sink = {0};
        struct expect e = expect_2d("ex/allocated", DT(kDLFloat, 64, 1), 3, 5, 11);
        dlx_client *c = fx_connect(&fx, "allocator");

        /* the first client connected is the default */
        ck_assert_int_eq(api->managed_tensor_allocator(&proto, &t, &sink, set_error), 0);
        ck_assert_int_eq(sink.calls, 0);
        ck_assert_ptr_nonnull(t);
        check_allocated(t, &proto);
        pattern_fill(&t->dl_tensor, 0, 11);
        /* zero-copy: it is dlx_alloc() memory of c */
        publish_ok(c, "ex/allocated", t, &(struct dlx_publish_options){.copy = DLX_COPY_NEVER},
                   NULL);
        consume_in_child(&e);

        /* a 0-d and an empty prototype */
        proto.ndim = 0;
        ck_assert_int_eq(api->managed_tensor_allocator(&proto, &t2, &sink, set_error), 0);
        ck_assert_int_eq(t2->dl_tensor.ndim, 0);
        ck_assert_uint_eq((uintptr_t)t2->dl_tensor.data % 64, 0);
        t2->deleter(t2);
        dlx_close(c);
}
END_TEST

START_TEST(test_allocator_default_client)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLTensor proto = cpu_prototype(DT(kDLInt, 32, 1));
        DLManagedTensorVersioned *t = NULL;
        struct error_sink sink = {0};
        struct expect e = expect_2d("ex/default", DT(kDLInt, 32, 1), 3, 5, 12);
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        dlx_client *first = fx_connect(&fx, "first");
        dlx_client *second = fx_connect(&fx, "second");

        /* the first connected stays the default over later connects */
        ck_assert_int_eq(api->managed_tensor_allocator(&proto, &t, &sink, set_error), 0);
        ck_assert_int_eq(dlx_publish(second, "ex/default", t, &never, NULL), -EXDEV);

        /* set explicitly: the allocator uses the second */
        dlx_set_default_client(second);
        t = NULL;
        ck_assert_int_eq(api->managed_tensor_allocator(&proto, &t, &sink, set_error), 0);
        pattern_fill(&t->dl_tensor, 0, 12);
        ck_assert_int_eq(dlx_publish(second, "ex/default", t, &never, NULL), 0);
        consume_in_child(&e);

        /* closing the pinned client unpins it */
        dlx_set_default_client(first);
        dlx_close(first);
        t = NULL;
        if (api->managed_tensor_allocator(&proto, &t, &sink, set_error) == 0) {
                /* the library may fall back to the other connected client */
                ck_assert_ptr_nonnull(t);
                ck_assert_int_eq(sink.calls, 0);
                t->deleter(t);
        } else {
                ck_assert_int_eq(sink.calls, 1);
                ck_assert_ptr_null(t);
        }
        dlx_close(second);
}
END_TEST

/*
 * dlx_set_default_client(NULL) "restores the default", which is the first client
 * connected in this process: with that client still connected, the allocator works.
 */
START_TEST(test_allocator_default_restored)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLTensor proto = cpu_prototype(DT(kDLInt, 8, 1));
        DLManagedTensorVersioned *t = NULL;
        struct error_sink sink = {0};
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        dlx_client *first = fx_connect(&fx, "first");
        dlx_client *second = fx_connect(&fx, "second");

        dlx_set_default_client(second);
        dlx_set_default_client(NULL);
        t = NULL;
        ck_assert_msg(api->managed_tensor_allocator(&proto, &t, &sink, set_error) == 0,
                      "allocator after dlx_set_default_client(NULL) with two clients connected: "
                      "%s",
                      sink.message);
        ck_assert_int_eq(sink.calls, 0);
        ck_assert_ptr_nonnull(t);
        /* it is the first client's memory again */
        ck_assert_int_eq(dlx_publish(first, "ex/restored", t, &never, NULL), 0);
        dlx_close(second);
        dlx_close(first);
}
END_TEST

/* ---- handles --------------------------------------------------------------------------------- */

START_TEST(test_handle_wrap_ref_unref)
{
        DLManagedTensorVersioned *t = owned_2d(DT(kDLUInt, 8, 1), 2, 4, 21);
        dlx_tensor *h = NULL, *h2 = NULL;

        deleter_runs = 0;
        ck_assert_int_eq(dlx_tensor_wrap(t, &h), 0);
        ck_assert_ptr_nonnull(h);
        ck_assert_ptr_eq(dlx_tensor_dltensor(h), &t->dl_tensor);
        ck_assert_ptr_eq(dlx_tensor_ref(h), h);
        ck_assert_ptr_eq(dlx_tensor_ref(h), h);
        dlx_tensor_unref(h);
        dlx_tensor_unref(h);
        ck_assert_int_eq(deleter_runs, 0);
        ck_assert_uint_eq(pattern_check(dlx_tensor_dltensor(h), 0, 21), 0);
        dlx_tensor_unref(h);
        ck_assert_int_eq(deleter_runs, 1);

        /* NULL-safety */
        dlx_tensor_unref(NULL);
        ck_assert_ptr_null(dlx_tensor_ref(NULL));
        ck_assert_ptr_null(dlx_tensor_dltensor(NULL));
        ck_assert_int_eq(dlx_tensor_wrap(NULL, &h2), -EINVAL);
        ck_assert_ptr_null(h2);

        /* ownership is taken on every path */
        t = owned_2d(DT(kDLUInt, 8, 1), 2, 4, 22);
        ck_assert_int_eq(dlx_tensor_wrap(t, NULL), -EINVAL);
        ck_assert_int_eq(deleter_runs, 2);

        /* a tensor without a deleter is fine: nothing to run */
        {
                static uint8_t bytes[8];
                static int64_t shape[1] = {8};
                static DLManagedTensorVersioned bare = {
                        .version = {1, 3},
                        .dl_tensor = {.data = bytes,
                                      .device = {kDLCPU, 0},
                                      .ndim = 1,
                                      .dtype = {kDLUInt, 8, 1},
                                      .shape = shape},
                };
                ck_assert_int_eq(dlx_tensor_wrap(&bare, &h2), 0);
                dlx_tensor_unref(h2);
        }
}
END_TEST

/* A tensor of another DLPack major version: refused, deleted exactly once, not read after. */
START_TEST(test_handle_wrap_bad_version)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t = owned_2d(DT(kDLUInt, 8, 1), 2, 4, 23);
        dlx_tensor *h = NULL;
        void *obj = NULL;

        deleter_runs = 0;
        t->version.major = 0;
        ck_assert_int_lt(dlx_tensor_wrap(t, &h), 0);
        ck_assert_ptr_null(h);
        ck_assert_int_eq(deleter_runs, 1);

        t = owned_2d(DT(kDLUInt, 8, 1), 2, 4, 24);
        t->version.major = 2;
        ck_assert_int_ne(api->managed_tensor_to_py_object_no_sync(t, &obj), 0);
        ck_assert_ptr_null(obj);
        ck_assert_int_eq(deleter_runs, 2);
}
END_TEST

START_TEST(test_to_object_steals)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t = owned_2d(DT(kDLFloat, 32, 1), 3, 4, 31);
        void *obj = NULL;

        deleter_runs = 0;
        ck_assert_int_eq(api->managed_tensor_to_py_object_no_sync(t, &obj), 0);
        ck_assert_ptr_nonnull(obj);
        ck_assert_ptr_eq(dlx_tensor_dltensor(obj), &t->dl_tensor);
        ck_assert_int_eq(deleter_runs, 0);
        dlx_tensor_unref(obj);
        ck_assert_int_eq(deleter_runs, 1);

        /* no out pointer: still consumed */
        t = owned_2d(DT(kDLFloat, 32, 1), 3, 4, 32);
        ck_assert_int_ne(api->managed_tensor_to_py_object_no_sync(t, NULL), 0);
        ck_assert_int_eq(deleter_runs, 2);
}
END_TEST

START_TEST(test_from_object_keeps_handle)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t = owned_2d(DT(kDLInt, 16, 1), 4, 6, 41);
        DLManagedTensorVersioned *x = NULL, *y = NULL;
        dlx_tensor *h = NULL;

        t->flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        deleter_runs = 0;
        ck_assert_int_eq(dlx_tensor_wrap(t, &h), 0);
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(h, &x), 0);
        ck_assert_ptr_nonnull(x);
        ck_assert_ptr_ne(x, t);
        ck_assert_ptr_nonnull(x->deleter);
        ck_assert_uint_eq(x->version.major, 1);
        ck_assert_uint_eq(x->version.minor, 3);
        ck_assert_uint_eq(x->flags, DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert_ptr_eq(x->dl_tensor.data, t->dl_tensor.data);
        ck_assert_ptr_eq(x->dl_tensor.shape, t->dl_tensor.shape);
        ck_assert_ptr_eq(x->dl_tensor.strides, t->dl_tensor.strides);
        ck_assert_int_eq(x->dl_tensor.ndim, 2);
        ck_assert_uint_eq(x->dl_tensor.byte_offset, 0);
        ck_assert_int_eq(x->dl_tensor.device.device_type, kDLCPU);
        ck_assert_uint_eq(x->dl_tensor.dtype.code, kDLInt);
        ck_assert_uint_eq(x->dl_tensor.dtype.bits, 16);

        /* a second export from the same handle */
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(h, &y), 0);
        ck_assert_ptr_ne(y, x);

        /* the handle goes first: the exports keep it alive */
        dlx_tensor_unref(h);
        ck_assert_int_eq(deleter_runs, 0);
        ck_assert_uint_eq(pattern_check(&x->dl_tensor, 0, 41), 0);
        ck_assert_int_eq(x->dl_tensor.shape[1], 6);
        x->deleter(x);
        ck_assert_int_eq(deleter_runs, 0);
        ck_assert_uint_eq(pattern_check(&y->dl_tensor, 0, 41), 0);
        y->deleter(y);
        ck_assert_int_eq(deleter_runs, 1);

        /* NULL arguments fail without crashing */
        ck_assert_int_ne(api->managed_tensor_from_py_object_no_sync(NULL, &x), 0);
}
END_TEST

START_TEST(test_dltensor_view)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t = owned_2d(DT(kDLFloat, 64, 1), 2, 3, 51);
        DLTensor view;
        dlx_tensor *h = NULL;

        deleter_runs = 0;
        ck_assert_int_eq(dlx_tensor_wrap(t, &h), 0);
        memset(&view, 0x5a, sizeof(view));
        ck_assert_int_eq(api->dltensor_from_py_object_no_sync(h, &view), 0);
        ck_assert_ptr_eq(view.data, t->dl_tensor.data);
        ck_assert_int_eq(view.device.device_type, t->dl_tensor.device.device_type);
        ck_assert_int_eq(view.device.device_id, t->dl_tensor.device.device_id);
        ck_assert_int_eq(view.ndim, t->dl_tensor.ndim);
        ck_assert_uint_eq(view.dtype.code, t->dl_tensor.dtype.code);
        ck_assert_uint_eq(view.dtype.bits, t->dl_tensor.dtype.bits);
        ck_assert_uint_eq(view.dtype.lanes, t->dl_tensor.dtype.lanes);
        ck_assert_ptr_eq(view.shape, t->dl_tensor.shape);
        ck_assert_ptr_eq(view.strides, t->dl_tensor.strides);
        ck_assert_uint_eq(view.byte_offset, t->dl_tensor.byte_offset);
        /* non-owning: no reference taken */
        dlx_tensor_unref(h);
        ck_assert_int_eq(deleter_runs, 1);

        ck_assert_int_ne(api->dltensor_from_py_object_no_sync(NULL, &view), 0);
}
END_TEST

/* dlx_tensor_info and dlx_tensor_sync see an acquired tensor through exports of it. */
START_TEST(test_acquired_through_exports)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t = owned_2d(DT(kDLFloat, 32, 1), 3, 4, 71);
        DLManagedTensorVersioned *a = NULL, *x = NULL, *y = NULL;
        dlx_client *c = fx_connect(&fx, "acq-exports");
        const char *name = NULL, *storage = NULL;
        uint64_t version = 0;
        dlx_tensor *h = NULL, *h2 = NULL;

        ck_assert_int_eq(dlx_publish(c, "ex/acq", t, NULL, &version), 0);
        ck_assert_int_eq(dlx_acquire(c, "ex/acq", NULL, &a), 0);
        ck_assert_int_eq(dlx_tensor_wrap(a, &h), 0);
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(h, &x), 0);
        /* an export of an export: a handle wrapping x, exported again */
        ck_assert_int_eq(dlx_tensor_wrap(x, &h2), 0);
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(h2, &y), 0);
        ck_assert_int_eq(dlx_tensor_info(y, &name, &version, &storage), 0);
        ck_assert_str_eq(name, "ex/acq");
        ck_assert_uint_eq(version, 1);
        ck_assert_str_eq(storage, "memfd");
        /* host memory: nothing to order, any stream */
        ck_assert_int_eq(dlx_tensor_sync(y, NULL), 0);
        ck_assert_int_eq(dlx_tensor_sync(y, (void *)0x2), 0);

        /* what is not acquired is refused, with a reason */
        ck_assert_int_eq(dlx_tensor_sync(NULL, NULL), -EINVAL);
        ck_assert_int_eq(dlx_tensor_info(NULL, NULL, NULL, NULL), -EINVAL);
        t = owned_2d(DT(kDLFloat, 32, 1), 3, 4, 72);
        ck_assert_int_eq(dlx_tensor_sync(t, NULL), -EINVAL);
        ck_assert_str_ne(dlx_last_error(), "");
        ck_assert_int_eq(dlx_tensor_info(t, NULL, NULL, NULL), -EINVAL);
        t->deleter(t);

        y->deleter(y);
        dlx_tensor_unref(h2);
        dlx_tensor_unref(h);
        dlx_close(c);
}
END_TEST

/*
 * A consumer's own tensor over another: the same view, flags of 0, its deleter
 * the inner one's. What tvm-ffi hands back for a tensor it was given.
 */
struct flagless {
        DLManagedTensorVersioned mt;
        DLManagedTensorVersioned *inner;
};

static void flagless_deleter(DLManagedTensorVersioned *t)
{
        struct flagless *f = t->manager_ctx;

        f->inner->deleter(f->inner);
        free(f);
}

static DLManagedTensorVersioned *flagless_over(DLManagedTensorVersioned *inner)
{
        struct flagless *f = calloc(1, sizeof(*f));

        ck_assert_ptr_nonnull(f);
        f->inner = inner;
        f->mt.version = inner->version;
        f->mt.manager_ctx = f;
        f->mt.deleter = flagless_deleter;
        f->mt.dl_tensor = inner->dl_tensor;
        return &f->mt;
}

/* Whether a tensor handed to the table's to_object comes back (exported again) read-only. */
static bool read_only_after_round_trip(DLManagedTensorVersioned *t)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *out = NULL;
        void *obj = NULL;
        bool ro;

        ck_assert_int_eq(api->managed_tensor_to_py_object_no_sync(t, &obj), 0);
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(obj, &out), 0);
        ro = out->flags & DLPACK_FLAG_BITMASK_READ_ONLY;
        out->deleter(out);
        dlx_tensor_unref(obj);
        return ro;
}

/*
 * A read-only tensor that comes back through a consumer which dropped its
 * flags is read-only again: its bytes lie in a read-only mapping, and a
 * writable view of it would crash at the first write. Writable versions and
 * other memory are not marked.
 */
START_TEST(test_read_only_survives_a_flagless_consumer)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *a = NULL, *x = NULL;
        dlx_client *c = fx_connect(&fx, "ro-roundtrip");
        struct dlx_publish_options rw = {.writable = true};
        dlx_tensor *h = NULL;
        int64_t shape[1] = {5}, offset_shape[1] = {2};

        ck_assert_int_eq(
                dlx_publish(c, "ex/ro", owned_2d(DT(kDLFloat, 32, 1), 3, 4, 81), NULL, NULL), 0);
        ck_assert_int_eq(
                dlx_publish(c, "ex/rw", owned_2d(DT(kDLFloat, 32, 1), 3, 4, 82), &rw, NULL), 0);

        /* read-only: the flag goes out with every export, and comes back without one */
        ck_assert_int_eq(dlx_acquire(c, "ex/ro", NULL, &a), 0);
        ck_assert(a->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert_int_eq(dlx_tensor_wrap(a, &h), 0);
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(h, &x), 0);
        ck_assert(x->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
        ck_assert_msg(read_only_after_round_trip(flagless_over(x)),
                      "a read-only mapping came back writable through a flagless consumer");
        /* a view of part of it, through a byte offset and a shape of its own */
        ck_assert_int_eq(api->managed_tensor_from_py_object_no_sync(h, &x), 0);
        DLManagedTensorVersioned *part = flagless_over(x);
        part->dl_tensor.byte_offset = 8;
        part->dl_tensor.ndim = 1;
        part->dl_tensor.shape = offset_shape;
        part->dl_tensor.strides = NULL;
        ck_assert(read_only_after_round_trip(part));
        dlx_tensor_unref(h);

        /* writable: nothing to add */
        ck_assert_int_eq(dlx_acquire(c, "ex/rw", NULL, &a), 0);
        ck_assert(!(a->flags & DLPACK_FLAG_BITMASK_READ_ONLY));
        ck_assert(!read_only_after_round_trip(flagless_over(a)));

        /* memory libdlx never mapped, and memory from dlx_alloc(): as they were */
        ck_assert(!read_only_after_round_trip(owned_2d(DT(kDLUInt, 8, 1), 2, 2, 83)));
        DLTensor proto = {
                .device = {kDLCPU, 0}, .ndim = 1, .dtype = DT(kDLFloat, 32, 1), .shape = shape};
        ck_assert_int_eq(dlx_alloc(c, &proto, &a), 0);
        ck_assert(!read_only_after_round_trip(a));
        dlx_close(c);
}
END_TEST

/* ---- dlx_publish_from -------------------------------------------------------------------------
 */

START_TEST(test_publish_from_own_table)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLManagedTensorVersioned *t = owned_2d(DT(kDLFloat, 32, 1), 5, 7, 61);
        struct expect e = expect_2d("ex/from", DT(kDLFloat, 32, 1), 5, 7, 61);
        dlx_client *c = fx_connect(&fx, "producer");
        uint64_t version = 0;
        void *obj = NULL;
        int err;

        deleter_runs = 0;
        ck_assert_int_eq(api->managed_tensor_to_py_object_no_sync(t, &obj), 0);
        err = dlx_publish_from(c, "ex/from", api, obj, NULL, &version);
        ck_assert_msg(err == 0, "publish_from: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_uint_eq(version, 1);
        /* the object was borrowed: still ours, still alive */
        ck_assert_int_eq(deleter_runs, 0);
        ck_assert_uint_eq(pattern_check(dlx_tensor_dltensor(obj), 0, 61), 0);
        consume_in_child(&e);

        /* writable, and again as a second version */
        e.flags = 0; /* no longer read-only */
        err = dlx_publish_from(c, "ex/from", api, obj,
                               &(struct dlx_publish_options){.writable = true}, &version);
        ck_assert_int_eq(err, 0);
        ck_assert_uint_eq(version, 2);
        consume_in_child(&e);

        dlx_tensor_unref(obj);
        ck_assert_int_eq(deleter_runs, 1);
        dlx_close(c);
        ck_assert_int_eq(deleter_runs, 1);
}
END_TEST

/* Shared memory wrapped in a handle travels through the table too. */
START_TEST(test_publish_from_allocated)
{
        const DLPackExchangeAPI *api = dlx_exchange_api();
        DLTensor proto = cpu_prototype(DT(kDLUInt, 16, 1));
        struct expect e = expect_2d("ex/from-alloc", DT(kDLUInt, 16, 1), 3, 5, 62);
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = NULL;
        struct error_sink sink = {0};
        void *obj = NULL;
        int err;

        ck_assert_int_eq(api->managed_tensor_allocator(&proto, &t, &sink, set_error), 0);
        pattern_fill(&t->dl_tensor, 0, 62);
        ck_assert_int_eq(api->managed_tensor_to_py_object_no_sync(t, &obj), 0);
        err = dlx_publish_from(c, "ex/from-alloc", api, obj, NULL, NULL);
        ck_assert_msg(err == 0, "publish_from: %s (%s)", dlx_strerror(err), dlx_last_error());
        consume_in_child(&e);
        dlx_tensor_unref(obj);
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

/* ---- foreign tables ----------------------------------------------------------------------------
 */

/* A foreign framework's "object": a struct of its own. */
struct foreign_obj {
        int exports;
        uint8_t seed;
};

static int foreign_from_ok(void *object, DLManagedTensorVersioned **out)
{
        struct foreign_obj *f = object;

        f->exports++;
        *out = owned_2d(DT(kDLComplex, 64, 1), 2, 3, f->seed);
        return 0;
}

static int foreign_from_fails(void *object, DLManagedTensorVersioned **out)
{
        struct foreign_obj *f = object;

        f->exports++;
        (void)out;
        return -1;
}

static int foreign_from_null(void *object, DLManagedTensorVersioned **out)
{
        struct foreign_obj *f = object;

        f->exports++;
        *out = NULL;
        return 0;
}

static int foreign_stream(DLDeviceType type, int32_t id, void **out)
{
        (void)type;
        (void)id;
        *out = NULL;
        return 0;
}

START_TEST(test_publish_from_foreign)
{
        DLPackExchangeAPI api = {
                .header = {.version = {1, 2}, .prev_api = NULL},
                .managed_tensor_from_py_object_no_sync = foreign_from_ok,
                .current_work_stream = foreign_stream,
        };
        struct foreign_obj obj = {.seed = 71};
        struct expect e = expect_2d("ex/foreign", DT(kDLComplex, 64, 1), 2, 3, 71);
        dlx_client *c = fx_connect(&fx, "producer");
        uint64_t version = 99;
        int err;

        /* a working foreign table (1.2, only the slots publish needs) */
        deleter_runs = 0;
        err = dlx_publish_from(c, "ex/foreign", &api, &obj, NULL, &version);
        ck_assert_msg(err == 0, "publish_from: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(obj.exports, 1);
        ck_assert_uint_eq(version, 1);
        /* the export was copied and released before publish returned */
        ck_assert_int_eq(deleter_runs, 1);
        consume_in_child(&e);

        /* its export goes through the copy policy like any tensor */
        err = dlx_publish_from(c, "ex/foreign", &api, &obj,
                               &(struct dlx_publish_options){.copy = DLX_COPY_NEVER}, NULL);
        ck_assert_int_eq(err, -EXDEV);
        ck_assert_int_eq(deleter_runs, 2);

        /* the from-object slot fails */
        version = 99;
        api.managed_tensor_from_py_object_no_sync = foreign_from_fails;
        ck_assert_int_eq(dlx_publish_from(c, "ex/foreign-fail", &api, &obj, NULL, &version), -EIO);
        ck_assert_uint_eq(version, 99);
        ck_assert_str_ne(dlx_last_error(), "");
        /* ... or claims success without a tensor */
        api.managed_tensor_from_py_object_no_sync = foreign_from_null;
        ck_assert_int_eq(dlx_publish_from(c, "ex/foreign-fail", &api, &obj, NULL, &version), -EIO);

        /* a table of DLPack major 2: not called at all */
        obj.exports = 0;
        api.managed_tensor_from_py_object_no_sync = foreign_from_ok;
        api.header.version.major = 2;
        api.header.version.minor = 0;
        ck_assert_int_eq(dlx_publish_from(c, "ex/foreign-v2", &api, &obj, NULL, &version),
                         -ENOTSUP);
        ck_assert_int_eq(obj.exports, 0);
        ck_assert_uint_eq(version, 99);

        /* no table, or no from-object slot */
        ck_assert_int_eq(dlx_publish_from(c, "ex/foreign", NULL, &obj, NULL, NULL), -EINVAL);
        api.header.version.major = 1;
        api.managed_tensor_from_py_object_no_sync = NULL;
        ck_assert_int_eq(dlx_publish_from(c, "ex/foreign", &api, &obj, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleter_runs, 2);

        /* none of the failures replaced the published version */
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

/* A foreign table whose export is refused by publish: the export is still released. */
START_TEST(test_publish_from_refused_export)
{
        DLPackExchangeAPI api = {
                .header = {.version = {1, 3}},
                .managed_tensor_from_py_object_no_sync = foreign_from_ok,
        };
        struct foreign_obj obj = {.seed = 72};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = NULL;

        deleter_runs = 0;
        ck_assert_int_eq(dlx_publish_from(c, "bad//name", &api, &obj, NULL, NULL), -EINVAL);
        ck_assert_int_eq(obj.exports, 1);
        ck_assert_int_eq(deleter_runs, 1);
        ck_assert_int_eq(dlx_publish_from(NULL, "ex/x", &api, &obj, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleter_runs, obj.exports);
        ck_assert_int_eq(dlx_acquire(c, "ex/x", NULL, &t), -ENOENT);
        dlx_close(c);
}
END_TEST

Suite *exchange_suite(void)
{
        Suite *s = suite_create("exchange");
        TCase *tc = tcase_create("table");

        /* pure checks still run under the fixture: its fd accounting covers them too */
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_add_test(tc, test_header);
        tcase_add_test(tc, test_current_work_stream);
        tcase_add_test(tc, test_handle_wrap_ref_unref);
        tcase_add_test(tc, test_handle_wrap_bad_version);
        tcase_add_test(tc, test_to_object_steals);
        tcase_add_test(tc, test_from_object_keeps_handle);
        tcase_add_test(tc, test_dltensor_view);
        tcase_add_test(tc, test_acquired_through_exports);
        tcase_add_test(tc, test_read_only_survives_a_flagless_consumer);
        suite_add_tcase(s, tc);

        tc = tcase_create("allocator");
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_add_test(tc, test_allocator_no_client);
        tcase_add_test(tc, test_allocator_skips_closing_client);
        tcase_add_test(tc, test_allocator_bad_prototypes);
        tcase_add_test(tc, test_allocator_publish);
        tcase_add_test(tc, test_allocator_default_client);
        tcase_add_test(tc, test_allocator_default_restored);
        suite_add_tcase(s, tc);

        tc = tcase_create("publish_from");
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_add_test(tc, test_publish_from_own_table);
        tcase_add_test(tc, test_publish_from_allocated);
        tcase_add_test(tc, test_publish_from_foreign);
        tcase_add_test(tc, test_publish_from_refused_export);
        suite_add_tcase(s, tc);
        return s;
}
