#!/usr/bin/env bash
# Real consumers of qforge's ONNX export (ctest onnx_consumers):
#   1. onnx_fixture_tool writes the frozen CNN, MLP, BERT and GPT-2 fixtures as .onnx with their
#      inputs and qforge's frozen outputs;
#   2. python3-onnx (Debian) runs check_model(full_check=True) and strict shape inference;
#   3. ONNX Runtime (npm's onnxruntime-node, pinned in package-lock.json, installed with
#      npm ci --ignore-scripts, which keeps its bundled CPU runtime) executes every model and
#      compares with qforge's outputs (run_ort.js), and its optimised graphs are checked for the
#      integer ops its QDQ fusions make (check_ort_fusion.py, with python3-onnx).
# A consumer that is absent is reported as SKIPPED and the test exits 77 (ctest shows it as
# skipped), after running the consumers that are present; it never passes silently.
# Usage: onnx_consumers_test.sh FIXTURE_TOOL SOURCE_DIR WORK_DIR
set -uo pipefail
tool=$1 src=$2 work=$3
rm -rf "$work/models"
mkdir -p "$work/models"
"$tool" "$work/models" || { echo "FAIL: onnx_fixture_tool"; exit 1; }
manifest=$work/models/manifest.json
skipped=() failed=0

# Debian's interpreter, where python3-onnx is installed (a python3 earlier on PATH may be another).
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if "$py" -c "import onnx" 2>/dev/null; then
  "$py" "$src/check_onnx.py" "$manifest" || { echo "FAIL: python3-onnx rejected an exported model"; failed=1; }
else
  skipped+=("python3-onnx is not installed (apt-get install python3-onnx)")
fi

if ! command -v node >/dev/null; then
  skipped+=("node is not installed: ONNX Runtime (onnxruntime-node) did not run the models")
else
  ort=$work/onnxruntime-node
  mkdir -p "$ort"
  if ! cmp -s "$src/package-lock.json" "$ort/package-lock.json" || [ ! -d "$ort/node_modules/onnxruntime-node" ]; then
    cp "$src/package.json" "$src/package-lock.json" "$ort/"
    echo "installing onnxruntime-node into $ort (npm ci --ignore-scripts)"
    (cd "$ort" && npm ci --ignore-scripts --no-audit --no-fund >npm.log 2>&1) || { tail -5 "$ort/npm.log"; rm -rf "$ort/node_modules"; }
  fi
  if [ -d "$ort/node_modules/onnxruntime-node" ]; then
    if NODE_PATH=$ort/node_modules node "$src/run_ort.js" "$manifest"; then
      if "$py" -c "import onnx" 2>/dev/null; then
        "$py" "$src/check_ort_fusion.py" "$manifest" || { echo "FAIL: ONNX Runtime left quantized layers in float"; failed=1; }
      fi
    else
      echo "FAIL: ONNX Runtime disagrees with qforge"; failed=1
    fi
  else
    skipped+=("npm could not install onnxruntime-node (see $ort/npm.log): ONNX Runtime did not run the models")
  fi
fi

[ "$failed" = 0 ] || exit 1
if ((${#skipped[@]})); then
  for s in "${skipped[@]}"; do echo "SKIPPED: $s"; done
  exit 77
fi
echo "onnx_consumers: every exported model passed python3-onnx and ONNX Runtime"
