// Recipe schema: every error path reports file, line, column, key and a hint, all at once;
// includes and --set overrides resolve in order; shipped recipes validate.
#include <gtest/gtest.h>

#include <chrono>

#include <filesystem>
#include <fstream>

#include "framework/recipe/recipe.h"
#include "framework/recipe/sha256.h"
#include "framework/recipe/task.h"
#include "tests/paths.h"

using namespace qforge;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("qforge_recipe_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::vector<RecipeIssue> issues_of(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    load_recipe(path, overrides);
  } catch (const RecipeError& e) {
    return e.issues();
  }
  return {};
}

const char* kMinimal = "model: {arch: mlp}\ndata: {dataset: fashion_mnist}\n";

}  // namespace

TEST(Sha256, MatchesFipsVectors) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string(1000, 'a')).substr(0, 16), "41edece42d63e8d9");
}

TEST(Recipe, ShippedRecipesValidate) {
  TempDir dir;
  for (const auto& entry : fs::directory_iterator(std::string(QFORGE_SOURCE_DIR) + "/recipes")) {
    const std::string path = entry.path().string(), name = entry.path().filename().string();
    try {
      const Recipe r = load_recipe(path);
      EXPECT_TRUE(r.quantize) << name;
      EXPECT_EQ(r.sha256.size(), 64u);
      // The resolved recipe holds every effective value (no version's defaults needed) and
      // resolves to itself.
      for (const char* key : {"seed:", "batch_size:", "eval_batch_size:", "warmup_steps:", "grad_clip:", "batches:",
                              "freeze_observers_after:", "calibration_dump:", "safetensors:", "backend:"})
        EXPECT_NE(r.resolved_yaml.find(key), std::string::npos) << name << " lacks " << key << "\n" << r.resolved_yaml;
      const Recipe again = load_recipe(dir.write(name, r.resolved_yaml));
      EXPECT_EQ(again.resolved_yaml, r.resolved_yaml) << name;
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": " << e.what();
    }
  }
  const Recipe bert = load_recipe(std::string(QFORGE_SOURCE_DIR) + "/recipes/bert_int8.yaml");
  EXPECT_EQ(bert.model.arch, "bert");
  EXPECT_EQ(bert.model.config["hidden_size"], 128);
  EXPECT_EQ(bert.scheme.activations, ActivationMode::kStatic);
  EXPECT_EQ(bert.scheme.observer, "histogram");
  ASSERT_EQ(bert.scheme.rules.size(), 1u);
  EXPECT_TRUE(bert.scheme.rules[0].keep_float);
  EXPECT_EQ(bert.qat.epochs, 1);
}

TEST(Recipe, UnknownKeyReportsFileLineColumnAndClosestKey) {
  TempDir dir;
  const std::string p = dir.write("r.yaml", std::string(kMinimal) + "quantize:\n  weights:\n    qtype: qint4\n    grup_size: 32\n");
  const auto issues = issues_of(p);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].file, p);
  EXPECT_EQ(issues[0].line, 6);
  EXPECT_EQ(issues[0].column, 5);
  EXPECT_EQ(issues[0].key, "quantize.weights.grup_size");
  EXPECT_NE(issues[0].message.find("did you mean 'group_size'"), std::string::npos) << issues[0].message;
}

TEST(Recipe, AllProblemsAreReportedAtOnce) {
  TempDir dir;
  const std::string p = dir.write("r.yaml",
                                  "model: {arch: bert, chekpoint: x}\n"
                                  "data: {dataset: langid, batch_size: 0}\n"
                                  "train: {epochs: many, lr: -1}\n"
                                  "quantize:\n  weights: {qtype: qint9}\n  activations: {mode: statik}\n");
  const auto issues = issues_of(p);
  ASSERT_EQ(issues.size(), 6u);
  std::string all;
  for (const auto& i : issues) all += i.to_string() + "\n";
  EXPECT_NE(all.find("model.chekpoint: unknown key (did you mean 'checkpoint'?)"), std::string::npos) << all;
  EXPECT_NE(all.find("data.batch_size: value 0 is out of range"), std::string::npos) << all;
  EXPECT_NE(all.find("train.epochs: 'many' is not an integer"), std::string::npos) << all;
  EXPECT_NE(all.find("train.lr: value -1 is out of range"), std::string::npos) << all;
  EXPECT_NE(all.find("'qint9' is not valid (did you mean 'qint8'?)"), std::string::npos) << all;
  EXPECT_NE(all.find("'statik' is not valid (did you mean 'static'?)"), std::string::npos) << all;
}

TEST(Recipe, ContradictionsAndMissingKeysAreErrors) {
  TempDir dir;
  auto first = [&](const std::string& text) {
    const auto issues = issues_of(dir.write("c.yaml", text));
    return issues.empty() ? std::string() : issues[0].to_string();
  };
  EXPECT_NE(first(std::string(kMinimal) + "quantize: {activations: {mode: static, qtype: qint4}}\n").find("no integer kernel"),
            std::string::npos);
  EXPECT_EQ(first(std::string(kMinimal) + "quantize: {activations: {mode: static, qtype: qint4}}\nfreeze: {enabled: false}\n"), "");
  EXPECT_NE(first("model: {arch: bert}\ndata: {dataset: fashion_mnist}\n").find("is trained on 'langid'"), std::string::npos);
  EXPECT_NE(first("data: {dataset: fashion_mnist}\n").find("model.arch: is required"), std::string::npos);
  EXPECT_NE(first(std::string(kMinimal) + "qat: {epochs: 1}\n").find("QAT needs a quantize section"), std::string::npos);
  EXPECT_NE(first(std::string(kMinimal) + "quantize: {weights: {granularity: per_group}}\n").find("group_size > 0"),
            std::string::npos);
  EXPECT_NE(first(std::string(kMinimal) + "quantize: {rules: [{keep_float: true}]}\n").find("needs a pattern"),
            std::string::npos);
  const std::string syntax = first("model: {arch: mlp\n");
  EXPECT_NE(syntax.find("YAML syntax error"), std::string::npos) << syntax;
}

TEST(Recipe, IncludesMergeInOrderAndTheIncludingFileWins) {
  TempDir dir;
  dir.write("configs/a.yaml", "seed: 1\ntrain: {epochs: 5, lr: 0.5}\n");
  dir.write("configs/b.yaml", "seed: 2\ntrain: {lr: 0.25}\n");
  const std::string p = dir.write("r.yaml", "include: [configs/a.yaml, configs/b.yaml]\n" + std::string(kMinimal) +
                                                "train: {weight_decay: 0.5}\n");
  const Recipe r = load_recipe(p);
  EXPECT_EQ(r.seed, 2u);
  EXPECT_EQ(r.train.epochs, 5);
  EXPECT_DOUBLE_EQ(r.train.lr, 0.25);
  EXPECT_DOUBLE_EQ(r.train.weight_decay, 0.5);
  EXPECT_EQ(r.resolved_yaml.find("include"), std::string::npos);

  dir.write("loop1.yaml", "include: [loop2.yaml]\n");
  dir.write("loop2.yaml", "include: [loop1.yaml]\n");
  const auto issues = issues_of(dir.write("top.yaml", "include: [loop1.yaml]\n" + std::string(kMinimal)));
  ASSERT_FALSE(issues.empty());
  EXPECT_NE(issues[0].message.find("include cycle"), std::string::npos);
  const auto missing = issues_of(dir.write("m.yaml", "include: [nope.yaml]\n" + std::string(kMinimal)));
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_NE(missing[0].message.find("not found"), std::string::npos);
  // Found by fuzzing: a directory (or a device) named in include must not reach the YAML parser.
  const auto directory = issues_of(dir.write("d.yaml", "include: [configs]\n" + std::string(kMinimal)));
  ASSERT_EQ(directory.size(), 1u);
  EXPECT_NE(directory[0].message.find("not a regular file"), std::string::npos);
  const auto device = issues_of(dir.write("z.yaml", "include: [/dev/zero]\n" + std::string(kMinimal)));
  ASSERT_EQ(device.size(), 1u);
}

