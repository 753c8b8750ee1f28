// BERT encoder with HF names (see bert.h).
#include "framework/models/bert.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/models/activation.h"
#include "framework/models/config_field.h"
#include "framework/models/hf_folder.h"
#include "framework/format/safetensors.h"

namespace qforge::models {

BertConfig BertConfig::from_json(const nlohmann::json& j) {
  constexpr const char* kWho = "models/bert";
  BertConfig c = read_config<BertConfig>(j, kWho);
  if (j.contains("id2label") && j["id2label"].is_object()) c.num_labels = static_cast<int64_t>(j["id2label"].size());
  get_config_field(j, kWho, "num_labels", c.num_labels);
  if (j.contains("position_embedding_type"))
    QF_REQUIRE(j["position_embedding_type"] == "absolute", "models/bert: only absolute position embeddings are supported, config has ",
               j["position_embedding_type"].dump());
  require_positive_fields(c, kWho);
  QF_REQUIRE(c.num_labels > 0, kWho, ": config field 'num_labels' must be > 0, got ", c.num_labels);
  require_heads_divide(kWho, "hidden_size", c.hidden_size, "num_attention_heads", c.num_attention_heads);
  apply_activation(c.hidden_act, at::zeros({1}));  // validates the name
  return c;
}

BertConfig BertConfig::from_file(const std::string& path) { return from_json(read_config_json(path, "models/bert")); }

double BertConfig::parameter_count() const {
  const double h = static_cast<double>(hidden_size), i = static_cast<double>(intermediate_size);
  const double embeddings = static_cast<double>(vocab_size + max_position_embeddings + type_vocab_size) * h + 2 * h;
  // q, k, v and the attention output (h x h + bias each), two LayerNorms, the MLP's two Linears.
  const double layer = 4 * (h * h + h) + 2 * 2 * h + (h * i + i) + (i * h + h);
  return embeddings + static_cast<double>(num_hidden_layers) * layer + (h * h + h) +
         h * static_cast<double>(num_labels) + static_cast<double>(num_labels);
}

nlohmann::json BertConfig::to_json() const {
  nlohmann::json j = config_json(*this, "bert", "BertForSequenceClassification");
  j["position_embedding_type"] = "absolute";
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (int64_t i = 0; i < num_labels; ++i) {
    id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
    label2id["LABEL_" + std::to_string(i)] = i;
  }
  j["id2label"] = id2label;
  j["label2id"] = label2id;
  return j;
}

// ---- embeddings ---------------------------------------------------------------------------

BertEmbeddingsImpl::BertEmbeddingsImpl(const BertConfig& c) : config(c) { reset(); }

void BertEmbeddingsImpl::reset() {
  word_embeddings = register_module(
      "word_embeddings",
      nn::Embedding(torch::nn::EmbeddingOptions(config.vocab_size, config.hidden_size).padding_idx(config.pad_token_id)));
  position_embeddings =
      register_module("position_embeddings", nn::Embedding(config.max_position_embeddings, config.hidden_size));
  token_type_embeddings = register_module("token_type_embeddings", nn::Embedding(config.type_vocab_size, config.hidden_size));
  LayerNorm = register_module(
      "LayerNorm", nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps)));
  dropout = register_module("dropout", torch::nn::Dropout(config.hidden_dropout_prob));
}

at::Tensor BertEmbeddingsImpl::forward(const at::Tensor& ids, const at::Tensor& token_type_ids) {
  const int64_t T = ids.size(1);
  QF_REQUIRE(T <= config.max_position_embeddings, "models/bert: sequence length ", T, " exceeds max_position_embeddings ",
             config.max_position_embeddings);
  const at::Tensor pos = at::arange(T, ids.options().dtype(at::kLong)).unsqueeze(0);
  const at::Tensor tt = token_type_ids.defined() ? token_type_ids : at::zeros_like(ids);
  at::Tensor h = word_embeddings->forward(ids) + token_type_embeddings->forward(tt) + position_embeddings->forward(pos);
  return dropout->forward(LayerNorm->forward(h));
}

// ---- attention ----------------------------------------------------------------------------

BertSelfAttentionImpl::BertSelfAttentionImpl(const BertConfig& c) : config(c) { reset(); }

