#!/bin/sh
# libdlx must export the public API and nothing else: every dynamic symbol it
# defines starts with dlx_, and each public function of dlx.h is there.
set -eu
lib=$1
here=$(dirname "$0")
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sed 's/@.*//' | sort -u)
bad=$(printf '%s\n' "$syms" | grep -v '^dlx_' || true)
if [ -n "$bad" ]; then
  echo "libdlx exports symbols outside the dlx_ namespace:" >&2
  printf '%s\n' "$bad" >&2
  exit 1
fi
want=$(grep -E '^[^ /#]' "$here/../include/dlx/dlx.h" | grep -oE 'dlx_[a-z_]+\(' | tr -d '(' | sort -u)
missing=$(printf '%s\n' "$want" | while read -r f; do printf '%s\n' "$syms" | grep -qx "$f" || echo "$f"; done)
if [ -n "$missing" ]; then
  echo "public functions missing from libdlx:" >&2
  printf '%s\n' "$missing" >&2
  exit 1
fi
echo "libdlx exports $(printf '%s\n' "$syms" | wc -l) symbols, all dlx_*, all of dlx.h"
