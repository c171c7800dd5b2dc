/* SPDX-License-Identifier: MIT */
/*
 * The DLPack exchange API, both ways.
 *
 * Ours: libdlx's table (dlx_exchange_api()) exchanges dlx_tensor handles, but a
 * table on a Python type must take and give PyObject*s (a dlx.Tensor here). So
 * dlx.Tensor's type carries a table of thin slots, each of which unwraps the
 * object to its handle and calls libdlx's slot (or wraps libdlx's result): the
 * export logic, the allocator and the stream stay libdlx's.
 *
 * Theirs: dlxpy_take_tensor() gets a DLManagedTensor(Versioned) out of any
 * producer for publish().
 */
#include <errno.h>
#include <string.h>

#include "dlxpy.h"

static const DLPackExchangeAPI *lib;
static DLPackExchangeAPI table;

/* How often consumers used each slot: tests check the table is what they went through. */
static unsigned long long counts[5];
enum { N_ALLOC, N_FROM, N_TO, N_VIEW, N_STREAM };
#define COUNT(slot) __atomic_fetch_add(&counts[slot], 1, __ATOMIC_RELAXED)

static int slot_alloc(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
                      void (*set_error)(void *error_ctx, const char *kind, const char *message))
{
        COUNT(N_ALLOC);
        return lib->managed_tensor_allocator(prototype, out, error_ctx, set_error);
}

PyObject *dlxpy_exchange_counts(PyObject *self, PyObject *unused)
{
        (void)self;
        (void)unused;
        return Py_BuildValue(
                "{sKsKsKsKsK}", "managed_tensor_allocator",
                __atomic_load_n(&counts[N_ALLOC], __ATOMIC_RELAXED),
                "managed_tensor_from_py_object_no_sync",
                __atomic_load_n(&counts[N_FROM], __ATOMIC_RELAXED),
                "managed_tensor_to_py_object_no_sync",
                __atomic_load_n(&counts[N_TO], __ATOMIC_RELAXED), "dltensor_from_py_object_no_sync",
                __atomic_load_n(&counts[N_VIEW], __ATOMIC_RELAXED), "current_work_stream",
                __atomic_load_n(&counts[N_STREAM], __ATOMIC_RELAXED));
}

static int slot_from_object(void *object, DLManagedTensorVersioned **out)
{
        PyGILState_STATE gil = PyGILState_Ensure();
        DlxPy_Tensor *t = object;
        int rc = -1;

        COUNT(N_FROM);
        if (!t || !out || !PyObject_TypeCheck((PyObject *)t, &DlxPy_TensorType))
                PyErr_SetString(PyExc_TypeError, "dlx exchange API: not a dlx.Tensor");
        else if (!t->h)
                PyErr_SetString(PyExc_BufferError, "dlx.Tensor is closed");
        else if (lib->managed_tensor_from_py_object_no_sync(t->h, out) != 0)
                PyErr_NoMemory();
        else
                rc = 0;
        PyGILState_Release(gil);
        return rc;
}

static int slot_to_object(DLManagedTensorVersioned *tensor, void **out_object)
{
        PyGILState_STATE gil = PyGILState_Ensure();
        const char *name = NULL, *storage = NULL;
        uint64_t version = 0;
        dlx_tensor *h = NULL;
        PyObject *o = NULL;

        COUNT(N_TO);
        if (!tensor || !out_object) {
                if (tensor && tensor->deleter)
                        tensor->deleter(tensor);
                PyErr_SetString(PyExc_ValueError, "dlx exchange API: NULL argument");
                goto out;
        }
        /* a tensor from dlx_acquire() (handed back to us) keeps its name and version */
        if (dlx_tensor_info(tensor, &name, &version, &storage) < 0)
                name = storage = NULL;
        /* steals the tensor on every path */
        if (lib->managed_tensor_to_py_object_no_sync(tensor, (void **)&h) != 0) {
                PyErr_Format(PyExc_BufferError, "dlx exchange API: %s", dlx_last_error());
                goto out;
        }
        /* the flags as libdlx left them: read-only again if its memory is (tvm-ffi drops them) */
        o = dlxpy_tensor_new(h, tensor->flags, name, version, storage);
out:
        if (o)
                *out_object = o;
        PyGILState_Release(gil);
        return o ? 0 : -1;
}

static int slot_dltensor(void *object, DLTensor *out)
{
        DlxPy_Tensor *t = object;

        COUNT(N_VIEW);
        /* hot: a view only, no Python call unless it fails */
        if (t && out && t->h) {
                *out = *dlx_tensor_dltensor(t->h);
                return 0;
        }
        PyGILState_STATE gil = PyGILState_Ensure();
        PyErr_SetString(PyExc_BufferError, "dlx.Tensor is closed");
        PyGILState_Release(gil);
        return -1;
}

