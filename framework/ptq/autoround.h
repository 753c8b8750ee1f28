// AutoRound (Cheng et al. 2023, "Optimize Weight Rounding via Signed Gradient Descent for the
// Quantization of LLMs"): per transformer block, every Linear's rounding offsets V ∈ [−0.5, 0.5]
// and per-group clipping factors α, β ∈ [0.5, 1] are trained with signed gradient descent so the
// quantized block reproduces the float block's output.
//
//   per (row, group) of w:  mx = max(max w, 0) · α,  mn = min(min w, 0) · β
//     asymmetric: s = max((mx − mn) / (qmax − qmin), ε),  z = clamp(qmin − round(mn / s), qmin, qmax)
//     symmetric:  s = max(max(mx, −mn) / ((qmax − qmin) / 2), ε),  z = the qtype's symmetric zero point
//     (4-bit and qint3 scales rounded up to float16, as the weight quantizer stores them)
//   ŵ = s · (clamp(round(w · (1/s) + V) + z, qmin, qmax) − z)   (w · (1/s) in float32, as fake-quant)
//   loss = mean ‖block_q(x_q) − block_f(x_f)‖²,  p ← clamp(p − lr_t · sign(∂loss/∂p)),  lr_t = lr (1 − t / T)
//
// round() passes gradients straight through. The grid is the weight quantizer's min/max formula on
// w clamped to [mn, mx] (weight_minmax_qparams), so freeze packs the codes like any solver's.
// Tensor and block level here; solve() (framework/ptq/ptq.h, method "autoround") drives the blocks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "framework/core/qparams.h"

namespace qforge::nn {
class LinearImpl;
}

namespace qforge::ptq {

struct AutoRoundOptions {
  int64_t iterations = 200;  // SignSGD steps per block (the paper's default)
  double lr = 0;             // step at iteration 0, decaying linearly to 0 (0: 1 / iterations, as auto-round)
  int64_t batch_size = 8;    // sequences per step (all when fewer)
  double min_clip = 0.5;     // α, β ∈ [min_clip, 1]
  uint64_t seed = 0;
};

// One Linear's trainable rounding: V [N, K], α and β [N, groups] (per-channel: one group per row).
struct AutoRoundVars {
  at::Tensor v, alpha, beta;
};
// V = 0, α = β = 1: round-to-nearest on the weight's own min/max grid.
AutoRoundVars autoround_init(const at::Tensor& w, const QSpec& spec);

// ŵ above for w [N, K], differentiable in V, α and β. Integer grids, per-channel (axis 0) or per-group.
at::Tensor autoround_weight(const at::Tensor& w, const AutoRoundVars& vars, const QSpec& spec);
// The grid ŵ lies on, as the weight quantizer computes it from w clamped to [mn, mx] per group.
QParams autoround_grid(const at::Tensor& w, const AutoRoundVars& vars, const QSpec& spec);
// s · (clamp(round(w / s + V) + z, qmin, qmax) − z) on a given grid (no autograd): the weight written back.
at::Tensor round_with_offset(const at::Tensor& w, const at::Tensor& v, const QParams& grid);

struct AutoRoundBlockResult {
  std::vector<AutoRoundVars> vars;     // the best iterate, per layer
  std::vector<QParams> grids;          // per layer: its weight's grid
  std::vector<at::Tensor> weights;     // per layer: the rounded weight [N, K] on that grid
  double first_loss = 0;               // mean squared output error at iteration 0 (round-to-nearest)
  double best_loss = 0;                // of the kept iterate (on its step's sequences)
  double last_loss = 0;                // of the last step's iterate (before its update)
  int64_t best_iteration = 0;
};

// Trains the rounding of `layers` (the block's quantized Linears, weight grids not fixed) so that
// forward(x) matches target: x [S, T, H] the block's inputs through the quantized blocks before it,
// target the float block's outputs on the float inputs. The layers' weights are not changed (their
// weight quantizers are bypassed during the steps and restored). on_step runs after every step.
AutoRoundBlockResult autoround_block(const std::function<at::Tensor(const at::Tensor&)>& forward,
                                     const std::vector<nn::LinearImpl*>& layers, const at::Tensor& x,
                                     const at::Tensor& target, const AutoRoundOptions& options,
                                     const std::function<void()>& on_step = {});

}  // namespace qforge::ptq
