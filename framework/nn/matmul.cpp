// MatMul of two activations with a quantizer on each operand.
#include "framework/nn/matmul.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge::nn {

void MatMulImpl::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  QF_REQUIRE(scheme.activations != ActivationMode::kNone || !scheme.weights, path_,
             " (MatMul): has no weight; quantize its operands with an activation scheme");
}

void MatMulImpl::on_attach() {
  if (scheme_.activations == ActivationMode::kNone) return;
  other_q_ = Quantizer(QuantizerImpl::Role::kActivation, scheme_.activation, scheme_.activations, path_ + ".other");
  register_module("other_quantizer", other_q_);
  other_q_->train(is_training());
}

std::vector<Quantizer> MatMulImpl::quantizers() const {
  std::vector<Quantizer> out = QuantizableLayer::quantizers();
  if (other_q_) out.push_back(other_q_);
  return out;
}

at::Tensor MatMulImpl::forward(const at::Tensor& a, const at::Tensor& b) {
  if (!input_q_) return at::matmul(a, b);
  // Per-token dynamic scales are along the last dimension of each operand as given.
  return at::matmul(input_q_->forward(a), other_q_->forward(b));
}

void MatMulImpl::install_frozen(QuantizedTensor) {
  QF_REQUIRE(!frozen_, path_, " (MatMul): already frozen");
  QF_REQUIRE(uncalibrated().empty(), path_, " (MatMul): static operand quantizers were never calibrated");
  mark_frozen();
}

KernelPlan MatMulImpl::plan() const {
  KernelPlan p;
  const bool quantized_output = scheme_.activations != ActivationMode::kNone;
  p.kernel = quantized_output ? "fake_quant+at::matmul" : "at::matmul";
  if (quantized_output) p.fallback = "no int8 batched matmul kernel: operands are quantize-dequantized in float";
  return p;
}

}  // namespace qforge::nn
