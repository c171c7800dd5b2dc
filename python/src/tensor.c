/* SPDX-License-Identifier: MIT */
/*
 * dlx.Tensor: a dlx_tensor handle (libdlx's reference-counted wrapper of one
 * DLManagedTensorVersioned) seen from Python.
 *
 * Lifetime: the object holds one handle reference and every DLPack export
 * holds another (libdlx's exchange export for versioned capsules and for the
 * exchange API, our own small wrapper for legacy capsules). The wrapped
 * tensor's deleter, which releases an acquired tensor's lease, runs when the
 * last of them goes: close(), the end of a with block or garbage collection
 * of the object, and the deletion of every export, in any order. Exports'
 * deleters touch no Python object, so consumers may drop them from any thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dlxpy.h"

PyObject *dlxpy_tensor_new(dlx_tensor *h, uint64_t flags, const char *name, uint64_t version,
                           const char *storage)
{
        DlxPy_Tensor *t;
        PyObject *pyname = NULL;

        if (name) {
                pyname = PyUnicode_FromString(name);
                if (!pyname) {
                        dlx_tensor_unref(h);
                        return NULL;
                }
        }
        t = PyObject_New(DlxPy_Tensor, &DlxPy_TensorType);
        if (!t) {
                Py_XDECREF(pyname);
                dlx_tensor_unref(h);
                return NULL;
        }
        t->h = h;
        t->flags = flags;
        t->name = pyname ? pyname : Py_NewRef(Py_None);
        t->version = version;
        t->storage = storage;
        t->weakrefs = NULL;
        return (PyObject *)t;
}

static void tensor_release(DlxPy_Tensor *t)
{
        dlx_tensor *h = t->h;

        t->h = NULL;
        /* the lease goes now unless an export still holds the handle */
        dlx_tensor_unref(h);
}

static void tensor_dealloc(DlxPy_Tensor *t)
{
        if (t->weakrefs)
                PyObject_ClearWeakRefs((PyObject *)t);
        tensor_release(t);
        Py_XDECREF(t->name);
        Py_TYPE(t)->tp_free((PyObject *)t);
}

static const DLTensor *live(DlxPy_Tensor *t)
{
        if (!t->h) {
                PyErr_SetString(PyExc_ValueError, "the dlx.Tensor is closed");
                return NULL;
        }
        return dlx_tensor_dltensor(t->h);
}

static PyObject *int64_tuple(const int64_t *v, int32_t n)
{
        PyObject *tuple = PyTuple_New(n);

        for (int32_t i = 0; tuple && i < n; i++) {
                PyObject *x = PyLong_FromLongLong(v[i]);
                if (!x) {
                        Py_CLEAR(tuple);
                        break;
                }
                PyTuple_SET_ITEM(tuple, i, x);
        }
        return tuple;
}

static void compact_strides(const DLTensor *d, int64_t *out)
{
        int64_t s = 1;

        for (int32_t i = d->ndim - 1; i >= 0; i--) {
                out[i] = s;
                s *= d->shape[i];
        }
}

static uint64_t numel(const DLTensor *d)
{
        uint64_t n = 1;

        for (int32_t i = 0; i < d->ndim; i++)
                n *= (uint64_t)d->shape[i];
        return n;
}

static uint64_t compact_nbytes(const DLTensor *d)
{
        return (numel(d) * d->dtype.bits * d->dtype.lanes + 7) / 8;
}

/* ---- legacy (pre-1.0) exports ------------------------------------------------------------- */

struct legacy_export {
        DLManagedTensor mt;
        dlx_tensor *h;
};

static void legacy_export_deleter(DLManagedTensor *mt)
{
        struct legacy_export *e = mt->manager_ctx;

        dlx_tensor_unref(e->h);
        free(e);
}

/* ---- copies (copy=True) -----------------------------------------------------------------------
 */

struct copied {
        DLManagedTensorVersioned mt;
        int64_t *dims; /* shape[ndim], strides[ndim] */
        void *data;
};

static void copied_deleter(DLManagedTensorVersioned *mt)
{
        struct copied *c = mt->manager_ctx;

        free(c->dims);
        free(c->data);
        free(c);
}

/* Gathers a strided CPU tensor into compact row-major bytes at dst. */
static void gather(const DLTensor *d, uint8_t *dst, size_t elem)
{
        const uint8_t *base = (const uint8_t *)d->data + d->byte_offset;
        int64_t idx[DLX_MAX_NDIM] = {0};
        uint64_t n = numel(d);

        for (uint64_t k = 0; k < n; k++) {
                int64_t off = 0;
                for (int32_t i = 0; i < d->ndim; i++)
                        off += idx[i] * d->strides[i];
                memcpy(dst + k * elem, base + off * (int64_t)elem, elem);
                for (int32_t i = d->ndim - 1; i >= 0; i--) {
                        if (++idx[i] < d->shape[i])
                                break;
                        idx[i] = 0;
                }
        }
}

