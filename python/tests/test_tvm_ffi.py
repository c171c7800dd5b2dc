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


def test_read_only_survives_a_tvm_ffi_function(client, name):
    # tvm-ffi keeps no DLPack flags: what its identity function gives back says nothing of
    # READ_ONLY, and the memory is a read-only mapping a write would die on
    client.publish(name, np.arange(6.0))
    echo = tvm_ffi.get_global_func("testing.echo")
    with client.acquire(name) as t:
        assert t.read_only and not np.from_dlpack(t).flags.writeable
        r = echo(t)
    assert type(r) is dlx.Tensor
    assert r.read_only
    view = np.from_dlpack(r)
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 1.0
    np.testing.assert_array_equal(view, np.arange(6.0))
    # and through tvm-ffi again, and a callback that is handed a dlx.Tensor
    assert echo(r).read_only
    seen = []
    fn = tvm_ffi.convert_func(lambda x: seen.append(x.read_only) or x, tensor_cls=dlx.Tensor)
    assert fn(r).read_only and seen == [True]
    del view, r
    gc.collect()


def test_writable_stays_writable_through_tvm_ffi(client, name):
    client.publish(name, np.zeros(4, dtype=np.int32), read_only=False)
    echo = tvm_ffi.get_global_func("testing.echo")
    with client.acquire(name) as t:
        r = echo(t)
    assert not r.read_only
    np.from_dlpack(r)[:] = 7
    with client.acquire(name) as t:
        np.testing.assert_array_equal(np.from_dlpack(t), 7)
    del r
    gc.collect()


def test_republishing_what_came_back_stays_read_only_unless_asked(client, name):
    client.publish(name, np.arange(3, dtype=np.int64))
    echo = tvm_ffi.get_global_func("testing.echo")
    with client.acquire(name) as t:
        r = echo(t)
    assert client.publish(name + "/again", r) == 1
    with client.acquire(name + "/again") as t:
        assert t.read_only and not np.from_dlpack(t).flags.writeable
    # asked: a writable copy for the consumers; the mapping r views stays read-only
    client.publish(name + "/rw", r, read_only=False)
    with client.acquire(name + "/rw") as t:
        assert not t.read_only
        np.from_dlpack(t)[:] = 5
    assert r.read_only
    np.testing.assert_array_equal(np.from_dlpack(r), np.arange(3))
    del r
    gc.collect()


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
