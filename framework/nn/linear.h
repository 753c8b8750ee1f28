// qforge::nn::Linear: torch::nn::Linear (same options, parameter names, initialisation and float
// forward) plus weight and input quantizers, and integer kernels after freeze().
#pragma once

#include <torch/nn/modules/linear.h>

#include <memory>

#include "framework/quantized_tensor.h"
#include "framework/nn/quantizable.h"

namespace qforge::kernels {
class PackedLinearS8;
class PackedLinearS4;
}  // namespace qforge::kernels

namespace qforge::nn {

class LinearImpl : public torch::nn::LinearImpl, public QuantizableLayer {
 public:
  using torch::nn::LinearImpl::LinearImpl;

  at::Tensor forward(const at::Tensor& x);

  const char* layer_type() const override { return "Linear"; }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void check_scheme(const LayerScheme& scheme) const override;
  void install_frozen(QuantizedTensor weight) override;
  QuantizedTensor frozen_weight() const override;
  at::Tensor frozen_bias() const override;

 protected:
  int64_t frozen_storage_bytes() const override;
  at::Tensor float_weight() const override { return weight; }

 private:
  at::Tensor frozen_forward(const at::Tensor& x);

  enum class Path : uint8_t { kDequant, kS8Dynamic, kS8Static, kS4Dynamic, kS4Static, kS8WeightOnly, kS4WeightOnly };
  Path path_kind_ = Path::kDequant;
  QuantizedTensor fweight_;
  std::shared_ptr<kernels::PackedLinearS8> s8_;
  std::shared_ptr<kernels::PackedLinearS4> s4_;
  float static_act_scale_ = 1.0f;
};

TORCH_MODULE(Linear);

}  // namespace qforge::nn
