#!/usr/bin/env bash
# Regenerates every golden file with Debian's python3-torch (PyTorch 1.13), the numerics oracle.
# Needs: apt-get install python3-torch. Tests never run this; they read the committed JSON.
set -euo pipefail
cd "$(dirname "$0")"
PY=/usr/bin/python3
"$PY" -c 'import torch' 2>/dev/null || { echo "install Debian's python3-torch first" >&2; exit 1; }
for gen in gen_*.py; do
  echo "== $gen"
  "$PY" "$gen"
done
