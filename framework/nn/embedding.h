// qforge::nn::Embedding: torch::nn::Embedding with a weight quantizer (per-row or per-group
// scales). A frozen table is held as a PackedWeight (pack_embedding) that gathers and dequantizes
// only the looked-up rows where its format allows.
#pragma once

#include <torch/nn/modules/embedding.h>

#include "framework/api/quantized_tensor.h"
#include "framework/nn/packed_weight.h"
#include "framework/nn/quantizable.h"
#include "framework/nn/twin.h"

namespace qforge::nn {

class EmbeddingImpl : QFORGE_TWIN_BASE(torch::nn::EmbeddingImpl), public QuantizableLayer {
 public:
  // Private base: a torch::nn::EmbeddingImpl& cannot bind to this layer, so the base class's
  // non-virtual forward can never run (in float) in its place. Module stays a public base.
  using torch::nn::EmbeddingImpl::EmbeddingImpl;
  using torch::nn::EmbeddingImpl::options;
  using torch::nn::EmbeddingImpl::weight;
  using torch::nn::EmbeddingImpl::reset;
  using torch::nn::EmbeddingImpl::reset_parameters;
  using torch::nn::EmbeddingImpl::pretty_print;
  // Cloning would copy only the LibTorch twin (a float layer): refused with a clear error.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<c10::Device>& = c10::nullopt) const override {
    refuse_clone();
  }
  at::Tensor forward(const at::Tensor& indices);

  const char* layer_type() const override { return "Embedding"; }
  void load(torch::serialize::InputArchive& archive) override {
    refuse_torch_load_if_quantized();
    torch::nn::Module::load(archive);
  }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void check_scheme(const LayerScheme& scheme) const override;
  void install_frozen(QuantizedTensor fw) override;
  KernelPlan plan() const override;
  std::shared_ptr<QuantizableLayer> float_copy() const override;
  QuantizedTensor frozen_weight() const override { return packed_ ? packed_->weight() : QuantizedTensor{}; }

 protected:
  at::Tensor float_weight() const override { return weight; }
  int64_t frozen_storage_bytes() const override { return packed_ ? packed_->bytes() : 0; }

 private:
  PackedWeightPtr packed_;
};
TORCH_MODULE(Embedding);

}  // namespace qforge::nn
