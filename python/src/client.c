/* SPDX-License-Identifier: MIT */
/*
 * dlx.Client: one dlx_client connection.
 *
 * Every call that talks to the daemon runs with the GIL released. A libdlx
 * client must not be used once dlx_close() has begun, so close() only marks
 * the client closing while calls run in other threads; the last of them
 * closes it for real. Waits are cut in slices of DLXPY_SLICE_MS, so a wait
 * without limit still notices Ctrl-C and close() from another thread.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dlxpy.h"

static int64_t now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int dlxpy_timeout_ms(PyObject *timeout, int64_t dflt, int64_t *ret_ms)
{
        double s;

        if (timeout == Py_None) {
                *ret_ms = dflt;
                return 0;
        }
        s = PyFloat_AsDouble(timeout);
        if (s == -1.0 && PyErr_Occurred())
                return -1;
        if (isnan(s) || s < 0) {
                PyErr_SetString(PyExc_ValueError,
                                "timeout must be None, a number of seconds >= 0, or math.inf");
                return -1;
        }
        if (isinf(s) || s > 1e12) {
                *ret_ms = -1;
                return 0;
        }
        *ret_ms = (int64_t)ceil(s * 1000.0);
        return 0;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

static void real_close(DlxPy_Client *self)
{
        dlx_client *c = self->c;

        self->c = NULL;
        if (!c)
                return;
        /* may run publishers' deleters, which may want the GIL */
        Py_BEGIN_ALLOW_THREADS;
        dlx_close(c);
        Py_END_ALLOW_THREADS;
}

int dlxpy_client_enter(DlxPy_Client *self)
{
        if (!self->c || self->closing) {
                PyErr_SetString(PyExc_ValueError, "the dlx.Client is closed");
                return -1;
        }
        self->inflight++;
        return 0;
}

void dlxpy_client_leave(DlxPy_Client *self)
{
        if (--self->inflight == 0 && self->closing)
                real_close(self);
}

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
        DlxPy_Client *self = (DlxPy_Client *)type->tp_alloc(type, 0);

        (void)args;
        (void)kwargs;
        if (!self)
                return NULL;
        self->stash = PyDict_New();
        if (!self->stash) {
                Py_DECREF(self);
                return NULL;
        }
        return (PyObject *)self;
}

static int client_init(DlxPy_Client *self, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"socket", "name", "timeout", NULL};
        PyObject *socket = Py_None, *path = NULL, *timeout = NULL;
        const char *name = NULL;
        struct dlx_connect_options o = {0};
        struct dlxpy_err e;
        dlx_client *c = NULL;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Oz$O:Client", kwlist, &socket, &name,
                                         &timeout))
                return -1;
        /* omitted: libdlx's default; None or math.inf: no limit; else seconds (> 0) */
        if (timeout && dlxpy_timeout_ms(timeout, -1, &o.timeout_ms) < 0)
                return -1;
        if (timeout && o.timeout_ms == 0) {
                PyErr_SetString(PyExc_ValueError,
                                "timeout must be a number of seconds > 0, None or math.inf");
                return -1;
        }
        if (o.timeout_ms > INT32_MAX)
                o.timeout_ms = -1;
        if (self->c || self->closing) {
                PyErr_SetString(PyExc_RuntimeError, "dlx.Client is already initialised");
                return -1;
        }
        if (socket != Py_None) {
                if (!PyUnicode_FSConverter(socket, &path))
                        return -1;
                o.socket_path = PyBytes_AS_STRING(path);
        }
        o.client_name = name;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_connect(&o, &c));
        Py_END_ALLOW_THREADS;
        Py_XDECREF(path);
        if (e.err < 0) {
                dlxpy_raise_connect(e.err, e.msg);
                return -1;
        }
        self->c = c;
        return 0;
}

