// qforge::nn::MatMul: a quantizable activation x activation product (attention scores Q·K^T and
// attention x values). Both operands get a quantizer ("input_quantizer", "other_quantizer").
// Dynamic per-token scales run along the contracted dimension of each operand: one per row of the
// first ([..., M, K]), one per column of the second ([..., K, N]; for Q.K^T that is one per key
// token, for P.V one per value channel), so after freeze the int8 product is exact in int32 and
// both scales apply in the epilogue. Static scales are per tensor, or per head (axis -3 of
// [batch, heads, tokens, features] operands; Scheme::attention_scales).
// After freeze, float32 CPU operands of at least two dimensions (batch dimensions broadcast)
// run kernels::bmm_s8s8f32 when plan_matmul() allows it (dynamic rows narrower than int8 and
// rows clipped below their amax included: their codes are int8 on the narrower grid, quantized
// by the quantizer's own formula); anything else keeps the fake-quant forward
// (quantize-dequantize both operands, at::matmul in float).
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
  void load(torch::serialize::InputArchive& archive) override {
    refuse_torch_load_if_quantized();
    torch::nn::Module::load(archive);
  }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void check_scheme(const LayerScheme& scheme) const override;
  void install_frozen(QuantizedTensor weight) override;
  KernelPlan plan() const override;
  std::vector<Quantizer> quantizers() const override;
  // The second operand's quantizer (null unless quantized with an activation scheme).
  Quantizer other_quantizer() const { return other_q_; }
  // Static scales per head (Scheme::attention_scales per_head): both quantizers per channel on
  // axis -3 of rank-4 operands, which forward requires.
  bool per_head() const;

 protected:
  bool has_weight() const override { return false; }
  void on_attach() override;
  void on_detach() override { other_q_ = Quantizer(nullptr); }

 private:
  at::Tensor quantize_other(const at::Tensor& b);
  at::Tensor integer_forward(const at::Tensor& a, const at::Tensor& b) const;

  Quantizer other_q_{nullptr};
  LinearPath path_kind_ = LinearPath::kDequant;  // set by install_frozen
  float static_a_scale_ = 0, static_b_scale_ = 0;
  at::Tensor static_a_scales_, static_b_scales_;  // per head, float32 [heads]
  at::Tensor static_a_inv_, static_b_inv_;        // their reciprocals
};
TORCH_MODULE(MatMul);

}  // namespace qforge::nn
