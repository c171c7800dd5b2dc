#!/usr/bin/env bash
# Builds HERE (a machine with network and the CUDA toolkit's cuda.h; no GPU needed) everything
# tests/gpu/run.sh needs on the GPU machine, which has no network and may lack meson, ninja,
# Check, libuv and protobuf-c. docs/gpu-run.md says how the two go together.
#
#   tests/gpu/prepare.sh
#
# build-gpu-meson/ is the meson build (-Dcuda=enabled -Dwerror=true -Dprefer_static=true),
# kept for the next run; build-gpu/ (what to carry: carry ["build-gpu"]) gets only what
# runs there, in the build tree's own layout so that the binaries' $ORIGIN run paths hold:
#   daemon/dlxd  client/dlxctl  client/libdlx.so.0  bench/dlx-bench  tests/test-*
#   tests/fuzz/*  tests/uvfault.so  tests/dlx-example  tests/gpu/dlx-gpu-probe
#   lib/libuv.so.1   libuv, shared: test-hygiene preloads tests/uvfault.so into dlxd to
#                    interpose libuv calls, which a static libuv would not let it do
#   tests.tsv        every test meson would run, with its command, environment and limit
#   INFO             what was built, from what, and the newest glibc symbol it needs
# Check and protobuf-c are linked statically, libuv found through the run path
# $ORIGIN/../lib; ldd of each binary is checked to need nothing else but the C library
# (libcuda is dlopen()ed at run time). Debug info is stripped (DLX_GPU_KEEP_DEBUG=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=build-gpu-meson
stage=build-gpu
cuda_include=${CUDA_INCLUDE:-/usr/local/cuda/include}

if ! .ci/deps >/tmp/dlx-gpu-prepare-deps.log 2>&1; then
        tail -n 5 /tmp/dlx-gpu-prepare-deps.log
        echo "prepare: .ci/deps failed; going on with what is installed" >&2
fi
[ -f "$cuda_include/cuda.h" ] || {
        echo "prepare: no $cuda_include/cuda.h (set CUDA_INCLUDE)" >&2
        exit 1
}

opts=(-Dcuda=enabled "-Dcudatoolkit=$(dirname "$cuda_include")" -Dwerror=true
      -Dprefer_static=true -Dbuildtype=debugoptimized
      # libuv.so.1 in build-gpu/lib: from daemon/, tests/ and tests/fuzz/
      "-Dc_link_args=['-Wl,-rpath,\$ORIGIN/../lib:\$ORIGIN/../../lib']")
echo "== meson setup $work ${opts[*]}"
if [ -f "$work/build.ninja" ]; then
        meson setup --reconfigure "$work" "${opts[@]}" >/tmp/dlx-gpu-prepare-setup.log 2>&1 ||
                { tail -n 30 /tmp/dlx-gpu-prepare-setup.log; exit 1; }
else
        meson setup "$work" "${opts[@]}" >/tmp/dlx-gpu-prepare-setup.log 2>&1 ||
                { tail -n 30 /tmp/dlx-gpu-prepare-setup.log; exit 1; }
fi
echo "== ninja -C $work"
ninja -C "$work" >/tmp/dlx-gpu-prepare-build.log 2>&1 ||
        { grep -E -A6 "error:|FAILED:" /tmp/dlx-gpu-prepare-build.log | head -n 60; exit 1; }

# The tests, as meson would run them (the default setup: no soak, no fuzzing), with paths
# made relative: @BUILD@ the build folder there, @SRC@ the checkout there. Each line:
# name, suites, timeout (0: none), parallel (1/0), environment words, command words, tab-
# separated; words are space-separated and contain no white space ("-": no words). The files they name in
# the build tree are listed on stdout, for the copy.
echo "== staging $stage"
rm -rf "$stage"
mkdir -p "$stage"
meson introspect --tests "$work" >"$work/tests.json"
python3 - "$root" "$work" "$stage" >"$work/stage-files.txt" <<'PY'
import json, os, sys
root, work, stage = sys.argv[1:4]
build = os.path.join(root, work)
files = set()

def rel(word):
    if word.startswith(build + "/"):
        if os.path.isfile(word):
            files.add(word[len(build) + 1:])
        return "@BUILD@/" + word[len(build) + 1:]
    if word == root or word.startswith(root + "/"):
        return "@SRC@" + word[len(root):]
    if not word.startswith("/") and os.path.isfile(os.path.join(build, word)):
        files.add(word)  # relative to the build folder, the tests' working directory
    return word

