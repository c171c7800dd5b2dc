# SPDX-License-Identifier: MIT
"""PyTorch (CPU) both ways; CUDA variants skip without a GPU."""
import ctypes
import gc

import numpy as np
import pytest

import dlx
from conftest import settle

torch = pytest.importorskip("torch")

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128, torch.uint16, torch.uint32, torch.uint64]
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
              "float8_e8m0fnu"):
    if hasattr(torch, _name):
        DTYPES.append(getattr(torch, _name))


def sample(dtype, shape=(4, 6)):
    n = shape[0] * shape[1]
    if dtype == torch.bool:
        return (torch.arange(n) % 3 == 0).reshape(shape)
    if dtype.is_complex:
        return torch.complex(torch.arange(n, dtype=torch.float64),
                             -torch.arange(n, dtype=torch.float64)).to(dtype).reshape(shape)
    return (torch.arange(n) % 50).to(dtype).reshape(shape)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.is_floating_point and a.element_size() == 1:
        # float8: compare the bits
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_dtypes_roundtrip(client, name, dtype):
    a = sample(dtype)
    client.publish(name, a)
    with client.acquire(name) as t:
        assert t.dtype == str(dtype).removeprefix("torch.")
        same(torch.from_dlpack(t), a)


@pytest.mark.parametrize("view", ["t", "slice", "step", "expand", "zero_d", "empty", "channels_last"])
def test_torch_layouts(client, name, view):
    base = torch.arange(120, dtype=torch.float32).reshape(2, 3, 4, 5)
    a = {
        "t": base[0, 0].t(),
        "slice": base[1, 1:, 2:],
        "step": base[:, ::2, ::3],
        "expand": torch.arange(5.0).expand(3, 5),
        "zero_d": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "channels_last": base.contiguous(memory_format=torch.channels_last),
    }[view]
    client.publish(name, a)
    with client.acquire(name) as t:
        b = torch.from_dlpack(t)
        same(b, a)
        if a.numel() > 1:
            assert b.stride() == a.stride()
        del b


def test_torch_fast_path_is_the_exchange_api(client, name):
    """publish() uses torch's __dlpack_c_exchange_api__, never __dlpack__."""
    assert type(torch.Tensor.__dlpack_c_exchange_api__).__name__ == "PyCapsule"

    class NoDunder(torch.Tensor):
        def __dlpack__(self, *args, **kwargs):
            raise AssertionError("__dlpack__ was called")

    a = torch.arange(6, dtype=torch.int32)
    client.publish(name, torch.Tensor._make_subclass(NoDunder, a))
    with client.acquire(name) as t:
        same(torch.from_dlpack(t), a)


