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
  // [K], >= 0 (e.g. the imatrix's E[x²]): each grid's range is searched as the imatrix grid search
  // searches it (framework/ptq/imatrix.h imatrix_search_clip: per row and group the clipping ratio
  // r ∈ {1, 0.95, …, 0.55} minimising Σ_k a_nk (Q(clamp(w, ±r·max|w|)) − w)_nk², a_nk = imp_k ·
  // sqrt(σ_n² + w_nk²), σ_n² the mean square of the starting row) on the columns the grid is computed from,
  // while the codes round the unclamped columns and the clipping error spreads like any rounding
  // error (AutoGPTQ's searched grids, weighted). The solve also runs on the plain min/max grids and
  // the result is whichever of the two has the lower output error tr(ΔHΔᵀ): never worse than the
  // min/max grids on H's inputs. Integer per-channel / per-group grids only.
  at::Tensor clip_importance;
};

struct GptqResult {
  at::Tensor weight;   // [N, K] float: dequantized codes, (q - z) · s
  QParams qparams;     // the grid the codes lie on, in `spec`'s shape
  double damp = 0;     // the damping that was used (raised ×10 when H was not positive definite)
  // With clip_importance only (0 otherwise): tr(ΔHΔᵀ) / tr(WHWᵀ) with Δ = W − weight, the layer's
  // relative output error on H's inputs (in the solver's precision); whether the searched grids
  // won; the other candidate's error.
  double error = 0;
  bool grids_searched = false;
  double error_other = 0;
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
