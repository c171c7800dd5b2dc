#!/usr/bin/env bash
# The GPU run, on the machine with the GPU: no network, perhaps no meson, ninja, Check,
# libuv or protobuf-c. It runs what tests/gpu/prepare.sh built elsewhere into build-gpu/
# (carried along: docs/gpu-run.md), needing nothing there but bash, coreutils and the C
# library:
#
#   bash tests/gpu/run.sh [LOGDIR]
#
#   1. what the machine has: GPUs and driver, the toolkit's CUDA_VERSION, which tools exist
#   2. the driver probes (tests/gpu/probe.c: dlx-gpu-probe all)
#   3. the CUDA tests: cuda-device (test-cuda-device.c, the real GPU) and cuda-double
#   4. every other test of the default meson setup, run directly from build-gpu/tests.tsv
#      with the environment meson gives them
#   5. dlx-bench --cuda --quick
# Without build-gpu/ it builds one first with prepare.sh, if meson and ninja are there.
#
# Every step has a time limit, and all together fit in GPU_RUN_TOTAL (470 s). Output is kept
# short (the caller may see only its last 12,000 characters): one line per test, the end of
# a failed test's log, and a summary last. The full logs go to LOGDIR (default $OUT, else a
# folder under /tmp, named at the end) as at most four files: run.txt (this output),
# probes.txt, summary.txt and logs.tar.gz (every test's log).
#
# Exit status: 0 everything ran and passed, the GPU tests on a GPU included; 77 no GPU (or
# no driver) here, so the GPU steps were skipped, and the rest passed; 1 anything else,
# a skipped cuda-device test on a machine with a GPU included.
set -uo pipefail

GPU_RUN_TOTAL=${GPU_RUN_TOTAL:-470}
PROBE_TIMEOUT=${PROBE_TIMEOUT:-150}
GPU_TIMEOUT=${GPU_TIMEOUT:-150}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-200}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-60}
PREPARE_TIMEOUT=${PREPARE_TIMEOUT:-300}
start=$SECONDS

cd "$(dirname "$0")/../.." || exit 2
root=$PWD
build=${DLX_GPU_BUILD:-build-gpu}
outdir=${1:-${OUT:-}}
logs=$(mktemp -d /tmp/dlx-gpu-run.XXXXXX) || exit 2
mkdir -p "$logs/tests"
exec > >(tee "$logs/run.txt") 2>&1
tee_pid=$!

summary=()
rc=0
gpu=unknown # yes, no, unknown

note() { summary+=("$1"); }
fail() {
        summary+=("FAIL $1")
        rc=1
}
left() { echo $((start + GPU_RUN_TOTAL - SECONDS)); }
# the smaller of a step's own limit and what the whole run has left (less 10 s for the end)
limit() {
        local l
        l=$(($(left) - 10))
        [ "$1" -lt "$l" ] && l=$1
        [ "$l" -lt 1 ] && l=1
        echo "$l"
}
have() { command -v "$1" >/dev/null 2>&1; }

finish() {
        echo
        echo "==== summary ($((SECONDS - start)) s)"
        printf '%s\n' "${summary[@]}"
        local result=FAIL
        if [ "$rc" -eq 0 ] && [ "$gpu" = yes ]; then
                result=PASS
        elif [ "$rc" -eq 0 ]; then
                result="SKIP (no GPU here: the GPU steps were skipped, the rest passed)"
                rc=77
        fi
        echo "RESULT: $result"
        printf '%s\n' "${summary[@]}" "RESULT: $result" >"$logs/summary.txt"
        if [ -n "$outdir" ] && mkdir -p "$outdir" 2>/dev/null; then
                tar -C "$logs" -czf "$outdir/logs.tar.gz" tests 2>/dev/null
                cp "$logs/summary.txt" "$outdir/"
                [ -f "$logs/probes.txt" ] && cp "$logs/probes.txt" "$outdir/"
                echo "logs: $outdir (run.txt, summary.txt, probes.txt, logs.tar.gz)"
        else
                echo "logs: $logs"
        fi
        # run.txt last, once this output has ended
        exec >&- 2>&-
        wait "$tee_pid"
        [ -n "$outdir" ] && [ -d "$outdir" ] && cp "$logs/run.txt" "$outdir/" 2>/dev/null
        exit "$rc"
}

# ---- 1. the machine
echo "== host: $(uname -srm), $(getconf GNU_LIBC_VERSION 2>/dev/null || echo 'glibc ?')"
if have nvidia-smi; then
        timeout 20 nvidia-smi -L 2>&1 | head -n 8
        timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode \
                --format=csv,noheader 2>&1 | head -n 8 | sed 's/^/driver: /'
        timeout 20 nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && gpu=yes
else
        echo "no nvidia-smi"
