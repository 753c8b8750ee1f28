// framework/models: forward passes against PyTorch golden logits (tests/golden/gen_models.py),
// HF parameter names, HF checkpoint import/export and its errors, conv+BN folding.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/format/safetensors.h"
#include "framework/models/bert.h"
#include "framework/models/cnn.h"
#include "framework/models/gpt2.h"
#include "framework/models/mlp.h"
#include "framework/api/quantize.h"
#include "tests/error_of.h"
#include "tests/golden/golden.h"
#include "tests/paths.h"

namespace qforge::models {
namespace {

using golden::describe_mismatch;
using golden::golden_tensor;
constexpr double kTol = 1e-5;

const nlohmann::json& goldens() {
  static const nlohmann::json j = golden::load_golden("models.json");
  return j;
}

StateDict golden_weights(const std::string& name) {
  return io::read_safetensors(std::string(QFORGE_GOLDEN_DIR) + "/models_" + name + ".safetensors").tensors;
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const char* what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual, expected, kTol, kTol)) << what << ": " << describe_mismatch(actual, expected);
}

std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("qforge_models_test_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}

using qforge::testing::error_of;

TEST(Bert, ForwardMatchesPyTorchGolden) {
  const auto& g = goldens()["bert"];
  BertForSequenceClassification model(BertConfig::from_json(g["config"]));
  EXPECT_EQ(model->config.num_labels, 3) << "num_labels comes from id2label";
  load_hf_bert(*model, golden_weights("bert"), "models_bert.safetensors");
  model->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = golden_tensor(g["input_ids"]), mask = golden_tensor(g["attention_mask"]),
                   tt = golden_tensor(g["token_type_ids"]);
  const BertOutputs out = model->bert->forward(ids, mask, tt);
  expect_close(out.last_hidden_state, golden_tensor(g["last_hidden_state"]), "last_hidden_state");
  expect_close(out.pooler_output, golden_tensor(g["pooler_output"]), "pooler_output");
  expect_close(model->forward(ids, mask, tt), golden_tensor(g["logits"]), "logits");
}

TEST(Bert, ParameterNamesAreHuggingFaces) {
  BertConfig c;
  c.vocab_size = 30, c.hidden_size = 8, c.num_hidden_layers = 1, c.num_attention_heads = 2, c.intermediate_size = 16;
  BertModel m(c);
  const StateDict s = model_state(*m);
  for (const char* k : {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                        "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
                        "encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.key.bias",
                        "encoder.layer.0.attention.self.value.weight", "encoder.layer.0.attention.output.dense.weight",
                        "encoder.layer.0.attention.output.LayerNorm.weight", "encoder.layer.0.intermediate.dense.weight",
                        "encoder.layer.0.output.dense.weight", "encoder.layer.0.output.LayerNorm.bias",
                        "pooler.dense.weight"})
    EXPECT_TRUE(s.count(k)) << k;
  EXPECT_EQ(s.size(), 5u + 16u + 2u) << "no parameters beyond HF's BertModel";
  EXPECT_TRUE(model_state(*BertForSequenceClassification(c)).count("classifier.weight"));
}

TEST(Bert, AttentionMatMulsAreQuantizable) {
  BertConfig c;
  c.vocab_size = 30, c.hidden_size = 8, c.num_hidden_layers = 2, c.num_attention_heads = 2, c.intermediate_size = 16;
  BertForSequenceClassification m(c);
  int matmuls = 0;
  for (const auto& item : m->named_modules())
    if (item.value()->as<nn::MatMulImpl>()) ++matmuls;
  EXPECT_EQ(matmuls, 4) << "QK^T and attention x V per layer";
}

TEST(Gpt2, ForwardMatchesPyTorchGoldenFromAnHfCheckpoint) {
  const auto& g = goldens()["gpt2"];
  Gpt2LMHeadModel model(Gpt2Config::from_json(g["config"]));
  // The file holds HF's [in, out] Conv1D weights, a tied lm_head.weight and attn.bias buffers.
  const StateDict w = golden_weights("gpt2");
  ASSERT_EQ(w.at("transformer.h.0.attn.c_attn.weight").sizes(), at::IntArrayRef({16, 48}));
  ASSERT_TRUE(w.count("lm_head.weight"));
  load_hf_gpt2(model, w, "models_gpt2.safetensors");
  EXPECT_EQ(model->transformer->h->ptr(0)->as<Gpt2BlockImpl>()->attn->c_attn->weight.sizes(),
            at::IntArrayRef({48, 16}));
  model->eval();
  at::NoGradGuard ng;
  expect_close(model->forward(golden_tensor(g["input_ids"])), golden_tensor(g["logits"]), "logits");
}

TEST(Gpt2, IsCausal) {
  Gpt2Config c;
  c.vocab_size = 20, c.n_positions = 8, c.n_embd = 8, c.n_layer = 1, c.n_head = 2;
  Gpt2LMHeadModel m(c);
  m->eval();
  at::NoGradGuard ng;
  at::Tensor a = at::randint(0, 20, {1, 6}, at::kLong), b = a.clone();
  b[0][5] = (a[0][5].item<int64_t>() + 1) % 20;
  const at::Tensor la = m->forward(a), lb = m->forward(b);
  EXPECT_TRUE(at::allclose(la.narrow(1, 0, 5), lb.narrow(1, 0, 5))) << "earlier positions must not see the future";
  EXPECT_FALSE(at::allclose(la.narrow(1, 5, 1), lb.narrow(1, 5, 1)));
}

TEST(Gpt2, IncrementalDecodingWithAKvCacheMatchesTheFullForward) {
  Gpt2Config c;
  c.vocab_size = 30, c.n_positions = 16, c.n_embd = 16, c.n_layer = 2, c.n_head = 4;
  at::manual_seed(3);
  Gpt2LMHeadModel m(c);
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, 30, {2, 10}, at::kLong);
  const at::Tensor full = m->forward(ids);
  // Prompt of 6, then 4 tokens one at a time.
  Gpt2KvCache cache;
  const at::Tensor prefill = m->forward(ids.narrow(1, 0, 6), &cache);
  EXPECT_TRUE(at::allclose(prefill, full.narrow(1, 0, 6), 1e-5, 1e-6));
  EXPECT_EQ(cache.length(), 6);
  for (int64_t t = 6; t < 10; ++t) {
    const at::Tensor step = m->forward(ids.narrow(1, t, 1), &cache);
    EXPECT_TRUE(at::allclose(step, full.narrow(1, t, 1), 1e-5, 1e-6)) << "position " << t;
  }
  EXPECT_EQ(cache.length(), 10);
  EXPECT_EQ(cache.keys[0].sizes(), at::IntArrayRef({2, 4, 10, 4}));
  // Past n_positions is an error naming the cached positions.
  EXPECT_NE(error_of([&] { m->forward(at::zeros({2, 7}, at::kLong), &cache); }).find("cached positions"),
            std::string::npos);
}

