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

}  // namespace
}  // namespace qforge