static bool is_compact(const DLTensor *d)
{
        int64_t s = 1;

        if (!d->strides)
                return true;
        for (int32_t i = d->ndim - 1; i >= 0; i--) {
                if (d->shape[i] != 1 && d->strides[i] != s)
                        return false;
                s *= d->shape[i];
        }
        return true;
}

static DLManagedTensorVersioned *copy_tensor(const DLTensor *d)
{
        struct copied *c;
        uint64_t bytes = compact_nbytes(d);
        size_t elem = (size_t)d->dtype.bits * d->dtype.lanes / 8;

        if (d->device.device_type != kDLCPU) {
                PyErr_SetString(PyExc_BufferError,
                                "dlx.Tensor: copy=True is supported for CPU tensors only");
                return NULL;
        }
        if (!is_compact(d) && (d->dtype.bits * d->dtype.lanes) % 8 != 0) {
                PyErr_SetString(PyExc_BufferError,
                                "dlx.Tensor: cannot copy a strided tensor of a sub-byte dtype");
                return NULL;
        }
        c = calloc(1, sizeof(*c));
        if (!c)
                return (DLManagedTensorVersioned *)PyErr_NoMemory();
        c->dims = malloc(2 * (size_t)(d->ndim ? d->ndim : 1) * sizeof(int64_t));
        c->data = malloc(bytes ? bytes : 1);
        if (!c->dims || !c->data) {
                free(c->dims);
                free(c->data);
                free(c);
                return (DLManagedTensorVersioned *)PyErr_NoMemory();
        }
        if (is_compact(d))
                memcpy(c->data, (const uint8_t *)d->data + d->byte_offset, bytes);
        else
                gather(d, c->data, elem);
        memcpy(c->dims, d->shape, (size_t)d->ndim * sizeof(int64_t));
        compact_strides(d, c->dims + d->ndim);
        c->mt.version.major = DLX_DLPACK_MAJOR;
        c->mt.version.minor = DLX_DLPACK_MINOR;
        c->mt.manager_ctx = c;
        c->mt.deleter = copied_deleter;
        c->mt.flags = DLPACK_FLAG_BITMASK_IS_COPIED;
        c->mt.dl_tensor = *d;
        c->mt.dl_tensor.data = c->data;
        c->mt.dl_tensor.byte_offset = 0;
        c->mt.dl_tensor.shape = d->ndim ? c->dims : NULL;
        c->mt.dl_tensor.strides = d->ndim ? c->dims + d->ndim : NULL;
        return &c->mt;
}

/* ---- capsules ---------------------------------------------------------------------------------
 */

/* Runs when a capsule dies: its tensor is ours to delete unless a consumer took it. */
static void versioned_capsule_destructor(PyObject *cap)
{
        DLManagedTensorVersioned *mt;
        PyObject *type, *value, *tb;

        if (PyCapsule_IsValid(cap, DLXPY_CAPSULE_VERSIONED_USED))
                return;
        PyErr_Fetch(&type, &value, &tb);
        mt = PyCapsule_GetPointer(cap, DLXPY_CAPSULE_VERSIONED);
        if (mt && mt->deleter)
                mt->deleter(mt);
        else if (!mt)
                PyErr_WriteUnraisable(cap);
        PyErr_Restore(type, value, tb);
}

static void legacy_capsule_destructor(PyObject *cap)
{
        DLManagedTensor *mt;
        PyObject *type, *value, *tb;

        if (PyCapsule_IsValid(cap, DLXPY_CAPSULE_USED))
                return;
        PyErr_Fetch(&type, &value, &tb);
        mt = PyCapsule_GetPointer(cap, DLXPY_CAPSULE);
        if (mt && mt->deleter)
                mt->deleter(mt);
        else if (!mt)
                PyErr_WriteUnraisable(cap);
        PyErr_Restore(type, value, tb);
}

/*
 * __dlpack__'s stream, for an acquired CUDA tensor: the consumer will use it
 * there, so that stream waits for the producer's write and the lease's release
 * for its work (dlx_tensor_sync); the stream must live until the tensor is
 * released. The array API's values: None or 1 the legacy default stream,
 * 2 the per-thread default, -1 "the consumer orders itself", 0 is ambiguous;
 * anything else is a CUstream. Host memory needs no ordering: stream is ignored.
 */
