/* SPDX-License-Identifier: MIT */
/* dtype and device names: the library-neutral spelling dlx.Tensor reports and alloc() reads. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlxpy.h"

static const struct {
        const char *name;
        uint8_t code, bits;
} dtypes[] = {
        {"bool", kDLBool, 8},
        {"int8", kDLInt, 8},
        {"int16", kDLInt, 16},
        {"int32", kDLInt, 32},
        {"int64", kDLInt, 64},
        {"uint8", kDLUInt, 8},
        {"uint16", kDLUInt, 16},
        {"uint32", kDLUInt, 32},
        {"uint64", kDLUInt, 64},
        {"float16", kDLFloat, 16},
        {"float32", kDLFloat, 32},
        {"float64", kDLFloat, 64},
        {"bfloat16", kDLBfloat, 16},
        {"complex64", kDLComplex, 64},
        {"complex128", kDLComplex, 128},
        {"float8_e3m4", kDLFloat8_e3m4, 8},
        {"float8_e4m3", kDLFloat8_e4m3, 8},
        {"float8_e4m3b11fnuz", kDLFloat8_e4m3b11fnuz, 8},
        {"float8_e4m3fn", kDLFloat8_e4m3fn, 8},
        {"float8_e4m3fnuz", kDLFloat8_e4m3fnuz, 8},
        {"float8_e5m2", kDLFloat8_e5m2, 8},
        {"float8_e5m2fnuz", kDLFloat8_e5m2fnuz, 8},
        {"float8_e8m0fnu", kDLFloat8_e8m0fnu, 8},
        {"float6_e2m3fn", kDLFloat6_e2m3fn, 6},
        {"float6_e3m2fn", kDLFloat6_e3m2fn, 6},
        {"float4_e2m1fn", kDLFloat4_e2m1fn, 4},
};

#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

int dlxpy_dtype_parse(PyObject *obj, DLDataType *ret)
{
        const char *s;
        Py_ssize_t len;

        if (!PyUnicode_Check(obj)) {
                PyErr_Format(PyExc_TypeError, "dtype must be a str such as 'float32', not %s",
                             Py_TYPE(obj)->tp_name);
                return -1;
        }
        s = PyUnicode_AsUTF8AndSize(obj, &len);
        if (!s)
                return -1;
        for (size_t i = 0; i < NDTYPES; i++) {
                size_t n = strlen(dtypes[i].name);
                unsigned long lanes = 1;
                if ((size_t)len < n || strncmp(s, dtypes[i].name, n) != 0)
                        continue;
                if ((size_t)len > n) {
                        /* vector lanes: "float32x4" */
                        char *end;
                        if (s[n] != 'x' || s[n + 1] < '1' || s[n + 1] > '9')
                                continue;
                        errno = 0;
                        lanes = strtoul(s + n + 1, &end, 10);
                        if (*end || errno || lanes > UINT16_MAX)
                                continue;
                }
                ret->code = dtypes[i].code;
                ret->bits = dtypes[i].bits;
                ret->lanes = (uint16_t)lanes;
                return 0;
        }
        PyErr_Format(PyExc_ValueError, "unknown dtype '%s'", s);
        return -1;
}

PyObject *dlxpy_dtype_name(DLDataType d)
{
        for (size_t i = 0; i < NDTYPES; i++) {
                if (dtypes[i].code != d.code || dtypes[i].bits != d.bits)
                        continue;
                if (d.lanes == 1)
                        return PyUnicode_FromString(dtypes[i].name);
                return PyUnicode_FromFormat("%sx%u", dtypes[i].name, (unsigned)d.lanes);
        }
        return PyUnicode_FromFormat("dtype(code=%u, bits=%u, lanes=%u)", (unsigned)d.code,
                                    (unsigned)d.bits, (unsigned)d.lanes);
}

int dlxpy_device_parse(PyObject *obj, DLDevice *ret)
{
        if (PyTuple_Check(obj)) {
                int type, id;
                if (!PyArg_ParseTuple(obj, "ii;device must be (device_type, device_id)", &type,
                                      &id))
                        return -1;
                ret->device_type = (DLDeviceType)type;
                ret->device_id = id;
                return 0;
        }
        if (PyUnicode_Check(obj)) {
                const char *s = PyUnicode_AsUTF8(obj);
                char *end;
                long id = 0;
                if (!s)
                        return -1;
                if (strcmp(s, "cpu") == 0) {
                        ret->device_type = kDLCPU;
                        ret->device_id = 0;
                        return 0;
                }
                if (strcmp(s, "cuda_host") == 0 || strcmp(s, "cuda-host") == 0) {
                        ret->device_type = kDLCUDAHost;
                        ret->device_id = 0;
                        return 0;
                }
                if (strncmp(s, "cuda", 4) == 0 && (s[4] == 0 || s[4] == ':')) {
                        if (s[4] == ':') {
                                errno = 0;
                                id = strtol(s + 5, &end, 10);
                                if (end == s + 5 || *end || errno || id < 0 || id > INT32_MAX)
                                        goto bad;
                        }
                        ret->device_type = kDLCUDA;
                        ret->device_id = (int32_t)id;
                        return 0;
                }
        }
bad:
        PyErr_Format(PyExc_ValueError,
                     "device must be 'cpu', 'cuda', 'cuda:N', 'cuda_host' or "
                     "(device_type, device_id), not %R",
                     obj);
        return -1;
}

PyObject *dlxpy_device_name(DLDevice d)
{
        switch (d.device_type) {
        case kDLCPU:
                return PyUnicode_FromString("cpu");
        case kDLCUDA:
                return PyUnicode_FromFormat("cuda:%d", (int)d.device_id);
        case kDLCUDAHost:
                return PyUnicode_FromString("cuda_host");
        default:
                return PyUnicode_FromFormat("device(type=%d, id=%d)", (int)d.device_type,
                                            (int)d.device_id);
        }
}
