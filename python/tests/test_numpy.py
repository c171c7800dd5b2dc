# SPDX-License-Identifier: MIT
"""numpy 2.x as producer and consumer, through __dlpack__ both ways."""
import ctypes
import gc
import re

import numpy as np
import pytest

import dlx
from conftest import settle

assert int(np.__version__.split(".")[0]) >= 2, "these tests are for numpy 2.x"

# every type code numpy has, and what DLPack calls it (None: numpy cannot export it)
NUMPY_DTYPES = {
    "?": "bool", "b": "int8", "h": "int16", "i": "int32", "l": "int64", "q": "int64",
    "n": "int64", "p": "int64", "B": "uint8", "H": "uint16", "I": "uint32", "L": "uint64",
    "Q": "uint64", "N": "uint64", "P": "uint64", "e": "float16", "f": "float32",
    "d": "float64", "F": "complex64", "D": "complex128",
    "g": None, "G": None, "S": None, "U": None, "V": None, "O": None, "M": None, "m": None,
    "T": None,
}


def test_the_table_covers_every_numpy_type_code():
    assert set(np.typecodes["All"]) <= set(NUMPY_DTYPES)


def sample(code, shape=(3, 5)):
    dt = np.dtype(code)
    n = int(np.prod(shape))
    if dt.kind == "b":
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dt.kind == "c":
        return (np.arange(n) + 1j * np.arange(n)[::-1]).astype(dt).reshape(shape)
    return (np.arange(n) % 100).astype(dt).reshape(shape)


@pytest.mark.parametrize("code", [c for c, v in NUMPY_DTYPES.items() if v])
def test_every_numpy_dtype_roundtrips(client, name, code):
    a = sample(code)
    client.publish(name, a)
    with client.acquire(name) as t:
        assert t.dtype == NUMPY_DTYPES[code]
        b = np.from_dlpack(t)
        assert b.dtype == a.dtype
        np.testing.assert_array_equal(b, a)
        del b


@pytest.mark.parametrize("code", [c for c, v in NUMPY_DTYPES.items() if not v])
def test_dtypes_dlpack_cannot_carry_are_refused_by_numpy(client, name, code):
    try:
        a = np.zeros(3, dtype=code)
    except TypeError:
        pytest.skip(f"numpy cannot make an array of {code!r} here")
    # a TypeError that says which publish and which dtype; numpy's own words in __cause__
    with pytest.raises(TypeError) as e:
        client.publish(name, a)
    assert str(e.value) == f"publish '{name}': numpy dtype {a.dtype} has no DLPack equivalent"
    assert isinstance(e.value.__cause__, BufferError)
    with pytest.raises(dlx.NotFound):
        client.stat(name)


@pytest.mark.parametrize("dtype", ["datetime64[ns]", "timedelta64[s]", "object", "<U3",
                                   "i4,f8"])
def test_the_message_names_the_tensor_and_the_dtype(client, name, dtype):
    with pytest.raises(TypeError) as e:
        client.publish(name, np.zeros(2, dtype=dtype))
    assert str(e.value) == (f"publish '{name}': numpy dtype {np.dtype(dtype)} has no DLPack "
                            "equivalent")
    assert isinstance(e.value.__cause__, BufferError) and "DLPack" in str(e.value.__cause__)


def test_non_native_byte_order_is_refused(client, name):
    with pytest.raises(BufferError) as e:
        client.publish(name, np.arange(4, dtype=">f4"))
    assert str(e.value).startswith(f"publish '{name}': numpy.ndarray cannot be exported "
                                   "through DLPack: ")
    assert isinstance(e.value.__cause__, BufferError)
    assert str(e.value.__cause__) in str(e.value)  # numpy's reason, "native byte order"


def test_strides_dlpack_cannot_express_are_refused(client, name):
    # a field of a packed record: its stride (6 bytes) is no whole number of int32s
    a = np.zeros(4, dtype=[("x", "<i4"), ("y", "<i2")])["x"]
    with pytest.raises(BufferError) as e:
        client.publish(name, a)
    assert f"publish '{name}': numpy.ndarray cannot be exported" in str(e.value)
    assert isinstance(e.value.__cause__, BufferError)
    with pytest.raises(dlx.NotFound):
        client.stat(name)


