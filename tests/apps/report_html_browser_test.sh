#!/usr/bin/env bash
# report.html in a real browser: a small run of the mixed-precision CNN recipe (search, PTQ, one
# short QAT, freeze: every section has something to draw), then headless Chromium loads the page
# from disk (no network), and the test checks that every plot area holds a drawn SVG, that the
# page reported all plots done with no script or console error, and that a screenshot was taken.
# Exits 77 (ctest: skipped, shown as such) when chromium is not installed.
# Usage: report_html_browser_test.sh QTRAIN SOURCE_DIR WORK_DIR
set -euo pipefail
QTRAIN=$1 SRC=$2 WORK=$3
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  echo "SKIPPED: chromium is not installed (apt-get install chromium; ./scripts/test installs it)"
  exit 77
fi
rm -rf "$WORK" && mkdir -p "$WORK"
cd "$SRC"
"$QTRAIN" --recipe recipes/fmnist_cnn_mixed.yaml --out "$WORK/run" --set model.checkpoint="$WORK/fp32.h5" \
  --set data.max_train_examples=1024 --set data.max_eval_examples=256 --set train.epochs=1 \
  --set calibrate.batches=1 --set search.batches=1 --set search.probes=4 --set search.latency_cache="$WORK/lat.json" \
  --set qat.epochs=1 --set qat.max_steps=8 > "$WORK/qtrain.log" 2>&1 || { cat "$WORK/qtrain.log"; exit 1; }
PAGE="$WORK/run/report.html"
flags=(--headless --no-sandbox --disable-gpu --no-first-run --disable-extensions --virtual-time-budget=20000
       --user-data-dir="$WORK/profile")
timeout 120 "$CHROMIUM" "${flags[@]}" --dump-dom "file://$PAGE" > "$WORK/dom.html" 2> "$WORK/chromium.log" || {
  cat "$WORK/chromium.log"; exit 1; }
timeout 120 "$CHROMIUM" "${flags[@]}" --window-size=1200,6000 --screenshot="$WORK/report.png" "file://$PAGE" \
  >> "$WORK/chromium.log" 2>&1 || { cat "$WORK/chromium.log"; exit 1; }
python3 - "$WORK/dom.html" "$WORK/report.png" <<'PY'
import re, sys, os
dom = open(sys.argv[1], encoding="utf-8").read()
fail = []
errors = re.search(r'<html[^>]*data-errors="([^"]*)"', dom)
if errors: fail.append("page errors: " + errors.group(1))
if 'data-plots="done"' not in dom: fail.append("the page did not report its plots done")
ids = re.findall(r'<div class="plot[^"]*" id="(plot-[a-z0-9-]+)"', dom)
for want in ("plot-sqnr", "plot-hist-0", "plot-loss", "plot-bits", "plot-pareto"):
    if want not in ids: fail.append("no plot area " + want)
for pid in ids:
    m = re.search(r'id="%s"(.*?)</svg>' % re.escape(pid), dom, re.S)
    if not m or "<svg" not in m.group(1): fail.append(pid + ": no SVG drawn"); continue
    marks = len(re.findall(r'<path', m.group(1)))
    if marks < 3: fail.append("%s: only %d SVG paths" % (pid, marks))
png = sys.argv[2]
if not os.path.exists(png) or os.path.getsize(png) < 20000:
    fail.append("screenshot missing or blank (%s bytes)" % (os.path.getsize(png) if os.path.exists(png) else 0))
if fail:
    print("FAIL\n" + "\n".join(fail)); sys.exit(1)
print("report.html: %d plots drawn, no page errors, screenshot %d bytes" % (len(ids), os.path.getsize(png)))
PY
