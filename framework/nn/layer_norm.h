// qforge::nn::LayerNorm: torch::nn::LayerNorm whose output can be fake-quantized (a Q/DQ point
// after normalisation, so the next Linear sees quantized inputs). Its affine weight stays float.
#pragma once

#include <torch/nn/modules/normalization.h>

#include <utility>

#include "framework/nn/norm_layer.h"
#include "framework/nn/twin.h"

namespace qforge::nn {

class LayerNormImpl : QFORGE_TWIN_BASE(torch::nn::LayerNormImpl), public NormLayer {
 public:
  // Private base: a torch::nn::LayerNormImpl& cannot bind to this layer, so the base class's
  // non-virtual forward can never run (in float) in its place. Module stays a public base.
  using torch::nn::LayerNormImpl::LayerNormImpl;
  using torch::nn::LayerNormImpl::options;
  using torch::nn::LayerNormImpl::weight;
  using torch::nn::LayerNormImpl::bias;
  using torch::nn::LayerNormImpl::reset;
  using torch::nn::LayerNormImpl::reset_parameters;
  using torch::nn::LayerNormImpl::pretty_print;
  // Cloning would copy only the LibTorch twin (a float layer): refused with a clear error.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<c10::Device>& = c10::nullopt) const override {
    refuse_clone();
  }
  // ATen's layer norm (torch::nn::LayerNorm's forward, bit for bit), then the output quantizer.
  at::Tensor forward(const at::Tensor& x);
  // The same with one fused kernel (kernels::layer_norm_f32: within 1e-6 |y| + 1e-6 max |y| of
  // forward(), another summation order) where token_ops_fusable holds for x and the affine
  // parameters (float CPU, no gradient to record), with a single normalized dimension and both
  // affine parameters of its size; else forward(). Decoders call it per
  // token (GPT-2); forward() stays ATen's so a converted torch::nn::LayerNorm keeps its results.
  at::Tensor forward_fused(const at::Tensor& x);
  // {h, forward_fused(h)} for h = x + residual, the add inside the kernel where it fuses.
  std::pair<at::Tensor, at::Tensor> forward_residual(const at::Tensor& x, const at::Tensor& residual);

  const char* layer_type() const override { return "LayerNorm"; }
  void load(torch::serialize::InputArchive& archive) override {
    refuse_torch_load_if_quantized();
    torch::nn::Module::load(archive);
  }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }

 protected:
  const char* float_kernel() const override { return "layer_norm_f32"; }
};
TORCH_MODULE(LayerNorm);

}  // namespace qforge::nn
