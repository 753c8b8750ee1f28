// Hutchinson trace estimation by double backward.
#include "framework/search/hessian.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>

#include "framework/core/error.h"

namespace qforge::search {

TraceEstimate hutchinson_trace(const at::Tensor& loss, const std::vector<at::Tensor>& params,
                               const HutchinsonOptions& o) {
  QF_REQUIRE(loss.defined() && loss.numel() == 1, "search: hutchinson_trace needs a scalar loss");
  QF_REQUIRE(!params.empty(), "search: hutchinson_trace needs parameters");
  QF_REQUIRE(o.min_probes >= 2 && o.max_probes >= o.min_probes && o.rel_tol > 0,
             "search: hutchinson options need 2 <= min_probes <= max_probes and rel_tol > 0");
  for (const at::Tensor& p : params)
    QF_REQUIRE(p.defined() && p.requires_grad(), "search: hutchinson_trace parameters must require grad");
  const std::vector<at::Tensor> grads =
      torch::autograd::grad({loss}, params, /*grad_outputs=*/{}, /*retain_graph=*/true, /*create_graph=*/true);
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  const size_t n = params.size();
  std::vector<double> sum(n, 0.0), sum_sq(n, 0.0);
  TraceEstimate est;
  est.trace.assign(n, 0.0);
  est.standard_error.assign(n, 0.0);
  for (int64_t k = 1; k <= o.max_probes; ++k) {
    std::vector<at::Tensor> v(n);
    at::Tensor gv = at::zeros({}, grads[0].options());
    for (size_t i = 0; i < n; ++i) {
      // Rademacher: 2 * Bernoulli(1/2) - 1.
      v[i] = at::empty_like(params[i]).bernoulli_(0.5, gen).mul_(2).sub_(1).detach();
      gv = gv + (grads[i] * v[i]).sum();
    }
    const std::vector<at::Tensor> hv = torch::autograd::grad({gv}, params, {}, /*retain_graph=*/true,
                                                             /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < n; ++i) {
      // A parameter the loss is linear in has no Hessian block: its sample is 0.
      const double s = hv[i].defined() ? (hv[i] * v[i]).sum().item<double>() : 0.0;
      sum[i] += s;
      sum_sq[i] += s * s;
    }
    est.probes = k;
    bool all_tight = k >= o.min_probes;
    for (size_t i = 0; i < n; ++i) {
      const double mean = sum[i] / k;
      const double var = k > 1 ? std::max(0.0, (sum_sq[i] - k * mean * mean) / (k - 1)) : 0.0;
      est.trace[i] = mean;
      est.standard_error[i] = std::sqrt(var / k);
      if (est.standard_error[i] > o.rel_tol * std::abs(mean)) all_tight = false;
    }
    if (all_tight) {
      est.converged = true;
      break;
    }
  }
  return est;
}

}  // namespace qforge::search
