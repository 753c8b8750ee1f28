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

void ConvQuantState::freeze_conv(at::Tensor& weight, torch::OrderedDict<std::string, at::Tensor>& params) {
  if (frozen_) return;
  QF_REQUIRE(quantized(), path_, " (", layer_type(), "): freeze() needs quantize() first");
  QF_REQUIRE(uncalibrated().empty(), path_, " (", layer_type(), "): static activations were never calibrated");
  QF_REQUIRE(weight_q_, path_, " (", layer_type(), "): freezing needs quantized weights");
  fweight_ = freeze_weight(weight, weight_q_->qparams(weight));
  params.erase("weight");
  weight = at::Tensor();
  weight_q_->clear_cache();
  frozen_ = true;
  kernel_ = "dequantize+at::conv";
  fallback_ = "no integer convolution kernel: the packed weight is dequantized per call";
}

at::Tensor Conv1dImpl::forward(const at::Tensor& x) {
  if (frozen_) {
    ScopedTensorSwap swap(weight, fweight_.dequantize());
    return torch::nn::Conv1dImpl::forward(quantize_input(x));
  }
  if (!quantized()) return torch::nn::Conv1dImpl::forward(x);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::Conv1dImpl::forward(quantize_input(x));
}

at::Tensor Conv2dImpl::forward(const at::Tensor& x) {
  if (frozen_) {
    ScopedTensorSwap swap(weight, fweight_.dequantize());
    return torch::nn::Conv2dImpl::forward(quantize_input(x));
  }
  if (!quantized()) return torch::nn::Conv2dImpl::forward(x);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::Conv2dImpl::forward(quantize_input(x));
}

}  // namespace qforge::nn