void BertSelfAttentionImpl::reset() {
  query = register_module("query", nn::Linear(config.hidden_size, config.hidden_size));
  key = register_module("key", nn::Linear(config.hidden_size, config.hidden_size));
  value = register_module("value", nn::Linear(config.hidden_size, config.hidden_size));
  qk_matmul = register_module("qk_matmul", nn::MatMul());
  av_matmul = register_module("av_matmul", nn::MatMul());
  dropout = register_module("dropout", torch::nn::Dropout(config.attention_probs_dropout_prob));
}

at::Tensor BertSelfAttentionImpl::forward(const at::Tensor& x, const at::Tensor& additive_mask) {
  const int64_t B = x.size(0), T = x.size(1), H = config.num_attention_heads, D = config.hidden_size / H;
  auto heads = [&](const at::Tensor& t) { return t.view({B, T, H, D}).permute({0, 2, 1, 3}); };
  const at::Tensor q = heads(query->forward(x)), k = heads(key->forward(x)), v = heads(value->forward(x));
  at::Tensor scores = qk_matmul->forward(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(D));
  if (additive_mask.defined()) scores = scores + additive_mask;
  const at::Tensor probs = dropout->forward(at::softmax(scores, -1));
  return av_matmul->forward(probs, v).permute({0, 2, 1, 3}).reshape({B, T, H * D});
}

BertResidualOutputImpl::BertResidualOutputImpl(const BertConfig& c, int64_t in) : config(c), in_features(in) { reset(); }

void BertResidualOutputImpl::reset() {
  dense = register_module("dense", nn::Linear(in_features, config.hidden_size));
  LayerNorm = register_module(
      "LayerNorm", nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps)));
  dropout = register_module("dropout", torch::nn::Dropout(config.hidden_dropout_prob));
}

at::Tensor BertResidualOutputImpl::forward(const at::Tensor& x, const at::Tensor& residual) {
  return LayerNorm->forward(dropout->forward(dense->forward(x)) + residual);
}

BertAttentionImpl::BertAttentionImpl(const BertConfig& c) : config(c) { reset(); }

void BertAttentionImpl::reset() {
  self = register_module("self", BertSelfAttention(config));
  output = register_module("output", BertResidualOutput(config, config.hidden_size));
}

at::Tensor BertAttentionImpl::forward(const at::Tensor& x, const at::Tensor& additive_mask) {
  return output->forward(self->forward(x, additive_mask), x);
}

BertIntermediateImpl::BertIntermediateImpl(const BertConfig& c) : config(c) { reset(); }

void BertIntermediateImpl::reset() {
  dense = register_module("dense", nn::Linear(config.hidden_size, config.intermediate_size));
}

at::Tensor BertIntermediateImpl::forward(const at::Tensor& x) {
  return apply_activation(config.hidden_act, dense->forward(x));
}

BertLayerImpl::BertLayerImpl(const BertConfig& c) : config(c) { reset(); }

void BertLayerImpl::reset() {
  attention = register_module("attention", BertAttention(config));
  intermediate = register_module("intermediate", BertIntermediate(config));
  output = register_module("output", BertResidualOutput(config, config.intermediate_size));
}

at::Tensor BertLayerImpl::forward(const at::Tensor& x, const at::Tensor& additive_mask) {
  const at::Tensor a = attention->forward(x, additive_mask);
  return output->forward(intermediate->forward(a), a);
}

BertEncoderImpl::BertEncoderImpl(const BertConfig& c) : config(c) { reset(); }