fi
cuda_h=
for d in ${CUDA_HOME:-} /usr/local/cuda /usr/local/cuda-*; do
        [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && cuda_h=$d/include/cuda.h && break
done
if [ -n "$cuda_h" ]; then
        echo "toolkit: $(grep -m1 '#define CUDA_VERSION' "$cuda_h") ($cuda_h)"
else
        echo "toolkit: no cuda.h found"
fi
tools=
for t in meson ninja python3 gcc cc valgrind nvcc clang-format nm git; do
        if have "$t"; then tools+=" $t"; else tools+=" (no $t)"; fi
done
echo "tools:$tools"

# ---- what to run: build-gpu/, carried (or built here if the tools are)
if [ ! -f "$build/tests.tsv" ]; then
        if have meson && have ninja && have python3; then
                echo "== no $build/tests.tsv: building it (tests/gpu/prepare.sh, limit $(limit "$PREPARE_TIMEOUT") s)"
                timeout -k 10 "$(limit "$PREPARE_TIMEOUT")" bash tests/gpu/prepare.sh \
                        >"$logs/prepare.txt" 2>&1
                st=$?
                tail -n 12 "$logs/prepare.txt"
                [ $st -eq 0 ] || cp "$logs/prepare.txt" "$logs/tests/prepare.log"
        fi
        if [ ! -f "$build/tests.tsv" ]; then
                fail "no $build/tests.tsv: run tests/gpu/prepare.sh where there is network and carry $build"
                finish
        fi
fi
[ -f "$build/INFO" ] && sed -n 's/^\(commit\|built\|newest glibc.*\): /build-gpu \1: /p' "$build/INFO"
if ! out=$(timeout 10 "$build/daemon/dlxd" --version 2>&1); then
        echo "$out" | tail -n 5
        fail "$build/daemon/dlxd does not run here (a library missing, or too old a glibc?)"
        finish
fi

# ---- running tests from the manifest, as meson would
# the environment meson gives every test, before the test's own
base_env=(DLXD="$root/$build/daemon/dlxd" DLXCTL="$root/$build/client/dlxctl"
          DLX_TEST_SRCDIR="$root/tests" DLX_TEST_UVFAULT="$root/$build/tests/uvfault.so"
          LD_LIBRARY_PATH="$root/$build/lib:$root/$build/client:$root/$build/tests${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
declare -A t_suites t_timeout t_env t_cmd
order=()
# the parallel column is not used: the tests run one at a time
while IFS=$'\t' read -r name suites timeout _ env cmd; do
        [ -n "$name" ] || continue
        order+=("$name")
        t_suites[$name]=$suites
        t_timeout[$name]=$timeout
        t_env[$name]=$env
        t_cmd[$name]=$cmd
done <"$build/tests.tsv"

# run_tests LABEL STEP_LIMIT NAME... : one line each; sets n_ok n_fail n_skip and bad
run_tests() {
        local label=$1 step_end=$((SECONDS + $2)) i=0 total=$(($# - 2)) name
        shift 2
        n_ok=0 n_fail=0 n_skip=0 n_late=0 bad=()
        for name in "$@"; do
                local -a e c
                local lim=$((step_end - SECONDS)) t0 st res log="$logs/tests/$name.log"
                i=$((i + 1))
                if [ "$lim" -lt 1 ]; then
                        printf '%2d/%d %-22s NOT RUN (out of time)\n' "$i" "$total" "$name"
                        n_fail=$((n_fail + 1))
                        n_late=$((n_late + 1))
                        continue
                fi
                [ "${t_timeout[$name]}" -gt 0 ] && [ "${t_timeout[$name]}" -lt "$lim" ] &&
                        lim=${t_timeout[$name]}
                e=()
                [ "${t_env[$name]}" != - ] && read -ra e <<<"${t_env[$name]}"
                read -ra c <<<"${t_cmd[$name]}"
                e=("${e[@]//@BUILD@/$root/$build}")
                e=("${e[@]//@SRC@/$root}")
                c=("${c[@]//@BUILD@/$root/$build}")
                c=("${c[@]//@SRC@/$root}")
                # the test's LD_LIBRARY_PATH goes before the one it inherits, as meson does
                # (the driver's folder may be found only through the inherited one), with
                # libuv's folder first
                for j in "${!e[@]}"; do
                        case ${e[j]} in
                        LD_LIBRARY_PATH=*)
                                e[j]="LD_LIBRARY_PATH=$root/$build/lib:${e[j]#LD_LIBRARY_PATH=}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                                ;;
                        esac
                done
                t0=$SECONDS
                # in the build folder, as meson runs them (some name files relative to it)
                (cd "$root/$build" &&
                        exec env "${base_env[@]}" "${e[@]}" MALLOC_PERTURB_=$((RANDOM % 255 + 1)) \
                                timeout -k 10 "$lim" "${c[@]}") </dev/null >"$log" 2>&1
                st=$?
                case $st in
                0) res=OK n_ok=$((n_ok + 1)) ;;
                77) res=SKIP n_skip=$((n_skip + 1)) ;;
                124 | 137) res="TIMEOUT (${lim}s)" ;;
                *) if [ "$st" -gt 128 ]; then res="FAIL (signal $((st - 128)))"; else res="FAIL (exit $st)"; fi ;;
                esac
                case $res in
                OK | SKIP) ;;
                *)
                        n_fail=$((n_fail + 1))
                        bad+=("$name: $res")
                        ;;
                esac
                [ "$res" = SKIP ] && bad+=("$name: SKIP")
                printf '%2d/%d %-22s %-16s %4ds\n' "$i" "$total" "$name" "$res" $((SECONDS - t0))
                if [ "$res" != OK ] && [ "$res" != SKIP ]; then
                        grep -vE "dlxd (notice|info|debug)|^$" "$log" | tail -n 15 | cut -c1-300 |
                                sed 's/^/    /'
                fi
        done
        local line="$label: $n_ok passed, $n_fail failed, $n_skip skipped"
        [ "$n_late" -gt 0 ] && bad+=("$n_late not run: out of time")
        if [ ${#bad[@]} -gt 0 ]; then
                line+=" [${bad[0]}"
                for name in "${bad[@]:1}"; do line+="; $name"; done
                line+="]"
        fi
        echo "$line"
        last_line=$line
}

# ---- 2. the driver probes
probe=$build/tests/gpu/dlx-gpu-probe
if [ -x "$probe" ]; then
        lim=$(limit "$PROBE_TIMEOUT")
        echo "== probes (dlx-gpu-probe all, limit ${lim}s)"
        timeout -k 10 "$lim" "$probe" all >"$logs/probes.txt" 2>&1
        st=$?
        cat "$logs/probes.txt"
        case $st in
        0) note "probes: ran (lines above; docs/gpu-run.md says what they mean)"
           gpu=yes ;;
        77) note "probes: skipped ($(tail -n 1 "$logs/probes.txt" | cut -c1-160))"
            [ "$gpu" = yes ] && fail "probes found no usable CUDA driver, yet nvidia-smi lists a GPU"
            [ "$gpu" = unknown ] && gpu=no ;;
        124 | 137) fail "probes: over the ${lim}s limit" ;;
        *) fail "probes: dlx-gpu-probe exited $st" ;;
        esac
        # a driver that answered is a GPU here, whatever became of the probes
        grep -q '^driver: ' "$logs/probes.txt" && gpu=yes
        v=$(sed -nE 's/^probe ([a-e])( \([^)]*\))?: ([A-Z]+):.*/\1 \3/p' "$logs/probes.txt" |
                tr '\n' ',' | sed 's/,$//; s/,/, /g')
        [ -n "$v" ] && note "probe verdicts: $v"
