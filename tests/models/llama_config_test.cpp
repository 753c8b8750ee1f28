// framework/models/llama's config reading as HF's config classes resolve it: transformers 5's
// rope_parameters, per-model_type defaults, the per-layer sliding-window rules, required RoPE keys,
// and LlamaConfig::validate() on configs built in code.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "framework/models/activation.h"
#include "framework/models/llama.h"
#include "tests/error_of.h"
#include "tests/paths.h"

namespace qforge::models {
namespace {

using qforge::testing::error_of;

nlohmann::json fixture_config(const std::string& name) {
  return read_config_json(std::string(QFORGE_LLAMA_FIXTURES) + "/" + name + "/config.json", "test");
}

bool has(const std::string& error, const std::string& part) { return error.find(part) != std::string::npos; }

TEST(LlamaConfig, Transformers5RopeParametersAreRead) {
  const nlohmann::json j = fixture_config("llama3_rope_parameters_tf5_f32");
  ASSERT_FALSE(j.contains("rope_theta") || j.contains("rope_scaling")) << "the fixture is transformers 5's form";
  const LlamaConfig c = LlamaConfig::from_json(j);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 64);
  auto refusal = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json bad = j;
    change(bad);
    return error_of([&] { LlamaConfig::from_json(bad); });
  };
  EXPECT_TRUE(has(refusal([](nlohmann::json& b) {
                    b["rope_parameters"] = {{"full_attention", b["rope_parameters"]},
                                            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
                  }),
                  "'rope_parameters.full_attention' gives RoPE parameters per layer type"));
  EXPECT_TRUE(has(refusal([](nlohmann::json& b) { b["rope_parameters"]["partial_rotary_factor"] = 0.5; }),
                  "'rope_parameters.partial_rotary_factor' is not supported"));
  EXPECT_TRUE(has(refusal([](nlohmann::json& b) { b["rope_parameters"].erase("low_freq_factor"); }),
                  "'rope_parameters.low_freq_factor' is missing; rope_type llama3 needs it"));
  EXPECT_TRUE(has(refusal([](nlohmann::json& b) { b["rope_theta"] = 10000.0; }),
                  "'rope_theta' (10000.0) and 'rope_parameters.rope_theta' (500000) disagree"));
  EXPECT_TRUE(has(refusal([](nlohmann::json& b) { b["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}}; }),
                  "'rope_scaling' and 'rope_parameters' disagree"));
  EXPECT_EQ(refusal([](nlohmann::json& b) { b["rope_theta"] = 500000.0; }), "") << "agreeing forms are accepted";
}

TEST(LlamaConfig, RopeScalingKeysTheKindNeedsAreRequired) {
  nlohmann::json j = fixture_config("llama2_biases_untied_f32");
  j["rope_scaling"] = {{"rope_type", "linear"}};
  EXPECT_TRUE(has(error_of([&] { LlamaConfig::from_json(j); }), "'rope_scaling.factor' is missing; rope_type linear"));
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  EXPECT_TRUE(has(error_of([&] { LlamaConfig::from_json(j); }),
                  "'rope_scaling.original_max_position_embeddings' is missing; rope_type llama3"));
}

TEST(LlamaConfig, DefaultsFollowTheModelTypesConfigClass) {
  const LlamaConfig mistral = LlamaConfig::from_json(fixture_config("mistral_defaults_omitted_f32"));
  EXPECT_EQ(mistral.kv_heads(), 8) << "MistralConfig's num_key_value_heads";
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_EQ(mistral.attention_window(1), 4096);
  EXPECT_TRUE(mistral.attention_bias && !mistral.qkv_bias() && !mistral.o_bias()) << "Mistral ignores attention_bias";
  nlohmann::json j = {{"model_type", "mistral"}, {"num_key_value_heads", nullptr}, {"sliding_window", nullptr}};
  const LlamaConfig nulls = LlamaConfig::from_json(j);
  EXPECT_EQ(nulls.kv_heads(), 32) << "an explicit null is num_attention_heads";
  EXPECT_EQ(nulls.attention_window(0), 0);
  EXPECT_EQ(nulls.intermediate_size, 14336);
  const LlamaConfig qwen_on = LlamaConfig::from_json({{"model_type", "qwen2"}, {"use_sliding_window", true}});
  EXPECT_EQ(qwen_on.sliding_window, 4096);
  EXPECT_EQ(qwen_on.kv_heads(), 32);
  EXPECT_EQ(qwen_on.attention_window(28), 4096);
  EXPECT_EQ(qwen_on.attention_window(27), 0);
  EXPECT_EQ(LlamaConfig::from_json({{"model_type", "qwen2"}, {"sliding_window", 8}}).sliding_window, 0)
      << "Qwen2Config drops the window without use_sliding_window";
  EXPECT_EQ(LlamaConfig::from_json(nlohmann::json::object()).vocab_size, 32000);
}

TEST(LlamaConfig, SlidingWindowsFollowEachModelsLayerRules) {
  const LlamaConfig off = LlamaConfig::from_json(fixture_config("qwen2_layer_types_window_off_f32"));
  EXPECT_EQ(off.layer_types[0], "sliding_attention");
  EXPECT_EQ(off.attention_window(0), 0) << "use_sliding_window false turns the marked layers' window off";
  nlohmann::json j = fixture_config("mistral_window_head_dim_linear_rope_untied_f32");
  j["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_EQ(LlamaConfig::from_json(j).attention_window(1), 3) << "Mistral windows every layer";
  j = fixture_config("llama2_biases_untied_f32");
  j["sliding_window"] = 4;
  EXPECT_EQ(LlamaConfig::from_json(j).attention_window(1), 0) << "Llama has no sliding window";
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_TRUE(has(error_of([&] { LlamaConfig::from_json(j); }),
                  "'layer_types' holds 'sliding_attention'; llama has no sliding-window attention"));
}

TEST(LlamaConfig, ModelsValidateConfigsBuiltInCode) {
  LlamaConfig c = LlamaConfig::from_json(fixture_config("qwen2_gqa_tied_window_f16"));
  c.layer_types = {"sliding_attention"};  // the model has 2 layers
  EXPECT_TRUE(has(error_of([&] { LlamaForCausalLM m(c); }), "'layer_types' lists 1 layers, the model has 2"));
  c.layer_types.clear();
  c.num_key_value_heads = 3;
  EXPECT_TRUE(has(error_of([&] { LlamaForCausalLM m(c); }), "not a multiple of num_key_value_heads 3"));
  c.num_key_value_heads = 2;
  c.rope_scaling.rope_type = "yarn";
  EXPECT_TRUE(has(error_of([&] { LlamaModel m(c); }), "'rope_scaling.rope_type' is 'yarn'"));
}

TEST(LlamaConfig, HiddenActSwishIsSilu) {
  const at::Tensor x = at::linspace(-6, 6, 25, at::kDouble);
  const at::Tensor silu = x * at::sigmoid(x);  // SiLU's formula
  EXPECT_LT((apply_activation("swish", x) - silu).abs().max().item<double>(), 1e-12);
  EXPECT_LT((apply_activation("silu", x) - silu).abs().max().item<double>(), 1e-12);
  nlohmann::json j = fixture_config("llama2_biases_untied_f32");
  j["hidden_act"] = "swish";
  EXPECT_EQ(LlamaConfig::from_json(j).hidden_act, "swish");
  j["hidden_act"] = "mish";
  EXPECT_TRUE(has(error_of([&] { LlamaConfig::from_json(j); }), "'hidden_act' is 'mish'; supported: silu, swish, gelu"));
}

}  // namespace
}  // namespace qforge::models