static int slot_stream(DLDeviceType device_type, int32_t device_id, void **out)
{
        COUNT(N_STREAM);
        if (lib->current_work_stream(device_type, device_id, out) == 0)
                return 0;
        PyGILState_STATE gil = PyGILState_Ensure();
        PyErr_SetString(PyExc_RuntimeError, "dlx exchange API: no current stream");
        PyGILState_Release(gil);
        return -1;
}

int dlxpy_exchange_init(void)
{
        lib = dlx_exchange_api();
        if (!lib || lib->header.version.major != DLX_DLPACK_MAJOR) {
                PyErr_SetString(PyExc_ImportError, "libdlx has no DLPack 1.x exchange API");
                return -1;
        }
        table.header.version.major = DLX_DLPACK_MAJOR;
        table.header.version.minor = DLX_DLPACK_MINOR;
        table.header.prev_api = NULL;
        /* takes no object: libdlx's own allocator (dlx_alloc on the default client) */
        table.managed_tensor_allocator = slot_alloc;
        table.managed_tensor_from_py_object_no_sync = slot_from_object;
        table.managed_tensor_to_py_object_no_sync = slot_to_object;
        table.dltensor_from_py_object_no_sync = slot_dltensor;
        table.current_work_stream = slot_stream;
        return 0;
}

const DLPackExchangeAPI *dlxpy_exchange_api(void)
{
        return &table;
}

/* ---- taking tensors from producers --------------------------------------------------------- */

/* The producer type's table of major version 1, or NULL (no error) when it has none. */
static const DLPackExchangeAPI *producer_api(PyObject *obj)
{
        static PyObject *attr13, *attr12;
        const DLPackExchangeAPIHeader *h = NULL;
        PyObject *type = (PyObject *)Py_TYPE(obj), *v;

        if (!attr13 && !(attr13 = PyUnicode_InternFromString("__dlpack_c_exchange_api__")))
                return NULL;
        if (!attr12 && !(attr12 = PyUnicode_InternFromString("__c_dlpack_exchange_api__")))
                return NULL;
        /* DLPack 1.3: a capsule named dlpack_exchange_api */
        v = PyObject_GetAttr(type, attr13);
        if (v) {
                if (PyCapsule_IsValid(v, DLXPY_CAPSULE_EXCHANGE_API))
                        h = PyCapsule_GetPointer(v, DLXPY_CAPSULE_EXCHANGE_API);
                Py_DECREF(v);
        } else {
                PyErr_Clear();
        }
        /* DLPack 1.2: the table's address as an int */
        if (!h) {
                v = PyObject_GetAttr(type, attr12);
                if (v) {
                        if (PyLong_Check(v))
                                h = PyLong_AsVoidPtr(v);
                        Py_DECREF(v);
                }
                PyErr_Clear();
        }
        /* a newer major may chain to a 1.x table */
        while (h && h->version.major != 1)
                h = h->prev_api;
        if (h && !((const DLPackExchangeAPI *)h)->managed_tensor_from_py_object_no_sync)
                h = NULL;
        return (const DLPackExchangeAPI *)h;
}

/* "numpy.ndarray", "torch.Tensor": the producer's type as its users spell it. New reference. */
static PyObject *type_name(PyObject *obj)
{
        PyObject *type = (PyObject *)Py_TYPE(obj), *mod, *qual, *name = NULL;

        mod = PyObject_GetAttrString(type, "__module__");
        qual = PyObject_GetAttrString(type, "__qualname__");
        if (mod && qual && PyUnicode_Check(mod) && PyUnicode_Check(qual))
                name = PyUnicode_CompareWithASCIIString(mod, "builtins") == 0
                               ? Py_NewRef(qual)
                               : PyUnicode_FromFormat("%U.%U", mod, qual);
        Py_XDECREF(mod);
        Py_XDECREF(qual);
        if (!name) {
                PyErr_Clear();
                name = PyUnicode_FromString(Py_TYPE(obj)->tp_name);
        }
        return name;
}

/*
 * str(dtype) of a numpy array or scalar whose dtype DLPack has no code for
 * (object, datetime64, timedelta64, strings, structured, longdouble, ...),
 * else NULL. Asked only once numpy refused: numpy exports the kinds b, i, u,
 * f and c, but not longdouble (type characters g, G), which is no IEEE type.
 * numpy is not imported here: an array of it means it is loaded already.
 */
