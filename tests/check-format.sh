#!/bin/sh
# SPDX-License-Identifier: MIT
# The house format (.clang-format) holds for every C file of the project:
# clang-format --dry-run -Werror over what git tracks (or, outside a git
# checkout, every .c and .h under the source directories). Skips (77) where
# clang-format is not installed; .ci/deps test installs it.
set -eu
cd "$1"
command -v clang-format >/dev/null 2>&1 || { echo "clang-format not installed: skipped"; exit 77; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        files=$(git ls-files '*.c' '*.h')
else
        files=$(find client daemon include proto python tests -name '*.[ch]' 2>/dev/null)
fi
[ -n "$files" ] || { echo "no C files found under $1"; exit 1; }
# shellcheck disable=SC2086 # one word per file: the project has no spaces in names
clang-format --dry-run -Werror $files
echo "$(echo "$files" | wc -l) files in the house format"
