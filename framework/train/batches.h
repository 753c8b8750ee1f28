// Batch sources for the training / evaluation loops: indexable datasets that build a Batch from
// a set of example indices (the loops choose and shuffle the indices).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace qforge::data {
class CharTokenizer;
struct TextExamples;
}  // namespace qforge::data

namespace qforge::train {

struct Batch {
  at::Tensor input;   // model input (images, token ids)
  at::Tensor target;  // int64 labels [B] or next tokens [B, T]
  at::Tensor mask;    // optional attention mask [B, T] (1 = real token)
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t size() const = 0;                           // number of examples
  virtual Batch get(const at::Tensor& indices) const = 0;     // indices: int64 [B]
};

// Rows of tensors: input [N, ...], target [N], optional mask [N, L]. With a mask, columns that are
// padding in every row of a batch are trimmed (dynamic padding).
class TensorBatches : public BatchSource {
 public:
  TensorBatches(at::Tensor input, at::Tensor target, at::Tensor mask = {});
  int64_t size() const override { return target_.size(0); }
  Batch get(const at::Tensor& indices) const override;

 private:
  at::Tensor input_, target_, mask_;
};

// Text classification: tokenizes every example once ([CLS] + characters, at most max_len tokens).
TensorBatches text_classification_batches(const data::TextExamples& examples, const data::CharTokenizer& tokenizer,
                                          int64_t max_len);

// Language modelling on a token stream: example i is the window starting at i * stride, input
// tokens[s, s + block), target tokens[s + 1, s + block + 1).
class LmBatches : public BatchSource {
 public:
  LmBatches(at::Tensor tokens, int64_t block_size, int64_t stride);
  int64_t size() const override { return count_; }
  Batch get(const at::Tensor& indices) const override;

 private:
  at::Tensor tokens_;
  int64_t block_, stride_, count_;
};

}  // namespace qforge::train
