// The whole qtrain pipeline on a Llama model, as on GPT-2 (issue 33): recipes/llama_mixed.yaml on a
// 2-layer Llama of hidden 64 runs float training, the mixed-precision search under a size budget,
// calibration, QAT, the numeric suite, freeze and export; model.h5 loads back into the model its
// resolved recipe builds and scores the report's perplexities, model.safetensors holds the same
// codes, qgen generates from the run directory, and the searched recipe rebuilds the same layers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <nlohmann/json.hpp>

#include "framework/format/safetensors.h"
#include "framework/io/model_io.h"
#include "framework/recipe/recipe.h"
#include "framework/recipe/task.h"
#include "framework/train/trainer.h"
#include "tests/qtrain_run.h"

namespace fs = std::filesystem;

namespace {

using qforge::testing::out_dir;
using qforge::testing::qtrain;
using qforge::testing::QtrainRun;
using qforge::testing::report;

// recipes/llama_mixed.yaml at 2 layers of hidden 64 (GQA 4/2), groups of 32, a 320-token BPE
// vocabulary, 2 epochs of 256 sequences of 32 tokens, one front point measured, 4 QAT steps.
std::string tiny_llama(const std::string& dir) {
  return " --out " + dir + " --set model.checkpoint=" + dir + "/fp32.h5" +
         " --set model.config.num_hidden_layers=2 --set model.config.hidden_size=64" +
         " --set model.config.intermediate_size=128 --set model.config.num_attention_heads=4" +
         " --set model.config.num_key_value_heads=2 --set data.seq_len=32 --set data.tokenizer.train.vocab_size=320" +
         " --set data.max_train_examples=256 --set data.max_eval_examples=32 --set train.epochs=2" +
         " --set train.warmup_steps=0 --set train.lr=0.01" +
         " --set calibrate.batches=2 --set quantize.weights.group_size=32 --set search.group_size=32" +
         " --set search.batches=1 --set search.probes=4 --set search.evaluate_front=1 --set search.latency_cache=off" +
         " --set qat.max_steps=4";
}

// The Linear layers of an n-layer Llama with an untied head, by HF's names.
std::set<std::string> llama_linears(int layers) {
  std::set<std::string> out{"lm_head"};
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) out.insert(p + ".self_attn." + n);
    for (const char* n : {"gate_proj", "up_proj", "down_proj"}) out.insert(p + ".mlp." + n);
  }
  return out;
}

double relative(double a, double b) { return std::abs(a - b) / std::abs(b); }

}  // namespace