static void client_dealloc(DlxPy_Client *self)
{
        if (self->weakrefs)
                PyObject_ClearWeakRefs((PyObject *)self);
        self->closing = true;
        real_close(self);
        Py_CLEAR(self->stash);
        Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *client_close(DlxPy_Client *self, PyObject *unused)
{
        (void)unused;
        self->closing = true;
        if (self->inflight == 0)
                real_close(self);
        Py_RETURN_NONE;
}

static PyObject *client_enter_ctx(DlxPy_Client *self, PyObject *unused)
{
        (void)unused;
        if (!self->c || self->closing) {
                PyErr_SetString(PyExc_ValueError, "the dlx.Client is closed");
                return NULL;
        }
        return Py_NewRef((PyObject *)self);
}

static PyObject *client_exit_ctx(DlxPy_Client *self, PyObject *args)
{
        (void)args;
        Py_XDECREF(client_close(self, NULL));
        Py_RETURN_FALSE;
}

/* ---- publish -------------------------------------------------------------------------------- */

static int parse_copy(PyObject *copy, enum dlx_copy *ret)
{
        if (!copy || copy == Py_None) {
                *ret = DLX_COPY_IF_NEEDED;
                return 0;
        }
        if (PyBool_Check(copy)) {
                *ret = copy == Py_True ? DLX_COPY_ALWAYS : DLX_COPY_NEVER;
                return 0;
        }
        if (PyUnicode_Check(copy)) {
                const char *s = PyUnicode_AsUTF8(copy);
                if (!s)
                        return -1;
                if (!strcmp(s, "if-needed") || !strcmp(s, "if_needed")) {
                        *ret = DLX_COPY_IF_NEEDED;
                        return 0;
                }
                if (!strcmp(s, "never")) {
                        *ret = DLX_COPY_NEVER;
                        return 0;
                }
                if (!strcmp(s, "always")) {
                        *ret = DLX_COPY_ALWAYS;
                        return 0;
                }
        }
        PyErr_Format(PyExc_ValueError,
                     "copy must be 'if-needed' (or None), 'never' (or False) or 'always' (or "
                     "True), not %R",
                     copy);
        return -1;
}

static PyObject *client_publish(DlxPy_Client *self, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"name", "obj", "persist", "read_only", "copy", "stream", NULL};
        const char *name;
        PyObject *obj, *copy = NULL, *stream = Py_None;
        int persist = 0, read_only = 1;
        struct dlx_publish_options o = {0};
        DLManagedTensorVersioned *mt;
        DLManagedTensor *legacy;
        uint64_t version = 0;
        struct dlxpy_err e;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|$ppOO:publish", kwlist, &name, &obj,
                                         &persist, &read_only, &copy, &stream))
                return NULL;
        if (parse_copy(copy, &o.copy) < 0)
                return NULL;
        o.persist = persist;
        o.writable = !read_only;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        /* with the GIL: the producer's table and __dlpack__ are Python-level calls */
        if (dlxpy_take_tensor(obj, name, stream, &mt, &legacy, &o.stream) < 0) {
                dlxpy_client_leave(self);
                return NULL;
        }
        /* both take ownership on every path; a copied tensor's deleter runs in here */
        Py_BEGIN_ALLOW_THREADS;
        if (mt)
                dlxpy_err_take(&e, dlx_publish(self->c, name, mt, &o, &version));
        else
                dlxpy_err_take(&e, dlx_publish_legacy(self->c, name, legacy, &o, &version));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        return PyLong_FromUnsignedLongLong(version);
}

static PyObject *client_unpublish(DlxPy_Client *self, PyObject *args)
{
        const char *name;
        struct dlxpy_err e;

        if (!PyArg_ParseTuple(args, "s:unpublish", &name))
                return NULL;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_unpublish(self->c, name));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        Py_RETURN_NONE;
}

/* ---- acquire ----------------------------------------------------------------------------------
 */

static PyObject *wrap_tensor(DLManagedTensorVersioned *mt, const char *storage)
{
        const char *name = NULL, *st = NULL;
        uint64_t version = 0;
        dlx_tensor *h;
        int err;

        if (dlx_tensor_info(mt, &name, &version, &st) < 0) {
                name = NULL;
                st = storage;
        }
        /* deletes the tensor if it fails */
        err = dlx_tensor_wrap(mt, &h);
        if (err < 0)
                return dlxpy_raise(err, dlx_last_error());
        /* name lives in the tensor, which h keeps alive; its flags are as wrapping left them */
        return dlxpy_tensor_new(h, mt->flags, name, version, st);
}

/*
 * For acquire(): sleeps on the version page until track shows a version that
 * will do (>= min_version, any with 0), up to ms. Returns 1 when there is one,
 * 0 when ms passed first (e: -ETIMEDOUT), -1 when the page cannot say (the
 * session ended, an old daemon...). GIL held on entry and return.
 */
static int wait_tracked(DlxPy_Client *self, uint32_t track, uint64_t min_version, int64_t ms,
                        struct dlxpy_err *e)
{
        uint64_t want = min_version ? min_version : 1, v = 0;
        int r = 0;

