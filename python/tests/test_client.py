# SPDX-License-Identifier: MIT
"""dlx.Client against a real dlxd: publish, acquire, errors, inspection, watches, threads."""
import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import dlx
from conftest import python_child, settle


def test_connect_and_close(daemon):
    c = dlx.Client(daemon.socket)
    assert not c.closed
    assert "dlxd" in c.server_version
    c.ping()
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(ValueError, match="closed"):
        c.ping()


def test_default_socket_from_environment(daemon, monkeypatch):
    monkeypatch.setenv("DLX_SOCKET", daemon.socket)
    with dlx.Client() as c:
        c.ping()


def connect_error(path, cls, code, words=None):
    """dlx.Client(path) raises cls with errno code, and a message that says the same."""
    with pytest.raises(cls) as e:
        dlx.Client(str(path))
    assert isinstance(e.value, dlx.Error)
    assert e.value.errno == code, f"errno {errno.errorcode.get(e.value.errno)}: {e.value}"
    assert (words or os.strerror(code)) in e.value.strerror
    return e.value


def test_no_daemon_is_a_connection_error(tmp_path):
    # no socket file: ENOENT (not ECONNREFUSED with ENOENT's words), still a ConnectionError
    err = connect_error(tmp_path / "nobody.sock", dlx.Disconnected, errno.ENOENT)
    assert isinstance(err, ConnectionError) and not isinstance(err, dlx.NotFound)
    assert str(tmp_path / "nobody.sock") in err.strerror
    connect_error("/no/such/dir/x.sock", dlx.Disconnected, errno.ENOENT)


def test_every_connect_failure_keeps_its_errno(tmp_path):
    import socket

    # a socket file no daemon listens on (a daemon killed with SIGKILL leaves one)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    assert isinstance(connect_error(stale, dlx.Disconnected, errno.ECONNREFUSED),
                      ConnectionError)
    # a path through a regular file
    (tmp_path / "file").write_text("")
    connect_error(tmp_path / "file" / "dlxd.sock", dlx.Disconnected, errno.ENOTDIR)
    # longer than a Unix socket address holds
    err = connect_error("/" + "x" * 200, dlx.InvalidArgument, errno.ENAMETOOLONG, "too long")
    assert isinstance(err, ValueError)


def test_a_socket_the_user_may_not_open_is_permission_denied(daemon):
    """EACCES: the daemon's socket is 0600 in a 0700 directory; another uid may not connect."""
    code = """
        import sys
        try:
            import dlx
        except Exception as e:
            sys.exit(f"cannot import dlx: {e!r}")
        try:
            dlx.Client(sys.argv[1])
        except dlx.PermissionDenied as e:
            print(e.errno, isinstance(e, PermissionError), e.strerror)
    """
    if os.geteuid() == 0:
        # root passes every permission check: try as nobody
        kw = dict(user=65534, group=65534, extra_groups=[])
    else:
        kw = {}
        os.chmod(daemon.dir, 0)
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code), daemon.socket],
                           capture_output=True, text=True, timeout=60, **kw)
    finally:
        os.chmod(daemon.dir, 0o700)
    if "cannot import dlx" in p.stderr:
        pytest.skip(f"uid 65534 cannot import dlx here: {p.stderr.strip()}")
    assert p.returncode == 0 and p.stdout, p.stderr
    code, is_perm, message = p.stdout.split(" ", 2)
    assert int(code) == errno.EACCES and is_perm == "True"
    assert os.strerror(errno.EACCES) in message and daemon.socket in message


class Refusing:
    """A producer whose __dlpack__ raises what it is given."""

    def __init__(self, exc):
        self.exc = exc

    def __dlpack__(self, **kwargs):
        raise self.exc


@pytest.mark.parametrize("exc, kind", [
    (BufferError("cannot export: not contiguous"), BufferError),
    (TypeError("unsupported dtype"), TypeError),
    (ValueError("bad layout"), ValueError),
    (RuntimeError("device lost"), RuntimeError),
    (KeyError("k"), BufferError),
    (BufferError(), BufferError),
])
def test_a_producers_refusal_names_publish_and_the_tensor(client, name, exc, kind):
    with pytest.raises(kind) as e:
        client.publish(name, Refusing(exc))
    assert str(e.value).startswith(f"publish '{name}': {Refusing.__module__}.Refusing cannot be "
                                   "exported through DLPack: ")
    assert e.value.__cause__ is exc
    assert (str(exc) or type(exc).__name__) in str(e.value)
    with pytest.raises(dlx.NotFound):
        client.stat(name)


