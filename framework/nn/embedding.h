// qforge::nn::Embedding: torch::nn::Embedding with a weight quantizer (per-row or per-group
// scales). Frozen tables keep packed codes and dequantize only the rows a lookup gathers.
#pragma once

#include <torch/nn/modules/embedding.h>

#include "framework/quantized_tensor.h"
#include "framework/nn/quantizable.h"

namespace qforge::nn {

class EmbeddingImpl : public torch::nn::EmbeddingImpl, public QuantizableLayer {
 public:
  using torch::nn::EmbeddingImpl::EmbeddingImpl;
  at::Tensor forward(const at::Tensor& indices);

  const char* layer_type() const override { return "Embedding"; }
  torch::nn::Module& module() override { return *this; }
  const torch::nn::Module& module() const override { return *this; }
  void check_scheme(const LayerScheme& scheme) const override;
  void install_frozen(QuantizedTensor fw) override;
  QuantizedTensor frozen_weight() const override { return fweight_; }

 protected:
  at::Tensor float_weight() const override { return weight; }
  int64_t frozen_storage_bytes() const override { return fweight_.defined() ? fweight_.bytes() : 0; }

 private:
  QuantizedTensor fweight_;
};
TORCH_MODULE(Embedding);

}  // namespace qforge::nn
