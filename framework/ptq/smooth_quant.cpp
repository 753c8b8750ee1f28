// SmoothQuant: per-input-channel factors move activation outliers into the weights.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "framework/core/error.h"
#include "framework/nn/linear.h"
#include "framework/ptq/float_view.h"
#include "framework/ptq/layer_access.h"
#include "framework/ptq/ptq.h"

namespace qforge::ptq {

namespace {
// Factors are kept inside [kMinFactor, 1/kMinFactor]: a channel that is all zero in the
// calibration data or in the weight gets no extreme factor.
constexpr double kMinFactor = 1e-5;
constexpr double kMinRange = 1e-5;
// Largest relative change of the float model's output the transform may cause (float rounding).
constexpr double kSmoothTolerance = 1e-4;

using Targets = std::vector<std::pair<std::string, nn::LinearImpl*>>;

// What a smoothed layer held before, to put back when the float output moved.
struct Undo {
  nn::LinearImpl* lin;
  at::Tensor weight, pre_quant_scale;
};

// The quantized, unfrozen Linear layers with quantized input activations; the others are reported skipped.
Targets smooth_targets(const torch::nn::Module& model, SmoothReport& rep) {
  Targets targets;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    auto* lin = layer->module().as<nn::LinearImpl>();
    if (!lin) continue;
    if (!layer->quantized() || layer->scheme().activations == ActivationMode::kNone) {
      if (layer->quantized()) rep.skipped.push_back(path + ": float input activations (nothing to smooth)");
      continue;
    }
    if (layer->frozen()) {
      rep.skipped.push_back(path + ": frozen");
      continue;
    }
    targets.emplace_back(path, lin);
  }
  return targets;
}

// Per-channel max |x| of every target's input over the calibration batches; y0 gets batch 0's output.
std::map<QuantizableLayer*, at::Tensor> input_amax(const Targets& targets, int64_t batches, const RunBatch& run,
                                                   at::Tensor& y0) {
  std::map<QuantizableLayer*, at::Tensor> amax;
  std::vector<QuantizableLayer*> tapped;
  for (const auto& [path, lin] : targets) tapped.push_back(lin);
  const ScopedInputTaps taps(tapped, [&amax](QuantizableLayer& l, const at::Tensor& x) {
    const at::Tensor a = x.detach().abs().reshape({-1, x.size(-1)}).amax(0).to(at::kFloat);
    at::Tensor& m = amax[&l];
    m = m.defined() ? at::maximum(m, a) : a;
  });
  for (int64_t b = 0; b < batches; ++b) {
    at::Tensor y = run(b);
    if (b == 0) y0 = y.detach().clone();
  }
  return amax;
}

// The warning for factors spanning more than kSmoothExtremeSpread, with advice by the side that
// spreads them: a^α spans (max a / min a)^α, 1 / max|W|^(1-α) spans (max w / min w)^(1-α).
std::string extreme_factors(const SmoothLayer& sl, double alpha, double act_spread, double weight_spread) {
  const bool weights = weight_spread >= act_spread;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s: SmoothQuant factors span %.3g to %.3g (%lld input channels floored at %g of the largest "
                "activation max); weight columns this unequal may not survive the weight grid. The %s drive the "
                "spread (activation part %.3g, weight part %.3g): try a %s alpha than %.2f",
                sl.path.c_str(), sl.min_factor, sl.max_factor, static_cast<long long>(sl.floored_channels),
                kSmoothActFloor, weights ? "weight columns (max |W| per input channel)" : "activation maxima",
                act_spread, weight_spread, weights ? "higher" : "lower", alpha);
  return buf;
}

// Moves the input range of one layer into its weight: W *= s per input channel, x /= s before
// quantizing; warns when the factors span more than kSmoothExtremeSpread.
SmoothLayer smooth_layer(const std::string& path, nn::LinearImpl* lin, const at::Tensor& amax, double alpha,
                         std::vector<Undo>& undo, std::vector<std::string>& warnings) {
  QF_REQUIRE(at::isfinite(amax).all().item<bool>(), "smooth_quant: ", path, ": calibration inputs hold NaN or inf");
  const double floor = std::max(kMinRange, kSmoothActFloor * amax.max().item<double>());
  const at::Tensor a = amax.clamp_min(floor).to(at::kDouble);
  const at::Tensor wmax = lin->weight.detach().abs().amax(0).clamp_min(kMinRange).to(at::kDouble);
  const at::Tensor s = (a.pow(alpha) / wmax.pow(1 - alpha)).clamp(kMinFactor, 1 / kMinFactor).to(at::kFloat);
  undo.push_back({lin, lin->weight.detach().clone(),
                  lin->pre_quant_scale().defined() ? lin->pre_quant_scale().clone() : at::Tensor()});
  const at::Tensor old = lin->pre_quant_scale().defined() ? lin->pre_quant_scale() : at::ones_like(s);
  lin->weight.mul_(s.unsqueeze(0));
  lin->set_pre_quant_scale(old / s);
  SmoothLayer sl;
  sl.path = path;
  sl.max_factor = s.max().item<double>();
  sl.min_factor = s.min().item<double>();
  sl.act_range_before = amax.max().item<double>();
  sl.act_range_after = (amax / s).max().item<double>();
  sl.floored_channels = (amax < floor).sum().item<int64_t>();
  if (sl.max_factor > kSmoothExtremeSpread * sl.min_factor) {
    const double act = std::pow((a.max() / a.min()).item<double>(), alpha);
    const double weight = std::pow((wmax.max() / wmax.min()).item<double>(), 1 - alpha);
    warnings.push_back(extreme_factors(sl, alpha, act, weight));
  }
  return sl;
}

void undo_smoothing(std::vector<Undo>& undo) {
  for (Undo& u : undo) {
    u.lin->weight.copy_(u.weight);
    u.lin->set_pre_quant_scale(u.pre_quant_scale.defined() ? u.pre_quant_scale : at::ones_like(u.lin->pre_quant_scale()));
  }
}

}  // namespace

SmoothReport smooth_quant(torch::nn::Module& model, int64_t batches, const RunBatch& run,
                          const SmoothQuantOptions& o) {
  QF_REQUIRE(o.alpha >= 0 && o.alpha <= 1, "smooth_quant: alpha must be in [0, 1], got ", o.alpha);
  QF_REQUIRE(batches > 0, "smooth_quant: needs at least one calibration batch");
  const auto t0 = std::chrono::steady_clock::now();
  SmoothReport rep;
  at::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const Targets targets = smooth_targets(model, rep);
  if (targets.empty()) {
    model.train(was_training);
    return rep;
  }
  FloatView float_view(model);
  at::Tensor y0;
  const std::map<QuantizableLayer*, at::Tensor> amax = input_amax(targets, batches, run, y0);
  QF_REQUIRE(y0.defined(), "smooth_quant: the calibration forward returned no output");
  std::vector<Undo> undo;
  for (const auto& [path, lin] : targets) {
    auto it = amax.find(lin);
    if (it == amax.end()) {
      rep.skipped.push_back(path + ": not reached by the model's forward on the calibration batches");
      continue;
    }
    rep.layers.push_back(smooth_layer(path, lin, it->second, o.alpha, undo, rep.warnings));
  }
  const at::Tensor y1 = run(0);
  rep.output_change = relative_change(y1, y0);
  if (!(rep.output_change <= kSmoothTolerance)) {
    undo_smoothing(undo);
    throw Error("smooth_quant: the float model's output changed by " + std::to_string(rep.output_change) +
                " (relative) after smoothing; undone (does a layer use its weight outside forward()?)");
  }
  model.train(was_training);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace qforge::ptq
