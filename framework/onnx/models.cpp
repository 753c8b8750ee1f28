// The forward of each model qforge ships, written as an ONNX graph op for op (eval mode: dropout
// is the identity). Each function mirrors the model's forward in framework/models/.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "framework/api/kv_static_scales.h"
#include "framework/core/error.h"
#include "framework/models/bert.h"
#include "framework/models/cnn.h"
#include "framework/models/gpt2.h"
#include "framework/models/mlp.h"
#include "framework/onnx/graph.h"

namespace qforge::onnx_export {

namespace {

using onnx::TensorProto;

// Float32's lowest value: what BERT's padding mask and GPT-2's causal mask add or put in place.
float lowest() { return std::numeric_limits<float>::lowest(); }

void small_cnn(const models::SmallCnnImpl& m, Graph& g, LayerWriter& w, ModelGraph* out) {
  const auto& o = m.options;
  std::string h = g.input("input", TensorProto::FLOAT, {"batch", o.in_channels, o.image_size, o.image_size});
  out->inputs = {h};
  for (size_t i = 0; i < m.blocks->size(); ++i) {
    const auto* b = m.blocks->ptr(i)->as<models::ConvBnReluImpl>();
    h = w.conv2d(*b->conv, h);
    if (b->bn) {
      const std::string p = "blocks." + std::to_string(i) + ".bn";
      const auto& bn = *b->bn;
      h = g.node("BatchNormalization",
                 {h, g.initializer(p + ".weight", bn.weight.detach()), g.initializer(p + ".bias", bn.bias.detach()),
                  g.initializer(p + ".running_mean", bn.running_mean.detach()),
                  g.initializer(p + ".running_var", bn.running_var.detach())},
                 p, {{"epsilon", static_cast<float>(bn.options.eps())}});
    }
    h = g.node("Relu", {h}, "blocks." + std::to_string(i) + ".relu");
    h = g.node("MaxPool", {h}, "blocks." + std::to_string(i) + ".max_pool",
               {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  }
  h = g.node("Flatten", {h}, "flatten", {{"axis", int64_t{1}}});
  h = g.node("Relu", {w.linear(*m.fc1, h)}, "fc1.relu");
  const std::string logits = g.node("Identity", {w.linear(*m.fc2, h)}, "logits");
  g.output(logits, TensorProto::FLOAT, {"batch", o.num_classes});
  out->outputs = {logits};
}

void mlp(const models::MlpImpl& m, Graph& g, LayerWriter& w, ModelGraph* out) {
  std::string h = g.input("input", TensorProto::FLOAT, {"batch", m.options.in_features});
  out->inputs = {h};
  for (size_t i = 0; i < m.layers.size(); ++i) {
    h = w.linear(*m.layers[i], h);
    if (i + 1 < m.layers.size()) h = g.node("Relu", {h}, "relu");
  }
  h = g.node("Identity", {h}, "logits");
  g.output(h, TensorProto::FLOAT, {"batch", m.options.num_classes});
  out->outputs = {h};
}

// [B, T, H*D] -> [B, H, T, D] (perm {0, 2, 1, 3}) or [B, H, D, T] (perm {0, 2, 3, 1}).
std::string heads(Graph& g, const std::string& x, int64_t H, int64_t D, std::vector<int64_t> perm, const std::string& hint) {
  const std::string r = g.node("Reshape", {x, g.ints({0, 0, H, D})}, hint + "/split_heads");
  return g.node("Transpose", {r}, hint + "/heads", {{"perm", std::move(perm)}});
}

std::string merge_heads(Graph& g, const std::string& ctx, int64_t hidden, const std::string& hint) {
  const std::string t = g.node("Transpose", {ctx}, hint + "/tokens_first", {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  return g.node("Reshape", {t, g.ints({0, 0, hidden})}, hint + "/merge_heads");
}

// A static KV cache's fake quantization of one side (kv_static_scales.h) as QuantizeLinear ->
// DequantizeLinear along the heads axis (1) of keys [B, H, D, T] or values [B, H, T, D]: int8 codes
// with each head's calibrated scale and zero point (one group per head; check_exportable refuses
// the rest). QuantizeLinear divides by the scale where qforge multiplies by its reciprocal: a value
// on a rounding tie may land one code away.
std::string kv_qdq(Graph& g, const std::string& x, const KvSideScales& side, const std::string& hint) {
  const std::string s = g.initializer(hint + "/scale", side.scale.reshape({-1}).to(at::kFloat).contiguous());
  const std::string z = g.initializer(hint + "/zero_point", side.zero_point.reshape({-1}).to(at::kChar).contiguous());
  const std::string q = g.node("QuantizeLinear", {x, s, z}, hint + "/q", {{"axis", int64_t{1}}});
  return g.node("DequantizeLinear", {q, s, z}, hint + "/dq", {{"axis", int64_t{1}}});
}

// Why a KV-cache scheme has no QDQ form in the exported graph ("" when it has one).
std::string kv_cache_not_exportable(const KvCacheScheme& s, int64_t head_dim) {
  if (!s.quantized()) return "";
  if (!s.is_static()) return "dynamic per-token scales have no QDQ form; export with a float cache or static scales "
                             "(quantize.kv_cache.scales: static_head or static_tensor)";
  if (!s.calibrated) return "its static scales are not calibrated (run a Calibration first)";
  if (s.qtype->bits != 8) return "int4 codes have no QuantizeLinear at opset 17; use int8";
  if (s.group(head_dim) != head_dim) return "groups smaller than a head need blocked scales (opset 21); use group_size 0";
  return "";
}

// Positions 0..T-1 of ids [B, T] as int64 [T].
std::string positions(Graph& g, const std::string& ids) {
  const std::string T = g.node("Gather", {g.node("Shape", {ids}, "ids_shape"), g.initializer("dim_1", at::full({}, 1, at::kLong))},
                               "sequence_length", {{"axis", int64_t{0}}});
  return g.node("Range", {g.initializer("zero", at::full({}, 0, at::kLong)), T, g.initializer("one", at::full({}, 1, at::kLong))},
                "positions");
}

void bert(const models::BertForSequenceClassificationImpl& m, Graph& g, LayerWriter& w, ModelGraph* out) {
  const models::BertConfig& c = m.config;
  const auto& bert = *m.bert;
  const std::string ids = g.input("input_ids", TensorProto::INT64, {"batch", "sequence"});
  const std::string mask = g.input("attention_mask", TensorProto::INT64, {"batch", "sequence"});
  out->inputs = {ids, mask};
  const auto& e = *bert.embeddings;
  // token_type_ids are zeros: every token adds row 0 of the token-type table.
  const std::string tt = g.node("Gather", {w.embedding_table(*e.token_type_embeddings), g.initializer("token_type_0", at::full({}, 0, at::kLong))},
                                "embeddings/token_type", {{"axis", int64_t{0}}});
  std::string h = g.node("Add", {w.embedding(*e.word_embeddings, ids), tt}, "embeddings/word_plus_type");
  h = g.node("Add", {h, w.embedding(*e.position_embeddings, positions(g, ids))}, "embeddings/sum");
  h = w.layer_norm(*e.LayerNorm, h);
  // HF's extended mask: (1 - mask) * lowest, [B, 1, 1, T].
  const std::string keep = g.node("Cast", {mask}, "mask/float", {{"to", int64_t{TensorProto::FLOAT}}});
  const std::string drop = g.node("Mul", {g.node("Sub", {g.scalar_f32(1.0f), keep}, "mask/inverted"), g.scalar_f32(lowest())}, "mask/additive");
  const std::string additive = g.node("Unsqueeze", {drop, g.ints({1, 2})}, "mask/broadcast");
  const int64_t H = c.num_attention_heads, D = c.hidden_size / H;
  for (size_t i = 0; i < bert.encoder->layer->size(); ++i) {
    const auto* layer = bert.encoder->layer->ptr(i)->as<models::BertLayerImpl>();
    const std::string p = "encoder.layer." + std::to_string(i);
    const auto& sa = *layer->attention->self;
    const std::string q = heads(g, w.linear(*sa.query, h), H, D, {0, 2, 1, 3}, p + "/q");
    const std::string kT = heads(g, w.linear(*sa.key, h), H, D, {0, 2, 3, 1}, p + "/k");
    const std::string v = heads(g, w.linear(*sa.value, h), H, D, {0, 2, 1, 3}, p + "/v");
    std::string scores = g.node("Div", {w.matmul(*sa.qk_matmul, q, kT, 4), g.scalar_f32(static_cast<float>(std::sqrt(static_cast<double>(D))))},
                                p + "/scores");
    scores = g.node("Add", {scores, additive}, p + "/masked_scores");
    const std::string probs = g.node("Softmax", {scores}, p + "/probs", {{"axis", int64_t{-1}}});
    const std::string ctx = merge_heads(g, w.matmul(*sa.av_matmul, probs, v, 4), c.hidden_size, p + "/ctx");
    const auto& ao = *layer->attention->output;
    const std::string a = w.layer_norm(*ao.LayerNorm, g.node("Add", {w.linear(*ao.dense, ctx), h}, p + "/attention_residual"));
    const std::string inter = w.activation(c.hidden_act, w.linear(*layer->intermediate->dense, a));
    const auto& lo = *layer->output;
    h = w.layer_norm(*lo.LayerNorm, g.node("Add", {w.linear(*lo.dense, inter), a}, p + "/output_residual"));
  }
  const std::string first = g.node("Gather", {h, g.initializer("token_0", at::full({}, 0, at::kLong))}, "pooler/first_token",
                                   {{"axis", int64_t{1}}});
  const std::string pooled = g.node("Tanh", {w.linear(*bert.pooler->dense, first)}, "pooler/tanh");
  const std::string logits = g.node("Identity", {w.linear(*m.classifier, pooled)}, "logits");
  g.output(logits, TensorProto::FLOAT, {"batch", c.num_labels});
  out->outputs = {logits};
}

void gpt2(const models::Gpt2LMHeadModelImpl& m, Graph& g, LayerWriter& w, ModelGraph* out) {
  const models::Gpt2Config& c = m.config;
  const auto& t = *m.transformer;
  const std::string ids = g.input("input_ids", TensorProto::INT64, {"batch", "sequence"});
  out->inputs = {ids};
  const std::string pos = positions(g, ids);
  std::string x = g.node("Add", {w.embedding(*t.wte, ids), w.embedding(*t.wpe, pos)}, "embeddings/sum");
  // Causal mask [T, T]: lower triangle kept, the rest replaced by lowest (HF keeps it finite).
  const std::string T1 = g.node("Unsqueeze", {g.node("Gather", {g.node("Shape", {pos}, "positions_shape"), g.initializer("dim_0", at::full({}, 0, at::kLong))},
                                                     "sequence_length_again", {{"axis", int64_t{0}}}),
                                              g.ints({0})},
                                "sequence_length_1d");
  const std::string square = g.node("Concat", {T1, T1}, "causal/shape", {{"axis", int64_t{0}}});
  const std::string ones = g.node("ConstantOfShape", {square}, "causal/ones", {{"value", at::ones({1}, at::kFloat)}});
  const std::string causal = g.node("Cast", {g.node("Trilu", {ones}, "causal/lower", {{"upper", int64_t{0}}})}, "causal/keep",
                                    {{"to", int64_t{TensorProto::BOOL}}});
  const int64_t E = c.n_embd, H = c.n_head, D = E / H;
  for (size_t i = 0; i < t.h->size(); ++i) {
    const auto* b = t.h->ptr(i)->as<models::Gpt2BlockImpl>();
    const std::string p = "transformer.h." + std::to_string(i);
    const auto& at_ = *b->attn;
    const std::string qkv = w.linear(*at_.c_attn, w.layer_norm(*b->ln_1, x));
    const auto parts = g.node_n("Split", {qkv, g.ints({E, E, E})}, p + "/qkv", 3, {{"axis", int64_t{-1}}});
    const std::string q = heads(g, parts[0], H, D, {0, 2, 1, 3}, p + "/q");
    std::string kT = heads(g, parts[1], H, D, {0, 2, 3, 1}, p + "/k");
    std::string v = heads(g, parts[2], H, D, {0, 2, 1, 3}, p + "/v");
    if (c.kv_cache.quantized()) {  // static int8 per head or layer (check_exportable)
      kT = kv_qdq(g, kT, c.kv_cache.calibrated->side(static_cast<int64_t>(i), false, p.c_str()), p + "/k_cache");
      v = kv_qdq(g, v, c.kv_cache.calibrated->side(static_cast<int64_t>(i), true, p.c_str()), p + "/v_cache");
    }
    std::string scores = g.node("Div", {w.matmul(*at_.qk_matmul, q, kT, 4), g.scalar_f32(static_cast<float>(std::sqrt(static_cast<double>(D))))},
                                p + "/scores");
    scores = g.node("Where", {causal, scores, g.scalar_f32(lowest())}, p + "/causal_scores");
    const std::string probs = g.node("Softmax", {scores}, p + "/probs", {{"axis", int64_t{-1}}});
    const std::string ctx = merge_heads(g, w.matmul(*at_.av_matmul, probs, v, 4), E, p + "/ctx");
    const std::string hres = g.node("Add", {x, w.linear(*at_.c_proj, ctx)}, p + "/attention_residual");
    const auto& mlp = *b->mlp;
    const std::string f = w.linear(*mlp.c_proj, w.activation(c.activation_function, w.linear(*mlp.c_fc, w.layer_norm(*b->ln_2, hres))));
    x = g.node("Add", {hres, f}, p + "/mlp_residual");
  }
  x = w.layer_norm(*t.ln_f, x);
  // The head is tied to wte: logits = h · wteᵀ (the same table the lookup reads).
  const std::string head = g.node("Transpose", {w.embedding_table(*t.wte)}, "lm_head/weight", {{"perm", std::vector<int64_t>{1, 0}}});
  const std::string logits = g.node("MatMul", {x, head}, "logits");
  g.output(logits, TensorProto::FLOAT, {"batch", "sequence", c.vocab_size});
  out->outputs = {logits};
}

}  // namespace

std::string model_problems(const torch::nn::Module& model) {
  std::string out;
  auto activation_ok = [](const std::string& a) {
    return a == "gelu" || a == "gelu_new" || a == "gelu_pytorch_tanh" || a == "relu";
  };
  if (const auto* m = dynamic_cast<const models::SmallCnnImpl*>(&model)) {
    for (size_t i = 0; i < m->blocks->size(); ++i) {
      const auto* b = m->blocks->ptr(i)->as<models::ConvBnReluImpl>();
      if (b->bn && !b->bn->options.affine())
        out += "\n  blocks." + std::to_string(i) + ".bn: a BatchNorm without affine parameters is not written";
    }
  } else if (const auto* m = dynamic_cast<const models::BertForSequenceClassificationImpl*>(&model)) {
    if (!activation_ok(m->config.hidden_act)) out += "\n  hidden_act '" + m->config.hidden_act + "' has no ONNX form here";
  } else if (const auto* m = dynamic_cast<const models::Gpt2LMHeadModelImpl*>(&model)) {
    if (!activation_ok(m->config.activation_function))
      out += "\n  activation_function '" + m->config.activation_function + "' has no ONNX form here";
    // The tied head multiplies by wte's float weight, which freeze releases once wte is quantized:
    // the frozen C++ model cannot run its head then, and a graph that read the dequantized table
    // would compute what qforge never does.
    // The graph's attention reads the keys and values as the cacheless forward does: a static
    // int8 cache per head as QDQ pairs; other schemes would leave it attending to floats.
    const std::string kv_why = kv_cache_not_exportable(m->config.kv_cache, m->config.n_embd / m->config.n_head);
    if (!kv_why.empty())
      out += "\n  config.kv_cache: a " + m->config.kv_cache.to_string() + " KV cache has no QDQ form: " + kv_why;
    if (m->transformer->wte->quantized())
      out += "\n  transformer.wte (Embedding): quantized, but the tied LM head reads its float weight; keep it "
             "float (rule {pattern: transformer.wte, keep_float: true}, as the gpt2 recipes do)";
  }
  return out;
}

const char* model_type(const torch::nn::Module& model) {
  if (dynamic_cast<const models::SmallCnnImpl*>(&model)) return "SmallCnn";
  if (dynamic_cast<const models::MlpImpl*>(&model)) return "Mlp";
  if (dynamic_cast<const models::BertForSequenceClassificationImpl*>(&model)) return "BertForSequenceClassification";
  if (dynamic_cast<const models::Gpt2LMHeadModelImpl*>(&model)) return "Gpt2LMHeadModel";
  return nullptr;
}

const char* exportable_models() { return "SmallCnn, Mlp, BertForSequenceClassification, Gpt2LMHeadModel"; }

bool write_model_graph(const torch::nn::Module& model, Graph& g, LayerWriter& w, ModelGraph* out) {
  if (const auto* m = dynamic_cast<const models::SmallCnnImpl*>(&model)) {
    out->model_type = "SmallCnn";
    small_cnn(*m, g, w, out);
  } else if (const auto* m = dynamic_cast<const models::MlpImpl*>(&model)) {
    out->model_type = "Mlp";
    mlp(*m, g, w, out);
  } else if (const auto* m = dynamic_cast<const models::BertForSequenceClassificationImpl*>(&model)) {
    out->model_type = "BertForSequenceClassification";
    bert(*m, g, w, out);
  } else if (const auto* m = dynamic_cast<const models::Gpt2LMHeadModelImpl*>(&model)) {
    out->model_type = "Gpt2LMHeadModel";
    gpt2(*m, g, w, out);
  } else {
    return false;
  }
  return true;
}

}  // namespace qforge::onnx_export
