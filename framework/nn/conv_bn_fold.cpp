// Conv + BatchNorm folding (formula in conv_bn_fold.h).
#include "framework/nn/conv_bn_fold.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge::nn {

namespace {

template <class Conv, size_t D, class Bn>
Conv fold(const Conv& conv, const Bn& bn) {
  QF_REQUIRE(!conv->quantized(), "fold_conv_bn: fold BatchNorm before quantize(): conv '", conv->path(),
             "' already has quantizers");
  const auto& bo = bn->options;
  QF_REQUIRE(bo.num_features() == conv->options.out_channels(), "fold_conv_bn: BatchNorm", D, "d has ",
             bo.num_features(), " features, conv has ", conv->options.out_channels(), " output channels");
  QF_REQUIRE(bo.track_running_stats(), "fold_conv_bn: folding needs BatchNorm running statistics");
  Conv folded(conv_options_of<D>(conv->options).bias(true));
  folded->to(conv->weight.device(), conv->weight.scalar_type());
  at::NoGradGuard no_grad;
  const auto [w, b] = fold_bn_tensors(conv->weight, conv->bias, bn->running_mean, bn->running_var,
                                      bo.affine() ? bn->weight : at::Tensor(), bo.affine() ? bn->bias : at::Tensor(),
                                      bo.eps());
  folded->weight.copy_(w);
  folded->bias.copy_(b);
  // A conv the caller froze for training stays frozen once folded.
  folded->weight.set_requires_grad(conv->weight.requires_grad());
  folded->bias.set_requires_grad(conv->bias.defined() ? conv->bias.requires_grad() : conv->weight.requires_grad());
  return folded;
}

}  // namespace

Conv2d fold_conv_bn(const Conv2d& conv, const torch::nn::BatchNorm2d& bn) { return fold<Conv2d, 2>(conv, bn); }
Conv1d fold_conv_bn(const Conv1d& conv, const torch::nn::BatchNorm1d& bn) { return fold<Conv1d, 1>(conv, bn); }

std::pair<at::Tensor, at::Tensor> fold_bn_tensors(const at::Tensor& weight, const at::Tensor& bias,
                                                  const at::Tensor& running_mean, const at::Tensor& running_var,
                                                  const at::Tensor& gamma, const at::Tensor& beta, double eps) {
  const int64_t out = weight.size(0);
  QF_REQUIRE(running_mean.numel() == out && running_var.numel() == out, "fold_bn_tensors: BatchNorm statistics of ",
             running_var.numel(), " channels, the convolution has ", out, " output channels");
  at::NoGradGuard no_grad;
  const at::Tensor inv_std = at::rsqrt(running_var + eps);
  const at::Tensor scale = gamma.defined() ? gamma * inv_std : inv_std;
  const at::Tensor b = bias.defined() ? bias : at::zeros_like(scale);
  std::vector<int64_t> bshape(weight.dim(), 1);
  bshape[0] = -1;
  at::Tensor folded_bias = (b - running_mean) * scale;
  if (beta.defined()) folded_bias = folded_bias + beta;
  return {weight * scale.reshape(bshape), folded_bias};
}

}  // namespace qforge::nn
