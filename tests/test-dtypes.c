/* SPDX-License-Identifier: MIT */
/*
 * Every dtype dlx accepts round-trips exactly between two processes, through
 * both publish paths (zero-copy from dlx_alloc() memory, one copy from other
 * memory), together with the layouts around them: 0-d, empty, strided,
 * negative strides, byte_offset, the legacy tensor, the copy policies, and the
 * tensors publish must refuse.
 *
 * The producer is the test process; every consumer is a child (fx_spawn) with
 * a client of its own, so the bytes really cross a process boundary. Children
 * report what went wrong on stderr and exit non-zero.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"
#include "tensors.h"

/* ---- the dtypes -------------------------------------------------------------------------- */

struct dtype_case {
        const char *label;
        DLDataType dt;
        uint64_t flags;
};

#define DTI(code, bits, lanes)                                                                     \
        {                                                                                          \
                (uint8_t)(code), (uint8_t)(bits), (uint16_t)(lanes)                                \
        }
#define PADDED DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED

static const struct dtype_case dtypes[] = {
        {"int8", DTI(kDLInt, 8, 1), 0},
        {"int16", DTI(kDLInt, 16, 1), 0},
        {"int32", DTI(kDLInt, 32, 1), 0},
        {"int64", DTI(kDLInt, 64, 1), 0},
        {"uint8", DTI(kDLUInt, 8, 1), 0},
        {"uint16", DTI(kDLUInt, 16, 1), 0},
        {"uint32", DTI(kDLUInt, 32, 1), 0},
        {"uint64", DTI(kDLUInt, 64, 1), 0},
        {"float16", DTI(kDLFloat, 16, 1), 0},
        {"float32", DTI(kDLFloat, 32, 1), 0},
        {"float64", DTI(kDLFloat, 64, 1), 0},
        {"bfloat16", DTI(kDLBfloat, 16, 1), 0},
        {"complex32", DTI(kDLComplex, 32, 1), 0},
        {"complex64", DTI(kDLComplex, 64, 1), 0},
        {"complex128", DTI(kDLComplex, 128, 1), 0},
        {"bool", DTI(kDLBool, 8, 1), 0},
        {"float8_e3m4", DTI(kDLFloat8_e3m4, 8, 1), 0},
        {"float8_e4m3", DTI(kDLFloat8_e4m3, 8, 1), 0},
        {"float8_e4m3b11fnuz", DTI(kDLFloat8_e4m3b11fnuz, 8, 1), 0},
        {"float8_e4m3fn", DTI(kDLFloat8_e4m3fn, 8, 1), 0},
        {"float8_e4m3fnuz", DTI(kDLFloat8_e4m3fnuz, 8, 1), 0},
        {"float8_e5m2", DTI(kDLFloat8_e5m2, 8, 1), 0},
        {"float8_e5m2fnuz", DTI(kDLFloat8_e5m2fnuz, 8, 1), 0},
        {"float8_e8m0fnu", DTI(kDLFloat8_e8m0fnu, 8, 1), 0},
        {"float6_e2m3fn", DTI(kDLFloat6_e2m3fn, 6, 1), 0},
        {"float6_e3m2fn", DTI(kDLFloat6_e3m2fn, 6, 1), 0},
        {"float4_e2m1fn", DTI(kDLFloat4_e2m1fn, 4, 1), 0},
        {"int4", DTI(kDLInt, 4, 1), 0},
        {"uint4", DTI(kDLUInt, 4, 1), 0},
        {"float32x4", DTI(kDLFloat, 32, 4), 0},
        {"int8x3", DTI(kDLInt, 8, 3), 0},
        {"int4x2", DTI(kDLInt, 4, 2), 0},                    /* sub-byte lanes filling a byte */
        {"float6_e3m2fnx4", DTI(kDLFloat6_e3m2fn, 6, 4), 0}, /* 24 bits: 3 bytes */
        {"uint2", DTI(kDLUInt, 2, 1), 0},
        {"int1", DTI(kDLInt, 1, 1), 0},
        {"float4_e2m1fnx3", DTI(kDLFloat4_e2m1fn, 4, 3), 0}, /* 12 bits: packed */
        {"int4 padded", DTI(kDLInt, 4, 1), PADDED},
        {"uint4 padded", DTI(kDLUInt, 4, 1), PADDED},
        {"float4_e2m1fn padded", DTI(kDLFloat4_e2m1fn, 4, 1), PADDED},
        {"float6_e2m3fn padded", DTI(kDLFloat6_e2m3fn, 6, 1), PADDED},
        {"float6_e3m2fn padded", DTI(kDLFloat6_e3m2fn, 6, 1), PADDED},
};
#define NDTYPES ((int)(N_ELEMS(dtypes)))

/* 3 x 5: an odd element count, so packed 4- and 6-bit tensors end in a partial byte. */
static const int64_t shape35[2] = {3, 5};