static int order_on_stream(DlxPy_Tensor *t, const DLTensor *d, PyObject *stream)
{
        DLManagedTensorVersioned *mt = NULL;
        long long s = 1;
        int err;

        if (d->device.device_type != kDLCUDA && d->device.device_type != kDLCUDAManaged)
                return 0;
        if (stream != Py_None) {
                s = PyLong_AsLongLong(stream);
                if (s == -1 && PyErr_Occurred())
                        return -1;
        }
        if (s == -1)
                return 0;
        if (s == 0 || s < -1) {
                PyErr_Format(PyExc_ValueError,
                             "dlx.Tensor: stream=%lld is not a CUDA stream (1: the legacy "
                             "default, 2: the per-thread default, -1: no ordering)",
                             s);
                return -1;
        }
        if (dlx_exchange_api()->managed_tensor_from_py_object_no_sync(t->h, &mt) != 0) {
                PyErr_NoMemory();
                return -1;
        }
        /* only acquired tensors have a producer to order after: alloc()'s memory is ours */
        err = dlx_tensor_info(mt, NULL, NULL, NULL) < 0 ? 0
                                                        : dlx_tensor_sync(mt, (void *)(uintptr_t)s);
        mt->deleter(mt);
        if (err < 0) {
                dlxpy_raise(err, dlx_last_error());
                return -1;
        }
        return 0;
}

static PyObject *tensor_dlpack(DlxPy_Tensor *t, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
        PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None,
                 *cap;
        unsigned long major = 0, minor = 0;
        bool versioned = false, want_copy = false;
        const DLTensor *d;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOO:__dlpack__", kwlist, &stream,
                                         &max_version, &dl_device, &copy))
                return NULL;
        if (!(d = live(t)))
                return NULL;
        if (max_version != Py_None) {
                if (!PyArg_ParseTuple(max_version, "kk;max_version must be (major, minor)", &major,
                                      &minor))
                        return NULL;
                versioned = major >= 1;
        }
        if (dl_device != Py_None) {
                DLDevice want;
                if (!PyArg_ParseTuple(dl_device, "ii;dl_device must be (device_type, device_id)",
                                      &want.device_type, &want.device_id))
                        return NULL;
                if (want.device_type != d->device.device_type ||
                    (want.device_type != kDLCPU && want.device_id != d->device.device_id)) {
                        PyErr_SetString(PyExc_BufferError,
                                        "dlx.Tensor: cannot export to another device");
                        return NULL;
                }
        }
        if (copy != Py_None) {
                int c = PyObject_IsTrue(copy);
                if (c < 0)
                        return NULL;
                want_copy = c;
        }
        if (order_on_stream(t, d, stream) < 0)
                return NULL;

        if (want_copy) {
                DLManagedTensorVersioned *mt = copy_tensor(d);
                if (!mt)
                        return NULL;
                if (!versioned) {
                        /* a legacy consumer: wrap the copy's versioned tensor */
                        PyErr_SetString(PyExc_BufferError,
                                        "dlx.Tensor: copy=True needs max_version >= (1, 0)");
                        mt->deleter(mt);
                        return NULL;
                }
                cap = PyCapsule_New(mt, DLXPY_CAPSULE_VERSIONED, versioned_capsule_destructor);
                if (!cap)
                        mt->deleter(mt);
                return cap;
        }
        if (versioned) {
                DLManagedTensorVersioned *mt = NULL;
                /* libdlx's export: a new tensor holding one more handle reference */
                if (dlx_exchange_api()->managed_tensor_from_py_object_no_sync(t->h, &mt) != 0)
                        return PyErr_NoMemory();
                /* speak no newer minor than the consumer knows: 1.x layouts are the same */
                if (major == DLX_DLPACK_MAJOR && minor < mt->version.minor)
                        mt->version.minor = (uint32_t)minor;
                cap = PyCapsule_New(mt, DLXPY_CAPSULE_VERSIONED, versioned_capsule_destructor);
                if (!cap)
                        mt->deleter(mt);
                return cap;
        }
        struct legacy_export *e = malloc(sizeof(*e));
        if (!e)
                return PyErr_NoMemory();
        e->h = dlx_tensor_ref(t->h);
        e->mt.dl_tensor = *d;
        e->mt.manager_ctx = e;
        e->mt.deleter = legacy_export_deleter;
        cap = PyCapsule_New(&e->mt, DLXPY_CAPSULE, legacy_capsule_destructor);
        if (!cap)
                legacy_export_deleter(&e->mt);
        return cap;
}

