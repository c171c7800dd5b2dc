#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A whole model through dlx: publish_dict, then acquire_dict + load_state_dict(assign=True).

Against the floor users already pay: load_state_dict(assign=True) of the same
state dict from memory. Both are timed in one process, alternating, on a
model of N small tensors (default 20,000: 200 blocks of 50 Linear(8, 8)
layers, weight and bias). Prints medians, and acquire_dict + load_state_dict over
load_state_dict alone.

    DLX_SOCKET=... python3 bench/py-group.py [--tensors N] [--repeats R]

Starts its own dlxd when DLX_SOCKET is unset and DLXD names the binary.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import dlx


def model_of(n):
    # nested as real models are (blocks of layers): load_state_dict filters the dict
    # per child, so one flat Sequential of 10,000 layers would cost it O(n^2)
    return torch.nn.Sequential(*[
        torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(50)])
        for _ in range(max(1, n // 100))])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()

    daemon = None
    socket = os.environ.get("DLX_SOCKET")
    if not socket:
        d = tempfile.mkdtemp(prefix="dlx-pygroup-")
        socket = os.path.join(d, "dlxd.sock")
        daemon = subprocess.Popen([os.environ.get("DLXD", "build/daemon/dlxd"), "--socket", socket,
                                   "--log-level", "warning"])
        for _ in range(200):
            if os.path.exists(socket):
                break
            time.sleep(0.01)

    torch.set_num_threads(1)
    src = model_of(args.tensors)
    sd = src.state_dict()
    dst = model_of(args.tensors)
    publish, acquire, acquire_load, load = [], [], [], []
    with dlx.Client(socket) as c:
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            c.publish_dict("bench/model", sd)
            publish.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            got = c.acquire_dict("bench/model")
            tensors = {k: torch.from_dlpack(v) for k, v in got.items()}
            acquire.append(time.perf_counter() - t0)
            dst.load_state_dict(tensors, assign=True)
            acquire_load.append(time.perf_counter() - t0)
            del got, tensors

            t0 = time.perf_counter()
            dst.load_state_dict(sd, assign=True)
            load.append(time.perf_counter() - t0)
        assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(),
                                                     dst.state_dict().values()))
    if daemon:
        daemon.terminate()
        daemon.wait()

    med = {k: statistics.median(v) * 1e3 for k, v in
           [("publish_dict", publish), ("acquire_dict + from_dlpack", acquire),
            ("acquire_dict + from_dlpack + load_state_dict", acquire_load),
            ("load_state_dict from memory", load)]}
    print(f"{args.tensors} tensors, {args.repeats} repeats, medians:")
    for k, v in med.items():
        print(f"  {k:48s} {v:9.2f} ms")
    ratio = med["acquire_dict + from_dlpack + load_state_dict"] / med["load_state_dict from memory"]
    print(f"  acquire_dict + load_state_dict over load_state_dict alone: {ratio:.2f}x "
          f"(target < 2x: {'met' if ratio < 2 else 'missed'})")


if __name__ == "__main__":
    sys.exit(main())