        Py_BEGIN_ALLOW_THREADS;
        e->err = dlx_track_version(self->c, track, &v);
        while (e->err == 0 && v < want) {
                /* versions only grow while tracked: each change is a look, then a wait */
                e->err = dlx_track_wait(self->c, track, v, ms, &v);
                if (e->err == 0 && v < want)
                        continue;
                break;
        }
        if (e->err == 0)
                r = 1;
        else if (e->err == -ETIMEDOUT || e->err == -EAGAIN)
                dlxpy_err_take(e, -ETIMEDOUT);
        else
                r = -1;
        Py_END_ALLOW_THREADS;
        return r;
}

/* Ends acquire()'s track, if it has one (GIL held). */
static void untrack(DlxPy_Client *self, uint32_t *track)
{
        uint32_t t = *track;

        if (!t)
                return;
        *track = 0;
        Py_BEGIN_ALLOW_THREADS;
        dlx_untrack(self->c, t);
        Py_END_ALLOW_THREADS;
}

/* One try of a waiting acquire, GIL released: dlx_acquire or dlx_acquire_group. */
typedef int (*acquire_fn)(DlxPy_Client *self, const char *name, const struct dlx_acquire_options *o,
                          void *ctx);

/*
 * A wait of total ms (< 0: none; 0: do not wait) for name, try() in slices of
 * DLXPY_SLICE_MS so that Ctrl-C and close() get in; a wait longer than one
 * slice goes on in the version page (asleep on its futex), not in requests
 * dlxd answers. Returns 0 (try() succeeded) or -1 (raised).
 */
static int acquire_wait(DlxPy_Client *self, const char *name, int64_t total,
                        struct dlx_acquire_options *o, acquire_fn try, void *ctx)
{
        int64_t deadline = total > 0 ? now_ms() + total : 0;
        uint32_t track = 0;
        struct dlxpy_err e = {0};

        for (;;) {
                int64_t left = total < 0 ? DLXPY_SLICE_MS : total == 0 ? 0 : deadline - now_ms();
                if (total > 0 && left <= 0)
                        break; /* e holds the last slice's -ETIMEDOUT */
                o->timeout_ms = left < DLXPY_SLICE_MS ? left : DLXPY_SLICE_MS;
                if (track) {
                        int r = wait_tracked(self, track, o->min_version, o->timeout_ms, &e);
                        if (r < 0) {
                                untrack(self, &track);
                                continue; /* the page cannot help: wait the plain way */
                        }
                        if (r == 0)
                                goto slice_end;
                        /* a version that will do is there: take it, at once as a rule */
                }
                Py_BEGIN_ALLOW_THREADS;
                dlxpy_err_take(&e, try(self, name, o, ctx));
                if (e.err == -ETIMEDOUT && !track && total != 0 &&
                    (total < 0 || deadline - now_ms() > 0) && dlx_track(self->c, name, &track) < 0)
                        track = 0;
                Py_END_ALLOW_THREADS;
                if (e.err != -ETIMEDOUT)
                        break;
        slice_end:
                /* a slice ran out: let Ctrl-C and close() in, then wait on */
                if (PyErr_CheckSignals() < 0) {
                        untrack(self, &track);
                        return -1;
                }
                if (self->closing) {
                        untrack(self, &track);
                        PyErr_SetString(PyExc_ValueError, "the dlx.Client was closed");
                        return -1;
                }
        }
        untrack(self, &track);
        if (e.err == -ETIMEDOUT) {
                /* say what was waited for, not what the last slice was */
                if (o->min_version)
                        snprintf(e.msg, sizeof(e.msg), "no version >= %llu of '%s' within %.3f s",
                                 (unsigned long long)o->min_version, name, (double)total / 1000);
                else
                        snprintf(e.msg, sizeof(e.msg), "'%s' was not published within %.3f s", name,
                                 (double)total / 1000);
        }
        if (e.err < 0) {
                dlxpy_raise(e.err, e.msg);
                return -1;
        }
        return 0;
}

/* The options acquire() and acquire_dict() share: timeout, min_version, stream. */
static int acquire_options(PyObject *timeout, PyObject *min_version, PyObject *stream,
                           int64_t *ret_total, struct dlx_acquire_options *o)
{
        if (dlxpy_timeout_ms(timeout, -1, ret_total) < 0)
                return -1;
        if (min_version != Py_None) {
                o->min_version = PyLong_AsUnsignedLongLong(min_version);
                if (PyErr_Occurred())
                        return -1;
        }
        if (stream != Py_None) {
                o->stream = PyLong_AsVoidPtr(stream);
                if (PyErr_Occurred())
                        return -1;
        }
        return 0;
}

