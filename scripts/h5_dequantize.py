#!/usr/bin/env python3
"""Rebuild float weights from a qforge checkpoint with h5py and numpy only (no qforge).

The layout and the formula are in docs/formats.md:

    float = (q - zero_point) * scale        (float32, scale/zero_point broadcast per tensor,
                                             per channel along `axis`, or per group of
                                             `group_size` elements along the last dimension)
    float = codebook[..., q]                 (k-means qtypes: float16 levels per channel/group)
    float = e2m1(q) * X                      (mxfp4: X = 2^(scale - 127); nvfp4: X = e4m3(scale)
                                             * tensor_scale, one float32 product; per block of
                                             `group_size` along the last dimension)

Usage:
    h5_dequantize.py CHECKPOINT                 list every parameter/buffer with shape and range
    h5_dequantize.py CHECKPOINT -o weights.npz  save all of them as float arrays (npz)
    h5_dequantize.py CHECKPOINT --expect REF.h5 compare bit for bit with REF.h5, a file holding one
                                                float32 dataset per key (tests/io: io_test_tool
                                                dequantize writes it with qforge)
Exit status 77 when h5py or numpy is missing (ctest reports the test as skipped).
"""
import argparse
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"h5_dequantize.py: SKIPPED, {e} (Debian: apt-get install python3-h5py)")
    sys.exit(77)


def text(value):
    """Attribute strings are fixed-length UTF-8; h5py may hand them back as bytes."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8")
    return str(value)


def unpack(data, bits, signed, n):
    """Dense sub-byte packing, low bits first: value i is bit field (i % per_byte) * bits of byte
    i // per_byte, two's complement when signed."""
    data = np.asarray(data, dtype=np.uint8)
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    fields = [(data >> (k * bits)) & mask for k in range(per_byte)]
    values = np.stack(fields, axis=1).reshape(-1)[:n].astype(np.int32)
    if signed:
        sign = 1 << (bits - 1)
        values = (values ^ sign) - sign
    return values


def broadcast(p, granularity, axis, group_size, shape):
    p = np.asarray(p)
    if granularity == "per_tensor":
        return p.reshape(())
    if granularity == "per_channel":
        view = [1] * len(shape)
        view[axis] = shape[axis]
        return p.reshape(view)
    if granularity == "per_group":
        return np.repeat(p, group_size, axis=-1)
    raise ValueError(f"unknown granularity {granularity!r}")


def dequantize_codebook(group, shape, bits):
    """k-means qtypes (qkmeans4/3/2): unsigned level indices (4-bit fields, 2-bit for qkmeans2) and
    float16 levels `codebook` of the scale shape plus 2^bits: float = codebook[..., code]."""
    a = group.attrs
    n = int(np.prod(shape, dtype=np.int64))
    q = unpack(group["data"][()].reshape(-1), 2 if bits == 2 else 4, False, n).reshape(shape)
    cb = group["codebook"][()].astype(np.float32)
    levels = cb.shape[-1]
    granularity = text(a["granularity"])
    if granularity == "per_tensor":
        return cb.reshape(levels)[q]
    if granularity == "per_channel":
        axis = int(a["axis"])
        moved = np.moveaxis(q, axis, 0)
        w = np.take_along_axis(cb.reshape(shape[axis], levels), moved.reshape(shape[axis], -1), axis=1)
        return np.moveaxis(w.reshape(moved.shape), 0, axis)
    if granularity == "per_group":
        g = int(a["group_size"])
        return np.take_along_axis(cb.reshape(-1, levels), q.reshape(-1, g), axis=1).reshape(shape)
    raise ValueError(f"unknown granularity {granularity!r}")


# E2M1 codes 0..15 (bit 3 the sign).
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e4m3_decode(b):
    """OCP E4M3 bytes (bias 7, subnormals m * 2^-9, no infinities, 0x7f / 0xff NaN) to float32."""
    b = np.asarray(b).astype(np.int32)
    e, m = (b >> 3) & 15, b & 7
    v = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.exp2(e - 10.0))  # exact in float64 and float32
    v = np.where(b & 128, -v, v).astype(np.float32)
    return np.where((b & 127) == 127, np.float32(np.nan), v)


