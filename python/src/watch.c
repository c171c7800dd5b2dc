/* SPDX-License-Identifier: MIT */
/*
 * dlx.Watch (an iterator of dlx.Event), and the dlx.Event and dlx.Info records.
 *
 * libdlx queues every watch's events of a client in one queue; a Watch that
 * reads another watch's event keeps it in the client's stash, under that
 * watch's id, where the other Watch looks first.
 */
#include <errno.h>
#include <time.h>

#include "dlxpy.h"

static PyTypeObject event_type, info_type;

static PyStructSequence_Field event_fields[] = {
        {"kind", "'published' (a first version), 'replaced', 'unpublished', or 'lost' (events "
                 "were dropped because this client left too many unread: list again)"},
        {"name", NULL},
        {"version", "The new version; for 'unpublished', the last one."},
        {"watch", "The id of the watch it came through."},
        {NULL, NULL},
};

static PyStructSequence_Desc event_desc = {
        "dlx.Event",
        "A change to a watched name.",
        event_fields,
        4,
};

static PyStructSequence_Field info_fields[] = {
        {"name", NULL},
        {"version", NULL},
        {"dtype", "A str, as dlx.Tensor.dtype."},
        {"shape", NULL},
        {"strides", "In elements."},
        {"byte_offset", NULL},
        {"device", "A str, as dlx.Tensor.device."},
        {"read_only", NULL},
        {"storage", "'memfd', 'cuda-ipc', 'cuda-vmm' or 'cuda-host'."},
        {"nbytes", "Bytes the tensor's region spans."},
        {"segment", "The daemon's segment id."},
        {"segment_size", NULL},
        {"owner_uid", NULL},
        {"producer_pid", "0 once the producer has gone (persistent tensors)."},
        {"producer_name", NULL},
        {"persist", NULL},
        {"leases", "Leases on the current version."},
        {"live_versions", NULL},
        {"published", "When, in seconds since the epoch."},
        {"members", "A group's member count (publish_dict); 0 for a tensor."},
        {"origin", "A federation mirror's origin ('ucx tcp/eth1 \u2190 a v7'); '' for others."},
        {NULL, NULL},
};

static PyStructSequence_Desc info_desc = {
        "dlx.Info",
        "What the daemon knows of a name (Client.stat, Client.list).",
        info_fields,
        21,
};

static PyObject *int64_tuple(const int64_t *v, int32_t n)
{
        PyObject *t = PyTuple_New(n);

        for (int32_t i = 0; t && i < n; i++) {
                PyObject *x = PyLong_FromLongLong(v[i]);
                if (!x) {
                        Py_CLEAR(t);
                        break;
                }
                PyTuple_SET_ITEM(t, i, x);
        }
        return t;
}

/* Fills a struct sequence; steals every value, and fails if any is NULL. */
static PyObject *fill(PyTypeObject *type, PyObject **values, int n)
{
        PyObject *o = NULL;
        int i;

        for (i = 0; i < n; i++)
                if (!values[i])
                        goto fail;
        o = PyStructSequence_New(type);
        if (!o)
                goto fail;
        for (i = 0; i < n; i++)
                PyStructSequence_SET_ITEM(o, i, values[i]);
        return o;
fail:
        for (i = 0; i < n; i++)
                Py_XDECREF(values[i]);
        return NULL;
}

PyObject *dlxpy_event_new(const struct dlx_event *ev)
{
        const char *kind = ev->kind == DLX_EVENT_PUBLISHED     ? "published"
                           : ev->kind == DLX_EVENT_REPLACED    ? "replaced"
                           : ev->kind == DLX_EVENT_UNPUBLISHED ? "unpublished"
                           : ev->kind == DLX_EVENT_LOST        ? "lost"
                                                               : "unknown";
        PyObject *v[4] = {
                PyUnicode_FromString(kind),
                PyUnicode_FromString(ev->name),
                PyLong_FromUnsignedLongLong(ev->version),
                PyLong_FromUnsignedLongLong(ev->watch),
        };

        return fill(&event_type, v, 4);
}

