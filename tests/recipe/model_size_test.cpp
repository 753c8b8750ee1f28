// Issue 39 item 22: model.config sizes were not bounded (n_layer: 100000 grew until the memory
// cap killed the run). Each config counts its model's parameters from its fields, and a config
// whose float32 parameters exceed the memory available is refused before the model is built.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "framework/models/bert.h"
#include "framework/models/gpt2.h"
#include "framework/models/llama.h"
#include "framework/recipe/recipe.h"
#include "framework/recipe/task.h"
#include "framework/recipe/tasks/task_data.h"
#include "tests/error_of.h"
#include "tests/paths.h"

using namespace qforge;
using qforge::testing::error_of;

namespace {

double built_parameters(const torch::nn::Module& m) {
  double n = 0;
  for (const at::Tensor& p : m.parameters()) n += static_cast<double>(p.numel());
  return n;
}

TEST(ModelSize, Issue39Item22ParameterCountIsTheBuiltModels) {
  models::BertConfig b;
  b.vocab_size = 97, b.hidden_size = 32, b.num_hidden_layers = 2, b.num_attention_heads = 4;
  b.intermediate_size = 48, b.max_position_embeddings = 40, b.num_labels = 5;
  EXPECT_EQ(b.parameter_count(), built_parameters(*models::BertForSequenceClassification(b)));
  for (const bool tied : {true, false}) {
    models::Gpt2Config g;
    g.vocab_size = 101, g.n_positions = 24, g.n_embd = 32, g.n_layer = 3, g.n_head = 4, g.n_inner = 40;
    g.tie_word_embeddings = tied;
    EXPECT_EQ(g.parameter_count(), built_parameters(*models::Gpt2LMHeadModel(g))) << "tied " << tied;
  }
  // Llama (with bias flags), Mistral (grouped-query attention), Qwen2 (q/k/v biases, tied).
  for (const char* type : {"llama", "mistral", "qwen2"}) {
    models::LlamaConfig l = models::LlamaConfig::defaults(type);
    l.vocab_size = 103, l.hidden_size = 32, l.intermediate_size = 56, l.num_hidden_layers = 2;
    l.num_attention_heads = 4, l.num_key_value_heads = 2, l.max_position_embeddings = 64;
    l.attention_bias = l.mlp_bias = std::string(type) == "llama";
    l.tie_word_embeddings = std::string(type) == "qwen2";
    EXPECT_EQ(l.parameter_count(), built_parameters(*models::LlamaForCausalLM(l))) << type;
  }
}

TEST(ModelSize, Issue39Item22ConfigBeyondAvailableMemoryIsRefusedBeforeBuilding) {
  ASSERT_GT(tasks::available_memory_bytes(), 0);
  const std::string gpt2 = std::string(QFORGE_SOURCE_DIR) + "/recipes/gpt2_mixed.yaml";
  EXPECT_NO_THROW(make_task(load_recipe(gpt2, {}), /*with_data=*/false));
  // 100000 GPT-2 layers of width 768: about 7e11 parameters, 2.8 TB as float32.
  const std::string e = error_of(
      [&] { make_task(load_recipe(gpt2, {"model.config.n_layer=100000", "model.config.n_embd=768"}), false); });
  EXPECT_NE(e.find("model.config {"), std::string::npos) << e;
  EXPECT_NE(e.find("\"n_layer\":100000"), std::string::npos) << e;
  EXPECT_NE(e.find("describes a gpt2 of about 7.09e+11 parameters"), std::string::npos) << e;
  EXPECT_NE(e.find("GB of memory available"), std::string::npos) << e;
  const std::string bert = std::string(QFORGE_SOURCE_DIR) + "/recipes/bert_int8.yaml";
  const std::string eb =
      error_of([&] { make_task(load_recipe(bert, {"model.config.hidden_size=200000"}), false); });
  EXPECT_NE(eb.find("describes a bert of about"), std::string::npos) << eb;
  const std::string llama = std::string(QFORGE_SOURCE_DIR) + "/recipes/llama_w8a8.yaml";
  const std::string el =
      error_of([&] { make_task(load_recipe(llama, {"model.config.num_hidden_layers=1000000"}), false); });
  EXPECT_NE(el.find("describes a llama of about"), std::string::npos) << el;
}

}  // namespace