static PyObject *numpy_dtype_without_dlpack(PyObject *obj)
{
        PyObject *name = PyUnicode_FromString("numpy"), *np, *dtype = NULL, *kind = NULL,
                 *chr = NULL, *text = NULL;
        int is_numpy = 0;

        np = name ? PyImport_GetModule(name) : NULL;
        Py_XDECREF(name);
        if (np) {
                PyObject *ndarray = PyObject_GetAttrString(np, "ndarray");
                PyObject *generic = PyObject_GetAttrString(np, "generic");
                is_numpy = (ndarray && PyObject_IsInstance(obj, ndarray) == 1) ||
                           (generic && PyObject_IsInstance(obj, generic) == 1);
                Py_XDECREF(ndarray);
                Py_XDECREF(generic);
                Py_DECREF(np);
        }
        if (is_numpy && (dtype = PyObject_GetAttrString(obj, "dtype")) &&
            (kind = PyObject_GetAttrString(dtype, "kind")) &&
            (chr = PyObject_GetAttrString(dtype, "char")) && PyUnicode_Check(kind) &&
            PyUnicode_Check(chr) && PyUnicode_GetLength(kind) == 1 &&
            PyUnicode_GetLength(chr) == 1 &&
            (!strchr("biufc", (int)PyUnicode_READ_CHAR(kind, 0)) ||
             strchr("gG", (int)PyUnicode_READ_CHAR(chr, 0))))
                text = PyObject_Str(dtype);
        Py_XDECREF(dtype);
        Py_XDECREF(kind);
        Py_XDECREF(chr);
        /* only an answer matters here: a failure to find one is no news */
        PyErr_Clear();
        return text;
}

/*
 * The producer raised instead of handing over a tensor for publish(name, obj).
 * What the user sees names the call and the tensor, with the producer's
 * exception as __cause__: a TypeError for a numpy dtype DLPack cannot
 * express; otherwise the same kind of error as the producer's (BufferError,
 * the array API's "cannot export", for kinds other than TypeError, ValueError
 * and RuntimeError) with its first line. MemoryError, interrupts and other
 * non-Exceptions pass as they are.
 */
static void explain_refusal(PyObject *obj, const char *name)
{
        static PyObject *const *const kinds[] = {&PyExc_TypeError, &PyExc_ValueError,
                                                 &PyExc_BufferError, &PyExc_RuntimeError};
        PyObject *type, *value, *tb, *cls = PyExc_BufferError, *dtype, *msg = NULL, *exc = NULL;

        if (!PyErr_Occurred() || !PyErr_ExceptionMatches(PyExc_Exception) ||
            PyErr_ExceptionMatches(PyExc_MemoryError))
                return;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb)
                PyException_SetTraceback(value, tb);
        dtype = numpy_dtype_without_dlpack(obj);
        if (dtype) {
                cls = PyExc_TypeError;
                msg = PyUnicode_FromFormat("publish '%s': numpy dtype %U has no DLPack equivalent",
                                           name, dtype);
                Py_DECREF(dtype);
        } else {
                PyObject *what = type_name(obj), *text = PyObject_Str(value), *line = NULL;

                for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
                        if (PyErr_GivenExceptionMatches(value, *kinds[i])) {
                                cls = *kinds[i];
                                break;
                        }
                /* torch's messages go on with a C++ backtrace: the cause keeps all of it */
                if (text) {
                        Py_ssize_t nl =
                                PyUnicode_FindChar(text, '\n', 0, PyUnicode_GetLength(text), 1);
                        line = nl >= 0 ? PyUnicode_Substring(text, 0, nl) : Py_NewRef(text);
                }
                /* a bare "raise BufferError": its kind is all there is to say */
                if (what && line)
                        msg = PyUnicode_GetLength(line)
                                      ? PyUnicode_FromFormat("publish '%s': %U cannot be exported "
                                                             "through DLPack: %U",
                                                             name, what, line)
                                      : PyUnicode_FromFormat("publish '%s': %U cannot be exported "
                                                             "through DLPack: %s",
                                                             name, what, Py_TYPE(value)->tp_name);
                Py_XDECREF(what);
                Py_XDECREF(text);
                Py_XDECREF(line);
        }
        if (msg)
                exc = PyObject_CallOneArg(cls, msg);
        Py_XDECREF(msg);
        if (!exc) {
                /* no words of our own: the producer's error is still better than none */
                PyErr_Clear();
                PyErr_Restore(type, value, tb);
                return;
        }
        PyException_SetCause(exc, Py_NewRef(value));
        PyException_SetContext(exc, value);
        PyErr_SetObject(cls, exc);
        Py_DECREF(exc);
        Py_XDECREF(type);
        Py_XDECREF(tb);
}

/* A producer's exchange-API slot failed: its exception explained, or ours if it raised none. */
static void slot_failed(PyObject *obj, const char *name, PyObject *cls, const char *what)
{
        if (PyErr_Occurred())
                explain_refusal(obj, name);
        else
                PyErr_Format(cls, "publish '%s': the DLPack exchange API of %s %s", name,
                             Py_TYPE(obj)->tp_name, what);
}

