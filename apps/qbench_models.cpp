// qbench cases for whole models, as users run them:
//   model_cnn_b1, model_cnn_b128     the Fashion-MNIST CNN (SmallCnn), one image / 128 images
//   model_bert_b1, model_bert_b8     BERT-base shapes (12 layers, hidden 768, 12 heads, FFN 3072,
//                                    sequence 128, random weights), 1 / 8 sequences
//   qat_step_cnn, qat_step_bert      one training step (forward, cross-entropy, backward, SGD)
//   model_gpt2_decode_w8, _w4        GPT-2 small decoding 32 tokens one at a time (KV cache),
//                                    frozen weight-only int8 / int4 (freeze_for_decode, apps/qbench_models.h)
// impl "libtorch": the float model (qforge's float layers run LibTorch's own ops: at::linear,
// at::conv2d, at::matmul); impl "qforge": the same model frozen to int8 (W8A8: int8 per-channel
// weights, int8 static activations calibrated by min/max on random inputs; the CNN's BatchNorm
// folded first), or for qat_step the QAT step of the model quantized that way (fake-quant
// forward, straight-through backward). Linear and conv layers run integer kernels (conv through
// im2col + the s8 GEMM, ReLU fused), attention's Q.K^T and P.V the batched int8 product
// (bmm_s8s8f32); describe() lists what each layer runs. No LibTorch
// dynamic-int8 row: LibTorch's C++ API has no quantize_dynamic for a module tree.
// Regime: BERT-base's weights (436 MB float, 110 MB int8) exceed the last-level cache, so every
// forward reads them from DRAM; the CNN's (1.7 MB float) stay in cache between calls.
#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <vector>

#include "apps/qbench_models.h"
#include "apps/qbench_registry.h"
#include "framework/models/cnn.h"

