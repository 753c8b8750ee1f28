// ImatrixCollector: Σ x², Σ x and rows per Linear input, accumulated in float64.
#include "framework/ptq/imatrix.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include "framework/core/error.h"
#include "framework/nn/linear.h"
#include "framework/ptq/awq.h"
#include "framework/ptq/layer_access.h"

namespace qforge::ptq {

ImatrixCollector::ImatrixCollector(const torch::nn::Module& model) {
  std::vector<QuantizableLayer*> linears;
  for (const auto& [path, layer] : quantizable_layers(model))
    if (layer->module().as<nn::LinearImpl>()) {
      linears.push_back(layer);
      path_of_[layer] = path;  // float layers have no path of their own
    }
  taps_ = std::make_unique<ScopedInputTaps>(linears, [this](QuantizableLayer& l, const at::Tensor& x) {
    const at::Tensor rows = x.detach().reshape({-1, x.size(-1)}).to(at::kDouble);
    const std::string& path = path_of_.at(&l);
    ImatrixEntry& e = m_[path];
    if (!at::isfinite(rows).all().item<bool>()) {
      nonfinite_.push_back(path);
      return;
    }
    const at::Tensor sq = rows.pow(2).sum(0), s = rows.sum(0);
    e.sum_sq = e.sum_sq.defined() ? e.sum_sq + sq : sq;
    e.sum = e.sum.defined() ? e.sum + s : s;
    e.count += rows.size(0);
  });
}

ImatrixCollector::~ImatrixCollector() = default;

Imatrix ImatrixCollector::take() {
  taps_.reset();
  QF_REQUIRE(nonfinite_.empty(), "imatrix: the inputs of ", nonfinite_.front(), " held NaN or inf (",
             nonfinite_.size(), " calls)");
  Imatrix out;
  for (auto& [path, e] : m_)
    if (e.count > 0) out.emplace(path, std::move(e));
  m_.clear();
  return out;
}

namespace {

// Clipping ratios and shrink grid as AWQ's clipping search (AutoAWQ's defaults).
constexpr int64_t kClipGrid = 20;
constexpr double kMaxShrink = 0.5;

double weighted_error(const at::Tensor& w, const at::Tensor& wq, const at::Tensor& a) {
  const double den = (w.to(at::kDouble).pow(2) * a.to(at::kDouble)).sum().item<double>();
  const double num = ((wq - w).to(at::kDouble).pow(2) * a.to(at::kDouble)).sum().item<double>();
  return den == 0 ? 0.0 : num / den;
}

// Why a layer keeps its plain RTN grid (empty: it is searched).
std::string unfit(const QuantizableLayer& l, const Imatrix& imatrix, const std::string& path, int64_t K) {
  if (!l.quantized() || !l.scheme().weights) return "float weights";
  const QSpec& spec = l.scheme().weights->spec;
  if (!spec.qtype.is_integer()) return std::string("weights are ") + spec.qtype.name + " (integer grids only)";
  if (spec.granularity == Granularity::kPerTensor) return "per-tensor grid";
  if (l.frozen()) return "frozen";
  if (l.weight_quantizer()->calibrated()) return "weight grid already fixed";
  const auto it = imatrix.find(path);
  if (it == imatrix.end()) return "not in the imatrix (not reached by calibration)";
  if (it->second.sum_sq.numel() != K)
    return "imatrix has " + std::to_string(it->second.sum_sq.numel()) + " features, the layer " + std::to_string(K);
  return "";
}

}  // namespace

at::Tensor imatrix_importance(const ImatrixEntry& e) {
  QF_REQUIRE(e.count > 0 && e.sum_sq.defined(), "imatrix: an entry without rows");
  return (e.sum_sq / static_cast<double>(e.count)).to(at::kFloat);
}

at::Tensor imatrix_weights(const at::Tensor& w, const at::Tensor& importance, const at::Tensor& row_mean_sq) {
  const at::Tensor w2 = w.to(at::kFloat).pow(2);
  QF_REQUIRE(!row_mean_sq.defined() || (row_mean_sq.numel() == w.size(0)), "imatrix: row_mean_sq must hold ",
             w.size(0), " values");
  const at::Tensor sigma2 = row_mean_sq.defined() ? row_mean_sq.to(at::kFloat).reshape({w.size(0), 1}) : w2.mean(1, true);
  return importance.to(at::kFloat).reshape({1, w.size(1)}) * (sigma2 + w2).sqrt();
}

at::Tensor imatrix_search_clip(const at::Tensor& w, const QSpec& spec, const at::Tensor& importance,
                               const at::Tensor& row_mean_sq) {
  QF_REQUIRE(w.defined() && w.dim() == 2, "imatrix: weight must be [N, K]");
  QF_REQUIRE(importance.defined() && importance.numel() == w.size(1) && at::isfinite(importance).all().item<bool>() &&
                 (importance >= 0).all().item<bool>(),
             "imatrix: importance must hold ", w.size(1), " finite values >= 0");
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t g = spec.granularity == Granularity::kPerGroup ? spec.group_size : K;
  const at::Tensor a = imatrix_weights(w, importance, row_mean_sq);
  return search_clip_ratios(w, spec, kClipGrid, kMaxShrink, [&](const at::Tensor& delta) {
    return (delta.pow(2) * a).reshape({N, K / g, g}).sum(-1);
  });
}

std::map<std::string, std::string> imatrix_round_leaves(const std::vector<LayerSolve>& plan,
                                                        const std::vector<std::string>& clipped_by_awq) {
  std::map<std::string, std::string> leave;
  for (const std::string& p : clipped_by_awq) leave.emplace(p, kLeftToAwq);
  for (const LayerSolve& ls : plan) {
    if (ls.method.rfind("gptq", 0) == 0) leave.emplace(ls.path, kLeftToGptq);
    if (ls.method.rfind("autoround", 0) == 0) leave.emplace(ls.path, kLeftToAutoRound);
  }
  return leave;
}

ImatrixRoundReport imatrix_round(torch::nn::Module& model, const Imatrix& imatrix,
                                 const std::map<std::string, std::string>& leave) {
  const auto t0 = std::chrono::steady_clock::now();
  ImatrixRoundReport rep;
  at::NoGradGuard no_grad;
  for (const auto& [path, layer] : quantizable_layers(model)) {
    auto* lin = layer->module().as<nn::LinearImpl>();
    if (!lin) continue;
    std::string why = unfit(*layer, imatrix, path, lin->options.in_features());
    if (why.empty() && leave.count(path)) why = leave.at(path);
    if (!why.empty()) {
      if (layer->quantized()) rep.skipped.push_back(path + ": " + why);
      continue;
    }
    const QSpec& spec = layer->scheme().weights->spec;
    const at::Tensor imp = imatrix_importance(imatrix.at(path));
    const at::Tensor w = lin->weight.detach().to(at::kFloat);
    ImatrixRoundLayer l;
    l.path = path;
    const at::Tensor a = imatrix_weights(w, imp);
    l.error_before = weighted_error(w, awq_round(w, spec), a);
    const at::Tensor ratio = imatrix_search_clip(w, spec, imp);
    const at::Tensor wc = awq_apply_clip(w, ratio, spec);
    l.error_after = weighted_error(w, awq_round(wc, spec), a);
    l.mean_clip = ratio.mean().item<double>();
    lin->weight.detach().copy_(wc.to(lin->weight.scalar_type()));
    rep.layers.push_back(l);
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

ImatrixRoundReport imatrix_round(torch::nn::Module& model, const Imatrix& imatrix,
                                 const std::vector<std::string>& clipped_by_awq) {
  return imatrix_round(model, imatrix, imatrix_round_leaves({}, clipped_by_awq));
}

}  // namespace qforge::ptq
