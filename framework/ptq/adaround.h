// AdaRound (Nagel et al. 2020): learned rounding. Each weight rounds down or up on its fixed grid,
// chosen by a rectified-sigmoid variable trained to reproduce the layer's float output on
// calibration inputs, with a regulariser whose exponent β anneals from 20 to 2 to push every
// variable to 0 or 1. Tensor level only: framework/ptq/solve.cpp feeds it the layers of a model.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "framework/core/qparams.h"

namespace qforge::ptq {

struct AdaRoundOptions {
  int64_t iterations = 1000;  // Adam steps per layer
  double lr = 1e-2;           // Adam step size on the rounding variables
  double reg_weight = 0.01;   // λ of the rounding regulariser
  double beta_start = 20, beta_end = 2;
  double warmup = 0.2;        // fraction of iterations without the regulariser
  int64_t batch_rows = 256;   // input rows per step
  uint64_t seed = 0;
};

struct AdaRoundResult {
  at::Tensor weight;            // [N, K] float: (clamp(floor(w/s) + h + z) - z) · s with h ∈ {0, 1}
  double binary_fraction = 0;   // share of soft rounding values within 0.01 of 0 or 1 at the end
  double rounded_up = 0;        // share of weights rounded up
};

// The rectified sigmoid h(V) = clamp(σ(V)(ζ − γ) + γ, 0, 1), ζ = 1.1, γ = −0.1.
at::Tensor rectified_sigmoid(const at::Tensor& v);

// w: [N, K]; qp: its integer grid (per_tensor, per_channel axis 0 or per_group along K); x: [R, K]
// input rows as the weight multiplies them (quantized when the layer's input is); target:
// [R, N] the float layer's output without bias. Minimises ‖x·W̃ᵀ − target‖² summed over outputs,
// averaged over rows, + λ Σ (1 − |2h − 1|^β). Throws qforge::Error for float8 grids, bad shapes
// and options out of range.
AdaRoundResult adaround(const at::Tensor& w, const QParams& qp, const at::Tensor& x, const at::Tensor& target,
                        const AdaRoundOptions& options);

}  // namespace qforge::ptq
