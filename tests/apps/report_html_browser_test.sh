#!/usr/bin/env bash
# report.html in a real browser: a small run of the mixed-precision CNN recipe (search, PTQ, one
# short QAT, freeze: every section has something to draw), then headless Chromium loads the page
# from disk (no network), and the test checks that every plot area holds a drawn SVG, that the
# page reported all plots done with no script or console error, and that a screenshot was taken.
# At 1400 px (issue 39 item 7) the page is no wider than the window, the layer labels of the SQNR
# and bit plots are distinct and none is cut at its end, and the chosen point is the Pareto plot's
# last symbol in SVG order. The same checks run on a second page: a crafted report whose layers
# carry BERT's names (report_html_tool writes it through the report writer), where labels cut to
# a shared head or a table sized by its names would show.
# Exits 77 (ctest: skipped, shown as such) when chromium is not installed.
# Usage: report_html_browser_test.sh QTRAIN SOURCE_DIR WORK_DIR REPORT_HTML_TOOL
set -euo pipefail
QTRAIN=$1 SRC=$2 WORK=$3 TOOL=$4
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
"$TOOL" "$WORK/long" > "$WORK/tool.log" 2>&1 || { cat "$WORK/tool.log"; exit 1; }
flags=(--headless --no-sandbox --disable-gpu --no-first-run --disable-extensions --virtual-time-budget=20000
       --user-data-dir="$WORK/profile" --hide-scrollbars)
# check PAGE DIR PLOTS...: the page's DOM and a screenshot at 1400 px into DIR, then the checks.
check() {
  local page=$1 dir=$2; shift 2
  timeout 120 "$CHROMIUM" "${flags[@]}" --window-size=1400,3000 --dump-dom "file://$page" > "$dir/dom.html" 2> "$dir/chromium.log" || {
    cat "$dir/chromium.log"; exit 1; }
  timeout 120 "$CHROMIUM" "${flags[@]}" --window-size=1400,6000 --screenshot="$dir/report.png" "file://$page" \
    >> "$dir/chromium.log" 2>&1 || { cat "$dir/chromium.log"; exit 1; }
  python3 - "$dir/dom.html" "$dir/report.png" "$@" <<'PY'
import re, sys, os
dom = open(sys.argv[1], encoding="utf-8").read()
fail = []
errors = re.search(r'<html[^>]*data-errors="([^"]*)"', dom)
if errors: fail.append("page errors: " + errors.group(1))
if 'data-plots="done"' not in dom: fail.append("the page did not report its plots done")
ids = re.findall(r'<div class="plot[^"]*" id="(plot-[a-z0-9-]+)"', dom)
for want in sys.argv[3:]:
    if want not in ids: fail.append("no plot area " + want)
for pid in ids:
    m = re.search(r'id="%s"(.*?)</svg>' % re.escape(pid), dom, re.S)
    if not m or "<svg" not in m.group(1): fail.append(pid + ": no SVG drawn"); continue
    marks = len(re.findall(r'<path', m.group(1)))
    if marks < 3: fail.append("%s: only %d SVG paths" % (pid, marks))
def svg_of(pid):
    m = re.search(r'id="%s"(.*?)</svg>' % re.escape(pid), dom, re.S)
    return m.group(1) if m else ""
# The page within a 1400-px window once drawn.
width = re.search(r'<body[^>]*data-page-width="(\d+)"', dom)
if not width: fail.append("the page did not record its width")
elif int(width.group(1)) > 1400: fail.append("the page is %s px wide in a 1400-px window" % width.group(1))
# Layer labels: distinct, none cut to a shared prefix.
for pid in ("plot-sqnr", "plot-bits"):
    axis = re.findall(r'<g class="mark-text role-axis-label"[^>]*>(.*?)</g>', svg_of(pid), re.S)
    labels = [t for a in axis for t in re.findall(r'<text[^>]*>([^<]*)</text>', a)]
    names = [t for t in labels if not re.fullmatch(r'[-\d.,\s]+', t)]
    if not names: fail.append(pid + ": no layer labels found")
    if len(set(names)) != len(names): fail.append(pid + ": labels repeat: " + ", ".join(sorted(names)))
    if any(t.endswith("\u2026") for t in names): fail.append(pid + ": a label is cut at its end")
# The chosen point (red diamond) is the last symbol of its panel in the SVG: drawn on top.
panels = re.split(r'<g class="mark-group role-scope concat_\d+_group"', svg_of("plot-pareto"))[1:] or [svg_of("plot-pareto")]
for i, panel in enumerate(panels):
    symbols = re.findall(r'<g class="mark-symbol role-mark[^"]*"[^>]*>(.*?)</g>', panel, re.S)
    fills = [f for g in symbols for f in re.findall(r'<path[^>]*fill="([^"]+)"', g)]
    if not fills: fail.append("plot-pareto panel %d: no points" % i); continue
    if fills[-1] != "#e45756" or fills.count("#e45756") != 1:
        fail.append("plot-pareto panel %d: the chosen point is not the one last symbol (fills %s)" % (i, fills))
png = sys.argv[2]
if not os.path.exists(png) or os.path.getsize(png) < 20000:
    fail.append("screenshot missing or blank (%s bytes)" % (os.path.getsize(png) if os.path.exists(png) else 0))
if fail:
    print("FAIL\n" + "\n".join(fail)); sys.exit(1)
print("%s: %d plots drawn, no page errors, page %s px wide at 1400, labels distinct, chosen point on top, "
      "screenshot %d bytes" % (sys.argv[1], len(ids), width.group(1), os.path.getsize(png)))
PY
}
check "$WORK/run/report.html" "$WORK/run" plot-sqnr plot-hist-0 plot-loss plot-bits plot-pareto
check "$WORK/long/report.html" "$WORK/long" plot-sqnr plot-bits plot-pareto