TEST(Gpt2, UntiedHeadKeepsTheLogitsQuantizesApartAndRoundTripsThroughHfFiles) {
  Gpt2Config c;
  c.vocab_size = 40, c.n_positions = 8, c.n_embd = 32, c.n_layer = 1, c.n_head = 2;
  at::manual_seed(5);
  Gpt2LMHeadModel m(c);
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, 40, {2, 5}, at::kLong);
  const at::Tensor tied = m->forward(ids);
  m->untie_lm_head();
  EXPECT_FALSE(m->config.tie_word_embeddings);
  EXPECT_TRUE(at::equal(m->forward(ids), tied));
  EXPECT_NE(error_of([&] { m->untie_lm_head(); }).find("already untied"), std::string::npos);
  // HF files: config says untied, lm_head.weight is loaded as the head's own.
  const std::string dir = ::testing::TempDir() + "/gpt2_untied";
  save_hf_gpt2(m, dir);
  Gpt2LMHeadModel back = load_gpt2_lm_head_model(dir);
  std::filesystem::remove_all(dir);
  back->eval();
  ASSERT_TRUE(back->lm_head);
  EXPECT_TRUE(at::equal(back->forward(ids), tied));
  // Quantized and frozen apart: the head int4, the embedding int8 (row gather).
  quantize(*m, Scheme(qint4));
  freeze(*m);
  EXPECT_NE(m->lm_head->report().kernel.find("f32s4f32"), std::string::npos) << m->lm_head->report().kernel;
  const at::Tensor q = m->forward(ids);
  EXPECT_LT((q - tied).abs().max().item<double>(), 0.1 * tied.abs().max().item<double>());
  // A tied model whose embedding was frozen says why its head cannot run.
  Gpt2LMHeadModel t(c);
  quantize(*t, Scheme(qint8));
  freeze(*t);
  EXPECT_NE(error_of([&] { t->forward(ids); }).find("untie_lm_head"), std::string::npos);
}