static int try_acquire(DlxPy_Client *self, const char *name, const struct dlx_acquire_options *o,
                       void *ctx)
{
        return dlx_acquire(self->c, name, o, ctx);
}

static PyObject *client_acquire(DlxPy_Client *self, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"name", "timeout", "min_version", "stream", NULL};
        const char *name;
        PyObject *timeout = Py_None, *min_version = Py_None, *stream = Py_None;
        struct dlx_acquire_options o = {0};
        DLManagedTensorVersioned *mt = NULL;
        int64_t total;
        int rc;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|$OOO:acquire", kwlist, &name, &timeout,
                                         &min_version, &stream))
                return NULL;
        if (acquire_options(timeout, min_version, stream, &total, &o) < 0)
                return NULL;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        rc = acquire_wait(self, name, total, &o, try_acquire, &mt);
        dlxpy_client_leave(self);
        if (rc < 0)
                return NULL;
        return wrap_tensor(mt, NULL);
}

/* ---- groups ----------------------------------------------------------------------------------
 */

/* Deletes the tensors taken so far (GIL held or not: deleters of producers' tensors may need it).
 */
static void delete_members(struct dlx_member *ms, size_t n)
{
        for (size_t i = 0; i < n; i++)
                if (ms[i].tensor && ms[i].tensor->deleter)
                        ms[i].tensor->deleter(ms[i].tensor);
}

static PyObject *client_publish_dict(DlxPy_Client *self, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"name", "mapping", "persist", NULL};
        const char *name;
        PyObject *mapping, *items = NULL, *keys = NULL;
        struct dlx_publish_options o = {0};
        struct dlx_member *ms = NULL;
        Py_ssize_t n = 0, taken = 0;
        int persist = 0;
        uint64_t version = 0;
        struct dlxpy_err e;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|$p:publish_dict", kwlist, &name,
                                         &mapping, &persist))
                return NULL;
        o.persist = persist;
        items = PyMapping_Items(mapping);
        if (!items)
                return NULL;
        n = PyList_GET_SIZE(items);
        ms = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*ms));
        keys = PyList_New(n); /* the names, alive until the publish returns */
        if (!ms || !keys) {
                PyErr_NoMemory();
                goto fail;
        }
        for (; taken < n; taken++) {
                PyObject *item = PyList_GET_ITEM(items, taken);
                if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
                        PyErr_Format(PyExc_TypeError,
                                     "publish_dict '%s': the mapping's items() gave a %s, not a "
                                     "(name, tensor) pair",
                                     name, Py_TYPE(item)->tp_name);
                        goto fail;
                }
                PyObject *key = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
                DLManagedTensor *legacy = NULL;
                void *stream = NULL;
                const char *member;

                if (!PyUnicode_Check(key)) {
                        PyErr_Format(PyExc_TypeError,
                                     "publish_dict '%s': member names are str, not %s", name,
                                     Py_TYPE(key)->tp_name);
                        goto fail;
                }
                Py_ssize_t mlen;
                member = PyUnicode_AsUTF8AndSize(key, &mlen);
                if (!member)
                        goto fail;
                if ((size_t)mlen != strlen(member)) {
                        PyErr_Format(PyExc_ValueError,
                                     "publish_dict '%s': a member name holds a NUL character",
                                     name);
                        goto fail;
                }
                Py_INCREF(key);
                PyList_SET_ITEM(keys, taken, key);
                if (dlxpy_take_tensor(value, member, Py_None, &ms[taken].tensor, &legacy, &stream) <
                    0)
                        goto fail;
                /* device members: ordered after the work on the framework's current stream */
                if (!o.stream)
                        o.stream = stream;
                if (legacy) {
                        int err = dlx_tensor_from_legacy(legacy, &ms[taken].tensor);
                        if (err < 0) {
                                dlxpy_raise(err, dlx_last_error());
                                goto fail;
                        }
                }
                ms[taken].name = member;
        }
        if (dlxpy_client_enter(self) < 0)
                goto fail;
        /* takes every tensor on every path; their deleters run in here */
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_publish_group(self->c, name, ms, (size_t)n, &o, &version));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        PyMem_Free(ms);
        Py_DECREF(keys);
        Py_DECREF(items);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        return PyLong_FromUnsignedLongLong(version);