rows = []
for t in json.load(open(os.path.join(build, "tests.json"))):
    suites = [s.split(":", 1)[-1] for s in t["suite"]]
    if {"soak", "fuzz"} & set(suites):
        continue
    env = []
    for k, v in sorted(t["env"].items()):
        # LD_LIBRARY_PATH and the like: colon-separated paths
        env.append(k + "=" + ":".join(rel(p) for p in v.split(":")))
    cmd = [rel(w) for w in t["cmd"]]
    for w in env + cmd:
        assert w and not any(c.isspace() for c in w), (t["name"], w)
    if t.get("workdir"):
        sys.exit(f"test {t['name']} has a working directory of its own: not supported")
    rows.append("\t".join([t["name"], ",".join(suites), str(t["timeout"] or 0),
                           "1" if t["is_parallel"] else "0", " ".join(env) or "-", " ".join(cmd)]))
with open(os.path.join(root, stage, "tests.tsv"), "w") as f:
    f.write("\n".join(rows) + "\n")
for p in sorted(files):
    print(p)
PY
for f in daemon/dlxd client/dlxctl client/libdlx.so.0 bench/dlx-bench tests/gpu/dlx-gpu-probe; do
        echo "$f" >>"$work/stage-files.txt"
done
sort -u "$work/stage-files.txt" | while read -r f; do
        [ -f "$work/$f" ] || { echo "prepare: $work/$f is missing" >&2; exit 1; }
        mkdir -p "$stage/$(dirname "$f")"
        cp -L "$work/$f" "$stage/$f"
done
# libuv, shared (see above), next to what needs it
uv=$(ldd "$work/daemon/dlxd" | awk '$1 ~ /^libuv\.so/ {print $3}')
if [ -z "$uv" ] || [ ! -f "$uv" ]; then
        echo "prepare: dlxd does not link a libuv.so" >&2
        exit 1
fi
mkdir -p "$stage/lib"
cp -L "$uv" "$stage/lib/$(basename "$(ldd "$work/daemon/dlxd" | awk '$1 ~ /^libuv\.so/ {print $1}')")"

elfs=$(find "$stage" -type f -exec sh -c 'head -c4 "$1" | grep -q "ELF"' _ {} \; -print | sort)
[ "${DLX_GPU_KEEP_DEBUG:-0}" = 1 ] || for f in $elfs; do strip --strip-debug "$f"; done

# What each binary needs at run time: the C library's own, and ours from inside $stage.
echo "== ldd"
bad=0
for f in $elfs; do
        deps=$(ldd "$f" 2>&1 | awk '{print $1 "=" $3}')
        extra=$(printf '%s\n' "$deps" | grep -vE '^(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|(libc|libm|libpthread|libdl|librt|libgcc_s)\.so\.[0-9]+)=' |
                grep -vE "^(libdlx\.so\.0|libuv\.so\.1)=$root/$stage/" || true)
        printf '%-36s %s\n' "${f#"$stage"/}" "$(printf '%s\n' "$deps" | sed 's/=.*//' | grep -v vdso | tr '\n' ' ')"
        if [ -n "$extra" ]; then
                echo "   needs more than the C library, or ours from elsewhere: $extra"
                bad=1
        fi
done
[ "$bad" -eq 0 ] || { echo "prepare: a binary needs a library the GPU machine may lack" >&2; exit 1; }

glibc=$(for f in $elfs; do objdump -T "$f"; done | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -n 1)
{
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"')"
        echo "commit: $(git rev-parse HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
        echo "compiler: $(gcc --version | head -n 1)"
        echo "cuda.h: $(grep -m1 '#define CUDA_VERSION' "$cuda_include/cuda.h")"
        echo "meson options: ${opts[*]}"
        echo "newest glibc symbol needed: $glibc (the GPU machine's glibc must be at least that)"
} >"$stage/INFO"
cat "$stage/INFO"
echo "== $stage: $(find "$stage" -type f | wc -l) files, $(du -sh "$stage" | cut -f1)"
echo "carry [\"$stage\"] and run: bash tests/gpu/run.sh"
