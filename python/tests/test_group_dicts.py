# SPDX-License-Identifier: MIT
"""A second reader's tests of Client.publish_dict / acquire_dict (README "Python").

The promises: a torch state_dict, a dict of numpy arrays or any DLPack objects
go out as one group version, copied once; acquire_dict gives name -> dlx.Tensor,
zero-copy and read-only, usable by torch.from_dlpack and
load_state_dict(assign=True); tied tensors stay tied; bad input raises the
documented exception and publishes nothing; members outlive the client; a
reader never sees two versions mixed.
"""
import ctypes
import gc
import json
import struct
import subprocess

import numpy as np
import pytest

import dlx
from conftest import python_child, settle

torch = pytest.importorskip("torch")


def nothing_published(client, name):
    with pytest.raises(dlx.NotFound):
        client.stat(name)


def raw_bytes(t):
    """A tensor's elements, row-major, as bytes (any dtype, any strides)."""
    t = t.contiguous()
    return bytes(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


# ---- what goes in comes out ------------------------------------------------------------------


def test_torch_kinds_round_trip(client, name):
    base = torch.arange(24, dtype=torch.float32)
    sd = {
        "empty": torch.empty(0),
        "empty2d": torch.empty(3, 0, dtype=torch.float64),
        "scalar": torch.tensor(3.5),
        "bf16": torch.randn(4, 5).to(torch.bfloat16),
        "bool": torch.tensor([True, False, True, True]),
        "f8e4m3": torch.randn(7).to(torch.float8_e4m3fn),
        "f8e5m2": torch.randn(7).to(torch.float8_e5m2),
        "i8": torch.arange(-5, 5, dtype=torch.int8),
        "u16": torch.arange(9, dtype=torch.int32).to(torch.uint16),
        "c64": torch.tensor([1 + 2j, -3.5 - 0.25j], dtype=torch.complex64),
        "transposed": base.reshape(4, 6).t(),
        "sliced": base[3:21:3],
        "expanded": base[:3].expand(5, 3),
    }
    v = client.publish_dict(name, sd)
    got = client.acquire_dict(name)
    assert sorted(got) == sorted(sd)
    for k, want in sd.items():
        t = torch.from_dlpack(got[k])
        assert t.dtype == want.dtype, k
        assert t.shape == want.shape, k
        assert raw_bytes(t) == raw_bytes(want), k
        assert got[k].version == v and got[k].name == k and got[k].read_only
    # strides are kept, not just values
    assert torch.from_dlpack(got["transposed"]).stride() == sd["transposed"].stride()
    assert torch.from_dlpack(got["expanded"]).stride() == (0, 1)


def test_numpy_negative_strides_round_trip(client, name):
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    d = {"flipped": a[::-1, ::-2], "col": a[:, 2], "plain": a}
    client.publish_dict(name, d)
    got = client.acquire_dict(name)
    for k, v in d.items():
        x = np.from_dlpack(got[k])
        assert x.strides == v.strides and np.array_equal(x, v), k


def test_big_members(client, name):
    n = (64 << 20) + 3
    big = torch.randint(0, 255, (n,), dtype=torch.uint8)
    wide = torch.randn(1024, 2049, dtype=torch.float64)[:, 1:]  # 16 MiB, strided rows
    client.publish_dict(name, {"big": big, "wide": wide, "tiny": torch.ones(1)})
    got = client.acquire_dict(name)
    assert torch.equal(torch.from_dlpack(got["big"]), big)
    assert torch.equal(torch.from_dlpack(got["wide"]), wide)
    assert client.stat(name).members == 3


def test_tied_and_overlapping_views_stay_shared(client, name):
    base = torch.arange(16, dtype=torch.float32)
    emb = torch.randn(10, 4)
    sd = {
        "embed.weight": emb,
        "lm_head.weight": emb,  # tied: the same tensor twice
        "row": emb[3],
        "a": base[0:10],
        "b": base[6:16],  # overlaps a
        "c": base.view(torch.int32)[2:5],  # another dtype over the same bytes
        "alone": torch.zeros(3),
    }
    client.publish_dict(name, sd)
    got = client.acquire_dict(name)
    t = {k: torch.from_dlpack(v) for k, v in got.items()}
    for k in sd:
        assert raw_bytes(t[k]) == raw_bytes(sd[k]), k
    assert t["embed.weight"].data_ptr() == t["lm_head.weight"].data_ptr()
    assert t["row"].data_ptr() - t["embed.weight"].data_ptr() == 3 * 4 * 4
    assert t["b"].data_ptr() - t["a"].data_ptr() == 6 * 4
    assert t["c"].data_ptr() - t["a"].data_ptr() == 2 * 4
    # the dlx.Tensor attributes say the same
    assert got["embed.weight"].data_ptr == got["lm_head.weight"].data_ptr


def test_load_state_dict_assign_is_zero_copy_and_keeps_ties(client, name):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(11, 6)
            self.proj = torch.nn.Linear(6, 6)
            self.head = torch.nn.Linear(6, 11, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, x):
            return self.head(torch.relu(self.proj(self.embed(x))))

    src = Tied()
    sd = src.state_dict()
    assert sd["embed.weight"].data_ptr() == sd["head.weight"].data_ptr()
    client.publish_dict(name, sd)
    got = client.acquire_dict(name)
    dst = Tied()
    dst.load_state_dict({k: torch.from_dlpack(t) for k, t in got.items()}, assign=True)
    for k, t in dst.state_dict().items():
        assert t.data_ptr() == got[k].data_ptr, f"{k} was copied"
        assert torch.equal(t, sd[k])
    assert dst.embed.weight.data_ptr() == dst.head.weight.data_ptr()
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(src(x), dst(x))


def test_copied_once_at_publish(client, name):
    """publish_dict copies: later writes to the sources (alloc() memory too) are not seen."""
    shared = client.alloc((4,), "float32")
    a = torch.from_dlpack(shared)
    a[:] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    n = np.arange(3, dtype=np.int64)
    client.publish_dict(name, {"shared": shared, "np": n, "torch": a[1:3]})
    a[:] = 9
    n[:] = -1
    got = client.acquire_dict(name)
    assert np.from_dlpack(got["shared"]).tolist() == [1, 2, 3, 4]
    assert np.from_dlpack(got["np"]).tolist() == [0, 1, 2]
    assert np.from_dlpack(got["torch"]).tolist() == [2, 3]


# ---- bad input: the documented exception, and nothing published -----------------------------

BAD_KEYS = [
    (1, TypeError),
    (b"bytes", TypeError),
    (None, TypeError),
    ("", ValueError),
    (".", ValueError),
    ("..", ValueError),
    ("a/../b", ValueError),
    ("a//b", ValueError),
    ("/a", ValueError),
    ("a/", ValueError),
    ("a" * 256, ValueError),
    ("\u00e9" * 128, ValueError),  # 256 bytes of UTF-8
    ("a\x00b", ValueError),
    ("a\nb", ValueError),
    ("\ud800", UnicodeEncodeError),
]


@pytest.mark.parametrize("key,exc", BAD_KEYS, ids=[f"key{i}" for i in range(len(BAD_KEYS))])
def test_bad_keys_publish_nothing(client, name, key, exc):
    first = torch.arange(4.0)
    with pytest.raises(exc):
        client.publish_dict(name, {"good": first, key: torch.zeros(2), "later": np.ones(2)})
    nothing_published(client, name)
    # over an existing version: it stays
    client.publish_dict(name, {"good": torch.ones(2)})
    with pytest.raises(exc):
        client.publish_dict(name, {"good": first, key: torch.zeros(2)})
    assert client.stat(name).version == 1
    assert np.from_dlpack(client.acquire_dict(name)["good"]).tolist() == [1, 1]
    assert first.tolist() == [0, 1, 2, 3]  # the taken tensor was given back intact


def test_longest_key_is_fine(client, name):
    key = "a" * 255
    client.publish_dict(name, {key: np.arange(2)})
    assert list(client.acquire_dict(name)) == [key]


BAD_VALUES = [
    (None, TypeError),
    ([1, 2, 3], TypeError),
    (3, TypeError),
    ("tensor", TypeError),
    (object(), TypeError),
    (np.zeros(2, dtype=">f4"), BufferError),
    (np.array(["a"]), TypeError),
    (np.zeros(2, dtype="datetime64[ns]"), TypeError),
]


@pytest.mark.parametrize("value,exc", BAD_VALUES, ids=[type(v).__name__ + str(i)
                                                      for i, (v, _) in enumerate(BAD_VALUES)])
def test_bad_values_publish_nothing(client, name, value, exc):
    t = torch.arange(6.0)
    with pytest.raises(exc):
        client.publish_dict(name, {"a": t, "bad": value, "z": np.ones(3)})
    nothing_published(client, name)
    assert t.tolist() == list(range(6))


def test_empty_dict_and_bad_group_names(client, name):
    with pytest.raises(dlx.InvalidArgument):
        client.publish_dict(name, {})
    nothing_published(client, name)
    before = [i.name for i in client.list("")]
    for bad in ["", "a//b", "..", "x" * 256]:
        with pytest.raises(ValueError):
            client.publish_dict(bad, {"a": np.ones(1)})
    assert [i.name for i in client.list("")] == before


# A DLPack capsule made by hand, for a device tensor without a GPU.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]


class FakeCapsule:
    """A legacy 'dltensor' capsule over a numpy float32 array, on any device type."""

    def __init__(self, arr, device_type):
        self.deleted = 0
        self.arr = arr
        self.shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
        self.mt = _DLManagedTensor()
        self.mt.dl_tensor.data = arr.ctypes.data
        self.mt.dl_tensor.device = _DLDevice(device_type, 0)
        self.mt.dl_tensor.ndim = arr.ndim
        self.mt.dl_tensor.dtype = _DLDataType(2, 32, 1)
        self.mt.dl_tensor.shape = self.shape

        def deleter(_):
            self.deleted += 1

        self.deleter = _DELETER(deleter)
        self.mt.deleter = self.deleter
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.capsule = new(ctypes.addressof(self.mt), b"dltensor", None)


@pytest.mark.parametrize("device_type", [2, 3, 4], ids=["cuda", "cuda_host", "opencl"])
def test_mixed_devices_publish_nothing(client, name, device_type):
    fake = FakeCapsule(np.arange(4, dtype=np.float32), device_type)
    with pytest.raises(dlx.NotSupported):
        client.publish_dict(name, {"cpu": torch.ones(3), "dev": fake.capsule})
    nothing_published(client, name)
    assert fake.deleted == 1
    # the same capsule machinery on the CPU is fine
    ok = FakeCapsule(np.arange(4, dtype=np.float32), 1)
    client.publish_dict(name, {"cpu": ok.capsule})
    assert ok.deleted == 1
    assert np.from_dlpack(client.acquire_dict(name)["cpu"]).tolist() == [0, 1, 2, 3]


def test_kinds_raise_documented_types(client, name):
    client.publish(name, np.zeros(2))
    with pytest.raises(dlx.NotGroup) as e:
        client.acquire_dict(name)
    assert isinstance(e.value, dlx.Error)
    client.publish_dict(name, {"a": np.zeros(2)})
    with pytest.raises(dlx.IsGroup) as e:
        client.acquire(name)
    assert isinstance(e.value, dlx.Error)
    with pytest.raises(dlx.NotFound):
        client.acquire_dict(name + "/none", timeout=0)
    with pytest.raises(dlx.NotFound):
        client.acquire_dict(name, ["a", "missing"])
    with pytest.raises(dlx.Timeout):
        client.acquire_dict(name, min_version=5, timeout=0.2)


# ---- lifetimes -------------------------------------------------------------------------------


def test_members_outlive_the_client(daemon, client, name):
    other = dlx.Client(daemon.socket, name="short-lived")
    other.publish_dict(name, {"w": torch.arange(8.0), "b": torch.full((3,), 7.0)}, persist=True)
    got = other.acquire_dict(name)
    w = torch.from_dlpack(got["w"])
    other.close()
    b = got["b"]
    del got, other
    gc.collect()
    assert settle(client, name, 1) == 1  # still leased: by w's and b's views
    assert w.tolist() == list(range(8))
    assert np.from_dlpack(b).tolist() == [7, 7, 7]
    del b
    gc.collect()
    assert w.sum().item() == 28
    del w
    gc.collect()
    assert settle(client, name, 0) == 0


def test_non_persistent_group_goes_with_its_client(daemon, client, name):
    other = dlx.Client(daemon.socket, name="owner")
    other.publish_dict(name, {"x": np.arange(3.0)})
    held = client.acquire_dict(name)
    other.close()
    nothing_published(client, name)
    assert np.from_dlpack(held["x"]).tolist() == [0, 1, 2]  # the lease keeps the bytes


def test_held_version_is_never_written(client, name):
    client.publish_dict(name, {"x": torch.full((4096,), 1.0), "y": torch.full((7,), 1.0)})
    held = client.acquire_dict(name)
    x = torch.from_dlpack(held["x"])
    for v in range(2, 40):
        client.publish_dict(name, {"x": torch.full((4096,), float(v)),
                                   "y": torch.full((7,), float(v))})
    assert held["x"].version == 1
    assert torch.all(x == 1.0)
    assert torch.all(torch.from_dlpack(held["y"]) == 1.0)
    assert client.acquire_dict(name)["x"].version == 39


# ---- atomicity against a writer in another process --------------------------------------------

WRITER = """
    import sys, dlx, torch
    name, n = sys.argv[1], int(sys.argv[2])
    with dlx.Client() as c:
        for v in range(1, n + 1):
            emb = torch.full((64, 256), float(v))
            sd = {f"layers.{i}.weight": torch.full((128, 128), float(v)) for i in range(6)}
            sd["embed.weight"] = emb
            sd["head.weight"] = emb          # tied
            sd["layers.0.bias"] = emb[0]     # a view of it
            sd["step"] = torch.tensor(v, dtype=torch.int64)
            c.publish_dict(name, sd, persist=True)
    print("done")
"""


def test_reader_never_sees_mixed_versions(client, name, daemon):
    n = 150
    p = python_child(WRITER, daemon.socket, name, n)
    seen, last = set(), 0
    subset = ["step", "layers.5.weight", "layers.0.weight"]
    try:
        while last < n:
            members = subset if len(seen) % 2 else None
            got = client.acquire_dict(name, members, timeout=30, min_version=last + 1)
            versions = {t.version for t in got.values()}
            assert len(versions) == 1, versions
            (version,) = versions
            step = int(np.from_dlpack(got["step"]))
            assert step == version, (step, version)
            for k, t in got.items():
                a = torch.from_dlpack(t)
                assert torch.all(a == step), f"{k} of version {version} holds other values"
            if members is None:
                assert got["embed.weight"].data_ptr == got["head.weight"].data_ptr
                assert got["layers.0.bias"].data_ptr == got["embed.weight"].data_ptr
            else:
                assert list(got) == subset
            assert version > last
            last = version
            seen.add(version)
            del got
    finally:
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert last == n


# ---- dlxctl reads what Python wrote ----------------------------------------------------------


def test_dlxctl_gets_a_python_group(client, name, dlxctl, daemon, tmp_path):
    if dlxctl is None:
        pytest.skip("no dlxctl beside dlxd")
    buf = np.arange(24, dtype=np.float32)
    d = {
        "t": buf.reshape(4, 6).T,
        "rev": buf[::-1],
        "grid": buf.reshape(4, 6)[::-2, 1::3],
        "bcast": np.broadcast_to(buf[:3], (2, 3)),
        "b": np.array([True, False]),
        "s": np.array(7, dtype=np.int16),
        "e": np.zeros((0, 3)),
    }
    client.publish_dict(name, d, persist=True)
    npz = tmp_path / "g.npz"
    r = subprocess.run([dlxctl, "--socket", daemon.socket, "get", name, str(npz)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = dict(np.load(npz))
    assert sorted(got) == sorted(d)
    for k, v in d.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and np.array_equal(got[k], v), k

    bf = {"w": torch.randn(3, 5).to(torch.bfloat16).t(), "q": torch.randn(4).to(torch.float8_e4m3fn)}
    client.publish_dict(name + "/bf", bf, persist=True)
    st = tmp_path / "g.safetensors"
    r = subprocess.run([dlxctl, "--socket", daemon.socket, "get", name + "/bf", str(st)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    raw = st.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    data = raw[8 + hlen:]
    assert header["w"]["dtype"] == "BF16" and header["w"]["shape"] == [5, 3]
    assert header["q"]["dtype"] == "F8_E4M3"
    for k in bf:
        b, e = header[k]["data_offsets"]
        assert data[b:e] == raw_bytes(bf[k]), k