PyObject *dlxpy_info_new(const struct dlx_info *i)
{
        PyObject *v[21] = {
                PyUnicode_FromString(i->name),
                PyLong_FromUnsignedLongLong(i->version),
                dlxpy_dtype_name(i->dtype),
                int64_tuple(i->shape, i->ndim),
                int64_tuple(i->strides, i->ndim),
                PyLong_FromUnsignedLongLong(i->byte_offset),
                dlxpy_device_name(i->device),
                PyBool_FromLong((i->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0),
                PyUnicode_FromString(i->storage ? i->storage : ""),
                PyLong_FromUnsignedLongLong(i->nbytes),
                PyLong_FromUnsignedLongLong(i->segment),
                PyLong_FromUnsignedLongLong(i->segment_size),
                PyLong_FromUnsignedLong(i->owner_uid),
                PyLong_FromLong(i->producer_pid),
                PyUnicode_DecodeUTF8(
                        i->producer_name,
                        (Py_ssize_t)strnlen(i->producer_name, sizeof(i->producer_name)), "replace"),
                PyBool_FromLong(i->persist),
                PyLong_FromUnsignedLong(i->leases),
                PyLong_FromUnsignedLong(i->live_versions),
                PyFloat_FromDouble((double)i->published_ns / 1e9),
                PyLong_FromUnsignedLong(i->members),
                PyUnicode_DecodeUTF8(i->origin, (Py_ssize_t)strnlen(i->origin, sizeof(i->origin)),
                                     "replace"),
        };

        return fill(&info_type, v, 21);
}

/* ---- dlx.Watch ----------------------------------------------------------------------------------
 */

typedef struct {
        PyObject_HEAD
        DlxPy_Client *client;
        uint64_t id;
        PyObject *prefix;
        PyObject *key;   /* id as an int: the client's stash key */
        PyObject *queue; /* list: our events another Watch read */
        int64_t timeout_ms;
        bool closed;
} Watch;

PyObject *dlxpy_watch_new(DlxPy_Client *client, uint64_t id, PyObject *prefix, int64_t timeout_ms)
{
        Watch *w = PyObject_New(Watch, &DlxPy_WatchType);

        if (!w)
                return NULL;
        w->client = (DlxPy_Client *)Py_NewRef((PyObject *)client);
        w->id = id;
        w->prefix = prefix ? Py_NewRef(prefix) : PyUnicode_FromString("");
        w->key = PyLong_FromUnsignedLongLong(id);
        w->queue = PyList_New(0);
        w->timeout_ms = timeout_ms;
        w->closed = false;
        if (!w->prefix || !w->key || !w->queue ||
            PyDict_SetItem(client->stash, w->key, w->queue) < 0) {
                Py_DECREF(w);
                return NULL;
        }
        return (PyObject *)w;
}

static int64_t now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * Events were dropped (the client's as a whole, not one watch's): every other
 * open Watch of the client hears of it too, after what it has queued.
 */
static int lost_for_all(DlxPy_Client *c, Watch *w, PyObject *lost)
{
        PyObject *key, *q;
        Py_ssize_t pos = 0;

        while (PyDict_Next(c->stash, &pos, &key, &q))
                if (q != w->queue && PyList_Append(q, lost) < 0)
                        return -1;
        return 0;
}

/* The next event for this watch: a dlx.Event, None when timeout_ms passes, NULL raised. */
static PyObject *next_event(Watch *w, int64_t timeout_ms)
{
        DlxPy_Client *c = w->client;
        int64_t deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
        struct dlx_event ev;
        struct dlxpy_err e;

        if (w->closed) {
                PyErr_SetString(PyExc_ValueError, "the dlx.Watch is closed");
                return NULL;
        }
        if (PyList_GET_SIZE(w->queue) > 0) {
                PyObject *first = Py_NewRef(PyList_GET_ITEM(w->queue, 0));
                if (PySequence_DelItem(w->queue, 0) < 0) {
                        Py_DECREF(first);
                        return NULL;
                }
                return first;
        }
        if (dlxpy_client_enter(c) < 0)
                return NULL;
        for (;;) {
                int64_t left = timeout_ms < 0    ? DLXPY_SLICE_MS
                               : timeout_ms == 0 ? 0
                                                 : deadline - now_ms();
                if (timeout_ms > 0 && left <= 0)
                        break;
                Py_BEGIN_ALLOW_THREADS;
                dlxpy_err_take(&e, dlx_next_event(c->c, &ev,
                                                  left < DLXPY_SLICE_MS ? left : DLXPY_SLICE_MS));
                Py_END_ALLOW_THREADS;
                if (e.err == 0) {
                        PyObject *o = dlxpy_event_new(&ev), *key, *q;
                        if (o && ev.kind == DLX_EVENT_LOST && lost_for_all(c, w, o) < 0)
                                Py_CLEAR(o);
                        if (!o || ev.watch == w->id || ev.kind == DLX_EVENT_LOST) {
                                dlxpy_client_leave(c);
                                return o;
                        }
                        /* another watch's: keep it for that Watch, if it is still open */
                        key = PyLong_FromUnsignedLongLong(ev.watch);
                        q = key ? PyDict_GetItemWithError(c->stash, key) : NULL;
                        Py_XDECREF(key);
                        if ((q && PyList_Append(q, o) < 0) || PyErr_Occurred()) {
                                Py_DECREF(o);
                                dlxpy_client_leave(c);
                                return NULL;
                        }
                        Py_DECREF(o);
                        continue;
                }
                if (e.err != -ETIMEDOUT && e.err != -EAGAIN) {
                        dlxpy_client_leave(c);
                        return dlxpy_raise(e.err, e.msg);
                }
                if (timeout_ms == 0)
                        break;
                if (PyErr_CheckSignals() < 0) {
                        dlxpy_client_leave(c);
                        return NULL;
                }
                if (c->closing) {
                        dlxpy_client_leave(c);
                        PyErr_SetString(PyExc_ValueError, "the dlx.Client was closed");
                        return NULL;
                }
        }
        dlxpy_client_leave(c);
        Py_RETURN_NONE;
}

static PyObject *watch_iternext(Watch *w)
{
        PyObject *ev = next_event(w, w->timeout_ms);

        if (ev == Py_None) {
                /* no event within the timeout: the iteration ends */
                Py_DECREF(ev);
                return NULL;
        }
        return ev;
}

static PyObject *watch_next(Watch *w, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"timeout", NULL};
        PyObject *timeout = NULL;
        int64_t ms = w->timeout_ms;

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:next", kwlist, &timeout))
                return NULL;
        if (timeout && dlxpy_timeout_ms(timeout, -1, &ms) < 0)
                return NULL;
        return next_event(w, ms);
}