void BertEncoderImpl::reset() {
  layer = register_module("layer", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layer->push_back(BertLayer(config));
}

at::Tensor BertEncoderImpl::forward(const at::Tensor& x, const at::Tensor& additive_mask) {
  at::Tensor h = x;
  for (const auto& l : *layer) h = l->as<BertLayerImpl>()->forward(h, additive_mask);
  return h;
}

BertPoolerImpl::BertPoolerImpl(const BertConfig& c) : config(c) { reset(); }

void BertPoolerImpl::reset() { dense = register_module("dense", nn::Linear(config.hidden_size, config.hidden_size)); }

at::Tensor BertPoolerImpl::forward(const at::Tensor& hidden) {
  return at::tanh(dense->forward(hidden.select(1, 0)));
}

// ---- models -------------------------------------------------------------------------------

BertModelImpl::BertModelImpl(const BertConfig& c) : config(c) { reset(); }

void BertModelImpl::reset() {
  embeddings = register_module("embeddings", BertEmbeddings(config));
  encoder = register_module("encoder", BertEncoder(config));
  pooler = register_module("pooler", BertPooler(config));
  init_weights();
}

void BertModelImpl::init_weights() {
  at::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* lin = m->as<nn::LinearImpl>()) {
      lin->weight.normal_(0.0, config.initializer_range);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = m->as<nn::EmbeddingImpl>()) {
      emb->weight.normal_(0.0, config.initializer_range);
    } else if (auto* ln = m->as<nn::LayerNormImpl>()) {
      ln->weight.fill_(1.0);
      ln->bias.zero_();
    }
  }
  embeddings->word_embeddings->weight[config.pad_token_id].zero_();
}

BertOutputs BertModelImpl::forward(const at::Tensor& ids, const at::Tensor& attention_mask, const at::Tensor& token_type_ids) {
  QF_REQUIRE(ids.dim() == 2, "models/bert: input_ids must be [batch, seq], got ", ids.sizes());
  at::Tensor additive;
  if (attention_mask.defined()) {
    QF_REQUIRE(attention_mask.sizes() == ids.sizes(), "models/bert: attention_mask ", attention_mask.sizes(),
               " does not match input_ids ", ids.sizes());
    // HF's get_extended_attention_mask: (1 - mask) * finfo(float32).min, broadcast over heads and queries.
    const at::Tensor m = attention_mask.to(at::kFloat).unsqueeze(1).unsqueeze(2);
    additive = (1.0 - m) * std::numeric_limits<float>::lowest();
  }
  const at::Tensor h = encoder->forward(embeddings->forward(ids, token_type_ids), additive);
  return {h, pooler->forward(h)};
}

BertForSequenceClassificationImpl::BertForSequenceClassificationImpl(const BertConfig& c) : config(c) { reset(); }

void BertForSequenceClassificationImpl::reset() {
  bert = register_module("bert", BertModel(config));
  dropout = register_module("dropout", torch::nn::Dropout(config.hidden_dropout_prob));
  classifier = register_module("classifier", nn::Linear(config.hidden_size, config.num_labels));
  init_weights();
}

void BertForSequenceClassificationImpl::init_weights() {
  bert->init_weights();
  at::NoGradGuard no_grad;
  classifier->weight.normal_(0.0, config.initializer_range);
  classifier->bias.zero_();
}

at::Tensor BertForSequenceClassificationImpl::forward(const at::Tensor& ids, const at::Tensor& attention_mask,
                                                      const at::Tensor& token_type_ids) {
  return classifier->forward(dropout->forward(bert->forward(ids, attention_mask, token_type_ids).pooler_output));
}

// ---- HF import / export -------------------------------------------------------------------

void load_hf_bert(torch::nn::Module& model, StateDict state, const std::string& source) {
  // Checkpoints from before transformers 2.x name LayerNorm parameters gamma/beta.
  StateDict renamed;
  for (auto& [k, v] : state) {
    std::string key = k;
    auto rename = [&](const std::string& from, const std::string& to) {
      if (key.size() > from.size() && key.compare(key.size() - from.size(), from.size(), from) == 0)
        key = key.substr(0, key.size() - from.size()) + to;
    };
    rename("LayerNorm.gamma", "LayerNorm.weight");
    rename("LayerNorm.beta", "LayerNorm.bias");
    renamed[key] = v;
  }
  LoadStateOptions opts;
  opts.ignore_suffixes = {"embeddings.position_ids", "embeddings.token_type_ids"};
  opts.source = "models/bert: " + source;
  load_model_state(model, renamed, opts);
}

BertForSequenceClassification load_bert_for_sequence_classification(const std::string& dir) {
  const BertConfig config = BertConfig::from_file(dir + "/config.json");
  BertForSequenceClassification model(config);
  const HfWeights weights = read_hf_weights(dir);
  load_hf_bert(*model, weights.tensors, weights.source);
  return model;
}

void save_hf_bert(const BertForSequenceClassification& model, const std::string& dir) {
  write_hf_folder(dir, model->config.to_json(), model_state(*model));
}

}  // namespace qforge::models