def test_interrupts_from_a_producer_pass_as_they_are(client, name):
    for exc in (KeyboardInterrupt(), MemoryError()):
        with pytest.raises(type(exc)) as e:
            client.publish(name, Refusing(exc))
        assert e.value is exc


def test_a_closed_tensor_refuses_through_the_exchange_api(client, name):
    client.publish(name, np.arange(3.0))
    t = client.acquire(name)
    t.close()
    with pytest.raises(BufferError) as e:
        client.publish(name + "/again", t)
    assert str(e.value) == (f"publish '{name}/again': dlx.Tensor cannot be exported through "
                            "DLPack: dlx.Tensor is closed")
    assert isinstance(e.value.__cause__, BufferError)


def test_roundtrip_and_versions(client, name):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert client.publish(name, a) == 1
    assert client.publish(name, a * 2) == 2
    with client.acquire(name) as t:
        assert (t.name, t.version, t.storage) == (name, 2, "memfd")
        assert (t.shape, t.strides, t.ndim) == ((3, 4), (4, 1), 2)
        assert (t.dtype, t.device, t.nbytes) == ("float32", "cpu", 48)
        assert t.read_only
        assert t.__dlpack_device__() == (1, 0)
        np.testing.assert_array_equal(np.from_dlpack(t), a * 2)
    assert t.closed
    with pytest.raises(ValueError, match="closed"):
        t.shape
    assert "closed" in repr(t)


def test_errors_carry_the_daemons_message(client, name):
    with pytest.raises(dlx.NotFound) as e:
        client.acquire(name, timeout=0)
    assert e.value.errno == errno.ENOENT
    assert isinstance(e.value, LookupError)
    assert name in str(e.value)
    with pytest.raises(dlx.InvalidArgument) as e:
        client.publish("bad//name", np.zeros(1))
    assert isinstance(e.value, ValueError)
    assert "bad" in e.value.strerror
    with pytest.raises(dlx.NotFound):
        client.unpublish(name)
    with pytest.raises(dlx.NotFound):
        client.stat(name)
    assert dlx.strerror(-errno.ENOENT)


def test_timeout(client, name):
    t0 = time.monotonic()
    with pytest.raises(dlx.Timeout) as e:
        client.acquire(name, timeout=0.5)
    waited = time.monotonic() - t0
    assert 0.45 <= waited < 3, waited
    assert isinstance(e.value, TimeoutError)
    assert e.value.errno == errno.ETIMEDOUT
    assert "0.500 s" in str(e.value)
    with pytest.raises(ValueError):
        client.acquire(name, timeout=-1)


def test_wait_for_min_version_releases_the_gil(client, name, daemon):
    client.publish(name, np.zeros(2))
    got = {}

    def waiter():
        with dlx.Client(daemon.socket) as c2:
            got["t"] = c2.acquire(name, timeout=10, min_version=3)
            got["v"] = got["t"].version
            got["t"].close()

    th = threading.Thread(target=waiter)
    th.start()
    # this thread keeps running while the other waits: the wait holds no GIL
    gap, last, end = 0.0, time.monotonic(), time.monotonic() + 0.5
    while time.monotonic() < end:
        now = time.monotonic()
        gap, last = max(gap, now - last), now
    assert gap < 0.1, f"the main thread stalled {gap:.3f} s"
    client.publish(name, np.ones(2))
    client.publish(name, np.full(2, 3.0))
    th.join(10)
    assert got["v"] == 3


def test_a_long_wait_asks_the_daemon_nothing(client, name, daemon):
    """acquire() past its first 200 ms slice sleeps on the version page, not in
    a new waiting acquire per slice: the daemon counts a handful of requests for
    a 1.5 s wait, not one per slice."""
    got = {}

    def waiter():
        with dlx.Client(daemon.socket) as c2:
            got["t"] = c2.acquire(name, timeout=10, min_version=2)
            got["v"] = got["t"].version
            got["t"].close()

    client.publish(name, np.zeros(2))
    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.3)  # past the first slice
    before = client.stats()["requests"]
    time.sleep(1.5)
    during = client.stats()["requests"] - before
    client.publish(name, np.ones(2))
    th.join(10)
    assert got["v"] == 2
    # the stats call itself is one; slices would have been seven more
    assert during <= 2, f"{during} requests while one client waited 1.5 s"


def test_close_from_another_thread_ends_a_wait(daemon, name):
    c = dlx.Client(daemon.socket)
    err = {}

    def waiter():
        try:
            c.acquire(name)  # no limit
        except Exception as e:  # noqa: BLE001
            err["e"] = e

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.3)
    c.close()
    th.join(5)
    assert not th.is_alive()
    assert isinstance(err["e"], ValueError)
    assert c.closed


