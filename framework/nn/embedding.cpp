// Embedding: fake-quant table for PTQ/QAT; frozen lookups through the table's PackedWeight.
#include "framework/nn/embedding.h"

#include <ATen/ATen.h>

#include <vector>

#include "framework/core/error.h"

namespace qforge::nn {

void EmbeddingImpl::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  QF_REQUIRE(scheme.activations == ActivationMode::kNone, path_,
             " (Embedding): inputs are indices; activation quantization does not apply");
  if (scheme.weights) {
    const QSpec& s = scheme.weights->spec;
    QF_REQUIRE(s.granularity != Granularity::kPerChannel || s.axis == 0, path_,
               " (Embedding): per-channel scales are per row (axis 0), got axis ", s.axis);
    QF_REQUIRE(s.granularity != Granularity::kPerGroup || options.embedding_dim() % s.group_size == 0, path_,
               " (Embedding): embedding_dim ", options.embedding_dim(), " is not a multiple of group_size ",
               s.group_size);
  }
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& indices) {
  note_input(indices);
  // The frozen table stays on the CPU; rows looked up for indices on another device go there.
  if (frozen_) return packed_->forward(indices, FrozenInput{});
  if (!quantized()) return torch::nn::EmbeddingImpl::forward(indices);
  // With the weight cache off (a Calibration), only the looked-up rows are fake-quantized: no copy
  // of the whole table per forward. max_norm rescales the table's rows in place: the full path.
  if (weight_q_ && !options.max_norm()) {
    const at::Tensor rows = weight_q_->weight_rows(weight, indices);
    if (rows.defined()) {
      std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
      shape.push_back(options.embedding_dim());
      return rows.reshape(shape);
    }
  }
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::EmbeddingImpl::forward(indices);
}

void EmbeddingImpl::install_frozen(QuantizedTensor fw) {
  QF_REQUIRE(!frozen_, path_, " (Embedding): already frozen");
  QF_REQUIRE(fw.defined() && scheme_.weights, path_, " (Embedding): install_frozen needs the saved scheme attached");
  QF_REQUIRE(fw.shape == std::vector<int64_t>({options.num_embeddings(), options.embedding_dim()}), path_,
             " (Embedding): frozen table has shape ", at::IntArrayRef(fw.shape), ", layer expects [",
             options.num_embeddings(), ", ", options.embedding_dim(), "]");
  packed_ = pack_embedding(std::move(fw), path_ + " (Embedding)");
  if (parameters_.contains("weight")) parameters_.erase("weight");
  weight = at::Tensor();
  if (weight_q_) weight_q_->clear_cache();
  mark_frozen();
}

std::shared_ptr<QuantizableLayer> EmbeddingImpl::float_copy() const {
  require_not_frozen("float_copy");
  RngStateGuard rng;
  auto c = std::make_shared<EmbeddingImpl>(options);
  copy_float_parameters(c->weight, weight);
  return c;
}

KernelPlan EmbeddingImpl::plan() const {
  KernelPlan p;
  const QSpec s = scheme_.weights ? scheme_.weights->spec : QSpec{};
  const EmbeddingLookup lookup = embedding_lookup(s, options.embedding_dim());
  if (lookup == EmbeddingLookup::kGatherS8) {
    p.kernel = "gather_s8+dequantize_rows";
  } else if (lookup == EmbeddingLookup::kGatherNibbles) {
    p.kernel = "gather_s4+dequantize_rows";
  } else if (lookup == EmbeddingLookup::kGatherCodebook) {
    p.kernel = "gather_codebook_rows";
  } else {
    p.kernel = "dequantize+embedding";
    p.fallback = detail::str_cat("row gather is implemented for int8, int4 and int3 per-row/per-group tables (int4 / int3 of even width) and byte-aligned codebooks; ", s.to_string(),
                                 " dequantizes the table per call");
  }
  return p;
}

}  // namespace qforge::nn
