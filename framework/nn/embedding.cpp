// Embedding: fake-quant table for PTQ/QAT; frozen lookups gather packed rows then dequantize.
#include "framework/nn/embedding.h"

#include <ATen/ATen.h>

#include <vector>

#include "framework/core/error.h"

namespace qforge::nn {

namespace {
// Rows of int8 tables with per-row (or per-group) scales are gathered before dequantizing.
bool row_gather(const QSpec& s) {
  return s.granularity != Granularity::kPerTensor && s.qtype.is_integer() && s.qtype.bits == 8 && s.qtype != quint8;
}

// Codebook tables whose rows start on a byte (dim a multiple of the codes per byte) gather the
// looked-up rows' packed indices and levels only.
bool codebook_gather(const QSpec& s, int64_t dim) {
  return s.qtype.is_codebook() && dim % (8 / codebook_storage_bits(s.qtype)) == 0;
}

// codebook[row, ..., code] for the rows `flat` of a frozen codebook table: [rows, dim] float.
at::Tensor gather_codebook_rows(const QuantizedTensor& fw, const at::Tensor& flat) {
  const int64_t num = fw.shape[0], dim = fw.shape[1];
  const int sb = codebook_storage_bits(fw.spec.qtype), per = 8 / sb;
  const at::Tensor bytes = fw.data.reshape({num, dim / per}).index_select(0, flat).to(at::kInt);
  std::vector<at::Tensor> fields;
  for (int a = 0; a < per; ++a) fields.push_back(at::bitwise_and(at::__rshift__(bytes, a * sb), (1 << sb) - 1));
  const int64_t n = flat.numel();
  const at::Tensor codes = at::stack(fields, -1).reshape({n, dim}).to(at::kLong);
  const at::Tensor cb = fw.codebook.to(at::kFloat);
  const int64_t L = fw.spec.qtype.levels();
  switch (fw.spec.granularity) {
    case Granularity::kPerTensor: return cb.reshape({L}).index_select(0, codes.reshape({-1})).reshape({n, dim});
    case Granularity::kPerChannel: return cb.index_select(0, flat).gather(1, codes);
    case Granularity::kPerGroup: {
      const int64_t g = fw.spec.group_size;
      return cb.index_select(0, flat).gather(2, codes.reshape({n, dim / g, g})).reshape({n, dim});
    }
  }
  return {};
}
}  // namespace

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
  if (frozen_) {
    if (codebook_gather(fweight_.spec, options.embedding_dim())) {
      const at::Tensor flat = indices.reshape({-1}).to(at::kCPU, at::kLong);
      std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
      shape.push_back(options.embedding_dim());
      return gather_codebook_rows(fweight_, flat).reshape(shape).to(indices.device());
    }
    if (row_gather(fweight_.spec)) {
      // Gather int8 rows and their scales, dequantize only those.
      // The frozen table stays on the CPU; rows gathered for indices on another device go there.
      const at::Tensor flat = indices.reshape({-1}).to(at::kCPU);
      const at::Tensor codes = fweight_.data.reshape(fweight_.shape).index_select(0, flat);
      QParams rows = fweight_.qparams();
      rows.scale = fweight_.scale.index_select(0, flat);
      rows.zero_point = fweight_.zero_point.index_select(0, flat);
      std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
      shape.push_back(options.embedding_dim());
      return dequantize_int(codes, rows).reshape(shape).to(indices.device());
    }
    ScopedTensorSwap swap(weight, fweight_.dequantize().to(indices.device()));
    return torch::nn::EmbeddingImpl::forward(indices);
  }
  if (!quantized()) return torch::nn::EmbeddingImpl::forward(indices);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::EmbeddingImpl::forward(indices);
}

void EmbeddingImpl::install_frozen(QuantizedTensor fw) {
  QF_REQUIRE(!frozen_, path_, " (Embedding): already frozen");
  QF_REQUIRE(fw.defined() && scheme_.weights, path_, " (Embedding): install_frozen needs the saved scheme attached");
  QF_REQUIRE(fw.shape == std::vector<int64_t>({options.num_embeddings(), options.embedding_dim()}), path_,
             " (Embedding): frozen table has shape ", at::IntArrayRef(fw.shape), ", layer expects [",
             options.num_embeddings(), ", ", options.embedding_dim(), "]");
  fweight_ = std::move(fw);
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
  if (row_gather(s)) {
    p.kernel = "gather_s8+dequantize_rows";
  } else if (codebook_gather(s, options.embedding_dim())) {
    p.kernel = "gather_codebook_rows";
  } else {
    p.kernel = "dequantize+embedding";
    p.fallback = detail::str_cat("row gather is implemented for int8 per-row/per-group tables; ", s.to_string(),
                                 " dequantizes the table per call");
  }
  return p;
}

}  // namespace qforge::nn
