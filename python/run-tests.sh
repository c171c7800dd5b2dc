#!/usr/bin/env bash
# The Python package's tests, from a clean slate, bounded:
#   python/run-tests.sh [BUILD_DIR]          (BUILD_DIR: build-python, under the repository)
#
#  1. dlxd, dlxctl and the README's C example: $DLXD if set (dlxctl and the example are
#     then looked for beside it), else a C build of this repository in BUILD_DIR/c;
#  2. a virtual environment in BUILD_DIR/venv, made with Debian's python3;
#  3. the test dependencies from PyPI (pytest, numpy 2.x, torch, apache-tvm-ffi), then
#     `pip wheel ./python` (meson-python and meson from PyPI; the extension built with
#     warnings as errors, libdlx compiled from this tree and linked in), its contents
#     checked, and that wheel installed;
#  4. pytest on python/tests, each module against its own dlxd; results also in
#     BUILD_DIR/pytest.xml (JUnit XML).
#
# Debian packages it needs beyond .ci/deps': python3-dev python3-venv.
# Environment: PYTHON (default /usr/bin/python3), DLXD, TORCH_INDEX_URL (an index to take
# torch from instead of PyPI, e.g. a CPU-only one), DLX_PY_NO_TORCH=1 (skip torch and its
# tests: PyPI's torch brings about 4 GiB of CUDA libraries). Extra arguments for pytest go
# in PYTEST_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-python}
mkdir -p "$build"
build=$(cd "$build" && pwd)
python=${PYTHON:-/usr/bin/python3}
[ -x "$python" ] || python=python3

step() { printf '=== %s\n' "$*"; }
timed() {
  local t0=$SECONDS
  "$@"
  printf '    (%d s)\n' $((SECONDS - t0)) >&2
}

missing=()
"$python" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
"$python" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(
    sysconfig.get_paths()["include"], "Python.h")))' || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing Debian packages: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 1
fi

# 1. the daemon and the C tools the tests talk to (pytest runs elsewhere: absolute paths)
if [ -n "${DLXD:-}" ]; then
  DLXD=$(realpath "$DLXD")
  export DLXD
fi
if [ -z "${DLXD:-}" ]; then
  step "C build in $build/c"
  timed .ci/setup "$build/c"
  timed ninja -C "$build/c" >/dev/null
  export DLXD=$build/c/daemon/dlxd
fi

# 2. the virtual environment (kept between runs; delete BUILD_DIR/venv to start over)
venv=$build/venv
if [ ! -x "$venv/bin/python" ]; then
  step "venv in $venv ($("$python" --version))"
  timed "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

# 3. test dependencies, then the package itself
step "test dependencies from PyPI"
deps=(pytest 'numpy>=2' apache-tvm-ffi)
timed "${pip[@]}" install -q "${deps[@]}"
if [ "${DLX_PY_NO_TORCH:-0}" != 1 ]; then
  step "torch${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
  timed "${pip[@]}" install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch
else
  "${pip[@]}" uninstall -q -y torch 2>/dev/null || true
fi
step "the wheel (pip wheel ./python), checked, then installed"
# a kept build directory makes the next build incremental
rm -rf "$build/dist"
timed "${pip[@]}" wheel -q --no-deps -w "$build/dist" \
  --config-settings=build-dir="$build/meson" --config-settings=setup-args=-Dwerror=true ./python
wheels=("$build"/dist/dlx-*.whl)
[ ${#wheels[@]} -eq 1 ] || { echo "want one wheel in $build/dist: ${wheels[*]}" >&2; exit 1; }
"$venv/bin/python" - "${wheels[0]}" <<'PY'
import sys, zipfile
# the extension and the package's Python files, nothing of the C project (dlxd, libdlx.so, headers)
names = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if ".dist-info/" not in n]
extension = [n for n in names if n.startswith("dlx/_dlx.") and n.endswith(".so")]
stray = sorted(set(names) - {"dlx/__init__.py", "dlx/py.typed", *extension})
if len(extension) != 1 or stray:
    sys.exit(f"unexpected wheel contents: {names}")
print(f"    {sys.argv[1].rsplit('/', 1)[-1]}: {', '.join(sorted(names))}")
PY
timed "${pip[@]}" install -q --force-reinstall --no-deps "${wheels[0]}"
# libdlx is inside the extension: no libdlx.so, no libuv at run time
so=$("$venv/bin/python" -c 'import dlx._dlx as m; print(m.__file__)')
if ldd "$so" | grep -E 'libdlx|libuv'; then
  echo "$so links libdlx or libuv dynamically" >&2
  exit 1
fi

# 4. the tests, from outside python/ so that the installed package is the one imported;
#    BUILD_DIR/pytest.xml (JUnit) is what a CI summary can count
step "pytest"
cd "$build"
rm -f pytest.xml
# shellcheck disable=SC2086
exec "$venv/bin/python" -m pytest -p no:cacheprovider -ra --junitxml="$build/pytest.xml" \
  ${PYTEST_ARGS:-} "$OLDPWD/python/tests"
