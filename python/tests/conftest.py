# SPDX-License-Identifier: MIT
"""Fixtures: a real dlxd per test module, started from the C build.

The daemon is $DLXD, else the repository's build/daemon/dlxd. It is started
on a socket in a fresh temporary directory and waited for through its
--ready-fd byte (no sleeps); at the end it gets SIGTERM and must exit 0.
dlxctl and the README's C example are looked for beside it ($DLXCTL,
$DLX_EXAMPLE override).
"""
import itertools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import dlx

REPO = Path(__file__).resolve().parents[2]


def _dlxd_path():
    path = os.environ.get("DLXD") or str(REPO / "build" / "daemon" / "dlxd")
    if not os.access(path, os.X_OK):
        pytest.exit(f"no dlxd at {path}: build the C project (meson setup build && ninja -C build) "
                    "or set DLXD", returncode=3)
    return path


def _beside_dlxd(env, rel):
    if os.environ.get(env):
        return os.environ[env]
    path = Path(_dlxd_path()).resolve().parents[1] / rel
    return str(path) if os.access(path, os.X_OK) else None


class Process:
    """A program started with --ready-fd N, its output in a log file of its own."""

    def start(self, argv, log_path, what, timeout=20, env=None):
        self.log = open(log_path, "w+")
        r, w = os.pipe()
        self.proc = subprocess.Popen(
            [*argv, "--ready-fd", str(w)],
            pass_fds=[w], stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, env=env)
        os.close(w)
        ready, _, _ = select.select([r], [], [], timeout)
        byte = os.read(r, 1) if ready else b""
        os.close(r)
        if not byte:
            self.proc.kill()
            raise RuntimeError(f"{what} did not become ready: {self.logtext()}")

    def logtext(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()


class Daemon(Process):
    def __init__(self, path, *extra):
        self.dir = tempfile.mkdtemp(prefix="dlx-pytest-")
        self.socket = os.path.join(self.dir, "dlxd.sock")
        self.start([path, "--socket", self.socket, "--log-level", "info", *extra],
                   os.path.join(self.dir, "dlxd.log"), "dlxd")

    def stop(self):
        """Stops dlxd; its directory goes with it unless it exited non-zero (its log stays)."""
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(20)
        self.log.close()
        if rc == 0:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"dlxd exited {rc}; its log is in {self.dir}", file=sys.stderr)
        return rc


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(_dlxd_path())
    yield d
    rc = d.stop()
    assert rc == 0, f"dlxd exited {rc}"


@pytest.fixture
def client(daemon):
    with dlx.Client(daemon.socket, name="pytest") as c:
        yield c


_names = itertools.count()


@pytest.fixture
def name(request):
    """A fresh tensor name for each test."""
    test = request.node.name.replace("[", "/").replace("]", "").replace("-", "_")
    return f"pytest/{test}/{next(_names)}"


@pytest.fixture(scope="session")
def dlxctl():
    return _beside_dlxd("DLXCTL", "client/dlxctl")


@pytest.fixture(scope="session")
def example():
    return _beside_dlxd("DLX_EXAMPLE", "tests/dlx-example")


def settle(client, name, leases, timeout=5.0):
    """Waits until name's current version has `leases` leases (releases are posted lazily)."""
    deadline = time.monotonic() + timeout
    while True:
        client.ping()  # carries this client's posted releases
        now = client.stat(name).leases
        if now == leases or time.monotonic() > deadline:
            return now
        time.sleep(0.01)


def python_child(code, socket, *args, stdin=None, stdout=subprocess.PIPE):
    """Starts `python -c code args...` with DLX_SOCKET set to socket."""
    env = dict(os.environ, DLX_SOCKET=socket)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                            env=env, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                            text=True)


def run_child(code, socket, *args, timeout=60):
    p = python_child(code, socket, *args)
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"child failed ({p.returncode}):\n{out}\n{err}"
    return out
