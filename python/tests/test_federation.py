# SPDX-License-Identifier: MIT
"""A peer's names through the Python package, unchanged: two hosts on the
loopback (each a dlxd and a dlxfed, UCX over TCP on lo), a numpy array
published on host A and acquired on host B as "@a/<name>"."""
import os
import signal
import socket
import time

import numpy as np
import pytest

import dlx
from conftest import Daemon, Process, _beside_dlxd, _dlxd_path


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bridge(Process):
    def __init__(self, path, daemon, alias, port, *extra):
        self.secret = os.path.join(daemon.dir, "fed.secret")
        fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, b"a secret the two hosts share\n")
        os.close(fd)
        env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
        self.start([path, "--alias", alias, "--listen", f"127.0.0.1:{port}", "--socket",
                    daemon.socket, "--secret-file", self.secret, "--log-level", "info", *extra],
                   os.path.join(daemon.dir, "dlxfed.log"), "dlxfed", timeout=30, env=env)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(20)
        text = self.logtext()
        self.log.close()
        return rc, text


@pytest.fixture(scope="module")
def hosts():
    fed = _beside_dlxd("DLXFED", "federation/dlxfed")
    if not fed:
        pytest.skip("no dlxfed beside dlxd (built with -Dfederation=disabled)")
    uid = str(os.getuid())
    a = Daemon(_dlxd_path(), "--federation-uid", uid)
    b = Daemon(_dlxd_path(), "--federation-uid", uid)
    pa, pb = _free_port(), _free_port()
    bridges = []
    try:
        bridges.append(Bridge(fed, a, "a", pa, "--export", "model/", "--peer", f"b=127.0.0.1:{pb}"))
        bridges.append(Bridge(fed, b, "b", pb, "--peer", f"a=127.0.0.1:{pa}"))
        yield a, b
    finally:
        for br in reversed(bridges):
            rc, text = br.stop()
            assert rc == 0, f"dlxfed exited {rc}:\n{text}"
        assert b.stop() == 0
        assert a.stop() == 0


def test_a_peers_name_is_acquired_as_any_name(hosts):
    a, b = hosts
    w = (np.arange(6 * 7, dtype=np.float32) / 7).reshape(6, 7)
    with dlx.Client(a.socket, name="producer-a") as pa, dlx.Client(b.socket, name="py-b") as cb:
        pa.publish("model/w", w)
        with cb.acquire("@a/model/w", timeout=10.0) as t:
            assert t.version == 1
            assert t.read_only
            got = np.from_dlpack(t)
            np.testing.assert_array_equal(got, w)
            del got
        info = cb.stat("@a/model/w")
        assert info.version == 1
        assert info.origin.startswith("ucx tcp/lo")
        assert info.origin.endswith("\u2190 a v1")
        # min_version means the same on both hosts: v2 is waited for at A
        pa.publish("model/w", w * 2)
        with cb.acquire("@a/model/w", timeout=10.0, min_version=2) as t:
            assert t.version == 2
            np.testing.assert_array_equal(np.from_dlpack(t), w * 2)


def test_what_a_peer_does_not_export_fails_naming_it(hosts):
    a, b = hosts
    with dlx.Client(a.socket) as pa, dlx.Client(b.socket) as cb:
        pa.publish("secret/k", np.zeros(4, dtype=np.int8))
        t0 = time.monotonic()
        with pytest.raises(dlx.Error) as e:
            cb.acquire("@a/secret/k", timeout=10.0)
        assert time.monotonic() - t0 < 5.0
        assert "a" in str(e.value)
        assert "export" in str(e.value)
