#!/usr/bin/env bash
# One run on a machine with an NVIDIA GPU (Debian 12, CUDA toolkit at /usr/local/cuda, driver
# installed): build dlx with CUDA and warnings as errors in build-gpu, run the real-hardware
# suite (test "cuda-device", tests/test-cuda-device.c) and the driver-double suite (test
# "cuda-double", tests/test-cuda-double.c), then every other test, then the CUDA benchmark if
# one is built. Output is kept short (the caller sees only the tail); full logs stay in a
# temporary directory named at the end.
# Exits 0 only if everything ran and passed; a skipped "cuda-device" test counts as a failure here.
#
# Time limits per step (seconds), overridable from the environment.
set -uo pipefail
GPU_TIMEOUT=${GPU_TIMEOUT:-240}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-200}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-90}

cd "$(dirname "$0")/../.." || exit 2
build="build-gpu"
logs=$(mktemp -d /tmp/dlx-gpu-run.XXXXXX)
summary=()
rc=0

note() { summary+=("$1"); }
fail() { summary+=("FAIL $1"); rc=1; }
finish() {
  echo
  echo "==== summary"
  printf '%s\n' "${summary[@]}"
  echo "logs: $logs"
  if [ "$rc" -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
  exit "$rc"
}

# meson's one line per test, once each (its failure summary repeats them).
results() { grep -E "^ *[0-9]+/[0-9]+ " "$1" | awk '!seen[$0]++'; }
# The rest of what meson printed (the failing tests' logs), without the noise; last $2 lines.
errors() {
  grep -vE "^ *[0-9]+/[0-9]+ |^$|^ninja: |dlxd (notice|info|debug)" "$1" | tail -n "$2"
}

# Counts results of a copied testlog.json; prints one line, and the failing tests' names.
# For the cuda-device test, also the lines test-cuda-device printed (its device probe and notes).
count_log() {
  python3 - "$1" "$2" <<'PY'
import json, sys
label, path = sys.argv[1], sys.argv[2]
n = {"passed": 0, "failed": 0, "skipped": 0}
bad = []
for line in open(path):
    t = json.loads(line)
    r = t.get("result")
    if r in ("OK", "EXPECTEDFAIL"):
        n["passed"] += 1
    elif r == "SKIP":
        n["skipped"] += 1
        bad.append(f"{t['name']} (SKIP)")
    else:
        n["failed"] += 1
        bad.append(f"{t['name']} ({r})")
    if t["name"] == "cuda-device":
        out = (t.get("stdout") or "") + (t.get("stderr") or "")
        for l in out.splitlines():
            if l.startswith("test-cuda-device") or ":F:" in l or ":E:" in l or "%: Checks" in l:
                print("    " + l[:400])
print(f"{label}: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped"
      + (f" [{', '.join(bad)}]" if bad else ""))
PY
}

echo "== deps"
if ! .ci/deps >"$logs/deps.log" 2>&1; then
  tail -n 8 "$logs/deps.log"
  note "deps: .ci/deps failed (no network?); going on with what is installed"
fi

echo "== host"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi -L 2>&1 | head -n 8
  nvidia-smi --query-gpu=name,driver_version,memory.total,persistence_mode,compute_mode \
    --format=csv,noheader 2>&1 | head -n 8
else
  echo "no nvidia-smi"
fi
grep -m1 '#define CUDA_VERSION' /usr/local/cuda/include/cuda.h 2>/dev/null ||
  echo "no /usr/local/cuda/include/cuda.h"

echo "== configure and build ($build)"
opts=(-Dcuda=enabled -Dwerror=true)
reconf=()
[ -f "$build/build.ninja" ] && reconf=(--reconfigure)
if ! meson setup "${reconf[@]}" "$build" "${opts[@]}" >"$logs/setup.log" 2>&1; then
  tail -n 30 "$logs/setup.log"
  fail "meson setup $build ${opts[*]}"
  finish
fi
grep -E "^\s+(CUDA|DLPack)\s*:" "$logs/setup.log" || true
if ! ninja -C "$build" >"$logs/build.log" 2>&1; then
  grep -E -A4 "error:|FAILED:" "$logs/build.log" | head -n 60
  fail "build (ninja -C $build): see $logs/build.log"
  finish
fi
note "build: ok ($build, ${opts[*]})"

# Which of the two CUDA tests this tree builds.
meson test -C "$build" --list >"$logs/list.txt" 2>/dev/null
wanted=()
for t in cuda-device cuda-double; do
  grep -qE "/ $t\$" "$logs/list.txt" && wanted+=("$t")
done
if ! grep -qE "/ cuda-device\$" "$logs/list.txt"; then
  fail "no test named cuda-device in $build: paste tests/gpu/meson-snippet.txt into tests/meson.build"
fi

if [ ${#wanted[@]} -gt 0 ]; then
  echo "== meson test ${wanted[*]} (limit ${GPU_TIMEOUT}s)"
  rm -f "$build/meson-logs/testlog.json"
  timeout -k 10 "$GPU_TIMEOUT" meson test -C "$build" --print-errorlogs "${wanted[@]}" \
    >"$logs/gpu.txt" 2>&1
  st=$?
  results "$logs/gpu.txt"
  # the error logs meson printed, trimmed to what fits
  [ $st -ne 0 ] && errors "$logs/gpu.txt" 80
  [ $st -eq 124 ] || [ $st -eq 137 ] && fail "CUDA tests: over the ${GPU_TIMEOUT}s limit"
  if [ -f "$build/meson-logs/testlog.json" ]; then
    cp "$build/meson-logs/testlog.json" "$logs/gpu.json"
    line=$(count_log "CUDA tests (${wanted[*]})" "$logs/gpu.json")
    echo "$line"
    last=$(tail -n 1 <<<"$line")
    if [ $st -ne 0 ] || grep -q "SKIP" <<<"$last"; then
      fail "$last"
    else
      note "$last"
    fi
  else
    fail "CUDA tests: meson wrote no log (exit $st)"
  fi
fi

echo "== meson test, everything else (limit ${SUITE_TIMEOUT}s)"
rm -f "$build/meson-logs/testlog.json"
timeout -k 10 "$SUITE_TIMEOUT" meson test -C "$build" --print-errorlogs --no-suite gpu \
  >"$logs/suite.txt" 2>&1
st=$?
if [ $st -ne 0 ]; then
  results "$logs/suite.txt" | grep -vE " (OK|SKIP) " | head -n 30
  errors "$logs/suite.txt" 60
fi
if [ -f "$build/meson-logs/testlog.json" ]; then
  cp "$build/meson-logs/testlog.json" "$logs/suite.json"
  line=$(count_log "other tests" "$logs/suite.json")
  echo "$line"
  if [ $st -ne 0 ]; then fail "$line (exit $st)"; else note "$line"; fi
else
  fail "other tests: meson wrote no log (exit $st)"
fi

echo "== benchmark"
bench=$build/bench/dlx-bench
if [ -x "$bench" ]; then
  # a daemon of its own on a private socket, in case the benchmark expects one running
  sock_dir=$(mktemp -d /tmp/dlx-gpu-bench.XXXXXX)
  "$build/daemon/dlxd" --socket "$sock_dir/dlxd.sock" --log-level warning \
    >"$logs/bench-dlxd.log" 2>&1 &
  dlxd_pid=$!
  for _ in $(seq 50); do [ -S "$sock_dir/dlxd.sock" ] && break; sleep 0.1; done
  DLX_SOCKET="$sock_dir/dlxd.sock" timeout -k 10 "$BENCH_TIMEOUT" "$bench" --cuda --quick \
    >"$logs/bench.txt" 2>&1
  st=$?
  kill "$dlxd_pid" 2>/dev/null
  wait "$dlxd_pid" 2>/dev/null
  rm -rf "$sock_dir"
  tail -n 25 "$logs/bench.txt"
  if [ $st -ne 0 ]; then fail "dlx-bench --cuda --quick exited $st"; else note "bench: ok"; fi
else
  echo "no $bench (not written yet): skipped"
  note "bench: skipped ($bench not built)"
fi

finish
