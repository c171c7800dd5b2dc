/* SPDX-License-Identifier: MIT */
/* dlx._dlx: the module. */
#include "dlxpy.h"

static PyObject *exchange_api_capsule(PyObject *self, PyObject *unused)
{
        (void)self;
        (void)unused;
        return PyCapsule_New((void *)dlxpy_exchange_api(), DLXPY_CAPSULE_EXCHANGE_API, NULL);
}

static PyObject *strerror_(PyObject *self, PyObject *args)
{
        int err;

        (void)self;
        if (!PyArg_ParseTuple(args, "i:strerror", &err))
                return NULL;
        return PyUnicode_FromString(dlx_strerror(err));
}

static PyMethodDef module_methods[] = {
        {"exchange_api", exchange_api_capsule, METH_NOARGS,
         "exchange_api()\n--\n\nThe DLPackExchangeAPI table dlx.Tensor's type carries, as a "
         "capsule\nnamed 'dlpack_exchange_api'."},
        {"strerror", strerror_, METH_VARARGS,
         "strerror(errno)\n--\n\nlibdlx's text for an errno value."},
        {"_exchange_counts", dlxpy_exchange_counts, METH_NOARGS,
         "_exchange_counts()\n--\n\nHow often each slot of dlx.Tensor's exchange-API table "
         "was called\n(for tests)."},
        {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
        PyModuleDef_HEAD_INIT,
        .m_name = "dlx._dlx",
        .m_doc = "The C extension behind the dlx package (libdlx, linked in).",
        .m_size = -1,
        .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__dlx(void);

PyMODINIT_FUNC PyInit__dlx(void)
{
        PyObject *m = PyModule_Create(&module_def);

        if (!m)
                return NULL;
        if (dlxpy_exchange_init() < 0 || dlxpy_errors_init(m) < 0 || dlxpy_tensor_init(m) < 0 ||
            dlxpy_client_init(m) < 0 || dlxpy_watch_init(m) < 0 || dlxpy_track_init(m) < 0 ||
            PyModule_AddStringConstant(m, "__version__", DLXPY_VERSION) < 0 ||
            PyModule_AddIntConstant(m, "DLPACK_MAJOR", DLX_DLPACK_MAJOR) < 0 ||
            PyModule_AddIntConstant(m, "DLPACK_MINOR", DLX_DLPACK_MINOR) < 0) {
                Py_DECREF(m);
                return NULL;
        }
        return m;
}
