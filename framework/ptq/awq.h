// AWQ (Lin et al. 2023, "Activation-aware Weight Quantization"): the weight columns that meet
// large inputs are scaled up before rounding, so they lose less to it, and the inputs scaled down
// by the same factors, so the float model computes the same function.
//
//   per group of Linear layers reading one input x (q/k/v, gate/up, o, down, a head), the scale
//   s = c / sqrt(max c · min c) among the candidates (identity first, then α ∈ {0, 1/20, …, 19/20})
//     activation (the paper):      c = max(mean|x|^α, 1e-4)           (α = 0 is the identity)
//     duo (AutoAWQ's duo_scaling): c = max(mean|x|^α / (w̄^(1−α) + 1e-4), 1e-4),
//       w̄_k = mean over the group's weight rows of |w_nk| / max|w| of its quantization block
//   minimising the objective's error of the group's weights rounded as Q(W_i diag s) diag s⁻¹
//   (Q: the layer's RTN grid; W'_i below):
//     layer: E(s) = Σ_i ‖X W'_iᵀ − X W_iᵀ‖² / Σ_i ‖X W_iᵀ‖²  over sampled input rows X
//     block: E(s) = ‖B(H; W') − B(H; W)‖² / ‖B(H; W)‖², B the transformer block holding the group,
//            run float on the hidden states H entering it (every other weight float): AutoAWQ's
//            "module to inspect", so q/k errors count through the attention they feed. Groups
//            outside a block (the head) and models without blocks use the layer objective.
//   then per layer, per (output row, weight group): the clipping ratio r ∈ {1, 0.95, …, 0.55}
//     minimising δᵀ H_g δ, δ = Q(clamp(w, ±r·max|w|)) − w, H_g = X_gᵀ X_g / n over the group's columns
//
// s⁻¹ goes where the model stays exact: into the preceding RMSNorm / LayerNorm weight (Llama's
// input_layernorm before q/k/v, post_attention_layernorm before gate/up; GPT-2's ln_1, ln_2), into
// the preceding Linear's output rows (v_proj before o_proj when their widths match, i.e. no
// grouped-query attention; up_proj before down_proj), otherwise into the Linear's pre_quant_scale.
// Runs after quantize() and before calibration; GPTQ (solve()) can round the scaled weights after.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "framework/core/qparams.h"
#include "framework/ptq/ptq.h"

