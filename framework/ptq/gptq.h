// GPTQ (Frantar et al. 2022): second-order weight rounding. Columns are quantized one at a time
// and each column's rounding error is spread over the columns not yet quantized, weighted by the
// inverse Hessian of the layer's squared output error, H = 2/n Σ x xᵀ over its calibration inputs.
// Tensor level only: framework/ptq/solve.cpp feeds it the layers of a model.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "framework/core/qparams.h"

namespace qforge::ptq {

struct GptqOptions {
  double damp = 0.01;        // λ = damp · mean(diag H) added to the diagonal (> 0)
  int64_t block_size = 128;  // columns updated together (lazy batch updates); results do not depend on it
  bool act_order = false;    // quantize columns in order of decreasing diag(H)
  // [K] with act_order: the order follows it instead of diag(H) (e.g. the calibration's imatrix,
  // E[x²] of the float model's inputs, where H sees inputs quantized upstream).
  at::Tensor column_importance;
};

struct GptqResult {
  at::Tensor weight;   // [N, K] float: dequantized codes, (q - z) · s
  QParams qparams;     // the grid the codes lie on, in `spec`'s shape
  double damp = 0;     // the damping that was used (raised ×10 when H was not positive definite)
};

// w: [N, K]; h: [K, K] (symmetric, positive semi-definite); spec: per_tensor, per_channel
// (axis 0) or per_group along K. Per-tensor and per-channel grids come from w's min/max;
// per-group grids from the group's columns as updated when the solver reaches the group (from the
// original w with act_order: the groups then hold columns quantized out of order). Every grid is
// the weight quantizer's own min/max formula (4-bit scales rounded up to float16), so the codes
// are what fake_quantize and the int4 kernels read. Throws qforge::Error for bad shapes, NaN/inf,
// options out of range, or an H that stays singular.
GptqResult gptq(const at::Tensor& w, const at::Tensor& h, const QSpec& spec, const GptqOptions& options);

// The unblocked algorithm in float64 (one column at a time, every later column updated at once):
// the test oracle of gptq().
GptqResult gptq_reference(const at::Tensor& w, const at::Tensor& h, const QSpec& spec, const GptqOptions& options);

}  // namespace qforge::ptq
