"""Helpers for the golden-vector generators: PyTorch (Debian's python3-torch 1.13) is the oracle.

Tensors are written as {"shape", "dtype", "data"}; float32 values go through float() so the JSON
decimal is the exact double of the float32, and C++ reads them back bit for bit.
"""
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def tensor_json(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.float32:
        dtype, data = "float32", [float(v) for v in t.flatten().tolist()]
    elif t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        dtype, data = "int64", [int(v) for v in t.flatten().tolist()]
    elif t.dtype == torch.bool:
        dtype, data = "bool", [bool(v) for v in t.flatten().tolist()]
    else:
        raise ValueError(f"unsupported dtype {t.dtype}")
    return {"shape": list(t.shape), "dtype": dtype, "data": data}


def data_kinds(gen, shape):
    """Random, skewed, heavy-tailed and constant data: the distributions observers must handle."""
    return {
        "normal": torch.randn(shape, generator=gen),
        "skewed": torch.rand(shape, generator=gen) * 5.0 + 0.25,
        "heavy_tailed": torch.distributions.StudentT(torch.tensor(1.5)).sample(shape) * 0.5,
        "constant": torch.full(shape, 0.75),
    }


def write(name, obj):
    path = os.path.join(HERE, name)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
