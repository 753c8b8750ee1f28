// The importance matrix in PTQ: its collection, which taps every Linear's input (as its weight
// multiplies it: after pre_quant_scale, before input fake-quant) while the model runs, e.g.
// during calibration; and the imatrix-weighted grid search of round-to-nearest (GPTQ runs the
// same search on its own columns: GptqOptions::clip_importance).
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/core/imatrix.h"
#include "framework/core/qparams.h"
#include "framework/ptq/ptq.h"

namespace qforge {
class QuantizableLayer;
}

namespace qforge::ptq {

class ScopedInputTaps;

class ImatrixCollector {
 public:
  // Taps every qforge Linear of `model` until destroyed (or take()).
  explicit ImatrixCollector(const torch::nn::Module& model);
  ~ImatrixCollector();
  ImatrixCollector(const ImatrixCollector&) = delete;
  ImatrixCollector& operator=(const ImatrixCollector&) = delete;

  // Stops collecting and returns what was seen. Throws qforge::Error when an input held NaN or
  // inf (naming the layer): a weighting from them would be meaningless.
  Imatrix take();

 private:
  std::unique_ptr<ScopedInputTaps> taps_;
  std::map<const QuantizableLayer*, std::string> path_of_;  // layer -> module path
  Imatrix m_;
  std::vector<std::string> nonfinite_;
};

// E[x²] per input feature, sum_sq / count, float32 [K].
at::Tensor imatrix_importance(const ImatrixEntry& e);

// The weight of each of w's [N, K] entries in the imatrix-weighted error, as llama.cpp's quantizers
// weigh their scale search (quantize_row_q4_0_impl): a_nk = imp_k · sqrt(σ_n² + w_nk²), with
// σ_n² = mean_k w_nk² over the row, or row_mean_sq [N, 1] when given (GPTQ searching a group of a
// row passes the whole row's). The sqrt(σ² + w²) factor keeps large weights from being clipped
// for the sake of many small ones. Returns [N, K] float32.
at::Tensor imatrix_weights(const at::Tensor& w, const at::Tensor& importance, const at::Tensor& row_mean_sq = {});

// Imatrix-weighted grid search of w's [N, K] round-to-nearest grid: per (row, block of the grid)
// the clipping ratio r ∈ {1, 0.95, …, 0.55} minimising Σ_k a_nk (Q(clamp(w, ±r·max|w|)) − w)_nk²,
// a = imatrix_weights(w, importance, row_mean_sq). Returns [N, K/g].
at::Tensor imatrix_search_clip(const at::Tensor& w, const QSpec& spec, const at::Tensor& importance,
                               const at::Tensor& row_mean_sq = {});

struct ImatrixRoundLayer {
  std::string path;
  double error_before = 0, error_after = 0;  // Σ a · (Q(w) − w)² / Σ a · w², before / after the search
  double mean_clip = 1;                      // mean chosen ratio
};
struct ImatrixRoundReport {
  std::vector<ImatrixRoundLayer> layers;
  std::vector<std::string> skipped;  // "path: reason"
  double seconds = 0;
};
// Clamps every quantized, unfrozen Linear whose weights lie on a per-channel / per-group integer
// grid not yet fixed, and which `imatrix` covers, to its searched ratios: the min/max grid of the
// clamped weight is the searched one, so RTN, AdaRound, BRECQ, fake-quant and freeze follow it.
// Layers in `leave` (path -> why, imatrix_round_leaves) are left as they are and listed as skipped
// with that reason.
ImatrixRoundReport imatrix_round(torch::nn::Module& model, const Imatrix& imatrix,
                                 const std::map<std::string, std::string>& leave = {});
// The earlier form: leaves the layers AWQ clipped only (imatrix_round_leaves({}, clipped_by_awq)).
ImatrixRoundReport imatrix_round(torch::nn::Module& model, const Imatrix& imatrix,
                                 const std::vector<std::string>& clipped_by_awq);

// The layers imatrix_round leaves, path -> why:
// - AWQ clipped them: AWQ searched its clipping on the group's full XᵀX, where the imatrix weighs
//   its diagonal only, and a second clamp on top of it compounds the two;
// - their planned rounding (plan_solve) is GPTQ, which searches its grids with the imatrix as it
//   rounds (GptqOptions::clip_importance), spreading the clipping error instead of losing it;
// - or AutoRound, which trains its own clipping (α, β) against the float block, whose output a
//   clamp would change.
// Its reasons, one home for the report and the qtrain line that counts them.
inline constexpr const char* kLeftToAwq = "AWQ searched its clipping on the full input covariance already";
inline constexpr const char* kLeftToGptq = "GPTQ searches its grids with the imatrix as it rounds";
inline constexpr const char* kLeftToAutoRound = "AutoRound trains its own clipping against the float block";
std::map<std::string, std::string> imatrix_round_leaves(const std::vector<LayerSolve>& plan,
                                                        const std::vector<std::string>& clipped_by_awq);

}  // namespace qforge::ptq
