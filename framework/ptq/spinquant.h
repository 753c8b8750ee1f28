// Learned rotations of a Llama-family model (SpinQuant, Liu et al. 2024, arXiv 2405.16406): the
// residual-stream rotation R1 and each layer's value rotation R2 that rotate() fixed as random
// Hadamard matrices are trained on calibration text to lower the quantized model's loss, then
// folded into the weights like the Hadamard ones (the float model computes the same logits).
//
// Starting point: a model rotate() turned (RMSNorm weights folded to ones, stream x·Q, values
// v·H_Dᵀ per head), quantize()d but not calibrated, solved or frozen. Learned on top of it, with
// U1 [hidden, hidden] and U2_l [head_dim, head_dim] orthogonal, starting at the identity:
//
//   stream readers (q/k/v/gate/up_proj, lm_head):  W <- W·U1        embed_tokens: E <- E·U1
//   stream writers (o_proj, down_proj):            W <- U1ᵀ·W,      b <- b·U1
//   values of layer l, per key/value head h:       v_proj rows of h <- U2_lᵀ·W_h, b_h <- b_h·U2_l
//                                                  o_proj columns of each head <- W_h·U2_l
//
// so the stream is x·Q·U1 (SpinQuant's R1 = Q·U1) and the cached values v·H_Dᵀ·U2_l (R2 = H_Dᵀ·U2_l).
// The online Hadamards (down_proj's input, queries and keys) stay as rotate() set them (SpinQuant's
// R3 and R4 are Hadamard too).
//
// Training, as SpinQuant's optimize_rotation: each step takes calibration batch (step mod batches),
// runs the quantized model's loss (`loss`: next-token cross-entropy in qtrain) forward and backward
// with the weights set from the current U's, and moves each U by one Cayley step on the orthogonal
// group (Li, Zhang & Todorovic 2020, SpinQuant's SGDG with momentum 0):
//
//   G = ∂loss/∂U                   (the weights' gradients carried back through the fold above)
//   W = ½ (UᵀG − GᵀU)              (skew-symmetric)
//   α = min(lr_t, 1 / ‖W‖₁)         lr_t = lr · ½ (1 + cos(π · step / steps))  (cosine, no warm-up)
//   U <- U · (I − α/2 · W) · (I + α/2 · W)⁻¹
//
// solved exactly in double (SpinQuant approximates the inverse with five fixed-point iterations and
// re-orthogonalises by QR at random), so every U stays orthogonal to rounding. Because the step
// multiplies U on the right, learning U on the Hadamard-rotated model takes the same steps as
// learning SpinQuant's R1 = Q·U1 and R2 = H_Dᵀ·U2 from their Hadamard starting points.
//
// While learning, weights are fake-quantized only with quantized_weights (SpinQuant learns against
// W16 when GPTQ rounds the weights afterwards, against RTN weights otherwise); dynamic per-token
// activations and a dynamic KV cache are fake-quantized as the scheme says, with straight-through
// gradients; static activations pass through (they are calibrated afterwards, on the learned model).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace qforge::ptq {

struct SpinQuantOptions {
  int64_t steps = 100;             // Cayley steps (SpinQuant: 100)
  double lr = 1.5;                 // peak step length, cosine-decayed to 0 (SpinQuant: 1.5)
  bool values = true;              // learn R2 as well as R1
  bool quantized_weights = false;  // fake-quantize the weights while learning (false: W16)
  bool progress = true;            // a progress line with the loss and an ETA (stderr)
};

struct SpinQuantReport {
  int64_t steps = 0, batches = 0, hidden_size = 0, head_dim = 0, layers = 0;
  bool values = false, quantized_weights = false;
  std::vector<double> losses;       // the training loss of each step (before its update)
  std::vector<double> r1_steps;     // the α U1's Cayley step took at each step
  int64_t bounded_steps = 0;        // steps where U1's α was 1 / ‖W‖₁ rather than lr_t
  double loss_before = 0;           // mean loss over the `batches` with the Hadamard rotations
  double loss_after = 0;            // the same with the learned ones
  double float_loss_before = 0;     // the float model's loss on batch 0 (quantizers passed through),
  double float_loss_after = 0;      //   before and after: a rotation leaves the float function alone
  double orthogonality_error = 0;   // max over U1, U2_l of max |UᵀU − I|
  double rotation_change = 0;       // ‖U1 − I‖_F / sqrt(hidden): how far R1 moved from the Hadamard one
  double value_rotation_change = 0; // the largest ‖U2_l − I‖_F / sqrt(head_dim) (0 without `values`)
  // learn_rotations_distilled only: ‖y − y0‖ / ‖y0‖ of the float outputs on batch 0 after and before
  // (rounding only, ~1e-6); -1 where not measured.
  double float_output_change = -1;
  double seconds = 0;
};

// The loss of calibration batch b: a scalar with autograd through the model.
using LossBatch = std::function<at::Tensor(int64_t b)>;

// Learns U1 and U2 on `batches` calibration batches and folds them into the model's weights.
// Throws qforge::Error, leaving the model untouched, for a model other than LlamaForCausalLM, one
// whose RMSNorm weights are not all ones (run rotate() first), a tied head, a frozen layer, a
// weight whose grid is fixed (solved or loaded: the rotation would leave it stale), codebook weights
// to be fake-quantized while learning (their levels are fitted once), a Linear with a pre_quant_scale
// (SmoothQuant / AWQ: it does not commute with a rotation of the input), a calibrated static
// activation, a static KV cache, steps < 1, batches < 1, lr ≤ 0. A loss that is not finite stops
// learning with an error and restores the weights. (With float weights, no dynamic activations
// and a float cache, a loss of the model's outputs is the float model's, which no rotation changes:
// qtrain's recipe check refuses that combination.)
SpinQuantReport learn_rotations(torch::nn::Module& model, int64_t batches, const LossBatch& loss,
                                const SpinQuantOptions& options = {});

// The model's output on calibration batch b (logits [..., vocab]), with autograd.
using OutputBatch = std::function<at::Tensor(int64_t b)>;

// learn_rotations against the KL divergence of the quantized model's predictions from the float
// model's, per position: KL(p_float ‖ p_quantized) = Σ_v p_float,v · (log p_float,v − log p_quantized,v)
// over the last dimension (log-softmax of each output), averaged over positions; the float outputs
// come from the same call with every quantizer passed through and the KV cache float, once per
// step (a second forward, without autograd). A departure from SpinQuant, which learns on the
// next-token cross-entropy: the KL leaves out the text's own entropy, whose gradient noise is large
// next to a small quantization error.
SpinQuantReport learn_rotations_distilled(torch::nn::Module& model, int64_t batches, const OutputBatch& output,
                                          const SpinQuantOptions& options = {});

// One Cayley step of U (square, orthogonal, double) against the gradient G: the formula above.
// `step` receives the α taken.
at::Tensor cayley_step(const at::Tensor& U, const at::Tensor& G, double lr, double* step = nullptr);

}  // namespace qforge::ptq
