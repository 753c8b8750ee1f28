// The frozen Embedding table as a PackedWeight: int8 per-row / per-group tables gather the
// looked-up rows' codes and scales, int4 / int3 ones (two codes a byte) the rows' bytes, byte-aligned
// codebook tables their packed indices and levels, and only those rows are dequantized; any other
// table is dequantized per call.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/nn/packed_weight_cpu.h"
#include "kernels/cpu/reference.h"

namespace qforge::nn {
namespace {

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

// int8 rows and their scales gathered, only those dequantized.
at::Tensor gather_s8_rows(const QuantizedTensor& fw, const at::Tensor& flat) {
  const at::Tensor codes = fw.data.reshape(fw.shape).index_select(0, flat);
  QParams rows = fw.qparams();
  rows.scale = fw.scale.index_select(0, flat);
  rows.zero_point = fw.zero_point.index_select(0, flat);
  return dequantize_int(codes, rows);
}

// int4 / int3 rows (two codes a byte, low nibble first; an even width, so each row starts on a
// byte) and their scales gathered, only those unpacked (as int_values() unpacks the whole table)
// and dequantized: the looked-up rows of dequantize(), bit for bit. A GGUF Q4_0 token table (Llama
// files) would otherwise unpack and dequantize every row for every token.
at::Tensor gather_nibble_rows(const QuantizedTensor& fw, const at::Tensor& flat) {
  const int64_t dim = fw.shape[1], n = flat.numel();
  const at::Tensor bytes = fw.data.reshape({fw.shape[0], dim / 2}).index_select(0, flat).contiguous();
  at::Tensor codes = at::empty({n, dim}, at::kChar);
  if (fw.spec.qtype.is_signed) {
    kernels::unpack_s4_reference(bytes.data_ptr<uint8_t>(), n * dim, codes.data_ptr<int8_t>());
  } else {
    kernels::unpack_u4_reference(bytes.data_ptr<uint8_t>(), n * dim, codes.data_ptr<int8_t>());
  }
  QParams rows = fw.qparams();
  rows.scale = fw.scale.index_select(0, flat);
  rows.zero_point = fw.zero_point.index_select(0, flat);
  return dequantize_int(codes, rows);
}

class PackedEmbedding final : public CpuPackedWeight {
 public:
  PackedEmbedding(QuantizedTensor fw, EmbeddingLookup lookup, std::string who)
      : fw_(std::move(fw)), lookup_(lookup), who_(std::move(who)) {
    // int8 rows with a float32 or fp16 scale per row or per group of a row and an int32 zero point
    // (or none but 0): views of the table's own tensors (no copy of a contiguous table), so a few
    // looked-up rows are read in one loop (few_rows).
    const QSpec& spec = fw_.spec;
    if (lookup_ == EmbeddingLookup::kGatherS8 && fw_.data.scalar_type() == at::kChar &&
        (fw_.scale.scalar_type() == at::kFloat || fw_.scale.scalar_type() == at::kHalf) &&
        ((spec.granularity == Granularity::kPerChannel && spec.axis == 0) || spec.granularity == Granularity::kPerGroup)) {
      const int64_t rows = fw_.shape[0];
      const bool zero = !fw_.zero_point.defined() || at::eq(fw_.zero_point, 0).all().item<bool>();
      const int64_t scales = fw_.scale.numel();
      if ((zero || (fw_.zero_point.scalar_type() == at::kInt && fw_.zero_point.numel() == scales)) &&
          scales % rows == 0 && fw_.shape[1] % (scales / rows) == 0) {
        row_codes_ = fw_.data.reshape(fw_.shape).contiguous();
        row_scale_ = fw_.scale.reshape({rows, -1}).contiguous();
        if (!zero) row_zero_ = fw_.zero_point.reshape({rows, -1}).contiguous();
      }
    }
  }
  LinearPath path() const override { return LinearPath::kDequant; }
  // indices [...] -> [..., dim] floats on the indices' device (the table stays on the CPU).
  at::Tensor forward(const at::Tensor& indices, const FrozenInput&) const override {
    const at::Tensor few = few_rows(indices);
    if (few.defined()) return few;
    const at::Tensor flat = indices.reshape({-1}).to(at::kCPU, at::kLong);
    std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
    shape.push_back(fw_.shape[1]);
    return rows(flat).reshape(shape).to(indices.device());
  }
  QuantizedTensor weight() const override { return fw_; }
  at::Tensor bias() const override { return {}; }
  int64_t bytes() const override { return fw_.bytes(); }
  // Lookups on any device read this CPU table (their rows are copied there per call).
  PackedWeightPtr to(const at::Device&) const override { return shared_from_this(); }

