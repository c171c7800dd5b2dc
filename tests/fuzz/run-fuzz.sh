#!/bin/sh
# Runs a fuzz target for the meson tests (tests/fuzz/meson.build).
#
#   run-fuzz.sh seeds TARGET MAKE_CORPUS NAME
#       Replays the seed corpus of NAME, written by MAKE_CORPUS into a fresh
#       directory, through TARGET (a libFuzzer binary or a replay build).
#
#   run-fuzz.sh replay TARGET DIR
#       Replays every file in DIR (none when DIR does not exist) through TARGET.
#
#   run-fuzz.sh fuzz TARGET MAKE_CORPUS NAME REGRESSIONS WORKDIR
#       Fuzzes for $DLX_FUZZ_SECONDS seconds (default 60) from the seeds and the
#       inputs in REGRESSIONS. New inputs are kept in WORKDIR/corpus-NAME (the
#       next run starts where this one stopped), crashes in WORKDIR/artifacts-NAME/.
#
# A crash, a sanitizer report or a broken invariant fails. Only file arguments
# reach TARGET in the first two modes: given a directory, libFuzzer would fuzz.
set -eu

# UBSan reports are failures, like ASan's, unless the caller says otherwise.
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export UBSAN_OPTIONS

# libFuzzer reports a crash with exit status 77, which meson reads as "skipped"
run() {
        rc=0
        "$@" || rc=$?
        [ "$rc" -eq 77 ] && rc=1
        return "$rc"
}

mode=${1:-}
case $mode in
seeds)
        target=$2 make_corpus=$3 name=$4
        tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlx-seeds-$name.XXXXXX")
        trap 'rm -rf "$tmp"' EXIT
        "$make_corpus" "$name" "$tmp"
        run "$target" "$tmp"/*
        ;;
replay)
        target=$2 dir=$3
        set --
        if [ -d "$dir" ]; then
                for f in "$dir"/*; do
                        [ -f "$f" ] && set -- "$@" "$f"
                done
        fi
        if [ $# -eq 0 ]; then
                echo "no inputs kept in $dir"
                exit 0
        fi
        run "$target" "$@"
        ;;
fuzz)
        target=$2 make_corpus=$3 name=$4 regressions=$5 work=$6
        seconds=${DLX_FUZZ_SECONDS:-60}
        mkdir -p "$work/corpus-$name" "$work/artifacts-$name"
        rm -rf "$work/seeds-$name"
        "$make_corpus" "$name" "$work/seeds-$name"
        set -- "$work/corpus-$name" "$work/seeds-$name"
        [ -d "$regressions" ] && set -- "$@" "$regressions"
        echo "fuzzing $name for $seconds s; corpus in $work/corpus-$name"
        # the first directory receives the new inputs; the others are only read
        run "$target" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 \
                -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
                -artifact_prefix="$work/artifacts-$name/" "$@"
        ;;
*)
        echo "usage: $0 seeds TARGET MAKE_CORPUS NAME | replay TARGET DIR |" >&2
        echo "       fuzz TARGET MAKE_CORPUS NAME REGRESSIONS WORKDIR" >&2
        exit 2
        ;;
esac