def test_ctrl_c_interrupts_a_wait_without_limit(daemon):
    code = """
        import dlx, signal, threading, os, sys
        # a shell that started us in the background may have left SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        c = dlx.Client()
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            c.acquire("never/there")
        except KeyboardInterrupt:
            print("interrupted")
    """
    p = python_child(code, daemon.socket)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    assert out.strip() == "interrupted"


def test_stat_list_unpublish(client, name):
    client.publish(name + "/a", np.zeros((2, 3), np.int16), persist=True)
    client.publish(name + "/b", np.zeros(5, np.uint8), read_only=False)
    info = client.stat(name + "/a")
    assert isinstance(info, dlx.Info)
    assert (info.name, info.version, info.dtype, info.shape) == (name + "/a", 1, "int16", (2, 3))
    assert (info.strides, info.device, info.storage, info.nbytes) == ((3, 1), "cpu", "memfd", 12)
    assert info.persist and info.read_only
    assert info.producer_pid == os.getpid()
    assert info.owner_uid == os.getuid()
    assert abs(info.published - time.time()) < 60
    assert not client.stat(name + "/b").read_only
    assert [i.name for i in client.list(name + "/")] == [name + "/a", name + "/b"]
    client.unpublish(name + "/a")
    assert [i.name for i in client.list(name + "/")] == [name + "/b"]
    stats = client.stats()
    assert stats["names"] >= 1 and stats["uid"] == os.getuid()


def test_metrics(client, name):
    before = client.metrics()
    assert before.startswith("# HELP dlx_build_info")
    client.publish(name + "/m", np.zeros(4))
    after = {line.split(" ")[0]: float(line.split(" ")[1])
             for line in client.metrics().splitlines() if line and not line.startswith("#")}
    assert after['dlx_requests_total{type="metrics"}'] >= 2
    assert after["dlx_publishes_total"] >= 1
    assert after[f'dlx_uid_names{{uid="{os.getuid()}"}}'] >= 1


def test_watch(client, name, daemon):
    with client.watch(name + "/", timeout=0.5) as w:
        assert w.prefix == name + "/"
        with dlx.Client(daemon.socket) as other:
            other.publish(name + "/x", np.zeros(1))
            other.publish(name + "/x", np.ones(1))
            other.unpublish(name + "/x")
            other.publish(name + "-not-under-the-prefix", np.zeros(1))
        events = list(w)  # ends when nothing comes for 0.5 s
    assert [(e.kind, e.name, e.version) for e in events] == [
        ("published", name + "/x", 1), ("replaced", name + "/x", 2), ("unpublished", name + "/x", 2)]
    assert all(e.watch == w.id for e in events)
    with pytest.raises(ValueError):
        w.next()


def test_track(client, name, daemon):
    with client.track(name) as t:
        assert t.name == name
        assert t.version == 0
        assert t.wait(timeout=0) is None
        with dlx.Client(daemon.socket) as other:
            other.publish(name, np.zeros(1))
            # the page is written before the publish is answered
            assert t.version == 1
            assert t.wait(0) == 1
            assert t.wait(timeout=0.05) is None
            done = []
            waiter = threading.Thread(target=lambda: done.append(t.wait(1, timeout=10)))
            waiter.start()
            time.sleep(0.05)
            other.publish(name, np.ones(1))
            waiter.join(10)
            assert done == [2]
            other.unpublish(name)
            assert t.version == 0
        assert client.track(name).version == 0  # the same name again: one more track
    with pytest.raises(ValueError):
        t.version
    with pytest.raises(dlx.Error):
        client.track("bad\nname")


def test_two_watches_on_one_client_each_get_their_own(client, name):
    wa = client.watch(name + "/a/", timeout=0.3)
    wb = client.watch(name + "/b/", timeout=0.3)
    client.publish(name + "/b/1", np.zeros(1))
    client.publish(name + "/a/1", np.zeros(1))
    # wa reads wb's event first and keeps it for wb
    assert wa.next().name == name + "/a/1"
    assert wb.next().name == name + "/b/1"
    assert wa.next(timeout=0) is None
    assert wb.next(timeout=0.1) is None
    wa.close()
    wb.close()


def test_non_persistent_tensors_go_with_their_client(daemon, client, name):
    with dlx.Client(daemon.socket) as producer:
        producer.publish(name, np.arange(4))
        t = client.acquire(name)
    # gone from the namespace, but the leased version stays readable
    with pytest.raises(dlx.NotFound):
        client.acquire(name, timeout=0)
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(4))
    t.close()


