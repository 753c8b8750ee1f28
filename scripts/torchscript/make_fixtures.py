#!/usr/bin/env python3
"""Writes the TorchScript fixtures of tests/jit (tests/fixtures/torchscript/): a small CNN, an
MLP and a CNN with BatchNorms, each scripted (torch.jit.script) and traced (torch.jit.trace), with fixed seeds.

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


class BnCnn(nn.Module):
    """torchvision-style Conv-BN-ReLU blocks (a conv without bias, one with, a Conv1d-BN1d), a
    BatchNorm after a Linear that stays float, and a bare parameter read elementwise."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.mix = nn.Conv1d(16, 8, 3, padding=1, bias=False)
        self.mix_bn = nn.BatchNorm1d(8)
        self.gain = nn.Parameter(torch.rand(8, 1) + 0.5)
        self.fc = nn.Linear(8 * 7 * 7, 10)
        self.head_bn = nn.BatchNorm1d(10)
        # Running statistics as after training, so folding has something to fold.
        for bn in (self.stem[1], self.block[1], self.mix_bn, self.head_bn):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)
            bn.num_batches_tracked.fill_(100)

    def forward(self, x):
        x = self.block(self.stem(x))
        x = torch.relu(self.mix_bn(self.mix(x.flatten(2)))) * self.gain
        return self.head_bn(self.fc(x.flatten(1)))


def write_safetensors(path, tensors):
    """The safetensors layout (8-byte header length, JSON header, raw little-endian bytes) by hand:
    the Python safetensors package is not a Debian package here."""
    import json
    import struct
    dtypes = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_recipe_data(out, model):
    """cnn_bn_data.safetensors: 384 random images and, as labels, the float model's own top-1
    class, so a quantized model's accuracy on it is its top-1 agreement with the float model."""
    torch.manual_seed(1)
    inputs = torch.randn(384, 1, 14, 14)
    with torch.no_grad():
        labels = model(inputs).argmax(1)
    write_safetensors(os.path.join(out, "cnn_bn_data.safetensors"), {"inputs": inputs, "labels": labels})


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "fixtures", "torchscript")
    os.makedirs(out, exist_ok=True)
    for name, cls, example in (("cnn", SmallCnn, torch.randn(2, 1, 14, 14)),
                               ("mlp", Mlp, torch.randn(4, 32)),
                               ("cnn_bn", BnCnn, torch.randn(2, 1, 14, 14))):
        torch.manual_seed(0)
        model = cls().eval()
        torch.jit.script(model).save(os.path.join(out, name + "_scripted.pt"))
        torch.jit.trace(model, example).save(os.path.join(out, name + "_traced.pt"))
        if name == "cnn_bn":
            write_recipe_data(out, model)
    print("wrote", out)


if __name__ == "__main__":
    main()
