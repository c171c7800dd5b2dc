/* SPDX-License-Identifier: MIT */
/*
 * The DLPack C exchange API. The "object" libdlx exchanges is a dlx_tensor:
 * a reference-counted handle on one DLManagedTensorVersioned. Exports are
 * new owning tensors that share shape, strides and data with the handle and
 * keep it alive; imports steal the tensor into a new handle.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "layout.h"

struct dlx_tensor {
        unsigned refs; /* atomic */
        DLManagedTensorVersioned *mt;
};

/*
 * Marks tensor read-only when its bytes lie in memory libdlx mapped read-only:
 * a consumer that took an acquired tensor and hands it back (tvm-ffi's
 * functions do, with flags of 0) cannot make that memory writable, and a
 * writable view of it would die at its first write.
 */
static void keep_read_only(DLManagedTensorVersioned *tensor)
{
        const DLTensor *t = &tensor->dl_tensor;
        const char *why;
        int64_t lo, hi;

        if (tensor->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
                return;
        /* a layout libdlx cannot measure: its first byte at least */
        if (t->ndim < 0 || t->ndim > DLX_MAX_NDIM || (t->ndim && !t->shape) ||
            layout_extent(t->dtype, t->ndim, t->shape, t->strides, t->byte_offset, tensor->flags,
                          &lo, &hi, &why) < 0) {
                lo = (int64_t)t->byte_offset;
                hi = lo + 1;
        }
        if (dlx__mapped_read_only(t->data, lo, hi))
                tensor->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
}

int dlx_tensor_wrap(DLManagedTensorVersioned *tensor, dlx_tensor **ret_handle)
{
        dlx_tensor *h;

        if (!tensor || !ret_handle) {
                if (tensor && tensor->deleter)
                        tensor->deleter(tensor);
                return dlx__fail(-EINVAL, "NULL argument");
        }
        if (tensor->version.major != DLX_DLPACK_MAJOR) {
                unsigned major = tensor->version.major;
                if (tensor->deleter)
                        tensor->deleter(tensor);
                return dlx__fail(-ENOTSUP, "DLPack major version %u", major);
        }
        h = malloc(sizeof(*h));
        if (!h) {
                if (tensor->deleter)
                        tensor->deleter(tensor);
                return dlx__fail(-ENOMEM, "out of memory");
        }
        /* the tensor is ours now: its flags say what its memory allows */
        keep_read_only(tensor);
        h->refs = 1;
        h->mt = tensor;
        *ret_handle = h;
        return 0;
}

dlx_tensor *dlx_tensor_ref(dlx_tensor *h)
{
        if (h)
                __atomic_add_fetch(&h->refs, 1, __ATOMIC_RELAXED);
        return h;
}

void dlx_tensor_unref(dlx_tensor *h)
{
        if (!h || __atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) != 0)
                return;
        if (h->mt->deleter)
                h->mt->deleter(h->mt);
        free(h);
}

const DLTensor *dlx_tensor_dltensor(const dlx_tensor *h)
{
        return h ? &h->mt->dl_tensor : NULL;
}

/* ---- the table's slots ------------------------------------------------------------------ */

static int allocator(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
                     void (*set_error)(void *error_ctx, const char *kind, const char *message))
{
        dlx_client *c;
        int err;

        c = dlx__default_client_ref();
        if (!c) {
                if (set_error)
                        set_error(error_ctx, "RuntimeError",
                                  "dlx: no client connected in this process to allocate from");
                return -1;
        }
        err = dlx_alloc(c, prototype, out);
        dlx__client_unref(c);
        if (err < 0) {
                if (set_error)
                        set_error(error_ctx, err == -EINVAL ? "ValueError" : "RuntimeError",
                                  dlx_last_error());
                return -1;
        }
        return 0;
}

/* An export: its own DLManagedTensorVersioned whose deleter drops one handle reference. */
struct export
{
        DLManagedTensorVersioned mt;
        dlx_tensor *h;
};

static void export_deleter(DLManagedTensorVersioned *t)
{
        struct export *e = t->manager_ctx;

        dlx_tensor_unref(e->h);
        free(e);
}

static int from_object(void *object, DLManagedTensorVersioned **out)
{
        dlx_tensor *h = object;
        struct export *e;

        if (!h || !out)
                return -1;
        e = malloc(sizeof(*e));
        if (!e)
                return -1;
        e->h = dlx_tensor_ref(h);
        e->mt = *h->mt;
        e->mt.version.major = DLX_DLPACK_MAJOR;
        e->mt.version.minor = DLX_DLPACK_MINOR;
        e->mt.manager_ctx = e;
        e->mt.deleter = export_deleter;
        *out = &e->mt;
        return 0;
}

const DLManagedTensorVersioned *dlx__exchange_unwrap(const DLManagedTensorVersioned *t)
{
        while (t && t->deleter == export_deleter)
                t = ((const struct export *)t->manager_ctx)->h->mt;
        return t;
}

static int to_object(DLManagedTensorVersioned *tensor, void **out_object)
{
        dlx_tensor *h;

        if (!out_object) {
                if (tensor && tensor->deleter)
                        tensor->deleter(tensor);
                return -1;
        }
        if (dlx_tensor_wrap(tensor, &h) < 0)
                return -1;
        *out_object = h;
        return 0;
}

static int dltensor_view(void *object, DLTensor *out)
{
        dlx_tensor *h = object;

        if (!h || !out)
                return -1;
        *out = h->mt->dl_tensor;
        return 0;
}

static int current_work_stream(DLDeviceType device_type, int32_t device_id, void **out)
{
        dlx_client *c;

        if (!out)
                return -1;
        *out = NULL;
        /* CPU work is synchronous; a CUDA device's stream is the default client's */
        if (device_type != kDLCUDA && device_type != kDLCUDAManaged)
                return 0;
        c = dlx__default_client_ref();
        if (c) {
                *out = dlx_get_stream(c, device_id);
                dlx__client_unref(c);
        }
        return 0;
}

static const DLPackExchangeAPI exchange_api = {
        .header = {.version = {.major = DLX_DLPACK_MAJOR, .minor = DLX_DLPACK_MINOR},
                   .prev_api = NULL},
        .managed_tensor_allocator = allocator,
        .managed_tensor_from_py_object_no_sync = from_object,
        .managed_tensor_to_py_object_no_sync = to_object,
        .dltensor_from_py_object_no_sync = dltensor_view,
        .current_work_stream = current_work_stream,
};

const DLPackExchangeAPI *dlx_exchange_api(void)
{
        return &exchange_api;
}
