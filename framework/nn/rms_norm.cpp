// RMSNorm with an output quantizer.
#include "framework/nn/rms_norm.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge::nn {

RMSNormImpl::RMSNormImpl(int64_t dim_, double eps_) : dim(dim_), eps(eps_) {
  QF_REQUIRE(dim > 0 && eps >= 0, "nn::RMSNorm: dim must be > 0 and eps >= 0, got ", dim, " and ", eps);
  reset();
}

void RMSNormImpl::reset() { weight = register_parameter("weight", at::ones({dim})); }

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  QF_REQUIRE(x.dim() >= 1 && x.size(-1) == dim, path_.empty() ? "nn::RMSNorm" : path_, ": input ", x.sizes(),
             " does not end in ", dim);
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  // HF casts back to the input dtype before the weight multiplies.
  const at::Tensor y = weight * normed.to(x.scalar_type());
  return input_q_ ? input_q_->forward(y) : y;
}

}  // namespace qforge::nn