def dequantize_microscaling(group, shape, qtype):
    """mxfp4 / nvfp4: E2M1 codes two per byte (low nibble first), one uint8 scale per block."""
    n = int(np.prod(shape, dtype=np.int64))
    codes = unpack(group["data"][()].reshape(-1), 4, False, n).reshape(shape)
    sb = group["scale"][()]
    if qtype == "mxfp4":
        x = np.ldexp(np.ones(sb.shape, np.float32), sb.astype(np.int32) - 127)  # E8M0
    else:
        x = e4m3_decode(sb) * np.float32(group["tensor_scale"][()])  # one float32 product
    return E2M1[codes] * np.repeat(x.astype(np.float32), int(group.attrs["group_size"]), axis=-1)


def dequantize(group):
    a = group.attrs
    shape = tuple(int(d) for d in a["shape"])
    bits = int(a["bits"])
    qtype = text(a["qtype"])
    if qtype.startswith("qkmeans"):
        return dequantize_codebook(group, shape, bits)
    if qtype in ("mxfp4", "nvfp4"):
        return dequantize_microscaling(group, shape, qtype)
    if bits == 3:
        bits = 4  # qint3 is stored in 4-bit fields, exactly as qint4 (docs/formats.md)
    signed = bool(int(a["signed"]))
    packing = text(a["packing"])
    expected_packing = "none" if bits == 8 else "row_major_low_bits_first"
    if packing != expected_packing:
        raise ValueError(f"{group.name}: unknown packing {packing!r}")
    n = int(np.prod(shape, dtype=np.int64))
    data = group["data"][()]
    if bits == 8:  # one value per element, int8 (qint8) or uint8 (quint8), already shaped
        q = data.astype(np.int32).reshape(shape)
    else:
        q = unpack(data.reshape(-1), bits, signed, n).reshape(shape)
    granularity = text(a["granularity"])
    axis = int(a["axis"])
    group_size = int(a["group_size"])
    scale = broadcast(group["scale"][()].astype(np.float32), granularity, axis, group_size, shape)
    zero_point = broadcast(group["zero_point"][()].astype(np.int32), granularity, axis, group_size, shape)
    # The subtraction is exact in int32; one float32 multiply, as qforge computes it.
    return (q - zero_point).astype(np.float32) * scale


def entries(f, section):
    """(key, dataset-or-quantized-group) for every entry of /parameters or /buffers."""
    if section not in f:
        return
    for name, obj in sorted(f[section].items()):
        if isinstance(obj, h5py.Dataset) or "encoding" in obj.attrs:
            yield name, obj
            continue
        for leaf, child in sorted(obj.items()):  # a module group: <module path>/<name>
            yield f"{name}.{leaf}", child


def load(path):
    out = {}
    with h5py.File(path, "r") as f:
        if text(f.attrs.get("format", "")) != "qforge.checkpoint":
            raise SystemExit(f"{path}: not a qforge checkpoint")
        version = int(f.attrs["format_version"])
        if version > 1:
            raise SystemExit(f"{path}: format_version {version} is newer than this script (1)")
        for section in ("parameters", "buffers"):
            for key, obj in entries(f, section):
                if isinstance(obj, h5py.Group):
                    out[(section, key)] = dequantize(obj)
                elif text(obj.attrs.get("torch_dtype", "")) == "bool":
                    out[(section, key)] = obj[()] != 0  # bool tensors are stored as uint8
                else:
                    out[(section, key)] = obj[()]  # bfloat16 tensors are stored as float32
    return out


def bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("-o", "--output", help="write every float array to this .npz")
    ap.add_argument("--expect", help="HDF5 file with one float32 dataset per parameter key")
    args = ap.parse_args()
    weights = load(args.checkpoint)
    if args.output:
        np.savez(args.output, **{f"{s}/{k}": v for (s, k), v in weights.items()})
    if args.expect:
        failures = 0
        with h5py.File(args.expect, "r") as ref:
            for key in ref:
                got = weights.get(("parameters", key))
                want = ref[key][()]
                if got is None or not bits_equal(np.asarray(got, dtype=want.dtype), want):
                    print(f"MISMATCH {key}")
                    failures += 1
            print(f"h5_dequantize.py: {len(ref) - failures}/{len(ref)} parameters match qforge bit for bit")
        return 1 if failures else 0
    if not args.output:
        for (section, key), v in weights.items():
            v = np.asarray(v)
            rng = f"[{v.min()}, {v.max()}]" if v.size and v.dtype != np.bool_ else ""
            print(f"{section:10s} {key:32s} {str(v.dtype):8s} {list(v.shape)} {rng}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
