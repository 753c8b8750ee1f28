#!/bin/sh
# Issue 39 item 23: models_results_test runs as one ctest entry per result (they used to share one
# binary run and its 900 s timeout). Each test the binary lists has exactly one slow-tier entry
# that runs it alone with a timeout; no entry names a test the binary lacks.
# The entries are read from a copy of this folder's CTestTestfile.cmake: ctest run on the build
# tree itself would overwrite the log of the ctest run this test is part of.
set -eu
bin=$1 ctest=$2 testfile=$3 work=$4
[ -x /usr/bin/python3 ] || { echo "python3 missing: skipped"; exit 77; }
tests=$("$bin" --gtest_list_tests | awk '/^[^ ]/{suite=$1} /^  /{print suite $1}')
printf 'binary lists:\n%s\n' "$tests"
rm -rf "$work" && mkdir -p "$work" && cp "$testfile" "$work/CTestTestfile.cmake"
"$ctest" --test-dir "$work" --show-only=json-v1 > "$work/tests.json"
printf '%s\n' "$tests" | /usr/bin/python3 -c '
import json, sys
listed = [l.strip() for l in sys.stdin if l.strip()]
entries = {}
for t in json.load(open(sys.argv[1]))["tests"]:
    if t["name"] == "models_results_test" or t["name"].startswith("models_results_test."):
        entries[t["name"]] = {p["name"]: p["value"] for p in t.get("properties", [])} | {"command": t.get("command", [])}
bad = []
if "models_results_test" in entries:
    bad.append("the whole binary is still one entry")
total = 0
for name in listed:
    suite, test = name.split(".", 1)
    e = entries.pop("models_results_test." + test, None)
    if e is None:
        bad.append(name + " has no entry"); continue
    if "--gtest_filter=" + name not in e["command"]: bad.append(name + ": entry does not filter to it")
    if "slow" not in e.get("LABELS", []): bad.append(name + ": not in the slow tier")
    if not e.get("RUN_SERIAL"): bad.append(name + ": not run alone")
    timeout = float(e.get("TIMEOUT", 0))
    if not 0 < timeout <= 5400: bad.append(name + ": timeout %g s" % timeout)
    total += timeout
    print("%-45s timeout %5.0f s" % (name, timeout))
bad += [n + " names no test of the binary" for n in entries if n != "models_results_test"]
if not listed: bad.append("the binary lists no test")
print("sum of timeouts %.0f s" % total)
if bad:
    print("FAIL: " + "; ".join(bad)); sys.exit(1)
print("results split: ok")
' "$work/tests.json"
