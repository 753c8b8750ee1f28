// LayerNorm with an output quantizer.
#include "framework/nn/layer_norm.h"

#include "framework/core/error.h"

namespace qforge::nn {

void LayerNormImpl::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  QF_REQUIRE(scheme.activations != ActivationMode::kDynamicPerToken, path_,
             " (LayerNorm): the output quantizer is static; dynamic per-token quantization belongs to the next Linear");
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  const at::Tensor y = torch::nn::LayerNormImpl::forward(x);
  return input_q_ ? input_q_->forward(y) : y;
}

void LayerNormImpl::install_frozen(QuantizedTensor) {
  QF_REQUIRE(!frozen_, path_, " (LayerNorm): already frozen");
  QF_REQUIRE(uncalibrated().empty(), path_, " (LayerNorm): static output quantizer was never calibrated");
  mark_frozen();
}

KernelPlan LayerNormImpl::plan() const {
  KernelPlan p;
  const bool quantized_output = scheme_.activations != ActivationMode::kNone;
  p.kernel = quantized_output ? "layer_norm_f32+fake_quant" : "layer_norm_f32";
  if (quantized_output) p.fallback = "no fused integer LayerNorm: output is quantize-dequantized in float";
  return p;
}

}  // namespace qforge::nn
