// AWQ's two searches on tensors: the activation-aware scale (α grid) and the clipping ratios.
#include "framework/ptq/awq.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantizer.h"
#include "framework/core/error.h"

namespace qforge::ptq {

namespace {

// mean|x| below this counts as this (AutoAWQ's clamp), so a silent channel gets a finite scale.
constexpr double kMinScale = 1e-4;

void check_rows(const at::Tensor& x, int64_t K, const char* who) {
  QF_REQUIRE(x.defined() && x.dim() == 2 && x.size(0) > 0 && x.size(1) == K, who, ": inputs must be [rows, ", K,
             "], got ", x.defined() ? x.sizes() : at::IntArrayRef{});
  QF_REQUIRE(at::isfinite(x).all().item<bool>(), who, ": inputs hold NaN or inf");
}

void check_weight(const at::Tensor& w, const char* who) {
  QF_REQUIRE(w.defined() && w.dim() == 2 && w.numel() > 0, who, ": weight must be a non-empty [N, K] matrix, got ",
             w.defined() ? w.sizes() : at::IntArrayRef{});
  QF_REQUIRE(at::isfinite(w).all().item<bool>(), who, ": weight holds NaN or inf");
}

// Columns per clipping block: the weight group, or the whole row on a per-channel grid.
int64_t clip_block(const QSpec& spec, int64_t K, const char* who) {
  QF_REQUIRE(spec.granularity != Granularity::kPerTensor, who,
             ": a per-tensor grid is shared by every row, so clipping is not searched per block");
  if (spec.granularity == Granularity::kPerChannel) return K;
  QF_REQUIRE(spec.group_size > 0 && K % spec.group_size == 0, who, ": K = ", K, " is not a multiple of group_size ",
             spec.group_size);
  return spec.group_size;
}

// Σ over rows of x of (x_g · δ_g)² per (output row, block g): [N, G].
at::Tensor block_error(const at::Tensor& x, const at::Tensor& blocks_h, const at::Tensor& delta, int64_t g) {
  const int64_t N = delta.size(0), G = delta.size(1) / g;
  if (blocks_h.defined()) {
    // δ_gᵀ H_g δ_g with H_g = X_gᵀ X_g: [G, N, g] · [G, g, g].
    const at::Tensor d = delta.reshape({N, G, g}).permute({1, 0, 2});
    return (at::bmm(d, blocks_h) * d).sum(-1).t();
  }
  return at::matmul(x, delta.t()).pow(2).sum(0).unsqueeze(1);  // one block per row
}

}  // namespace

double awq_group_error(const at::Tensor& x, const std::vector<at::Tensor>& w, const std::vector<at::Tensor>& wq) {
  QF_REQUIRE(w.size() == wq.size(), "awq: ", w.size(), " weights against ", wq.size(), " quantized ones");
  double num = 0, den = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const at::Tensor y = at::matmul(x, w[i].t()).to(at::kDouble);
    num += (at::matmul(x, wq[i].t()).to(at::kDouble) - y).pow(2).sum().item<double>();
    den += y.pow(2).sum().item<double>();
  }
  return den == 0 ? (num == 0 ? 0.0 : std::numeric_limits<double>::infinity()) : num / den;
}

at::Tensor awq_round(const at::Tensor& w, const QSpec& spec) {
  return fake_quantize(w, weight_minmax_qparams(w, spec, "awq"));
}

const std::vector<std::string>& awq_scales_names() {
  static const std::vector<std::string> kNames = {"activation", "duo", "both"};
  return kNames;
}
const std::vector<std::string>& awq_objective_names() {
  static const std::vector<std::string> kNames = {"layer", "block"};
  return kNames;
}
AwqScales parse_awq_scales(const std::string& name) {
  const auto& n = awq_scales_names();
  const auto it = std::find(n.begin(), n.end(), name);
  QF_REQUIRE(it != n.end(), "awq: unknown scales '", name, "' (activation, duo or both)");
  return static_cast<AwqScales>(it - n.begin());
}
AwqObjective parse_awq_objective(const std::string& name) {
  const auto& n = awq_objective_names();
  const auto it = std::find(n.begin(), n.end(), name);
  QF_REQUIRE(it != n.end(), "awq: unknown objective '", name, "' (layer or block)");
  return static_cast<AwqObjective>(it - n.begin());
}