fail:
        if (ms)
                delete_members(ms, (size_t)taken);
        PyMem_Free(ms);
        Py_XDECREF(keys);
        Py_XDECREF(items);
        return NULL;
}

struct group_try {
        const char *const *names;
        size_t count;
        dlx_group *g;
};

static int try_acquire_group(DlxPy_Client *self, const char *name,
                             const struct dlx_acquire_options *o, void *ctx)
{
        struct group_try *t = ctx;
        return dlx_acquire_group(self->c, name, t->names, t->count, o, &t->g);
}

static PyObject *client_acquire_dict(DlxPy_Client *self, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"name", "members", "timeout", "min_version", NULL};
        const char *name;
        PyObject *members = Py_None, *timeout = Py_None, *min_version = Py_None;
        PyObject *seq = NULL, *dict = NULL;
        struct dlx_acquire_options o = {0};
        struct group_try t = {0};
        const char **names = NULL;
        int64_t total;
        int rc;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|O$OO:acquire_dict", kwlist, &name,
                                         &members, &timeout, &min_version))
                return NULL;
        if (acquire_options(timeout, min_version, Py_None, &total, &o) < 0)
                return NULL;
        if (members != Py_None) {
                /* a tuple of our own: the names live while the GIL is released */
                seq = PySequence_Tuple(members);
                if (!seq)
                        return NULL;
                t.count = (size_t)PyTuple_GET_SIZE(seq);
                names = PyMem_Calloc(t.count ? t.count : 1, sizeof(*names));
                if (!names) {
                        Py_DECREF(seq);
                        return PyErr_NoMemory();
                }
                for (size_t i = 0; i < t.count; i++) {
                        PyObject *k = PyTuple_GET_ITEM(seq, (Py_ssize_t)i);
                        names[i] = PyUnicode_Check(k) ? PyUnicode_AsUTF8(k) : NULL;
                        if (!names[i]) {
                                if (!PyErr_Occurred())
                                        PyErr_Format(PyExc_TypeError,
                                                     "acquire_dict: member names are str, not %s",
                                                     Py_TYPE(k)->tp_name);
                                goto out;
                        }
                }
                t.names = names;
        }
        if (dlxpy_client_enter(self) < 0)
                goto out;
        rc = acquire_wait(self, name, total, &o, try_acquire_group, &t);
        dlxpy_client_leave(self);
        if (rc < 0)
                goto out;
        /* one dlx.Tensor per member: each keeps the group's lease while it lives */
        dict = PyDict_New();
        for (size_t i = 0; dict && i < dlx_group_count(t.g); i++) {
                DLManagedTensorVersioned *mt = NULL;
                int err = dlx_group_take(t.g, i, &mt);
                PyObject *tensor =
                        err < 0 ? dlxpy_raise(err, dlx_last_error()) : wrap_tensor(mt, NULL);
                if (!tensor || PyDict_SetItemString(dict, dlx_group_name(t.g, i), tensor) < 0)
                        Py_CLEAR(dict);
                Py_XDECREF(tensor);
        }
        dlx_group_release(t.g);
out:
        PyMem_Free(names);
        Py_XDECREF(seq);
        return dict;
}

/* ---- alloc ------------------------------------------------------------------------------------
 */

static PyObject *client_alloc(DlxPy_Client *self, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"shape", "dtype", "device", NULL};
        PyObject *shape_obj, *dtype_obj, *device_obj = NULL, *seq;
        int64_t shape[DLX_MAX_NDIM];
        DLTensor proto = {0};
        DLManagedTensorVersioned *mt = NULL;
        struct dlxpy_err e;
        const char *storage;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:alloc", kwlist, &shape_obj, &dtype_obj,
                                         &device_obj))
                return NULL;
        proto.device.device_type = kDLCPU;
        if (device_obj && dlxpy_device_parse(device_obj, &proto.device) < 0)
                return NULL;
        if (dlxpy_dtype_parse(dtype_obj, &proto.dtype) < 0)
                return NULL;
        if (PyLong_Check(shape_obj)) {
                shape[0] = PyLong_AsLongLong(shape_obj);
                if (PyErr_Occurred())
                        return NULL;
                proto.ndim = 1;
        } else {
                seq = PySequence_Fast(shape_obj, "shape must be an int or a sequence of ints");
                if (!seq)
                        return NULL;
                Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
                if (n > DLX_MAX_NDIM) {
                        Py_DECREF(seq);
                        PyErr_Format(PyExc_ValueError, "at most %d dimensions", DLX_MAX_NDIM);
                        return NULL;
                }
                for (Py_ssize_t i = 0; i < n; i++) {
                        shape[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
                        if (PyErr_Occurred()) {
                                Py_DECREF(seq);
                                return NULL;
                        }
                }
                Py_DECREF(seq);
                proto.ndim = (int32_t)n;
        }
        proto.shape = shape;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_alloc(self->c, &proto, &mt));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        storage = proto.device.device_type == kDLCUDA       ? "cuda-vmm"
                  : proto.device.device_type == kDLCUDAHost ? "cuda-host"
                                                            : "memfd";
        return wrap_tensor(mt, storage);
}

