// AdaRound: rectified-sigmoid rounding variables trained with Adam, annealed regulariser.
#include "framework/ptq/adaround.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cmath>

#include "framework/core/error.h"
#include "framework/api/quantizer.h"

namespace qforge::ptq {

namespace {
// The stretch of the rectified sigmoid (Louizos et al.), as in the AdaRound paper.
constexpr double kZeta = 1.1;
constexpr double kGamma = -0.1;
}  // namespace

at::Tensor rectified_sigmoid(const at::Tensor& v) {
  return at::clamp(at::sigmoid(v) * (kZeta - kGamma) + kGamma, 0.0, 1.0);
}

SoftRounding::SoftRounding(const at::Tensor& w_in, const QParams& qp) : n_(w_in.size(0)), k_(w_in.size(1)) {
  const QSpec& spec = qp.spec;
  const at::Tensor w = w_in.detach().to(at::kFloat);
  const at::Tensor wg = grouped(w, spec);
  s_ = broadcast_qparam(qp.scale.to(at::kFloat), w, spec);
  z_ = broadcast_qparam(qp.zero_point.to(at::kFloat), w, spec);
  qmin_ = static_cast<double>(spec.quant_min()), qmax_ = static_cast<double>(spec.quant_max());
  // w / s = base + rest, rest in [0, 1): the variables start where h(V) = rest (round to nearest
  // is h >= 0.5), so training starts from the float weight itself.
  const at::Tensor scaled = wg * at::reciprocal(s_);
  base_ = at::floor(scaled);
  const at::Tensor rest = (scaled - base_).clamp(1e-6, 1 - 1e-6);
  v_ = (-at::log((kZeta - kGamma) / (rest - kGamma) - 1)).detach().clone().set_requires_grad(true);
}

at::Tensor SoftRounding::weight_of(const at::Tensor& h) const {
  return ((at::clamp(base_ + h + z_, qmin_, qmax_) - z_) * s_).reshape({n_, k_});
}

at::Tensor SoftRounding::soft_weight() const { return weight_of(rectified_sigmoid(v_)); }

at::Tensor SoftRounding::hard_weight() const {
  at::NoGradGuard no_grad;
  return weight_of((v_ >= 0).to(at::kFloat)).contiguous();
}

at::Tensor SoftRounding::regularizer(double beta) const {
  return (1 - (2 * rectified_sigmoid(v_) - 1).abs().pow(beta)).sum();
}

double SoftRounding::binary_fraction() const {
  at::NoGradGuard no_grad;
  const at::Tensor h = rectified_sigmoid(v_.detach());
  return at::logical_or(h < 0.01, h > 0.99).to(at::kFloat).mean().item<double>();
}

double SoftRounding::rounded_up() const {
  at::NoGradGuard no_grad;
  return (v_ >= 0).to(at::kFloat).mean().item<double>();
}

double annealed_beta(int64_t t, int64_t iterations, double warmup, double beta_start, double beta_end) {
  const int64_t warm = static_cast<int64_t>(std::floor(warmup * static_cast<double>(iterations)));
  if (t < warm) return 0;
  const double rel = static_cast<double>(t - warm) / static_cast<double>(std::max<int64_t>(1, iterations - warm));
  return beta_end + (beta_start - beta_end) * std::max(0.0, 1.0 - rel);
}

AdaRoundResult adaround(const at::Tensor& w_in, const QParams& qp, const at::Tensor& x_in, const at::Tensor& target_in,
                        const AdaRoundOptions& o) {
  const QSpec& spec = qp.spec;
  QF_REQUIRE(spec.qtype.is_integer(), "adaround: rounds onto integer grids; ", spec.qtype.name,
             " has no round-up / round-down choice");
  QF_REQUIRE(w_in.defined() && w_in.dim() == 2 && w_in.numel() > 0, "adaround: weight must be a non-empty [N, K] matrix");
  const int64_t N = w_in.size(0), K = w_in.size(1);
  QF_REQUIRE(x_in.defined() && x_in.dim() == 2 && x_in.size(1) == K && x_in.size(0) > 0, "adaround: inputs must be [R, ",
             K, "] with R > 0, got ", x_in.defined() ? x_in.sizes() : at::IntArrayRef{});
  QF_REQUIRE(target_in.defined() && target_in.dim() == 2 && target_in.size(0) == x_in.size(0) && target_in.size(1) == N,
             "adaround: target must be [", x_in.size(0), ", ", N, "], got ",
             target_in.defined() ? target_in.sizes() : at::IntArrayRef{});
  QF_REQUIRE(at::isfinite(w_in).all().item<bool>() && at::isfinite(x_in).all().item<bool>() &&
                 at::isfinite(target_in).all().item<bool>(),
             "adaround: weight, inputs or target hold NaN or inf");
  QF_REQUIRE(o.iterations > 0 && o.batch_rows > 0, "adaround: iterations and batch_rows must be > 0");
  QF_REQUIRE(o.lr > 0 && o.reg_weight >= 0 && o.warmup >= 0 && o.warmup < 1 && o.beta_start >= o.beta_end &&
                 o.beta_end > 0,
             "adaround: needs lr > 0, reg_weight >= 0, 0 <= warmup < 1 and beta_start >= beta_end > 0");

  const at::Tensor x = x_in.detach().to(at::kFloat).contiguous();
  const at::Tensor target = target_in.detach().to(at::kFloat).contiguous();
  SoftRounding rounding(w_in, qp);

  at::AutoGradMode grad_on(true);  // the solvers call it under NoGradGuard
  torch::optim::Adam opt({rounding.v()}, torch::optim::AdamOptions(o.lr));
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  const int64_t R = x.size(0), bs = std::min(o.batch_rows, R);
  for (int64_t it = 0; it < o.iterations; ++it) {
    const at::Tensor idx = at::randint(R, {bs}, gen, at::TensorOptions().dtype(at::kLong));
    const at::Tensor xb = x.index_select(0, idx), tb = target.index_select(0, idx);
    const at::Tensor pred = at::matmul(xb, rounding.soft_weight().t());
    at::Tensor loss = (pred - tb).pow(2).sum(1).mean();
    const double beta = annealed_beta(it, o.iterations, o.warmup, o.beta_start, o.beta_end);
    if (beta > 0 && o.reg_weight > 0) loss = loss + o.reg_weight * rounding.regularizer(beta);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  at::NoGradGuard no_grad;
  AdaRoundResult r;
  r.weight = rounding.hard_weight();
  r.binary_fraction = rounding.binary_fraction();
  r.rounded_up = rounding.rounded_up();
  return r;
}

}  // namespace qforge::ptq
