// qforge::nn::Conv1d / Conv2d: LibTorch's convolutions (same options, names, initialisation and
// float forward) with weight and input quantizers. After freeze() the weight lives in packed
// integer storage and is dequantized per call (qforge has no integer convolution kernel yet;
// the report says so).
#pragma once

#include <torch/nn/modules/conv.h>

#include "framework/quantized_tensor.h"
#include "framework/nn/quantizable.h"
#include "framework/nn/twin.h"

namespace qforge::nn {

// Shared freeze/forward logic of the convolutions.
class ConvQuantState : public QuantizableLayer {
 public:
  void check_scheme(const LayerScheme& scheme) const override;
  KernelPlan plan() const override;

 protected:
  void install_conv(QuantizedTensor fw, at::Tensor& weight, torch::OrderedDict<std::string, at::Tensor>& params);
  int64_t frozen_storage_bytes() const override { return fweight_.defined() ? fweight_.bytes() : 0; }
  QuantizedTensor frozen_weight() const override { return fweight_; }
  QuantizedTensor fweight_;
};

class Conv1dImpl : QFORGE_TWIN_BASE(torch::nn::Conv1dImpl), public ConvQuantState {
 public:
  // Private base: a torch::nn::Conv1dImpl& cannot bind to this layer, so the base class's
  // non-virtual forward can never run (in float) in its place. Module stays a public base.
  using torch::nn::Conv1dImpl::Conv1dImpl;
  using torch::nn::Conv1dImpl::options;
  using torch::nn::Conv1dImpl::weight;
  using torch::nn::Conv1dImpl::bias;
  using torch::nn::Conv1dImpl::reset;
  using torch::nn::Conv1dImpl::reset_parameters;
  using torch::nn::Conv1dImpl::pretty_print;
  // Cloning would copy only the LibTorch twin (a float layer): refused with a clear error.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<c10::Device>& = c10::nullopt) const override {
    refuse_clone();
  }
  at::Tensor forward(const at::Tensor& x);
  const char* layer_type() const override { return "Conv1d"; }
  std::shared_ptr<QuantizableLayer> float_copy() const override;
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void install_frozen(QuantizedTensor fw) override { install_conv(std::move(fw), weight, parameters_); }
  QuantizedTensor frozen_weight() const override { return ConvQuantState::frozen_weight(); }
  at::Tensor frozen_bias() const override { return options.bias() ? bias : at::Tensor(); }

 protected:
  at::Tensor float_weight() const override { return weight; }

 public:
};
TORCH_MODULE(Conv1d);

class Conv2dImpl : QFORGE_TWIN_BASE(torch::nn::Conv2dImpl), public ConvQuantState {
 public:
  // Private base: a torch::nn::Conv2dImpl& cannot bind to this layer, so the base class's
  // non-virtual forward can never run (in float) in its place. Module stays a public base.
  using torch::nn::Conv2dImpl::Conv2dImpl;
  using torch::nn::Conv2dImpl::options;
  using torch::nn::Conv2dImpl::weight;
  using torch::nn::Conv2dImpl::bias;
  using torch::nn::Conv2dImpl::reset;
  using torch::nn::Conv2dImpl::reset_parameters;
  using torch::nn::Conv2dImpl::pretty_print;
  // Cloning would copy only the LibTorch twin (a float layer): refused with a clear error.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<c10::Device>& = c10::nullopt) const override {
    refuse_clone();
  }
  at::Tensor forward(const at::Tensor& x);
  const char* layer_type() const override { return "Conv2d"; }
  std::shared_ptr<QuantizableLayer> float_copy() const override;
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void install_frozen(QuantizedTensor fw) override { install_conv(std::move(fw), weight, parameters_); }
  QuantizedTensor frozen_weight() const override { return ConvQuantState::frozen_weight(); }
  at::Tensor frozen_bias() const override { return options.bias() ? bias : at::Tensor(); }

 protected:
  at::Tensor float_weight() const override { return weight; }

 public:
};
TORCH_MODULE(Conv2d);

}  // namespace qforge::nn
