// Small conv-BN-ReLU CNN and conv+BN folding.
#include "framework/models/cnn.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/nn/batch_norm.h"
#include "framework/nn/conv_bn_fold.h"

namespace qforge::models {

ConvBnReluImpl::ConvBnReluImpl(int64_t in, int64_t out) : in_channels(in), out_channels(out) { reset(); }

void ConvBnReluImpl::reset() {
  conv = register_module("conv", nn::Conv2d(torch::nn::Conv2dOptions(in_channels, out_channels, 3).padding(1).bias(false)));
  bn = register_module("bn", torch::nn::BatchNorm2d(out_channels));
}

at::Tensor ConvBnReluImpl::forward(const at::Tensor& x) {
  // Folded: the frozen integer convolution applies the ReLU in its epilogue.
  if (!bn) return conv->forward_relu(x);
  // Synchronised over ranks inside a SyncBatchNormScope.
  return at::relu(nn::batch_norm(*bn, conv->forward(x)));
}

void ConvBnReluImpl::fold_batch_norm() {
  if (!bn) return;
  conv = replace_module("conv", nn::fold_conv_bn(conv, bn));
  unregister_module("bn");
  bn = nullptr;
}

SmallCnnImpl::SmallCnnImpl(SmallCnnOptions opts) : options(std::move(opts)) { reset(); }

void SmallCnnImpl::reset() {
  QF_REQUIRE(!options.channels.empty(), "models/cnn: need at least one conv block");
  blocks = register_module("blocks", torch::nn::ModuleList());
  int64_t c = options.in_channels, size = options.image_size;
  for (int64_t out : options.channels) {
    blocks->push_back(ConvBnRelu(c, out));
    c = out;
    size /= 2;
  }
  QF_REQUIRE(size >= 1, "models/cnn: ", options.channels.size(), " pooling steps shrink a ", options.image_size,
             "-pixel image to nothing");
  fc1 = register_module("fc1", nn::Linear(c * size * size, options.hidden));
  fc2 = register_module("fc2", nn::Linear(options.hidden, options.num_classes));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout));
}

namespace {
// 2x2 max pooling, stride 2 (at::max_pool2d(x, {2, 2}): odd trailing rows/columns dropped, NaN
// propagates). Without autograd it is two at::maximum passes over strided halves, the same values
// several times faster than LibTorch 1.13's max_pool2d_with_indices, which also computes the
// indices only backward needs.
at::Tensor max_pool_2x2(const at::Tensor& x) {
  if (at::GradMode::is_enabled() && x.requires_grad()) return at::max_pool2d(x, {2, 2});
  const int64_t h = x.size(-2) / 2 * 2, w = x.size(-1) / 2 * 2;
  const at::Tensor cols = at::maximum(x.slice(-1, 0, w, 2), x.slice(-1, 1, w, 2));
  return at::maximum(cols.slice(-2, 0, h, 2), cols.slice(-2, 1, h, 2));
}
}  // namespace

at::Tensor SmallCnnImpl::forward(const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto& b = *blocks->ptr(i)->as<ConvBnReluImpl>();
    auto* next = i + 1 < blocks->size() ? blocks->ptr(i + 1)->as<ConvBnReluImpl>() : nullptr;
    // Static-activation chain: a frozen integer block hands the next one int8 codes of its input
    // quantizer, requantized in the epilogue. Max pooling commutes with the monotone quantization,
    // so the codes equal the next block's quantization of the float path, bit for bit.
    if (next != nullptr && !b.bn && !next->bn && h.is_cpu() && b.conv->integer_frozen() && next->conv->takes_codes()) {
      h = max_pool_2x2(b.conv->forward_relu_codes(h, *next->conv));
    } else {
      h = max_pool_2x2(b.forward(h));
    }
  }
  h = at::relu(fc1->forward(h.flatten(1)));
  return fc2->forward(dropout->forward(h));
}

void SmallCnnImpl::fold_batch_norm() {
  for (const auto& b : *blocks) b->as<ConvBnReluImpl>()->fold_batch_norm();
}

}  // namespace qforge::models
