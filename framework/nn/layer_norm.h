// qforge::nn::LayerNorm: torch::nn::LayerNorm whose output can be fake-quantized (a Q/DQ point
// after normalisation, so the next Linear sees quantized inputs). Its affine weight stays float.
#pragma once

#include <torch/nn/modules/normalization.h>

#include "framework/nn/quantizable.h"

namespace qforge::nn {

class LayerNormImpl : public torch::nn::LayerNormImpl, public QuantizableLayer {
 public:
  using torch::nn::LayerNormImpl::LayerNormImpl;
  at::Tensor forward(const at::Tensor& x);

  const char* layer_type() const override { return "LayerNorm"; }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void check_scheme(const LayerScheme& scheme) const override;
  void install_frozen(QuantizedTensor weight) override;

 protected:
  const char* activation_quantizer_name() const override { return "output_quantizer"; }
  bool has_weight() const override { return false; }
};
TORCH_MODULE(LayerNorm);

}  // namespace qforge::nn