def test_tensors_outlive_their_client(daemon, name):
    with dlx.Client(daemon.socket) as c:
        c.publish(name, np.arange(6.0), persist=True)
        t = c.acquire(name)
        a = np.from_dlpack(t)
    np.testing.assert_array_equal(a, np.arange(6.0))
    del t, a
    with dlx.Client(daemon.socket) as c:
        c.unpublish(name)


def test_daemon_going_away(name):
    """A stopped daemon: calls raise Disconnected, acquired tensors stay readable."""
    from conftest import Daemon, _dlxd_path

    d = Daemon(_dlxd_path())
    c = dlx.Client(d.socket)
    c.publish(name, np.arange(5.0))
    t = c.acquire(name)
    assert d.stop() == 0
    with pytest.raises(dlx.Disconnected) as e:
        for _ in range(100):  # the shutdown notice may take a moment to arrive
            c.ping()
            time.sleep(0.01)
    assert e.value.errno in (errno.ESHUTDOWN, errno.ECONNRESET, errno.EPIPE)
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(5.0))
    t.close()
    c.close()


def test_many_threads_share_one_client(client, name):
    client.publish(name, np.arange(64, dtype=np.int64))
    errors = []

    def reader():
        try:
            for _ in range(100):
                with client.acquire(name) as t:
                    assert int(np.from_dlpack(t).sum()) in (sum(range(64)), 64 * 7)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for th in threads:
        th.start()
    client.publish(name, np.full(64, 7, dtype=np.int64))
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert settle(client, name, 0) == 0


def test_a_view_outlives_its_client(daemon, name):
    """The lease lives as long as the view does, even past the client's close."""
    with dlx.Client(daemon.socket) as producer:
        t = producer.alloc((4096,), np.float32)
        np.from_dlpack(t)[:] = 1.0
        producer.publish(name, t, copy="never")
        del t
        with dlx.Client(daemon.socket) as c:
            x = np.from_dlpack(c.acquire(name))
        assert producer.stat(name).leases == 1
        # the producer cycles its memory as fast as it likes: never those pages
        producer.unpublish(name)
        for i in range(20):
            u = producer.alloc((4096,), np.float32)
            np.from_dlpack(u)[:] = 9.0
            producer.publish(f"{name}/{i}", u, copy="never")
            del u
        assert (x == 1.0).all()
        assert producer.stats()["leases"] == 1
        del x
        deadline = time.monotonic() + 5
        while producer.stats()["leases"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert producer.stats()["leases"] == 0


def test_a_client_used_in_a_forked_child_says_so(daemon, name):
    with dlx.Client(daemon.socket) as c:
        c.publish(name, np.arange(4.0))
        t = c.acquire(name)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                c.ping()
                code = 2
            except dlx.Error as e:
                code = 0 if e.errno == errno.ESTALE and "connect again" in str(e) else 3
            try:
                del t
                c.close()
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        # the parent's connection and lease are untouched
        c.ping()
        assert c.stat(name).leases == 1
        np.testing.assert_array_equal(np.from_dlpack(t), np.arange(4.0))
        t.close()


def test_a_stopped_daemon_times_out(tmp_path, name):
    from conftest import Daemon, _dlxd_path
    d = Daemon(_dlxd_path())
    try:
        with dlx.Client(d.socket, timeout=0.3) as c:
            d.proc.send_signal(signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                with pytest.raises(dlx.Timeout):
                    c.ping()
                assert time.monotonic() - t0 < 5
            finally:
                d.proc.send_signal(signal.SIGCONT)
        with pytest.raises(ValueError):
            dlx.Client(d.socket, timeout=0)
    finally:
        assert d.stop() == 0


def test_a_watcher_that_falls_behind_hears_lost(name):
    """Events dropped for a slow reader: every watch of the client gets a 'lost'."""
    from conftest import Daemon, _dlxd_path
    d = Daemon(_dlxd_path(), "--max-queued", "64K")
    try:
        with dlx.Client(d.socket) as prod, dlx.Client(d.socket) as c:
            wa = c.watch(name + "/", timeout=0.5)
            wb = c.watch("other/", timeout=0.5)
            pad = "x" * 150
            for i in range(3000):
                prod.publish(f"{name}/{i}/{pad}", np.zeros(1))
            kinds = [e.kind for e in wa]
            assert "lost" in kinds
            assert 0 < kinds.count("published") < 3000
            assert [e.kind for e in wb] == ["lost"]
            # still connected, and what comes now arrives
            prod.publish(f"{name}/after", np.zeros(1))
            assert wa.next(timeout=5).name == f"{name}/after"
    finally:
        assert d.stop() == 0