def test_dlpack_1_2_integer_attribute(client, name):
    """A producer type that only has DLPack 1.2's __c_dlpack_exchange_api__ (an int)."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get(torch.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api")

    class Old(torch.Tensor):
        __dlpack_c_exchange_api__ = None  # hide 1.3's capsule
        __c_dlpack_exchange_api__ = address

        def __dlpack__(self, *args, **kwargs):
            raise AssertionError("__dlpack__ was called")

    a = torch.arange(4, dtype=torch.float64)
    client.publish(name, torch.Tensor._make_subclass(Old, a))
    with client.acquire(name) as t:
        same(torch.from_dlpack(t), a)


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_what_torch_cannot_export_names_publish_and_the_tensor(client, name):
    # torch's exchange API raises for a sparse tensor (it has no strided storage)
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
    with pytest.raises(RuntimeError) as e:
        client.publish(name, sparse)
    assert str(e.value).startswith(f"publish '{name}': torch.Tensor cannot be exported "
                                   "through DLPack: ")
    # the first line of torch's message; all of it, C++ backtrace too, in the cause
    assert "\n" not in str(e.value)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert str(e.value.__cause__).splitlines()[0] in str(e.value)
    with pytest.raises(dlx.NotFound):
        client.stat(name)


def test_views_outlive_the_dlx_tensor(client, name):
    client.publish(name, torch.arange(100, dtype=torch.float32))
    t = client.acquire(name)
    x = torch.from_dlpack(t)
    view = x[10:20].view(2, 5)
    del t, x
    gc.collect()
    # the dlx.Tensor and the first torch tensor are gone; the view holds the lease
    assert settle(client, name, 1) == 1
    assert view.sum().item() == sum(range(10, 20))
    client.unpublish(name)  # removed from the namespace, still mapped for the view
    assert view[1, 4].item() == 19.0
    del view
    gc.collect()
    client.ping()


def test_torch_view_of_the_lease_after_gc(client, name):
    client.publish(name, torch.ones(3, 3))
    view = torch.from_dlpack(client.acquire(name))  # the dlx.Tensor is a temporary
    gc.collect()
    assert settle(client, name, 1) == 1
    assert view.sum().item() == 9.0
    del view
    gc.collect()
    assert settle(client, name, 0) == 0


def test_alloc_with_torch_dtype_and_zero_copy_publish(client, name):
    t = client.alloc((2, 8), torch.bfloat16)
    x = torch.from_dlpack(t)
    x.copy_(torch.arange(16, dtype=torch.bfloat16).reshape(2, 8))
    client.publish(name, t, copy="never")
    # a torch view of dlx memory is still dlx memory: zero-copy too
    client.publish(name + "/row", x[1], copy="never")
    with client.acquire(name + "/row") as r:
        same(torch.from_dlpack(r), torch.arange(8, 16, dtype=torch.bfloat16))


def test_publish_numpy_acquire_torch_and_back(client, name):
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    client.publish(name, a)
    with client.acquire(name) as t:
        x = torch.from_dlpack(t)
        client.publish(name + "/again", x.T)
    with client.acquire(name + "/again") as t:
        np.testing.assert_array_equal(np.from_dlpack(t), a.T)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@cuda
def test_cuda_roundtrip(client, name):
    a = torch.arange(1024, dtype=torch.float32, device="cuda")
    try:
        client.publish(name, a)
    except dlx.NotSupported as e:
        pytest.skip(f"libdlx without CUDA here: {e}")
    with client.acquire(name) as t:
        assert t.device == "cuda:0"
        assert t.storage == "cuda-ipc"
        b = torch.from_dlpack(t)
        assert torch.equal(b, a)


@cuda
def test_cuda_alloc(client, name):
    try:
        t = client.alloc(256, torch.float16, device="cuda:0")
    except dlx.NotSupported as e:
        pytest.skip(f"libdlx without CUDA here: {e}")
    torch.from_dlpack(t).fill_(2)
    client.publish(name, t, copy="never")
    with client.acquire(name) as r:
        assert r.storage == "cuda-vmm"
        assert torch.from_dlpack(r).sum().item() == 512


@cuda
def test_cuda_consumer_stream(client, name):
    """torch.from_dlpack on a side stream: __dlpack__(stream=) orders it after the producer."""
    a = torch.empty(1 << 24, dtype=torch.float32, device="cuda")
    side = torch.cuda.Stream()
    producer = torch.cuda.Stream()
    with torch.cuda.stream(producer):
        for k in range(32):  # a slow write, still queued when publish returns
            a.fill_(float(k))
        a.fill_(7.0)
        try:
            client.publish(name, a, stream=producer.cuda_stream)
        except dlx.NotSupported as e:
            pytest.skip(f"libdlx without CUDA here: {e}")
    with client.acquire(name) as t:
        with torch.cuda.stream(side):
            b = torch.from_dlpack(t)  # passes side's handle as __dlpack__(stream=)
            total = b.sum()
        side.synchronize()
        assert total.item() == 7.0 * (1 << 24)
        with pytest.raises(ValueError):
            t.__dlpack__(stream=0, max_version=(1, 3))
