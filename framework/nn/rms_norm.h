// qforge::nn::RMSNorm: root-mean-square normalisation over the last dimension (Llama, Mistral,
// Qwen2), y = weight * x / sqrt(mean(x^2) + eps), computed in float32 whatever the input dtype, as
// HF's LlamaRMSNorm does. LibTorch 1.13 has no twin for it. Like LayerNorm, its output can be
// fake-quantized (a Q/DQ point after normalisation) and its weight stays float.
#pragma once

#include <torch/nn/cloneable.h>

#include <initializer_list>
#include <utility>

#include "framework/nn/norm_layer.h"

namespace qforge::nn {

class RMSNormImpl : public torch::nn::Cloneable<RMSNormImpl>, public NormLayer {
 public:
  RMSNormImpl(int64_t dim, double eps);
  void reset() override;
  // Cloning would copy the module without its quantizers: refused with a clear error, as LayerNorm.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<c10::Device>& = c10::nullopt) const override {
    refuse_clone();
  }
  // Float CPU calls that autograd does not record run one fused kernel (kernels/cpu/token_ops.h,
  // rms_norm_f32: within a few ulp of the ATen ops); others run the ATen ops.
  at::Tensor forward(const at::Tensor& x);
  // {h, forward(h)} for h = x + residual: the residual add before the norm, fused with it where
  // forward fuses (h equal to the ATen add bit for bit).
  std::pair<at::Tensor, at::Tensor> forward_residual(const at::Tensor& x, const at::Tensor& residual);

  const char* layer_type() const override { return "RMSNorm"; }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }

  int64_t dim;
  double eps;
  at::Tensor weight;  // [dim], ones at construction

 protected:
  const char* float_kernel() const override { return "rms_norm_f32"; }
};
TORCH_MODULE(RMSNorm);

// Whether the fused per-token kernels (kernels/cpu/token_ops.h) serve these tensors: float32 on the
// CPU, none recorded by autograd.
bool token_ops_fusable(std::initializer_list<const at::Tensor*> ts);

}  // namespace qforge::nn
