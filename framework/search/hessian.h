// Hutchinson's estimator of Hessian traces: Tr(H) = E[vᵀ H v] for Rademacher v (entries ±1).
// One gradient with create_graph, then per probe one Hessian-vector product by double backward
// through LibTorch autograd: Hv = ∂(gᵀv)/∂θ. Each tensor of `params` gets the trace of its own
// diagonal block of the Hessian of the loss with respect to all of them (HAWQ-V2's per-layer
// trace). Probing stops when every estimate's standard error is within `rel_tol` of its mean
// (after `min_probes`), or after `max_probes`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace qforge::search {

struct HutchinsonOptions {
  int64_t min_probes = 8;
  int64_t max_probes = 256;
  double rel_tol = 0.02;  // standard error / |mean| for every tensor
  uint64_t seed = 0;
};

struct TraceEstimate {
  std::vector<double> trace;           // Tr of each tensor's diagonal Hessian block
  std::vector<double> standard_error;  // of each estimate
  int64_t probes = 0;
  bool converged = false;              // rel_tol reached before max_probes
};

// `loss` must be a scalar computed from `params` (which require grad) with a graph that
// supports double backward.
TraceEstimate hutchinson_trace(const at::Tensor& loss, const std::vector<at::Tensor>& params,
                               const HutchinsonOptions& options = {});

}  // namespace qforge::search
