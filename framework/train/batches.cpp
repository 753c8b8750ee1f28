// Batch sources.
#include "framework/train/batches.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/data/char_tokenizer.h"
#include "framework/data/language_id.h"

namespace qforge::train {

TensorBatches::TensorBatches(at::Tensor input, at::Tensor target, at::Tensor mask)
    : input_(std::move(input)), target_(std::move(target)), mask_(std::move(mask)) {
  QF_REQUIRE(input_.defined() && target_.defined() && input_.size(0) == target_.size(0), "train: input has ",
             input_.defined() ? input_.size(0) : 0, " rows, target ", target_.defined() ? target_.size(0) : 0);
  QF_REQUIRE(!mask_.defined() || mask_.sizes() == input_.sizes(), "train: mask ", mask_.sizes(),
             " does not match input ", input_.sizes());
}

Batch TensorBatches::get(const at::Tensor& idx) const {
  Batch b{input_.index_select(0, idx), target_.index_select(0, idx), {}};
  if (mask_.defined()) {
    b.mask = mask_.index_select(0, idx);
    const int64_t len = std::max<int64_t>(1, b.mask.sum(1).max().item<int64_t>());
    b.input = b.input.narrow(1, 0, len).contiguous();
    b.mask = b.mask.narrow(1, 0, len).contiguous();
  }
  return b;
}

TensorBatches text_classification_batches(const data::TextExamples& ex, const data::CharTokenizer& tok,
                                          int64_t max_len) {
  QF_REQUIRE(ex.size() > 0, "train: no examples to batch");
  const data::TokenBatch t = tok.encode_batch(ex.text, max_len);
  return TensorBatches(t.input_ids, at::tensor(ex.label, at::kLong), t.attention_mask);
}

LmBatches::LmBatches(at::Tensor tokens, int64_t block, int64_t stride)
    : tokens_(tokens.to(at::kLong).contiguous()), block_(block), stride_(stride) {
  QF_REQUIRE(block_ > 0 && stride_ > 0, "train: block_size and stride must be > 0");
  QF_REQUIRE(tokens_.dim() == 1 && tokens_.numel() > block_, "train: need a 1-D token stream longer than the block (",
             block_, "), got ", tokens_.sizes());
  count_ = (tokens_.numel() - block_ - 1) / stride_ + 1;
}

Batch LmBatches::get(const at::Tensor& idx) const {
  const at::Tensor starts = idx.to(at::kLong) * stride_;
  const at::Tensor offsets = at::arange(block_ + 1, at::kLong);
  const at::Tensor windows = tokens_.index_select(0, (starts.unsqueeze(1) + offsets).flatten()).view({-1, block_ + 1});
  return {windows.narrow(1, 0, block_).contiguous(), windows.narrow(1, 1, block_).contiguous(), {}};
}

}  // namespace qforge::train
