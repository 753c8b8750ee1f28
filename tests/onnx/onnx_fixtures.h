// Small frozen models of each exportable type, quantized as the shipped recipes do (static
// int8 activations with the histogram observer; dynamic per-token for GPT-2; quint8 affine for
// the MLP), with their inputs: shared by onnx_export_test and onnx_fixture_tool.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "framework/models/bert.h"
#include "framework/models/cnn.h"
#include "framework/models/gpt2.h"
#include "framework/models/mlp.h"
#include "framework/api/quantize.h"

namespace qforge::onnx_testing {

struct Input {
  std::string name;
  at::Tensor value;  // float32 or int64
};

struct Fixture {
  std::string name;
  std::shared_ptr<torch::nn::Module> model;
  std::vector<Input> inputs;
  // The model's forward on `inputs` (eval, no grad).
  std::function<at::Tensor(const std::vector<Input>&)> forward;
  // The fake-quant model's output on `inputs` just before freeze (undefined for float fixtures):
  // how far qforge's own frozen kernels are from it is the frozen model's tolerance.
  at::Tensor fake_quant_output;
};

inline models::BertConfig tiny_bert_config() {
  models::BertConfig c;
  c.vocab_size = 120;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 64;
  c.max_position_embeddings = 64;
  c.num_labels = 3;
  c.initializer_range = 0.2;  // logits of order 1, so a wrong mask or op shows in the comparison
  return c;
}

inline models::Gpt2Config tiny_gpt2_config() {
  models::Gpt2Config c;
  c.vocab_size = 120;
  c.n_positions = 64;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.initializer_range = 0.2;
  return c;
}

inline Scheme w8a8_static() {
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  return s;
}

// Quantizes with `scheme`, calibrates on `batches` calls of forward, freezes.
inline void quantize_and_freeze(Fixture& f, const Scheme& scheme, const std::vector<std::vector<Input>>& batches) {
  f.model->eval();
  quantize(*f.model, scheme);
  {
    Calibration c(*f.model);
    for (const auto& b : batches) f.forward(b);
  }
  f.fake_quant_output = f.forward(f.inputs);
  freeze(*f.model);
}

inline std::vector<Input> token_inputs(int64_t B, int64_t T, int64_t vocab, bool mask) {
  std::vector<Input> in{{"input_ids", at::randint(vocab, {B, T}, at::kLong)}};
  if (mask) {
    // Row b keeps its first T - 2b tokens (padding at the end, as the data loaders pad).
    at::Tensor m = at::ones({B, T}, at::kLong);
    for (int64_t b = 0; b < B; ++b) m[b].narrow(0, T - 2 * b, 2 * b).fill_(0);
    in.push_back({"attention_mask", m});
  }
  return in;
}

inline Fixture cnn_fixture(bool frozen = true) {
  models::SmallCnnOptions o;
  o.channels = {8, 16};
  o.hidden = 32;
  auto m = std::make_shared<models::SmallCnnImpl>(o);
  m->eval();
  m->fold_batch_norm();
  Fixture f{"cnn", m, {{"input", at::rand({3, 1, 28, 28})}}, nullptr};
  f.forward = [m](const std::vector<Input>& in) {
    at::NoGradGuard g;
    return m->forward(in[0].value);
  };
  if (frozen) {
    std::vector<std::vector<Input>> batches;
    for (int i = 0; i < 4; ++i) batches.push_back({{"input", at::rand({16, 1, 28, 28})}});
    quantize_and_freeze(f, w8a8_static(), batches);
  }
  return f;
}

inline Fixture mlp_fixture(bool frozen = true) {
  auto m = std::make_shared<models::MlpImpl>(models::MlpOptions{});
  Fixture f{"mlp", m, {{"input", at::rand({4, 28 * 28})}}, nullptr};
  f.forward = [m](const std::vector<Input>& in) {
    at::NoGradGuard g;
    return m->forward(in[0].value);
  };
  if (frozen) {
    Scheme s = w8a8_static();
    s.activation_qtype = quint8;  // affine uint8 activations: zero points that are not 0
    s.activation_symmetric = false;
    std::vector<std::vector<Input>> batches;
    for (int i = 0; i < 4; ++i) batches.push_back({{"input", at::rand({32, 28 * 28})}});
    quantize_and_freeze(f, s, batches);
  }
  return f;
}

// attention: the attention products' static scales (per head: per-axis QDQ on the heads axis).
inline Fixture bert_fixture(bool frozen = true, AttentionScales attention = AttentionScales::kPerTensor) {
  const models::BertConfig c = tiny_bert_config();
  auto m = std::make_shared<models::BertForSequenceClassificationImpl>(c);
  m->eval();
  Fixture f{"bert", m, token_inputs(3, 12, c.vocab_size, true), nullptr};
  f.forward = [m](const std::vector<Input>& in) {
    at::NoGradGuard g;
    return m->forward(in[0].value, in[1].value);
  };
  if (frozen) {
    Scheme s = w8a8_static();
    s.attention_scales = attention;
    s.rules.push_back(LayerRule{"classifier", true});
    std::vector<std::vector<Input>> batches;
    for (int i = 0; i < 4; ++i) batches.push_back(token_inputs(4, 12, c.vocab_size, true));
    quantize_and_freeze(f, s, batches);
  }
  return f;
}

// `kv`: the KV-cache scheme set before quantizing (a static one is calibrated by the same pass).
inline Fixture gpt2_fixture_with_kv(bool frozen, const KvCacheScheme& kv) {
  const models::Gpt2Config c = tiny_gpt2_config();
  auto m = std::make_shared<models::Gpt2LMHeadModelImpl>(c);
  m->eval();
  m->set_kv_cache_scheme(kv);
  Fixture f{"gpt2", m, token_inputs(2, 10, c.vocab_size, false), nullptr};
  f.forward = [m](const std::vector<Input>& in) {
    at::NoGradGuard g;
    return m->forward(in[0].value);
  };
  if (frozen) {
    Scheme s(qint8);
    s.activations = ActivationMode::kDynamicPerToken;
    s.rules.push_back(LayerRule{"transformer.wte", true});  // the tied head stays float, as gpt2 recipes keep it
    if (kv.quantized()) {
      // Attention products on a quantized cache stay float (as the KV-cache recipes keep them):
      // requantizing keys already on the cache's grid per column makes exact rounding ties
      // common, where QuantizeLinear's division and fake-quant's reciprocal multiply part ways.
      s.rules.push_back(LayerRule{"*.qk_matmul", true});
      s.rules.push_back(LayerRule{"*.av_matmul", true});
    }
    std::vector<std::vector<Input>> batches;
    batches.push_back(token_inputs(2, 10, c.vocab_size, false));
    quantize_and_freeze(f, s, batches);
  }
  return f;
}

inline Fixture gpt2_fixture(bool frozen = true) { return gpt2_fixture_with_kv(frozen, KvCacheScheme{}); }

// GPT-2's int8 KV cache with static scales per head (written as QDQ pairs on keys and values).
inline KvCacheScheme static_int8_kv_cache() {
  KvCacheScheme kv;
  kv.qtype = qint8;
  kv.symmetric = false;
  kv.scales = KvScales::kStaticHead;
  return kv;
}

// The quantized fixtures, BERT with per-head attention scales, GPT-2 with a static int8 KV cache,
// and GPT-2 in float (the export of a
// model nobody quantized).
inline std::vector<Fixture> all_fixtures() {
  Fixture float_gpt2 = gpt2_fixture(false);
  float_gpt2.name = "gpt2_float";
  Fixture kv8 = gpt2_fixture_with_kv(true, static_int8_kv_cache());
  kv8.name = "gpt2_kv8";
  Fixture bert_head = bert_fixture(true, AttentionScales::kPerHead);
  bert_head.name = "bert_head";
  return {cnn_fixture(), mlp_fixture(), bert_fixture(), bert_head, gpt2_fixture(), kv8, float_gpt2};
}

}  // namespace qforge::onnx_testing
