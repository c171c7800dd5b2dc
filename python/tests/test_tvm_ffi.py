# SPDX-License-Identifier: MIT
"""apache-tvm-ffi as an independent consumer of dlx.Tensor's DLPack exchange-API table."""
import gc

import numpy as np
import pytest

import dlx
from conftest import settle

tvm_ffi = pytest.importorskip("tvm_ffi")


def counts():
    return dlx._dlx._exchange_counts()


def test_tvm_ffi_function_reads_a_dlx_tensor_through_our_table(client, name):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    client.publish(name, a)
    seen = {}

    def body(x):
        # tvm-ffi hands the callback its own Tensor, made from our table's export
        seen["type"] = type(x).__name__
        seen["shape"] = tuple(x.shape)
        seen["sum"] = int(np.from_dlpack(x).sum())

    fn = tvm_ffi.convert(body)
    before = counts()
    with client.acquire(name) as t:
        fn(t)
    after = counts()
    assert seen == {"type": "Tensor", "shape": (3, 4), "sum": int(a.sum())}
    assert after["managed_tensor_from_py_object_no_sync"] > before[
        "managed_tensor_from_py_object_no_sync"]


def test_tvm_ffi_gives_back_dlx_tensors_through_our_table(client, name):
    client.publish(name, np.arange(5.0))
    echo = tvm_ffi.get_global_func("testing.echo")
    before = counts()
    with client.acquire(name) as t:
        r = echo(t)
    after = counts()
    # the result came back as our type, built by managed_tensor_to_py_object_no_sync
    assert type(r) is dlx.Tensor
    assert after["managed_tensor_to_py_object_no_sync"] > before[
        "managed_tensor_to_py_object_no_sync"]
    np.testing.assert_array_equal(np.from_dlpack(r), np.arange(5.0))
    # the lease lives on in r (the acquired tensor is closed)
    assert settle(client, name, 1) == 1
    del r
    gc.collect()
    assert settle(client, name, 0) == 0


def test_callback_receives_dlx_tensors(client, name):
    client.publish(name, np.full((2, 2), 3, dtype=np.uint8))
    got = []

    fn = tvm_ffi.convert_func(lambda x: got.append((type(x), x.shape, x.dtype)) or x,
                              tensor_cls=dlx.Tensor)
    with client.acquire(name) as t:
        out = fn(t)
    assert got == [(dlx.Tensor, (2, 2), "uint8")]
    assert type(out) is dlx.Tensor
    np.testing.assert_array_equal(np.from_dlpack(out), 3)


@pytest.mark.parametrize("producer", ["numpy", "torch"])
def test_tvm_ffi_receives_a_tensor_published_and_reacquired_through_dlx(client, name, producer):
    if producer == "torch":
        torch = pytest.importorskip("torch")
        src = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, 1:5]
        want = src.numpy()
    else:
        src = np.arange(24, dtype=np.float32).reshape(4, 6)[:, 1:5]
        want = src
    client.publish(name, src)
    with client.acquire(name) as t:
        x = tvm_ffi.from_dlpack(t)
        assert tuple(x.shape) == (4, 4)
        np.testing.assert_array_equal(np.from_dlpack(x), want)
        echo = tvm_ffi.get_global_func("testing.echo")
        np.testing.assert_array_equal(np.from_dlpack(echo(t)), want)
        del x


def test_publish_a_tvm_ffi_tensor(client, name):
    x = tvm_ffi.from_dlpack(np.arange(7, dtype=np.int64))
    client.publish(name, x)
    with client.acquire(name) as t:
        np.testing.assert_array_equal(np.from_dlpack(t), np.arange(7))
