#!/usr/bin/env bash
# Second reader: `meson install` under a prefix off the loader's path
# (--prefix /opt/dlx-check), used from where it was installed. Configures and
# builds this source tree afresh (-Dtests=false) with that prefix, installs it
# into a DESTDIR, then, in a private mount namespace, mounts the DESTDIR's
# tree at the prefix and runs what was installed: every binary's --version
# (dlxctl and dlxfed load libdlx.so.0 from the prefix's libdir), the units
# name the dlxd under the prefix, and the README example links against the
# installed tree with pkg-config dlx, shared and --static.
#   check-prefix.sh MESON SRCDIR
# Skipped (77) without unshare/mount privileges.
set -euo pipefail
meson=$1 srcdir=$2
prefix=/opt/dlx-check
command -v unshare >/dev/null || { echo "no unshare: skipped"; exit 77; }
unshare -m --propagation private true 2>/dev/null || { echo "no mount namespace here: skipped"; exit 77; }
work=$(mktemp -d /tmp/dlx-prefix-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0
$meson setup "$work/build" "$srcdir" --prefix "$prefix" -Dtests=false -Dwerror=false \
  >"$work/setup.log" 2>&1 || { cat "$work/setup.log"; exit 1; }
ninja -C "$work/build" >"$work/ninja.log" 2>&1 || { tail -30 "$work/ninja.log"; exit 1; }
$meson install -C "$work/build" --destdir "$work/dest" --quiet >/dev/null
root=$work/dest$prefix
[ -d "$root" ] || { echo "FAIL: nothing installed under $prefix"; exit 1; }

while IFS= read -r u; do
  exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$u")
  [ "$exe" = "$prefix/bin/dlxd" ] || { echo "FAIL: ${u#"$work/dest"} runs $exe, not $prefix/bin/dlxd"; fail=1; }
done < <(find "$work/dest" -path '*/systemd/*' -name 'dlxd.service')

# where the units and the sysusers.d entry went, systemd must look: else
# `systemctl enable dlxd.socket` finds no unit and no user dlx is ever made
if command -v systemd-analyze >/dev/null; then
  sys_paths=$(systemd-analyze unit-paths 2>/dev/null || true)
  user_paths=$(XDG_RUNTIME_DIR=$work systemd-analyze --user unit-paths 2>/dev/null || true)
  while IFS= read -r f; do
    d=$(dirname "${f#"$work/dest"}")
    case $d in
    */systemd/system) paths=$sys_paths ;;
    */systemd/user) paths=$user_paths ;;
    */sysusers.d) paths=$(printf '%s\n' /etc/sysusers.d /run/sysusers.d /usr/local/lib/sysusers.d /usr/lib/sysusers.d) ;;
    *) continue ;;
    esac
    printf '%s\n' "$paths" | grep -qxF "$d" ||
      { echo "FAIL: ${f#"$work/dest"} is installed where systemd never looks"; fail=1; }
  done < <(find "$work/dest" \( -path '*/systemd/*' -o -path '*/sysusers.d/*' \) -type f)
fi

extract=$srcdir/tests/extract-example.sh
"$extract" "$srcdir/README.md" "$work/example.c"
cat > "$work/inside.sh" <<EOF
set -u
mount -t tmpfs none /opt
mkdir -p $prefix
mount --bind "$root" $prefix
rc=0
for b in $prefix/bin/*; do
  out=\$("\$b" --version 2>&1) || { echo "FAIL: installed \${b#$prefix/} does not run: \$out"; rc=1; }
done
libdir=\$(dirname "\$(find $prefix -name dlx.pc | head -1)")
export PKG_CONFIG_PATH=\$libdir
cc -o "$work/ex" "$work/example.c" \$(pkg-config --cflags --libs dlx) ||
  { echo "FAIL: the example does not build with pkg-config dlx under $prefix"; rc=1; }
cc -static -o "$work/ex-static" "$work/example.c" \$(pkg-config --static --cflags --libs dlx) 2>"$work/static.err" ||
  { cat "$work/static.err"; echo "FAIL: the example does not link statically under $prefix"; rc=1; }
exit \$rc
EOF
unshare -m --propagation private bash "$work/inside.sh" || fail=1
[ $fail -eq 0 ] && echo "install under $prefix: ok"
exit $fail