/* ---- inspecting -------------------------------------------------------------------------------
 */

static PyObject *client_stat(DlxPy_Client *self, PyObject *args)
{
        const char *name;
        struct dlx_info info;
        struct dlxpy_err e;

        if (!PyArg_ParseTuple(args, "s:stat", &name))
                return NULL;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_stat(self->c, name, &info));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        return dlxpy_info_new(&info);
}

struct list_ctx {
        PyObject *list;
        bool failed;
};

/* Runs without the GIL (dlx_list is called without it) and with no libdlx lock held. */
static int list_one(void *ctx, const struct dlx_info *info)
{
        struct list_ctx *l = ctx;
        PyGILState_STATE gil = PyGILState_Ensure();
        PyObject *o = dlxpy_info_new(info);

        if (!o || PyList_Append(l->list, o) < 0)
                l->failed = true;
        Py_XDECREF(o);
        PyGILState_Release(gil);
        return l->failed;
}

static PyObject *client_list(DlxPy_Client *self, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"prefix", NULL};
        const char *prefix = "";
        struct list_ctx l = {0};
        struct dlxpy_err e;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|s:list", kwlist, &prefix))
                return NULL;
        l.list = PyList_New(0);
        if (!l.list)
                return NULL;
        if (dlxpy_client_enter(self) < 0) {
                Py_DECREF(l.list);
                return NULL;
        }
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_list(self->c, prefix, list_one, &l));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (l.failed) {
                Py_DECREF(l.list);
                return NULL;
        }
        if (e.err < 0) {
                Py_DECREF(l.list);
                return dlxpy_raise(e.err, e.msg);
        }
        return l.list;
}

#define SET_U64(d, k, v)                                                                           \
        do {                                                                                       \
                PyObject *x_ = PyLong_FromUnsignedLongLong(v);                                     \
                if (!x_ || PyDict_SetItemString(d, k, x_) < 0) {                                   \
                        Py_XDECREF(x_);                                                            \
                        Py_DECREF(d);                                                              \
                        return NULL;                                                               \
                }                                                                                  \
                Py_DECREF(x_);                                                                     \
        } while (0)

static PyObject *client_stats(DlxPy_Client *self, PyObject *unused)
{
        struct dlx_stats s;
        struct dlxpy_err e;
        PyObject *d;

        (void)unused;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_stats(self->c, &s));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        if (!(d = PyDict_New()))
                return NULL;
        SET_U64(d, "names", s.names);
        SET_U64(d, "versions", s.versions);
        SET_U64(d, "leases", s.leases);
        SET_U64(d, "segments", s.segments);
        SET_U64(d, "bytes", s.bytes);
        SET_U64(d, "max_bytes", s.max_bytes);
        SET_U64(d, "clients", s.clients);
        SET_U64(d, "max_clients", s.max_clients);
        SET_U64(d, "watchers", s.watchers);
        SET_U64(d, "uptime_ms", s.uptime_ms);
        SET_U64(d, "requests", s.requests);
        SET_U64(d, "publishes", s.publishes);
        SET_U64(d, "acquires", s.acquires);
        SET_U64(d, "uid", s.uid);
        SET_U64(d, "uid_clients", s.uid_clients);
        SET_U64(d, "uid_bytes", s.uid_bytes);
        SET_U64(d, "uid_names", s.uid_names);
        return d;
}

static PyObject *client_metrics(DlxPy_Client *self, PyObject *unused)
{
        struct dlxpy_err e;
        char *text = NULL;
        PyObject *s;

        (void)unused;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_metrics(self->c, &text));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
        free(text);
        return s;
}

