// framework/models/llama: logits of HF folders (tests/models/llama_fixtures, written by
// llama_reference.py) against the PyTorch reference, KV-cache decoding, sharded and bf16/f16
// loading, what the loader and the config refuse, RMSNorm's formula.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "framework/core/error.h"
#include "framework/format/safetensors.h"
#include "framework/models/hf_folder.h"
#include "framework/models/llama.h"
#include "tests/error_of.h"
#include "tests/paths.h"

namespace qforge::models {
namespace {

using qforge::testing::error_of;
namespace fs = std::filesystem;

const char* const kFixtures[] = {"llama3_gqa_tied_bf16_sharded",   "llama2_biases_untied_f32",
                                 "qwen2_gqa_tied_window_f16",      "mistral_window_head_dim_linear_rope_untied_f32",
                                 "llama3_rope_parameters_tf5_f32", "mistral_defaults_omitted_f32",
                                 "qwen2_layer_types_window_off_f32"};
// llama_reference.py's CHUNKS: a 2-token prompt, a 5-token chunk after the cache (longer than the
// fixtures' windows), then one token at a time.
constexpr int64_t kChunks[] = {2, 5};

std::string fixture(const std::string& name) { return std::string(QFORGE_LLAMA_FIXTURES) + "/" + name; }

// max |actual - expected| relative to the largest expected magnitude.
double relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  return (actual - expected).abs().max().item<double>() / expected.abs().max().item<double>();
}

std::string copy_fixture(const std::string& name, const std::string& as) {
  const fs::path to = fs::path(::testing::TempDir()) / ("qforge_llama_" + as);
  fs::remove_all(to);
  fs::copy(fixture(name), to);
  return to.string();
}

LlamaConfig tiny_config() {
  LlamaConfig c;
  c.vocab_size = 50, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  return c;
}

class LlamaFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaFixture, LogitsAndCachedDecodingMatchTheHfReferenceWithin1e5) {
  LlamaForCausalLM m = load_llama_for_causal_lm(fixture(GetParam()));
  m->eval();
  at::NoGradGuard ng;
  const io::SafetensorsFile ref = io::read_safetensors(fixture(GetParam()) + "/reference_logits.safetensors");
  const at::Tensor ids = ref.tensors.at("input_ids"), want = ref.tensors.at("logits");
  const at::Tensor full = m->forward(ids);
  ASSERT_EQ(full.sizes(), want.sizes());
  EXPECT_LT(relative_error(full, want), 1e-5);
  KvCache cache;
  std::vector<at::Tensor> steps;
  int64_t t = 0;
  for (const int64_t n : kChunks) steps.push_back(m->forward(ids.narrow(1, t, n), &cache)), t += n;
  for (; t < ids.size(1); ++t) steps.push_back(m->forward(ids.narrow(1, t, 1), &cache));
  EXPECT_LT(relative_error(at::cat(steps, 1), want), 1e-5);
  EXPECT_EQ(cache.length(), ids.size(1));
  EXPECT_EQ(cache.keys[0].size(1), m->config.kv_heads()) << "the cache holds key/value heads, not query heads";
}

INSTANTIATE_TEST_SUITE_P(Llama, LlamaFixture, ::testing::ValuesIn(kFixtures));

