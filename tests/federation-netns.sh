#!/usr/bin/env bash
# Two hosts as two network namespaces joined by a veth pair, addresses from
# TEST-NET-1 (192.0.2.0/24, routed nowhere): each "host" runs its dlxd (both
# in this script's namespace: they speak only AF_UNIX) and its dlxfed inside
# its namespace, with a sysfs of its own so that UCX sees that namespace's
# devices (UCX_NET_DEVICES=veth-a / veth-b). A publishes, B acquires through
# dlxctl, byte for byte, with the origin naming the veth; a replacement on A
# is pulled by version; a name A does not export is refused by A.
#
# Needs unshare (util-linux), ip (iproute2) and nsenter. Runs unprivileged
# in a user namespace where the kernel allows one; skips (77) where it does
# not. Usage: federation-netns.sh DLXD DLXFED DLXCTL
set -euo pipefail

if [ "${1:-}" != --inside ]; then
        [ $# -eq 3 ] || { echo "usage: $0 DLXD DLXFED DLXCTL" >&2; exit 2; }
        for tool in unshare nsenter ip python3; do
                command -v "$tool" >/dev/null || { echo "SKIP: no $tool"; exit 77; }
        done
        if ! unshare -r -n -m true 2>/dev/null; then
                echo "SKIP: this kernel or sandbox allows no network namespace here"
                exit 77
        fi
        # absolute: nsenter starts a namespace's commands from its root
        exec unshare -r -n -m --fork "$0" --inside "$(realpath "$1")" "$(realpath "$2")" \
                "$(realpath "$3")"
fi
shift
DLXD=$1 DLXFED=$2 DLXCTL=$3

dir=$(mktemp -d /tmp/dlx-netns-XXXXXX)
pids=() fed_pids=() dlxd_pids=()
cleanup() {
        local rc=$?
        for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
        wait 2>/dev/null || true
        if [ $rc -ne 0 ]; then
                for f in "$dir"/*.log; do echo "== $f"; tail -20 "$f"; done
        fi
        rm -rf "$dir"
        exit $rc
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; exit 1; }

# A namespace that holds itself open: unshare's own pid names it for ip and nsenter.
unshare -n -m --fork sh -c 'mount -t sysfs sysfs /sys && exec sleep 600' </dev/null >/dev/null 2>&1 &
ns_a=$!
pids+=($ns_a)
unshare -n -m --fork sh -c 'mount -t sysfs sysfs /sys && exec sleep 600' </dev/null >/dev/null 2>&1 &
ns_b=$!
pids+=($ns_b)
# wait for both to have mounted their sysfs
for _ in $(seq 100); do
        if nsenter -t "$ns_a" -m test -e /sys/class/net/lo && \
           nsenter -t "$ns_b" -m test -e /sys/class/net/lo; then
                break
        fi
        sleep 0.05
done

ip link add veth-a type veth peer name veth-b
ip link set veth-a netns "$ns_a"
ip link set veth-b netns "$ns_b"
nsenter -t "$ns_a" -n sh -c 'ip addr add 192.0.2.1/24 dev veth-a && ip link set veth-a up && ip link set lo up'
nsenter -t "$ns_b" -n sh -c 'ip addr add 192.0.2.2/24 dev veth-b && ip link set veth-b up && ip link set lo up'
nsenter -t "$ns_a" -n ping -c 1 -W 2 192.0.2.2 >/dev/null 2>&1 || \
        nsenter -t "$ns_a" -n ip link show veth-a >/dev/null || fail "no veth in namespace a"

uid=$(id -u)
start_dlxd() { # name
        "$DLXD" --socket "$dir/$1.sock" --federation-uid "$uid" 2>"$dir/dlxd-$1.log" &
        pids+=($!)
        dlxd_pids+=($!)
}
start_dlxd a
start_dlxd b
for _ in $(seq 100); do
        [ -S "$dir/a.sock" ] && [ -S "$dir/b.sock" ] && break
        sleep 0.05
done

printf 'the secret shared by a and b\n' >"$dir/secret"
chmod 600 "$dir/secret"
start_fed() { # ns alias addr dev peer extra...
        local ns=$1 alias=$2 addr=$3 dev=$4 peer=$5
        shift 5
        nsenter -t "$ns" -n -m env UCX_TLS=tcp UCX_NET_DEVICES="$dev" \
                "$DLXFED" --alias "$alias" --listen "$addr:7770" --peer "$peer" \
                --secret-file "$dir/secret" --socket "$dir/$alias.sock" \
                --log-level info "$@" 2>"$dir/dlxfed-$alias.log" &
        pids+=($!)
        fed_pids+=($!)
}
start_fed "$ns_a" a 192.0.2.1 veth-a b=192.0.2.2:7770 --export model/
start_fed "$ns_b" b 192.0.2.2 veth-b a=192.0.2.1:7770
for _ in $(seq 200); do
        grep -q listening "$dir/dlxfed-a.log" 2>/dev/null && \
                grep -q listening "$dir/dlxfed-b.log" 2>/dev/null && break
        sleep 0.05
done
grep -q listening "$dir/dlxfed-a.log" && grep -q listening "$dir/dlxfed-b.log" || \
        fail "a bridge did not start"

# a 2 x 3 float32 .npy, and a second version of it
python3 - "$dir" <<'PY'
import struct, sys
def npy(path, base):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    hdr += ' ' * (64 - (10 + len(hdr) + 1) % 64) + '\n'
    data = b''.join(struct.pack('<f', base + i) for i in range(6))
    open(path, 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(hdr)) + hdr.encode() + data)
npy(sys.argv[1] + '/w1.npy', 1.0)
npy(sys.argv[1] + '/w2.npy', 10.0)
PY

ctl_a() { "$DLXCTL" --socket "$dir/a.sock" "$@"; }
ctl_b() { "$DLXCTL" --socket "$dir/b.sock" "$@"; }

ctl_a put model/w "$dir/w1.npy" >/dev/null
ctl_b get @a/model/w "$dir/got1.npy" --timeout 10000 || fail "B could not acquire @a/model/w"
cmp "$dir/w1.npy" "$dir/got1.npy" || fail "B's copy differs from A's"
origin=$(ctl_b stat @a/model/w | sed -n 's/^origin: *//p')
case "$origin" in
*"tcp/veth-b"*" a v1") ;;
*) fail "origin '$origin' does not name veth-b, a and v1" ;;
esac

# a second version on A is pulled when B asks for it by number
ctl_a put model/w "$dir/w2.npy" >/dev/null
ctl_b get @a/model/w "$dir/got2.npy" --min-version 2 --timeout 10000 || fail "B did not get v2"
cmp "$dir/w2.npy" "$dir/got2.npy" || fail "B's v2 differs from A's"
ctl_b stat @a/model/w | grep -q "^version: *2$" || fail "B's mirror is not at A's version 2"

# what A does not export is refused by A, and the message says so
ctl_a put secret/w "$dir/w1.npy" >/dev/null
if ctl_b get @a/secret/w "$dir/nope.npy" --timeout 5000 2>"$dir/err"; then
        fail "B got a name A does not export"
fi
grep -q "not exported by a" "$dir/err" || fail "refusal without its reason: $(cat "$dir/err")"

# both bridges and both daemons stop cleanly
for p in "${fed_pids[@]}" "${dlxd_pids[@]}"; do
        kill -TERM "$p"
        wait "$p" || fail "a process exited $? on SIGTERM"
done
pids=("$ns_a" "$ns_b")
echo "netns: ok (origin: $origin)"