TEST(Mlp, ForwardMatchesPyTorchGolden) {
  const auto& g = goldens()["mlp"];
  Mlp m(MlpOptions{784, g["hidden"].get<std::vector<int64_t>>(), 10});
  load_model_state(*m, golden_weights("mlp"));
  m->eval();
  at::NoGradGuard ng;
  expect_close(m->forward(golden_tensor(g["input"])), golden_tensor(g["logits"]), "logits");
}

TEST(SmallCnn, ForwardAndBatchNormFoldingMatchPyTorchGolden) {
  const auto& g = goldens()["cnn"];
  SmallCnnOptions o;
  o.channels = g["channels"].get<std::vector<int64_t>>();
  o.hidden = g["hidden"].get<int64_t>();
  SmallCnn m(o);
  LoadStateOptions lo;
  lo.allow_missing = {"num_batches_tracked"};
  load_model_state(*m, golden_weights("cnn"), lo);
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor x = golden_tensor(g["input"]), want = golden_tensor(g["logits"]);
  expect_close(m->forward(x), want, "logits");
  m->fold_batch_norm();
  const StateDict s = model_state(*m);
  EXPECT_FALSE(s.count("blocks.0.bn.weight"));
  EXPECT_TRUE(s.count("blocks.0.conv.bias"));
  expect_close(m->forward(x), want, "logits after folding");
}

TEST(SmallCnn, FoldingAfterQuantizeIsAnError) {
  SmallCnn m(SmallCnnOptions{});
  m->eval();
  quantize(*m, Scheme(qint8));
  EXPECT_NE(error_of([&] { m->fold_batch_norm(); }).find("fold BatchNorm before quantize()"), std::string::npos);
}

TEST(HfImport, BertSavedAndLoadedThroughConfigAndSafetensors) {
  BertConfig c;
  c.vocab_size = 30, c.hidden_size = 8, c.num_hidden_layers = 2, c.num_attention_heads = 2, c.intermediate_size = 16,
  c.num_labels = 4;
  BertForSequenceClassification a(c);
  const std::string dir = temp_dir("bert");
  save_hf_bert(a, dir);
  BertForSequenceClassification b = load_bert_for_sequence_classification(dir);
  EXPECT_EQ(b->config.num_labels, 4);
  a->eval(), b->eval();
  const at::Tensor ids = at::randint(1, 30, {3, 5}, at::kLong);
  EXPECT_TRUE(at::equal(a->forward(ids), b->forward(ids)));
  std::filesystem::remove_all(dir);
}

TEST(HfImport, Gpt2ExportTransposesConv1DAndImportRestoresIt) {
  Gpt2Config c;
  c.vocab_size = 20, c.n_positions = 8, c.n_embd = 8, c.n_layer = 1, c.n_head = 2;
  Gpt2LMHeadModel a(c);
  const std::string dir = temp_dir("gpt2");
  save_hf_gpt2(a, dir);
  const auto file = io::read_safetensors(dir + "/model.safetensors");
  EXPECT_EQ(file.tensors.at("transformer.h.0.mlp.c_fc.weight").sizes(), at::IntArrayRef({8, 32})) << "HF [in, out]";
  Gpt2LMHeadModel b = load_gpt2_lm_head_model(dir);
  a->eval(), b->eval();
  const at::Tensor ids = at::randint(0, 20, {2, 6}, at::kLong);
  EXPECT_TRUE(at::equal(a->forward(ids), b->forward(ids)));
  std::filesystem::remove_all(dir);
}

