// The llama task (framework/recipe/tasks/causal_lm_task.h): import_safetensors reads an HF folder,
// single-file or sharded, as well as one .safetensors file, and the imported model computes what
// the exported one does.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "framework/format/safetensors.h"
#include "framework/models/state_dict.h"
#include "framework/recipe/task.h"
#include "framework/text/tokenizer.h"
#include "tests/error_of.h"

namespace qforge {
namespace {

namespace fs = std::filesystem;
using qforge::testing::error_of;

Recipe tiny_llama_recipe() {
  Recipe r;
  r.model.arch = "llama";
  r.model.config = {{"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 1},
                    {"num_attention_heads", 4}, {"num_key_value_heads", 2}};
  r.data.seq_len = 16;
  return r;
}

// `state` as an HF folder of two shards and their model.safetensors.index.json.
void write_two_shards(const std::string& dir, const models::StateDict& state) {
  fs::create_directories(dir);
  std::map<std::string, at::Tensor> shards[2];
  nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
  size_t i = 0;
  for (const auto& [name, t] : state) {
    const size_t s = i++ % 2;
    shards[s][name] = t.detach().contiguous();
    index["weight_map"][name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  for (size_t s = 0; s < 2; ++s)
    io::write_safetensors(dir + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors", shards[s], {});
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
}

TEST(LlamaTask, ImportsAnHfFolderShardedOrSingleFile) {
  at::manual_seed(3);
  Task from = make_task(tiny_llama_recipe(), /*with_data=*/false);
  const std::string dir = (fs::path(::testing::TempDir()) / "qforge_llama_task_shards").string();
  fs::remove_all(dir);
  write_two_shards(dir, models::model_state(*from.model));
  from.model->eval();
  train::Batch batch;
  batch.input = at::randint(0, 256, {2, 7}, at::kLong);
  at::NoGradGuard ng;
  const at::Tensor want = from.forward(batch);
  Task sharded = make_task(tiny_llama_recipe(), false);
  sharded.import_safetensors(dir);
  sharded.model->eval();
  EXPECT_TRUE(at::equal(sharded.forward(batch), want));
  std::map<std::string, at::Tensor> all;
  for (const auto& [name, t] : models::model_state(*from.model)) all[name] = t.detach().contiguous();
  io::write_safetensors(dir + "/weights.safetensors", all, {});
  Task single = make_task(tiny_llama_recipe(), false);
  single.import_safetensors(dir + "/weights.safetensors");
  single.model->eval();
  EXPECT_TRUE(at::equal(single.forward(batch), want));
  Task half = make_task(tiny_llama_recipe(), false);
  EXPECT_NE(error_of([&] { half.import_safetensors(dir + "/model-00001-of-00002.safetensors"); }).find("missing keys"),
            std::string::npos);
  fs::remove_all(dir);
}

// data.tokenizer.train: the task trains a BPE tokenizer on the fortunes training text, the model's
// vocabulary is its size, the splits are its tokens, and the saved tokenizer.json decodes them
// back to the corpus text; data.tokenizer.file reads that file back to the same tokens.
TEST(LlamaTask, TrainsABpeTokenizerOnTheFortunesTrainingText) {
  Recipe r = tiny_llama_recipe();
  r.data.dataset = "fortunes";
  r.data.tokenizer_vocab_size = 300;
  r.data.max_train_examples = 3;
  r.data.max_eval_examples = 2;
  at::manual_seed(0);
  Task t = make_task(r, /*with_data=*/true);
  EXPECT_EQ(models::model_state(*t.model).at("model.embed_tokens.weight").size(0), 300);
  ASSERT_TRUE(t.save_tokenizer);
  EXPECT_EQ(t.tokenizer_name, "tokenizer.json");
  const std::string path = (fs::path(::testing::TempDir()) / "qforge_llama_task_tokenizer.json").string();
  t.save_tokenizer(path);
  const std::unique_ptr<text::Tokenizer> tok = text::load_tokenizer(path);
  EXPECT_EQ(tok->vocab_size(), 300);
  const train::Batch first = t.train->get(at::arange(1, at::kLong));
  ASSERT_EQ(first.input.sizes(), (std::vector<int64_t>{1, 16}));
  EXPECT_GE(first.input.max().item<int64_t>(), 256);  // merged tokens, not bytes
  const at::Tensor ids = first.input[0].contiguous();
  const std::string text = tok->decode(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + 16));
  std::ifstream corpus("/usr/share/games/fortunes/" + std::string("art"), std::ios::binary);
  std::string head(text.size(), '\0');
  corpus.read(head.data(), static_cast<std::streamsize>(head.size()));
  EXPECT_EQ(text, head);  // the first fortune file, sorted by name
  // The test text the two capped evaluation examples cover, in windows of 16 every 8 tokens.
  ASSERT_TRUE(t.sliding_perplexity);
  const models::PerplexityResult p = t.sliding_perplexity();
  EXPECT_EQ(p.max_length, 16);
  EXPECT_EQ(p.stride, 8);
  EXPECT_EQ(p.tokens_scored, 2 * 16);
  EXPECT_NEAR(p.perplexity, std::exp(p.nll_per_token), 1e-9 * p.perplexity);
  EXPECT_GT(p.perplexity, 1.0);

  Recipe from_file = r;
  from_file.data.tokenizer_vocab_size = 0;
  from_file.data.tokenizer_file = path;
  Task f = make_task(from_file, true);
  EXPECT_EQ(f.tokenizer_name, "tokenizer.json");
  EXPECT_TRUE(at::equal(f.train->get(at::arange(3, at::kLong)).input, t.train->get(at::arange(3, at::kLong)).input));
  fs::remove(path);
}

}  // namespace
}  // namespace qforge
