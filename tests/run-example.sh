#!/bin/sh
# Runs the README example: a producer and a consumer process against a real dlxd.
set -eu
example=$1
dir=$(mktemp -d /tmp/dlx-example-XXXXXX)
export DLX_SOCKET="$dir/dlxd.sock"
cleanup() {
  [ -n "${holder:-}" ] && kill "$holder" 2>/dev/null || true
  [ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# readiness on fd 3, as a supervisor would do it
mkfifo "$dir/ready"
"$DLXD" --ready-fd 3 3>"$dir/ready" &
daemon=$!
[ -n "$(head -c1 "$dir/ready")" ] || { echo "dlxd did not start" >&2; exit 1; }

# the producer keeps its tensor published until its stdin closes
mkfifo "$dir/in"
"$example" produce demo/example < "$dir/in" > "$dir/produce.out" &
producer=$!
sleep 1000 > "$dir/in" &
holder=$!
for _ in $(seq 1 500); do
  grep -q published "$dir/produce.out" 2>/dev/null && break
  sleep 0.01
done
cat "$dir/produce.out"
"$example" consume demo/example
kill "$holder"; holder=
wait "$producer"

# the producer left: its non-persistent tensor is gone
if "$DLXCTL" get demo/example "$dir/x.npy" 2>/dev/null; then
  echo "the tensor outlived its producer" >&2
  exit 1
fi
kill -TERM "$daemon"
wait "$daemon"
daemon=
echo "example ok"
