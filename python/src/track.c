/* SPDX-License-Identifier: MIT */
/*
 * dlx.Track (Client.track): a name's current version, read from the client's
 * version page without a round trip (dlx_track_version), and waited for
 * (dlx_track_wait) in slices, so that Ctrl-C and close() get in.
 */
#include <errno.h>
#include <time.h>

#include "dlxpy.h"

typedef struct {
        PyObject_HEAD
        DlxPy_Client *client;
        uint32_t id;
        PyObject *name;
        bool closed;
} Track;

PyObject *dlxpy_track_new(DlxPy_Client *client, uint32_t id, PyObject *name)
{
        Track *t = PyObject_New(Track, &DlxPy_TrackType);

        if (!t)
                return NULL;
        t->client = (DlxPy_Client *)Py_NewRef((PyObject *)client);
        t->id = id;
        t->name = Py_NewRef(name);
        t->closed = false;
        return (PyObject *)t;
}

/* 0, or -1 raised: the track, or its client, is closed. */
static int usable(Track *t)
{
        if (t->closed) {
                PyErr_SetString(PyExc_ValueError, "the dlx.Track is closed");
                return -1;
        }
        if (!t->client->c || t->client->closing) {
                PyErr_SetString(PyExc_ValueError, "the dlx.Client is closed");
                return -1;
        }
        return 0;
}

/* No system call and no GIL release: a load from the page. */
static PyObject *get_version(Track *t, void *unused)
{
        uint64_t v = 0;
        int err;

        (void)unused;
        if (usable(t) < 0)
                return NULL;
        err = dlx_track_version(t->client->c, t->id, &v);
        if (err < 0)
                return dlxpy_raise(err, dlx_last_error());
        return PyLong_FromUnsignedLongLong(v);
}

static int64_t now_ms(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static PyObject *track_wait(Track *t, PyObject *args, PyObject *kwargs)
{
        static char *kwlist[] = {"version", "timeout", NULL};
        PyObject *version = Py_None, *timeout = Py_None;
        DlxPy_Client *c = t->client;
        int64_t total, deadline = 0;
        uint64_t after = 0, seen = 0;
        struct dlxpy_err e = {0};

        if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O$O:wait", kwlist, &version, &timeout))
                return NULL;
        if (dlxpy_timeout_ms(timeout, -1, &total) < 0 || usable(t) < 0)
                return NULL;
        if (version == Py_None) {
                e.err = dlx_track_version(c->c, t->id, &after);
                if (e.err < 0)
                        return dlxpy_raise(e.err, dlx_last_error());
        } else {
                after = PyLong_AsUnsignedLongLong(version);
                if (PyErr_Occurred())
                        return NULL;
        }
        if (dlxpy_client_enter(c) < 0)
                return NULL;
        if (total > 0)
                deadline = now_ms() + total;
        for (;;) {
                int64_t left = total < 0 ? DLXPY_SLICE_MS : total == 0 ? 0 : deadline - now_ms();
                if (total > 0 && left <= 0)
                        break; /* e holds the last slice's -ETIMEDOUT */
                Py_BEGIN_ALLOW_THREADS;
                dlxpy_err_take(&e, dlx_track_wait(c->c, t->id, after,
                                                  left < DLXPY_SLICE_MS ? left : DLXPY_SLICE_MS,
                                                  &seen));
                Py_END_ALLOW_THREADS;
                if (e.err != -ETIMEDOUT)
                        break;
                if (PyErr_CheckSignals() < 0) {
                        dlxpy_client_leave(c);
                        return NULL;
                }
                if (c->closing || t->closed) {
                        dlxpy_client_leave(c);
                        PyErr_SetString(PyExc_ValueError, "closed while waited on");
                        return NULL;
                }
        }
        dlxpy_client_leave(c);
        if (e.err == -ETIMEDOUT || e.err == -EAGAIN)
                Py_RETURN_NONE;
        if (e.err < 0)
                return dlxpy_raise(e.err, e.msg);
        return PyLong_FromUnsignedLongLong(seen);
}

static int track_stop(Track *t)
{
        DlxPy_Client *c = t->client;
        struct dlxpy_err e = {0};

        if (t->closed)
                return 0;
        t->closed = true;
        /* a closed client has no tracks left to stop */
        if (!c->c || c->closing)
                return 0;
        c->inflight++;
        Py_BEGIN_ALLOW_THREADS;
        dlxpy_err_take(&e, dlx_untrack(c->c, t->id));
        Py_END_ALLOW_THREADS;
        dlxpy_client_leave(c);
        if (e.err < 0 && e.err != -EINVAL) {
                dlxpy_raise(e.err, e.msg);
                return -1;
        }
        return 0;
}

static PyObject *track_close(Track *t, PyObject *unused)
{
        (void)unused;
        if (track_stop(t) < 0)
                return NULL;
        Py_RETURN_NONE;
}

static PyObject *track_enter(Track *t, PyObject *unused)
{
        (void)unused;
        return Py_NewRef((PyObject *)t);
}

static PyObject *track_exit(Track *t, PyObject *args)
{
        (void)args;
        if (track_stop(t) < 0)
                return NULL;
        Py_RETURN_FALSE;
}

static void track_dealloc(Track *t)
{
        if (!t->closed) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                if (track_stop(t) < 0)
                        PyErr_WriteUnraisable((PyObject *)t);
                PyErr_Restore(type, value, tb);
        }
        Py_XDECREF(t->client);
        Py_XDECREF(t->name);
        PyObject_Free(t);
}

static PyObject *get_name(Track *t, void *unused)
{
        (void)unused;
        return Py_NewRef(t->name);
}

static PyMethodDef track_methods[] = {
        {"wait", (PyCFunction)(void (*)(void))track_wait, METH_VARARGS | METH_KEYWORDS,
         "wait(version=<the current one>, timeout=None)\n--\n\nWaits until the name's version "
         "is no longer version: returns the new one (0: unpublished), or None if timeout "
         "seconds passed first. Asleep on a futex; no message from the daemon."},
        {"close", (PyCFunction)track_close, METH_NOARGS,
         "close()\n--\n\nStops tracking. Idempotent."},
        {"__enter__", (PyCFunction)track_enter, METH_NOARGS, NULL},
        {"__exit__", (PyCFunction)track_exit, METH_VARARGS, NULL},
        {NULL, NULL, 0, NULL},
};

static PyGetSetDef track_getset[] = {
        {"version", (getter)get_version, NULL,
         "The name's current version, 0 when it has none; read from memory, no round trip.", NULL},
        {"name", (getter)get_name, NULL, NULL, NULL},
        {NULL, NULL, NULL, NULL, NULL},
};

/* PyVarObject_HEAD_INIT ends with its own comma: clang-format would join the next line */
/* clang-format off */
PyTypeObject DlxPy_TrackType = {
        PyVarObject_HEAD_INIT(NULL, 0)
        .tp_name = "dlx.Track",
        /* clang-format on */
        .tp_basicsize = sizeof(Track),
        .tp_dealloc = (destructor)track_dealloc,
        .tp_flags = Py_TPFLAGS_DEFAULT,
        .tp_doc = "A name's current version, kept current by the daemon (Client.track).",
        .tp_methods = track_methods,
        .tp_getset = track_getset,
};

int dlxpy_track_init(PyObject *module)
{
        if (PyType_Ready(&DlxPy_TrackType) < 0)
                return -1;
        return PyModule_AddObjectRef(module, "Track", (PyObject *)&DlxPy_TrackType);
}
