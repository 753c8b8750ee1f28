#!/usr/bin/env python3
"""Loads each <name>_frozen.pt of a folder in PyTorch with qforge's ops loaded and checks its output
on the stored input equals the stored output of qforge's frozen model (<name>_io.pt), bit for bit.

    check_in_python.py <libqforge_torchscript.so> <folder>
"""
import glob
import os
import sys

import torch


def main():
    library, folder = sys.argv[1], sys.argv[2]
    torch.ops.load_library(library)
    files = sorted(glob.glob(os.path.join(folder, "*_frozen.pt")))
    if not files:
        sys.exit("no *_frozen.pt in %s (torchscript_test writes them)" % folder)
    for path in files:
        model = torch.jit.load(path).eval()
        x, expected = torch.load(path[: -len("_frozen.pt")] + "_io.pt")
        with torch.no_grad():
            got = model(x)
        if not torch.equal(got, expected):
            sys.exit("%s: output differs from qforge's frozen model by %g" %
                     (path, (got - expected).abs().max().item()))
        print("%s: equal to qforge's frozen output %s" % (os.path.basename(path), tuple(got.shape)))


if __name__ == "__main__":
    main()
