// BERT encoder of qforge layers with Hugging Face's parameter names, so HF checkpoints load as is.
//   BertModel:  embeddings.{word,position,token_type}_embeddings, embeddings.LayerNorm,
//               encoder.layer.N.attention.self.{query,key,value}, encoder.layer.N.attention.output.{dense,LayerNorm},
//               encoder.layer.N.intermediate.dense, encoder.layer.N.output.{dense,LayerNorm}, pooler.dense
//   BertForSequenceClassification: bert.* (the above) + classifier (as HF's class of that name)
// Attention scores Q·K^T and probabilities x V go through qforge::nn::MatMul ("qk_matmul",
// "av_matmul"), so quantize() can quantize them; they hold no parameters.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "framework/models/field_rule.h"
#include "framework/models/state_dict.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "framework/nn/matmul.h"

namespace qforge::models {

// The fields of HF's BertConfig that shape the model.
struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  std::string hidden_act = "gelu";  // "gelu" (erf), "gelu_new"/"gelu_pytorch_tanh" (tanh), "relu"
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  double initializer_range = 0.02;
  int64_t pad_token_id = 0;
  int64_t num_labels = 2;  // from "num_labels" or the size of "id2label"; written as id2label/label2id

  // Parses an HF config.json object; unknown fields are ignored, bad values are errors.
  static BertConfig from_json(const nlohmann::json& j);
  static BertConfig from_file(const std::string& path);
  nlohmann::json to_json() const;
  // BertForSequenceClassification's parameters (pooler and classifier included), counted from
  // the fields before anything is allocated (a double: huge configs must not overflow).
  double parameter_count() const;

  // The fields read and written as they are (config_field.h), in reading order.
  template <typename Self, typename Visit>
  static void fields(Self& c, Visit&& visit) {
    visit("vocab_size", c.vocab_size, FieldRule::kPositive);
    visit("hidden_size", c.hidden_size, FieldRule::kPositive);
    visit("num_hidden_layers", c.num_hidden_layers, FieldRule::kPositive);
    visit("num_attention_heads", c.num_attention_heads, FieldRule::kPositive);
    visit("intermediate_size", c.intermediate_size, FieldRule::kPositive);
    visit("hidden_act", c.hidden_act, FieldRule::kAny);
    visit("hidden_dropout_prob", c.hidden_dropout_prob, FieldRule::kAny);
    visit("attention_probs_dropout_prob", c.attention_probs_dropout_prob, FieldRule::kAny);
    visit("max_position_embeddings", c.max_position_embeddings, FieldRule::kPositive);
    visit("type_vocab_size", c.type_vocab_size, FieldRule::kPositive);
    visit("layer_norm_eps", c.layer_norm_eps, FieldRule::kAny);
    visit("initializer_range", c.initializer_range, FieldRule::kAny);
    visit("pad_token_id", c.pad_token_id, FieldRule::kAny);
  }
};