at::Tensor awq_weight_mean(const std::vector<at::Tensor>& weights, const std::vector<QSpec>& specs) {
  QF_REQUIRE(!weights.empty() && specs.size() == weights.size(), "awq: one grid per weight expected, got ",
             specs.size(), " for ", weights.size());
  std::vector<at::Tensor> rows;
  for (size_t i = 0; i < weights.size(); ++i) {
    check_weight(weights[i], "awq");
    const at::Tensor a = weights[i].to(at::kFloat).abs();
    const int64_t N = a.size(0), K = a.size(1);
    if (specs[i].granularity == Granularity::kPerTensor) {
      rows.push_back(a / (a.max() + 1e-6));
      continue;
    }
    const int64_t g = clip_block(specs[i], K, "awq");
    const at::Tensor a3 = a.reshape({N, K / g, g});
    rows.push_back((a3 / (a3.amax(-1, true) + 1e-6)).reshape({N, K}));
  }
  return at::cat(rows, 0).mean(0);
}

AwqScaleSearch awq_search_scale(const at::Tensor& x_mean_abs, const std::vector<at::Tensor>& weights,
                                const std::vector<QSpec>& specs, const AwqOptions& o, const AwqScaleError& error) {
  QF_REQUIRE(!weights.empty(), "awq: no weights to scale");
  QF_REQUIRE(specs.size() == weights.size(), "awq: one grid per weight expected, got ", specs.size(), " for ",
             weights.size());
  QF_REQUIRE(o.grid > 0, "awq: grid must be > 0, got ", o.grid);
  for (const at::Tensor& w : weights) check_weight(w, "awq");
  const int64_t K = weights[0].size(1);
  for (const at::Tensor& w : weights)
    QF_REQUIRE(w.size(1) == K, "awq: the weights reading one input must share K = ", K, ", got ", w.sizes());
  QF_REQUIRE(x_mean_abs.defined() && x_mean_abs.numel() == K, "awq: mean |x| must have ", K, " entries");
  QF_REQUIRE(at::isfinite(x_mean_abs).all().item<bool>(), "awq: inputs hold NaN or inf");
  std::vector<at::Tensor> w32;
  for (const at::Tensor& w : weights) w32.push_back(w.to(at::kFloat));
  auto rounded = [&](const at::Tensor& s) {
    std::vector<at::Tensor> wq;
    for (size_t i = 0; i < w32.size(); ++i)
      wq.push_back(awq_round(w32[i] * s.unsqueeze(0), specs[i]) / s.unsqueeze(0));
    return wq;
  };
  const at::Tensor m = x_mean_abs.to(at::kDouble).reshape({K});
  const bool duo = o.scales != AwqScales::kActivation, activation = o.scales != AwqScales::kDuo;
  const at::Tensor w_mean = duo ? awq_weight_mean(w32, specs).to(at::kDouble) : at::Tensor();
  AwqScaleSearch best;
  best.scale = at::ones({K});
  best.error_rtn = best.error_scaled = error(rounded(best.scale));
  auto consider = [&](const at::Tensor& c, double alpha, bool is_duo) {
    at::Tensor s = c.clamp_min(kMinScale);
    s = s / (s.max() * s.min()).sqrt();
    if (!at::isfinite(s).all().item<bool>()) return;  // AutoAWQ sets such entries to 1; a candidate less here
    s = s.to(at::kFloat);
    const double e = error(rounded(s));
    if (e < best.error_scaled) best = {s, alpha, is_duo, best.error_rtn, e};
  };
  for (int64_t k = 0; k < o.grid; ++k) {
    const double alpha = static_cast<double>(k) / static_cast<double>(o.grid);
    if (activation && k > 0) consider(m.pow(alpha), alpha, false);
    if (duo) consider(m.pow(alpha) / (w_mean.pow(1 - alpha) + kMinScale), alpha, true);
  }
  return best;
}