TEST(Llama, FixturesCoverGqaBiasesTiedHeadsRopeScalingAndStoredDtypes) {
  const LlamaConfig l3 = LlamaConfig::from_file(fixture(kFixtures[0]) + "/config.json");
  EXPECT_EQ(l3.rope_scaling.rope_type, "llama3");
  EXPECT_LT(l3.kv_heads(), l3.num_attention_heads);
  EXPECT_TRUE(l3.tie_word_embeddings);
  EXPECT_TRUE(fs::exists(fixture(kFixtures[0]) + "/model.safetensors.index.json"));
  const LlamaConfig qwen = LlamaConfig::from_file(fixture(kFixtures[2]) + "/config.json");
  EXPECT_TRUE(qwen.qkv_bias() && !qwen.o_bias());
  EXPECT_EQ(qwen.attention_window(0), 0) << "below max_window_layers";
  EXPECT_EQ(qwen.attention_window(1), 4);
  LlamaForCausalLM q = load_llama_for_causal_lm(fixture(kFixtures[2]));
  const auto& attn = *q->model->layers->ptr(0)->as<LlamaDecoderLayerImpl>()->self_attn;
  EXPECT_TRUE(attn.q_proj->bias.defined() && !attn.o_proj->bias.defined());
  const LlamaConfig mistral = LlamaConfig::from_file(fixture(kFixtures[3]) + "/config.json");
  EXPECT_EQ(mistral.head_size(), 12);
  EXPECT_EQ(mistral.rope_scaling.rope_type, "linear");
  EXPECT_EQ(mistral.attention_window(0), 3) << "the window is shorter than the fixtures' 10 tokens";
}

TEST(Llama, HfParameterNames) {
  LlamaConfig c = tiny_config();
  LlamaForCausalLM m(c);
  const StateDict s = model_state(*m);
  for (const char* name : {"model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight",
                           "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                           "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                           "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                           "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
                           "model.norm.weight", "lm_head.weight"})
    EXPECT_TRUE(s.count(name)) << name;
  EXPECT_EQ(s.at("model.layers.0.self_attn.k_proj.weight").sizes(), at::IntArrayRef({16, 32})) << "2 kv heads of 8";
  EXPECT_EQ(s.size(), 2u + 2u * 9u + 1u);
}

TEST(Llama, ConfigRoundTripsThroughJsonAndFolders) {
  LlamaConfig c = tiny_config();
  c.rope_scaling = LlamaRopeScaling::from_json(
      {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
       {"original_max_position_embeddings", 32}});
  c.tie_word_embeddings = true;
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_TRUE(j["num_key_value_heads"] == 2 && j["head_dim"].is_null());
  EXPECT_EQ(LlamaConfig::from_json(j).to_json(), j);
  at::manual_seed(1);
  LlamaForCausalLM m(c);
  m->eval();
  const std::string dir = (fs::path(::testing::TempDir()) / "qforge_llama_roundtrip").string();
  save_hf_llama(m, dir);
  LlamaForCausalLM back = load_llama_for_causal_lm(dir);
  fs::remove_all(dir);
  back->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, c.vocab_size, {1, 7}, at::kLong);
  EXPECT_TRUE(at::equal(back->forward(ids), m->forward(ids)));
}

