#!/bin/sh
# The man pages against what they document. Each page built (DLX_MAN_DLXD,
# DLX_MAN_DLXCTL, DLX_MAN_DLXFED, DLX_MAN_LIBDLX: their paths) must
#  - lint clean (mandoc -Tlint -W warning says nothing) and render (mandoc, man -l);
#  - say in its header the name and section its file name gives;
#  - document every option of its program's --help (DLXD, DLXCTL, DLXFED) as an
#    entry of its own (a line that starts with options), and every dlxctl command
#    as an entry of COMMANDS;
#  - for libdlx(3), give a synopsis (a prototype) and a description of every
#    function libdlx exports (DLX_LIBDLX, matched against the version script
#    client/libdlx.map) and every function dlx.h declares.
# Skipped (77) without the pages (no scdoc: -Dman) or without mandoc.
set -eu

if ! command -v mandoc >/dev/null 2>&1; then
        echo "mandoc is not installed: skipped"
        exit 77
fi
if [ -z "${DLX_MAN_LIBDLX:-}${DLX_MAN_DLXD:-}${DLX_MAN_DLXCTL:-}${DLX_MAN_DLXFED:-}" ]; then
        echo "the man pages were not built (scdoc not found, or -Dman=disabled): skipped"
        exit 77
fi
src=${DLX_TEST_SRCDIR:-$(dirname "$0")}

failed=0
fail() {
        echo "FAIL: $*" >&2
        failed=1
}

# The page as text, one line per paragraph, without bold and underline.
bs=$(printf '\b')
text() {
        mandoc -Tascii -O width=1000 "$1" | sed "s/.$bs//g"
}

# The term part of each option line of a --help: the line up to the first run
# of two spaces, from lines whose first character after the indent is '-'.
help_terms() {
        sed -n 's/^ \{1,\}\(-[^ ].*\)$/\1/p' | sed 's/  .*//'
}

# Options (-x, --long) named in term parts on stdin, one per line.
options_in() {
        grep -oE -- '(^|[][ ,|])--?[A-Za-z0-9][A-Za-z0-9-]*' | sed 's/^[][ ,|]//' | sort -u
}

# Whether option $2 has an entry in page text $1: a line that starts (after the
# indent) with options, among them $2.
has_entry() {
        printf '%s\n' "$1" | grep -E '^ *-' |
                grep -qE -- "(^|[][ ,|])$2([][ ,=|]|\$)"
}

check_page() {
        page=$1 name=$2 section=$3
        if [ ! -f "$page" ]; then
                fail "$name($section): $page was not built"
                return
        fi
        base=$(basename "$page")
        [ "$base" = "$name.$section" ] || fail "$page: the file of $name($section) is named $base"

        # (a) lint and render
        lint=$(mandoc -Tlint -W warning "$page" 2>&1) || true
        [ -z "$lint" ] || fail "$name($section): mandoc -Tlint -W warning:
$lint"
        mandoc -Tascii "$page" >/dev/null || fail "$name($section): mandoc cannot render it"
        if command -v man >/dev/null 2>&1; then
                if ! err=$(LC_ALL=C MANWIDTH=80 MANPAGER=cat man -l "$page" 2>&1 >/dev/null); then
                        fail "$name($section): man -l failed: $err"
                elif printf '%s\n' "$err" | grep -qiE 'warning|error'; then
                        fail "$name($section): man -l: $err"
                fi
        fi

        # (d) the header names the page and its section, and so does NAME
        th=$(sed -n 's/^\.TH "\{0,1\}\([^" ]*\)"\{0,1\} "\{0,1\}\([^" ]*\)"\{0,1\}.*/\1(\2)/p' "$page" |
                head -n 1)
        [ "$th" = "$name($section)" ] || fail "$page: .TH says '$th', not $name($section)"
        t=$(text "$page")
        first=$(printf '%s\n' "$t" | head -n 1 | awk '{print $1}')
        [ "$first" = "$name($section)" ] || fail "$page: its header reads '$first', not $name($section)"
        printf '%s\n' "$t" | sed -n '/^NAME$/{n;p;}' | grep -qE "^ *$name - " ||
                fail "$page: NAME does not start with '$name - '"
}

