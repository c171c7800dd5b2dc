# SPDX-License-Identifier: MIT
"""Groups: a dict of tensors published and acquired as one version (publish_dict, acquire_dict)."""
import gc

import numpy as np
import pytest

import dlx
from conftest import python_child, settle


def state(version, n=8):
    return {f"layers.{i}.weight": np.full((4, 3), version + i, dtype=np.float32) for i in range(n)}


def test_numpy_dict_round_trip(client, name):
    d = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.arange(5, dtype=np.int64),
        "t": np.arange(12, dtype=np.float64).reshape(3, 4).T,  # strided
        "s": np.array(2.5),
        "e": np.zeros((0, 3), dtype=np.float16),
    }
    v = client.publish_dict(name, d)
    assert v == 1
    got = client.acquire_dict(name)
    assert sorted(got) == sorted(d)
    for k, a in d.items():
        b = np.from_dlpack(got[k])
        assert b.dtype == a.dtype and b.shape == a.shape and b.strides == a.strides
        assert np.array_equal(a, b)
        assert not b.flags.writeable
        assert got[k].name == k and got[k].version == 1
    info = client.stat(name)
    assert info.members == len(d)


def test_members_in_order_asked(client, name):
    client.publish_dict(name, state(1))
    got = client.acquire_dict(name, ["layers.3.weight", "layers.0.weight"])
    assert list(got) == ["layers.3.weight", "layers.0.weight"]
    with pytest.raises(dlx.NotFound, match="layers.99"):
        client.acquire_dict(name, ["layers.99.weight"])
    with pytest.raises(TypeError):
        client.acquire_dict(name, [1])


def test_one_lease_kept_by_any_member(client, name):
    client.publish_dict(name, state(1))
    got = client.acquire_dict(name)
    keep = got["layers.5.weight"]
    del got
    gc.collect()
    assert settle(client, name, 1) == 1
    arr = np.from_dlpack(keep)
    del keep
    gc.collect()
    assert settle(client, name, 1) == 1  # the numpy view holds it still
    assert arr[0, 0] == 6
    del arr
    gc.collect()
    assert settle(client, name, 0) == 0


def test_kinds_do_not_mix(client, name):
    client.publish(name, np.zeros(3, dtype=np.float32))
    with pytest.raises(dlx.NotGroup):
        client.acquire_dict(name)
    with pytest.raises(NotADirectoryError):
        client.acquire_dict(name)
    client.publish_dict(name, state(1, 2))
    with pytest.raises(dlx.IsGroup):
        client.acquire(name)


class PairlessItems(dict):
    def items(self):
        return [("a",)]


def test_bad_dicts_publish_nothing(client, name):
    with pytest.raises(TypeError, match="pair"):
        client.publish_dict(name, PairlessItems(a=np.zeros(2)))
    with pytest.raises(ValueError, match="NUL"):
        client.publish_dict(name, {"a\x00b": np.zeros(2)})
    with pytest.raises(TypeError, match="str"):
        client.publish_dict(name, {1: np.zeros(2)})
    with pytest.raises(TypeError):
        client.publish_dict(name, {"a": object()})
    with pytest.raises(ValueError):
        client.publish_dict(name, {"a/../b": np.zeros(2)})
    with pytest.raises(ValueError):
        client.publish_dict(name, {})
    with pytest.raises(dlx.NotFound):
        client.stat(name)


def test_waits_for_a_version(client, name, daemon):
    client.publish_dict(name, state(1))
    with pytest.raises(TimeoutError):
        client.acquire_dict(name, min_version=2, timeout=0.3)
    client.publish_dict(name, state(2))
    got = client.acquire_dict(name, min_version=2, timeout=5)
    assert np.from_dlpack(got["layers.0.weight"])[0, 0] == 2


def test_another_process_sees_whole_versions(client, name, daemon):
    code = """
        import sys, dlx, numpy as np
        name, n = sys.argv[1], int(sys.argv[2])
        seen = 0
        with dlx.Client() as c:
            while seen < n:
                got = c.acquire_dict(name, timeout=30)
                vals = {int(np.from_dlpack(t)[0, 0]) - i for i, t in
                        enumerate(got[f"layers.{i}.weight"] for i in range(8))}
                assert len(vals) == 1, vals
                seen = vals.pop()
                del got
        print(seen)
    """
    client.publish_dict(name, state(1), persist=True)
    p = python_child(code, daemon.socket, name, 300)
    for v in range(2, 301):
        client.publish_dict(name, state(v), persist=True)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert out.strip() == "300"


def test_torch_state_dict_load_assign(client, name):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    # tied: the last layer's bias shares storage with a view of the first's
    sd = model.state_dict()
    client.publish_dict(name, sd)
    got = client.acquire_dict(name)
    tensors = {k: torch.from_dlpack(t) for k, t in got.items()}
    other = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    other.load_state_dict(tensors, assign=True)
    for k, v in sd.items():
        assert torch.equal(other.state_dict()[k], v)
    x = torch.randn(3, 8)
    assert torch.equal(model(x), other(x))


def test_torch_tied_weights_stay_tied(client, name):
    torch = pytest.importorskip("torch")
    emb = torch.randn(10, 4)
    sd = {"embed.weight": emb, "lm_head.weight": emb, "first_row": emb[0]}
    client.publish_dict(name, sd)
    got = {k: torch.from_dlpack(t) for k, t in client.acquire_dict(name).items()}
    assert got["embed.weight"].data_ptr() == got["lm_head.weight"].data_ptr()
    assert got["first_row"].data_ptr() == got["embed.weight"].data_ptr()
    assert torch.equal(got["embed.weight"], emb)