namespace qforge::ptq {

// Which candidate scales the search tries (the identity always).
enum class AwqScales { kActivation, kDuo, kBoth };
// Where the search measures a group's error.
enum class AwqObjective { kLayer, kBlock };
// Names (recipe ptq.awq.scales: activation | duo | both; ptq.awq.objective: layer | block).
const std::vector<std::string>& awq_scales_names();
const std::vector<std::string>& awq_objective_names();
AwqScales parse_awq_scales(const std::string& name);
AwqObjective parse_awq_objective(const std::string& name);

struct AwqOptions {
  int64_t grid = 20;          // α ∈ {0, 1/grid, …, (grid − 1)/grid} (the paper's 20 points)
  AwqScales scales = AwqScales::kBoth;
  AwqObjective objective = AwqObjective::kBlock;
  bool clip = true;           // weight clipping search after the scales
  int64_t clip_grid = 20;     // clipping ratios 1 − i/clip_grid ...
  double max_shrink = 0.5;    // ... for i < clip_grid · max_shrink (AutoAWQ's defaults: down to 0.55)
  int64_t sample_rows = 4096; // input rows kept per group for the searches (mean |x| uses every row);
                              // the block objective runs the first batches holding this many tokens
  uint64_t seed = 0;
};

// Tensor level. x: [n, K] input rows; x_mean_abs: [K] mean |x| per input channel (over all rows);
// weights: the [N_i, K] weights reading x, weight i rounded on specs[i] by min/max (RTN).
struct AwqScaleSearch {
  at::Tensor scale;         // [K] s, ones when the identity wins
  double alpha = 0;
  bool duo = false;         // s is a duo candidate (at α = 0 too)
  double error_rtn = 0;     // E(1)
  double error_scaled = 0;  // E(s) <= error_rtn (the identity is a candidate)
};
AwqScaleSearch awq_search_scale(const at::Tensor& x, const at::Tensor& x_mean_abs, const std::vector<at::Tensor>& weights,
                                const std::vector<QSpec>& specs, const AwqOptions& options);
// The same search on any objective: error(W') for the group's rounded weights W'_i = Q(W_i s) / s.
using AwqScaleError = std::function<double(const std::vector<at::Tensor>& rounded)>;
AwqScaleSearch awq_search_scale(const at::Tensor& x_mean_abs, const std::vector<at::Tensor>& weights,
                                const std::vector<QSpec>& specs, const AwqOptions& options, const AwqScaleError& error);
// w̄ of the duo scales: [K], the mean over every row of `weights` of |w| / max|w| of its block
// (group, row, or whole tensor by its spec).
at::Tensor awq_weight_mean(const std::vector<at::Tensor>& weights, const std::vector<QSpec>& specs);

// Per (row, weight group) clipping ratio of w [N, K] (per-channel: one group per row), [N, K/g].
// Per-tensor grids are not separable by group: throws.
at::Tensor awq_search_clip(const at::Tensor& x, const at::Tensor& w, const QSpec& spec, const AwqOptions& options);
// The search AWQ's clipping runs (any weighting of δ can reuse it): per (row, block of
// the grid) the ratio r ∈ {1, 1 − 1/grid, …} (while i < grid · max_shrink) whose
// δ = Q(clamp(w, ±r·max|w|)) − w has the least error(δ) ([N, K] -> [N, K/g]).
using ClipError = std::function<at::Tensor(const at::Tensor& delta)>;
at::Tensor search_clip_ratios(const at::Tensor& w, const QSpec& spec, int64_t grid, double max_shrink,
                              const ClipError& error);
// w clamped to ±ratio · max|w| per (row, group).
at::Tensor awq_apply_clip(const at::Tensor& w, const at::Tensor& ratio, const QSpec& spec);
// The group's relative output error Σ_i ‖x wq_iᵀ − x w_iᵀ‖² / Σ_i ‖x w_iᵀ‖² (E above).
double awq_group_error(const at::Tensor& x, const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& wq);
// RTN on `spec` by the weight's min/max, as the weight quantizer rounds it.
at::Tensor awq_round(const at::Tensor& w, const QSpec& spec);

struct AwqGroup {
  std::vector<std::string> layers;  // the Linear layers reading one input (AWQ-quantized or not)
  std::string scale_home;           // the norm / Linear path s⁻¹ was folded into, or "pre_quant_scale"
  std::string objective;            // "layer", or the block whose output E measures ("block model.layers.0")
  double alpha = 0;
  bool duo = false;
  double error_rtn = 0, error_scaled = 0;  // E of the objective, RTN weights, before / after the scales
  // The layer objective's E after the scales, and after the clipping too (equal without clipping).
  double layer_error_scaled = 0, error_clipped = 0;
  double mean_clip = 1;  // mean clipping ratio over the searched (row, group) blocks (1: none clipped)
  std::vector<std::string> clipped;  // the layers whose clipping was searched (all but q/k and per-tensor grids)
  int64_t rows = 0;
  double seconds = 0;
  // The search chose scales (α > 0, or the duo family); otherwise the layers kept the identity.
  bool scaled() const { return alpha > 0 || duo; }
};

struct AwqReport {
  std::vector<AwqGroup> groups;      // forward order
  std::vector<std::string> skipped;  // "path: reason"
  double output_change = 0;          // relative change of the float model's output by the scales (batch 0)
  double seconds = 0;
};

// Every layer AWQ searched a clipping for (the imatrix grid search leaves them: imatrix_round).
std::vector<std::string> awq_clipped_layers(const AwqReport& report);

// AWQ over every quantized, unfrozen Linear whose weights lie on an integer grid not yet fixed.
// Throws when the float output moves by more than 1e-4 (relative) after the scales (undone then).
AwqReport awq(torch::nn::Module& model, int64_t batches, const RunBatch& run, const AwqOptions& options);

}  // namespace qforge::ptq
