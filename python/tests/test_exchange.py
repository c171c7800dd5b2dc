# SPDX-License-Identifier: MIT
"""dlx.Tensor's DLPack exchange-API table, called slot by slot as a C consumer would (ctypes)."""
import ctypes
import gc

import numpy as np
import pytest

import dlx
from conftest import settle


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
MT_PP = ctypes.POINTER(ctypes.POINTER(DLManagedTensorVersioned))
# PYFUNCTYPE: the slots raise Python exceptions, so they are called with the GIL held
ALLOCATOR = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), MT_PP, ctypes.c_void_p,
                              SET_ERROR)
FROM_OBJECT = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, MT_PP)
TO_OBJECT = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLManagedTensorVersioned),
                              ctypes.POINTER(ctypes.c_void_p))
VIEW = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
STREAM = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32,
                           ctypes.POINTER(ctypes.c_void_p))


class Table(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("prev_api", ctypes.c_void_p), ("allocator", ALLOCATOR),
                ("from_object", FROM_OBJECT), ("to_object", TO_OBJECT), ("view", VIEW),
                ("stream", STREAM)]


@pytest.fixture(scope="module")
def table():
    return Table.from_address(dlx.Tensor.__c_dlpack_exchange_api__)


def steal(address):
    """The object behind a new reference the C side handed us, taking that reference over."""
    obj = ctypes.cast(address, ctypes.py_object).value
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(obj))
    return obj


def test_header(table):
    assert (table.major, table.minor, table.prev_api) == (1, 3, None)


def test_from_object_and_back(table, client, name):
    client.publish(name, np.arange(6, dtype=np.int32).reshape(2, 3))
    with client.acquire(name) as t:
        out = ctypes.POINTER(DLManagedTensorVersioned)()
        assert table.from_object(t, ctypes.byref(out)) == 0
    mt = out.contents
    assert (mt.major, mt.minor) == (1, 3)
    assert mt.flags & 1  # READ_ONLY
    d = mt.dl_tensor
    assert (d.ndim, d.shape[0], d.shape[1], d.dtype.code, d.dtype.bits) == (2, 2, 3, 0, 32)
    # the export holds the lease although the dlx.Tensor is closed
    assert settle(client, name, 1) == 1
    # give it back: a new dlx.Tensor owns it now
    obj = ctypes.c_void_p()
    assert table.to_object(out, ctypes.byref(obj)) == 0
    back = steal(obj.value)
    assert type(back) is dlx.Tensor and back.read_only
    np.testing.assert_array_equal(np.from_dlpack(back), [[0, 1, 2], [3, 4, 5]])
    del back
    gc.collect()
    assert settle(client, name, 0) == 0


def test_read_only_comes_back_through_a_consumer_that_drops_flags(table, client, name):
    """A consumer hands our export back as its own tensor with flags 0 (tvm-ffi does)."""
    client.publish(name, np.arange(4, dtype=np.float32))
    with client.acquire(name) as t:
        inner = ctypes.POINTER(DLManagedTensorVersioned)()
        assert table.from_object(t, ctypes.byref(inner)) == 0
    assert inner.contents.flags & 1
    # the consumer's tensor: the same view, no flags, its deleter runs the inner one's
    outer = DLManagedTensorVersioned(major=1, minor=3, flags=0,
                                     dl_tensor=inner.contents.dl_tensor)
    ran = []

    @DELETER
    def deleter(_):
        ran.append(True)
        inner.contents.deleter(inner)

    outer.deleter = deleter
    obj = ctypes.c_void_p()
    assert table.to_object(ctypes.pointer(outer), ctypes.byref(obj)) == 0
    back = steal(obj.value)
    assert back.read_only
    view = np.from_dlpack(back)
    assert not view.flags.writeable
    np.testing.assert_array_equal(view, np.arange(4, dtype=np.float32))
    del view, back
    gc.collect()
    assert ran == [True]
    assert settle(client, name, 0) == 0


def test_view_of_a_tensor(table, client, name):
    client.publish(name, np.arange(4.0))
    with client.acquire(name) as t:
        view = DLTensor()
        assert table.view(t, ctypes.byref(view)) == 0
        assert view.data + view.byte_offset == t.data_ptr
        assert (view.ndim, view.shape[0], view.device.device_type) == (1, 4, 1)
    with pytest.raises(BufferError):
        table.view(t, ctypes.byref(view))  # closed
    with pytest.raises(TypeError):
        table.from_object(np.zeros(1), ctypes.byref(ctypes.POINTER(DLManagedTensorVersioned)()))


def test_allocator_and_stream(table, client, name):
    errors = []
    set_error = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    shape = (ctypes.c_int64 * 2)(3, 4)
    proto = DLTensor(device=DLDevice(1, 0), ndim=2, dtype=DLDataType(2, 32, 1), shape=shape)
    out = ctypes.POINTER(DLManagedTensorVersioned)()
    # libdlx's allocator: dlx_alloc on the oldest client open in this process
    assert table.allocator(ctypes.byref(proto), ctypes.byref(out), None, set_error) == 0, errors
    obj = ctypes.c_void_p()
    assert table.to_object(out, ctypes.byref(obj)) == 0
    t = steal(obj.value)
    assert (t.shape, t.dtype, t.read_only) == ((3, 4), "float32", False)
    np.from_dlpack(t)[:] = 2.0
    client.publish(name, t)
    with client.acquire(name) as r:
        assert float(np.from_dlpack(r).sum()) == 24.0
    stream = ctypes.c_void_p(1)
    assert table.stream(1, 0, ctypes.byref(stream)) == 0 and stream.value is None
    # a bad prototype: the error comes through SetError
    proto.ndim = -1
    assert table.allocator(ctypes.byref(proto), ctypes.byref(out), None, set_error) != 0
    assert errors and errors[0][0] == b"ValueError"