TEST(QtrainLlama, MixedSearchQatAndNumericSuiteRunAndBothCheckpointsLoadBackToTheReport) {
  const std::string dir = out_dir("llama_mixed");
  const QtrainRun run = qtrain("--recipe recipes/llama_mixed.yaml" + tiny_llama(dir));
  ASSERT_EQ(run.code, 0) << run.output;
  const nlohmann::json r = report(dir);
  for (const char* stage : {"float", "ptq", "qat", "frozen"}) {
    ASSERT_TRUE(r["metrics"].contains(stage)) << stage << "\n" << r.dump(2);
    const double ppl = r["metrics"][stage]["perplexity"].get<double>();
    EXPECT_GT(ppl, 1.0) << stage;
    EXPECT_LT(ppl, 320.0) << stage;  // below a uniform model over the vocabulary
    EXPECT_TRUE(r["metrics"][stage].contains("sliding_window_perplexity")) << stage;
  }
  EXPECT_LT(r["metrics"]["float"]["perplexity"].get<double>(), 160.0);  // trained: half the uniform model's
  EXPECT_FALSE(r["loss_curves"]["qat"].empty());
  // The integer kernels compute what QAT's fake-quant model computed.
  EXPECT_LT(relative(r["metrics"]["frozen"]["perplexity"].get<double>(), r["metrics"]["qat"]["perplexity"].get<double>()), 1e-4);

  // The search priced every Linear (the embedding is kept float by the recipe's rule) and met the budget.
  const std::set<std::string> linears = llama_linears(2);
  const nlohmann::json& s = r["search"];
  std::map<std::string, std::string> chosen;
  for (const auto& l : s["layers"]) chosen[l["path"].get<std::string>()] = l["qtype"].get<std::string>();
  std::set<std::string> searched;
  for (const auto& [path, qtype] : chosen) searched.insert(path);
  EXPECT_EQ(searched, linears) << s["layers"].dump(1);
  EXPECT_LE(s["bytes"].get<double>(), s["budget_bytes"].get<double>());
  ASSERT_TRUE(fs::exists(dir + "/recipe.searched.yaml"));

  // Every quantized Linear has its row in the layer table and in the numeric suite's table.
  std::map<std::string, nlohmann::json> table, errors;
  for (const auto& l : r["layers"]) table[l["name"].get<std::string>()] = l;
  for (const auto& l : r["layer_errors"]["layers"]) errors[l["path"].get<std::string>()] = l;
  int quantized = 0;
  for (const auto& [path, qtype] : chosen) {
    if (qtype == "float") {
      EXPECT_EQ(table.count(path), 0u) << path;
      continue;
    }
    ++quantized;
    ASSERT_EQ(table.count(path), 1u) << path << "\n" << r["layers"].dump(1);
    // The search names a candidate "qint4 per_group(32)", the table the frozen weight's spec.
    EXPECT_EQ(table[path]["weights"].get<std::string>().substr(0, qtype.find(' ') + 1), qtype.substr(0, qtype.find(' ') + 1))
        << qtype << " " << table[path].dump();
    EXPECT_GT(table[path]["bytes"].get<int64_t>(), 0) << path;
    EXPECT_FALSE(table[path]["kernel"].get<std::string>().empty()) << path;
    ASSERT_EQ(errors.count(path), 1u) << path << "\n" << r["layer_errors"].dump(1);
    EXPECT_GT(errors[path]["rows"].get<int64_t>(), 0) << path;
    EXPECT_TRUE(std::isfinite(errors[path]["weight_sqnr_db"].get<double>())) << errors[path].dump();
  }
  EXPECT_GT(quantized, 0);
  // The search's bytes are the frozen model's, its float bytes the float model's.
  EXPECT_EQ(s["bytes"].get<int64_t>(), r["size_bytes"]["frozen"].get<int64_t>());
  EXPECT_EQ(s["float_bytes"].get<int64_t>(), r["size_bytes"]["float"].get<int64_t>());

  // model.h5 into the model the resolved recipe builds (its data too): the frozen stage's figures.
  const qforge::Recipe recipe = qforge::load_recipe(dir + "/recipe.resolved.yaml");
  qforge::Task task = qforge::make_task(recipe, /*with_data=*/true);
  const qforge::io::LoadReport loaded = qforge::io::load_model(*task.model, dir + "/model.h5");
  EXPECT_EQ(static_cast<int>(loaded.frozen_layers.size()), quantized);
  const qforge::train::Metrics m =
      qforge::train::evaluate(*task.model, *task.test, task.forward, recipe.data.eval_batch_size, "reloaded", false);
  const nlohmann::json& frozen = r["metrics"]["frozen"];
  EXPECT_LT(relative(m.perplexity, frozen["perplexity"].get<double>()), 1e-9) << m.perplexity;
  EXPECT_LT(relative(task.sliding_perplexity().perplexity, frozen["sliding_window_perplexity"].get<double>()), 1e-9);

  // model.safetensors: each frozen weight's codes, scales and zero points are model.h5's; every
  // float tensor is the reloaded model's.
  const qforge::io::SafetensorsFile st =
      qforge::io::read_safetensors(dir + "/model.safetensors", qforge::io::SafetensorsReadOptions{false});
  ASSERT_EQ(st.metadata.at("format"), "qforge.quantized");
  const nlohmann::json packed = nlohmann::json::parse(st.metadata.at("qforge.quantized"));
  const qforge::io::CheckpointReader h5(dir + "/model.h5");
  int packed_linears = 0;
  for (const auto& [name, info] : packed.items()) {
    const qforge::QuantizedTensor q = h5.read_quantized(name);
    EXPECT_TRUE(st.tensors.at(name).view(-1).equal(q.data.view(-1).view(st.tensors.at(name).scalar_type()))) << name;
    EXPECT_TRUE(st.tensors.at(name + ".scale").equal(q.scale)) << name;
    EXPECT_TRUE(st.tensors.at(name + ".zero_point").equal(q.zero_point)) << name;
    packed_linears += linears.count(name.substr(0, name.size() - std::string(".weight").size())) > 0;
  }
  EXPECT_EQ(packed_linears, quantized);
  for (const auto& p : task.model->named_parameters()) {
    if (packed.contains(p.key())) continue;
    ASSERT_TRUE(st.tensors.count(p.key())) << p.key();
    EXPECT_TRUE(st.tensors.at(p.key()).equal(p.value())) << p.key();
  }

  // The searched recipe builds the same layers without searching.
  const std::string again_dir = out_dir("llama_searched");
  const QtrainRun again = qtrain("--recipe " + dir + "/recipe.searched.yaml --out " + again_dir +
                                 " --stages calibrate,freeze");
  ASSERT_EQ(again.code, 0) << again.output;
  const nlohmann::json r2 = report(again_dir);
  EXPECT_FALSE(r2.contains("search"));
  ASSERT_EQ(r2["layers"].size(), r["layers"].size());
  for (size_t i = 0; i < r["layers"].size(); ++i) {
    EXPECT_EQ(r2["layers"][i]["name"], r["layers"][i]["name"]);
    EXPECT_EQ(r2["layers"][i]["weights"], r["layers"][i]["weights"]);
    EXPECT_EQ(r2["layers"][i]["bytes"], r["layers"][i]["bytes"]);
  }
  EXPECT_EQ(r2["size_bytes"]["frozen"], r["size_bytes"]["frozen"]);
  if (!HasFailure()) fs::remove_all(dir), fs::remove_all(again_dir);
}