TEST(HfImport, UnknownMissingAndMisshapenKeysAreListed) {
  BertConfig c;
  c.vocab_size = 30, c.hidden_size = 8, c.num_hidden_layers = 1, c.num_attention_heads = 2, c.intermediate_size = 16;
  BertForSequenceClassification m(c);
  StateDict s;
  for (const auto& [k, v] : model_state(*m)) s[k] = v.clone();
  s.erase("bert.pooler.dense.bias");
  s["bert.encoder.layer.7.output.dense.weight"] = at::zeros({8, 16});
  s["classifier.weight"] = at::zeros({3, 8});
  s["bert.embeddings.position_ids"] = at::arange(512).unsqueeze(0);  // HF buffer: ignored
  const std::string msg = error_of([&] { load_hf_bert(*m, s, "ckpt.safetensors"); });
  EXPECT_NE(msg.find("ckpt.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown keys (1): bert.encoder.layer.7.output.dense.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing keys (1): bert.pooler.dense.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("classifier.weight (checkpoint [3, 8], model [2, 8])"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("position_ids"), std::string::npos) << msg;
}

TEST(HfImport, IntegerWeightsNanValuesAndNegativeVariancesAreRefused) {
  SmallCnn m(SmallCnnOptions{});
  const StateDict good = model_state(*m);
  StateDict s;
  for (const auto& [k, v] : good) s[k] = v.clone();
  const std::string w = s.begin()->first;  // some float parameter
  std::string var, weight;
  for (const auto& [k, v] : s) {
    if (k.size() > 11 && k.substr(k.size() - 11) == "running_var") var = k;
    if (weight.empty() && k.find("weight") != std::string::npos && at::isFloatingType(v.scalar_type())) weight = k;
  }
  ASSERT_FALSE(var.empty());
  s[weight] = s[weight].to(at::kInt);
  s[var] = -s[var];
  std::string bias;
  for (const auto& [k, v] : s)
    if (k.find("bias") != std::string::npos) bias = k;
  s[bias] = s[bias].clone().fill_(NAN);
  const StateDict before = [&] {
    StateDict c;
    for (const auto& [k, v] : model_state(*m)) c[k] = v.clone();
    return c;
  }();
  const std::string msg = error_of([&] { load_model_state(*m, s); });
  EXPECT_NE(msg.find("dtype mismatches (1): " + weight + " (checkpoint Int, model Float)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(var + " ("), std::string::npos) << msg;
  EXPECT_NE(msg.find("negative variances"), std::string::npos) << msg;
  EXPECT_NE(msg.find(bias + " ("), std::string::npos) << msg;
  for (const auto& [k, v] : model_state(*m)) EXPECT_TRUE(at::equal(v, before.at(k))) << k;  // untouched
  (void)w;
}

TEST(HfImport, LegacyGammaBetaNamesAndHalfPrecisionLoad) {
  BertConfig c;
  c.vocab_size = 30, c.hidden_size = 8, c.num_hidden_layers = 1, c.num_attention_heads = 2, c.intermediate_size = 16;
  BertModel a(c), b(c);
  std::map<std::string, at::Tensor> s;
  for (const auto& [k, v] : model_state(*a)) {
    std::string key = k;
    if (key.size() > 16 && key.compare(key.size() - 16, 16, "LayerNorm.weight") == 0) key = key.substr(0, key.size() - 6) + "gamma";
    s[key] = v.to(at::kHalf);
  }
  const std::string dir = temp_dir("legacy");
  std::filesystem::create_directories(dir);
  io::write_safetensors(dir + "/w.safetensors", s);
  load_hf_bert(*b, io::read_safetensors(dir + "/w.safetensors").tensors);
  EXPECT_TRUE(at::equal(b->embeddings->LayerNorm->weight, a->embeddings->LayerNorm->weight.to(at::kHalf).to(at::kFloat)));
  std::filesystem::remove_all(dir);
}

TEST(HfImport, BadConfigsAreClearErrors) {
  EXPECT_NE(error_of([] { BertConfig::from_json({{"hidden_size", 10}, {"num_attention_heads", 3}}); }).find("multiple"),
            std::string::npos);
  EXPECT_NE(error_of([] { BertConfig::from_json({{"hidden_act", "mish"}}); }).find("unsupported activation"),
            std::string::npos);
  EXPECT_NE(error_of([] { Gpt2Config::from_json({{"n_layer", "two"}}); }).find("'n_layer' has the wrong type"),
            std::string::npos);
  EXPECT_NE(error_of([] { BertConfig::from_file("/nonexistent/config.json"); }).find("/nonexistent/config.json"),
            std::string::npos);
}

TEST(HfImport, ConfigsRoundTripEveryFieldThroughJson) {
  BertConfig b;
  b.vocab_size = 31, b.hidden_size = 12, b.num_hidden_layers = 3, b.num_attention_heads = 3, b.intermediate_size = 20,
  b.hidden_act = "relu", b.hidden_dropout_prob = 0.25, b.attention_probs_dropout_prob = 0.125,
  b.max_position_embeddings = 40, b.type_vocab_size = 3, b.layer_norm_eps = 1e-6, b.initializer_range = 0.5,
  b.pad_token_id = 1, b.num_labels = 5;
  const nlohmann::json bj = b.to_json();
  EXPECT_EQ(bj["id2label"].size(), 5u);
  EXPECT_EQ(bj["position_embedding_type"], "absolute");
  EXPECT_EQ(BertConfig::from_json(bj).to_json(), bj);
  Gpt2Config g;
  g.vocab_size = 21, g.n_positions = 9, g.n_embd = 12, g.n_layer = 2, g.n_head = 3, g.n_inner = 0,
  g.activation_function = "gelu", g.resid_pdrop = 0.25, g.embd_pdrop = 0.125, g.attn_pdrop = 0.5,
  g.layer_norm_epsilon = 1e-6, g.initializer_range = 0.5, g.tie_word_embeddings = false;
  nlohmann::json gj = g.to_json();
  EXPECT_TRUE(gj["n_inner"].is_null()) << "0 means 4 * n_embd, written as HF's null";
  EXPECT_EQ(gj["n_ctx"], 9);
  EXPECT_EQ(Gpt2Config::from_json(gj).to_json(), gj);
  g.n_inner = 7;
  gj = g.to_json();
  EXPECT_EQ(gj["n_inner"], 7);
  EXPECT_EQ(Gpt2Config::from_json(gj).inner(), 7);
  EXPECT_NE(error_of([] { BertConfig::from_json({{"num_labels", 0}}); }).find("'num_labels' must be > 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { Gpt2Config::from_json({{"n_head", 0}}); }).find("models/gpt2: config field 'n_head' must be > 0"),
            std::string::npos);
}

// Issue 18's target: after freeze, every Linear, convolution, attention product and embedding of
// the reference models runs an integer kernel (describe() lists no fake-quant or dequantize-per-call
// path for them), BERT and the CNN W8A8 static, GPT-2 weight-only int4 for decoding. On AVX-512
// VNNI hardware the plans are also the first choice (no fallback reason at all).
void expect_integer_kernels(torch::nn::Module& m, const char* model, int expected_layers) {
  int checked = 0;
  for (const LayerReport& r : layer_reports(m)) {
    const bool integer_type = r.type == "Linear" || r.type == "Conv1d" || r.type == "Conv2d" || r.type == "MatMul" ||
                              r.type == "Embedding";
    if (!integer_type || (r.weights == "float" && r.activations == "float")) continue;
    ++checked;
    const std::string what = std::string(model) + " " + r.name + " (" + r.type + "): kernel '" + r.kernel +
                             "', fallback '" + r.fallback_reason + "'";
    EXPECT_EQ(r.kernel.find("fake_quant"), std::string::npos) << what;
    EXPECT_NE(r.kernel.rfind("dequantize+", 0), 0u) << what;
    EXPECT_NE(r.kernel.rfind("at::", 0), 0u) << what;
    if (usable_isa() >= Isa::kAvx512Vnni) {
      EXPECT_EQ(r.fallback_reason, "") << what;
    }
  }
  EXPECT_EQ(checked, expected_layers) << model;
}

TEST(ReferenceModels, EveryLayerRunsAnIntegerKernelAfterFreeze) {
  Scheme w8a8(qint8);
  w8a8.activations = ActivationMode::kStatic;
  w8a8.observer = "minmax";
  at::NoGradGuard ng;
  {
    BertConfig c;
    c.vocab_size = 50, c.hidden_size = 32, c.num_hidden_layers = 2, c.num_attention_heads = 2, c.intermediate_size = 64;
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0;
    torch::manual_seed(0);
    BertForSequenceClassification m(c);
    m->eval();
    quantize(m, w8a8);
    {
      Calibration calib(m);
      m->forward(at::randint(1, c.vocab_size, {2, 12}, at::kLong));
    }
    freeze(m);
    // Per layer: Q, K, V, output, FFN in and out (6 Linear) + 2 MatMul; pooler + classifier; the
    // word, position and token-type embeddings.
    expect_integer_kernels(*m, "BERT", 2 * 8 + 2 + 3);
    const at::Tensor logits = m->forward(at::randint(1, c.vocab_size, {2, 12}, at::kLong));
    EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
  }
  {
    torch::manual_seed(0);
    SmallCnn m;
    m->eval();
    m->fold_batch_norm();
    quantize(m, w8a8);
    {
      Calibration calib(m);
      m->forward(at::randn({8, 1, 28, 28}));
    }
    freeze(m);
    expect_integer_kernels(*m, "SmallCnn", 4);  // 2 convolutions, 2 Linear
  }
  {
    Gpt2Config c;
    c.vocab_size = 64, c.n_positions = 32, c.n_embd = 128, c.n_layer = 2, c.n_head = 2;  // K = 128: one int4 group
    c.resid_pdrop = c.embd_pdrop = c.attn_pdrop = 0;
    torch::manual_seed(0);
    Gpt2LMHeadModel m(c);
    m->eval();
    m->untie_lm_head();
    Scheme w4(qint4);
    LayerRule emb;
    emb.pattern = "transformer.w?e";
    emb.weights = qint8;
    emb.weight_granularity = Granularity::kPerChannel;
    w4.rules.push_back(emb);
    quantize(m, w4);
    freeze(m);
    // Per block: c_attn, c_proj, c_fc, mlp c_proj; both embeddings; the untied head.
    expect_integer_kernels(*m, "GPT-2", 2 * 4 + 2 + 1);
  }
}

TEST(SmallCnn, FrozenBlocksChainInt8CodesWithTheFloatPathsValues) {
  // Issue 18's static-activation chain: block 1 hands block 2 int8 codes requantized in its
  // epilogue (no float output, no separate quantization pass); the logits equal those of the
  // same frozen layers run with floats between the blocks, bit for bit, on the im2col path
  // (batch 2) and oneDNN's (batch 32: at least 4096 output pixels in both convolutions).
  Scheme w8a8(qint8);
  w8a8.activations = ActivationMode::kStatic;
  w8a8.observer = "minmax";
  at::NoGradGuard ng;
  torch::manual_seed(3);
  SmallCnn m;
  m->eval();
  m->fold_batch_norm();
  quantize(m, w8a8);
  {
    Calibration calib(m);
    m->forward(at::randn({16, 1, 28, 28}));
  }
  freeze(m);
  auto& c0 = *m->blocks->ptr(0)->as<ConvBnReluImpl>()->conv;
  auto& c1 = *m->blocks->ptr(1)->as<ConvBnReluImpl>()->conv;
  ASSERT_TRUE(c1.takes_codes());
  for (int64_t batch : {2, 32}) {
    const at::Tensor x = at::randn({batch, 1, 28, 28});
    const at::Tensor codes = c0.forward_relu_codes(x, c1);
    EXPECT_EQ(codes.scalar_type(), at::kChar);
    EXPECT_TRUE(at::equal(codes, quantize_to_int8(c0.forward_relu(x), c1.input_quantizer()->qparams())))
        << "batch " << batch;
    at::Tensor h = x;
    for (const auto& b : *m->blocks) h = at::max_pool2d(b->as<ConvBnReluImpl>()->conv->forward_relu(h), {2, 2});
    const at::Tensor unchained = m->fc2->forward(at::relu(m->fc1->forward(h.flatten(1))));
    EXPECT_TRUE(at::equal(m->forward(x), unchained)) << "batch " << batch;
  }
  // Codes into a layer that does not take them are refused with the reason.
  nn::Conv2d plain(torch::nn::Conv2dOptions(32, 4, 3));
  EXPECT_NE(qforge::testing::error_of([&] { plain->forward(at::zeros({1, 32, 5, 5}, at::kChar)); }).find("int8 input codes"),
            std::string::npos);
}

}  // namespace
}  // namespace qforge::models
