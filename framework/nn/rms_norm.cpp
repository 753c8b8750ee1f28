// RMSNorm with an output quantizer.
#include "framework/nn/rms_norm.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "kernels/cpu/token_ops.h"

namespace qforge::nn {

RMSNormImpl::RMSNormImpl(int64_t dim_, double eps_) : dim(dim_), eps(eps_) {
  QF_REQUIRE(dim > 0 && eps >= 0, "nn::RMSNorm: dim must be > 0 and eps >= 0, got ", dim, " and ", eps);
  reset();
}

void RMSNormImpl::reset() { weight = register_parameter("weight", at::ones({dim})); }

bool token_ops_fusable(std::initializer_list<const at::Tensor*> ts) {
  bool grad = false;
  for (const at::Tensor* t : ts) {
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat) return false;
    grad = grad || t->requires_grad();
  }
  return !(grad && at::GradMode::is_enabled());
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  QF_REQUIRE(x.dim() >= 1 && x.size(-1) == dim, path_.empty() ? "nn::RMSNorm" : path_, ": input ", x.sizes(),
             " does not end in ", dim);
  at::Tensor y;
  if (weight.numel() == dim && token_ops_fusable({&x, &weight})) {  // a weight of another size: ATen's error
    const at::Tensor xc = x.contiguous(), w = weight.contiguous();
    y = at::empty_like(xc);
    kernels::rms_norm_f32({xc.data_ptr<float>(), nullptr, nullptr, w.data_ptr<float>(), y.data_ptr<float>(),
                           xc.numel() / dim, dim, static_cast<float>(eps)});
  } else {
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
    // HF casts back to the input dtype before the weight multiplies.
    y = weight * normed.to(x.scalar_type());
  }
  return input_q_ ? input_q_->forward(y) : y;
}

std::pair<at::Tensor, at::Tensor> RMSNormImpl::forward_residual(const at::Tensor& x, const at::Tensor& residual) {
  if (x.sizes() != residual.sizes() || x.dim() < 1 || x.size(-1) != dim || weight.numel() != dim ||
      !token_ops_fusable({&x, &residual, &weight})) {
    const at::Tensor h = x + residual;
    return {h, forward(h)};
  }
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), w = weight.contiguous();
  at::Tensor h = at::empty_like(xc), y = at::empty_like(xc);
  kernels::rms_norm_f32({xc.data_ptr<float>(), rc.data_ptr<float>(), h.data_ptr<float>(), w.data_ptr<float>(),
                         y.data_ptr<float>(), xc.numel() / dim, dim, static_cast<float>(eps)});
  return {h, input_q_ ? input_q_->forward(y) : y};
}

}  // namespace qforge::nn
