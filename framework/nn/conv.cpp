// Convolutions: fake-quant forward through LibTorch's own forward with the weight swapped.
#include "framework/nn/conv.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge::nn {

void ConvQuantState::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  if (scheme.weights) {
    const QSpec& s = scheme.weights->spec;
    QF_REQUIRE(s.granularity != Granularity::kPerGroup, path_, " (", layer_type(),
               "): per-group weights are for Linear/Embedding; use per_channel for convolutions");
    QF_REQUIRE(s.granularity != Granularity::kPerChannel || s.axis == 0, path_, " (", layer_type(),
               "): per-channel weight quantization is along the output channels (axis 0), got axis ", s.axis);
  }
  QF_REQUIRE(scheme.activations != ActivationMode::kDynamicPerToken, path_, " (", layer_type(),
             "): dynamic per-token activations are for Linear; use static activations for convolutions");
}

KernelPlan ConvQuantState::plan() const {
  KernelPlan p;
  p.kernel = "dequantize+at::conv";
  p.fallback = "no integer convolution kernel: the packed weight is dequantized per call";
  return p;
}

void ConvQuantState::install_conv(QuantizedTensor fw, at::Tensor& weight,
                                  torch::OrderedDict<std::string, at::Tensor>& params) {
  QF_REQUIRE(!frozen_, path_, " (", layer_type(), "): already frozen");
  QF_REQUIRE(fw.defined() && scheme_.weights, path_, " (", layer_type(),
             "): install_frozen needs the saved scheme attached and a packed weight");
  if (weight.defined()) {
    QF_REQUIRE(at::IntArrayRef(fw.shape) == weight.sizes(), path_, " (", layer_type(), "): frozen weight has shape ",
               at::IntArrayRef(fw.shape), ", layer expects ", weight.sizes());
  }
  fweight_ = std::move(fw);
  if (params.contains("weight")) params.erase("weight");
  weight = at::Tensor();
  if (weight_q_) weight_q_->clear_cache();
  mark_frozen();
}

namespace {
// ConvOptions<D> from the ConvNdOptions<D> a convolution keeps.
template <size_t D>
torch::nn::ConvOptions<D> conv_options(const torch::nn::detail::ConvNdOptions<D>& o) {
  return torch::nn::ConvOptions<D>(o.in_channels(), o.out_channels(), o.kernel_size())
      .stride(o.stride())
      .padding(o.padding())
      .dilation(o.dilation())
      .groups(o.groups())
      .bias(o.bias())
      .padding_mode(o.padding_mode());
}
}  // namespace

// A fresh convolution of the same type and options holding copies of the float parameters.
template <class Impl, size_t D>
std::shared_ptr<QuantizableLayer> conv_float_copy(const torch::nn::detail::ConvNdOptions<D>& options,
                                                  const at::Tensor& weight, const at::Tensor& bias) {
  RngStateGuard rng;
  auto c = std::make_shared<Impl>(conv_options<D>(options));
  copy_float_parameters(c->weight, weight, &c->bias, &bias);
  return c;
}

std::shared_ptr<QuantizableLayer> Conv1dImpl::float_copy() const {
  require_not_frozen("float_copy");
  return conv_float_copy<Conv1dImpl, 1>(options, weight, bias);
}

std::shared_ptr<QuantizableLayer> Conv2dImpl::float_copy() const {
  require_not_frozen("float_copy");
  return conv_float_copy<Conv2dImpl, 2>(options, weight, bias);
}

at::Tensor Conv1dImpl::forward(const at::Tensor& x) {
  note_input(x);
  if (frozen_) {
    // Frozen codes stay on the CPU; on another device the dequantized weight is copied there.
    ScopedTensorSwap swap(weight, fweight_.dequantize().to(x.device()));
    return torch::nn::Conv1dImpl::forward(quantize_input(x));
  }
  if (!quantized()) return torch::nn::Conv1dImpl::forward(x);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::Conv1dImpl::forward(quantize_input(x));
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) {
  note_input(x);
  if (frozen_) {
    // Frozen codes stay on the CPU; on another device the dequantized weight is copied there.
    ScopedTensorSwap swap(weight, fweight_.dequantize().to(x.device()));
    return torch::nn::Conv2dImpl::forward(quantize_input(x));
  }
  if (!quantized()) return torch::nn::Conv2dImpl::forward(x);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::Conv2dImpl::forward(quantize_input(x));
}

}  // namespace qforge::nn
