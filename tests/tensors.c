/* SPDX-License-Identifier: MIT */
/* Tensors and consumers shared by the suites that move bytes between processes: tensors.h. */
#include "tensors.h"

#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

/* ---- element layout and the byte pattern ------------------------------------------------ */

uint64_t elem_size(DLDataType dt, uint64_t flags)
{
        uint64_t bits = (uint64_t)dt.bits * dt.lanes;

        if (bits % 8 == 0)
                return bits / 8;
        if (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)
                return (uint64_t)dt.lanes * ((dt.bits + 7u) / 8u);
        return 0;
}

uint64_t numel_of(int32_t ndim, const int64_t *shape)
{
        uint64_t n = 1;

        for (int32_t i = 0; i < ndim; i++)
                n *= (uint64_t)shape[i];
        return n;
}

uint64_t packed_bytes(DLDataType dt, uint64_t numel)
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

void pattern_fill(const DLTensor *t, uint64_t flags, uint8_t seed)
{
        walk(t, flags, seed, true, NULL, 0);
}

uint64_t pattern_check(const DLTensor *t, uint64_t flags, uint8_t seed)
{
        return walk(t, flags, seed, false, NULL, 0);
}

bool is_compact(const DLTensor *t)
{
        int64_t s = 1;

        if (!t->strides)
                return true;
        for (int32_t i = t->ndim - 1; i >= 0; i--) {
                if (t->shape[i] != 1 && t->strides[i] != s)
                        return false;
                s *= t->shape[i];
        }
        return true;
}

/* ---- producer-side tensors ------------------------------------------------------------- */

int deleter_runs;

static void owned_deleter(DLManagedTensorVersioned *t)
{
        struct owned *o = t->manager_ctx;

        deleter_runs++;
        /* poison first: a use after this is visible even without ASan */
        if (o->buf)
                memset(o->buf, 0xdd, o->bufsize < 16 ? o->bufsize : 16);
        free(o->buf);
        free(o);
}

struct owned *owned_new(DLDataType dt, int32_t ndim, const int64_t *shape, const int64_t *strides,
                        uint64_t byte_offset, uint64_t flags, size_t bufsize, size_t data_at)
{
        struct owned *o = calloc(1, sizeof(*o));

        ck_assert_ptr_nonnull(o);
        if (bufsize) {
                o->buf = malloc(bufsize);
                ck_assert_ptr_nonnull(o->buf);
                memset(o->buf, 0xee, bufsize);
                o->bufsize = bufsize;
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

struct owned *owned_compact(DLDataType dt, int32_t ndim, const int64_t *shape, uint64_t flags,
                            uint8_t seed)
{
        uint64_t numel = numel_of(ndim, shape), size = elem_size(dt, flags);
        size_t bytes = size ? numel * size : packed_bytes(dt, numel);
        struct owned *o = owned_new(dt, ndim, shape, NULL, 0, flags, bytes ? bytes : 1, 0);

        pattern_fill(&o->mt.dl_tensor, flags, seed);
        return o;
}

DLManagedTensorVersioned *owned_2d(DLDataType dt, int64_t rows, int64_t cols, uint8_t seed)
{
        const int64_t shape[2] = {rows, cols};

        return &owned_compact(dt, 2, shape, 0, seed)->mt;
}

DLManagedTensorVersioned *alloc_or_fail(dlx_client *c, DLDataType dt, int32_t ndim,
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

#define CHILD_MSG 512

/* While consume_in_child() waits: shared with its child, which writes its failure there. */
static char *child_msg;

int child_fail(const char *fmt, ...)
{
        char msg[CHILD_MSG];
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "consumer (pid %d): %s\n", (int)getpid(), msg);
        if (child_msg && !child_msg[0])
                snprintf(child_msg, CHILD_MSG, "%s", msg);
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
                pattern_fill(d, t->flags, e->write_seed);
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

void consume_in_child(const struct expect *e)
{
        char msg[CHILD_MSG];
        int rc;

        child_msg =
                mmap(NULL, CHILD_MSG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        ck_assert_ptr_ne(child_msg, MAP_FAILED);
        child_msg[0] = '\0';
        rc = fx_wait(fx_spawn(consume, (void *)e));
        snprintf(msg, sizeof(msg), "%s", child_msg[0] ? child_msg : "no message (see its stderr)");
        munmap(child_msg, CHILD_MSG);
        child_msg = NULL;
        ck_assert_msg(rc == 0, "the consumer of '%s' failed (status %d): %s", e->name, rc, msg);
}

struct expect expect_of(const char *name, const DLManagedTensorVersioned *mt, bool exact,
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

struct expect expect_2d(const char *name, DLDataType dt, int64_t rows, int64_t cols, uint8_t seed)
{
        struct expect e = {.name = name, .dtype = dt, .ndim = 2, .exact = true, .seed = seed};

        e.shape[0] = rows;
        e.shape[1] = cols;
        e.strides[0] = cols;
        e.strides[1] = 1;
        e.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
        return e;
}