static PyObject *tensor_dlpack_device(DlxPy_Tensor *t, PyObject *unused)
{
        const DLTensor *d = live(t);

        (void)unused;
        if (!d)
                return NULL;
        return Py_BuildValue("(ii)", (int)d->device.device_type, (int)d->device.device_id);
}

static PyObject *tensor_close(DlxPy_Tensor *t, PyObject *unused)
{
        (void)unused;
        tensor_release(t);
        Py_RETURN_NONE;
}

static PyObject *tensor_enter(DlxPy_Tensor *t, PyObject *unused)
{
        (void)unused;
        if (!live(t))
                return NULL;
        return Py_NewRef((PyObject *)t);
}

static PyObject *tensor_exit(DlxPy_Tensor *t, PyObject *args)
{
        (void)args;
        tensor_release(t);
        Py_RETURN_FALSE;
}

/* ---- attributes ------------------------------------------------------------------------------ */

static PyObject *get_name(DlxPy_Tensor *t, void *unused)
{
        (void)unused;
        return Py_NewRef(t->name);
}

static PyObject *get_version(DlxPy_Tensor *t, void *unused)
{
        (void)unused;
        if (!t->version)
                Py_RETURN_NONE;
        return PyLong_FromUnsignedLongLong(t->version);
}

static PyObject *get_storage(DlxPy_Tensor *t, void *unused)
{
        (void)unused;
        if (!t->storage)
                Py_RETURN_NONE;
        return PyUnicode_FromString(t->storage);
}

static PyObject *get_shape(DlxPy_Tensor *t, void *unused)
{
        const DLTensor *d = live(t);

        (void)unused;
        return d ? int64_tuple(d->shape, d->ndim) : NULL;
}

static PyObject *get_strides(DlxPy_Tensor *t, void *unused)
{
        const DLTensor *d = live(t);
        int64_t s[DLX_MAX_NDIM];

        (void)unused;
        if (!d)
                return NULL;
        if (d->strides || d->ndim == 0)
                return int64_tuple(d->strides, d->ndim);
        compact_strides(d, s);
        return int64_tuple(s, d->ndim);
}

static PyObject *get_ndim(DlxPy_Tensor *t, void *unused)
{
        const DLTensor *d = live(t);

        (void)unused;
        return d ? PyLong_FromLong(d->ndim) : NULL;
}

static PyObject *get_dtype(DlxPy_Tensor *t, void *unused)
{
        const DLTensor *d = live(t);

        (void)unused;
        return d ? dlxpy_dtype_name(d->dtype) : NULL;
}

static PyObject *get_device(DlxPy_Tensor *t, void *unused)
{
        const DLTensor *d = live(t);

        (void)unused;
        return d ? dlxpy_device_name(d->device) : NULL;
}

static PyObject *get_nbytes(DlxPy_Tensor *t, void *unused)
{
        const DLTensor *d = live(t);

        (void)unused;
        return d ? PyLong_FromUnsignedLongLong(compact_nbytes(d)) : NULL;
}

static PyObject *get_data_ptr(DlxPy_Tensor *t, void *unused)
{
        const DLTensor *d = live(t);

        (void)unused;
        return d ? PyLong_FromVoidPtr((uint8_t *)d->data + d->byte_offset) : NULL;
}

