# SPDX-License-Identifier: MIT
"""Separate processes against one real dlxd, and the C side: dlxctl and the README's example."""
import os
import signal
import subprocess

import numpy as np
import pytest

import dlx
from conftest import python_child, run_child, settle

PRODUCER = """
    import sys, numpy as np, dlx
    name, n = sys.argv[1], int(sys.argv[2])
    c = dlx.Client()
    t = c.alloc((n,), "float64")
    np.from_dlpack(t)[:] = np.arange(n)
    print(c.publish(name, t, copy="never"), flush=True)
    sys.stdin.readline()  # stay connected (the tensor lives with us) until told
    c.close()
"""

CONSUMER = """
    import sys, numpy as np, dlx
    with dlx.Client() as c, c.acquire(sys.argv[1], timeout=10) as t:
        a = np.from_dlpack(t)
        print(t.version, t.storage, a.dtype, a.shape, float(a.sum()))
"""


def test_python_producer_python_consumer(daemon, client, name):
    p = python_child(PRODUCER, daemon.socket, name, 1000, stdin=subprocess.PIPE)
    assert p.stdout.readline().strip() == "1"
    out = run_child(CONSUMER, daemon.socket, name)
    assert out.split() == ["1", "memfd", "float64", "(1000,)", str(float(sum(range(1000))))]
    # the producer's zero-copy memory is mapped here too
    t = client.acquire(name)
    p.communicate(timeout=20)  # closes its stdin: it leaves
    assert p.returncode == 0
    # the producer left: the name is gone, our lease keeps the pages
    with pytest.raises(dlx.NotFound):
        client.acquire(name, timeout=0)
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(1000.0))
    t.close()


def test_consumer_waits_for_producer(daemon, name):
    consumer = python_child(CONSUMER, daemon.socket, name)
    producer = python_child(PRODUCER, daemon.socket, name, 10, stdin=subprocess.PIPE)
    out, err = consumer.communicate(timeout=30)
    assert consumer.returncode == 0, err
    assert out.split()[-1] == "45.0"
    producer.communicate(timeout=20)
    assert producer.returncode == 0


def test_torch_tensor_to_another_process(daemon, client, name):
    torch = pytest.importorskip("torch")
    client.publish(name, torch.arange(16, dtype=torch.float32).reshape(4, 4).T)
    out = run_child("""
        import sys, torch, dlx
        with dlx.Client() as c:
            x = torch.from_dlpack(c.acquire(sys.argv[1]))
            print(x.stride(), x[0].tolist())
    """, daemon.socket, name)
    assert out.strip() == "(1, 4) [0.0, 4.0, 8.0, 12.0]"


def test_killed_consumer_leases_are_released(daemon, client, name):
    client.publish(name, np.zeros(100))
    p = python_child("""
        import sys, time, numpy as np, dlx
        c = dlx.Client()
        keep = [np.from_dlpack(c.acquire(sys.argv[1])) for _ in range(3)]
        print("holding", flush=True)
        time.sleep(600)
    """, daemon.socket, name)
    assert p.stdout.readline().strip() == "holding"
    assert settle(client, name, 3) == 3
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=20)
    assert settle(client, name, 0) == 0


def test_many_processes_read_one_tensor(daemon, client, name):
    client.publish(name, np.arange(10_000, dtype=np.int64))
    code = """
        import sys, numpy as np, dlx
        with dlx.Client() as c, c.acquire(sys.argv[1]) as t:
            print(int(np.from_dlpack(t).sum()))
    """
    kids = [python_child(code, daemon.socket, name) for _ in range(8)]
    for k in kids:
        out, err = k.communicate(timeout=60)
        assert k.returncode == 0, err
        assert int(out) == sum(range(10_000))


# ---- the C side ----------------------------------------------------------------------------------


def test_python_publishes_c_example_consumes(daemon, client, name, example):
    if not example:
        pytest.skip("the README example is not built (a C build with -Dtests=true has it)")
    # what the README's consumer checks: a 4x8 float32 with v[i] = i * 0.5, sum 248
    client.publish(name, (np.arange(32, dtype=np.float32) * 0.5).reshape(4, 8))
    r = subprocess.run([example, "consume", name], env=dict(os.environ, DLX_SOCKET=daemon.socket),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{name}: 4x8 float32, sum 248.0, read-only"


def test_c_example_publishes_python_reads(daemon, client, name, example):
    if not example:
        pytest.skip("the README example is not built (a C build with -Dtests=true has it)")
    p = subprocess.Popen([example, "produce", name], env=dict(os.environ, DLX_SOCKET=daemon.socket),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith(f"published {name} version 1")
        with client.acquire(name, timeout=10) as t:
            assert (t.shape, t.dtype, t.storage) == ((4, 8), "float32", "memfd")
            np.testing.assert_array_equal(np.from_dlpack(t).ravel(),
                                          np.arange(32, dtype=np.float32) * 0.5)
    finally:
        p.communicate(timeout=20)
    assert p.returncode == 0


def test_dlxctl_reads_what_python_published(daemon, client, name, dlxctl, tmp_path):
    if not dlxctl:
        pytest.skip("no dlxctl beside dlxd")
    a = np.arange(20, dtype=np.int16).reshape(4, 5)[:, ::2]
    client.publish(name, a)
    out = tmp_path / "a.npy"
    subprocess.run([dlxctl, "--socket", daemon.socket, "get", name, str(out)], check=True,
                   timeout=30)
    np.testing.assert_array_equal(np.load(out), a)
    # and the other way: dlxctl put, Python acquire
    np.save(tmp_path / "b.npy", np.linspace(0, 1, 7, dtype=np.float32))
    subprocess.run([dlxctl, "--socket", daemon.socket, "put", name + "/b",
                    str(tmp_path / "b.npy")], check=True, timeout=30, capture_output=True)
    with client.acquire(name + "/b") as t:
        np.testing.assert_array_equal(np.from_dlpack(t), np.linspace(0, 1, 7, dtype=np.float32))
    client.unpublish(name + "/b")