static PyObject *client_ping(DlxPy_Client *self, PyObject *unused)
{
        struct dlxpy_err e;

        (void)unused;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_ping(self->c));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        Py_RETURN_NONE;
}

/* ---- watching and event loops -----------------------------------------------------------------
 */

static PyObject *client_watch(DlxPy_Client *self, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"prefix", "timeout", NULL};
        PyObject *prefix = NULL, *timeout = Py_None;
        const char *p = "";
        int64_t ms;
        uint64_t id = 0;
        struct dlxpy_err e;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|U$O:watch", kwlist, &prefix, &timeout))
                return NULL;
        if (prefix && !(p = PyUnicode_AsUTF8(prefix)))
                return NULL;
        if (dlxpy_timeout_ms(timeout, -1, &ms) < 0)
                return NULL;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_watch(self->c, p, &id));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        return dlxpy_watch_new(self, id, prefix, ms);
}

static PyObject *client_track(DlxPy_Client *self, PyObject *args)
{
        PyObject *name;
        const char *n;
        uint32_t id = 0;
        struct dlxpy_err e;

        if (!PyArg_ParseTuple(args, "U:track", &name) || !(n = PyUnicode_AsUTF8(name)))
                return NULL;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_track(self->c, n, &id));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        return dlxpy_track_new(self, id, name);
}

static PyObject *client_fileno(DlxPy_Client *self, PyObject *unused)
{
        (void)unused;
        if (!self->c || self->closing) {
                PyErr_SetString(PyExc_ValueError, "the dlx.Client is closed");
                return NULL;
        }
        return PyLong_FromLong(dlx_fd(self->c));
}

static PyObject *client_process_events(DlxPy_Client *self, PyObject *unused)
{
        struct dlxpy_err e;

        (void)unused;
        if (dlxpy_client_enter(self) < 0)
                return NULL;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_process_events(self->c));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(self);
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        return PyLong_FromLong(e.err);
}

static PyObject *get_closed(DlxPy_Client *self, void *unused)
{
        (void)unused;
        return PyBool_FromLong(!self->c || self->closing);
}

static PyObject *get_server_version(DlxPy_Client *self, void *unused)
{
        (void)unused;
        if (!self->c)
                Py_RETURN_NONE;
        return PyUnicode_FromString(dlx_server_version(self->c));
}

