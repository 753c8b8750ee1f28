// Hutchinson's estimator against exact traces: a quadratic loss with known blocks, and a small
// MLP whose Hessian diagonal is computed column by column.
#include "framework/search/hessian.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "framework/core/error.h"

namespace qforge::search {
namespace {

TEST(Hutchinson, QuadraticLossBlockTracesWithin2Percent) {
  at::manual_seed(0);
  constexpr int64_t n1 = 24, n2 = 16;
  const at::Tensor r = at::randn({n1 + n2, n1 + n2}) * 0.05;
  const at::Tensor a = r + r.t() + at::diag(at::rand({n1 + n2}) * 4 + 1);  // symmetric, dominant diagonal
  const at::Tensor t1 = at::randn({n1}).requires_grad_(), t2 = at::randn({4, n2 / 4}).requires_grad_();
  const at::Tensor theta = at::cat({t1, t2.reshape({-1})});
  const at::Tensor loss = 0.5 * at::dot(theta, at::mv(a, theta));
  HutchinsonOptions o;
  o.rel_tol = 0.002;
  o.max_probes = 2000;
  const TraceEstimate e = hutchinson_trace(loss, {t1, t2}, o);
  const double exact1 = a.diagonal().narrow(0, 0, n1).sum().item<double>();
  const double exact2 = a.diagonal().narrow(0, n1, n2).sum().item<double>();
  EXPECT_NEAR(e.trace[0], exact1, 0.02 * exact1);
  EXPECT_NEAR(e.trace[1], exact2, 0.02 * exact2);
  EXPECT_TRUE(e.converged) << e.probes << " probes";
}

TEST(Hutchinson, SmallMlpTraceAgreesWithTheExactTraceWithin5Percent) {
  at::manual_seed(1);
  const at::Tensor w1 = (at::randn({8, 6}) * 0.5).requires_grad_();
  const at::Tensor w2 = (at::randn({3, 8}) * 0.5).requires_grad_();
  const at::Tensor x = at::randn({32, 6});
  const at::Tensor y = at::randint(0, 3, {32}, at::kLong);
  const at::Tensor logits = at::linear(at::tanh(at::linear(x, w1)), w2);
  const at::Tensor loss = at::cross_entropy_loss(logits, y);
  // Exact: H_kk from the Hessian-vector product with each unit vector.
  const std::vector<at::Tensor> g = torch::autograd::grad({loss}, {w1, w2}, {}, true, true);
  std::vector<double> exact(2, 0.0);
  const std::vector<at::Tensor> params{w1, w2};
  for (size_t i = 0; i < 2; ++i) {
    for (int64_t k = 0; k < params[i].numel(); ++k) {
      at::Tensor e = at::zeros_like(params[i]);
      e.view({-1})[k] = 1.0;
      const at::Tensor hv = torch::autograd::grad({(g[i] * e).sum()}, {params[i]}, {}, true)[0];
      exact[i] += hv.view({-1})[k].item<double>();
    }
  }
  HutchinsonOptions o;
  o.rel_tol = 0.01;
  o.max_probes = 4000;
  o.seed = 5;
  const TraceEstimate est = hutchinson_trace(loss, params, o);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_GT(exact[i], 0.0);
    EXPECT_NEAR(est.trace[i], exact[i], 0.05 * std::abs(exact[i])) << "tensor " << i << " after " << est.probes;
  }
}

TEST(Hutchinson, RejectsNonScalarLossesAndParametersWithoutGrad) {
  const at::Tensor w = at::randn({3}).requires_grad_();
  EXPECT_THROW(hutchinson_trace(w * 2, {w}), Error);
  EXPECT_THROW(hutchinson_trace((w * w).sum(), {at::randn({3})}), Error);
}

}  // namespace
}  // namespace qforge::search
