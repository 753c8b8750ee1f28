// A small CNN for 28x28 grey images (Fashion-MNIST) made of conv-BN-ReLU blocks of qforge
// Conv2d, folded for freeze by nn::fold_conv_bn (framework/nn/conv_bn_fold.h).
//   blocks.i: ConvBnRelu (conv 3x3 pad 1 -> BatchNorm2d -> ReLU), 2x2 max-pool after each block
//   fc1 (qforge Linear) -> ReLU -> dropout -> fc2 (qforge Linear) -> logits
// Parameter names: blocks.0.conv.weight, blocks.0.bn.{weight,bias,running_mean,running_var}, fc1.*, fc2.*
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "framework/nn/conv.h"
#include "framework/nn/conv_bn_fold.h"
#include "framework/nn/linear.h"

namespace qforge::models {

// Kept from before the fold moved to framework/nn/conv_bn_fold.h: existing callers still compile.
using nn::fold_conv_bn;

class ConvBnReluImpl : public torch::nn::Cloneable<ConvBnReluImpl> {
 public:
  ConvBnReluImpl(int64_t in_channels, int64_t out_channels);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  // Replaces conv by nn::fold_conv_bn(conv, bn) and removes bn (forward is then conv -> ReLU).
  void fold_batch_norm();
  bool folded() const { return !bn; }

  int64_t in_channels, out_channels;
  nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBnRelu);

struct SmallCnnOptions {
  int64_t in_channels = 1;
  int64_t image_size = 28;
  std::vector<int64_t> channels = {32, 64};
  int64_t hidden = 128;
  int64_t num_classes = 10;
  double dropout = 0.25;
};

class SmallCnnImpl : public torch::nn::Cloneable<SmallCnnImpl> {
 public:
  explicit SmallCnnImpl(SmallCnnOptions options = {});
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  // Folds every block's BatchNorm into its conv (call in eval mode, before quantize()).
  void fold_batch_norm();

  SmallCnnOptions options;
  torch::nn::ModuleList blocks{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(SmallCnn);

}  // namespace qforge::models
