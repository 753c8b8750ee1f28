#!/bin/sh
# A GoogleTest binary registered with qforge_add_test(... SPLIT ...) runs as one ctest entry per
# test (issue 39 item 23: models_results_test's results used to share one binary run and its 900 s
# timeout; issue 31: qtrain_test's shards run in parallel). Each test the binary lists has exactly
# one entry of the binary's tier that runs it alone with a timeout; no entry names a test the
# binary lacks. Slow-tier entries time real trainings and run serially; fast-tier ones in parallel.
# The entries are read from a copy of the folder's CTestTestfile.cmake: ctest run on the build
# tree itself would overwrite the log of the ctest run this test is part of.
#   split_entries_test.sh BINARY CTEST TESTFILE WORKDIR NAME TIER MAX_TIMEOUT_S
set -eu
bin=$1 ctest=$2 testfile=$3 work=$4 name=$5 tier=$6 max_timeout=$7
[ -x /usr/bin/python3 ] || { echo "python3 missing: skipped"; exit 77; }
tests=$("$bin" --gtest_list_tests | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}')
printf 'binary lists:\n%s\n' "$tests"
rm -rf "$work" && mkdir -p "$work" && cp "$testfile" "$work/CTestTestfile.cmake"
"$ctest" --test-dir "$work" --show-only=json-v1 > "$work/tests.json"
printf '%s\n' "$tests" | /usr/bin/python3 -c '
import json, sys
name, tier, max_timeout = sys.argv[2], sys.argv[3], float(sys.argv[4])
listed = [l.strip() for l in sys.stdin if l.strip()]
entries = {}
for t in json.load(open(sys.argv[1]))["tests"]:
    if t["name"] == name or t["name"].startswith(name + "."):
        entries[t["name"]] = {p["name"]: p["value"] for p in t.get("properties", [])} | {"command": t.get("command", [])}
bad = []
if name in entries:
    bad.append("the whole binary is still one entry")
total = 0
for test_name in listed:
    suite, test = test_name.split(".", 1)
    e = entries.pop(name + "." + test, None)
    if e is None:
        bad.append(test_name + " has no entry"); continue
    if "--gtest_filter=" + test_name not in e["command"]: bad.append(test_name + ": entry does not filter to it")
    if tier not in e.get("LABELS", []): bad.append(test_name + ": not in the " + tier + " tier")
    serial = str(e.get("RUN_SERIAL", False)).upper() in ("1", "ON", "TRUE", "YES")
    if serial != (tier == "slow"): bad.append(test_name + ": RUN_SERIAL should be " + str(tier == "slow"))
    timeout = float(e.get("TIMEOUT", 0))
    if not 0 < timeout <= max_timeout: bad.append(test_name + ": timeout %g s" % timeout)
    total += timeout
    print("%-45s timeout %5.0f s" % (test_name, timeout))
bad += [n + " names no test of the binary" for n in entries if n != name]
if not listed: bad.append("the binary lists no test")
print("sum of timeouts %.0f s" % total)
if bad:
    print("FAIL: " + "; ".join(bad)); sys.exit(1)
print(name + " split: ok")
' "$work/tests.json" "$name" "$tier" "$max_timeout"
