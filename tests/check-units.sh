#!/usr/bin/env bash
# The systemd units as built: systemd-analyze verify (system and user), and
# systemd-analyze security on the system service, whose exposure must stay at
# 1.0 or less ("SAFE"; the user service cannot be confined as far by a user
# manager: at most 7.0). ExecStart is pointed at the dlxd under test, as verify
# checks the binary. Skipped (77) without systemd-analyze.
# check-units.sh DLXD SYSTEM_SERVICE SYSTEM_SOCKET USER_SERVICE USER_SOCKET
set -euo pipefail
dlxd=$1
command -v systemd-analyze >/dev/null || { echo "no systemd-analyze: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/system" "$work/user" "$work/runtime"
chmod 700 "$work/runtime"
sed "s|^ExecStart=[^ ]*|ExecStart=$dlxd|" "$2" > "$work/system/dlxd.service"
cp "$3" "$work/system/dlxd.socket"
sed "s|^ExecStart=[^ ]*|ExecStart=$dlxd|" "$4" > "$work/user/dlxd.service"
cp "$5" "$work/user/dlxd.socket"
grep -q "^ExecStart=$dlxd --group dlx\$" "$work/system/dlxd.service"

fail=0
# --man=no: the pages are checked by their own test, and may not be installed here
if ! out=$(systemd-analyze verify --man=no "$work/system/dlxd.socket" "$work/system/dlxd.service" 2>&1) ||
   [ -n "$out" ]; then
  echo "FAIL: systemd-analyze verify (system):"; echo "$out"; fail=1
fi
if ! out=$(XDG_RUNTIME_DIR=$work/runtime systemd-analyze --user verify --man=no \
           "$work/user/dlxd.socket" "$work/user/dlxd.service" 2>&1) || [ -n "$out" ]; then
  echo "FAIL: systemd-analyze --user verify:"; echo "$out"; fail=1
fi
# --threshold is in tenths of the exposure scale
if ! out=$(systemd-analyze security --offline=yes --threshold=10 "$work/system/dlxd.service" 2>&1); then
  echo "FAIL: the system service's exposure is over 1.0:"; echo "$out"; fail=1
fi
echo "$out" | grep "Overall exposure"
if ! out=$(XDG_RUNTIME_DIR=$work/runtime systemd-analyze --user security --offline=yes --threshold=70 \
           "$work/user/dlxd.service" 2>&1); then
  echo "FAIL: the user service's exposure is over 7.0:"; echo "$out"; fail=1
fi
echo "$out" | grep "Overall exposure"
# a unit that breaks its rules must fail here: the test can fail
printf '[Service]\nExecStart=%s\nBogusKey=1\n' "$dlxd" > "$work/system/broken.service"
if systemd-analyze verify --man=no "$work/system/broken.service" >/dev/null 2>&1 &&
   [ -z "$(systemd-analyze verify --man=no "$work/system/broken.service" 2>&1)" ]; then
  echo "FAIL: verify passed a unit with an unknown key"; fail=1
fi
[ $fail -eq 0 ] && echo "units verified"
exit $fail
