#!/usr/bin/env bash
# Second reader: does the system unit's seccomp filter let dlxd do its job?
# Runs dlxd as dlxd.service runs it (socket-activated, --group, Type=notify
# via a test-owned NOTIFY_SOCKET, --metrics-file every second) under
# strace -f, drives a workload through it (put .npy, put .npz as a group,
# get, list, watch, stats --prometheus, rm, the README example's
# publish/acquire), and compares every syscall dlxd made with what
# SystemCallFilter= in the unit allows, as systemd-analyze syscall-filter
# expands the groups. Any syscall used but not allowed fails the test
# (under the unit it would return EPERM: SystemCallErrorNumber=EPERM).
#   check-syscalls.sh DLXD DLXCTL SYSTEM_SERVICE [EXAMPLE]
# Skipped (77) without strace, systemd-analyze, systemd-socket-activate.
set -euo pipefail
dlxd=$1 dlxctl=$2 unit=$3 example=${4:-}
for t in strace systemd-analyze systemd-socket-activate python3; do
  command -v "$t" >/dev/null || { echo "no $t: skipped"; exit 77; }
done
dir=$(mktemp -d /tmp/dlx-syscalls-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
# strace may be refused (no ptrace in this container)
strace -f -qq -o /dev/null true 2>/dev/null || { echo "strace cannot trace here: skipped"; exit 77; }

# the allowed set: the unit's SystemCallFilter= lines, in order
systemd-analyze syscall-filter > "$dir/groups.txt" 2>/dev/null
grep '^SystemCallFilter=' "$unit" | sed 's/^SystemCallFilter=//' > "$dir/filter.txt"
[ -s "$dir/filter.txt" ] || { echo "no SystemCallFilter= in $unit: nothing to check"; exit 0; }

python3 - "$dir/notify" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.bind(sys.argv[1]); s.settimeout(60)
try:
    while True:
        s.recv(4096)
except Exception:
    pass
PY
pids+=($!)
for _ in $(seq 50); do [ -S "$dir/notify" ] && break; sleep 0.1; done

export DLX_SOCKET=$dir/dlxd.sock
# ExecStart as the unit has it (dlxd --group dlx): the group here is ours
# strace outside: systemd-socket-activate execs dlxd in its own pid (LISTEN_PID)
strace -f -qq -o "$dir/trace" systemd-socket-activate -l "$DLX_SOCKET" -E NOTIFY_SOCKET="$dir/notify" \
  "$dlxd" --group "$(id -g)" \
  --metrics-file "$dir/dlxd.prom" --metrics-interval 1 2>"$dir/dlxd.log" &
daemon=$!
pids+=("$daemon")
for _ in $(seq 100); do [ -S "$DLX_SOCKET" ] && break; sleep 0.1; done

python3 - "$dir" <<'PY'
import struct, sys, zipfile, io
d = sys.argv[1]
def npy(shape, data):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join("%d," % x for x in shape)
    hdr = hdr.encode()
    pad = 64 - (10 + len(hdr) + 1) % 64
    hdr += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr + data
open(d + "/a.npy", "wb").write(npy((4,), struct.pack("<4f", 1, 2, 3, 4)))
with zipfile.ZipFile(d + "/g.npz", "w") as z:
    z.writestr("x.npy", npy((2,), struct.pack("<2f", 1, 2)))
    z.writestr("y.npy", npy((3,), struct.pack("<3f", 1, 2, 3)))
PY

run() { timeout 20 "$@" >>"$dir/work.log" 2>&1 || { echo "workload step failed: $*"; cat "$dir/work.log"; cat "$dir/dlxd.log"; exit 1; }; }
run "$dlxctl" stats
run "$dlxctl" put t/a "$dir/a.npy"
run "$dlxctl" put t/a "$dir/a.npy" --writable
run "$dlxctl" put t/g "$dir/g.npz"
run "$dlxctl" get t/a "$dir/a2.npy"
run "$dlxctl" get t/g "$dir/g2.npz"
run "$dlxctl" list
run "$dlxctl" stat t/a
timeout 5 "$dlxctl" watch t/ --count 1 --timeout 3000 >>"$dir/work.log" 2>&1 &
w=$!
sleep 0.3
run "$dlxctl" put t/b "$dir/a.npy"
wait $w || true
run "$dlxctl" stats --prometheus
if [ -n "$example" ] && [ -x "$example" ]; then
  mkfifo "$dir/in"
  "$example" produce demo/example < "$dir/in" > "$dir/produce.out" 2>&1 &
  producer=$!
  sleep 1000 > "$dir/in" &
  holder=$!
  pids+=("$holder")
  for _ in $(seq 1 300); do grep -q published "$dir/produce.out" 2>/dev/null && break; sleep 0.01; done
  run "$example" consume demo/example
  kill $holder; wait $producer || true
fi
run "$dlxctl" rm t/a
sleep 2.2   # two metrics rewrites (thread pool, mkostemp, rename)
[ -f "$dir/dlxd.prom" ] || { echo "dlxd wrote no metrics file"; cat "$dir/dlxd.log"; exit 1; }
# dlxd is strace's child (systemd-socket-activate exec'd it): stop it, not strace
# shellcheck disable=SC2046 # one pid, or none
kill -TERM $(cat /proc/"$daemon"/task/*/children) 2>/dev/null || true
wait $daemon || true

python3 - "$dir/groups.txt" "$dir/filter.txt" "$dir/trace" <<'PY'
import re, sys
groups, cur = {}, None
for line in open(sys.argv[1]):
    m = re.match(r'^(@[\w-]+)', line)
    if m:
        cur = m.group(1); groups[cur] = []; continue
    s = line.strip()
    if cur and s and not s.startswith('#'):
        groups[cur].append(s.split()[0])
def expand(tok, seen=()):
    if tok.startswith('@'):
        out = set()
        for x in groups.get(tok, []):
            out |= expand(x)
        return out
    return {tok}
allowed = None
for line in open(sys.argv[2]):
    line = line.strip()
    if not line:
        continue
    deny = line.startswith('~')
    toks = set()
    for t in line.lstrip('~').split():
        toks |= expand(t)
    if allowed is None:
        allowed = set() if not deny else None
        if deny:
            print("deny-first filters are not modelled"); sys.exit(0)
    allowed = allowed - toks if deny else allowed | toks
used = {}
started = False
for line in open(sys.argv[3]):
    # systemd-socket-activate's own syscalls come before it execs dlxd
    if not started:
        started = re.match(r'^\d+\s+execve\(".*dlxd"', line) is not None
        if not started:
            continue
    m = re.match(r'^\d+\s+([a-z_0-9]+)\(', line)
    if m:
        used.setdefault(m.group(1), line.strip())
# strace's own exec of dlxd, and the dynamic loader before main, are dlxd's too
bad = sorted(s for s in used if s not in allowed)
print("dlxd made %d distinct syscalls" % len(used))
if bad:
    print("FAIL: syscalls dlxd makes that the unit's SystemCallFilter= forbids (EPERM under systemd):")
    for s in bad:
        print("  %s   e.g. %s" % (s, used[s][:160]))
    sys.exit(1)
print("every syscall dlxd made is allowed by the unit")
PY