/* Zero-copy: filled in place in dlx_alloc() memory, published with DLX_COPY_NEVER. */
START_TEST(test_dtype_zero_copy)
{
        const struct dtype_case *dc = &dtypes[_i];
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t;
        struct dlx_publish_options o = {.copy = DLX_COPY_NEVER};
        uint64_t version = 0;
        struct expect e;

        if (dc->flags & PADDED) {
                /* dlx_alloc() knows no flags: take one byte per element and describe it */
                t = alloc_or_fail(c, DT(kDLUInt, 8, 1), 2, shape35);
                t->dl_tensor.dtype = dc->dt;
                t->flags |= dc->flags;
        } else {
                t = alloc_or_fail(c, dc->dt, 2, shape35);
        }
        ck_assert_uint_eq(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY, 0);
        ck_assert_uint_eq((uintptr_t)t->dl_tensor.data % 64, 0);
        pattern_fill(&t->dl_tensor, t->flags, (uint8_t)_i);
        e = expect_of("dt/zero-copy", t, true, false, (uint8_t)_i);
        publish_ok(c, "dt/zero-copy", t, &o, &version);
        ck_assert_uint_eq(version, 1);
        e.version = 1;
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

/* One copy: malloc'd memory; the deleter runs exactly once, before publish returns. */
START_TEST(test_dtype_copy)
{
        const struct dtype_case *dc = &dtypes[_i];
        dlx_client *c = fx_connect(&fx, "producer");
        struct owned *o = owned_compact(dc->dt, 2, shape35, dc->flags, (uint8_t)(_i + 100));
        struct expect e = expect_of("dt/copy", &o->mt, false, false, (uint8_t)(_i + 100));

        deleter_runs = 0;
        publish_ok(c, "dt/copy", &o->mt, NULL, NULL);
        ck_assert_int_eq(deleter_runs, 1);
        consume_in_child(&e);
        dlx_close(c);
        ck_assert_int_eq(deleter_runs, 1);
}
END_TEST

/* The same dtype table, rank 1 with one element and rank 3: shapes beyond the common 2-d. */
START_TEST(test_dtype_shapes)
{
        static const int64_t shapes[][3] = {{1, 0, 0}, {2, 3, 7}};
        static const int32_t ndims[] = {1, 3};
        dlx_client *c = fx_connect(&fx, "producer");

        for (int k = 0; k < 2; k++) {
                for (int i = 0; i < NDTYPES; i++) {
                        const struct dtype_case *dc = &dtypes[i];
                        struct owned *o =
                                owned_compact(dc->dt, ndims[k], shapes[k], dc->flags, (uint8_t)i);
                        struct expect e = expect_of("dt/shapes", &o->mt, false, false, (uint8_t)i);
                        uint64_t version = 0;
                        publish_ok(c, "dt/shapes", &o->mt, NULL, &version);
                        /* every publish under the name is the next version */
                        ck_assert_uint_eq(version, (uint64_t)(k * NDTYPES + i + 1));
                        e.version = version;
                        consume_in_child(&e);
                }
        }
        dlx_close(c);
}
END_TEST

/* ---- layouts ------------------------------------------------------------------------------ */

START_TEST(test_zero_dim)
{
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = alloc_or_fail(c, DT(kDLFloat, 64, 1), 0, NULL);
        struct owned *o;
        struct expect e;

        ck_assert_int_eq(t->dl_tensor.ndim, 0);
        pattern_fill(&t->dl_tensor, 0, 7);
        e = expect_of("dt/scalar", t, true, false, 7);
        publish_ok(c, "dt/scalar", t, &(struct dlx_publish_options){.copy = DLX_COPY_NEVER}, NULL);
        consume_in_child(&e);

        o = owned_compact(DT(kDLComplex, 128, 1), 0, NULL, 0, 8);
        e = expect_of("dt/scalar-copy", &o->mt, true, false, 8);
        deleter_runs = 0;
        publish_ok(c, "dt/scalar-copy", &o->mt, NULL, NULL);
        ck_assert_int_eq(deleter_runs, 1);
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

START_TEST(test_size_zero)
{
        static const int64_t shape[3] = {4, 0, 3};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = alloc_or_fail(c, DT(kDLFloat, 32, 1), 3, shape);
        struct owned *o;
        struct expect e;

        e = expect_of("dt/empty", t, true, false, 0);
        publish_ok(c, "dt/empty", t, &(struct dlx_publish_options){.copy = DLX_COPY_NEVER}, NULL);
        consume_in_child(&e);

        /* malloc'd, and with no data pointer at all: nothing to copy either way */
        deleter_runs = 0;
        o = owned_new(DT(kDLInt, 16, 1), 3, shape, NULL, 0, 0, 8, 0);
        e = expect_of("dt/empty-copy", &o->mt, false, false, 0);
        publish_ok(c, "dt/empty-copy", &o->mt, NULL, NULL);
        consume_in_child(&e);
        o = owned_new(DT(kDLInt, 16, 1), 3, shape, NULL, 0, 0, 0, 0);
        e = expect_of("dt/empty-null", &o->mt, false, false, 0);
        publish_ok(c, "dt/empty-null", &o->mt, NULL, NULL);
        consume_in_child(&e);
        ck_assert_int_eq(deleter_runs, 2);

        /* a packed dtype with a zero dimension */
        o = owned_new(DT(kDLFloat4_e2m1fn, 4, 1), 3, shape, NULL, 0, 0, 0, 0);
        e = expect_of("dt/empty-fp4", &o->mt, false, false, 0);
        publish_ok(c, "dt/empty-fp4", &o->mt, NULL, NULL);
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

/*
 * Zero-copy views into dlx_alloc() memory of alloc_shape: the strides must
 * come back exactly. A view may say another dtype (with flags) over the
 * bytes, and move the data pointer data_at elements on.
 */
static const struct strided_zero_copy_row {
        const char *name;
        DLDataType alloc_dt;
        int32_t ndim;
        int64_t alloc_shape[2];
        DLDataType dt;
        uint64_t flags;
        int64_t shape[2], strides[2];
        int64_t data_at;
        bool default_policy;
} strided_zero_copy_rows[] = {
        /* a transposed 4 x 6: 6 x 4 with strides {1, 6} */
        {"dt/transposed", DTI(kDLFloat, 32, 1), 2, {4, 6}, .shape = {6, 4}, .strides = {1, 6}},
        /* every other element of 10 */
        {"dt/every-other", DTI(kDLInt, 16, 1), 1, {10}, .shape = {5}, .strides = {2}},
        /* every other row and column of a 4 x 12 complex64 */
        {"dt/every-other-2d",
         DTI(kDLComplex, 64, 1),
         2,
         {4, 12},
         .shape = {2, 6},
         .strides = {24, 2}},
        /* padded sub-byte elements are addressable: strides are allowed */
        {"dt/padded-transposed",
         DTI(kDLUInt, 8, 1),
         2,
         {4, 6},
         DTI(kDLInt, 4, 1),
         PADDED,
         {6, 4},
         {1, 6}},
        /* reversed in place: the data pointer moved to the last element, stride -1 */
        {"dt/reversed",
         DTI(kDLInt, 32, 1),
         1,
         {10},
         .shape = {10},
         .strides = {-1},
         .data_at = 9,
         .default_policy = true},
};

START_TEST(strided_zero_copy_keeps_the_strides)
{
        const struct strided_zero_copy_row *row = &strided_zero_copy_rows[_i];
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = alloc_or_fail(c, row->alloc_dt, row->ndim, row->alloc_shape);
        DLTensor *d = &t->dl_tensor;
        struct expect e;

        if (row->dt.bits)
                d->dtype = row->dt;
        t->flags |= row->flags;
        d->data = (uint8_t *)d->data + row->data_at * (d->dtype.bits * d->dtype.lanes / 8);
        for (int32_t k = 0; k < row->ndim; k++) {
                d->shape[k] = row->shape[k];
                d->strides[k] = row->strides[k];
        }
        pattern_fill(d, t->flags, (uint8_t)(21 + _i));
        e = expect_of(row->name, t, true, false, (uint8_t)(21 + _i));
        for (int32_t k = 0; k < row->ndim; k++)
                ck_assert_int_eq(e.strides[k], row->strides[k]);
        publish_ok(c, row->name, t, row->default_policy ? NULL : &never, NULL);
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

/*
 * Copies of strided malloc'd views, negative strides included: the values
 * must match, and the deleter runs once, by the time publish returns.
 */
static const struct strided_copy_row {
        const char *name;
        DLDataType dt;
        int32_t ndim;
        int64_t shape[2], strides[2];
        uint64_t byte_offset, flags;
        size_t bufsize, data_at;
} strided_copy_rows[] = {
        {"dt/c-transposed", DTI(kDLFloat, 64, 1), 2, {6, 4}, {1, 6}, 0, 0, 24 * 8, 0},
        {"dt/c-every-other", DTI(kDLUInt, 32, 1), 1, {5}, {2}, 0, 0, 10 * 4, 0},
        /* the data pointer at the last element */
        {"dt/c-reversed", DTI(kDLInt, 64, 1), 1, {5}, {-1}, 0, 0, 5 * 8, 4 * 8},
        /* data at the start of the last row */
        {"dt/c-flip-rows", DTI(kDLBfloat, 16, 1), 2, {3, 4}, {-4, 1}, 0, 0, 12 * 2, 8 * 2},
        /* both axes flipped: data at the very last element */
        {"dt/c-flip-both", DTI(kDLFloat, 32, 4), 2, {3, 4}, {-4, -1}, 0, 0, 12 * 16, 11 * 16},
        /* transposed and reversed, with a byte_offset on top */
        {"dt/c-neg-transposed", DTI(kDLInt, 8, 1), 2, {6, 4}, {-1, -6}, 16, 0, 16 + 24, 23},
        /* padded int4, every other element */
        {"dt/c-padded-strided", DTI(kDLInt, 4, 1), 1, {5}, {2}, 0, PADDED, 10, 0},
};

START_TEST(strided_copy_keeps_the_values)
{
        const struct strided_copy_row *row = &strided_copy_rows[_i];
        dlx_client *c = fx_connect(&fx, "producer");
        struct owned *o = owned_new(row->dt, row->ndim, row->shape, row->strides, row->byte_offset,
                                    row->flags, row->bufsize, row->data_at);
        struct expect e;

        deleter_runs = 0;
        pattern_fill(&o->mt.dl_tensor, row->flags, (uint8_t)(31 + _i));
        e = expect_of(row->name, &o->mt, false, false, (uint8_t)(31 + _i));
        publish_ok(c, row->name, &o->mt, NULL, NULL);
        ck_assert_int_eq(deleter_runs, 1);
        consume_in_child(&e);
        dlx_close(c);
        ck_assert_int_eq(deleter_runs, 1);
}
END_TEST

/* Packed sub-byte dtypes are compact only, on both paths. */
START_TEST(test_packed_strided_rejected)
{
        static const int64_t shape[2] = {4, 4}, strides[2] = {1, 4};
        static const DLDataType packed[] = {
                DTI(kDLFloat6_e2m3fn, 6, 1), DTI(kDLFloat6_e3m2fn, 6, 1),
                DTI(kDLFloat4_e2m1fn, 4, 1), DTI(kDLInt, 4, 1), DTI(kDLUInt, 4, 1)};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = NULL;
        int err;

        for (size_t i = 0; i < N_ELEMS(packed); i++) {
                struct owned *o = owned_new(packed[i], 2, shape, strides, 0, 0, 16, 0);
                deleter_runs = 0;
                err = dlx_publish(c, "dt/packed-strided", &o->mt, NULL, NULL);
                ck_assert_msg(err == -EINVAL, "dtype %u/%u strided: %s", packed[i].code,
                              packed[i].bits, dlx_strerror(err));
                ck_assert_int_eq(deleter_runs, 1);

                t = alloc_or_fail(c, packed[i], 2, shape);
                t->dl_tensor.strides[0] = 1;
                t->dl_tensor.strides[1] = 4;
                err = dlx_publish(c, "dt/packed-strided", t, NULL, NULL);
                ck_assert_msg(err == -EINVAL, "dtype %u/%u strided zero-copy: %s", packed[i].code,
                              packed[i].bits, dlx_strerror(err));
        }
        ck_assert_int_eq(dlx_acquire(c, "dt/packed-strided", NULL, &t), -ENOENT);
        dlx_close(c);
}
END_TEST

START_TEST(test_byte_offset_zero_copy)
{
        static const int64_t region[2] = {1, 128 + 12 * 4};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = alloc_or_fail(c, DT(kDLUInt, 8, 1), 2, region);
        struct expect e;
        uint8_t *base = t->dl_tensor.data;

        memset(base, 0xab, 128);
        /* a 3 x 4 float32 view 128 bytes into the region */
        t->dl_tensor.dtype = DT(kDLFloat, 32, 1);
        t->dl_tensor.shape[0] = 3;
        t->dl_tensor.shape[1] = 4;
        t->dl_tensor.strides[0] = 4;
        t->dl_tensor.strides[1] = 1;
        t->dl_tensor.byte_offset = 128;
        pattern_fill(&t->dl_tensor, 0, 41);
        e = expect_of("dt/byte-offset", t, true, false, 41);
        ck_assert_uint_eq(e.byte_offset, 128);
        publish_ok(c, "dt/byte-offset", t, &(struct dlx_publish_options){.copy = DLX_COPY_NEVER},
                   NULL);
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

START_TEST(test_byte_offset_copy)
{
        static const int64_t shape[2] = {3, 4}, strides[2] = {1, 3};
        dlx_client *c = fx_connect(&fx, "producer");
        struct owned *o;
        struct expect e;

        deleter_runs = 0;
        o = owned_new(DT(kDLFloat, 32, 1), 2, shape, NULL, 128, 0, 128 + 48, 0);
        pattern_fill(&o->mt.dl_tensor, 0, 42);
        e = expect_of("dt/c-byte-offset", &o->mt, false, false, 42);
        publish_ok(c, "dt/c-byte-offset", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* an odd byte_offset, with strides */
        o = owned_new(DT(kDLInt, 16, 1), 2, shape, strides, 3, 0, 3 + 24, 0);
        pattern_fill(&o->mt.dl_tensor, 0, 43);
        e = expect_of("dt/c-odd-offset", &o->mt, false, false, 43);
        publish_ok(c, "dt/c-odd-offset", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* a packed dtype 5 bytes in */
        o = owned_new(DT(kDLFloat4_e2m1fn, 4, 1), 2, shape, NULL, 5, 0, 5 + 6, 0);
        pattern_fill(&o->mt.dl_tensor, 0, 44);
        e = expect_of("dt/c-packed-offset", &o->mt, false, false, 44);
        publish_ok(c, "dt/c-packed-offset", &o->mt, NULL, NULL);
        consume_in_child(&e);
        ck_assert_int_eq(deleter_runs, 3);
        dlx_close(c);
}
END_TEST

/* ---- the legacy tensor -------------------------------------------------------------------- */

static int legacy_runs;

static void legacy_deleter(DLManagedTensor *t)
{
        legacy_runs++;
        free(t->dl_tensor.data);
        free(t->dl_tensor.shape);
        free(t);
}

static DLManagedTensor *legacy_new(DLDataType dt, int64_t rows, int64_t cols, uint8_t seed)
{
        DLManagedTensor *t = calloc(1, sizeof(*t));
        int64_t *shape = malloc(2 * sizeof(int64_t));

        ck_assert_ptr_nonnull(t);
        ck_assert_ptr_nonnull(shape);
        shape[0] = rows;
        shape[1] = cols;
        t->dl_tensor.data = malloc(elem_size(dt, 0) ? (size_t)(rows * cols) * elem_size(dt, 0)
                                                    : packed_bytes(dt, (uint64_t)(rows * cols)));
        ck_assert_ptr_nonnull(t->dl_tensor.data);
        t->dl_tensor.device.device_type = kDLCPU;
        t->dl_tensor.ndim = 2;
        t->dl_tensor.dtype = dt;
        t->dl_tensor.shape = shape;
        t->deleter = legacy_deleter;
        pattern_fill(&t->dl_tensor, 0, seed);
        return t;
}

START_TEST(test_legacy)
{
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensor *t = legacy_new(DT(kDLFloat, 64, 1), 3, 7, 51);
        struct expect e = {.name = "dt/legacy", .dtype = DT(kDLFloat, 64, 1), .ndim = 2};
        uint64_t version = 0;
        int err;

        e.shape[0] = 3;
        e.shape[1] = 7;
        e.strides[0] = 7;
        e.strides[1] = 1;
        e.exact = true;
        e.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        e.seed = 51;
        legacy_runs = 0;
        err = dlx_publish_legacy(c, "dt/legacy", t, NULL, &version);
        ck_assert_msg(err == 0, "publish_legacy: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_int_eq(legacy_runs, 1);
        ck_assert_uint_eq(version, 1);
        consume_in_child(&e);

        /* a refused legacy tensor is deleted too, once */
        t = legacy_new(DT(kDLFloat, 7, 1), 2, 2, 52);
        err = dlx_publish_legacy(c, "dt/legacy-bad", t, NULL, NULL);
        ck_assert_int_eq(err, -EINVAL);
        ck_assert_int_eq(legacy_runs, 2);

        /* a legacy tensor with DLX_COPY_NEVER: not dlx_alloc() memory */
        t = legacy_new(DT(kDLInt, 32, 1), 2, 2, 53);
        err = dlx_publish_legacy(c, "dt/legacy-never", t,
                                 &(struct dlx_publish_options){.copy = DLX_COPY_NEVER}, NULL);
        ck_assert_int_eq(err, -EXDEV);
        ck_assert_int_eq(legacy_runs, 3);
        dlx_close(c);
        ck_assert_int_eq(legacy_runs, 3);
}
END_TEST

/* ---- copy policies -------------------------------------------------------------------------- */

START_TEST(test_copy_never_malloc)
{
        static const int64_t shape[1] = {16};
        dlx_client *c = fx_connect(&fx, "producer");
        struct owned *o = owned_compact(DT(kDLFloat, 32, 1), 1, shape, 0, 61);
        DLManagedTensorVersioned *t = NULL;
        int err;

        deleter_runs = 0;
        err = dlx_publish(c, "dt/never", &o->mt,
                          &(struct dlx_publish_options){.copy = DLX_COPY_NEVER}, NULL);
        ck_assert_int_eq(err, -EXDEV);
        ck_assert_int_eq(deleter_runs, 1);
        ck_assert_int_eq(dlx_acquire(c, "dt/never", NULL, &t), -ENOENT);
        ck_assert_ptr_null(t);
        dlx_close(c);
}
END_TEST

/* dlx_alloc() memory of another client is not this client's: copy, or -EXDEV. */
START_TEST(test_alloc_of_other_client)
{
        static const int64_t shape[1] = {32};
        dlx_client *a = fx_connect(&fx, "allocator");
        dlx_client *b = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = alloc_or_fail(a, DT(kDLInt, 32, 1), 1, shape);
        struct expect e;

        pattern_fill(&t->dl_tensor, 0, 62);
        ck_assert_int_eq(dlx_publish(b, "dt/other", t,
                                     &(struct dlx_publish_options){.copy = DLX_COPY_NEVER}, NULL),
                         -EXDEV);

        t = alloc_or_fail(a, DT(kDLInt, 32, 1), 1, shape);
        pattern_fill(&t->dl_tensor, 0, 63);
        e = expect_of("dt/other", t, false, false, 63);
        publish_ok(b, "dt/other", t, NULL, NULL);
        /* b copied it: a's going away changes nothing */
        dlx_close(a);
        consume_in_child(&e);
        dlx_close(b);
}
END_TEST

START_TEST(test_copy_always)
{
        static const int64_t shape[1] = {4096};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = alloc_or_fail(c, DT(kDLUInt, 8, 1), 1, shape);
        DLManagedTensorVersioned *again, *mine = NULL;
        struct dlx_info info;
        struct expect e;
        uint8_t *p = t->dl_tensor.data;

        pattern_fill(&t->dl_tensor, 0, 71);
        e = expect_of("dt/always", t, true, false, 71);
        publish_ok(c, "dt/always", t, &(struct dlx_publish_options){.copy = DLX_COPY_ALWAYS}, NULL);
        consume_in_child(&e);

        /*
         * The producer's memory changes afterwards. Its tensor was handed over (and, being
         * copied, deleted), so the same arena memory is allocated again and overwritten.
         */
        again = alloc_or_fail(c, DT(kDLUInt, 8, 1), 1, shape);
        pattern_fill(&again->dl_tensor, 0, 72);
        if (again->dl_tensor.data != p) {
                /* another chunk: overwrite the old one too, it is still mapped by the arena */
                DLTensor old = again->dl_tensor;
                old.data = p;
                pattern_fill(&old, 0, 72);
        }
        consume_in_child(&e);

        /* the producer's own acquire sees the copy, not its arena */
        ck_assert_int_eq(dlx_acquire(c, "dt/always", NULL, &mine), 0);
        ck_assert_ptr_ne(mine->dl_tensor.data, p);
        ck_assert_uint_eq(pattern_check(&mine->dl_tensor, 0, 71), 0);
        ck_assert_int_eq(fx_wait_leases(c, 1, 5000), 1);
        ck_assert_int_eq(dlx_stat(c, "dt/always", &info), 0);
        ck_assert_uint_eq(info.leases, 1);
        mine->deleter(mine);
        again->deleter(again);
        dlx_close(c);
}
END_TEST

/* The zero-copy contrast: a writable mapping of the producer's memory is the memory itself. */
START_TEST(test_zero_copy_shares_pages)
{
        static const int64_t shape[1] = {256};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = alloc_or_fail(c, DT(kDLUInt, 8, 1), 1, shape);
        struct expect e;

        pattern_fill(&t->dl_tensor, 0, 81);
        e = expect_of("dt/shared", t, true, true, 81);
        e.write = true;
        e.write_seed = 82;
        publish_ok(c, "dt/shared", t,
                   &(struct dlx_publish_options){.copy = DLX_COPY_NEVER, .writable = true}, NULL);
        /* the first consumer writes; the second sees it */
        consume_in_child(&e);
        e.seed = 82;
        e.write = false;
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

START_TEST(test_writable_copy)
{
        static const int64_t shape[2] = {8, 8};
        dlx_client *c = fx_connect(&fx, "producer");
        struct owned *o = owned_compact(DT(kDLInt, 16, 1), 2, shape, 0, 83);
        struct expect e = expect_of("dt/writable", &o->mt, false, true, 83);

        ck_assert_uint_eq(e.flags, 0);
        publish_ok(c, "dt/writable", &o->mt, &(struct dlx_publish_options){.writable = true}, NULL);
        e.write = true;
        e.write_seed = 84;
        consume_in_child(&e);
        e.seed = 84;
        e.write = false;
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

static void on_segv(int sig)
{
        (void)sig;
        _exit(42);
}

/* A consumer that writes through a READ_ONLY tensor; faults (exit 42) if the mapping is. */
static int write_read_only(void *arg)
{
        const char *name = arg;
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "writer"};
        struct sigaction sa = {.sa_handler = on_segv};
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c = NULL;

        if (dlx_connect(&o, &c) < 0 || dlx_acquire(c, name, NULL, &t) < 0)
                return child_fail("cannot acquire '%s'", name);
        if (!(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY))
                return child_fail("'%s' is not READ_ONLY", name);
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        *(volatile uint8_t *)((uint8_t *)t->dl_tensor.data + t->dl_tensor.byte_offset) = 0;
        return child_fail("wrote through the READ_ONLY tensor '%s'", name);
}

START_TEST(test_read_only_enforced)
{
        static const int64_t shape[1] = {64};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = alloc_or_fail(c, DT(kDLUInt, 8, 1), 1, shape);
        struct owned *o = owned_compact(DT(kDLUInt, 8, 1), 1, shape, 0, 86);
        struct expect e;

        pattern_fill(&t->dl_tensor, 0, 85);
        e = expect_of("dt/ro", t, true, false, 85);
        publish_ok(c, "dt/ro", t, NULL, NULL);
        ck_assert_int_eq(fx_wait(fx_spawn(write_read_only, "dt/ro")), 42);
        consume_in_child(&e);

        e = expect_of("dt/ro-copy", &o->mt, false, false, 86);
        publish_ok(c, "dt/ro-copy", &o->mt, NULL, NULL);
        ck_assert_int_eq(fx_wait(fx_spawn(write_read_only, "dt/ro-copy")), 42);
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------------- */

static void refuse(dlx_client *c, struct owned *o, int want, const char *what)
{
        int err;

        deleter_runs = 0;
        err = dlx_publish(c, "dt/refused", &o->mt, NULL, NULL);
        ck_assert_msg(err == want, "%s: publish gave %d (%s), not %d", what, err, dlx_strerror(err),
                      want);
        ck_assert_msg(deleter_runs == 1, "%s: the deleter ran %d times", what, deleter_runs);
        ck_assert_str_ne(dlx_last_error(), "");
}

START_TEST(test_rejected_dtypes)
{
        static const int64_t shape[1] = {4};
        static const struct {
                DLDataType dt;
                const char *what;
        } bad[] = {
                {DTI(kDLOpaqueHandle, 64, 1), "opaque handle"},
                {DTI(kDLFloat, 7, 1), "float with 7 bits"},
                {DTI(kDLFloat, 32, 0), "zero lanes"},
                {DTI(kDLInt, 0, 1), "zero bits"},
                {DTI(kDLBool, 16, 1), "bool of 16 bits"},
                {DTI(kDLFloat8_e5m2, 16, 1), "fp8 of 16 bits"},
                {DTI(kDLFloat4_e2m1fn, 8, 1), "fp4 of 8 bits"},
                {DTI(kDLComplex, 16, 1), "complex of 16 bits"},
                {DTI(18, 8, 1), "unknown code 18"},
        };
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = NULL;

        for (size_t i = 0; i < N_ELEMS(bad); i++) {
                DLTensor proto = {.device = {kDLCPU, 0}, .ndim = 1, .dtype = bad[i].dt};
                refuse(c, owned_new(bad[i].dt, 1, shape, NULL, 0, 0, 64, 0), -EINVAL, bad[i].what);
                proto.shape = (int64_t *)shape;
                ck_assert_msg(dlx_alloc(c, &proto, &t) == -EINVAL, "dlx_alloc took %s",
                              bad[i].what);
        }
        ck_assert_ptr_null(t);
        ck_assert_int_eq(dlx_acquire(c, "dt/refused", NULL, &t), -ENOENT);
        dlx_close(c);
}
END_TEST

START_TEST(test_rejected_layouts)
{
        int64_t shape[DLX_MAX_NDIM + 1];
        static const int64_t negative[2] = {2, -1};
        dlx_client *c = fx_connect(&fx, "producer");
        struct owned *o;
        uint64_t version = 77;

        for (int i = 0; i <= DLX_MAX_NDIM; i++)
                shape[i] = 1;
        /* 32 dimensions are fine, 33 are not */
        o = owned_compact(DT(kDLInt, 8, 1), DLX_MAX_NDIM, shape, 0, 91);
        struct expect e = expect_of("dt/rank32", &o->mt, true, false, 91);
        publish_ok(c, "dt/rank32", &o->mt, NULL, NULL);
        consume_in_child(&e);
        refuse(c, owned_new(DT(kDLInt, 8, 1), DLX_MAX_NDIM + 1, shape, NULL, 0, 0, 8, 0), -EINVAL,
               "ndim 33");
        refuse(c, owned_new(DT(kDLInt, 8, 1), -1, shape, NULL, 0, 0, 8, 0), -EINVAL, "ndim -1");
        refuse(c, owned_new(DT(kDLInt, 8, 1), 2, negative, NULL, 0, 0, 8, 0), -EINVAL,
               "negative shape");
        /* a non-empty tensor without data */
        refuse(c, owned_new(DT(kDLInt, 8, 1), 1, shape, NULL, 0, 0, 0, 0), -EINVAL, "NULL data");
        /* ndim 1 without a shape */
        o = owned_new(DT(kDLInt, 8, 1), 1, shape, NULL, 0, 0, 8, 0);
        o->mt.dl_tensor.shape = NULL;
        refuse(c, o, -EINVAL, "NULL shape");

        /* a device dlx cannot share */
        o = owned_new(DT(kDLFloat, 32, 1), 1, shape, NULL, 0, 0, 8, 0);
        o->mt.dl_tensor.device.device_type = kDLOpenCL;
        refuse(c, o, -ENOTSUP, "kDLOpenCL");
        /* CUDA memory on a host without a driver (or a build without CUDA): a clear refusal */
        o = owned_new(DT(kDLFloat, 32, 1), 1, shape, NULL, 0, 0, 8, 0);
        o->mt.dl_tensor.device.device_type = kDLCUDA;
        deleter_runs = 0;
        {
                int err = dlx_publish(c, "dt/refused", &o->mt, NULL, NULL);
                /* no driver, no CUDA build, or (with a GPU) host memory is no device memory */
                ck_assert_msg(err == -ENODEV || err == -ENOTSUP || err == -EINVAL,
                              "kDLCUDA: publish gave %d", err);
                expect_last_error("CUDA");
                ck_assert_int_eq(deleter_runs, 1);
        }
        o = owned_new(DT(kDLFloat, 32, 1), 1, shape, NULL, 0, 0, 8, 0);
        o->mt.dl_tensor.device = (DLDevice){kDLCUDA, 1};
        deleter_runs = 0;
        ck_assert_int_eq(dlx_publish(c, "dt/refused", &o->mt,
                                     &(struct dlx_publish_options){.copy = DLX_COPY_ALWAYS},
                                     &version),
                         -ENOTSUP);
        ck_assert_int_eq(deleter_runs, 1);
        ck_assert_uint_eq(version, 77); /* untouched on failure */

        /* a bad name */
        deleter_runs = 0;
        o = owned_compact(DT(kDLInt, 8, 1), 1, shape, 0, 93);
        ck_assert_int_eq(dlx_publish(c, "dt/../x", &o->mt, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleter_runs, 1);
        /* NULL client: still consumed */
        o = owned_compact(DT(kDLInt, 8, 1), 1, shape, 0, 95);
        ck_assert_int_eq(dlx_publish(NULL, "dt/x", &o->mt, NULL, NULL), -EINVAL);
        ck_assert_int_eq(deleter_runs, 2);

        DLManagedTensorVersioned *t = NULL;
        DLTensor proto = {.device = {kDLOpenCL, 0}, .ndim = 1, .dtype = DT(kDLFloat, 32, 1)};
        proto.shape = shape;
        ck_assert_int_eq(dlx_alloc(c, &proto, &t), -ENOTSUP);
        /* CUDA memory without a driver (or a build without CUDA): refused clearly */
        proto.device.device_type = kDLCUDA;
        {
                int err = dlx_alloc(c, &proto, &t);
                if (err == 0) {
                        /* a host with a GPU: a real VMM allocation */
                        ck_assert_int_eq(t->dl_tensor.device.device_type, kDLCUDA);
                        t->deleter(t);
                        t = NULL;
                } else {
                        ck_assert_msg(err == -ENODEV || err == -ENOTSUP,
                                      "dlx_alloc(kDLCUDA) gave %d", err);
                        ck_assert_ptr_null(t);
                }
        }
        proto.device.device_type = kDLCPU;
        proto.ndim = DLX_MAX_NDIM + 1;
        ck_assert_int_eq(dlx_alloc(c, &proto, &t), -EINVAL);
        ck_assert_ptr_null(t);
        ck_assert_int_eq(dlx_acquire(c, "dt/refused", NULL, &t), -ENOENT);
        dlx_close(c);
}
END_TEST

/* A DLPack major version this library does not speak: refused, and deleted exactly once. */
START_TEST(test_rejected_major_version)
{
        static const int64_t shape[1] = {4};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t = NULL;
        struct owned *o = owned_compact(DT(kDLInt, 8, 1), 1, shape, 0, 94);

        o->mt.version.major = 2;
        deleter_runs = 0;
        /* the tensor is gone once its deleter ran: publish must not read it afterwards */
        ck_assert_int_eq(dlx_publish(c, "dt/v2", &o->mt, NULL, NULL), -ENOTSUP);
        ck_assert_int_eq(deleter_runs, 1);
        ck_assert_str_ne(dlx_last_error(), "");
        ck_assert_int_eq(dlx_acquire(c, "dt/v2", NULL, &t), -ENOENT);
        dlx_close(c);
}
END_TEST

Suite *dtypes_suite(void)
{
        Suite *s = suite_create("dtypes");
        TCase *tc = tcase_create("roundtrip");

        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_loop_test(tc, test_dtype_zero_copy, 0, NDTYPES);
        tcase_add_loop_test(tc, test_dtype_copy, 0, NDTYPES);
        tcase_add_test(tc, test_dtype_shapes);
        suite_add_tcase(s, tc);

        tc = tcase_create("layouts");
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_zero_dim);
        tcase_add_test(tc, test_size_zero);
        tcase_add_rows(tc, strided_zero_copy_keeps_the_strides, strided_zero_copy_rows);
        tcase_add_rows(tc, strided_copy_keeps_the_values, strided_copy_rows);
        tcase_add_test(tc, test_packed_strided_rejected);
        tcase_add_test(tc, test_byte_offset_zero_copy);
        tcase_add_test(tc, test_byte_offset_copy);
        suite_add_tcase(s, tc);

        tc = tcase_create("paths");
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_set_timeout(tc, 120);
        tcase_add_test(tc, test_legacy);
        tcase_add_test(tc, test_copy_never_malloc);
        tcase_add_test(tc, test_alloc_of_other_client);
        tcase_add_test(tc, test_copy_always);
        tcase_add_test(tc, test_zero_copy_shares_pages);
        tcase_add_test(tc, test_writable_copy);
        tcase_add_test(tc, test_read_only_enforced);
        suite_add_tcase(s, tc);

        tc = tcase_create("refusals");
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
        tcase_add_test(tc, test_rejected_dtypes);
        tcase_add_test(tc, test_rejected_layouts);
        tcase_add_test(tc, test_rejected_major_version);
        suite_add_tcase(s, tc);
        return s;
}