namespace qforge::bench {
namespace {

Scheme w8a8() {
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  return s;
}

constexpr int64_t kSeq = 128;

// The SmallCnn of seed 0 quantized W8A8 (BatchNorm folded first), calibrated on random images.
std::shared_ptr<models::SmallCnn> calibrated_w8a8_cnn() {
  torch::manual_seed(0);
  auto q = std::make_shared<models::SmallCnn>();
  (*q)->eval();
  (*q)->fold_batch_norm();
  quantize(*q, w8a8());
  Calibration calib(*q);
  at::NoGradGuard g;
  for (int i = 0; i < 4; ++i) (*q)->forward(at::randn({32, 1, 28, 28}));
  return q;
}

// The BERT of seed 0 quantized W8A8, calibrated on two random sequences.
std::shared_ptr<models::BertForSequenceClassification> calibrated_w8a8_bert(const models::BertConfig& cfg) {
  torch::manual_seed(0);
  auto q = std::make_shared<models::BertForSequenceClassification>(cfg);
  (*q)->eval();
  quantize(*q, w8a8());
  Calibration calib(*q);
  at::NoGradGuard g;
  (*q)->forward(at::randint(1, cfg.vocab_size, {2, kSeq}, at::kLong));
  return q;
}

// Eval-mode forward of the float model (seed 0, as the quantized one) beside the frozen one.
template <class M>
std::vector<Case> frozen_vs_float(const std::string& shape, std::shared_ptr<M> fp, std::shared_ptr<M> q, at::Tensor x) {
  (*fp)->eval();
  freeze(*q);
  Case c{shape, 0, {}};
  c.impls.push_back({"libtorch", [fp, x] {
    at::NoGradGuard g;
    (*fp)->forward(x);
  }});
  c.impls.push_back({"qforge", [q, x] {
    at::NoGradGuard g;
    (*q)->forward(x);
  }});
  return {c};
}

std::vector<Case> cnn_cases(int64_t batch) {
  auto q = calibrated_w8a8_cnn();
  torch::manual_seed(0);
  auto fp = std::make_shared<models::SmallCnn>();  // before the input draws from the generator
  return frozen_vs_float("b" + std::to_string(batch) + "_1x28x28", fp, q, at::randn({batch, 1, 28, 28}));
}

std::vector<Case> bert_cases(int64_t batch) {
  const models::BertConfig cfg = bert_base(12);
  auto q = calibrated_w8a8_bert(cfg);
  torch::manual_seed(0);
  auto fp = std::make_shared<models::BertForSequenceClassification>(cfg);
  return frozen_vs_float("L12_H768_b" + std::to_string(batch) + "_s128", fp, q,
                         at::randint(1, cfg.vocab_size, {batch, kSeq}, at::kLong));
}

// One SGD step of `model` on (x, y) through `forward`.
template <class M, class Fwd>
std::function<void()> train_step(std::shared_ptr<M> model, Fwd forward, at::Tensor target) {
  auto opt = std::make_shared<torch::optim::SGD>((*model)->parameters(), torch::optim::SGDOptions(1e-4));
  return [model, forward, target, opt] {
    opt->zero_grad();
    at::cross_entropy_loss(forward(), target).backward();
    opt->step();
  };
}

std::vector<Case> qat_cnn_cases() {
  constexpr int64_t kBatch = 64;
  auto q = calibrated_w8a8_cnn();
  torch::manual_seed(0);
  auto fp = std::make_shared<models::SmallCnn>();
  (*fp)->train();
  (*q)->train();
  const at::Tensor x = at::randn({kBatch, 1, 28, 28}), y = at::randint(0, 10, {kBatch}, at::kLong);
  Case c{"b64_1x28x28", 0, {}};
  c.impls.push_back({"libtorch", train_step(fp, [fp, x] { return (*fp)->forward(x); }, y)});
  c.impls.push_back({"qforge", train_step(q, [q, x] { return (*q)->forward(x); }, y)});
  return {c};
}

std::vector<Case> qat_bert_cases() {
  constexpr int64_t kBatch = 8, kLayers = 4;
  const models::BertConfig cfg = bert_base(kLayers);
  auto q = calibrated_w8a8_bert(cfg);
  torch::manual_seed(0);
  auto fp = std::make_shared<models::BertForSequenceClassification>(cfg);
  (*fp)->train();
  (*q)->train();
  const at::Tensor ids = at::randint(1, cfg.vocab_size, {kBatch, kSeq}, at::kLong);
  const at::Tensor y = at::randint(0, cfg.num_labels, {kBatch}, at::kLong);
  Case c{"L4_H768_b8_s128", 0, {}};
  c.impls.push_back({"libtorch", train_step(fp, [fp, ids] { return (*fp)->forward(ids); }, y)});
  c.impls.push_back({"qforge", train_step(q, [q, ids] { return (*q)->forward(ids); }, y)});
  return {c};
}

// ---- GPT-2 small decoding token by token: 12 layers, hidden 768, 12 heads, vocabulary 50257
// (random weights, seed 0). Each run feeds 32 tokens one at a time (greedy: each step's argmax is
// the next input) after a 16-token prompt already in the KV cache. "libtorch": the float model,
// its LM head tied to the token embedding (at::linear on the [50257, 768] table). "qforge": the
// same weights with the head untied (untie_lm_head(): same logits), frozen weight-only: every
// Linear of the blocks and the head int8 per channel (w8) or int4 in groups of 128 (w4) on the
// weight-only GEMV kernels; both embeddings int8 per row (row gather; an int4 table would be
// dequantized whole per call). LayerNorms stay float. Regime: DRAM (float 498 MB of weights). ----

constexpr int64_t kPrompt = 16, kDecode = 32;

// Greedy decoding of kDecode tokens after `prompt`, whose cache is `prefilled`.
std::function<void()> decode(std::shared_ptr<models::Gpt2LMHeadModel> m, models::Gpt2KvCache prefilled,
                             at::Tensor first) {
  return [m, prefilled, first] {
    at::NoGradGuard g;
    models::Gpt2KvCache cache = prefilled;  // the cached tensors are never written in place
    at::Tensor next = first;
    for (int64_t t = 0; t < kDecode; ++t) next = (*m)->forward(next, &cache).select(1, 0).argmax(-1, true);
  };
}

std::vector<Case> gpt2_decode_cases(const QType& qtype) {
  const models::Gpt2Config cfg = gpt2_small();
  torch::manual_seed(0);
  auto fp = std::make_shared<models::Gpt2LMHeadModel>(cfg);
  (*fp)->eval();
  torch::manual_seed(1);
  auto q = std::make_shared<models::Gpt2LMHeadModel>(cfg);
  (*q)->eval();
  models::load_model_state(**q, models::model_state(**fp));
  freeze_for_decode(*q, qtype);
  const at::Tensor prompt = at::randint(0, cfg.vocab_size, {1, kPrompt}, at::kLong);
  models::Gpt2KvCache fp_cache, q_cache;
  at::Tensor fp_first, q_first;
  {
    at::NoGradGuard g;
    fp_first = (*fp)->forward(prompt, &fp_cache).select(1, kPrompt - 1).argmax(-1, true);
    q_first = (*q)->forward(prompt, &q_cache).select(1, kPrompt - 1).argmax(-1, true);
  }
  Case c{"L12_H768_prompt16_decode32_tokens", 0, {}};
  c.impls.push_back({"libtorch", decode(fp, fp_cache, fp_first)});
  c.impls.push_back({"qforge", decode(q, q_cache, q_first)});
  return {c};
}

const Register kCnnB1(70, "model_cnn_b1", [] { return cnn_cases(1); });
const Register kCnnB128(71, "model_cnn_b128", [] { return cnn_cases(128); });
const Register kBertB1(72, "model_bert_b1", [] { return bert_cases(1); });
const Register kBertB8(73, "model_bert_b8", [] { return bert_cases(8); });
const Register kQatCnn(74, "qat_step_cnn", qat_cnn_cases);
const Register kQatBert(75, "qat_step_bert", qat_bert_cases);
const Register kGpt2W8(76, "model_gpt2_decode_w8", [] { return gpt2_decode_cases(qint8); });
const Register kGpt2W4(77, "model_gpt2_decode_w4", [] { return gpt2_decode_cases(qint4); });

}  // namespace
}  // namespace qforge::bench
