// BRECQ (Li et al. 2021, "BRECQ: Pushing the Limit of Post-Training Quantization by Block
// Reconstruction"): AdaRound's rounding variables (framework/ptq/adaround.h) for every Linear of a
// transformer block, trained together so the quantized block reproduces the float block's output,
// each output element weighted by the diagonal Fisher information of the task loss:
//
//   per Linear, on its fixed grid (s, z):  W̃ = s · (clamp(⌊w/s⌋ + h(V) + z, qmin, qmax) − z)
//   loss = mean over tokens Σ_h F ⊙ (block_q(x_q) − block_f(x_f))²  +  λ Σ_layers Σ (1 − |2h(V) − 1|^β)
//   F = g² / mean(g²),  g = ∂(Σ_tokens task loss) / ∂(block output), taken on the float model
//
// Adam on V; β anneals from beta_start to beta_end after `warmup` (as AdaRound); the result rounds
// up where V >= 0. Tensor and block level here; solve() (method "brecq") drives the blocks and
// computes F (framework/ptq/block_reconstruction.cpp).
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

struct BrecqOptions {
  int64_t iterations = 500;   // Adam steps per block (the paper: 20000 per block on ImageNet models)
  double lr = 1e-2;           // Adam step size on the rounding variables (as AdaRound's default here)
  double reg_weight = 0.01;   // λ of the rounding regulariser (the paper's default)
  double beta_start = 20, beta_end = 2;
  double warmup = 0.2;        // share of iterations without the regulariser
  int64_t batch_size = 8;     // calibration sequences per step (all when fewer)
  bool fisher = true;         // weight the output error by the diagonal Fisher (false: plain MSE)
  uint64_t seed = 0;
};

struct BrecqBlockResult {
  std::vector<QParams> grids;           // per layer: its weight's grid (the weight quantizer's)
  std::vector<at::Tensor> weights;      // per layer: the hard-rounded weight [N, K] on that grid
  std::vector<double> binary_fraction;  // per layer: share of h(V) within 0.01 of 0 or 1 at the end
  std::vector<double> rounded_up;       // per layer: share of weights rounded up
  double first_loss = 0;                // reconstruction term at step 0 (soft weights start at the float weight)
  double last_loss = 0;                 // reconstruction term at the last step (soft weights)
};

// Trains the rounding of `layers` (the block's quantized Linears, weight grids not fixed) so that
// forward(x) matches target: x [S, T, H] the block's inputs through the quantized blocks before it,
// target [S, T, H] the float block's outputs on the float inputs, fisher [S, T, H] the weights F
// (undefined: 1). The layers' weights are not changed (their weight quantizers are bypassed during
// the steps and restored). on_step runs after every step. Throws qforge::Error for bad options,
// shapes, non-integer or per-tensor-less grids and a non-finite loss.
BrecqBlockResult brecq_block(const std::function<at::Tensor(const at::Tensor&)>& forward,
                             const std::vector<nn::LinearImpl*>& layers, const at::Tensor& x, const at::Tensor& target,
                             const at::Tensor& fisher, const BrecqOptions& options,
                             const std::function<void()>& on_step = {});

}  // namespace qforge::ptq