@pytest.mark.parametrize("view", ["transposed", "stepped", "reversed", "fortran", "column",
                                  "broadcast", "offset"])
def test_strided_arrays_keep_their_layout(client, name, view):
    base = np.arange(60, dtype=np.int32).reshape(6, 10)
    a = {
        "transposed": base.T,
        "stepped": base[::2, 1::3],
        "reversed": base[::-1],
        "fortran": np.asfortranarray(base),
        "column": base[:, 3],
        "broadcast": np.broadcast_to(np.arange(4, dtype=np.int32), (3, 4)),
        "offset": base[2:, 5:],
    }[view]
    client.publish(name, a)
    with client.acquire(name) as t:
        b = np.from_dlpack(t)
        np.testing.assert_array_equal(b, a)
        assert b.shape == a.shape
        # the element strides travel (compact when numpy's are)
        assert t.strides == tuple(s // a.itemsize for s in a.strides)
        del b


def test_zero_d_and_empty(client, name):
    client.publish(name + "/scalar", np.array(3.5, dtype=np.float64))
    client.publish(name + "/empty", np.zeros((0, 4), dtype=np.int8))
    with client.acquire(name + "/scalar") as t:
        assert (t.shape, t.strides, t.ndim) == ((), (), 0)
        b = np.from_dlpack(t)
        assert b.shape == () and b == 3.5
        del b
    with client.acquire(name + "/empty") as t:
        assert t.shape == (0, 4) and t.nbytes == 0
        assert np.from_dlpack(t).shape == (0, 4)


def test_read_only_by_default_writable_on_request(client, name, daemon):
    client.publish(name + "/ro", np.zeros(4))
    client.publish(name + "/rw", np.zeros(4), read_only=False)
    with client.acquire(name + "/ro") as t:
        b = np.from_dlpack(t)
        assert not b.flags.writeable
        del b
    with dlx.Client(daemon.socket) as other:
        with client.acquire(name + "/rw") as t, other.acquire(name + "/rw") as u:
            assert not t.read_only
            w = np.from_dlpack(t)
            assert w.flags.writeable
            w[:] = 7
            # the same pages: the other client sees the write
            np.testing.assert_array_equal(np.from_dlpack(u), 7)
            del w


def test_alloc_fill_publish_zero_copy(client, name):
    t = client.alloc((3, 4), np.float32)
    assert (t.shape, t.dtype, t.device, t.storage, t.name, t.version) == (
        (3, 4), "float32", "cpu", "memfd", None, None)
    assert not t.read_only
    assert t.data_ptr % 64 == 0
    a = np.from_dlpack(t)
    a[:] = np.arange(12).reshape(3, 4)
    assert client.publish(name, t, copy="never") == 1
    with client.acquire(name) as r:
        np.testing.assert_array_equal(np.from_dlpack(r), np.arange(12).reshape(3, 4))
        # zero-copy: a later write by the producer shows through
        a[0, 0] = 100
        assert np.from_dlpack(r)[0, 0] == 100


def test_alloc_dtype_spellings(client):
    for dtype, want in [("bfloat16", "bfloat16"), (np.dtype("int16"), "int16"),
                        (np.uint8, "uint8"), ("float8_e4m3fn", "float8_e4m3fn"),
                        ("float32x4", "float32x4"), ("bool", "bool")]:
        with client.alloc(2, dtype) as t:
            assert t.dtype == want
    with pytest.raises(ValueError):
        client.alloc(2, "float31")
    with pytest.raises(ValueError):
        client.alloc(2, "float32", device="tpu")


def test_copy_options(client, name):
    with pytest.raises(dlx.WouldCopy) as e:
        client.publish(name, np.zeros(3), copy="never")
    assert "copy" in str(e.value)
    t = client.alloc(3, "int64")
    np.from_dlpack(t)[:] = [1, 2, 3]
    client.publish(name, t, copy="always")
    np.from_dlpack(t)[:] = 0
    with client.acquire(name) as r:
        np.testing.assert_array_equal(np.from_dlpack(r), [1, 2, 3])
    for bad in ("sometimes", 3):
        with pytest.raises(ValueError):
            client.publish(name, t, copy=bad)
    assert client.publish(name, np.zeros(3), copy=None) == 2
    assert client.publish(name, np.zeros(3), copy=True) == 3


def capsule_name(cap):
    return re.search(r'capsule object "([^"]*)"', repr(cap)).group(1)


def test_dlpack_protocol_details(client, name):
    client.publish(name, np.arange(6, dtype=np.int16).reshape(2, 3))
    with client.acquire(name) as t:
        assert capsule_name(t.__dlpack__()) == "dltensor"
        assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
        assert capsule_name(t.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
        assert capsule_name(t.__dlpack__(max_version=(2, 0))) == "dltensor_versioned"
        assert capsule_name(t.__dlpack__(dl_device=(1, 0), copy=False,
                                         max_version=(1, 3))) == "dltensor_versioned"
        with pytest.raises(BufferError):
            t.__dlpack__(dl_device=(2, 0))
        with pytest.raises(TypeError):
            t.__dlpack__((1, 3))  # keyword-only
        # host memory needs no ordering: any stream a consumer names is accepted
        for stream in (None, -1, 0, 1, 2, 0x7F00DEAD):
            assert capsule_name(t.__dlpack__(stream=stream,
                                             max_version=(1, 3))) == "dltensor_versioned"
        # copy=True: a private, writable copy
        c = np.from_dlpack(t, copy=True)
        assert c.flags.writeable
        c[0, 0] = 99
        assert np.from_dlpack(t)[0, 0] == 0
        del c


def test_consumed_capsules_are_renamed(client, name):
    a = np.arange(3.0)
    cap = a.__dlpack__(max_version=(1, 3))
    client.publish(name, cap)
    assert capsule_name(cap) == "used_dltensor_versioned"
    with pytest.raises(TypeError, match=f"publish '{re.escape(name)}': .*used"):
        client.publish(name, cap)
    legacy = a.__dlpack__()
    client.publish(name, legacy)
    assert capsule_name(legacy) == "used_dltensor"
    with client.acquire(name) as t:
        np.testing.assert_array_equal(np.from_dlpack(t), a)


class LegacyProducer:
    """A pre-1.0 producer: its __dlpack__ knows no max_version."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)


def test_legacy_producer(client, name):
    a = np.arange(5, dtype=np.uint16)
    client.publish(name, LegacyProducer(a))
    with client.acquire(name) as t:
        np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_not_a_tensor(client, name):
    with pytest.raises(TypeError, match=f"publish '{re.escape(name)}': list .*DLPack"):
        client.publish(name, [1, 2, 3])


def test_views_keep_the_lease(client, name):
    client.publish(name, np.arange(1000.0))
    t = client.acquire(name)
    view = np.from_dlpack(t)[10:20]
    assert settle(client, name, 1) == 1
    del t
    gc.collect()
    # the dlx.Tensor is gone; the numpy view still holds the export, so the lease stays
    assert settle(client, name, 1) == 1
    np.testing.assert_array_equal(view, np.arange(10.0, 20.0))
    del view
    gc.collect()
    assert settle(client, name, 0) == 0


def test_close_with_exports_alive(client, name):
    client.publish(name, np.arange(8))
    t = client.acquire(name)
    a = np.from_dlpack(t)
    cap = t.__dlpack__(max_version=(1, 3))  # never consumed
    t.close()
    assert settle(client, name, 1) == 1
    np.testing.assert_array_equal(a, np.arange(8))
    del a
    assert settle(client, name, 1) == 1
    del cap  # an unconsumed capsule deletes its tensor
    assert settle(client, name, 0) == 0


def test_exchange_api_capsule_on_the_type():
    cap = dlx.Tensor.__dlpack_c_exchange_api__
    assert capsule_name(cap) == "dlpack_exchange_api"
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    addr = get(cap, b"dlpack_exchange_api")
    assert addr == dlx.Tensor.__c_dlpack_exchange_api__
    assert addr == get(dlx.exchange_api(), b"dlpack_exchange_api")
    major, minor = (ctypes.c_uint32 * 2).from_address(addr)
    assert (major, minor) == (1, 3)
