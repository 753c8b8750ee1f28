// quantize.kv_cache through qtrain's pipeline (docs/kv_cache.md): the calibrate stage sets the
// scheme and writes report.json's kv_cache entry; a group size the model's head_dim refuses
// fails the run before the float stage trains; search.context_length prices the cache; ptq.rotate_online
// reaches the rotation.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "framework/pipeline/pipeline.h"
#include "framework/recipe/recipe.h"
#include "tests/error_of.h"
#include "tests/paths.h"

namespace qforge {
namespace {

using qforge::testing::error_of;

namespace fs = std::filesystem;

// The tiny Llama recipe shrunk to one layer of 4 query / 2 key-value heads of 16 on a little data.
Recipe small_llama(const fs::path& dir, std::vector<std::string> more) {
  std::vector<std::string> set = {
      "model.checkpoint=" + (dir / "fp32.h5").string(), "model.config.hidden_size=64",
      "model.config.intermediate_size=96", "model.config.num_hidden_layers=1", "model.config.num_attention_heads=4",
      "model.config.max_position_embeddings=32", "data.seq_len=32", "data.batch_size=8",
      "data.max_train_examples=64", "data.max_eval_examples=16", "data.tokenizer.train.vocab_size=300",
      "train.epochs=1", "calibrate.batches=1"};
  set.insert(set.end(), more.begin(), more.end());
  return load_recipe(std::string(QFORGE_SOURCE_DIR) + "/recipes/llama_kv_cache.yaml", set);
}

TEST(KvCacheQuant, PipelineWritesTheSchemeToTheReportAndRefusesABadGroupBeforeTraining) {
  const fs::path dir = fs::temp_directory_path() / ("qforge_kvq_pipeline_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  PipelineOptions o;
  o.out_dir = (dir / "bad").string();
  // head_dim 16: groups of 6 do not divide it, refused by the calibrate stage's check.
  const std::string e = error_of([&] { run_pipeline(small_llama(dir, {"quantize.kv_cache.group_size=6"}), o); });
  EXPECT_NE(e.find("quantize.kv_cache"), std::string::npos) << e;
  EXPECT_NE(e.find("6"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "fp32.h5")) << "the float stage did not train";

  o.out_dir = (dir / "int4").string();
  const Recipe r = small_llama(dir, {"quantize.kv_cache.qtype=int4", "quantize.kv_cache.symmetric=false"});
  ASSERT_EQ(error_of([&] { run_pipeline(r, o); }), "");
  const nlohmann::json report = nlohmann::json::parse(std::ifstream(dir / "int4" / "report.json"));
  ASSERT_TRUE(report.contains("kv_cache")) << report.dump(2);
  const nlohmann::json& kv = report["kv_cache"];
  EXPECT_EQ(kv["scheme"], "qint4 asymmetric per token and head");
  EXPECT_EQ(kv["qtype"], "qint4");
  EXPECT_EQ(kv["symmetric"], false);
  EXPECT_EQ(kv["group_size"], 0);
  // 1 layer x K and V x 2 heads x (8 bytes of codes + a float32 scale + an int8 zero point); float32: 16 x 4.
  EXPECT_EQ(kv["bytes_per_token"], 1 * 2 * 2 * (8 + 4 + 1));
  EXPECT_EQ(kv["float_bytes_per_token"], 1 * 2 * 2 * 16 * 4);

  // scales: static_head: the activations' calibration pass (activations float here) measures the
  // keys and values; report.json names the scales and each layer's largest.
  o.out_dir = (dir / "static").string();
  ASSERT_EQ(error_of([&] { run_pipeline(small_llama(dir, {"quantize.kv_cache.scales=static_head"}), o); }), "");
  const nlohmann::json st = nlohmann::json::parse(std::ifstream(dir / "static" / "report.json"))["kv_cache"];
  EXPECT_EQ(st["scheme"], "qint8 symmetric static per head (calibrated)");
  EXPECT_EQ(st["scales"], "static_head");
  ASSERT_EQ(st["static_scales"].size(), 1u) << st.dump(2);
  EXPECT_GT(st["static_scales"][0]["key_scale_max"].get<double>(), 0.0);
  EXPECT_GT(st["static_scales"][0]["value_scale_max"].get<double>(), 0.0);

  // search.context_length: the size budget holds the weights and the int8 cache at 64 positions
  // (against the float model and a float32 cache), report.json's search.kv_cache says so.
  o.out_dir = (dir / "search").string();
  const Recipe s = small_llama(dir, {"quantize.weights.qtype=qint8", "search.candidates=[qint8, qint4]",
                                     "search.group_size=16", "search.budget.size_ratio=0.5", "search.context_length=64", "search.batches=1",
                                     "search.probes=4", "search.latency_cache=off"});
  ASSERT_EQ(error_of([&] { run_pipeline(s, o); }), "");
  const nlohmann::json searched = nlohmann::json::parse(std::ifstream(dir / "search" / "report.json"))["search"];
  ASSERT_TRUE(searched["kv_cache"].is_object()) << searched.dump(2);
  EXPECT_EQ(searched["kv_cache"]["context_length"], 64);
  EXPECT_EQ(searched["kv_cache"]["scheme"], "qint8 symmetric per token and head");
  EXPECT_EQ(searched["kv_cache"]["bytes"], 64 * 1 * 2 * 2 * (16 + 4));
  EXPECT_EQ(searched["kv_cache"]["float_bytes"], 64 * 1 * 2 * 2 * 16 * 4);
  const double whole = 0.5 * (searched["float_bytes"].get<double>() + 64 * 256);
  EXPECT_LE(searched["bytes"].get<double>() + 64 * 80, whole);
  EXPECT_DOUBLE_EQ(searched["budget_bytes"].get<double>(), whole - 64 * 80);

  // ptq.rotate_online.qk: false keeps the queries and keys unturned (down_proj's input still is).
  o.out_dir = (dir / "rotated").string();
  ASSERT_EQ(error_of([&] {
              run_pipeline(small_llama(dir, {"ptq.rotate=hadamard", "ptq.rotate_online.qk=false"}), o);
            }),
            "");
  const nlohmann::json rotated = nlohmann::json::parse(std::ifstream(dir / "rotated" / "report.json"))["ptq"]["rotate"];
  EXPECT_EQ(rotated["online_qk"], false) << rotated.dump(2);
  EXPECT_EQ(rotated["online_down_proj"], true) << rotated.dump(2);
  fs::remove_all(dir);
}

// export.onnx with a static int8 cache: the recipe check and the dry run accept it (the dry run
// checks the graph before the uncalibrated static scheme is set; the run calibrates it before export).
TEST(KvCacheQuant, DryRunOfAGpt2OnnxRecipeWithAStaticInt8CacheIsAccepted) {
  const fs::path dir = fs::temp_directory_path() / ("qforge_kvq_dry_" + std::to_string(::getpid()));
  const Recipe r = load_recipe(std::string(QFORGE_SOURCE_DIR) + "/recipes/gpt2_w4_weight_only.yaml",
                               {"quantize.weights.qtype=qint8", "quantize.weights.granularity=per_channel",
                                "quantize.kv_cache.qtype=int8",
                                "quantize.kv_cache.scales=static_head", "export.onnx=true"});
  PipelineOptions o;
  o.out_dir = (dir / "dry").string();
  o.dry_run = true;
  EXPECT_EQ(error_of([&] { run_pipeline(r, o); }), "");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace qforge