static int watch_stop(Watch *w)
{
        DlxPy_Client *c = w->client;
        struct dlxpy_err e = {0};

        if (w->closed)
                return 0;
        w->closed = true;
        if (PyDict_DelItem(c->stash, w->key) < 0)
                PyErr_Clear();
        /* a closed client has no watches left to stop */
        if (!c->c || c->closing)
                return 0;
        c->inflight++;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_unwatch(c->c, w->id));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(c);
        if (e.err < 0 && e.err != -ENOENT) {
                dlxpy_raise(e.err, e.msg);
                return -1;
        }
        return 0;
}

static PyObject *watch_close(Watch *w, PyObject *unused)
{
        (void)unused;
        if (watch_stop(w) < 0)
                return NULL;
        Py_RETURN_NONE;
}

static PyObject *watch_enter(Watch *w, PyObject *unused)
{
        (void)unused;
        return Py_NewRef((PyObject *)w);
}

static PyObject *watch_exit(Watch *w, PyObject *args)
{
        (void)args;
        if (watch_stop(w) < 0)
                return NULL;
        Py_RETURN_FALSE;
}

static void watch_dealloc(Watch *w)
{
        if (w->client && w->key) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                if (watch_stop(w) < 0)
                        PyErr_WriteUnraisable((PyObject *)w);
                PyErr_Restore(type, value, tb);
        }
        Py_XDECREF(w->client);
        Py_XDECREF(w->prefix);
        Py_XDECREF(w->key);
        Py_XDECREF(w->queue);
        PyObject_Free(w);
}

static PyObject *get_prefix(Watch *w, void *unused)
{
        (void)unused;
        return Py_NewRef(w->prefix);
}

static PyObject *get_id(Watch *w, void *unused)
{
        (void)unused;
        return PyLong_FromUnsignedLongLong(w->id);
}

static PyMethodDef watch_methods[] = {
        {"next", (PyCFunction)(void (*)(void))watch_next, METH_VARARGS | METH_KEYWORDS,
         "next(timeout=<the watch's>)\n--\n\nThe next dlx.Event, or None if none came within "
         "timeout seconds."},
        {"close", (PyCFunction)watch_close, METH_NOARGS,
         "close()\n--\n\nStops the watch. Idempotent."},
        {"__enter__", (PyCFunction)watch_enter, METH_NOARGS, NULL},
        {"__exit__", (PyCFunction)watch_exit, METH_VARARGS, NULL},
        {NULL, NULL, 0, NULL},
};

static PyGetSetDef watch_getset[] = {
        {"prefix", (getter)get_prefix, NULL, NULL, NULL},
        {"id", (getter)get_id, NULL, NULL, NULL},
        {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends with its own comma: clang-format would join the next line */
/* clang-format off */
PyTypeObject DlxPy_WatchType = {
        PyVarObject_HEAD_INIT(NULL, 0)
        .tp_name = "dlx.Watch",
        /* clang-format on */
        .tp_basicsize = sizeof(Watch),
        .tp_dealloc = (destructor)watch_dealloc,
        .tp_flags = Py_TPFLAGS_DEFAULT,
        .tp_doc = "Events of names under a prefix (Client.watch): iterate, or call next().",
        .tp_iter = PyObject_SelfIter,
        .tp_iternext = (iternextfunc)watch_iternext,
        .tp_methods = watch_methods,
        .tp_getset = watch_getset,
};

int dlxpy_watch_init(PyObject *module)
{
        if (PyStructSequence_InitType2(&event_type, &event_desc) < 0 ||
            PyStructSequence_InitType2(&info_type, &info_desc) < 0 ||
            PyType_Ready(&DlxPy_WatchType) < 0)
                return -1;
        if (PyModule_AddObjectRef(module, "Event", (PyObject *)&event_type) < 0 ||
            PyModule_AddObjectRef(module, "Info", (PyObject *)&info_type) < 0 ||
            PyModule_AddObjectRef(module, "Watch", (PyObject *)&DlxPy_WatchType) < 0)
                return -1;
        return 0;
}