AwqScaleSearch awq_search_scale(const at::Tensor& x, const at::Tensor& x_mean_abs, const std::vector<at::Tensor>& weights,
                                const std::vector<QSpec>& specs, const AwqOptions& o) {
  QF_REQUIRE(!weights.empty(), "awq: no weights to scale");
  for (const at::Tensor& w : weights) check_weight(w, "awq");
  check_rows(x, weights[0].size(1), "awq");
  const at::Tensor xs = x.to(at::kFloat);
  std::vector<at::Tensor> y;
  double den = 0;
  for (const at::Tensor& w : weights) {
    QF_REQUIRE(w.size(1) == xs.size(1), "awq: the weights reading one input must share K = ", xs.size(1), ", got ",
               w.sizes());
    y.push_back(at::matmul(xs, w.to(at::kFloat).t()));
    den += y.back().to(at::kDouble).pow(2).sum().item<double>();
  }
  return awq_search_scale(x_mean_abs, weights, specs, o, [&](const std::vector<at::Tensor>& wq) {
    double num = 0;
    for (size_t i = 0; i < wq.size(); ++i)
      num += (at::matmul(xs, wq[i].t()) - y[i]).to(at::kDouble).pow(2).sum().item<double>();
    return den == 0 ? (num == 0 ? 0.0 : std::numeric_limits<double>::infinity()) : num / den;
  });
}

at::Tensor search_clip_ratios(const at::Tensor& w, const QSpec& spec, int64_t grid, double max_shrink,
                              const ClipError& error) {
  check_weight(w, "clip search");
  QF_REQUIRE(grid > 0 && max_shrink >= 0 && max_shrink < 1, "clip search: grid must be > 0 and max_shrink in [0, 1)");
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t g = clip_block(spec, K, "clip search"), G = K / g;
  const at::Tensor w32 = w.to(at::kFloat);
  const at::Tensor amax = w32.abs().reshape({N, G, g}).amax(-1, true);
  at::Tensor best_ratio = at::ones({N, G}), best_err;
  const auto steps = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(grid) * max_shrink)));
  for (int64_t i = 0; i < steps; ++i) {
    const double r = 1.0 - static_cast<double>(i) / static_cast<double>(grid);
    const at::Tensor lim = amax * r;
    const at::Tensor wc = at::maximum(at::minimum(w32.reshape({N, G, g}), lim), -lim).reshape({N, K});
    const at::Tensor err = error(awq_round(wc, spec) - w32);
    QF_CHECK(err.dim() == 2 && err.size(0) == N && err.size(1) == G);
    if (!best_err.defined()) {
      best_err = err;
      continue;
    }
    const at::Tensor better = err < best_err;
    best_err = at::where(better, err, best_err);
    best_ratio = at::where(better, at::full_like(best_ratio, r), best_ratio);
  }
  return best_ratio;
}

at::Tensor awq_search_clip(const at::Tensor& x, const at::Tensor& w, const QSpec& spec, const AwqOptions& o) {
  check_weight(w, "awq clip");
  const int64_t K = w.size(1);
  check_rows(x, K, "awq clip");
  const int64_t g = clip_block(spec, K, "awq clip"), G = K / g;
  const at::Tensor xs = x.to(at::kFloat);
  at::Tensor blocks_h;
  if (G > 1) {
    const at::Tensor xg = xs.reshape({xs.size(0), G, g}).permute({1, 0, 2});  // [G, n, g]
    blocks_h = at::bmm(xg.transpose(1, 2), xg);
  }
  return search_clip_ratios(w, spec, o.clip_grid, o.max_shrink,
                            [&](const at::Tensor& delta) { return block_error(xs, blocks_h, delta, g); });
}

at::Tensor awq_apply_clip(const at::Tensor& w, const at::Tensor& ratio, const QSpec& spec) {
  check_weight(w, "awq clip");
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t g = clip_block(spec, K, "awq clip"), G = K / g;
  QF_REQUIRE(ratio.defined() && ratio.dim() == 2 && ratio.size(0) == N && ratio.size(1) == G,
             "awq clip: ratios must be [", N, ", ", G, "], got ", ratio.defined() ? ratio.sizes() : at::IntArrayRef{});
  const at::Tensor w3 = w.reshape({N, G, g});
  const at::Tensor lim = w3.abs().amax(-1, true) * ratio.to(w.scalar_type()).unsqueeze(-1);
  return at::maximum(at::minimum(w3, lim), -lim).reshape({N, K});
}

}  // namespace qforge::ptq
