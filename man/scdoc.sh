#!/bin/sh
# scdoc SCDOC < page.scd > page.N: scdoc, with the empty paragraphs of its output
# taken out. scdoc starts a paragraph (".P") at every blank line of its input:
# after a heading, before the next one, at the end, and inside an indented
# block that a blank line ends (".P" then ".RE"). Each is an empty paragraph,
# which mandoc -Tlint warns of; the page renders the same without them (the one
# that ends a block moves after its ".RE"), and lints clean.
set -eu
# scdoc fails on a malformed page: so must the build (a pipe would hide it)
roff=$("$1")
printf '%s\n' "$roff" | awk '
{ line[n++] = $0 }
END {
        for (i = 0; i + 1 < n; i++)
                if (line[i] == ".P" && line[i + 1] == ".RE") {
                        line[i] = ".RE"
                        line[i + 1] = ".P"
                }
        prev = ""
        for (i = 0; i < n; i++) {
                if (line[i] == ".P" && (i + 1 == n || line[i + 1] == ".P" ||
                    line[i + 1] ~ /^\.S[HS] / || prev ~ /^\.(TH|SH|SS) /))
                        continue
                print line[i]
                prev = line[i]
        }
}'
