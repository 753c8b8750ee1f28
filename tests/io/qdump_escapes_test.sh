#!/bin/sh
# Issue 39 item 22: qdump prints names, attributes and notes from a file through printable():
# no raw control byte of a crafted file reaches the terminal, and a NaN or missing count prints
# "-", not -9223372036854775808.
set -eu
tool=$1 qdump=$2 file=$3
"$tool" make-hostile-names "$file"
out=$("$qdump" errors "$file"; "$qdump" show "$file")
printf '%s\n' "$out"
esc=$(printf '\033') bel=$(printf '\007')
case $out in *"$esc"* | *"$bel"*) echo "FAIL: a raw control byte reached the output"; exit 1 ;; esac
case $out in *-9223372036854775808*) echo "FAIL: a NaN count printed as an integer"; exit 1 ;; esac
printf '%s\n' "$out" | grep -qF 'evil\x1B]0;pwned\x07name' || { echo "FAIL: the escaped name is missing"; exit 1; }
printf '%s\n' "$out" | grep -qF 'note\x1B[2J' || { echo "FAIL: the escaped note is missing"; exit 1; }
# An error quoting a file name with control bytes prints it escaped too.
bad="$file.missing$(printf '\033')[2Jx.h5"
err=$("$qdump" show "$bad" 2>&1 >/dev/null || true)
printf '%s\n' "$err"
case $err in *"$esc"*) echo "FAIL: a raw control byte of a file name reached the error"; exit 1 ;; esac
printf '%s\n' "$err" | grep -qF 'missing\x1B[2Jx.h5' || { echo "FAIL: the escaped file name is missing from the error"; exit 1; }
echo "qdump escapes: ok"
