#!/bin/sh
# Writes the C example between the README's example markers to $2.
set -eu
awk '/<!-- example:begin -->/ {on = 1; next}
     /<!-- example:end -->/ {on = 0}
     on && /^```/ {next}
     on {print}' "$1" > "$2"
test -s "$2" || { echo "no example found in $1" >&2; exit 1; }
