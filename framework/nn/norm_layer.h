// What the normalisation layers (LayerNorm, RMSNorm) share as qforge layers: their affine weight
// stays float, their output may get a static quantizer (a Q/DQ point feeding the next Linear), and
// no fused integer kernel runs them.
#pragma once

#include "framework/nn/quantizable.h"

namespace qforge::nn {

class NormLayer : public QuantizableLayer {
 public:
  void check_scheme(const LayerScheme& scheme) const override;
  void install_frozen(QuantizedTensor weight) override;
  KernelPlan plan() const override;

 protected:
  // The float kernel's name in describe(): "layer_norm_f32".
  virtual const char* float_kernel() const = 0;
  const char* activation_quantizer_name() const override { return "output_quantizer"; }
  bool has_weight() const override { return false; }
};

}  // namespace qforge::nn