# (b) every option of PROGRAM --help has an entry in its page
check_options() {
        page=$1 prog=$2 name=$3
        [ -f "$page" ] || return 0
        if ! help=$("$prog" --help); then
                fail "$name --help failed"
                return
        fi
        t=$(text "$page")
        opts=$(printf '%s\n' "$help" | help_terms | options_in)
        # dlxctl: the options of commands, in the command lines of its --help
        if [ "$name" = dlxctl ]; then
                opts=$(printf '%s\n%s\n' "$opts" "$(printf '%s\n' "$help" |
                        sed -n 's/^  \([a-z][^ ].*\)$/\1/p' | sed 's/  .*//' | options_in)" |
                        sort -u)
        fi
        [ -n "$opts" ] || fail "$name --help: no options found in it"
        n=0
        for o in $opts; do
                n=$((n + 1))
                has_entry "$t" "$o" || fail "$name.$(basename "$page" | sed 's/.*\.//'): no entry for $o"
        done
        echo "$name: $n options of --help documented"
}

# (b) every dlxctl command of --help is an entry of COMMANDS
check_commands() {
        page=$1
        [ -f "$page" ] || return 0
        cmds=$("$DLXCTL" --help | sed -n 's/^  \([a-z][a-z]*\)\( .*\)\{0,1\}$/\1/p' | sort -u)
        [ -n "$cmds" ] || fail "dlxctl --help: no commands found in it"
        section=$(text "$page" | sed -n '/^COMMANDS$/,/^[A-Z]/p')
        n=0
        for c in $cmds; do
                n=$((n + 1))
                printf '%s\n' "$section" | grep -qE "^ +$c( |\$)" ||
                        fail "dlxctl.1: no entry for the command $c in COMMANDS"
        done
        echo "dlxctl: $n commands documented"
}

# (c) libdlx(3) names every function libdlx exports and every one dlx.h declares
check_library() {
        page=$1
        [ -f "$page" ] || return 0
        t=$(text "$page")
        want=
        if [ -n "${DLX_LIBDLX:-}" ]; then
                # the version script's global patterns (dlx_*), matched against
                # the library's dynamic symbols
                globs=$(sed -n '/global:/,/local:/p' "$src/../client/libdlx.map" |
                        sed -n 's/^[[:space:]]*\([A-Za-z_*][A-Za-z0-9_*]*\);.*/\1/p')
                [ -n "$globs" ] || fail "client/libdlx.map: no global symbols found in it"
                syms=$(nm -D --defined-only "$DLX_LIBDLX" | awk '$2 ~ /^[TW]$/ {print $3}' |
                        sed 's/@.*//' | sort -u)
                for s in $syms; do
                        for g in $globs; do
                                # shellcheck disable=SC2254 # $g is a glob
                                case $s in
                                $g) want="$want $s" ;;
                                esac
                        done
                done
                [ -n "$want" ] || fail "$DLX_LIBDLX: no exported function found"
        fi
        want="$want $(grep -E '^[^ /#]' "$src/../include/dlx/dlx.h" | grep -oE 'dlx_[a-z_]+\(' |
                tr -d '(')"
        n=0
        # shellcheck disable=SC2086 # $want is a list of words
        for f in $(printf '%s\n' $want | sort -u); do
                n=$((n + 1))
                # a prototype in a synopsis, and the function named elsewhere too
                printf '%s\n' "$t" | grep -qE "^ +[A-Za-z_][A-Za-z0-9_ ]*[ *]$f\(" ||
                        fail "libdlx.3: no synopsis of $f"
                [ "$(printf '%s\n' "$t" | grep -cE "(^|[^a-z_])$f\(")" -ge 2 ] ||
                        fail "libdlx.3: $f is not described"
        done
        echo "libdlx: $n functions documented"
}

[ -n "${DLX_MAN_DLXD:-}" ] && check_page "$DLX_MAN_DLXD" dlxd 8
[ -n "${DLX_MAN_DLXCTL:-}" ] && check_page "$DLX_MAN_DLXCTL" dlxctl 1
[ -n "${DLX_MAN_DLXFED:-}" ] && check_page "$DLX_MAN_DLXFED" dlxfed 8
[ -n "${DLX_MAN_LIBDLX:-}" ] && check_page "$DLX_MAN_LIBDLX" libdlx 3

[ -n "${DLX_MAN_DLXD:-}" ] && [ -n "${DLXD:-}" ] && check_options "$DLX_MAN_DLXD" "$DLXD" dlxd
[ -n "${DLX_MAN_DLXCTL:-}" ] && [ -n "${DLXCTL:-}" ] && check_options "$DLX_MAN_DLXCTL" "$DLXCTL" dlxctl
[ -n "${DLX_MAN_DLXCTL:-}" ] && [ -n "${DLXCTL:-}" ] && check_commands "$DLX_MAN_DLXCTL"
[ -n "${DLX_MAN_DLXFED:-}" ] && [ -n "${DLXFED:-}" ] && check_options "$DLX_MAN_DLXFED" "$DLXFED" dlxfed
[ -n "${DLX_MAN_LIBDLX:-}" ] && check_library "$DLX_MAN_LIBDLX"

exit "$failed"
