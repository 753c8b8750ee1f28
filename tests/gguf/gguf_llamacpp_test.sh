#!/usr/bin/env bash
# llama.cpp as the consumer of qforge's GGUF export (ctest gguf_llamacpp):
#   1. gguf_llamacpp_tool writes a tiny Llama and a tiny GPT-2 as GGUF (F32 and Q8_0 of the float
#      models, frozen W8 -> Q8_0 and W4 g32 -> Q4_0) with qforge's greedy tokens and next-token
#      probabilities;
#   2. node-llama-cpp 3.21.1 (llama.cpp's prebuilt CPU library), installed into the build tree with
#      npm i -E --ignore-scripts --omit=optional (no CUDA / Vulkan builds, no compilation), loads
#      each file and run_llamacpp.js compares its greedy tokens and probabilities with qforge's.
# Without node, or when npm cannot install node-llama-cpp (offline), the test exits 77 (ctest shows
# it skipped) with the reason; it never passes silently.
# Usage: gguf_llamacpp_test.sh TOOL SOURCE_DIR WORK_DIR
set -uo pipefail
tool=$1 src=$2 work=$3
version=3.21.1
rm -rf "$work/models"
mkdir -p "$work/models"
"$tool" "$work/models" || { echo "FAIL: gguf_llamacpp_tool"; exit 1; }

command -v node >/dev/null || { echo "SKIPPED: node is not installed: llama.cpp did not run the GGUF files"; exit 77; }
nlc=$work/node-llama-cpp
installed=$(node -p "require('$nlc/node_modules/node-llama-cpp/package.json').version" 2>/dev/null)
if [ "$installed" != "$version" ] || [ ! -d "$nlc/node_modules/@node-llama-cpp/linux-x64" ]; then
  rm -rf "$nlc" && mkdir -p "$nlc"
  echo "installing node-llama-cpp $version into $nlc"
  (cd "$nlc" && echo '{"private": true}' >package.json &&
    npm i -E --ignore-scripts --omit=optional --no-audit --no-fund \
      "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >npm.log 2>&1) ||
    { tail -5 "$nlc/npm.log"; echo "SKIPPED: npm could not install node-llama-cpp $version (see $nlc/npm.log)"; exit 77; }
fi
cp "$src/run_llamacpp.js" "$nlc/"
node "$nlc/run_llamacpp.js" "$work/models/manifest.json" || { echo "FAIL: llama.cpp disagrees with qforge"; exit 1; }
echo "gguf_llamacpp: llama.cpp ran every exported file and agreed with qforge"
