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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dlx/dlx.h>

#include "fixture.h"

/* ---- element layout and the byte pattern ------------------------------------------------ */

/* Bytes per element, or 0 for packed sub-byte dtypes (which are addressed as whole bytes). */
static uint64_t elem_size(DLDataType dt, uint64_t flags)
{
        uint64_t bits = (uint64_t)dt.bits * dt.lanes;

        if (bits % 8 == 0)
                return bits / 8;
        if (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)
                return (uint64_t)dt.lanes * ((dt.bits + 7u) / 8u);
        return 0;
}

static uint64_t numel_of(int32_t ndim, const int64_t *shape)
{
        uint64_t n = 1;

        for (int32_t i = 0; i < ndim; i++)
                n *= (uint64_t)shape[i];
        return n;
}

/* Bytes of a packed tensor: numel * bits * lanes, rounded up to whole bytes. */
static uint64_t packed_bytes(DLDataType dt, uint64_t numel)
{
        return (numel * dt.bits * dt.lanes + 7) / 8;
}

/* The byte at position i of logical element lin (row-major), for a seed. */
static uint8_t pattern(uint8_t seed, uint64_t lin, uint64_t i)
{
        return (uint8_t)(lin * 131u + i * 29u + seed * 7u + 1u);
}

/* Element offset (in elements) of the row-major linear index lin. */
static int64_t elem_offset(int32_t ndim, const int64_t *shape, const int64_t *strides, uint64_t lin)
{
        int64_t off = 0, compact = 1;

        for (int32_t d = ndim - 1; d >= 0; d--) {
                int64_t idx = (int64_t)(lin % (uint64_t)shape[d]);
                lin /= (uint64_t)shape[d];
                off += idx * (strides ? strides[d] : compact);
                compact *= shape[d];
        }
        return off;
}

/*
 * Fills (fill) or checks every byte the elements of t cover. Returns the number
 * of mismatching bytes; the first one is described in why.
 */
static uint64_t walk(const DLTensor *t, uint64_t flags, uint8_t seed, bool fill, char *why,
                     size_t whysz)
{
        uint8_t *base = (uint8_t *)t->data + t->byte_offset;
        uint64_t numel = numel_of(t->ndim, t->shape), size = elem_size(t->dtype, flags), bad = 0;

        if (numel == 0)
                return 0;
        if (size == 0) {
                /* packed: compact by construction, the pattern runs over the bytes */
                uint64_t n = packed_bytes(t->dtype, numel);
                for (uint64_t i = 0; i < n; i++) {
                        uint8_t want = pattern(seed, 0, i);
                        if (fill) {
                                base[i] = want;
                        } else if (base[i] != want) {
                                if (!bad++ && why)
                                        snprintf(why, whysz,
                                                 "packed byte %llu is 0x%02x, not 0x%02x",
                                                 (unsigned long long)i, base[i], want);
                        }
                }
                return bad;
        }
        for (uint64_t lin = 0; lin < numel; lin++) {
                uint8_t *p = base + elem_offset(t->ndim, t->shape, t->strides, lin) * (int64_t)size;
                for (uint64_t i = 0; i < size; i++) {
                        uint8_t want = pattern(seed, lin, i);
                        if (fill) {
                                p[i] = want;
                        } else if (p[i] != want) {
                                if (!bad++ && why)
                                        snprintf(why, whysz,
                                                 "element %llu byte %llu is 0x%02x, not 0x%02x",
                                                 (unsigned long long)lin, (unsigned long long)i,
                                                 p[i], want);
                        }
                }
        }
        return bad;
}

static void fill(const DLTensor *t, uint64_t flags, uint8_t seed)
{
        walk(t, flags, seed, true, NULL, 0);
}

/* ---- producer-side tensors ------------------------------------------------------------- */

static int deleter_runs;

/* A tensor over malloc'd memory whose deleter counts its runs. */
struct owned {
        DLManagedTensorVersioned mt;
        void *buf;
        int64_t shape[DLX_MAX_NDIM + 1];
        int64_t strides[DLX_MAX_NDIM + 1];
};

