// The frozen form of the RPQ layers (framework/nn/rpq.h) as a PackedWeight: float32 codebooks
// [H, 256, D], uint8 indices [H, C] and the bias. Linear and Embedding run their forward here
// (rpq_linear, rpq_gather_rows: what the unfrozen layers run, so the bits agree); convolutions and
// Bilinear run their ATen op on rpq_split_weight(). CPU only: there is no CUDA form.
#include <ATen/ATen.h>

#include "framework/nn/packed_weight_cpu.h"
#include "framework/nn/rpq.h"

namespace qforge::nn {
namespace {

class PackedRpq final : public CpuPackedWeight {
 public:
  PackedRpq(at::Tensor codebooks, at::Tensor indices, at::Tensor bias, RpqForward form, std::string who)
      : codebooks_(std::move(codebooks)), indices_(std::move(indices)), bias_(std::move(bias)), form_(form),
        who_(std::move(who)) {}
  // No integer path: the float weight is generated from the codebooks per call (or summed through them).
  LinearPath path() const override { return LinearPath::kDequant; }
  at::Tensor forward(const at::Tensor& x, const FrozenInput& in) const override {
    QF_REQUIRE(x.device().is_cpu(), who_, ": frozen RPQ layers run on the CPU; the input is on ", x.device());
    QF_REQUIRE(!in.quantizer, who_, ": RPQ layers take float activations");
    switch (form_) {
      case RpqForward::kLinear: check_linear_call(in); return rpq_linear(x, codebooks_, indices_, bias_);
      case RpqForward::kEmbedding: return rpq_gather_rows(codebooks_, indices_, x);
      case RpqForward::kDense: break;
    }
    throw Error(who_ + ": a frozen RPQ convolution or Bilinear has no packed forward (the layer runs its ATen op on "
                "rpq_split_weight())");
  }
  // Codebooks of sub-vectors are no QuantizedTensor grid: undefined (rpq_split_weight() expands them).
  QuantizedTensor weight() const override { return {}; }
  at::Tensor bias() const override { return bias_; }
  int64_t bytes() const override {
    return codebooks_.nbytes() + indices_.nbytes() + (bias_.defined() ? bias_.nbytes() : 0);
  }
  PackedWeightPtr to(const at::Device& device) const override {
    QF_REQUIRE(device.is_cpu(), who_, ": a frozen RPQ layer runs on the CPU only (its packed weight has no CUDA "
               "form), not on ", device, "; move the layer before freeze(): unfrozen, its forward runs on any device");
    return shared_from_this();
  }
  at::Tensor split_weight() const { return rpq_expand(codebooks_, indices_); }

 private:
  at::Tensor codebooks_, indices_, bias_;
  RpqForward form_;
  std::string who_;
};

}  // namespace

PackedWeightPtr pack_rpq(at::Tensor codebooks, at::Tensor indices, at::Tensor bias, RpqForward form,
                         const std::string& who) {
  QF_REQUIRE(codebooks.defined() && codebooks.dim() == 3 && codebooks.scalar_type() == at::kFloat &&
                 codebooks.size(1) == kRpqCodebookSize && codebooks.is_contiguous(),
             who, ": RPQ codebooks must be contiguous float32 [H, 256, D]");
  QF_REQUIRE(indices.defined() && indices.dim() == 2 && indices.scalar_type() == at::kByte &&
                 indices.size(0) == codebooks.size(0),
             who, ": RPQ indices must be uint8 [H, C] with the codebooks' H");
  QF_REQUIRE(codebooks.is_cpu() && indices.is_cpu() && (!bias.defined() || bias.is_cpu()), who,
             ": RPQ packed weights are built on the CPU");
  return std::make_shared<PackedRpq>(std::move(codebooks), std::move(indices), std::move(bias), form, who);
}

at::Tensor rpq_split_weight(const PackedWeight& packed) {
  const auto* rpq = dynamic_cast<const PackedRpq*>(&packed);
  QF_CHECK(rpq, "rpq_split_weight: not an RPQ packed weight");
  return rpq->split_weight();
}

}  // namespace qforge::nn
