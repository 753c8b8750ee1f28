#!/usr/bin/python3
"""Writes the generated seeds of tests/fuzz/corpus/ (committed; rerun only to change them).

safetensors/: files in the layout qforge's serialize_safetensors writes (8-byte length, JSON
header padded with spaces to 8-byte alignment, tensors in key order).
idx/: tiny uint8 IDX files, gzip-compressed and plain (zlib reads both).
checkpoint/, calibration_dump/: small HDF5 files in HDF5's *earliest* object formats (no metadata
checksums, so mutations reach deeper than in qforge's own v1.10 files), written with h5py.
The committed fixtures tests/fixtures/*.h5 and the YAML recipes are added by scripts/fuzz itself.
"""
import gzip
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def out(reader, name, data):
    d = os.path.join(HERE, "corpus", reader)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw bytes), written in name order."""
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in sorted(tensors):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":"))
    h += " " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h.encode() + b"".join(blobs)


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def write_safetensors():
    out("safetensors", "float.safetensors", safetensors([
        ("fc.weight", "F32", [2, 3], f32(0.5, -1, 2, 3.25, 0, -0.125)),
        ("fc.bias", "F32", [2], f32(1, -1)),
        ("ln.weight", "F16", [2], struct.pack("<2e", 1.0, -2.0)),
        ("ln.bias", "BF16", [2], b"\x80\x3f\x00\xc0"),
        ("pos", "F64", [1], struct.pack("<d", 3.0)),
    ]))
    # What export_safetensors writes for a frozen layer: packed codes, scale, zero_point, metadata.
    quantized = {"fc": {"qtype": "qint4", "bits": 4, "granularity": "per_group", "axis": -1,
                        "group_size": 4, "packing": "row_major_low_bits_first", "shape": [2, 4],
                        "symmetric": True}}
    out("safetensors", "quantized.safetensors", safetensors([
        ("fc.weight", "U8", [4], bytes([0x10, 0x32, 0xf8, 0x7e])),
        ("fc.weight.scale", "F32", [2, 1], f32(0.25, 0.5)),
        ("fc.weight.zero_point", "I32", [2, 1], struct.pack("<2i", 0, 0)),
        ("fc.bias", "F32", [2], f32(0, 1)),
    ], {"format": "qforge.quantized", "qforge.quantized": json.dumps(quantized)}))
    out("safetensors", "ints.safetensors", safetensors([
        ("a", "I64", [2], struct.pack("<2q", -1, 1 << 40)),
        ("b", "I16", [1, 2], struct.pack("<2h", -3, 3)),
        ("c", "I8", [3], b"\x80\x00\x7f"),
        ("d", "BOOL", [2], b"\x00\x01"),
        ("e", "F32", [0, 4], b""),
        ("s", "F32", [], f32(7)),
    ]))
    out("safetensors", "empty.safetensors", safetensors([]))


def idx(dims, payload):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def write_idx():
    images = idx([2, 3, 3], bytes(range(0, 180, 10)))
    labels = idx([4], bytes([9, 0, 3, 7]))
    out("idx", "images.idx3.gz", gzip.compress(images, mtime=0))
    out("idx", "labels.idx1.gz", gzip.compress(labels, mtime=0))
    out("idx", "images.idx3", images)
    out("idx", "matrix.idx2.gz", gzip.compress(idx([2, 2], b"\x01\x02\x03\x04"), mtime=0))


def write_hdf5():
    try:
        import h5py
        import numpy as np
    except ImportError:
        print("make_seeds: no h5py; HDF5 seeds not written", file=sys.stderr)
        return

    def s(v):
        return np.bytes_(v)

    tmp = os.path.join(HERE, "corpus", ".tmp.h5")
    with h5py.File(tmp, "w", libver="earliest") as f:
        f.attrs["format"] = s("qforge.checkpoint")
        f.attrs["format_version"] = np.int64(1)
        f.attrs["qforge_version"] = s("0.1.0")
        f.attrs["step"] = np.int64(3)
        f.attrs["recipe"] = s("")
        f.attrs["optimizer_kind"] = s("")
        f["parameters/fc1/weight"] = np.arange(6, dtype=np.float32).reshape(2, 3)
        f["parameters/fc1/bias"] = np.zeros(2, dtype=np.float32)
        q = f.create_group("parameters/fc2/weight")
        for k, v in {"encoding": "quantized", "qtype": "qint8", "granularity": "per_tensor",
                     "packing": "none"}.items():
            q.attrs[k] = s(v)
        for k, v in {"bits": 8, "signed": 1, "quant_min": -128, "quant_max": 127, "axis": 0,
                     "group_size": 0}.items():
            q.attrs[k] = np.int64(v)
        q.attrs["shape"] = np.array([2, 2], dtype=np.int64)
        q["data"] = np.array([[1, -2], [3, -4]], dtype=np.int8)
        q["scale"] = np.float32(0.5)
        q["zero_point"] = np.int32(0)
        f["buffers/counter"] = np.zeros(2, dtype=np.int64)
    with open(tmp, "rb") as fh:
        out("checkpoint", "earliest_format.h5", fh.read())

    with h5py.File(tmp, "w", libver="earliest") as f:
        f.attrs["format"] = s("qforge.calibration")
        f.attrs["format_version"] = np.int64(1)
        f.attrs["qforge_version"] = s("0.1.0")
        p = f.create_group("fc1/input")
        for k, v in {"observer_kind": "minmax", "qtype": "qint8", "granularity": "per_tensor"}.items():
            p.attrs[k] = s(v)
        for k, v in {"bits": 8, "symmetric": 0, "narrow_range": 0, "reduce_range": 0,
                     "quant_min": -128, "quant_max": 127}.items():
            p.attrs[k] = np.int64(v)
        p["state/min"] = np.float32(-1)
        p["state/max"] = np.float32(2)
        p["state/count"] = np.int64(10)
        p["state/nonfinite_count"] = np.int64(0)
        p["qparams/scale"] = np.float32(3 / 255)
        p["qparams/zero_point"] = np.int32(-43)
        h = f.create_group("fc1/weight")
        for k, v in {"observer_kind": "histogram", "method": "l2", "qtype": "qint8",
                     "granularity": "per_tensor"}.items():
            h.attrs[k] = s(v)
        for k, v in {"bins": 8, "upsample_rate": 2, "bits": 8, "symmetric": 1, "narrow_range": 0,
                     "reduce_range": 0, "quant_min": -128, "quant_max": 127}.items():
            h.attrs[k] = np.int64(v)
        h["state/min"] = np.float32(-1)
        h["state/max"] = np.float32(1)
        h["state/histogram"] = np.array([0, 1, 2, 5, 5, 2, 1, 0], dtype=np.float32)
        h["state/count"] = np.int64(16)
        h["state/nonfinite_count"] = np.int64(0)
    with open(tmp, "rb") as fh:
        out("calibration_dump", "earliest_format.h5", fh.read())
    os.remove(tmp)


if __name__ == "__main__":
    write_safetensors()
    write_idx()
    write_hdf5()
