// LayerNorm with an output quantizer.
#include "framework/nn/layer_norm.h"

#include <ATen/ATen.h>

#include "framework/nn/rms_norm.h"
#include "kernels/cpu/token_ops.h"

namespace qforge::nn {

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  const at::Tensor y = torch::nn::LayerNormImpl::forward(x);
  return input_q_ ? input_q_->forward(y) : y;
}

namespace {

// The fused kernel's call for x (and residual r, or undefined) on `ln`, or {} where it does not apply.
std::pair<at::Tensor, at::Tensor> fused_layer_norm(const torch::nn::LayerNormOptions& o, const at::Tensor& weight,
                                                   const at::Tensor& bias, const at::Tensor& x, const at::Tensor& r) {
  const std::vector<int64_t>& shape = o.normalized_shape();
  if (shape.size() != 1 || !weight.defined() || !bias.defined() || x.dim() < 1 || x.size(-1) != shape[0] ||
      weight.numel() != shape[0] || bias.numel() != shape[0] || x.numel() == 0 ||
      (r.defined() && r.sizes() != x.sizes()))
    return {};
  if (r.defined() ? !token_ops_fusable({&x, &r, &weight, &bias}) : !token_ops_fusable({&x, &weight, &bias})) return {};
  const int64_t dim = shape[0];
  const at::Tensor xc = x.contiguous(), rc = r.defined() ? r.contiguous() : r;
  const at::Tensor w = weight.contiguous(), b = bias.contiguous();
  at::Tensor h = r.defined() ? at::empty_like(xc) : xc, y = at::empty_like(xc);
  kernels::layer_norm_f32({xc.data_ptr<float>(), r.defined() ? rc.data_ptr<float>() : nullptr,
                           r.defined() ? h.data_ptr<float>() : nullptr, w.data_ptr<float>(), b.data_ptr<float>(),
                           y.data_ptr<float>(), xc.numel() / dim, dim, static_cast<float>(o.eps())});
  return {h, y};
}

}  // namespace

at::Tensor LayerNormImpl::forward_fused(const at::Tensor& x) {
  const at::Tensor y = fused_layer_norm(options, weight, bias, x, at::Tensor()).second;
  if (!y.defined()) return forward(x);
  return input_q_ ? input_q_->forward(y) : y;
}

std::pair<at::Tensor, at::Tensor> LayerNormImpl::forward_residual(const at::Tensor& x, const at::Tensor& residual) {
  auto [h, y] = fused_layer_norm(options, weight, bias, x, residual);
  if (!y.defined()) {
    const at::Tensor sum = x + residual;
    return {sum, forward(sum)};
  }
  return {h, input_q_ ? input_q_->forward(y) : y};
}

}  // namespace qforge::nn