 private:
  // The float rows `flat` [n] (CPU, int64) of the table: [n, dim].
  at::Tensor rows(const at::Tensor& flat) const {
    switch (lookup_) {
      case EmbeddingLookup::kGatherS8: return gather_s8_rows(fw_, flat);
      case EmbeddingLookup::kGatherNibbles: return gather_nibble_rows(fw_, flat);
      case EmbeddingLookup::kGatherCodebook: return gather_codebook_rows(fw_, flat);
      case EmbeddingLookup::kDequantize: return at::embedding(fw_.dequantize(), flat);
    }
    return {};
  }

  // A decode step's lookup (a few CPU int64 indices) of an int8 table with rows' own scales:
  // dequantize_int's formula (float(q) − float(z)) · s per element, bit for bit gather_s8_rows,
  // without its dozen dispatched ops. Undefined where it does not apply.
  at::Tensor few_rows(const at::Tensor& indices) const {
    constexpr int64_t kFewRows = 16;
    if (!row_codes_.defined() || !indices.device().is_cpu() || indices.scalar_type() != at::kLong ||
        !indices.is_contiguous() || indices.numel() > kFewRows)
      return {};
    const int64_t rows = fw_.shape[0], dim = fw_.shape[1], G = row_scale_.size(1), group = dim / G, n = indices.numel();
    std::vector<int64_t> shape(indices.sizes().begin(), indices.sizes().end());
    shape.push_back(dim);
    at::Tensor out = at::empty(shape, at::kFloat);
    const int64_t* ids = indices.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      QF_REQUIRE(ids[i] >= 0 && ids[i] < rows, who_, ": index ", ids[i], " is outside the table's ", rows, " rows");
    const int8_t* codes = row_codes_.data_ptr<int8_t>();
    const int32_t* zero = row_zero_.defined() ? row_zero_.data_ptr<int32_t>() : nullptr;
    float* y = out.data_ptr<float>();
    auto fill = [&](const auto* scale) {  // float(scale) and float(zero) as .to(kFloat) gives them
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = ids[i];
        for (int64_t d = 0; d < dim; ++d) {
          const int64_t g = r * G + d / group;
          const float z = zero ? static_cast<float>(zero[g]) : 0.0f;
          y[i * dim + d] = (static_cast<float>(codes[r * dim + d]) - z) * static_cast<float>(scale[g]);
        }
      }
    };
    if (row_scale_.scalar_type() == at::kFloat) {
      fill(row_scale_.data_ptr<float>());
    } else {
      fill(row_scale_.data_ptr<at::Half>());
    }
    return out;
  }

  QuantizedTensor fw_;
  EmbeddingLookup lookup_;
  std::string who_;
  at::Tensor row_codes_, row_scale_, row_zero_;  // few_rows' table (row_zero_ undefined when all 0);
                                                 // row_codes_ undefined where few_rows does not apply
};

}  // namespace

EmbeddingLookup embedding_lookup(const QSpec& s, int64_t dim) {
  if (s.granularity != Granularity::kPerTensor && s.qtype.is_integer() && s.qtype.bits == 8 && s.qtype != quint8)
    return EmbeddingLookup::kGatherS8;
  if (s.granularity != Granularity::kPerTensor && nibble_packed(s.qtype) && dim % 2 == 0)
    return EmbeddingLookup::kGatherNibbles;
  if (s.qtype.is_codebook() && dim % (8 / codebook_storage_bits(s.qtype)) == 0) return EmbeddingLookup::kGatherCodebook;
  return EmbeddingLookup::kDequantize;
}

PackedWeightPtr pack_embedding(QuantizedTensor fw, const std::string& who) {
  QF_REQUIRE(fw.defined() && fw.shape.size() == 2, who, ": a frozen Embedding table is [num_embeddings, dim], got ",
             at::IntArrayRef(fw.shape));
  const EmbeddingLookup lookup = embedding_lookup(fw.spec, fw.shape[1]);
  return std::make_shared<PackedEmbedding>(std::move(fw), lookup, who);
}

}  // namespace qforge::nn