static void owned_deleter(DLManagedTensorVersioned *t)
{
        struct owned *o = t->manager_ctx;

        deleter_runs++;
        free(o->buf);
        free(o);
}

/*
 * A CPU tensor over a malloc'd buffer of bufsize bytes whose data pointer sits
 * data_at bytes into it (bufsize 0: data NULL). strides may be NULL.
 */
static struct owned *owned_new(DLDataType dt, int32_t ndim, const int64_t *shape,
                               const int64_t *strides, uint64_t byte_offset, uint64_t flags,
                               size_t bufsize, size_t data_at)
{
        struct owned *o = calloc(1, sizeof(*o));

        ck_assert_ptr_nonnull(o);
        if (bufsize) {
                o->buf = malloc(bufsize);
                ck_assert_ptr_nonnull(o->buf);
                memset(o->buf, 0xee, bufsize);
        }
        o->mt.version.major = 1;
        o->mt.version.minor = 3;
        o->mt.manager_ctx = o;
        o->mt.deleter = owned_deleter;
        o->mt.flags = flags;
        o->mt.dl_tensor.data = o->buf ? (uint8_t *)o->buf + data_at : NULL;
        o->mt.dl_tensor.device.device_type = kDLCPU;
        o->mt.dl_tensor.ndim = ndim;
        o->mt.dl_tensor.dtype = dt;
        for (int32_t i = 0; i < ndim && i <= DLX_MAX_NDIM; i++) {
                o->shape[i] = shape[i];
                if (strides)
                        o->strides[i] = strides[i];
        }
        o->mt.dl_tensor.shape = ndim > 0 ? o->shape : NULL;
        o->mt.dl_tensor.strides = ndim > 0 && strides ? o->strides : NULL;
        o->mt.dl_tensor.byte_offset = byte_offset;
        return o;
}

/* A compact owned tensor, filled with the pattern for seed. */
static struct owned *owned_compact(DLDataType dt, int32_t ndim, const int64_t *shape,
                                   uint64_t flags, uint8_t seed)
{
        uint64_t numel = numel_of(ndim, shape), size = elem_size(dt, flags);
        size_t bytes = size ? numel * size : packed_bytes(dt, numel);
        struct owned *o = owned_new(dt, ndim, shape, NULL, 0, flags, bytes ? bytes : 1, 0);

        fill(&o->mt.dl_tensor, flags, seed);
        return o;
}

static DLManagedTensorVersioned *alloc_or_fail(dlx_client *c, DLDataType dt, int32_t ndim,
                                               const int64_t *shape)
{
        DLTensor proto = {.device = {kDLCPU, 0}, .ndim = ndim, .dtype = dt};
        DLManagedTensorVersioned *t = NULL;
        int err;

        proto.shape = (int64_t *)shape;
        err = dlx_alloc(c, &proto, &t);
        ck_assert_msg(err == 0, "dlx_alloc: %s (%s)", dlx_strerror(err), dlx_last_error());
        ck_assert_ptr_nonnull(t);
        return t;
}

/* ---- the consumer ------------------------------------------------------------------------ */

/* What a consumer must find under a name. */
struct expect {
        const char *name;
        DLDataType dtype;
        int32_t ndim;
        int64_t shape[DLX_MAX_NDIM];
        /* exact: strides and byte_offset must match; else only the values are checked */
        bool exact;
        int64_t strides[DLX_MAX_NDIM];
        uint64_t byte_offset;
        uint64_t flags; /* exactly the acquired flags */
        uint8_t seed;
        uint64_t version; /* 0: any */
        /* after checking, write the bytes of the pattern for write_seed through the mapping */
        bool write;
        uint8_t write_seed;
};

static char child_msg[512];

