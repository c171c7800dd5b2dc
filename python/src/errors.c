/* SPDX-License-Identifier: MIT */
/*
 * dlx.Error and its subclasses. Every class is an OSError (errno and strerror
 * filled from libdlx's negative errno and dlx_last_error()), and the common
 * ones are also the matching builtin, so `except TimeoutError` works too.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dlxpy.h"

PyObject *DlxPy_Error;
static PyObject *not_found, *timeout, *permission, *disconnected, *invalid, *limit, *not_supported,
        *would_copy, *protocol, *is_group, *not_group;

static const struct {
        PyObject **slot;
        const char *name;
        PyObject **builtin; /* second base, or NULL */
        const char *doc;
} classes[] = {
        {&not_found, "dlx.NotFound", &PyExc_LookupError,
         "No such name, or not the version asked for (ENOENT)."},
        {&timeout, "dlx.Timeout", &PyExc_TimeoutError, "A wait ran out (ETIMEDOUT)."},
        {&permission, "dlx.PermissionDenied", &PyExc_PermissionError,
         "The name belongs to another user, or the daemon refused this peer (EACCES, EPERM)."},
        {&disconnected, "dlx.Disconnected", &PyExc_ConnectionError,
         "No daemon, or the connection to it was lost or shut down (ECONNREFUSED, "
         "ECONNRESET, EPIPE, ESHUTDOWN; ENOENT or ENOTDIR when connecting: no socket at "
         "that path): close the client and connect again."},
        {&invalid, "dlx.InvalidArgument", &PyExc_ValueError,
         "A bad name, dtype, shape or option (EINVAL, ENAMETOOLONG, EOVERFLOW)."},
        {&limit, "dlx.LimitExceeded", NULL,
         "A daemon limit was reached: clients, names, leases, watches (EAGAIN), "
         "shared bytes (ENOSPC) or a group's members or table (E2BIG)."},
        {&not_supported, "dlx.NotSupported", NULL,
         "A device, dtype or operation this build or machine cannot share (ENOTSUP, ENODEV, "
         "EPROTONOSUPPORT)."},
        {&would_copy, "dlx.WouldCopy", NULL,
         "copy='never' and the memory did not come from alloc() on this client (EXDEV)."},
        {&protocol, "dlx.ProtocolError", NULL, "The daemon sent something malformed (EPROTO)."},
        {&is_group, "dlx.IsGroup", &PyExc_IsADirectoryError,
         "A tensor was asked of a group's name: use acquire_dict() (EISDIR)."},
        {&not_group, "dlx.NotGroup", &PyExc_NotADirectoryError,
         "A group was asked of a tensor's name: use acquire() (ENOTDIR)."},
};

int dlxpy_errors_init(PyObject *module)
{
        DlxPy_Error = PyErr_NewExceptionWithDoc(
                "dlx.Error",
                "Base class of every dlx failure: an OSError whose errno is libdlx's and whose "
                "strerror is the daemon's (or libdlx's) own message.",
                PyExc_OSError, NULL);
        if (!DlxPy_Error || PyModule_AddObjectRef(module, "Error", DlxPy_Error) < 0)
                return -1;
        for (size_t i = 0; i < sizeof(classes) / sizeof(classes[0]); i++) {
                PyObject *bases = classes[i].builtin
                                          ? PyTuple_Pack(2, DlxPy_Error, *classes[i].builtin)
                                          : PyTuple_Pack(1, DlxPy_Error);
                if (!bases)
                        return -1;
                *classes[i].slot =
                        PyErr_NewExceptionWithDoc(classes[i].name, classes[i].doc, bases, NULL);
                Py_DECREF(bases);
                if (!*classes[i].slot ||
                    PyModule_AddObjectRef(module, strchr(classes[i].name, '.') + 1,
                                          *classes[i].slot) < 0)
                        return -1;
        }
        return 0;
}

static PyObject *class_for(int err)
{
        switch (err) {
        case ENOENT:
                return not_found;
        case ETIMEDOUT:
                return timeout;
        case EACCES:
        case EPERM:
                return permission;
        case ECONNREFUSED:
        case ECONNRESET:
        case EPIPE:
        case ESHUTDOWN:
        case ENOTCONN:
                return disconnected;
        case EINVAL:
        case ENAMETOOLONG:
        case EOVERFLOW:
                return invalid;
        case EAGAIN:
        case ENOSPC:
        case E2BIG:
                return limit;
        case EISDIR:
                return is_group;
        case ENOTDIR:
                return not_group;
        case ENOTSUP:
        case ENODEV:
        case EPROTONOSUPPORT:
                return not_supported;
        case EXDEV:
                return would_copy;
        case EPROTO:
                return protocol;
        default:
                return DlxPy_Error;
        }
}

static PyObject *raise_as(PyObject *cls, int e, const char *detail)
{
        PyObject *args;

        if (e == ENOMEM)
                return PyErr_NoMemory();
        if (!detail || !*detail)
                detail = dlx_strerror(-e);
        args = Py_BuildValue("(is)", e, detail);
        if (args) {
                PyErr_SetObject(cls, args);
                Py_DECREF(args);
        }
        return NULL;
}

PyObject *dlxpy_raise(int err, const char *detail)
{
        int e = err < 0 ? -err : err;

        return raise_as(class_for(e), e, detail);
}

PyObject *dlxpy_raise_connect(int err, const char *detail)
{
        int e = err < 0 ? -err : err;

        /* no socket at that path means no daemon, like a refused one: not a missing name */
        if (e == ENOENT || e == ENOTDIR)
                return raise_as(disconnected, e, detail);
        return raise_as(class_for(e), e, detail);
}

void dlxpy_err_take(struct dlxpy_err *e, int err)
{
        e->err = err;
        snprintf(e->msg, sizeof(e->msg), "%s", err < 0 ? dlx_last_error() : "");
}
