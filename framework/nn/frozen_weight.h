// FrozenWeight: a weight after freeze(): integer (or fp8) codes in packed storage plus the qparams
// that dequantize them, (q - zero_point) * scale, exactly the values fake-quant produced.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "framework/core/qparams.h"

namespace qforge {

struct FrozenWeight {
  QParams qp;
  std::vector<int64_t> shape;  // the float weight's shape
  // Packed codes: int8 for 8-bit grids; two 4-bit fields per byte (low nibble first) for 4-bit;
  // four 2-bit fields per byte for qint2; OCP fp8 bytes for float8 grids. Undefined when a
  // kernel object owns the only copy.
  at::Tensor storage;

  bool defined() const { return qp.defined(); }
  // Bytes of storage + scale + zero_point.
  int64_t bytes() const;
  // Grid values (int8, original shape) / the float weight they stand for.
  at::Tensor int_values() const;
  at::Tensor dequantize() const;
};

// Quantizes `w` under `qp` into packed storage. dequantize() of the result equals
// fake_quantize(w, qp) bit for bit.
FrozenWeight freeze_weight(const at::Tensor& w, const QParams& qp);

// Packs int8 grid values (a [N, K] or any-shape tensor) for `qtype`; unpack is the inverse.
at::Tensor pack_codes(const at::Tensor& values, const QType& qtype);
at::Tensor unpack_codes(const at::Tensor& packed, const QType& qtype, const std::vector<int64_t>& shape);

}  // namespace qforge
