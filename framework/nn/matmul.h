// qforge::nn::MatMul: a quantizable activation x activation product (attention scores Q·K^T and
// attention x values). Both operands get a quantizer ("input_quantizer", "other_quantizer").
#pragma once

#include <torch/nn/cloneable.h>

#include "framework/nn/quantizable.h"

namespace qforge::nn {

class MatMulImpl : public torch::nn::Cloneable<MatMulImpl>, public QuantizableLayer {
 public:
  MatMulImpl() = default;
  void reset() override {}
  // at::matmul(a, b), with both operands fake-quantized once quantized.
  at::Tensor forward(const at::Tensor& a, const at::Tensor& b);

  const char* layer_type() const override { return "MatMul"; }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void check_scheme(const LayerScheme& scheme) const override;
  void install_frozen(QuantizedTensor weight) override;
  KernelPlan plan() const override;
  std::vector<Quantizer> quantizers() const override;
  // The second operand's quantizer (null unless quantized with an activation scheme).
  Quantizer other_quantizer() const { return other_q_; }

 protected:
  bool has_weight() const override { return false; }
  void on_attach() override;
  void on_detach() override { other_q_ = Quantizer(nullptr); }

 private:
  Quantizer other_q_{nullptr};
};
TORCH_MODULE(MatMul);

}  // namespace qforge::nn