static PyObject *get_read_only(DlxPy_Tensor *t, void *unused)
{
        (void)unused;
        return PyBool_FromLong((t->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
}

static PyObject *get_closed(DlxPy_Tensor *t, void *unused)
{
        (void)unused;
        return PyBool_FromLong(t->h == NULL);
}

static PyObject *tensor_repr(DlxPy_Tensor *t)
{
        const DLTensor *d = t->h ? dlx_tensor_dltensor(t->h) : NULL;
        PyObject *shape, *dtype, *device, *r;

        if (!d)
                return PyUnicode_FromFormat("<dlx.Tensor %R (closed)>", t->name);
        shape = int64_tuple(d->shape, d->ndim);
        dtype = dlxpy_dtype_name(d->dtype);
        device = dlxpy_device_name(d->device);
        r = shape && dtype && device
                    ? PyUnicode_FromFormat(
                              "<dlx.Tensor name=%R version=%llu shape=%R dtype=%U device=%U "
                              "storage=%s%s>",
                              t->name, (unsigned long long)t->version, shape, dtype, device,
                              t->storage ? t->storage : "-",
                              t->flags & DLPACK_FLAG_BITMASK_READ_ONLY ? " read-only" : "")
                    : NULL;
        Py_XDECREF(shape);
        Py_XDECREF(dtype);
        Py_XDECREF(device);
        return r;
}

static PyMethodDef tensor_methods[] = {
        {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
         "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
         "Exports the tensor as a DLPack capsule: 'dltensor_versioned' (DLPack 1.x) when\n"
         "max_version's major is >= 1, else a legacy 'dltensor'. Each export keeps the\n"
         "tensor (and its lease) alive until the consumer deletes it. copy=True gives a\n"
         "private CPU copy."},
        {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
         "__dlpack_device__()\n--\n\n(device_type, device_id) as DLPack numbers them."},
        {"close", (PyCFunction)tensor_close, METH_NOARGS,
         "close()\n--\n\nDrops this object's hold on the tensor: the lease is released once "
         "every\nDLPack export of it is gone too. Idempotent."},
        {"__enter__", (PyCFunction)tensor_enter, METH_NOARGS, NULL},
        {"__exit__", (PyCFunction)tensor_exit, METH_VARARGS, NULL},
        {NULL, NULL, 0, NULL},
};

static PyGetSetDef tensor_getset[] = {
        {"name", (getter)get_name, NULL, "The name it was acquired under, or None.", NULL},
        {"version", (getter)get_version, NULL, "The version acquired, or None.", NULL},
        {"storage", (getter)get_storage, NULL,
         "How it is shared: 'memfd', 'cuda-ipc', 'cuda-vmm', 'cuda-host', or None.", NULL},
        {"shape", (getter)get_shape, NULL, "A tuple of ints.", NULL},
        {"strides", (getter)get_strides, NULL, "A tuple of ints, in elements (not bytes).", NULL},
        {"ndim", (getter)get_ndim, NULL, NULL, NULL},
        {"dtype", (getter)get_dtype, NULL, "A str: 'float32', 'bfloat16', 'bool', ...", NULL},
        {"device", (getter)get_device, NULL, "A str: 'cpu', 'cuda:N' or 'cuda_host'.", NULL},
        {"nbytes", (getter)get_nbytes, NULL, "Bytes of a compact copy of the tensor.", NULL},
        {"data_ptr", (getter)get_data_ptr, NULL, "Address of the first element.", NULL},
        {"read_only", (getter)get_read_only, NULL, "Whether writing through it is refused.", NULL},
        {"closed", (getter)get_closed, NULL, NULL, NULL},
        {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends with its own comma: clang-format would join the next line */
/* clang-format off */
PyTypeObject DlxPy_TensorType = {
        PyVarObject_HEAD_INIT(NULL, 0)
        .tp_name = "dlx.Tensor",
        /* clang-format on */
        .tp_basicsize = sizeof(DlxPy_Tensor),
        .tp_dealloc = (destructor)tensor_dealloc,
        .tp_repr = (reprfunc)tensor_repr,
        .tp_flags = Py_TPFLAGS_DEFAULT,
        .tp_doc = "A tensor shared through dlx: returned by Client.acquire() and "
                  "Client.alloc().\n\nAny DLPack consumer takes it zero-copy "
                  "(numpy.from_dlpack, torch.from_dlpack,\ntvm_ffi), through __dlpack__ or "
                  "the DLPack C exchange API on its type.",
        .tp_weaklistoffset = offsetof(DlxPy_Tensor, weakrefs),
        .tp_methods = tensor_methods,
        .tp_getset = tensor_getset,
};

int dlxpy_tensor_init(PyObject *module)
{
        PyObject *cap, *addr;
        int rc;

        if (PyType_Ready(&DlxPy_TensorType) < 0)
                return -1;
        /* the exchange API lives on the type, as DLPack asks: 1.3 (capsule) and 1.2 (int) */
        cap = PyCapsule_New((void *)dlxpy_exchange_api(), DLXPY_CAPSULE_EXCHANGE_API, NULL);
        addr = PyLong_FromVoidPtr((void *)dlxpy_exchange_api());
        rc = cap && addr &&
                             PyDict_SetItemString(DlxPy_TensorType.tp_dict,
                                                  "__dlpack_c_exchange_api__", cap) == 0 &&
                             PyDict_SetItemString(DlxPy_TensorType.tp_dict,
                                                  "__c_dlpack_exchange_api__", addr) == 0
                     ? 0
                     : -1;
        Py_XDECREF(cap);
        Py_XDECREF(addr);
        if (rc < 0)
                return -1;
        PyType_Modified(&DlxPy_TensorType);
        return PyModule_AddObjectRef(module, "Tensor", (PyObject *)&DlxPy_TensorType);
}
