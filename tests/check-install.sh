#!/bin/sh
# What `meson install` puts in place, used the way an installed copy is used:
# installs BUILD into a temporary DESTDIR, checks the files (binaries, the
# soname chain, every public header, dlx.pc, the completion; man pages and
# units when this build makes them), builds the README's example against the
# installed tree with `pkg-config dlx` alone and runs it against the installed
# dlxd, and runs each installed binary's --version.
#   check-install.sh MESON BUILD SRCDIR VERSION SOVERSION FEDERATION(0|1)
# CC (the build's compiler) and DLX_SANITIZE (its b_sanitize) come from the
# environment: a consumer of a sanitized libdlx links the sanitizer too.
set -eu
meson=$1 build=$2 srcdir=$3 version=$4 soversion=$5 federation=$6
cc=${CC:-cc}
sanitize=${DLX_SANITIZE:-none}
here=$(cd "$(dirname "$0")" && pwd)

dest=$(mktemp -d /tmp/dlx-install-XXXXXX)
trap 'rm -rf "$dest"' EXIT
fail() {
  echo "check-install: $*" >&2
  exit 1
}

# --no-rebuild: meson test is running in this build directory, and a second
# ninja there would race it; the test's depends built what is installed.
$meson install -C "$build" --no-rebuild --quiet --destdir "$dest" ||
  fail "meson install failed (a file not built? meson test builds only the tests' depends)"

# the layout this build was configured with, as absolute paths
prefix='' bindir='' libdir='' includedir='' mandir=''
eval "$($meson introspect --buildoptions "$build" | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
for k in ("prefix", "bindir", "libdir", "includedir", "mandir"):
    print("%s=\"%s\"" % (k, o[k] if o[k].startswith("/") else o["prefix"] + "/" + o[k]))
')"

# Everything meson says it installs is there (the man pages and units included,
# where this build makes them), and nothing of it lies outside the prefix but
# what pkg-config placed there (units, completions).
$meson introspect --installed "$build" | python3 -c '
import json, sys
for dst in json.load(sys.stdin).values():
    print(dst)
' > "$dest/installed.list"
while read -r f; do
  [ -e "$dest$f" ] || [ -L "$dest$f" ] || fail "meson lists $f as installed, but it is not there"
done < "$dest/installed.list"

binaries="dlxd dlxctl"
[ "$federation" = 1 ] && binaries="$binaries dlxfed"
for b in $binaries; do
  [ -x "$dest$bindir/$b" ] || fail "$bindir/$b is not installed"
  # no run path into the build tree: the installed copy must run on its own
  if readelf -d "$dest$bindir/$b" | grep -E 'R(UN)?PATH' | grep -qF "$build"; then
    fail "$bindir/$b keeps a run path into the build directory"
  fi
done

# libdlx.so -> libdlx.so.SOVERSION -> libdlx.so.VERSION, a file with that soname
lib=$dest$libdir
[ "$(readlink "$lib/libdlx.so")" = "libdlx.so.$soversion" ] || fail "libdlx.so does not point to libdlx.so.$soversion"
[ "$(readlink "$lib/libdlx.so.$soversion")" = "libdlx.so.$version" ] ||
  fail "libdlx.so.$soversion does not point to libdlx.so.$version"
if [ ! -f "$lib/libdlx.so.$version" ] || [ -L "$lib/libdlx.so.$version" ]; then
  fail "libdlx.so.$version is not a file"
fi
readelf -d "$lib/libdlx.so.$version" | grep -q "SONAME.*\[libdlx.so.$soversion\]" ||
  fail "libdlx.so.$version has not the soname libdlx.so.$soversion"
[ -f "$lib/libdlx.a" ] || fail "libdlx.a is not installed"

# every public header of the source tree
for h in "$srcdir"/include/dlx/*.h; do
  [ -f "$dest$includedir/dlx/$(basename "$h")" ] || fail "include/dlx/$(basename "$h") is not installed"
done
[ -f "$lib/pkgconfig/dlx.pc" ] || fail "dlx.pc is not installed"

# the completion, where bash-completion looks (or datadir's usual place)
comp=$(find "$dest" -path '*/bash-completion/completions/dlxctl')
[ -n "$comp" ] || fail "dlxctl's bash completion is not installed"
bash -c '. "$1" && complete -p dlxctl' sh "$comp" >/dev/null || fail "$comp does not define dlxctl's completion"

# man pages: where this build installs any, one for each program and libdlx(3)
if [ -d "$dest$mandir" ]; then
  pages="man8/dlxd.8 man1/dlxctl.1 man3/libdlx.3"
  [ "$federation" = 1 ] && pages="$pages man8/dlxfed.8"
  for p in $pages; do
    ls "$dest$mandir/$p"* >/dev/null 2>&1 || fail "$mandir/$p is not installed"
  done
fi
# units: the programs of ours they run are the installed ones
for u in $(find "$dest" -path '*/systemd/*' -type f \( -name '*.service' -o -name '*.socket' \)); do
  for exe in $(sed -n 's/^Exec[A-Za-z]*=[-@:+!]*\([^ ]*\).*/\1/p' "$u"); do
    case ${exe##*/} in
    dlxd | dlxctl | dlxfed)
      [ "$exe" = "$bindir/${exe##*/}" ] || fail "${u#"$dest"} runs $exe, not $bindir/${exe##*/}" ;;
    esac
  done
done

# each installed program runs, from the installed libdlx
# only the installed libdlx: meson test points LD_LIBRARY_PATH into the build tree
export LD_LIBRARY_PATH="$lib"
for b in $binaries; do
  out=$("$dest$bindir/$b" --version) || fail "$b --version failed"
  case $out in
  *"$version"*) ;;
  *) fail "$b --version says '$out', not $version" ;;
  esac
done
ldd "$dest$bindir/dlxctl" | grep -qF "$lib/libdlx.so.$soversion" || fail "dlxctl does not load the installed libdlx"

# The README's example, built with nothing but what pkg-config dlx says of the
# installed tree (the source tree's include/ is not on any path).
"$here/extract-example.sh" "$srcdir/README.md" "$dest/example.c"
export PKG_CONFIG_PATH="$lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$dest"
flags=$(pkg-config --cflags --libs dlx) || fail "pkg-config dlx failed"
san=
[ "$sanitize" = none ] || san="-fsanitize=$sanitize"
# shellcheck disable=SC2086
$cc -Wall -Wextra -Werror $san -o "$dest/example" "$dest/example.c" $flags ||
  fail "the README example does not build against the installed libdlx"
ldd "$dest/example" | grep -qF "$lib/libdlx.so.$soversion" || fail "the example does not load the installed libdlx"
# and against libdlx.a: pkg-config --static has what it needs (no sanitizer: no -static)
if [ "$sanitize" = none ]; then
  # shellcheck disable=SC2046
  $cc -static -o "$dest/example-static" "$dest/example.c" $(pkg-config --static --cflags --libs dlx) \
    2>"$dest/static.err" || { cat "$dest/static.err" >&2; fail "the example does not link statically"; }
fi

DLXD=$dest$bindir/dlxd DLXCTL=$dest$bindir/dlxctl "$here/run-example.sh" "$dest/example"
if [ "$sanitize" = none ]; then
  DLXD=$dest$bindir/dlxd DLXCTL=$dest$bindir/dlxctl "$here/run-example.sh" "$dest/example-static"
fi
echo "install ok: $(find "$dest$prefix" -type f | wc -l) files under $prefix"
