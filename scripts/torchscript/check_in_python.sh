#!/bin/sh
# Loads the frozen TorchScript files torchscript_test wrote in Python, with qforge's shared library
# loaded through torch.ops.load_library, and checks their outputs equal qforge's frozen outputs.
#   check_in_python.sh <libqforge_torchscript.so> <folder of *_frozen.pt and *_io.pt>
# Exits 77 (ctest: skipped) when no python3 on PATH, nor /usr/bin/python3, imports torch.
for py in python3 /usr/bin/python3; do
  if "$py" -c "import torch" 2>/dev/null; then
    exec "$py" "$(dirname "$0")/check_in_python.py" "$@"
  fi
done
echo "skipped: no python3 imports torch (Debian: apt-get install python3-torch)"
exit 77