TEST(Llama, RefusedConfigsNameTheKey) {
  nlohmann::json base = tiny_config().to_json();
  auto refusal = [&](const char* key, nlohmann::json value) {
    nlohmann::json j = base;
    j[key] = std::move(value);
    return error_of([&] { LlamaConfig::from_json(j); });
  };
  EXPECT_NE(refusal("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}).find("'rope_scaling.rope_type' is 'yarn'"),
            std::string::npos);
  EXPECT_NE(refusal("rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}).find("'rope_scaling.type'"),
            std::string::npos);
  EXPECT_NE(refusal("model_type", "gemma").find("'model_type'"), std::string::npos);
  EXPECT_NE(refusal("hidden_act", "swish2").find("swish2"), std::string::npos);
  EXPECT_NE(refusal("attention_dropout", 0.1).find("'attention_dropout'"), std::string::npos);
  EXPECT_NE(refusal("num_key_value_heads", 3).find("num_key_value_heads 3"), std::string::npos);
  EXPECT_NE(refusal("head_dim", 7).find("head_dim 7"), std::string::npos);
  EXPECT_NE(refusal("hidden_size", "wide").find("'hidden_size' has the wrong type"), std::string::npos);
  EXPECT_NE(refusal("partial_rotary_factor", 0.5).find("'partial_rotary_factor'"), std::string::npos);
  EXPECT_EQ(refusal("pretraining_tp", 2), "") << "pretraining_tp only splits HF's products; the result is the same";
}

// RoPE makes attention depend on relative positions only, so with one layer and a window of W
// each position's logits are those of the W tokens ending there, run alone.
TEST(Llama, SlidingWindowSeesOnlyTheLastWindowOfKeys) {
  LlamaConfig c = tiny_config();
  c.model_type = "mistral", c.num_hidden_layers = 1, c.sliding_window = 3;
  at::manual_seed(4);
  LlamaForCausalLM m(c);
  m->eval();
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, c.vocab_size, {2, 9}, at::kLong);
  const at::Tensor full = m->forward(ids);
  for (int64_t t = 2; t < 9; ++t) {
    const at::Tensor alone = m->forward(ids.narrow(1, t - 2, 3)).narrow(1, 2, 1);
    EXPECT_LT(relative_error(full.narrow(1, t, 1), alone), 1e-5) << "position " << t;
  }
  c.sliding_window = 0;
  LlamaForCausalLM unwindowed(c);
  {
    const StateDict from = model_state(*m);
    load_hf_llama(unwindowed, from, "the windowed model");
  }
  EXPECT_GT(relative_error(unwindowed->forward(ids), full), 1e-3) << "the window changes the logits";
  // Qwen2 windows only with use_sliding_window, from max_window_layers on; layer_types overrides.
  c.model_type = "qwen2", c.sliding_window = 3, c.num_hidden_layers = 2, c.max_window_layers = 1;
  EXPECT_EQ(c.attention_window(1), 0);
  c.use_sliding_window = true;
  EXPECT_EQ(c.attention_window(0), 0);
  EXPECT_EQ(c.attention_window(1), 3);
  nlohmann::json j = c.to_json();
  j["layer_types"] = {"sliding_attention", "full_attention"};
  const LlamaConfig typed = LlamaConfig::from_json(j);
  EXPECT_EQ(typed.attention_window(0), 3);
  EXPECT_EQ(typed.attention_window(1), 0);
  EXPECT_EQ(LlamaConfig::from_json(typed.to_json()).layer_types, typed.layer_types);
  j["layer_types"] = {"chunked_attention", "full_attention"};
  EXPECT_NE(error_of([&] { LlamaConfig::from_json(j); }).find("'layer_types' holds 'chunked_attention'"),
            std::string::npos);
}

TEST(Llama, UntiedHeadKeepsTheLogits) {
  LlamaConfig c = tiny_config();
  c.tie_word_embeddings = true;
  LlamaForCausalLM m(c);
  at::NoGradGuard ng;
  const at::Tensor ids = at::randint(0, c.vocab_size, {2, 5}, at::kLong);
  const at::Tensor tied = m->forward(ids);
  m->untie_lm_head();
  EXPECT_TRUE(at::equal(m->forward(ids), tied));
  EXPECT_NE(error_of([&] { m->untie_lm_head(); }).find("already untied"), std::string::npos);
}

TEST(Llama, FailedLoadNamesEveryProblemAndLeavesTheModelUntouched) {
  LlamaForCausalLM m = load_llama_for_causal_lm(fixture(kFixtures[1]));
  StateDict before;  // copies: model_state aliases the model's tensors
  for (const auto& [k, v] : model_state(*m)) before[k] = v.clone();
  StateDict bad;
  for (const auto& [k, v] : before) bad[k] = v + 1;
  bad.erase("model.norm.weight");
  bad["model.layers.0.mlp.up_proj.weight"] = at::zeros({3, 3});
  bad["model.layers.9.mlp.up_proj.weight"] = at::zeros({3});
  const std::string e = error_of([&] { load_hf_llama(m, bad, "bad.safetensors"); });
  for (const char* part : {"model.norm.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.9.mlp.up_proj.weight"})
    EXPECT_NE(e.find(part), std::string::npos) << e;
  for (const auto& [k, v] : model_state(*m)) EXPECT_TRUE(at::equal(v, before.at(k))) << k;
  // A tied model refuses a head that differs from its embedding.
  LlamaForCausalLM tied = load_llama_for_causal_lm(fixture(kFixtures[0]));
  StateDict with_head = model_state(*tied);
  with_head["lm_head.weight"] = at::zeros_like(with_head.at("model.embed_tokens.weight"));
  EXPECT_NE(error_of([&] { load_hf_llama(tied, with_head, "h.safetensors"); }).find("differs from model.embed_tokens"),
            std::string::npos);
}

TEST(Llama, ShardedIndexErrorsNameTheTensorAndTheShard) {
  const std::string dir = copy_fixture(kFixtures[0], "shards");
  const std::string index = dir + "/model.safetensors.index.json";
  nlohmann::json j;
  {
    std::ifstream in(index);
    in >> j;
  }
  auto with_index = [&](const nlohmann::json& changed) {
    std::ofstream(index) << changed.dump();
    return error_of([&] { read_hf_weights(dir); });
  };
  nlohmann::json missing = j;
  missing["weight_map"]["model.extra.weight"] = "model-00001-of-00002.safetensors";
  EXPECT_NE(with_index(missing).find("places 'model.extra.weight' in model-00001-of-00002.safetensors"),
            std::string::npos);
  nlohmann::json dropped = j;
  dropped["weight_map"].erase("model.norm.weight");
  EXPECT_NE(with_index(dropped).find("holds 'model.norm.weight'"), std::string::npos);
  nlohmann::json escaping = j;
  escaping["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  EXPECT_NE(with_index(escaping).find("not a file in the folder"), std::string::npos);
  fs::remove(index);
  EXPECT_NE(error_of([&] { read_hf_weights(dir); }).find("neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos);
  fs::remove_all(dir);
}

// A float layer converted to bfloat16, with bfloat16 RoPE tables, masks its scores with bfloat16's
// lowest value (float32's does not fit); 20 tokens take the ATen attention path, not the fused one.
TEST(Llama, ReducedPrecisionLayerRunsAndKeepsItsOutput) {
  at::manual_seed(0);
  LlamaModel m(tiny_config());
  at::NoGradGuard ng;
  auto layer = m->layers[0]->as<LlamaDecoderLayerImpl>();
  const RopeTables rope = m->rope(0, 20, at::kCPU);
  const at::Tensor x = at::randn({2, 20, 32});
  const at::Tensor want = layer->forward(x, rope);
  m->to(at::kBFloat16);
  const RopeTables half_rope{rope.cos.to(at::kBFloat16), rope.sin.to(at::kBFloat16)};
  const at::Tensor got = layer->forward(x.to(at::kBFloat16), half_rope);
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::isfinite(got).all().item<bool>());
  EXPECT_LT(relative_error(got.to(at::kFloat), want), 5e-2);
}

TEST(RMSNorm, IsTheFormulaAndQuantizesItsOutputLikeLayerNorm) {
  nn::RMSNorm n(6, 1e-5);
  {
    at::NoGradGuard g;
    n->weight.copy_(at::arange(1, 7, at::kFloat) / 4);
  }
  const at::Tensor x = at::randn({3, 6}, at::kDouble);
  const at::Tensor want = n->weight.to(at::kDouble) * x / at::sqrt(x.pow(2).mean(-1, true) + 1e-5);
  const at::Tensor got = n->forward(x.to(at::kFloat)).to(at::kDouble);
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-6);
  EXPECT_STREQ(n->layer_type(), "RMSNorm");
  EXPECT_NE(error_of([&] { n->forward(at::zeros({2, 5})); }).find("does not end in 6"), std::string::npos);
  EXPECT_NE(error_of([&] { n->clone(); }).find("clone() is not supported"), std::string::npos);
}

}  // namespace
}  // namespace qforge::models
