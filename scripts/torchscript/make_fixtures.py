#!/usr/bin/env python3
"""Writes the TorchScript fixtures of tests/jit (tests/fixtures/torchscript/): a small CNN and an
MLP, each scripted (torch.jit.script) and traced (torch.jit.trace), with fixed seeds.

    python3 scripts/torchscript/make_fixtures.py [output folder]

Needs python3-torch (Debian). The C++ tests read the committed files, so they run without Python.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCnn(nn.Module):
    """Conv2d-ReLU-Conv2d-ReLU, a Conv1d over the flattened pixels, a Linear classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.mix = nn.Conv1d(16, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 7 * 7, 10)

    def forward(self, x):
        x = self.features(x)
        x = F.relu(self.mix(x.flatten(2)))
        return self.fc(x.flatten(1))


class Mlp(nn.Module):
    """Two Linear layers, a functional linear on a parameter, and a matmul qforge leaves float."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32, bias=False)
        self.head_weight = nn.Parameter(torch.randn(10, 32) * 0.1)
        self.mix = nn.Parameter(torch.randn(32, 32) * 0.1)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h))
        h = h + torch.matmul(h, self.mix)
        return F.linear(h, self.head_weight)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "fixtures", "torchscript")
    os.makedirs(out, exist_ok=True)
    for name, cls, example in (("cnn", SmallCnn, torch.randn(2, 1, 14, 14)),
                               ("mlp", Mlp, torch.randn(4, 32))):
        torch.manual_seed(0)
        model = cls().eval()
        torch.jit.script(model).save(os.path.join(out, name + "_scripted.pt"))
        torch.jit.trace(model, example).save(os.path.join(out, name + "_traced.pt"))
    print("wrote", out)


if __name__ == "__main__":
    main()