TEST(Recipe, SetOverridesApplyAndAreValidated) {
  TempDir dir;
  const std::string p = dir.write("r.yaml", kMinimal);
  const Recipe r = load_recipe(p, {"train.epochs=7", "quantize.weights.qtype=qint4", "quantize.weights.group_size=16"});
  EXPECT_EQ(r.train.epochs, 7);
  ASSERT_TRUE(r.scheme.weights.has_value());
  EXPECT_EQ(*r.scheme.weights, qint4);
  EXPECT_EQ(r.scheme.group_size, 16);
  const auto bad = issues_of(p, {"train.epoch=3", "data.batch_size=-2", "nonsense"});
  ASSERT_EQ(bad.size(), 3u);
  EXPECT_EQ(bad[0].file, "--set");
  EXPECT_NE(bad[0].message.find("did you mean 'epochs'"), std::string::npos) << bad[0].message;
  EXPECT_NE(bad[1].message.find("out of range"), std::string::npos);
  EXPECT_NE(bad[2].message.find("key.path=value"), std::string::npos);
}

TEST(Recipe, ResolvedRecipeMatchesTheGoldenFileAndItsHash) {
  const std::string dir = std::string(QFORGE_SOURCE_DIR) + "/tests/recipe";
  const Recipe r = load_recipe(std::string(QFORGE_SOURCE_DIR) + "/recipes/bert_int8.yaml", {"train.epochs=1"});
  if (std::getenv("QFORGE_UPDATE_GOLDEN")) std::ofstream(dir + "/bert_int8.resolved.yaml") << r.resolved_yaml;
  std::ifstream in(dir + "/bert_int8.resolved.yaml");
  ASSERT_TRUE(in) << "golden file missing";
  const std::string golden((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(r.resolved_yaml, golden) << "after an intended change: QFORGE_UPDATE_GOLDEN=1 recipe_test";
  EXPECT_EQ(r.sha256, sha256_hex(golden));
}

TEST(Recipe, EveryDocumentedKeyIsInTheSchema) {
  const auto keys = recipe_keys();
  auto has = [&](const std::string& k) {
    return std::any_of(keys.begin(), keys.end(), [&](const auto& kv) { return kv.first == k; });
  };
  for (const char* k : {"model.arch", "data.dataset", "quantize.weights.group_size", "quantize.activations.method",
                        "quantize.rules[].pattern", "qat.freeze_bn_after", "export.calibration_dump", "search"})
    EXPECT_TRUE(has(k)) << k;
}

TEST(Recipe, EveryBoundKeyReachesTheRecipeAndAbsentKeysKeepTheirDefaults) {
  const std::string path = std::string(QFORGE_SOURCE_DIR) + "/recipes/fmnist_cnn_int8.yaml";
  const Recipe defaults = load_recipe(path);
  const Recipe r = load_recipe(path, {"seed=9", "model.checkpoint=x.h5", "model.safetensors=w.safetensors",
                                      "data.batch_size=7", "data.examples_per_language=3", "train.lr=0.5",
                                      "train.grad_clip=0", "calibrate.batches=5", "calibrate.samples=300", "qat.freeze_bn_after=3",
                                      "qat.lr=0.25", "freeze.enabled=false", "export.safetensors=true",
                                      "export.report=false"});
  EXPECT_EQ(r.seed, 9u);
  EXPECT_EQ(r.model.checkpoint, "x.h5");
  EXPECT_EQ(r.model.safetensors, "w.safetensors");
  EXPECT_EQ(r.data.batch_size, 7);
  EXPECT_EQ(r.data.examples_per_language, 3);
  EXPECT_EQ(r.train.lr, 0.5);
  EXPECT_EQ(r.train.grad_clip, 0.0);
  EXPECT_EQ(r.calibrate.batches, 5);
  EXPECT_EQ(r.calibrate.samples, 300);
  EXPECT_EQ(defaults.calibrate.samples, 0);
  EXPECT_EQ(r.qat.freeze_bn_after, 3);
  EXPECT_EQ(r.qat.lr, 0.25);
  EXPECT_FALSE(r.freeze.enabled);
  EXPECT_TRUE(r.export_.safetensors);
  EXPECT_FALSE(r.export_.report);
  // Untouched keys: the recipe's values, or recipe.h's defaults where the recipe is silent.
  EXPECT_EQ(r.data.eval_batch_size, defaults.data.eval_batch_size);
  EXPECT_EQ(r.qat.freeze_observers_after, defaults.qat.freeze_observers_after);
  const Recipe::Data data_defaults;
  EXPECT_EQ(data_defaults.seq_len, defaults.data.seq_len);  // the cnn recipe says nothing of seq_len
}

TEST(Recipe, PtqSectionIsValidatedWithFileLineColumn) {
  TempDir dir;
  const std::string q = std::string(kMinimal) + "quantize: {weights: {qtype: qint4, granularity: per_channel}}\n";
  auto all = [&](const std::string& text) {
    std::string out;
    for (const auto& i : issues_of(dir.write("p.yaml", text))) out += i.to_string() + "\n";
    return out;
  };
  std::string e = all(q + "ptq:\n  method: gtpq\n");
  EXPECT_NE(e.find("p.yaml:5:11: ptq.method: 'gtpq' is not valid (did you mean 'gptq'?)"), std::string::npos) << e;
  e = all(q + "ptq: {smoothquant: true, alpha: 1.5}\n");
  EXPECT_NE(e.find("ptq.alpha: value 1.5 is out of range"), std::string::npos) << e;
  e = all(q + "ptq: {smoothquant: true}\n");
  EXPECT_NE(e.find("ptq.smoothquant: SmoothQuant eases the quantization of input activations"), std::string::npos) << e;
  e = all(q + "ptq: {method: gptq, gptq: {damp: 0}}\n");
  EXPECT_NE(e.find("ptq.gptq.damp: value 0 is out of range"), std::string::npos) << e;
  e = all(std::string(kMinimal) + "ptq: {method: gptq}\n");
  EXPECT_NE(e.find("ptq: the PTQ solvers work on a quantized model"), std::string::npos) << e;
  e = all(q + "ptq:\n  rules:\n    - {pattern: fc1}\n");
  EXPECT_NE(e.find("ptq.rules[0]: every rule needs a pattern and a method"), std::string::npos) << e;
  const Recipe r = load_recipe(dir.write("ok.yaml", q + "ptq:\n  method: adaround\n  rules:\n    - {pattern: fc3, method: rtn}\n"));
  EXPECT_TRUE(r.ptq.enabled);
  EXPECT_EQ(r.ptq.method, "adaround");
  ASSERT_EQ(r.ptq.rule_sites.size(), 1u);
  EXPECT_EQ(r.ptq.rule_sites[0].line, 7);
}

TEST(Recipe, PtqRotateIsAChoiceForLlamaModelsOnly) {
  TempDir dir;
  const std::string q = "quantize: {weights: {qtype: qint4, granularity: per_channel}}\n";
  const std::string llama = "model: {arch: llama}\ndata: {dataset: fortunes}\n" + q;
  auto all = [&](const std::string& text) {
    std::string out;
    for (const auto& i : issues_of(dir.write("p.yaml", text))) out += i.to_string() + "\n";
    return out;
  };
  std::string e = all(llama + "ptq:\n  rotate: hadamrd\n");
  EXPECT_NE(e.find("p.yaml:5:11: ptq.rotate: 'hadamrd' is not valid (did you mean 'hadamard'?)"), std::string::npos) << e;
  e = all(std::string(kMinimal) + q + "ptq: {rotate: hadamard}\n");
  EXPECT_NE(e.find("ptq.rotate: the Hadamard rotation needs an RMSNorm model (arch llama"), std::string::npos) << e;
  const Recipe r = load_recipe(std::string(QFORGE_SOURCE_DIR) + "/recipes/llama_w4_gptq.yaml", {"ptq.rotate=hadamard"});
  EXPECT_EQ(r.ptq.rotate, "hadamard");
  EXPECT_EQ(Recipe::Ptq().rotate, "none");
  // What would act on the unrotated model, or ignore the online transform, is refused up front.
  e = all(llama + "ptq: {rotate: hadamard, method: awq}\n");
  EXPECT_NE(e.find("p.yaml:4:33: ptq.method: AWQ's per-channel scales would cross down_proj's online Hadamard"),
            std::string::npos)
      << e;
  e = all(llama + "ptq: {rotate: hadamard}\nexport: {safetensors: true}\n");
  EXPECT_NE(e.find("p.yaml:5:23: export.safetensors: a rotated model's safetensors need qforge's online"),
            std::string::npos)
      << e;
  e = all(llama + "ptq: {rotate: hadamard}\nsearch: {candidates: [qint4, qint8], budget: {size_ratio: 0.5}}\n");
  EXPECT_NE(e.find("ptq.rotate: the search stage runs before calibrate rotates the model"), std::string::npos) << e;
  EXPECT_EQ(all(llama + "ptq: {rotate: hadamard, method: gptq}\n"), "");
  // The online transforms are switched one by one, and only beside the rotation.
  const Recipe qk_off = load_recipe(dir.write("o.yaml", llama + "ptq: {rotate: hadamard, rotate_online: {qk: false}}\n"));
  EXPECT_FALSE(qk_off.ptq.rotate_qk);
  EXPECT_TRUE(qk_off.ptq.rotate_down_proj);
  EXPECT_TRUE(Recipe::Ptq().rotate_qk && Recipe::Ptq().rotate_down_proj);
  // Without online transforms the rotated weights are a plain model: safetensors may be written.
  EXPECT_EQ(all(llama + "ptq: {rotate: hadamard, rotate_online: {down_proj: false, qk: false}}\n"
                        "export: {safetensors: true}\n"),
            "");
  e = all(llama + "ptq: {rotate: hadamard, rotate_online: {down_proj: false}}\nexport: {safetensors: true}\n");
  EXPECT_NE(e.find("online Hadamard transforms (queries and keys after RoPE)"), std::string::npos) << e;
  e = all(llama + "ptq: {method: gptq, rotate_online: {down_proj: false}}\n");
  EXPECT_NE(e.find("p.yaml:4:48: ptq.rotate_online.down_proj: has no effect without ptq.rotate: hadamard"),
            std::string::npos)
      << e;
  // spinquant: the Hadamard rotation, then learned; its options only beside it, with a dynamic or float cache.
  const Recipe spin = load_recipe(dir.write("s.yaml", llama + "ptq: {rotate: spinquant, rotate_seed: 3, method: gptq, "
                                                             "spinquant: {steps: 20, lr: 20, weights: quantized, objective: kl}}\n"));
  EXPECT_TRUE(spin.ptq.rotates());
  EXPECT_EQ(spin.ptq.rotate_seed, 3);
  EXPECT_EQ(spin.ptq.spinquant_steps, 20);
  EXPECT_EQ(spin.ptq.spinquant_lr, 20.0);
  EXPECT_EQ(spin.ptq.spinquant_weights, "quantized");
  EXPECT_EQ(spin.ptq.spinquant_objective, "kl");
  EXPECT_EQ(Recipe::Ptq().spinquant_objective, "cross_entropy");
  EXPECT_EQ(Recipe::Ptq().spinquant_steps, 100);
  EXPECT_EQ(Recipe::Ptq().spinquant_lr, 1.5);
  e = all(llama + "ptq: {rotate: hadamard, spinquant: {steps: 20}}\n");
  EXPECT_NE(e.find("ptq.spinquant: SpinQuant options without ptq.rotate: spinquant"), std::string::npos) << e;
  e = all(llama + "ptq: {method: gptq, rotate_seed: 2}\n");
  EXPECT_NE(e.find("ptq.rotate_seed: has no effect without ptq.rotate"), std::string::npos) << e;
  e = all(llama + "ptq: {rotate: spinquant, spinquant: {weights: half}}\n");
  EXPECT_NE(e.find("ptq.spinquant.weights: 'half' is not valid"), std::string::npos) << e;
  e = all("model: {arch: llama}\ndata: {dataset: fortunes}\nquantize: {weights: {qtype: qint4, granularity: "
          "per_channel}, kv_cache: {qtype: int8, scales: static_head}}\nptq: {rotate: spinquant}\n");
  EXPECT_NE(e.find("ptq.rotate: spinquant learns with a dynamic KV cache or a float one"), std::string::npos) << e;
  e = all(llama + "ptq: {rotate: spinquant, method: gptq, spinquant: {weights: float}}\n");
  EXPECT_NE(e.find("ptq.spinquant.weights: with float weights, no dynamic activations and a float KV cache nothing"),
            std::string::npos)
      << e;
  e = all(std::string(kMinimal) + q + "ptq: {rotate: spinquant}\n");
  EXPECT_NE(e.find("ptq.rotate: the Hadamard rotation needs an RMSNorm model"), std::string::npos) << e;
}

TEST(Recipe, AwqMethodsSetAwqBeforeTheirRoundingAndStrayAwqOptionsAreErrors) {
  TempDir dir;
  const std::string q = std::string(kMinimal) + "quantize: {weights: {qtype: qint4, granularity: per_channel}}\n";
  const Recipe r = load_recipe(dir.write(
      "a.yaml", q + "ptq:\n  method: awq\n  awq: {grid: 10, clip: false, scales: duo, objective: layer}\n"));
  EXPECT_TRUE(r.ptq.awq);
  EXPECT_EQ(r.ptq.method, "rtn");
  EXPECT_EQ(r.ptq.awq_grid, 10);
  EXPECT_FALSE(r.ptq.awq_clip);
  EXPECT_EQ(r.ptq.awq_scales, "duo");
  EXPECT_EQ(r.ptq.awq_objective, "layer");
  const Recipe r2 = load_recipe(dir.write("b.yaml", q + "ptq: {method: awq+gptq}\n"));
  EXPECT_TRUE(r2.ptq.awq);
  EXPECT_EQ(r2.ptq.method, "gptq");
  EXPECT_EQ(r2.ptq.awq_grid, 20);
  EXPECT_EQ(r2.ptq.awq_scales, "both");
  EXPECT_EQ(r2.ptq.awq_objective, "block");
  std::string e;
  for (const auto& i : issues_of(dir.write("c.yaml", q + "ptq:\n  method: gptq\n  awq: {grid: 10}\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("c.yaml:6:"), std::string::npos) << e;
  EXPECT_NE(e.find("ptq.awq: AWQ options without AWQ"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("d.yaml", q + "ptq:\n  method: awq\n  awq: {grid: 0}\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("ptq.awq.grid: value 0 is out of range"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("d2.yaml", q + "ptq:\n  method: awq\n  awq: {scales: dou}\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("ptq.awq.scales"), std::string::npos) << e;
  EXPECT_NE(e.find("duo"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("d3.yaml", q + "ptq:\n  method: gptq\n  awq: {objective: layer}\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("ptq.awq: AWQ options without AWQ"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("e.yaml", q + "ptq:\n  method: awq+gtpq\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("e.yaml:5:11: ptq.method: 'awq+gtpq' is not valid (did you mean 'awq+gptq'?)"), std::string::npos) << e;
}

TEST(Recipe, AutoRoundMethodAndOptionsAndTheirErrorsAtFileLineColumn) {
  TempDir dir;
  const std::string q = std::string(kMinimal) + "quantize: {weights: {qtype: qint4, granularity: per_channel}}\n";
  const std::string llama = "model: {arch: llama}\ndata: {dataset: fortunes}\n"
                            "quantize: {weights: {qtype: qint3, granularity: per_group, group_size: 32}}\n";
  const Recipe r = load_recipe(dir.write("a.yaml", llama + "ptq:\n  method: autoround\n  autoround: {iterations: 50, lr: 0.01, batch_size: 4}\n"));
  EXPECT_EQ(r.ptq.method, "autoround");
  EXPECT_EQ(r.ptq.autoround_iterations, 50);
  EXPECT_DOUBLE_EQ(r.ptq.autoround_lr, 0.01);
  EXPECT_EQ(r.ptq.autoround_batch_size, 4);
  EXPECT_EQ(Recipe::Ptq().autoround_iterations, 200);
  std::string e;
  for (const auto& i : issues_of(dir.write("b.yaml", llama + "ptq:\n  method: gptq\n  autoround: {iterations: 10}\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("b.yaml:6:"), std::string::npos) << e;
  EXPECT_NE(e.find("ptq.autoround: AutoRound options without AutoRound"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("c.yaml", llama + "ptq:\n  method: autoround\n  autoround: {iterations: 0}\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("c.yaml:6:27: ptq.autoround.iterations: value 0 is out of range"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("d.yaml", q + "ptq:\n  method: autoround\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("d.yaml:5:11: ptq.method: AutoRound reconstructs transformer blocks"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("e.yaml", llama + "ptq:\n  method: autorund\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("e.yaml:5:11: ptq.method: 'autorund' is not valid (did you mean 'autoround'?)"), std::string::npos) << e;
}

TEST(Recipe, BrecqMethodAndOptionsAndTheirErrorsAtFileLineColumn) {
  TempDir dir;
  const std::string q = std::string(kMinimal) + "quantize: {weights: {qtype: qint4, granularity: per_channel}}\n";
  const std::string llama = "model: {arch: llama}\ndata: {dataset: fortunes}\n"
                            "quantize: {weights: {qtype: qint3, granularity: per_group, group_size: 32}}\n";
  const Recipe r = load_recipe(dir.write(
      "a.yaml", llama + "ptq:\n  method: brecq\n  brecq: {iterations: 50, lr: 0.001, reg_weight: 0.1, batch_size: 4, fisher: false}\n"));
  EXPECT_EQ(r.ptq.method, "brecq");
  EXPECT_EQ(r.ptq.brecq_iterations, 50);
  EXPECT_DOUBLE_EQ(r.ptq.brecq_lr, 0.001);
  EXPECT_DOUBLE_EQ(r.ptq.brecq_reg_weight, 0.1);
  EXPECT_EQ(r.ptq.brecq_batch_size, 4);
  EXPECT_FALSE(r.ptq.brecq_fisher);
  EXPECT_EQ(Recipe::Ptq().brecq_iterations, 500);
  EXPECT_TRUE(Recipe::Ptq().brecq_fisher);
  std::string e;
  for (const auto& i : issues_of(dir.write("b.yaml", llama + "ptq:\n  method: autoround\n  brecq: {fisher: false}\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("b.yaml:6:"), std::string::npos) << e;
  EXPECT_NE(e.find("ptq.brecq: BRECQ options without BRECQ"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("c.yaml", llama + "ptq:\n  method: brecq\n  brecq: {batch_size: 0}\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("c.yaml:6:23: ptq.brecq.batch_size: value 0 is out of range"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("d.yaml", q + "ptq:\n  method: brecq\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("d.yaml:5:11: ptq.method: BRECQ reconstructs transformer blocks"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("e.yaml", llama + "ptq:\n  method: brecg\n"))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("e.yaml:5:11: ptq.method: 'brecg' is not valid (did you mean 'brecq'?)"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("f.yaml", llama + "ptq:\n  method: brecq\n  brecq: {iteration: 5}\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("f.yaml:6:11: ptq.brecq.iteration: unknown key (did you mean 'iterations'?)"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("g.yaml", llama + "ptq:\n  method: brecq\n  brecc: {iterations: 5}\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("g.yaml:6:3: ptq.brecc: unknown key (did you mean 'brecq'?)"), std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("h.yaml", llama + "ptq:\n  method: rtn\n  rules:\n    - {pattern: \"*.mlp.*\", method: brecq}\n")))
    e += i.to_string() + "\n";
  EXPECT_EQ(e, "") << "a rule's brecq is a BRECQ recipe";
}

TEST(Recipe, FreezeDecodeActivationsIsAChoiceRefusedWithTheClosestAtFileLine) {
  TempDir dir;
  const std::string q = std::string(kMinimal) + "quantize: {weights: {qtype: qint4, granularity: per_channel}}\n";
  const Recipe r = load_recipe(dir.write("d.yaml", q + "freeze:\n  decode_activations: q8_block32\n"));
  EXPECT_EQ(r.freeze.decode_activations, "q8_block32");
  EXPECT_EQ(load_recipe(dir.write("e.yaml", q)).freeze.decode_activations, "exact");
  std::string e;
  for (const auto& i : issues_of(dir.write("f.yaml", q + "freeze:\n  decode_activations: q8_blok32\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("f.yaml:5:23: freeze.decode_activations: 'q8_blok32' is not valid (did you mean 'q8_block32'?)"),
            std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("g.yaml", q + "freeze:\n  decode_activation: q8_block32\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("g.yaml:5:3: freeze.decode_activation: unknown key (did you mean 'decode_activations'?)"),
            std::string::npos) << e;
}

TEST(Recipe, FreezeDecodeActivationsIsRefusedWhereNoLayerWouldTakeIt) {
  TempDir dir;
  const std::string q = std::string(kMinimal) + "quantize: {weights: {qtype: qint4, granularity: per_channel}}\n";
  std::string e;
  for (const auto& i : issues_of(dir.write("h.yaml", q + "freeze:\n  decode_activations: q8_block32\n  enabled: false\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("h.yaml:5:23: freeze.decode_activations: q8_block32 is applied when freezing, and freeze.enabled is "
                   "false"),
            std::string::npos) << e;
  e.clear();
  const std::string a = std::string(kMinimal) +
                        "quantize: {weights: {qtype: qint8}, activations: {mode: dynamic_per_token}}\n";
  for (const auto& i : issues_of(dir.write("i.yaml", a + "freeze:\n  decode_activations: q8_block32\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("i.yaml:5:23: freeze.decode_activations: q8_block32 applies to weight-only Linear layers, and "
                   "quantize.activations.mode is dynamic_per_token"),
            std::string::npos) << e;
  // A rule keeping some layers' activations float leaves them weight-only: accepted.
  const std::string rule = std::string(kMinimal) +
                           "quantize: {weights: {qtype: qint8}, activations: {mode: dynamic_per_token}, "
                           "rules: [{pattern: 'lm_head', activations: none}]}\n";
  EXPECT_EQ(load_recipe(dir.write("j.yaml", rule + "freeze:\n  decode_activations: q8_block32\n")).freeze.decode_activations,
            "q8_block32");
}

// W4A4: dynamic per-token int4 rows are accepted for fake-quant evaluation and for freezing (the
// int8 kernels take their codes); static int4 activations (no kernel) and unsigned dynamic rows
// are errors at the qtype's line.
TEST(Recipe, DynamicInt4ActivationsFreezeStaticInt4AndUnsignedGridsAreRefused) {
  TempDir dir;
  const std::string a = std::string(kMinimal) + "quantize:\n  weights: {qtype: qint4}\n  activations:\n"
                        "    mode: dynamic_per_token\n";
  const Recipe r = load_recipe(dir.write("a.yaml", a + "    qtype: qint4\nfreeze: {enabled: false}\n"));
  EXPECT_EQ(r.scheme.activation_qtype, qint4);
  EXPECT_TRUE(load_recipe(dir.write("b.yaml", a + "    qtype: qint4\nfreeze: {enabled: true}\n")).freeze.enabled);
  std::string e;
  const std::string st = std::string(kMinimal) + "quantize:\n  weights: {qtype: qint4}\n  activations:\n"
                         "    mode: static\n    qtype: qint4\nfreeze: {enabled: true}\n";
  for (const auto& i : issues_of(dir.write("s.yaml", st))) e += i.to_string() + "\n";
  EXPECT_NE(e.find("quantize.activations.qtype: qint4 static activations have no integer kernel to freeze into"),
            std::string::npos) << e;
  e.clear();
  for (const auto& i : issues_of(dir.write("c.yaml", a + "    qtype: quint8\nfreeze: {enabled: false}\n")))
    e += i.to_string() + "\n";
  EXPECT_NE(e.find("quantize.activations.qtype: dynamic per-token activations are symmetric signed integers"),
            std::string::npos) << e;
}

TEST(Recipe, BadSearchSectionsAreErrorsWithFileLineColumn) {
  TempDir dir;
  const std::string q = std::string(kMinimal) + "quantize: {weights: {qtype: qint8}}\n";
  auto all = [&](const std::string& text) {
    std::string out;
    for (const auto& i : issues_of(dir.write("s.yaml", text))) out += i.to_string() + "\n";
    return out;
  };
  // Unknown method, with the closest valid one, at the line and column of the value.
  std::string e = all(q + "search:\n  method: hesian\n  candidates: [qint8, qint4]\n  budget: {size_mb: 1}\n");
  EXPECT_NE(e.find("s.yaml:5:11: search.method: 'hesian' is not valid (did you mean 'hessian'?)"), std::string::npos) << e;
  // Negative budget: out of range.
  e = all(q + "search:\n  candidates: [qint8, qint4]\n  budget: {size_mb: -2}\n");
  EXPECT_NE(e.find("search.budget.size_mb: value -2 is out of range"), std::string::npos) << e;
  // Two size budgets at once, and no budget.
  e = all(q + "search:\n  candidates: [qint8, qint4]\n  budget: {size_mb: 1, size_ratio: 0.5}\n");
  EXPECT_NE(e.find("search.budget: give size_mb or size_ratio, not both"), std::string::npos) << e;
  e = all(q + "search:\n  candidates: [qint8, qint4]\n  budget: {}\n");
  EXPECT_NE(e.find("give one or more of size_mb, size_ratio, avg_bits, latency_ms"), std::string::npos) << e;
  e = all(q + "search:\n  candidates: [qint8, qint4]\n  budget: {latency_ms: 0}\n");
  EXPECT_NE(e.find("search.budget.latency_ms: value 0 is out of range"), std::string::npos) << e;
  // Activation choices: histogram method, static activations, the scheme's grid or float.
  e = all(q + "search:\n  candidates: [qint8, qint4]\n  activations: [qint8, float]\n  budget: {size_mb: 1}\n");
  EXPECT_NE(e.find("search.activations: activation widths are searched by the histogram method only"), std::string::npos) << e;
  EXPECT_NE(e.find("need static activations in the scheme"), std::string::npos) << e;
  e = all(std::string(kMinimal) + "quantize: {weights: {qtype: qint8}, activations: {mode: static}}\n" +
          "search:\n  method: histogram\n  candidates: [qint8, qint4]\n  activations: [qint4, float]\n  budget: {size_mb: 1}\n");
  EXPECT_NE(e.find("search.activations[0]: 'qint4' is not the scheme's activation grid (qint8)"), std::string::npos) << e;
  e = all(std::string(kMinimal) + "quantize: {weights: {qtype: qint8}, activations: {mode: static, observer: minmax}}\n" +
          "search:\n  method: histogram\n  candidates: [qint8, qint4]\n  budget: {size_mb: 1}\n");
  EXPECT_NE(e.find("the histogram method reads histogram observers"), std::string::npos) << e;
  // A candidate that is no grid.
  e = all(q + "search:\n  candidates: [qint8, qint5]\n  budget: {avg_bits: 4}\n");
  EXPECT_NE(e.find("search.candidates[1]: 'qint5' is not valid"), std::string::npos) << e;
  // One candidate leaves nothing to choose; a search without a quantize section has no weights.
  e = all(q + "search:\n  candidates: [qint8]\n  budget: {avg_bits: 4}\n");
  EXPECT_NE(e.find("search.candidates: needs at least two candidates"), std::string::npos) << e;
  e = all(std::string(kMinimal) + "search:\n  candidates: [qint8, float]\n  budget: {avg_bits: 4}\n");
  EXPECT_NE(e.find("add one"), std::string::npos) << e;
  // A valid section loads, with its constraints and ties.
  const Recipe r = load_recipe(dir.write("ok.yaml", q + "search:\n  method: loss\n  candidates: [qint8, qint4, float]\n"
                                                        "  budget: {size_ratio: 0.3}\n  min_bits: [{pattern: fc1, bits: 8}]\n"
                                                        "  ties: [[fc2, fc3]]\n"));
  EXPECT_TRUE(r.search.enabled);
  EXPECT_EQ(r.search.method, "loss");
  EXPECT_EQ(r.search.candidates, (std::vector<std::string>{"qint8", "qint4", "float"}));
  EXPECT_EQ(r.search.size_ratio, 0.3);
  ASSERT_EQ(r.search.min_bits.size(), 1u);
  EXPECT_EQ(r.search.min_bits[0].second, 8);
  ASSERT_EQ(r.search.ties.size(), 1u);
  EXPECT_EQ(r.search.ties[0], (std::vector<std::string>{"fc2", "fc3"}));
  // Several budgets hold at once; each candidate's place is kept for errors found later.
  const Recipe r2 = load_recipe(dir.write("two.yaml", q + "search:\n  candidates: [qint8, qint4]\n"
                                                          "  budget: {size_mb: 1.5, latency_ms: 2, avg_bits: 6}\n"));
  EXPECT_EQ(r2.search.size_mb, 1.5);
  EXPECT_EQ(r2.search.latency_ms, 2);
  EXPECT_EQ(r2.search.avg_bits, 6);
  ASSERT_EQ(r2.search.candidate_sites.size(), 2u);
  EXPECT_EQ(r2.search.candidate_sites[1].key, "search.candidates[1]");
  EXPECT_EQ(r2.search.candidate_sites[1].line, 5);
  EXPECT_EQ(r2.search.candidate_sites[1].column, 23);
}

// search.context_length prices a causal LM's KV cache into the size budget: refused for a model
// without a cache and without a size budget, at its line (kv_cache_quant_pipeline_test runs it).
TEST(Recipe, SearchContextLengthPricesTheKvCacheOfACausalLm) {
  TempDir dir;
  const std::string q = "quantize: {weights: {qtype: qint8}, kv_cache: {qtype: int4}}\n";
  const std::string llama = "model: {arch: llama}\ndata: {dataset: fortunes}\n" + q;
  auto all = [&](const std::string& text) {
    std::string out;
    for (const auto& i : issues_of(dir.write("c.yaml", text))) out += i.to_string() + "\n";
    return out;
  };
  std::string e = all(std::string(kMinimal) + "quantize: {weights: {qtype: qint8}}\n"
                      "search:\n  candidates: [qint8, qint4]\n  budget: {size_mb: 1}\n  context_length: 4096\n");
  EXPECT_NE(e.find("c.yaml:7:19: search.context_length: prices a KV cache, which the causal LMs keep (arch gpt2 or "
                   "llama), not mlp"),
            std::string::npos)
      << e;
  e = all(llama + "search:\n  candidates: [qint8, qint4]\n  budget: {avg_bits: 6}\n  context_length: 4096\n");
  EXPECT_NE(e.find("c.yaml:7:19: search.context_length: prices the KV cache into search.budget.size_mb or size_ratio"),
            std::string::npos)
      << e;
  e = all(llama + "search:\n  candidates: [qint8, qint4]\n  budget: {size_mb: 1}\n  context_length: -1\n");
  EXPECT_NE(e.find("search.context_length: value -1 is out of range"), std::string::npos) << e;
  const Recipe r = load_recipe(dir.write(
      "ok.yaml", llama + "search:\n  candidates: [qint8, qint4]\n  budget: {size_mb: 1}\n  context_length: 4096\n"));
  EXPECT_EQ(r.search.context_length, 4096);
  EXPECT_EQ(Recipe::Search().context_length, 0);
}

TEST(Recipe, ProblemsCausedByASetAreBlamedOnTheArgument) {
  TempDir dir;
  const std::string path = dir.write("w.yaml", std::string(kMinimal) + "quantize: {weights: {qtype: qint8}}\n");
  const auto issues = issues_of(path, {"quantize.weights.granularity=per_group"});
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].file, "--set quantize.weights.granularity=per_group");
  EXPECT_EQ(issues[0].key, "quantize.weights.granularity");
  EXPECT_NE(issues[0].message.find("needs quantize.weights.group_size > 0"), std::string::npos) << issues[0].message;
  // Written in the file, the group size is blamed at its line.
  const std::string file = dir.write("g.yaml", std::string(kMinimal) +
                                                   "quantize:\n  weights: {qtype: qint4, granularity: per_group, group_size: 0}\n");
  const auto in_file = issues_of(file);
  ASSERT_FALSE(in_file.empty());
  EXPECT_EQ(in_file[0].file, file);
  EXPECT_GT(in_file[0].line, 0);
}

TEST(Recipe, DuplicateKeysZeroRatesAndUntrainableModelsAreRejectedUpFront) {
  TempDir dir;
  auto all = [&](const std::string& text) {
    std::string out;
    for (const auto& i : issues_of(dir.write("r.yaml", text))) out += i.to_string() + "\n";
    return out;
  };
  // A duplicate key: yaml-cpp keeps the first, PyYAML the last; neither is taken.
  std::string e = all(std::string(kMinimal) + "train: {epochs: 2}\ntrain: {epochs: 3}\n");
  EXPECT_NE(e.find("r.yaml:4:1: train: duplicate key (first at line 3)"), std::string::npos) << e;
  e = all(std::string(kMinimal) + "train:\n  lr: 0.1\n  lr: 0.2\n");
  EXPECT_NE(e.find("train.lr: duplicate key (first at line 4)"), std::string::npos) << e;
  // Zero learning rates, percentile and averaging constant.
  e = all(std::string(kMinimal) + "train: {lr: 0}\nqat: {lr: 0}\n");
  EXPECT_NE(e.find("train.lr: value 0 is out of range"), std::string::npos) << e;
  EXPECT_NE(e.find("qat.lr: value 0 is out of range"), std::string::npos) << e;
  e = all(std::string(kMinimal) + "quantize: {activations: {mode: static, percentile: 0, averaging_constant: 0}}\n");
  EXPECT_NE(e.find("quantize.activations.percentile: value 0 is out of range"), std::string::npos) << e;
  EXPECT_NE(e.find("quantize.activations.averaging_constant: value 0 is out of range"), std::string::npos) << e;
  // No epochs and nothing to load: the float model would be untrained.
  e = all("model: {arch: mlp, checkpoint: /nonexistent/qforge_absent.h5}\ndata: {dataset: fashion_mnist}\n"
          "train: {epochs: 0}\n");
  EXPECT_NE(e.find("train.epochs: 0 epochs and no float weights to load"), std::string::npos) << e;
}

TEST(Recipe, HostileRecipesAreRefusedInMilliseconds) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  // "Billion laughs": nine levels of ten aliases each, under a free-form key.
  std::string bomb = std::string(kMinimal) + "model_bomb:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    bomb += "  a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) bomb += std::string(k ? ", " : "") + "*a" + std::to_string(i - 1);
    bomb += "]\n";
  }
  std::vector<RecipeIssue> issues = issues_of(dir.write("bomb.yaml", bomb));
  ASSERT_FALSE(issues.empty());
  EXPECT_NE(issues[0].message.find("YAML nodes once aliases are expanded"), std::string::npos) << issues[0].message;
  // Includes that fan out, 24 levels of two: each file is resolved once, and the depth is capped.
  for (int d = 0; d < 24; ++d) {
    const std::string next = d == 23 ? "" : "include: [l" + std::to_string(d + 1) + ".yaml, l" + std::to_string(d + 1) + ".yaml]\n";
    dir.write("l" + std::to_string(d) + ".yaml", next + "seed: " + std::to_string(d) + "\n");
  }
  issues = issues_of(dir.write("fan.yaml", std::string(kMinimal) + "include: [l0.yaml, l0.yaml]\n"));
  ASSERT_FALSE(issues.empty());
  bool capped = false;
  for (const auto& i : issues) capped |= i.message.find("includes nest deeper than 16") != std::string::npos;
  EXPECT_TRUE(capped);
  // A file far larger than any recipe.
  issues = issues_of(dir.write("big.yaml", std::string(kMinimal) + "# " + std::string(2 << 20, 'x') + "\n"));
  ASSERT_FALSE(issues.empty());
  EXPECT_NE(issues[0].message.find("recipes are at most 1048576 bytes"), std::string::npos) << issues[0].message;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

// Issue 39 item 24 (recipe_fuzz, 2026-11-27): a merge key inside its own anchor loads in yaml-cpp
// as a map containing itself, and the node count's walk recursed until the stack overflowed.
TEST(Recipe, Issue39Item24AnAliasInsideItsOwnAnchorIsRefusedNotWalkedForever) {
  TempDir dir;
  const std::string self_ref = std::string(kMinimal) + "train_defaults: &lr {lr: 0.001, <<: *lr, lsq: false}\n";
  std::vector<RecipeIssue> issues = issues_of(dir.write("self.yaml", self_ref));
  ASSERT_FALSE(issues.empty());
  EXPECT_NE(issues[0].message.find("nested deeper than 64 levels (an alias inside its own anchor?)"), std::string::npos)
      << issues[0].message;
  // The same value given on the command line.
  issues = issues_of(dir.write("ok.yaml", std::string(kMinimal)), {"model.config=&a [1, *a]"});
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].file, "--set");
  EXPECT_NE(issues[0].message.find("value nested deeper than 64 levels"), std::string::npos) << issues[0].message;
  // Deep but finite nesting below the bound is still a recipe's business (free-form config).
  std::string deep = "model_config_deep: ";
  for (int i = 0; i < 40; ++i) deep += "[";
  for (int i = 0; i < 40; ++i) deep += "]";
  issues = issues_of(dir.write("deep.yaml", std::string(kMinimal) + deep + "\n"));
  for (const auto& i : issues) EXPECT_EQ(i.message.find("nested deeper"), std::string::npos) << i.message;
}

TEST(Recipe, SetReachesFreeFormConfigKeysAndRefusesIncludes) {
  const std::string path = std::string(QFORGE_SOURCE_DIR) + "/recipes/bert_int8.yaml";
  const Recipe r = load_recipe(path, {"model.config.hidden_size=64"});
  EXPECT_EQ(r.model.config.at("hidden_size"), 64);
  const auto issues = issues_of(path, {"include=[x.yaml]"});
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].file, "--set include=[x.yaml]");
  EXPECT_NE(issues[0].message.find("include cannot be set from the command line"), std::string::npos);
}

TEST(Recipe, FreezingWithoutQuantizedWeightsIsRejectedUpFront) {
  TempDir dir;
  const std::string path = dir.write("n.yaml", std::string(kMinimal) +
                                                   "quantize: {weights: {qtype: none}, activations: {mode: static}}\n");
  const auto issues = issues_of(path);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].key, "quantize.weights.qtype");
  EXPECT_GT(issues[0].line, 0);
  EXPECT_NE(issues[0].message.find("freezing packs quantized weights"), std::string::npos) << issues[0].message;
  // Not freezing: activation-only fake-quant is fine.
  EXPECT_TRUE(issues_of(path, {"freeze.enabled=false"}).empty());
}

TEST(Recipe, ArchitecturesAndDatasetsAreTheTaskRegistrys) {
  TempDir dir;
  for (const TaskKind& k : task_kinds()) {
    std::string text = std::string("model: {arch: ") + k.arch + "}\ndata: {dataset: " + k.dataset + "}\n";
    // A TorchScript model also names its file and its data file.
    const std::string fx = std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/torchscript/";
    if (std::string(k.arch) == "torchscript")
      text = "model: {arch: torchscript, torchscript: " + fx + "cnn_bn_scripted.pt}\ndata: {dataset: tensors, file: " + fx +
             "cnn_bn_data.safetensors}\n";
    EXPECT_TRUE(issues_of(dir.write(std::string(k.arch) + ".yaml", text)).empty()) << k.arch;
  }
  const std::vector<RecipeIssue> typo = issues_of(dir.write("typo.yaml", "model: {arch: bret}\ndata: {dataset: langid}\n"));
  ASSERT_EQ(typo.size(), 1u);
  EXPECT_EQ(typo[0].message, "'bret' is not valid (did you mean 'bert'?); valid: mlp, cnn, bert, gpt2, llama, torchscript");
  const std::vector<RecipeIssue> missing = issues_of(dir.write("none.yaml", "train: {epochs: 1}\n"));
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing[0].message, "is required (mlp, cnn, bert, gpt2, llama or torchscript)");
  EXPECT_EQ(missing[1].message, "is required (fashion_mnist, langid, fortunes, tensors or images)");
  EXPECT_EQ(find_task_kind("gpt2")->dataset, std::string("fortunes"));
  EXPECT_EQ(find_task_kind("resnet"), nullptr);
}

TEST(Recipe, QuantizeSectionIsBoundAndItsEffectiveValuesAreResolved) {
  TempDir dir;
  const Recipe w4 = load_recipe(dir.write("w4.yaml", std::string(kMinimal) + "quantize: {weights: {qtype: qint4}}\n"));
  ASSERT_TRUE(w4.scheme.weights.has_value());
  EXPECT_EQ(w4.scheme.weights->name, std::string("qint4"));
  EXPECT_EQ(w4.scheme.weight_granularity, Granularity::kPerGroup);  // the grid's defaults, as Scheme(qint4)
  EXPECT_EQ(w4.scheme.group_size, 128);
  EXPECT_NE(w4.resolved_yaml.find("granularity: per_group"), std::string::npos) << w4.resolved_yaml;
  EXPECT_NE(w4.resolved_yaml.find("group_size: 128"), std::string::npos) << w4.resolved_yaml;
  EXPECT_NE(w4.resolved_yaml.find("observer: histogram"), std::string::npos) << w4.resolved_yaml;
  // group_size means something only per group: not written otherwise.
  const Recipe pc = load_recipe(
      dir.write("pc.yaml", std::string(kMinimal) + "quantize: {weights: {qtype: qint4, granularity: per_channel}}\n"));
  EXPECT_EQ(pc.scheme.weight_granularity, Granularity::kPerChannel);
  EXPECT_EQ(pc.resolved_yaml.find("group_size"), std::string::npos) << pc.resolved_yaml;
  const Recipe acts = load_recipe(dir.write(
      "a.yaml", std::string(kMinimal) + "quantize:\n  weights: {qtype: none}\n  activations: {mode: static, method: "
                                        "percentile, percentile: 99.9}\n  rules: [{pattern: 'fc*', weights: qint8, "
                                        "group_size: 32}]\nfreeze: {enabled: false}\n"));
  EXPECT_FALSE(acts.scheme.weights.has_value());
  EXPECT_EQ(acts.scheme.activations, ActivationMode::kStatic);
  EXPECT_EQ(acts.scheme.observer_options.method, HistogramMethod::kPercentile);
  EXPECT_DOUBLE_EQ(acts.scheme.observer_options.percentile, 99.9);
  ASSERT_EQ(acts.scheme.rules.size(), 1u);
  EXPECT_EQ(acts.scheme.rules[0].pattern, "fc*");
  EXPECT_EQ(acts.scheme.rules[0].group_size, std::optional<int64_t>(32));
  EXPECT_NE(acts.resolved_yaml.find("qtype: none"), std::string::npos) << acts.resolved_yaml;
  // The resolved recipe loads back to the same scheme and the same resolved text.
  const Recipe again = load_recipe(dir.write("again.yaml", acts.resolved_yaml));
  EXPECT_EQ(again.resolved_yaml, acts.resolved_yaml);
}

// An empty `weights:` / `activations:` resolves to the scheme's effective values, as a missing one
// does; the text (and so the recipe's SHA-256) is the one earlier releases wrote, plus the
// calibrate.imatrix key.
TEST(Recipe, EmptyQuantizeWeightsAndActivationsResolveToTheirEffectiveValues) {
  TempDir dir;
  const Recipe r = load_recipe(dir.write("null_parts.yaml",
                                         "model: {arch: mlp}\ndata: {dataset: fashion_mnist, max_train_examples: 256}\n"
                                         "quantize:\n  weights:\n  activations:\ntrain: {epochs: 1}\n"
                                         "freeze: {enabled: false}\n"));
  const std::string expected =
      "model: {arch: mlp}\n"
      "data: {dataset: fashion_mnist, max_train_examples: 256, batch_size: 64, eval_batch_size: 256, "
      "validation_size: 5000, max_eval_examples: 0, seq_len: 128, examples_per_language: 0, tokens: chars}\n"
      "quantize:\n"
      "  weights:\n    qtype: qint8\n    granularity: per_channel\n    symmetric: true\n    lsq: false\n"
      "  activations:\n    mode: none\n    qtype: qint8\n    symmetric: true\n    observer: histogram\n"
      "    method: l2\n    percentile: 99.99\n    averaging_constant: 0.01\n    lsq: false\n"
      "train: {epochs: 1, lr: 0.001, weight_decay: 0.01, warmup_steps: 0, grad_clip: 1, max_steps: 0}\n"
      "freeze: {enabled: false, backend: cpu, decode_activations: exact}\n"
      "seed: 0\n"
      "calibrate:\n  batches: 16\n  samples: 0\n  imatrix: false\n"
      "qat:\n  epochs: 0\n  lr: 0.0001\n  lsq: false\n  freeze_observers_after: -1\n  freeze_bn_after: -1\n"
      "  max_steps: 0\n"
      "distributed:\n  backend: gloo\n  timeout_s: 300\n  sync_batchnorm: false\n"
      "export:\n  checkpoint: true\n  calibration_dump: true\n  report: true\n  safetensors: false\n"
      "  onnx: false\n";
  EXPECT_EQ(r.resolved_yaml, expected);
  EXPECT_EQ(r.sha256, "a7046d5eb8752e8a3f6ce27e0df7eb53685fea2b641e992f16b9405fade92e55");
}

TEST(Recipe, TokenizerKeysAreCheckedWithFileLineColumn) {
  TempDir dir;
  auto all = [&](const std::string& text) {
    std::string out;
    for (const auto& i : issues_of(dir.write("t.yaml", text))) out += i.to_string() + "\n";
    return out;
  };
  const std::string llama = "model: {arch: llama}\n";
  const Recipe r = load_recipe(dir.write("ok.yaml", llama + "data:\n  dataset: fortunes\n  tokenizer: {train: {vocab_size: 2048}}\n"));
  EXPECT_EQ(r.data.tokenizer_vocab_size, 2048);
  EXPECT_TRUE(r.data.tokenizer_file.empty());
  const std::string file = dir.write("tokenizer.json", "{}");
  std::string e = all(llama + "data:\n  dataset: fortunes\n  tokenizer:\n    train: {vocab_size: 300}\n    file: " + file + "\n");
  EXPECT_NE(e.find("t.yaml:5:5: data.tokenizer: give train or file, not both"), std::string::npos) << e;
  e = all(llama + "data:\n  dataset: fortunes\n  tokenizer: {file: /nonexistent/qforge_tok.json}\n");
  EXPECT_NE(e.find("t.yaml:4:21: "), std::string::npos) << e;
  EXPECT_NE(e.find("data.tokenizer.file: '/nonexistent/qforge_tok.json' does not exist"), std::string::npos) << e;
  e = all(llama + "data:\n  dataset: fortunes\n  tokenizer: {train: {vocab_size: 100}}\n");
  EXPECT_NE(e.find("data.tokenizer.train.vocab_size: value 100 is out of range"), std::string::npos) << e;
  e = all("model: {arch: mlp}\ndata: {dataset: fashion_mnist, tokenizer: {train: {vocab_size: 300}}}\n");
  EXPECT_NE(e.find("data.tokenizer: applies to the fortunes language models only"), std::string::npos) << e;
}

// quantize.activations.clip_ratio: dynamic rows only, at its line (freezing takes it: the Linear
// kernels clip); the resolved recipe names it only when it clips.
TEST(Recipe, ActivationClipRatioNeedsDynamicRows) {
  TempDir dir;
  auto all = [&](const std::string& text) {
    std::string out;
    for (const auto& i : issues_of(dir.write("clip.yaml", text))) out += i.to_string() + "\n";
    return out;
  };
  const std::string nofreeze = std::string(kMinimal) + "freeze: {enabled: false}\n";
  const Recipe r = load_recipe(
      dir.write("ok.yaml", nofreeze + "quantize: {activations: {mode: dynamic_per_token, qtype: qint4, clip_ratio: 0.9}}\n"));
  EXPECT_EQ(r.scheme.activation_clip_ratio, 0.9f);
  EXPECT_NE(r.resolved_yaml.find("clip_ratio"), std::string::npos);
  EXPECT_EQ(load_recipe(dir.write("plain.yaml", nofreeze + "quantize: {activations: {mode: dynamic_per_token}}\n"))
                .resolved_yaml.find("clip_ratio"),
            std::string::npos);
  std::string e = all(nofreeze + "quantize: {activations: {mode: static, clip_ratio: 0.9}}\n");
  EXPECT_NE(e.find("quantize.activations.clip_ratio: clips dynamic per-token rows only"), std::string::npos) << e;
  EXPECT_TRUE(load_recipe(dir.write("frozen.yaml", std::string(kMinimal) + "quantize: {activations: {mode: "
                                                                           "dynamic_per_token, clip_ratio: 0.9}}\n"))
                  .freeze.enabled);
  e = all(nofreeze + "quantize: {activations: {mode: dynamic_per_token, clip_ratio: 1.5}}\n");
  EXPECT_NE(e.find("clip_ratio"), std::string::npos) << e;
}

// quantize.activations.attention: per_head with static activations, not with dynamic rows or LSQ,
// a misspelt value named with the closest; the resolved recipe names it only per head.
TEST(Recipe, AttentionPerHeadScalesNeedStaticCalibratedActivations) {
  TempDir dir;
  auto all = [&](const std::string& text) {
    std::string out;
    for (const auto& i : issues_of(dir.write("attn.yaml", text))) out += i.to_string() + "\n";
    return out;
  };
  const Recipe r =
      load_recipe(dir.write("ok.yaml", std::string(kMinimal) + "quantize: {activations: {mode: static, attention: per_head}}\n"));
  EXPECT_EQ(r.scheme.attention_scales, AttentionScales::kPerHead);
  EXPECT_NE(r.resolved_yaml.find("attention: per_head"), std::string::npos) << r.resolved_yaml;
  EXPECT_EQ(load_recipe(dir.write("plain.yaml", std::string(kMinimal) + "quantize: {activations: {mode: static}}\n"))
                .resolved_yaml.find("attention"),
            std::string::npos);
  std::string e = all(std::string(kMinimal) + "quantize: {activations: {mode: dynamic_per_token, attention: per_head}}\n");
  EXPECT_NE(e.find("quantize.activations.attention: per_head sets static scales"), std::string::npos) << e;
  e = all(std::string(kMinimal) + "quantize: {activations: {mode: static, lsq: true, attention: per_head}}\n");
  EXPECT_NE(e.find("quantize.activations.attention: per_head scales are calibrated"), std::string::npos) << e;
  // A rule's static activations are static activations too; a rule's attention overrides for its layers.
  const Recipe by_rule = load_recipe(dir.write(
      "rule.yaml", std::string(kMinimal) + "quantize:\n  activations: {mode: dynamic_per_token, attention: per_head}\n"
                                           "  rules: [{pattern: \"*\", activations: static, attention: per_tensor}]\n"));
  ASSERT_EQ(by_rule.scheme.rules.size(), 1u);
  EXPECT_EQ(by_rule.scheme.rules[0].attention_scales, AttentionScales::kPerTensor);
  e = all(std::string(kMinimal) + "quantize: {activations: {mode: static, attention: per_heads}}\n");
  EXPECT_NE(e.find("per_head"), std::string::npos) << e;
  EXPECT_NE(e.find("attn.yaml:3:"), std::string::npos) << e;  // at its line
}

TEST(Recipe, Mxfp4AndNvfp4TakeTheirBlockAndNoActivations) {
  TempDir dir;
  auto first = [&](const std::string& text) {
    std::string all;
    for (const auto& i : issues_of(dir.write("fp4.yaml", text))) all += i.to_string() + "\n";
    return all;
  };
  const Recipe r = load_recipe(dir.write("ok.yaml", std::string(kMinimal) + "quantize: {weights: {qtype: nvfp4}}\n"));
  EXPECT_EQ(r.scheme.weight_granularity, Granularity::kPerGroup);
  EXPECT_EQ(r.scheme.group_size, 16);
  const std::string block = first(std::string(kMinimal) + "quantize:\n  weights: {qtype: mxfp4, group_size: 64}\n");
  EXPECT_NE(block.find("quantize.weights.group_size"), std::string::npos) << block;
  EXPECT_NE(block.find("fixed by the format"), std::string::npos) << block;
  const std::string act = first(std::string(kMinimal) + "quantize: {activations: {mode: static, qtype: mxfp4}}\n");
  EXPECT_NE(act.find("weight-only"), std::string::npos) << act;
}
