#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Hand a tensor to another Python process: dlx against torch.multiprocessing.

    python bench/py-handoff.py [--iters N] [--sizes 4KiB,64MiB,1GiB] [--scenarios reused,fresh]
                               [--pin none|same] [--json]

One hand-off is: the producer process has a tensor ready and hands it over; the
consumer process ends up with a torch tensor on the very same memory and reads
its first element. The producer writes time.perf_counter() (CLOCK_MONOTONIC,
the same clock in every process) into that element just before handing over;
the consumer subtracts it from its own clock once it has read it: a one-way
latency, measured the same way for every method. Hand-offs go in lock step (the
consumer acknowledges each one on a pipe, outside the measured interval), so
no method is measured under a queue of its own backlog.

Two scenarios, each for dlx and torch.multiprocessing's Queue with either sharing
strategy (file_descriptor, the Linux default, and file_system):
  reused  the producer hands over the same buffer every time, already shareable:
          dlx: alloc() once, publish(copy="never") a new version each time;
          torch: a tensor moved to shared memory once (share_memory_()), put each time.
          The best case for torch.multiprocessing.
  fresh   every hand-off is a new tensor (a new batch, new weights), filled before the
          clock starts: dlx: a new alloc() each time, filled in place, published
          zero-copy; torch: a new ordinary tensor each time, which put() moves into
          shared memory (one copy, as torch.multiprocessing does).
and, for reference, dlx-copy: publish() of an ordinary torch tensor (one copy into
shared memory per hand-off), reused scenario.
On the consumer side every method ends with a torch tensor on the shared pages
(acquire(min_version=k) + torch.from_dlpack for dlx, Queue.get for torch).

The floor, measured per size in the same run: the producer writes its clock (8 bytes)
into a pipe, and a process blocked reading it takes the difference. Every figure is
also given over it. --pin none (the default) leaves placement to the scheduler, as users
do; --pin same keeps every process, dlxd too, on one CPU.

