// qforge::nn::Linear: torch::nn::Linear (same options, parameter names, initialisation and float
// forward) plus weight and input quantizers, and integer kernels after freeze().
#pragma once

#include <torch/nn/modules/linear.h>

#include <memory>

#include "framework/api/quantized_tensor.h"
#include "framework/nn/packed_weight.h"
#include "framework/nn/quantizable.h"
#include "framework/nn/twin.h"

namespace qforge::nn {

class LinearImpl : QFORGE_TWIN_BASE(torch::nn::LinearImpl), public QuantizableLayer {
 public:
  // Private base: a torch::nn::LinearImpl& cannot bind to this layer, so the base class's
  // non-virtual forward can never run (in float) in its place. Module stays a public base.
  using torch::nn::LinearImpl::LinearImpl;
  using torch::nn::LinearImpl::options;
  using torch::nn::LinearImpl::weight;
  using torch::nn::LinearImpl::bias;
  using torch::nn::LinearImpl::reset;
  using torch::nn::LinearImpl::reset_parameters;
  using torch::nn::LinearImpl::pretty_print;
  // Cloning would copy only the LibTorch twin (a float layer): refused with a clear error.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<c10::Device>& = c10::nullopt) const override {
    refuse_clone();
  }

  at::Tensor forward(const at::Tensor& x);

  const char* layer_type() const override { return "Linear"; }
  // The activations column says when decode calls quantize (set_decode_activations).
  LayerReport report(bool planned = false) const override;
  void load(torch::serialize::InputArchive& archive) override {
    refuse_torch_load_if_quantized();
    torch::nn::Module::load(archive);
  }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void check_scheme(const LayerScheme& scheme) const override;
  void install_frozen(QuantizedTensor weight) override;
  KernelPlan plan() const override;
  std::shared_ptr<QuantizableLayer> float_copy() const override;
  QuantizedTensor frozen_weight() const override;
  at::Tensor frozen_bias() const override;

  // Moving a frozen layer to a CUDA device moves its packed weight there (PackedWeight::to: the
  // int8 codes and scales for the cuBLASLt path, the packed int4 codes for the dequantize path);
  // its forward then runs the CUDA kernels and describe() shows the CUDA plan (plan_linear_cuda).
  // Back on the CPU, the device copies are dropped. A build without CUDA kernels refuses with the reason.
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  // SmoothQuant's per-input-feature factor (ModelOpt's pre_quant_scale): once set, forward
  // multiplies its input by it first, in every state (float, fake-quant, frozen), so the layer
  // computes (x * pre_quant_scale) Wᵀ + b. Registered as the buffer "pre_quant_scale" [in_features].
  void set_pre_quant_scale(const at::Tensor& scale) { set_optional_buffer("pre_quant_scale", scale); }
  const at::Tensor& pre_quant_scale() const { return pre_quant_scale_; }
  std::vector<std::string> optional_buffers() const override { return {"pre_quant_scale"}; }
  void check_optional_buffer(const std::string& name, const at::Tensor& value) const override;
  void set_optional_buffer(const std::string& name, const at::Tensor& value) override;

  // Weight-only int8 / int4 layers on the CPU: kQ8Block32 quantizes the float input of calls of
  // at most kernels::kWeightOnlyMaxM rows to int8 in blocks of 32 and runs integer dot products
  // (llama.cpp's decode numerics, faster); kExact (the default, except for Linears load_gguf fills
  // with Q4_0 codes) keeps float activations. A run-time choice like the thread count: not saved in
  // checkpoints. The plan (describe) follows it; other paths ignore it.
  void set_decode_activations(DecodeActivations mode);
  DecodeActivations decode_activations() const { return decode_; }

 protected:
  int64_t frozen_storage_bytes() const override;
  at::Tensor float_weight() const override { return weight; }

 private:
  at::Tensor frozen_forward(const at::Tensor& x);
  // Where the frozen weight lives: the float weight's device before freeze(), then the packed weight's.
  at::Device compute_device() const;
  // Throws (before anything moves) when a frozen layer cannot run on `device`.
  void check_frozen_device(const at::Device& device) const;
  // Moves the packed weight of a frozen layer to `device`; refreshes the plan.
  void place_frozen(const at::Device& device);
  // kernel and fallback of the describe() line from plan().
  void refresh_plan();

  // The frozen weight, packed for plan().path (null until frozen).
  PackedWeightPtr packed_;
  at::Tensor pre_quant_scale_;
  DecodeActivations decode_ = DecodeActivations::kExact;
  // The device the layer was last moved to (where install_frozen places a checkpoint's weight).
  at::Device device_{at::kCPU};
};

TORCH_MODULE(Linear);

// set_decode_activations(mode) on every qforge Linear of `model`; returns how many of them now
// quantize their decode activations to block-32 int8 (KernelPlan::decode_q8; 0 for kExact).
int set_decode_activations(torch::nn::Module& model, DecodeActivations mode);

}  // namespace qforge::nn