else
        fail "no $probe"
fi
[ "$gpu" = unknown ] && gpu=no

# ---- 3. the CUDA tests
cuda_tests=()
for t in cuda-device cuda-double; do
        [ -n "${t_cmd[$t]:-}" ] && cuda_tests+=("$t")
done
[ -n "${t_cmd[cuda-device]:-}" ] || fail "$build/tests.tsv has no cuda-device test (built without CUDA?)"
if [ ${#cuda_tests[@]} -gt 0 ]; then
        lim=$(limit "$GPU_TIMEOUT")
        echo "== CUDA tests (${cuda_tests[*]}, limit ${lim}s)"
        run_tests "CUDA tests" "$lim" "${cuda_tests[@]}"
        # test-cuda-device's own lines: its device probe, notes, failures
        [ -f "$logs/tests/cuda-device.log" ] &&
                grep -E "^test-cuda-device|:F:|:E:|%: Checks" "$logs/tests/cuda-device.log" |
                head -n 30 | cut -c1-300 | sed 's/^/    /'
        if [ "$n_fail" -gt 0 ]; then
                fail "$last_line"
        elif [ "$n_skip" -gt 0 ] && [ "$gpu" = yes ]; then
                fail "$last_line (a GPU is here: cuda-device must not skip)"
        else
                note "$last_line"
        fi
fi

# ---- 4. everything else: the default setup's tests (no soak, no fuzzing), the GPU ones apart
others=()
for t in "${order[@]}"; do
        case ",${t_suites[$t]}," in
        *,gpu,* | *,soak,* | *,fuzz,*) continue ;;
        esac
        case $t in cuda-device | cuda-double) continue ;; esac
        others+=("$t")
done
lim=$(limit "$SUITE_TIMEOUT")
echo "== other tests (${#others[@]}, limit ${lim}s)"
run_tests "other tests" "$lim" "${others[@]}"
if [ "$n_fail" -gt 0 ]; then fail "$last_line"; else note "$last_line"; fi

# ---- 5. the benchmark, CUDA scenario included
bench=$build/bench/dlx-bench
if [ "$gpu" != yes ]; then
        echo "== benchmark: skipped (no GPU)"
        note "bench: skipped (no GPU)"
elif [ -x "$bench" ]; then
        lim=$(limit "$BENCH_TIMEOUT")
        echo "== benchmark (dlx-bench --cuda --quick, limit ${lim}s)"
        env "${base_env[@]}" timeout -k 10 "$lim" "$bench" --cuda --quick \
                >"$logs/tests/bench.log" 2>&1
        st=$?
        tail -n 15 "$logs/tests/bench.log" | cut -c1-200
        if [ $st -ne 0 ]; then fail "dlx-bench --cuda --quick exited $st"; else note "bench: ok"; fi
else
        fail "no $bench"
fi

finish