It starts its own dlxd ($DLXD, else build/daemon/dlxd) on a private socket.
"""
import argparse
import json
import os
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20, "1GiB": 1 << 30}


# ---- consumers (run in a spawned process) --------------------------------------------------------


def dlx_consumer(socket, name, iters, ready, acks, results):
    import torch
    import dlx

    lat, parts = [], []
    with dlx.Client(socket) as c:
        ready.send(True)
        for k in range(1, iters + 1):
            t = c.acquire(name, min_version=k, timeout=60)
            t_acq = time.perf_counter()
            x = torch.from_dlpack(t)
            sent = x[0].item()
            t_end = time.perf_counter()
            lat.append(t_end - sent)
            parts.append((t_acq - sent, t_end - t_acq))
            del x
            t.close()
            acks.send(k)
    results.send((lat, parts))


def pipe_consumer(conn, iters, ready, acks, results):
    fd = conn.fileno()  # raw reads: no framing, no pickle
    lat = []
    ready.send(True)
    for k in range(1, iters + 1):
        (sent,) = struct.unpack("d", os.read(fd, 8))
        lat.append(time.perf_counter() - sent)
        acks.send(k)
    results.send(lat)


def tmp_consumer(strategy, queue, iters, ready, acks, results):
    import torch.multiprocessing as tmp

    tmp.set_sharing_strategy(strategy)
    lat = []
    ready.send(True)
    for k in range(1, iters + 1):
        x = queue.get()
        sent = x[0].item()
        lat.append(time.perf_counter() - sent)
        del x
        acks.send(k)
    results.send(lat)


# ---- producers -------------------------------------------------------------------------------------


def run_dlx(ctx, socket, nbytes, iters, mode):
    """mode: 'zero' (alloc once), 'fresh' (alloc each time) or 'copy' (a torch tensor)."""
    import torch
    import dlx

    name = f"bench/handoff/{nbytes}/{mode}"
    n = nbytes // 8
    ready_r, ready_w = ctx.Pipe(False)
    acks_r, acks_w = ctx.Pipe(False)
    res_r, res_w = ctx.Pipe(False)
    with dlx.Client(socket) as c:
        t = None
        if mode == "copy":
            src = torch.ones(n, dtype=torch.float64)
        elif mode == "zero":
            t = c.alloc((n,), "float64")
            src = torch.from_dlpack(t)
            src.fill_(1.0)
        p = ctx.Process(target=dlx_consumer, args=(socket, name, iters, ready_w, acks_w, res_w))
        p.start()
        ready_r.recv()
        for k in range(1, iters + 1):
            if mode == "fresh":
                t = c.alloc((n,), "float64")
                src = torch.from_dlpack(t)
                src.fill_(1.0)
            src[0] = time.perf_counter()
            if mode == "copy":
                c.publish(name, src)
            else:
                c.publish(name, t, copy="never")
            if mode == "fresh":
                # the published version keeps the memory until its readers are done
                del src
                t.close()
            assert acks_r.recv() == k
        lat, parts = res_r.recv()
        p.join(60)
    # where a hand-off's time goes: until acquire() returns, then torch.from_dlpack + a read
    run_dlx.parts = parts
    return lat


def run_pipe(ctx, iters):
    """The floor: 8 bytes (the clock) through a pipe to a process blocked reading it."""
    r, w = ctx.Pipe(False)
    ready_r, ready_w = ctx.Pipe(False)
    acks_r, acks_w = ctx.Pipe(False)
    res_r, res_w = ctx.Pipe(False)
    p = ctx.Process(target=pipe_consumer, args=(r, iters, ready_w, acks_w, res_w))
    p.start()
    ready_r.recv()
    fd = w.fileno()
    for k in range(1, iters + 1):
        os.write(fd, struct.pack("d", time.perf_counter()))
        assert acks_r.recv() == k
    lat = res_r.recv()
    p.join(60)
    return lat


def run_tmp(ctx, strategy, nbytes, iters, fresh):
    import torch
    import torch.multiprocessing as tmp

    tmp.set_sharing_strategy(strategy)
    n = nbytes // 8
    if not fresh:
        src = torch.ones(n, dtype=torch.float64).share_memory_()
    q = ctx.Queue()
    ready_r, ready_w = ctx.Pipe(False)
    acks_r, acks_w = ctx.Pipe(False)
    res_r, res_w = ctx.Pipe(False)
    p = ctx.Process(target=tmp_consumer, args=(strategy, q, iters, ready_w, acks_w, res_w))
    p.start()
    ready_r.recv()
    for k in range(1, iters + 1):
        if fresh:
            src = torch.ones(n, dtype=torch.float64)
        src[0] = time.perf_counter()
        q.put(src)  # a fresh tensor is moved to shared memory as it is sent
        assert acks_r.recv() == k
    lat = res_r.recv()
    p.join(60)
    return lat


# ---- the daemon and the table -------------------------------------------------------------------


def start_dlxd(tmpdir):
    path = os.environ.get("DLXD") or os.path.join(REPO, "build", "daemon", "dlxd")
    sock = os.path.join(tmpdir, "dlxd.sock")
    r, w = os.pipe()
    proc = subprocess.Popen([path, "--socket", sock, "--ready-fd", str(w), "--log-level", "warning"],
                            pass_fds=[w])
    os.close(w)
    ok, _, _ = select.select([r], [], [], 20)
    if not ok or not os.read(r, 1):
        proc.kill()
        sys.exit(f"dlxd ({path}) did not start")
    os.close(r)
    return proc, sock


def summary(lat, warmup):
    us = sorted(x * 1e6 for x in lat[warmup:])
    return {"median_us": statistics.median(us), "p90_us": us[int(len(us) * 0.9)],
            "min_us": us[0], "n": len(us)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=200, help="hand-offs per method and size")
    ap.add_argument("--sizes", default="4KiB,64MiB,1GiB",
                    help="comma-separated: " + ", ".join(SIZES))
    ap.add_argument("--fresh-iters", type=int, default=20,
                    help="hand-offs per method in the fresh scenario at 1 GiB (each copies 1 GiB)")
    ap.add_argument("--scenarios", default="reused,fresh")
    ap.add_argument("--pin", choices=("same", "none"), default="none",
                    help="none (the default): where the scheduler puts them, what users get, "
                         "cross-CPU wake-ups included; same: every process (dlxd too) on one "
                         "CPU, the steadiest figures, like dlx-bench --pin same")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.pin == "same":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # inherited by every child

    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    runs = {
        ("floor", "pipe"): lambda n, i: run_pipe(ctx, i),
        ("reused", "dlx"): lambda n, i: run_dlx(ctx, sock, n, i, "zero"),
        ("reused", "tmp-fd"): lambda n, i: run_tmp(ctx, "file_descriptor", n, i, False),
        ("reused", "tmp-fs"): lambda n, i: run_tmp(ctx, "file_system", n, i, False),
        ("reused", "dlx-copy"): lambda n, i: run_dlx(ctx, sock, n, i, "copy"),
        ("fresh", "dlx"): lambda n, i: run_dlx(ctx, sock, n, i, "fresh"),
        ("fresh", "tmp-fd"): lambda n, i: run_tmp(ctx, "file_descriptor", n, i, True),
        ("fresh", "tmp-fs"): lambda n, i: run_tmp(ctx, "file_system", n, i, True),
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="dlx-handoff-") as tmpdir:
        daemon, sock = start_dlxd(tmpdir)
        try:
            for size in args.sizes.split(","):
                nbytes = SIZES[size]
                for (scenario, method), run in runs.items():
                    if scenario != "floor" and scenario not in args.scenarios.split(","):
                        continue
                    iters = args.iters
                    copies = scenario == "fresh" or method == "dlx-copy"
                    if copies and nbytes >= 1 << 30:
                        iters = args.fresh_iters
                    warmup = max(1, min(10, iters // 5))
                    lat = run(nbytes, iters)
                    results.append({"size": size, "scenario": scenario, "method": method,
                                    **summary(lat, warmup)})
                    if method == "dlx":
                        parts = run_dlx.parts[warmup:]
                        results[-1]["acquire_us"] = statistics.median(a for a, _ in parts) * 1e6
                        results[-1]["torch_us"] = statistics.median(b for _, b in parts) * 1e6
                    if not args.json:
                        r = results[-1]
                        print(f"  {size:>5} {scenario:<6} {method:<9} median "
                              f"{r['median_us']:11.1f} us", file=sys.stderr)
        finally:
            daemon.terminate()
            daemon.wait(20)

    base = {(r["size"], r["scenario"]): r["median_us"] for r in results if r["method"] == "dlx"}
    floor = {r["size"]: r["median_us"] for r in results if r["method"] == "pipe"}
    for r in results:
        if (r["size"], r["scenario"]) in base:
            r["x_dlx"] = r["median_us"] / base[(r["size"], r["scenario"])]
        r["x_floor"] = r["median_us"] / floor[r["size"]]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"pin: {args.pin}; floor: 8 bytes through a pipe to a process blocked reading it")
    print("| size | scenario | method | median | p90 | min | n | median / dlx's | median / floor |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    labels = {"pipe": "pipe, 8 bytes", "tmp-fd": "torch.mp file_descriptor",
              "tmp-fs": "torch.mp file_system", "dlx-copy": "dlx, publish copies (no `alloc()`)"}
    for r in results:
        x_dlx = f"{r['x_dlx']:.1f}x" if "x_dlx" in r else ""
        print(f"| {r['size']} | {r['scenario']} | {labels.get(r['method'], r['method'])} | "
              f"{fmt(r['median_us'])} | "
              f"{fmt(r['p90_us'])} | {fmt(r['min_us'])} | {r['n']} | {x_dlx} | "
              f"{r['x_floor']:.1f}x |")
    print()
    print("dlx's hand-off, median of each part: from the producer's clock until acquire()")
    print("returns in the consumer, then torch.from_dlpack() and reading the element")
    for r in results:
        if "acquire_us" in r:
            print(f"  {r['size']:>5} {r['scenario']:<6} until acquire returns {fmt(r['acquire_us'])}, "
                  f"from_dlpack + read {fmt(r['torch_us'])}")


def fmt(us):
    return f"{us / 1000:.2f} ms" if us >= 10_000 else f"{us:.1f} us"


if __name__ == "__main__":
    main()