class BertEmbeddingsImpl : public torch::nn::Cloneable<BertEmbeddingsImpl> {
 public:
  explicit BertEmbeddingsImpl(const BertConfig& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids);
  BertConfig config;
  nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  nn::LayerNorm LayerNorm{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertEmbeddings);

class BertSelfAttentionImpl : public torch::nn::Cloneable<BertSelfAttentionImpl> {
 public:
  explicit BertSelfAttentionImpl(const BertConfig& c);
  void reset() override;
  // x [B, T, H]; additive_mask broadcastable to [B, heads, T, T] (0 keep, very negative drop) or undefined.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& additive_mask);
  BertConfig config;
  nn::Linear query{nullptr}, key{nullptr}, value{nullptr};
  nn::MatMul qk_matmul{nullptr}, av_matmul{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertSelfAttention);

// dense -> dropout -> LayerNorm(x + residual): HF's BertSelfOutput and BertOutput.
class BertResidualOutputImpl : public torch::nn::Cloneable<BertResidualOutputImpl> {
 public:
  BertResidualOutputImpl(const BertConfig& c, int64_t in_features);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, const at::Tensor& residual);
  BertConfig config;
  int64_t in_features;
  nn::Linear dense{nullptr};
  nn::LayerNorm LayerNorm{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertResidualOutput);

class BertAttentionImpl : public torch::nn::Cloneable<BertAttentionImpl> {
 public:
  explicit BertAttentionImpl(const BertConfig& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, const at::Tensor& additive_mask);
  BertConfig config;
  BertSelfAttention self{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertAttention);

class BertIntermediateImpl : public torch::nn::Cloneable<BertIntermediateImpl> {
 public:
  explicit BertIntermediateImpl(const BertConfig& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  BertConfig config;
  nn::Linear dense{nullptr};
};
TORCH_MODULE(BertIntermediate);

class BertLayerImpl : public torch::nn::Cloneable<BertLayerImpl> {
 public:
  explicit BertLayerImpl(const BertConfig& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, const at::Tensor& additive_mask);
  BertConfig config;
  BertAttention attention{nullptr};
  BertIntermediate intermediate{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertLayer);

class BertEncoderImpl : public torch::nn::Cloneable<BertEncoderImpl> {
 public:
  explicit BertEncoderImpl(const BertConfig& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& x, const at::Tensor& additive_mask);
  BertConfig config;
  torch::nn::ModuleList layer{nullptr};
};
TORCH_MODULE(BertEncoder);

class BertPoolerImpl : public torch::nn::Cloneable<BertPoolerImpl> {
 public:
  explicit BertPoolerImpl(const BertConfig& c);
  void reset() override;
  at::Tensor forward(const at::Tensor& hidden);  // tanh(dense(hidden[:, 0]))
  BertConfig config;
  nn::Linear dense{nullptr};
};
TORCH_MODULE(BertPooler);

struct BertOutputs {
  at::Tensor last_hidden_state;  // [B, T, hidden]
  at::Tensor pooler_output;      // [B, hidden]
};

class BertModelImpl : public torch::nn::Cloneable<BertModelImpl> {
 public:
  explicit BertModelImpl(const BertConfig& c);
  void reset() override;
  // input_ids [B, T] int64; attention_mask [B, T] (1 keep, 0 padding) and token_type_ids may be undefined.
  BertOutputs forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                      const at::Tensor& token_type_ids = {});
  // HF's _init_weights: N(0, initializer_range) for Linear/Embedding weights, zero biases, LN = 1/0,
  // zero padding-token embedding.
  void init_weights();
  BertConfig config;
  BertEmbeddings embeddings{nullptr};
  BertEncoder encoder{nullptr};
  BertPooler pooler{nullptr};
};
TORCH_MODULE(BertModel);

class BertForSequenceClassificationImpl : public torch::nn::Cloneable<BertForSequenceClassificationImpl> {
 public:
  explicit BertForSequenceClassificationImpl(const BertConfig& c);
  void reset() override;
  // Logits [B, num_labels].
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                     const at::Tensor& token_type_ids = {});
  void init_weights();
  BertConfig config;
  BertModel bert{nullptr};
  torch::nn::Dropout dropout{nullptr};
  nn::Linear classifier{nullptr};
};
TORCH_MODULE(BertForSequenceClassification);

// HF import: `state` uses HF names (e.g. from read_safetensors). Legacy "gamma"/"beta" LayerNorm names
// are renamed, "position_ids" buffers ignored; anything else unknown, missing or mis-shaped is an error.
void load_hf_bert(torch::nn::Module& model, StateDict state, const std::string& source = "checkpoint");
// config.json + model.safetensors in `dir` (HF's save_pretrained layout).
BertForSequenceClassification load_bert_for_sequence_classification(const std::string& dir);
// Writes config.json + model.safetensors readable by HF's from_pretrained.
void save_hf_bert(const BertForSequenceClassification& model, const std::string& dir);

}  // namespace qforge::models
