// Scheme checks, freezing and the kernel plan of the normalisation layers (see norm_layer.h).
#include "framework/nn/norm_layer.h"

#include <string>

#include "framework/core/error.h"

namespace qforge::nn {

void NormLayer::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  QF_REQUIRE(scheme.activations != ActivationMode::kDynamicPerToken, path_, " (", layer_type(),
             "): the output quantizer is static; dynamic per-token quantization belongs to the next Linear");
}

void NormLayer::install_frozen(QuantizedTensor) {
  QF_REQUIRE(!frozen_, path_, " (", layer_type(), "): already frozen");
  QF_REQUIRE(uncalibrated().empty(), path_, " (", layer_type(), "): static output quantizer was never calibrated");
  mark_frozen();
}

KernelPlan NormLayer::plan() const {
  KernelPlan p;
  const bool quantized_output = scheme_.activations != ActivationMode::kNone;
  p.kernel = std::string(float_kernel()) + (quantized_output ? "+fake_quant" : "");
  if (quantized_output)
    p.fallback = std::string("no fused integer ") + layer_type() + ": output is quantize-dequantized in float";
  return p;
}

}  // namespace qforge::nn
