// QuantizedTensor: a weight as stored in a quantized checkpoint -- its integer values packed into
// bytes, the scale and zero point that map them back to float, and everything needed to do so
// without qforge (qtype, granularity, axis, group size, original shape, packing order).
//
//   float = (q - zero_point) * scale
//
// with scale/zero_point broadcast per tensor, per channel along `axis`, or per group of
// `group_size` consecutive elements along the last dimension. Layout: docs/formats.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "framework/core/qparams.h"

namespace qforge::io {

// Packing orders (the `packing` attribute of a checkpoint's quantized entry).
// 8-bit grids: one value per byte, dataset of the original shape (int8 for qint8, uint8 quint8).
inline constexpr const char* kPackingNone = "none";
// 4- and 2-bit grids: values in row-major order of the original shape, packed densely into a 1-d
// uint8 dataset, low bits first: value i is the bit field (i % per_byte) * bits of byte
// i / per_byte, two's complement for signed grids. Same order as kernels/cpu pack_*_reference.
inline constexpr const char* kPackingLowBitsFirst = "row_major_low_bits_first";

struct QuantizedTensor {
  QType qtype = qint8;
  Granularity granularity = Granularity::kPerTensor;
  int64_t axis = 0;        // per-channel: the channel dimension of `shape`
  int64_t group_size = 0;  // per-group: elements per group along the last dimension
  std::vector<int64_t> shape;  // the float tensor's shape
  at::Tensor data;        // packed values (see the packing orders above)
  at::Tensor scale;       // float32, the QParams shape
  at::Tensor zero_point;  // int32, the QParams shape

  const char* packing() const { return qtype.bits < 8 ? kPackingLowBitsFirst : kPackingNone; }
  int64_t numel() const;
  // Scale and zero point as QParams (narrow/reduce range and symmetry are not recorded).
  QParams qparams() const;
  // Throws qforge::Error (prefixed with `who`) unless dtypes, shapes and packed size agree.
  void validate(const std::string& who) const;
};

// Packs integer `values` (any integer dtype, every value inside qp.spec.qtype's range) with the
// scale and zero point of `qp`. Integer grids only.
QuantizedTensor pack_quantized(const at::Tensor& values, const QParams& qp);

// Quantizes float `w`: q = clamp(nearbyint(w * (1 / scale) + zero_point), quant_min, quant_max),
// round half to even as ATen's quantize_per_tensor, then packs.
QuantizedTensor quantize_tensor(const at::Tensor& w, const QParams& qp);

// The integer values with the original shape: uint8 for quint8, int8 otherwise.
at::Tensor unpack_values(const QuantizedTensor& q);

// (q - zero_point) * scale as float32 with the original shape, computed in float32 as
// (float(q - zero_point)) * scale.
at::Tensor dequantize(const QuantizedTensor& q);

// Broadcasts per-tensor/channel/group qparams `p` (scale or zero point) to `shape`.
at::Tensor expand_qparam(const at::Tensor& p, Granularity g, int64_t axis, int64_t group_size,
                         at::IntArrayRef shape);

}  // namespace qforge::io
