// QuantizedTensor: the one quantized-tensor type of qforge. A weight after freeze(), a quantized
// entry of a checkpoint and the input of the kernels' packing are all this: integer (or fp8) codes
// in packed storage plus the scale and zero point that map them back to float,
//
//   float = (q - zero_point) * scale                    (integer grids)
//   float = decode_float8(code) * scale                 (float8 grids)
//
// with scale/zero_point broadcast per tensor, per channel along spec.axis, or per group of
// spec.group_size consecutive elements along the last dimension. Layout: docs/formats.md.
//   float = codebook[..., code]                         (codebook grids: qkmeans4/3/2)
// Codebook grids store b-bit level indices (nibbles for 4 and 3 bits, 2-bit fields for 2) and the
// float16 levels, [qparam shape..., 2^bits]; they have no scale or zero point.
//   float = decode_e2m1(code) * decode_e8m0(scale)                    (mxfp4)
//   float = decode_e2m1(code) * (decode_e4m3(scale) * tensor_scale)   (nvfp4)
// Microscaling grids store E2M1 codes as nibbles and one scale byte per block (E8M0 or E4M3
// codes, uint8 of the QParams shape), plus nvfp4's float32 tensor scale; no zero point.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "framework/core/qparams.h"

namespace qforge {

// Packing orders (the `packing` attribute of a checkpoint's quantized entry).
// 8-bit grids: one value per byte, tensor of the original shape (int8 for qint8, uint8 for quint8
// and the float8 grids).
inline constexpr const char* kPackingNone = "none";
// 4- and 2-bit grids: values in row-major order of the original shape, packed densely into a 1-d
// uint8 tensor, low bits first: value i is the bit field (i % per_byte) * bits of byte
// i / per_byte, two's complement for signed grids. Same order as kernels/cpu pack_*_reference.
inline constexpr const char* kPackingLowBitsFirst = "row_major_low_bits_first";

struct QuantizedTensor {
  // qtype, granularity, axis (non-negative for per-channel, 0 otherwise), group_size (0 unless
  // per-group). Range and symmetry flags are kept in memory; checkpoints do not record them.
  QSpec spec;
  std::vector<int64_t> shape;  // the float tensor's shape
  at::Tensor data;             // packed codes (see the packing orders above); undefined when a
                               // kernel object holds the only copy (frozen Linear)
  at::Tensor scale;            // float32, the QParams shape
  at::Tensor zero_point;       // int32, the QParams shape
  at::Tensor codebook;         // codebook grids only: float16, codebook_shape (undefined otherwise)
  at::Tensor tensor_scale;     // nvfp4 only: float32, 0-dim

  bool defined() const { return scale.defined() || codebook.defined(); }
  const QType& qtype() const { return spec.qtype; }
  QParams qparams() const;
  const char* packing() const { return spec.qtype.bits < 8 ? kPackingLowBitsFirst : kPackingNone; }
  int64_t numel() const;
  // Bytes of data + scale + zero_point + codebook + tensor_scale (what model_size counts for a frozen weight).
  int64_t bytes() const;
  // Throws qforge::Error (prefixed with `who`) unless dtypes, shapes and packed size agree.
  void validate(const std::string& who) const;
  // The integer values with the original shape: uint8 for quint8, codebook indices and E2M1
  // codes (microscaling grids), int8 otherwise.
  at::Tensor int_values() const;
  // The float tensor the codes stand for, float32 of the original shape; equals fake_quantize of
  // the tensor quantize_tensor() was given, bit for bit.
  at::Tensor dequantize() const;
};

// Quantizes float `w` under `qp` (any qtype): q = clamp(rint(w * (1 / scale)) + zero_point, qmin,
// qmax) for integer grids, fp8 codes of round_to_float8(w / scale) for float8 grids, the nearest
// level's index (codebook_assign) for codebook grids, then packs.
// dequantize() of the result equals fake_quantize(w, qp) bit for bit.
QuantizedTensor quantize_tensor(const at::Tensor& w, const QParams& qp);

// Packs integer `values` (any integer dtype, every value inside qp.spec.qtype's range; E2M1 codes
// 0..15 for microscaling grids) with the scale and zero point (or codebook, or block scales) of
// `qp`. Integer, codebook and microscaling grids.
QuantizedTensor pack_quantized(const at::Tensor& values, const QParams& qp);

// Assembles a QuantizedTensor from its parts (a checkpoint's datasets, a kernel's codes): the spec
// is stored in its normal form (non-negative channel axis) and everything is validated.
QuantizedTensor make_quantized(const QParams& qp, std::vector<int64_t> shape, at::Tensor data);

}  // namespace qforge
