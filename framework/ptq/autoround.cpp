// AutoRound: rounding offsets and clipping factors of a block's Linears trained by SignSGD.
#include "framework/ptq/autoround.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>

#include "framework/api/quantizer.h"
#include "framework/core/error.h"
#include "framework/nn/linear.h"
#include "framework/ptq/block_capture.h"

namespace qforge::ptq {

namespace {

void check_spec(const at::Tensor& w, const QSpec& spec) {
  QF_REQUIRE(w.dim() == 2, "autoround: weights are [N, K], got ", w.sizes());
  QF_REQUIRE(spec.qtype.is_integer(), "autoround: rounds onto integer grids, not ", spec.qtype.name);
  QF_REQUIRE(spec.granularity != Granularity::kPerTensor,
             "autoround: clips per output channel or weight group; a per-tensor grid is not separable");
  QF_REQUIRE(spec.granularity != Granularity::kPerChannel || spec.axis == 0 || spec.axis == -2,
             "autoround: per-channel grids along the output rows (axis 0), got axis ", spec.axis);
  QF_REQUIRE(spec.granularity != Granularity::kPerGroup || (spec.group_size > 0 && w.size(1) % spec.group_size == 0),
             "autoround: ", w.size(1), " columns are not a multiple of group_size ", spec.group_size);
}

// w [N, K] as [N, groups, columns per group] (per-channel: one group per row).
at::Tensor grouped3(const at::Tensor& w, const QSpec& spec) {
  if (spec.granularity == Granularity::kPerGroup) return w.reshape({w.size(0), -1, spec.group_size});
  return w.unsqueeze(1);
}

// round() forward, identity backward (the straight-through estimator).
at::Tensor round_ste(const at::Tensor& x) { return x + (at::round(x) - x).detach(); }

// Per (row, group) clipped range [mn, mx] of w, [N, G, 1].
std::pair<at::Tensor, at::Tensor> clipped_range(const at::Tensor& wg, const AutoRoundVars& vars) {
  const at::Tensor mx = at::clamp_min(std::get<0>(wg.max(-1, true)), 0) * vars.alpha.unsqueeze(-1);
  const at::Tensor mn = at::clamp_max(std::get<0>(wg.min(-1, true)), 0) * vars.beta.unsqueeze(-1);
  return {mn, mx};
}

AutoRoundVars detached_copy(const AutoRoundVars& v) {
  return {v.v.detach().clone(), v.alpha.detach().clone(), v.beta.detach().clone()};
}

}  // namespace

AutoRoundVars autoround_init(const at::Tensor& w, const QSpec& spec) {
  check_spec(w, spec);
  const int64_t groups = spec.granularity == Granularity::kPerGroup ? w.size(1) / spec.group_size : 1;
  const auto f = at::TensorOptions().dtype(at::kFloat).device(w.device());
  return {at::zeros(w.sizes(), f), at::ones({w.size(0), groups}, f), at::ones({w.size(0), groups}, f)};
}

at::Tensor autoround_weight(const at::Tensor& w, const AutoRoundVars& vars, const QSpec& spec) {
  check_spec(w, spec);
  const at::Tensor wg = grouped3(w.to(at::kFloat), spec);
  QF_REQUIRE(vars.v.sizes() == w.sizes() && vars.alpha.numel() == wg.size(0) * wg.size(1) &&
                 vars.beta.sizes() == vars.alpha.sizes(),
             "autoround: rounding variables do not match the weight ", w.sizes());
  const auto [mn, mx] = clipped_range(wg, vars);
  const double qmin = static_cast<double>(spec.quant_min()), qmax = static_cast<double>(spec.quant_max());
  at::Tensor s, z;
  if (spec.symmetric) {
    s = at::clamp_min(at::maximum(mx, -mn) / ((qmax - qmin) / 2), kScaleEps);
    // The symmetric zero point does not depend on the values: calculate_qparams' constant.
    z = calculate_qparams(at::zeros({1}), at::ones({1}), spec).zero_point.to(at::kFloat).to(w.device());
  } else {
    s = at::clamp_min((mx - mn) / (qmax - qmin), kScaleEps);
    // From the scale before its float16 rounding, as weight_minmax_qparams orders the two.
    z = at::clamp(qmin - round_ste(mn / s), qmin, qmax);
  }
  if (nibble_packed(spec.qtype)) s = s + (round_scale_up_to_half(s.detach()) - s.detach());
  // w · (1/s) in float32, as the fake-quant kernels divide: no offset is exactly round-to-nearest.
  const at::Tensor q = at::clamp(round_ste(wg * s.reciprocal() + grouped3(vars.v, spec)) + z, qmin, qmax);
  return (s * (q - z)).reshape(w.sizes());
}

QParams autoround_grid(const at::Tensor& w, const AutoRoundVars& vars, const QSpec& spec) {
  check_spec(w, spec);
  const at::Tensor wg = grouped3(w.detach().to(at::kFloat), spec);
  const auto [mn, mx] = clipped_range(wg, detached_copy(vars));
  // The clamped group's min and max are mn and mx: the quantizer's formula gives the clipped grid.
  return weight_minmax_qparams(at::minimum(at::maximum(wg, mn), mx).reshape(w.sizes()), spec, "autoround");
}

at::Tensor round_with_offset(const at::Tensor& w, const at::Tensor& v, const QParams& grid) {
  at::NoGradGuard no_grad;
  check_spec(w, grid.spec);
  QF_REQUIRE(v.sizes() == w.sizes(), "autoround: offsets ", v.sizes(), " do not match the weight ", w.sizes());
  const at::Tensor wg = grouped3(w.to(at::kFloat), grid.spec);
  const at::Tensor s = grid.scale.to(at::kFloat).reshape({wg.size(0), wg.size(1), 1});
  const at::Tensor z = grid.zero_point.to(at::kFloat).reshape({wg.size(0), wg.size(1), 1});
  const double qmin = static_cast<double>(grid.spec.quant_min()), qmax = static_cast<double>(grid.spec.quant_max());
  const at::Tensor q = at::clamp(at::round(wg * s.reciprocal() + grouped3(v.to(at::kFloat), grid.spec)) + z, qmin, qmax);
  return ((q - z) * s).reshape(w.sizes());
}

AutoRoundBlockResult autoround_block(const std::function<at::Tensor(const at::Tensor&)>& forward,
                                     const std::vector<nn::LinearImpl*>& layers, const at::Tensor& x,
                                     const at::Tensor& target, const AutoRoundOptions& o,
                                     const std::function<void()>& on_step) {
  QF_REQUIRE(o.iterations > 0, "autoround: iterations must be > 0, got ", o.iterations);
  QF_REQUIRE(o.batch_size > 0, "autoround: batch_size must be > 0, got ", o.batch_size);
  QF_REQUIRE(o.lr >= 0 && std::isfinite(o.lr), "autoround: lr must be >= 0 (0: 1 / iterations), got ", o.lr);
  QF_REQUIRE(o.min_clip > 0 && o.min_clip <= 1, "autoround: min_clip must be in (0, 1], got ", o.min_clip);
  QF_REQUIRE(!layers.empty(), "autoround: no layers to round");
  QF_REQUIRE(x.dim() >= 2 && x.size(0) == target.size(0), "autoround: inputs ", x.sizes(), " and targets ",
             target.sizes(), " hold different numbers of sequences");
  const double lr0 = o.lr > 0 ? o.lr : 1.0 / static_cast<double>(o.iterations);
  std::vector<at::Tensor> w, params;
  std::vector<QSpec> specs;
  std::vector<AutoRoundVars> vars;
  for (nn::LinearImpl* l : layers) {
    w.push_back(l->weight.detach().to(at::kFloat).clone());
    specs.push_back(l->weight_quantizer()->config().spec);
    vars.push_back(autoround_init(w.back(), specs.back()));
    for (at::Tensor* p : {&vars.back().v, &vars.back().alpha, &vars.back().beta}) params.push_back(p->requires_grad_(true));
  }
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  const int64_t S = x.size(0), bs = std::min(o.batch_size, S);
  AutoRoundBlockResult r;
  r.best_loss = std::numeric_limits<double>::infinity();
  std::vector<AutoRoundVars> best;
  at::AutoGradMode grad_on(true);
  for (int64_t t = 0; t < o.iterations; ++t) {
    const at::Tensor idx = bs < S ? at::randperm(S, gen, at::TensorOptions().dtype(at::kLong)).slice(0, 0, bs)
                                  : at::arange(S, at::TensorOptions().dtype(at::kLong));
    at::Tensor loss;
    {
      std::vector<at::Tensor> trained;
      for (size_t i = 0; i < layers.size(); ++i) trained.push_back(autoround_weight(w[i], vars[i], specs[i]));
      const ScopedBlockWeights swapped(layers, trained);
      loss = (forward(x.index_select(0, idx)).to(at::kFloat) - target.index_select(0, idx).to(at::kFloat)).pow(2).mean();
    }
    const double lv = loss.item<double>();
    QF_REQUIRE(std::isfinite(lv), "autoround: the block's output error is not finite at step ", t);
    if (t == 0) r.first_loss = lv;
    r.last_loss = lv;
    if (lv < r.best_loss) {
      best.clear();
      for (const AutoRoundVars& v : vars) best.push_back(detached_copy(v));
      r.best_loss = lv;
      r.best_iteration = t;
    }
    const std::vector<at::Tensor> grads = torch::autograd::grad({loss}, params, {}, false, false, /*allow_unused=*/true);
    {
      at::NoGradGuard no_grad;
      const double step = lr0 * (1.0 - static_cast<double>(t) / static_cast<double>(o.iterations));
      for (size_t i = 0; i < params.size(); ++i) {
        if (!grads[i].defined()) continue;
        params[i].sub_(step * at::sign(grads[i]));
        if (i % 3 == 0) params[i].clamp_(-0.5, 0.5);
        else params[i].clamp_(o.min_clip, 1.0);
      }
    }
    if (on_step) on_step();
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    r.grids.push_back(autoround_grid(w[i], best[i], specs[i]));
    r.weights.push_back(round_with_offset(w[i], best[i].v, r.grids.back()));
  }
  r.vars = std::move(best);
  return r;
}

}  // namespace qforge::ptq
