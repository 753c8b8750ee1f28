// export.gguf in recipes: the section switches the export on and resolves with its defaults; what
// the GGUF export cannot write is refused at the line that asked for it, before any stage runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "framework/pipeline/pipeline.h"
#include "framework/recipe/recipe.h"
#include "tests/error_of.h"

namespace fs = std::filesystem;

namespace {

std::string write_recipe(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("qforge_gguf_recipe_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

const char* kGpt2 =
    "model: {arch: gpt2}\n"
    "data: {dataset: fortunes}\n"
    "quantize: {weights: {qtype: qint4, granularity: per_group, group_size: 32}}\n"
    "freeze: {enabled: true}\n";

// The one issue of loading `path`, or an issue with the message "no error" when it loads.
qforge::RecipeIssue only_issue(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    qforge::load_recipe(path, overrides);
  } catch (const qforge::RecipeError& e) {
    EXPECT_EQ(e.issues().size(), 1u) << e.what();
    return e.issues().front();
  }
  return {path, 0, 0, "", "no error"};
}

}  // namespace

TEST(GgufRecipe, SectionEnablesTheExportAndResolvesWithDefaults) {
  const qforge::Recipe off = qforge::load_recipe(write_recipe("off.yaml", kGpt2));
  EXPECT_FALSE(off.export_.gguf.enabled);
  EXPECT_EQ(off.resolved_yaml.find("gguf"), std::string::npos) << off.resolved_yaml;

  const qforge::Recipe on = qforge::load_recipe(write_recipe("on.yaml", std::string(kGpt2) + "export: {gguf: {}}\n"));
  EXPECT_TRUE(on.export_.gguf.enabled);
  EXPECT_EQ(on.export_.gguf.float_type, "f32");
  EXPECT_FALSE(on.export_.gguf.refuse_wider);
  EXPECT_NE(on.resolved_yaml.find("float_type: f32"), std::string::npos) << on.resolved_yaml;
  // The resolved recipe runs the same export again.
  const qforge::Recipe again = qforge::load_recipe(write_recipe("again.yaml", on.resolved_yaml));
  EXPECT_TRUE(again.export_.gguf.enabled);
  EXPECT_EQ(again.sha256, on.sha256);

  // `gguf:` with nothing after it is YAML null: the export is on, as with {}.
  for (const char* empty : {"export: {gguf: }\n", "export:\n  gguf:\n"}) {
    const qforge::Recipe null = qforge::load_recipe(write_recipe("null.yaml", std::string(kGpt2) + empty));
    EXPECT_TRUE(null.export_.gguf.enabled) << empty;
    EXPECT_EQ(null.export_.gguf.float_type, "f32") << empty;
    EXPECT_NE(null.resolved_yaml.find("float_type: f32"), std::string::npos) << null.resolved_yaml;
  }

  const qforge::Recipe set = qforge::load_recipe(write_recipe("set.yaml", kGpt2),
                                                 {"export.gguf.float_type=q8_0", "export.gguf.refuse_wider=true"});
  EXPECT_TRUE(set.export_.gguf.enabled);
  EXPECT_EQ(set.export_.gguf.float_type, "q8_0");
  EXPECT_TRUE(set.export_.gguf.refuse_wider);
}

TEST(GgufRecipe, RefusalsNameTheLineAndTheReason) {
  const std::string gguf_line = "export:\n  gguf: {float_type: f16}\n";  // export.gguf at line N + 2, column 3
  auto expect_at_gguf = [](const qforge::RecipeIssue& i, int line, const std::string& words) {
    EXPECT_EQ(i.key, "export.gguf") << i.to_string();
    EXPECT_EQ(i.line, line) << i.to_string();
    EXPECT_NE(i.message.find(words), std::string::npos) << i.to_string();
  };
  // Tasks it cannot serve.
  expect_at_gguf(only_issue(write_recipe("bert.yaml", "model: {arch: bert}\ndata: {dataset: langid}\n"
                                                      "quantize: {weights: {qtype: qint8}}\n" + gguf_line)),
                 5, "not model.arch 'bert'");
  // Quantized weights that are not frozen.
  expect_at_gguf(only_issue(write_recipe("unfrozen.yaml", "model: {arch: gpt2}\ndata: {dataset: fortunes}\n"
                                                          "quantize: {weights: {qtype: qint8}}\n"
                                                          "freeze: {enabled: false}\n" + gguf_line)),
                 6, "freeze.enabled: true");
  // No quantize section: the export stage does not run.
  expect_at_gguf(only_issue(write_recipe("float.yaml", "model: {arch: gpt2}\ndata: {dataset: fortunes}\n" + gguf_line)),
                 4, "add one");
  // A trained tokenizer's vocabulary has no GGUF form here.
  expect_at_gguf(only_issue(write_recipe("tok.yaml", std::string(kGpt2) + gguf_line),
                            {"data.tokenizer.train.vocab_size=300"}),
                 6, "256-byte vocabulary");
  // SmoothQuant's pre_quant_scale.
  expect_at_gguf(only_issue(write_recipe("sq.yaml", "model: {arch: llama}\ndata: {dataset: fortunes}\n"
                                                    "quantize: {weights: {qtype: qint8}, activations: {mode: dynamic_per_token}}\n"
                                                    "freeze: {enabled: true}\nptq: {smoothquant: true}\n" + gguf_line)),
                 7, "pre_quant_scale");
  // A Hadamard-rotated Llama.
  expect_at_gguf(only_issue(write_recipe("rot.yaml", "model: {arch: llama}\ndata: {dataset: fortunes}\n"
                                                     "quantize: {weights: {qtype: qint4, granularity: per_group, group_size: 32}}\n"
                                                     "freeze: {enabled: true}\nptq: {rotate: hadamard}\n" + gguf_line)),
                 7, "online Hadamard transform");
  // A type qforge does not write is a schema error at its value.
  const qforge::RecipeIssue k = only_issue(write_recipe("k.yaml", std::string(kGpt2) + "export:\n  gguf: {float_type: q5_k}\n"));
  EXPECT_EQ(k.key, "export.gguf.float_type") << k.to_string();
  EXPECT_EQ(k.line, 6) << k.to_string();
}

// A Llama config llama.cpp's llama cannot express fails when the run starts: no stage has run, so
// neither the float checkpoint nor model.h5 exists.
TEST(GgufRecipe, UnexportableLlamaConfigFailsBeforeAnyStage) {
  const fs::path dir = fs::temp_directory_path() / ("qforge_gguf_early_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string ckpt = (dir / "float.h5").string(), out = (dir / "run").string();
  const std::string tiny = "hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, ";
  for (const std::string& config : {"{" + tiny + "attention_bias: true}", "{" + tiny + "mlp_bias: true}"}) {
    const qforge::Recipe r = qforge::load_recipe(write_recipe("early.yaml",
        "model: {arch: llama, checkpoint: " + ckpt + ", config: " + config + "}\n"
        "data: {dataset: fortunes}\nquantize: {weights: {qtype: qint8}}\nfreeze: {enabled: true}\nexport: {gguf: {}}\n"));
    qforge::PipelineOptions po;
    po.out_dir = out;
    const std::string e = qforge::testing::error_of([&] { qforge::run_pipeline(r, po); });
    EXPECT_NE(e.find("gguf export: "), std::string::npos) << config << ": " << e;
    EXPECT_FALSE(fs::exists(ckpt)) << config;
    EXPECT_FALSE(fs::exists(out + "/model.h5")) << config;
    EXPECT_FALSE(fs::exists(out + "/report.json")) << config;
  }
  fs::remove_all(dir);
}