__attribute__((format(printf, 1, 2))) static int child_fail(const char *fmt, ...)
{
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(child_msg, sizeof(child_msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "consumer (pid %d): %s\n", (int)getpid(), child_msg);
        return 1;
}

static int64_t compact_stride(const DLTensor *d, int32_t dim)
{
        int64_t s = 1;

        for (int32_t k = d->ndim - 1; k > dim; k--)
                s *= d->shape[k] > 0 ? d->shape[k] : 1;
        return s;
}

static int check_acquired(const DLManagedTensorVersioned *t, const struct expect *e)
{
        const DLTensor *d = &t->dl_tensor;
        const char *name = NULL, *storage = NULL;
        uint64_t version = 0;
        char why[160] = "";
        int err;

        if (t->version.major != 1 || t->version.minor != 3)
                return child_fail("DLPack version %u.%u, not 1.3", t->version.major,
                                  t->version.minor);
        if (!t->deleter)
                return child_fail("no deleter");
        if (t->flags != e->flags)
                return child_fail("flags 0x%llx, not 0x%llx", (unsigned long long)t->flags,
                                  (unsigned long long)e->flags);
        err = dlx_tensor_info(t, &name, &version, &storage);
        if (err < 0)
                return child_fail("dlx_tensor_info: %s", dlx_strerror(err));
        if (!name || strcmp(name, e->name) != 0)
                return child_fail("dlx_tensor_info name '%s', not '%s'", name ? name : "(null)",
                                  e->name);
        if (!storage || strcmp(storage, "memfd") != 0)
                return child_fail("storage '%s', not memfd", storage ? storage : "(null)");
        if (e->version && version != e->version)
                return child_fail("version %llu, not %llu", (unsigned long long)version,
                                  (unsigned long long)e->version);
        if (d->device.device_type != kDLCPU || d->device.device_id != 0)
                return child_fail("device %d:%d", (int)d->device.device_type,
                                  (int)d->device.device_id);
        if (d->dtype.code != e->dtype.code || d->dtype.bits != e->dtype.bits ||
            d->dtype.lanes != e->dtype.lanes)
                return child_fail("dtype %u/%u/%u, not %u/%u/%u", d->dtype.code, d->dtype.bits,
                                  d->dtype.lanes, e->dtype.code, e->dtype.bits, e->dtype.lanes);
        if (d->ndim != e->ndim)
                return child_fail("ndim %d, not %d", (int)d->ndim, (int)e->ndim);
        if (d->ndim > 0 && !d->shape)
                return child_fail("NULL shape with ndim %d", (int)d->ndim);
        if (!d->data && numel_of(d->ndim, d->shape) > 0)
                return child_fail("NULL data");
        for (int32_t i = 0; i < d->ndim; i++)
                if (d->shape[i] != e->shape[i])
                        return child_fail("shape[%d] = %lld, not %lld", (int)i,
                                          (long long)d->shape[i], (long long)e->shape[i]);
        if (e->exact) {
                if (d->byte_offset != e->byte_offset)
                        return child_fail("byte_offset %llu, not %llu",
                                          (unsigned long long)d->byte_offset,
                                          (unsigned long long)e->byte_offset);
                for (int32_t i = 0; i < d->ndim; i++) {
                        /* NULL strides mean compact; a dimension of extent 1 has any stride */
                        int64_t got = d->strides ? d->strides[i] : compact_stride(d, i);
                        if (e->shape[i] != 1 && got != e->strides[i])
                                return child_fail("strides[%d] = %lld, not %lld", (int)i,
                                                  (long long)got, (long long)e->strides[i]);
                }
        }
        if (walk(d, t->flags, e->seed, false, why, sizeof(why)))
                return child_fail("'%s': %s", e->name, why);
        if (e->write)
                fill(d, t->flags, e->write_seed);
        return 0;
}

static int consume(void *arg)
{
        const struct expect *e = arg;
        struct dlx_connect_options o = {.socket_path = fx.socket, .client_name = "consumer"};
        DLManagedTensorVersioned *t = NULL;
        dlx_client *c = NULL;
        int err, rc;

        err = dlx_connect(&o, &c);
        if (err < 0)
                return child_fail("connect: %s", dlx_strerror(err));
        err = dlx_acquire(c, e->name, NULL, &t);
        if (err < 0) {
                rc = child_fail("acquire '%s': %s (%s)", e->name, dlx_strerror(err),
                                dlx_last_error());
                dlx_close(c);
                return rc;
        }
        rc = check_acquired(t, e);
        t->deleter(t);
        dlx_close(c);
        return rc;
}

/* Runs the consumer for e in a child and requires it to succeed. */
static void consume_in_child(const struct expect *e)
{
        int rc = fx_wait(fx_spawn(consume, (void *)e));

        ck_assert_msg(rc == 0, "the consumer of '%s' failed (status %d, see its stderr)", e->name,
                      rc);
}

/* The expectation for a tensor as published (its layout exactly, or values only). */
static struct expect expect_of(const char *name, const DLManagedTensorVersioned *mt, bool exact,
                               bool writable, uint8_t seed)
{
        const DLTensor *d = &mt->dl_tensor;
        struct expect e = {.name = name, .dtype = d->dtype, .ndim = d->ndim, .seed = seed};

        e.exact = exact;
        e.byte_offset = d->byte_offset;
        e.flags = (writable ? 0 : DLPACK_FLAG_BITMASK_READ_ONLY) |
                  (mt->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
        for (int32_t i = 0; i < d->ndim; i++)
                e.shape[i] = d->shape[i];
        if (d->ndim > 0) {
                int64_t s = 1;
                for (int32_t i = d->ndim - 1; i >= 0; i--) {
                        e.strides[i] = d->strides ? d->strides[i] : s;
                        s *= d->shape[i] > 0 ? d->shape[i] : 1;
                }
        }
        return e;
}

/* ---- the dtypes -------------------------------------------------------------------------- */

struct dtype_case {
        const char *label;
        DLDataType dt;
        uint64_t flags;
};

#define DT(code, bits, lanes) ((DLDataType){(uint8_t)(code), (uint8_t)(bits), (uint16_t)(lanes)})
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
        fill(&t->dl_tensor, t->flags, (uint8_t)_i);
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
        fill(&t->dl_tensor, 0, 7);
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

/* Zero-copy views into dlx_alloc() memory: the strides must come back exactly. */
START_TEST(test_strided_zero_copy)
{
        static const int64_t shape46[2] = {4, 6};
        static const int64_t shape10[1] = {10};
        static const int64_t shape412[2] = {4, 12};
        struct dlx_publish_options never = {.copy = DLX_COPY_NEVER};
        dlx_client *c = fx_connect(&fx, "producer");
        DLManagedTensorVersioned *t;
        struct expect e;

        /* a transposed 4 x 6: 6 x 4 with strides {1, 6} */
        t = alloc_or_fail(c, DT(kDLFloat, 32, 1), 2, shape46);
        t->dl_tensor.shape[0] = 6;
        t->dl_tensor.shape[1] = 4;
        t->dl_tensor.strides[0] = 1;
        t->dl_tensor.strides[1] = 6;
        fill(&t->dl_tensor, 0, 21);
        e = expect_of("dt/transposed", t, true, false, 21);
        ck_assert_int_eq(e.strides[0], 1);
        publish_ok(c, "dt/transposed", t, &never, NULL);
        consume_in_child(&e);

        /* every other element of 10 */
        t = alloc_or_fail(c, DT(kDLInt, 16, 1), 1, shape10);
        t->dl_tensor.shape[0] = 5;
        t->dl_tensor.strides[0] = 2;
        fill(&t->dl_tensor, 0, 22);
        e = expect_of("dt/every-other", t, true, false, 22);
        publish_ok(c, "dt/every-other", t, &never, NULL);
        consume_in_child(&e);

        /* every other row and column of a 4 x 12 complex64 */
        t = alloc_or_fail(c, DT(kDLComplex, 64, 1), 2, shape412);
        t->dl_tensor.shape[0] = 2;
        t->dl_tensor.shape[1] = 6;
        t->dl_tensor.strides[0] = 24;
        t->dl_tensor.strides[1] = 2;
        fill(&t->dl_tensor, 0, 23);
        e = expect_of("dt/every-other-2d", t, true, false, 23);
        publish_ok(c, "dt/every-other-2d", t, &never, NULL);
        consume_in_child(&e);

        /* padded sub-byte elements are addressable: strides are allowed */
        t = alloc_or_fail(c, DT(kDLUInt, 8, 1), 2, shape46);
        t->dl_tensor.dtype = DT(kDLInt, 4, 1);
        t->flags |= PADDED;
        t->dl_tensor.shape[0] = 6;
        t->dl_tensor.shape[1] = 4;
        t->dl_tensor.strides[0] = 1;
        t->dl_tensor.strides[1] = 6;
        fill(&t->dl_tensor, t->flags, 24);
        e = expect_of("dt/padded-transposed", t, true, false, 24);
        publish_ok(c, "dt/padded-transposed", t, &never, NULL);
        consume_in_child(&e);

        /* reversed in place: the data pointer moved to the last element, stride -1 */
        t = alloc_or_fail(c, DT(kDLInt, 32, 1), 1, shape10);
        t->dl_tensor.data = (int32_t *)t->dl_tensor.data + 9;
        t->dl_tensor.strides[0] = -1;
        fill(&t->dl_tensor, 0, 25);
        e = expect_of("dt/reversed", t, true, false, 25);
        publish_ok(c, "dt/reversed", t, NULL, NULL);
        consume_in_child(&e);
        dlx_close(c);
}
END_TEST

/* Copies of strided malloc'd views, negative strides included: the values must match. */
START_TEST(test_strided_copy)
{
        static const int64_t shape64[2] = {6, 4}, t_strides[2] = {1, 6};
        static const int64_t shape5[1] = {5}, eo_strides[1] = {2}, neg1[1] = {-1};
        static const int64_t shape34[2] = {3, 4}, flip_rows[2] = {-4, 1}, flip_both[2] = {-4, -1};
        static const int64_t neg_t[2] = {-1, -6};
        dlx_client *c = fx_connect(&fx, "producer");
        struct owned *o;
        struct expect e;

        deleter_runs = 0;
        /* transposed */
        o = owned_new(DT(kDLFloat, 64, 1), 2, shape64, t_strides, 0, 0, 24 * 8, 0);
        fill(&o->mt.dl_tensor, 0, 31);
        e = expect_of("dt/c-transposed", &o->mt, false, false, 31);
        publish_ok(c, "dt/c-transposed", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* every other element */
        o = owned_new(DT(kDLUInt, 32, 1), 1, shape5, eo_strides, 0, 0, 10 * 4, 0);
        fill(&o->mt.dl_tensor, 0, 32);
        e = expect_of("dt/c-every-other", &o->mt, false, false, 32);
        publish_ok(c, "dt/c-every-other", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* reversed: the data pointer at the last element, stride -1 */
        o = owned_new(DT(kDLInt, 64, 1), 1, shape5, neg1, 0, 0, 5 * 8, 4 * 8);
        fill(&o->mt.dl_tensor, 0, 33);
        e = expect_of("dt/c-reversed", &o->mt, false, false, 33);
        publish_ok(c, "dt/c-reversed", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* rows flipped: data at the start of the last row */
        o = owned_new(DT(kDLBfloat, 16, 1), 2, shape34, flip_rows, 0, 0, 12 * 2, 8 * 2);
        fill(&o->mt.dl_tensor, 0, 34);
        e = expect_of("dt/c-flip-rows", &o->mt, false, false, 34);
        publish_ok(c, "dt/c-flip-rows", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* both axes flipped: data at the very last element */
        o = owned_new(DT(kDLFloat, 32, 4), 2, shape34, flip_both, 0, 0, 12 * 16, 11 * 16);
        fill(&o->mt.dl_tensor, 0, 35);
        e = expect_of("dt/c-flip-both", &o->mt, false, false, 35);
        publish_ok(c, "dt/c-flip-both", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* transposed and reversed, with a byte_offset on top */
        o = owned_new(DT(kDLInt, 8, 1), 2, shape64, neg_t, 16, 0, 16 + 24, 23);
        fill(&o->mt.dl_tensor, 0, 36);
        e = expect_of("dt/c-neg-transposed", &o->mt, false, false, 36);
        publish_ok(c, "dt/c-neg-transposed", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* padded int4, every other element */
        o = owned_new(DT(kDLInt, 4, 1), 1, shape5, eo_strides, 0, PADDED, 10, 0);
        fill(&o->mt.dl_tensor, PADDED, 37);
        e = expect_of("dt/c-padded-strided", &o->mt, false, false, 37);
        publish_ok(c, "dt/c-padded-strided", &o->mt, NULL, NULL);
        consume_in_child(&e);

        ck_assert_int_eq(deleter_runs, 7);
        dlx_close(c);
        ck_assert_int_eq(deleter_runs, 7);
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
        fill(&t->dl_tensor, 0, 41);
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
        fill(&o->mt.dl_tensor, 0, 42);
        e = expect_of("dt/c-byte-offset", &o->mt, false, false, 42);
        publish_ok(c, "dt/c-byte-offset", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* an odd byte_offset, with strides */
        o = owned_new(DT(kDLInt, 16, 1), 2, shape, strides, 3, 0, 3 + 24, 0);
        fill(&o->mt.dl_tensor, 0, 43);
        e = expect_of("dt/c-odd-offset", &o->mt, false, false, 43);
        publish_ok(c, "dt/c-odd-offset", &o->mt, NULL, NULL);
        consume_in_child(&e);

        /* a packed dtype 5 bytes in */
        o = owned_new(DT(kDLFloat4_e2m1fn, 4, 1), 2, shape, NULL, 5, 0, 5 + 6, 0);
        fill(&o->mt.dl_tensor, 0, 44);
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
        fill(&t->dl_tensor, 0, seed);
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

        fill(&t->dl_tensor, 0, 62);
        ck_assert_int_eq(dlx_publish(b, "dt/other", t,
                                     &(struct dlx_publish_options){.copy = DLX_COPY_NEVER}, NULL),
                         -EXDEV);

        t = alloc_or_fail(a, DT(kDLInt, 32, 1), 1, shape);
        fill(&t->dl_tensor, 0, 63);
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

        fill(&t->dl_tensor, 0, 71);
        e = expect_of("dt/always", t, true, false, 71);
        publish_ok(c, "dt/always", t, &(struct dlx_publish_options){.copy = DLX_COPY_ALWAYS}, NULL);
        consume_in_child(&e);

        /*
         * The producer's memory changes afterwards. Its tensor was handed over (and, being
         * copied, deleted), so the same arena memory is allocated again and overwritten.
         */
        again = alloc_or_fail(c, DT(kDLUInt, 8, 1), 1, shape);
        fill(&again->dl_tensor, 0, 72);
        if (again->dl_tensor.data != p) {
                /* another chunk: overwrite the old one too, it is still mapped by the arena */
                DLTensor old = again->dl_tensor;
                old.data = p;
                fill(&old, 0, 72);
        }
        consume_in_child(&e);

        /* the producer's own acquire sees the copy, not its arena */
        ck_assert_int_eq(dlx_acquire(c, "dt/always", NULL, &mine), 0);
        ck_assert_ptr_ne(mine->dl_tensor.data, p);
        ck_assert_int_eq(walk(&mine->dl_tensor, 0, 71, false, NULL, 0), 0);
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

        fill(&t->dl_tensor, 0, 81);
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

        fill(&t->dl_tensor, 0, 85);
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
        tcase_add_test(tc, test_strided_zero_copy);
        tcase_add_test(tc, test_strided_copy);
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
