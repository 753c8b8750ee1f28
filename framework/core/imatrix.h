// The importance matrix (llama.cpp's "imatrix"): per Linear layer, over every input row x its
// weight multiplied during calibration, Σ x_k² per input feature k (the diagonal of XᵀX), Σ x_k
// and the row count. E[x_k²] = sum_sq / count weighs the rounding error of weight column k: it
// is the diagonal of the layer's output-error Hessian. Collected by framework/ptq/imatrix.h,
// stored in calibration dumps (framework/io), written as llama.cpp's file (framework/format).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace qforge {

struct ImatrixEntry {
  at::Tensor sum_sq;  // [K] float64, Σ x²
  at::Tensor sum;     // [K] float64, Σ x
  int64_t count = 0;  // rows
};

// Module path -> entry.
using Imatrix = std::map<std::string, ImatrixEntry>;

}  // namespace qforge
