// The whole qtrain pipeline on a Llama model, as on GPT-2 (issue 33): recipes/llama_mixed.yaml on a
// 2-layer Llama of hidden 64 runs float training, the mixed-precision search under a size budget,
// calibration, QAT, the numeric suite, freeze and export; model.h5 loads back into the model its
// resolved recipe builds and scores the report's perplexities, model.safetensors holds the same
// codes, and the searched recipe rebuilds the same layers and PTQ perplexity.
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
// vocabulary, 8 epochs of 256 sequences of 32 tokens (float training learns context: below the
// unigram model), 16 Hutchinson probes (no Linear's trace estimate clamped to 0), one front point
// measured, 4 QAT steps.
std::string tiny_llama(const std::string& dir) {
  return " --out " + dir + " --set model.checkpoint=" + dir + "/fp32.h5" +
         " --set model.config.num_hidden_layers=2 --set model.config.hidden_size=64" +
         " --set model.config.intermediate_size=128 --set model.config.num_attention_heads=4" +
         " --set model.config.num_key_value_heads=2 --set data.seq_len=32 --set data.tokenizer.train.vocab_size=320" +
         " --set data.max_train_examples=256 --set data.max_eval_examples=32 --set train.epochs=8" +
         " --set train.warmup_steps=0 --set train.lr=0.01" +
         " --set calibrate.batches=2 --set quantize.weights.group_size=32 --set search.group_size=32" +
         " --set search.batches=1 --set search.probes=16 --set search.evaluate_front=1 --set search.latency_cache=off" +
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

// Every stage's perplexity; the float model's below 3/4 of the unigram model's (it uses context).
void check_stages(const nlohmann::json& r) {
  for (const char* stage : {"float", "ptq", "qat", "frozen"}) {
    ASSERT_TRUE(r["metrics"].contains(stage)) << stage << "\n" << r.dump(2);
    const double ppl = r["metrics"][stage]["perplexity"].get<double>();
    EXPECT_GT(ppl, 1.0) << stage;
    EXPECT_LT(ppl, 320.0) << stage;  // below a uniform model over the vocabulary
    EXPECT_TRUE(r["metrics"][stage].contains("sliding_window_perplexity")) << stage;
  }
  EXPECT_LT(r["metrics"]["float"]["perplexity"].get<double>(), 0.75 * r["baselines"]["unigram_perplexity"].get<double>());
  EXPECT_FALSE(r["loss_curves"]["qat"].empty());
  // The integer kernels compute what QAT's fake-quant model computed.
  EXPECT_LT(relative(r["metrics"]["frozen"]["perplexity"].get<double>(), r["metrics"]["qat"]["perplexity"].get<double>()), 1e-4);
}

// The search priced every Linear (the embedding is kept float by the recipe's rule) with a positive
// Hessian trace and met the budget; returns its layers by path.
std::map<std::string, nlohmann::json> check_search(const nlohmann::json& r, const std::set<std::string>& linears) {
  const nlohmann::json& s = r["search"];
  std::map<std::string, nlohmann::json> chosen;
  std::set<std::string> searched;
  for (const auto& l : s["layers"]) {
    chosen[l["path"].get<std::string>()] = l;
    searched.insert(l["path"].get<std::string>());
    EXPECT_GT(l["hessian_trace"].get<double>(), 0.0) << l["path"];
  }
  EXPECT_EQ(searched, linears) << s["layers"].dump(1);
  EXPECT_LE(s["bytes"].get<double>(), s["budget_bytes"].get<double>());
  // The search's bytes are the frozen model's, its float bytes the float model's.
  EXPECT_EQ(s["bytes"].get<int64_t>(), r["size_bytes"]["frozen"].get<int64_t>());
  EXPECT_EQ(s["float_bytes"].get<int64_t>(), r["size_bytes"]["float"].get<int64_t>());
  return chosen;
}

// Every quantized Linear has its row in the layer table (the search's bytes) and in the numeric
// suite's table; returns how many Linears are quantized.
int check_tables(const nlohmann::json& r, const std::map<std::string, nlohmann::json>& chosen) {
  std::map<std::string, nlohmann::json> table, errors;
  for (const auto& l : r["layers"]) table[l["name"].get<std::string>()] = l;
  for (const auto& l : r["layer_errors"]["layers"]) errors[l["path"].get<std::string>()] = l;
  int quantized = 0;
  for (const auto& [path, layer] : chosen) {
    const std::string qtype = layer["qtype"].get<std::string>();
    if (qtype == "float") {
      EXPECT_EQ(table.count(path), 0u) << path;
      continue;
    }
    ++quantized;
    if (table.count(path) != 1) {
      ADD_FAILURE() << path << "\n" << r["layers"].dump(1);
      continue;
    }
    // The search names a candidate "qint4 per_group(32)", the table the frozen weight's spec.
    EXPECT_EQ(table[path]["weights"].get<std::string>().substr(0, qtype.find(' ') + 1), qtype.substr(0, qtype.find(' ') + 1))
        << qtype << " " << table[path].dump();
    EXPECT_EQ(table[path]["bytes"].get<int64_t>(), layer["bytes"].get<int64_t>()) << qtype << " " << table[path].dump();
    EXPECT_FALSE(table[path]["kernel"].get<std::string>().empty()) << path;
    if (errors.count(path) != 1) {
      ADD_FAILURE() << path << "\n" << r["layer_errors"].dump(1);
      continue;
    }
    EXPECT_GT(errors[path]["rows"].get<int64_t>(), 0) << path;
    EXPECT_TRUE(std::isfinite(errors[path]["weight_sqnr_db"].get<double>())) << errors[path].dump();
  }
  return quantized;
}

// model.h5 into the model the resolved recipe builds (its data too) gives the frozen stage's
// figures; model.safetensors holds each frozen weight's codes, scales and zero points of model.h5
// and every float tensor of the reloaded model.
void check_checkpoints(const std::string& dir, const nlohmann::json& r, const std::set<std::string>& linears,
                       int quantized) {
  const qforge::Recipe recipe = qforge::load_recipe(dir + "/recipe.resolved.yaml");
  qforge::Task task = qforge::make_task(recipe, /*with_data=*/true);
  const qforge::io::LoadReport loaded = qforge::io::load_model(*task.model, dir + "/model.h5");
  EXPECT_EQ(static_cast<int>(loaded.frozen_layers.size()), quantized);
  const qforge::train::Metrics m =
      qforge::train::evaluate(*task.model, *task.test, task.forward, recipe.data.eval_batch_size, "reloaded", false);
  const nlohmann::json& frozen = r["metrics"]["frozen"];
  EXPECT_LT(relative(m.perplexity, frozen["perplexity"].get<double>()), 1e-9) << m.perplexity;
  EXPECT_LT(relative(task.sliding_perplexity().perplexity, frozen["sliding_window_perplexity"].get<double>()), 1e-9);

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
}

// The searched recipe, run without searching, builds the same layers and scores run 1's PTQ
// perplexity (same float checkpoint, calibration and widths).
void check_searched_rerun(const std::string& dir, const nlohmann::json& r, const std::string& again_dir) {
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
  ASSERT_TRUE(r2["metrics"].contains("frozen")) << r2["metrics"].dump();
  EXPECT_LT(relative(r2["metrics"]["frozen"]["perplexity"].get<double>(), r["metrics"]["ptq"]["perplexity"].get<double>()),
            1e-9);
}

}  // namespace

TEST(QtrainLlama, MixedSearchQatAndNumericSuiteRunAndBothCheckpointsLoadBackToTheReport) {
  const std::string dir = out_dir("llama_mixed");
  const QtrainRun run = qtrain("--recipe recipes/llama_mixed.yaml" + tiny_llama(dir));
  ASSERT_EQ(run.code, 0) << run.output;
  const nlohmann::json r = report(dir);
  check_stages(r);
  const std::set<std::string> linears = llama_linears(2);
  const std::map<std::string, nlohmann::json> chosen = check_search(r, linears);
  ASSERT_TRUE(fs::exists(dir + "/recipe.searched.yaml"));
  const int quantized = check_tables(r, chosen);
  EXPECT_GT(quantized, 0);
  check_checkpoints(dir, r, linears, quantized);
  const std::string again_dir = out_dir("llama_searched");
  check_searched_rerun(dir, r, again_dir);
  if (!HasFailure()) fs::remove_all(dir), fs::remove_all(again_dir);
}
