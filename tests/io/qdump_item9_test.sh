#!/bin/sh
# Issue 39 item 9: `qdump errors` keeps its columns aligned for names over 40 characters (the layer
# column is as wide as the longest name, names printed whole), and `qdump show` limits its tree
# with --depth N (as tree -L N) and --grep PATTERN.
set -eu
tool=$1 qdump=$2 dump=$3 ckpt=$4
fail() { echo "FAIL: $*"; exit 1; }

"$tool" make-long-names "$dump"
out=$("$qdump" errors "$dump")
printf '%s\n' "$out"
# Every row's type column starts where the header's does, and each long name is there in full.
header_at=$(printf '%s\n' "$out" | awk '/^layer /{print index($0, " type ")}')
[ -n "$header_at" ] || fail "no header line"
rows=$(printf '%s\n' "$out" | awk -v at="$header_at" '/ Linear /{n++; if (index($0, " Linear ") != at) bad++} END{print n+0, bad+0}')
[ "$rows" = "4 0" ] || fail "rows/misaligned = $rows (want 4 rows, 0 misaligned)"
for leaf in query key value; do
  printf '%s\n' "$out" | grep -q "^bert\.encoder\.layer\.1\.attention\.self\.$leaf " || fail "$leaf's name is not printed whole"
done
# The numbers line up too: the own-SQNR column ends at one offset on every row.
ends=$(printf '%s\n' "$out" | awk '/ Linear /{p = index($0, "25.2"); if (p == 0) p = index($0, "35.0"); print p}' | sort -u | wc -l)
[ "$ends" -eq 1 ] || fail "the own SQNR column moves between rows"

# show --depth 1: the root's children only, each group with a count of what lies below it.
full=$("$qdump" show "$ckpt")
d1=$("$qdump" show "$ckpt" --depth 1)
printf '%s\n' "$d1"
printf '%s\n' "$d1" | grep -q "^  parameters/  ([0-9]* objects below, not shown: --depth 1)" || fail "--depth 1 does not cut /parameters"
printf '%s\n' "$d1" | grep -q "^    " && fail "--depth 1 printed a second level"
printf '%s\n' "$d1" | grep -q "^(.* of .* objects shown, --depth 1)$" || fail "--depth 1 has no closing count"
d2=$("$qdump" show "$ckpt" --depth 2)
printf '%s\n' "$d2" | grep -q "^    fc1/  (" || fail "--depth 2 does not show /parameters/fc1 as a cut group"
[ "$(printf '%s\n' "$full" | wc -l)" -gt "$(printf '%s\n' "$d2" | wc -l)" ] || fail "--depth 2 is not shorter than the full tree"
# Deep enough shows the whole tree and the same lines as no limit (plus the count).
d9=$("$qdump" show "$ckpt" --depth 9 | sed '$d')
[ "$d9" = "$full" ] || fail "--depth 9 differs from the full tree"

# --grep: the matching objects with the groups leading to them, nothing else; dotted paths match.
g=$("$qdump" show "$ckpt" --grep 'fc1\.weight')
printf '%s\n' "$g"
printf '%s\n' "$g" | grep -q "^  parameters/$" || fail "--grep lost the group leading to the match"
printf '%s\n' "$g" | grep -q "^    fc1/$" || fail "--grep lost fc1/"
printf '%s\n' "$g" | grep -q "^      weight" || fail "--grep did not show fc1's weight"
printf '%s\n' "$g" | grep -q "bias" && fail "--grep showed a bias"
printf '%s\n' "$g" | grep -q "fc2" && fail "--grep showed fc2"
printf '%s\n' "$g" | grep -q "^(.* of .* objects shown)$" || fail "--grep has no closing count"
none=$("$qdump" show "$ckpt" --grep 'no-such-name')
[ "$(printf '%s\n' "$none" | wc -l)" -eq 2 ] || fail "--grep without a match printed more than the title and the count"
if "$qdump" show "$ckpt" --grep '(' 2>/dev/null; then fail "a malformed --grep was accepted"; fi
# --depth below 1 is refused with qdump's own message and exit status 2.
for d in 0 -1; do
  rc=0; msg=$("$qdump" show "$ckpt" --depth "$d" 2>&1) || rc=$?
  [ "$rc" -eq 2 ] || fail "--depth $d exited $rc (want 2)"
  [ "$msg" = "qdump show: --depth must be >= 1, got $d" ] || fail "--depth $d said: $msg"
done
"$qdump" show --help | grep -q -- "--depth" || fail "--depth is not in qdump show --help"
"$qdump" show --help | grep -q -- "--grep" || fail "--grep is not in qdump show --help"
echo "qdump item 9: ok"