static PyMethodDef client_methods[] = {
        {"publish", (PyCFunction)(void (*)(void))client_publish, METH_VARARGS | METH_KEYWORDS,
         "publish(name, obj, *, persist=False, read_only=True, copy='if-needed', stream=None)\n"
         "--\n\n"
         "Publishes any DLPack producer under name as a new version; returns the version.\n"
         "Memory from alloc() on this client is shared as is; other CPU memory is copied\n"
         "once into shared memory (copy='never' refuses instead, copy='always' always\n"
         "copies). persist keeps it after this client closes; read_only=False lets\n"
         "consumers write. stream: the producer's CUDA stream (an int), for CUDA tensors."},
        {"publish_dict", (PyCFunction)(void (*)(void))client_publish_dict,
         METH_VARARGS | METH_KEYWORDS,
         "publish_dict(name, mapping, *, persist=False)\n--\n\n"
         "Publishes every tensor of mapping (str -> DLPack object: a torch state_dict(),\n"
         "numpy arrays...) as one version of the group name, atomically: host tensors\n"
         "copied once; CUDA tensors on one device in place when they are in one\n"
         "allocation, else copied once on the device, ordered after the framework's\n"
         "current stream. Returns the version."},
        {"acquire_dict", (PyCFunction)(void (*)(void))client_acquire_dict,
         METH_VARARGS | METH_KEYWORDS,
         "acquire_dict(name, members=None, *, timeout=None, min_version=None)\n--\n\n"
         "Acquires the current version of the group name in one round trip: a dict of\n"
         "member name -> dlx.Tensor (read-only, zero-copy; all of one version). members:\n"
         "only these, in this order. The group's lease lives while any of them does."},
        {"acquire", (PyCFunction)(void (*)(void))client_acquire, METH_VARARGS | METH_KEYWORDS,
         "acquire(name, *, timeout=None, min_version=None, stream=None)\n--\n\n"
         "Leases the current version of name and maps it: a dlx.Tensor. timeout: seconds\n"
         "to wait for the name (or min_version) to appear; None waits without limit, 0\n"
         "does not wait. Raises dlx.NotFound (no wait) or dlx.Timeout."},
        {"alloc", (PyCFunction)(void (*)(void))client_alloc, METH_VARARGS | METH_KEYWORDS,
         "alloc(shape, dtype, device='cpu')\n--\n\n"
         "A compact, writable tensor in shared memory, to fill in place and publish\n"
         "without a copy. dtype is a name ('float32'); see dlx.Client.alloc for others."},
        {"unpublish", (PyCFunction)client_unpublish, METH_VARARGS,
         "unpublish(name)\n--\n\nRemoves name; leased versions stay readable until released."},
        {"stat", (PyCFunction)client_stat, METH_VARARGS,
         "stat(name)\n--\n\nWhat the daemon knows of name: a dlx.Info."},
        {"list", (PyCFunction)(void (*)(void))client_list, METH_VARARGS | METH_KEYWORDS,
         "list(prefix='')\n--\n\nA dlx.Info per name starting with prefix, in name order."},
        {"stats", (PyCFunction)client_stats, METH_NOARGS,
         "stats()\n--\n\nThe daemon's counters, as a dict."},
        {"metrics", (PyCFunction)client_metrics, METH_NOARGS,
         "metrics()\n--\n\nThe daemon's metrics in the Prometheus text format (dlx_metrics())."},
        {"ping", (PyCFunction)client_ping, METH_NOARGS, "ping()\n--\n\nOne round trip."},
        {"watch", (PyCFunction)(void (*)(void))client_watch, METH_VARARGS | METH_KEYWORDS,
         "watch(prefix='', *, timeout=None)\n--\n\n"
         "Events for names starting with prefix: an iterator of dlx.Event that stops when\n"
         "no event comes within timeout seconds (None: waits without limit)."},
        {"track", (PyCFunction)client_track, METH_VARARGS,
         "track(name)\n--\n\n"
         "A dlx.Track: name's current version, which the daemon keeps in this client's\n"
         "version page, read without a round trip (track.version), and waited for\n"
         "(track.wait()). name need not exist yet."},
        {"fileno", (PyCFunction)client_fileno, METH_NOARGS,
         "fileno()\n--\n\nA descriptor that polls readable when process_events() has work."},
        {"process_events", (PyCFunction)client_process_events, METH_NOARGS,
         "process_events()\n--\n\nReads what the daemon sent without blocking; returns the "
         "number of\nwatch events queued."},
        {"close", (PyCFunction)client_close, METH_NOARGS,
         "close()\n--\n\nCloses the client: its watches end and its non-persistent tensors "
         "are\nremoved. Tensors acquired through it, and every view of them (numpy, torch,\n"
         "tvm-ffi), keep their leases until they are gone: the connection stays open for\n"
         "them alone. Idempotent."},
        {"__enter__", (PyCFunction)client_enter_ctx, METH_NOARGS, NULL},
        {"__exit__", (PyCFunction)client_exit_ctx, METH_VARARGS, NULL},
        {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
        {"closed", (getter)get_closed, NULL, NULL, NULL},
        {"server_version", (getter)get_server_version, NULL,
         "The daemon's version string, seen at connect.", NULL},
        {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends with its own comma: clang-format would join the next line */
/* clang-format off */
PyTypeObject DlxPy_ClientType = {
        PyVarObject_HEAD_INIT(NULL, 0)
        .tp_name = "dlx._dlx.Client",
        /* clang-format on */
        .tp_basicsize = sizeof(DlxPy_Client),
        .tp_dealloc = (destructor)client_dealloc,
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
        .tp_doc = "Client(socket=None, name=None, *, timeout=10.0)\n--\n\n"
                  "A connection to dlxd. socket: the daemon's socket path (None: $DLX_SOCKET,\n"
                  "else the default); name: shown in the daemon's logs and in stat; timeout:\n"
                  "seconds any call waits for the daemon to answer (a silent daemon is pinged\n"
                  "first) before raising dlx.Timeout (None or math.inf: no limit).",
        .tp_weaklistoffset = offsetof(DlxPy_Client, weakrefs),
        .tp_methods = client_methods,
        .tp_getset = client_getset,
        .tp_init = (initproc)client_init,
        .tp_new = client_new,
};

int dlxpy_client_init(PyObject *module)
{
        if (PyType_Ready(&DlxPy_ClientType) < 0)
                return -1;
        return PyModule_AddObjectRef(module, "Client", (PyObject *)&DlxPy_ClientType);
}