/* Takes the tensor out of a DLPack capsule and marks the capsule used. */
static int from_capsule(PyObject *cap, const char *name, DLManagedTensorVersioned **ret_versioned,
                        DLManagedTensor **ret_legacy)
{
        void *p;

        if (PyCapsule_IsValid(cap, DLXPY_CAPSULE_VERSIONED)) {
                p = PyCapsule_GetPointer(cap, DLXPY_CAPSULE_VERSIONED);
                if (!p || PyCapsule_SetName(cap, DLXPY_CAPSULE_VERSIONED_USED) < 0)
                        return -1;
                *ret_versioned = p;
                return 0;
        }
        if (PyCapsule_IsValid(cap, DLXPY_CAPSULE)) {
                p = PyCapsule_GetPointer(cap, DLXPY_CAPSULE);
                if (!p || PyCapsule_SetName(cap, DLXPY_CAPSULE_USED) < 0)
                        return -1;
                *ret_legacy = p;
                return 0;
        }
        PyErr_Format(PyExc_TypeError,
                     "publish '%s': expected a DLPack capsule named 'dltensor_versioned' or "
                     "'dltensor', not %R (a used capsule cannot be published again)",
                     name, cap);
        return -1;
}

static PyObject *call_dlpack(PyObject *method, PyObject *stream_obj, bool versioned)
{
        PyObject *kw = PyDict_New(), *res = NULL, *empty = NULL, *ver = NULL;

        if (!kw)
                return NULL;
        if (versioned) {
                ver = Py_BuildValue("(ii)", DLX_DLPACK_MAJOR, DLX_DLPACK_MINOR);
                if (!ver || PyDict_SetItemString(kw, "max_version", ver) < 0)
                        goto out;
        }
        if (stream_obj != Py_None && PyDict_SetItemString(kw, "stream", stream_obj) < 0)
                goto out;
        empty = PyTuple_New(0);
        if (empty)
                res = PyObject_Call(method, empty, kw);
out:
        Py_XDECREF(ver);
        Py_XDECREF(empty);
        Py_DECREF(kw);
        return res;
}

int dlxpy_take_tensor(PyObject *obj, const char *name, PyObject *stream_obj,
                      DLManagedTensorVersioned **ret_versioned, DLManagedTensor **ret_legacy,
                      void **ret_stream)
{
        const DLPackExchangeAPI *api;
        PyObject *method, *cap;
        void *stream = NULL;
        int rc;

        *ret_versioned = NULL;
        *ret_legacy = NULL;
        if (stream_obj != Py_None) {
                stream = PyLong_AsVoidPtr(stream_obj);
                if (!stream && PyErr_Occurred())
                        return -1;
        }
        *ret_stream = stream;

        /* 1. the fast path: the producer type's C table, no capsule, no Python call */
        api = producer_api(obj);
        if (PyErr_Occurred())
                return -1;
        if (api) {
                DLManagedTensorVersioned *mt = NULL;
                if (api->managed_tensor_from_py_object_no_sync(obj, &mt) != 0 || !mt) {
                        slot_failed(obj, name, PyExc_BufferError, "could not export it");
                        return -1;
                }
                if (mt->dl_tensor.device.device_type != kDLCPU && stream_obj == Py_None &&
                    api->current_work_stream &&
                    api->current_work_stream(mt->dl_tensor.device.device_type,
                                             mt->dl_tensor.device.device_id, ret_stream) != 0) {
                        if (mt->deleter)
                                mt->deleter(mt);
                        slot_failed(obj, name, PyExc_RuntimeError, "has no current stream");
                        return -1;
                }
                *ret_versioned = mt;
                return 0;
        }

        /* 2. a capsule handed over as is */
        if (PyCapsule_CheckExact(obj))
                return from_capsule(obj, name, ret_versioned, ret_legacy);

        /* 3. __dlpack__: versioned first, then what an older producer gives */
        method = PyObject_GetAttrString(obj, "__dlpack__");
        if (!method) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                        return -1;
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError,
                             "publish '%s': %s supports neither the DLPack exchange API nor "
                             "__dlpack__",
                             name, Py_TYPE(obj)->tp_name);
                return -1;
        }
        cap = call_dlpack(method, stream_obj, true);
        if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
                /* a pre-1.0 producer does not know max_version */
                PyErr_Clear();
                cap = call_dlpack(method, stream_obj, false);
        }
        Py_DECREF(method);
        if (!cap) {
                explain_refusal(obj, name);
                return -1;
        }
        rc = from_capsule(cap, name, ret_versioned, ret_legacy);
        Py_DECREF(cap);
        return rc;
}
