// Conv2d + BatchNorm2d folding (formula in conv_bn_fold.h).
#include "framework/nn/conv_bn_fold.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge::nn {

Conv2d fold_conv_bn(const Conv2d& conv, const torch::nn::BatchNorm2d& bn) {
  QF_REQUIRE(!conv->quantized(), "fold_conv_bn: fold BatchNorm before quantize(): conv '", conv->path(),
             "' already has quantizers");
  const auto& bo = bn->options;
  QF_REQUIRE(bo.num_features() == conv->options.out_channels(), "fold_conv_bn: BatchNorm2d has ", bo.num_features(),
             " features, conv has ", conv->options.out_channels(), " output channels");
  QF_REQUIRE(bo.track_running_stats(), "fold_conv_bn: folding needs BatchNorm running statistics");
  Conv2d folded(conv_options_of<2>(conv->options).bias(true));
  folded->to(conv->weight.device(), conv->weight.scalar_type());
  at::NoGradGuard no_grad;
  const at::Tensor inv_std = at::rsqrt(bn->running_var + bo.eps());
  const at::Tensor gamma = bo.affine() ? bn->weight : at::ones_like(inv_std);
  const at::Tensor beta = bo.affine() ? bn->bias : at::zeros_like(inv_std);
  const at::Tensor scale = gamma * inv_std;
  const at::Tensor b = conv->bias.defined() ? conv->bias : at::zeros_like(scale);
  std::vector<int64_t> bshape(conv->weight.dim(), 1);
  bshape[0] = -1;
  folded->weight.copy_(conv->weight * scale.reshape(bshape));
  folded->bias.copy_((b - bn->running_mean) * scale + beta);
  // A conv the caller froze for training stays frozen once folded.
  folded->weight.set_requires_grad(conv->weight.requires_grad());
  folded->bias.set_requires_grad(conv->bias.defined() ? conv->bias.requires_grad() : conv->weight.requires_grad());
  return folded;
}

}  // namespace qforge::nn
