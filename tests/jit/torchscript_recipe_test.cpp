// qtrain on a TorchScript model (recipes/torchscript_cnn_int8.yaml: a scripted net with
// BatchNorms, user data in a safetensors file): calibrate -> quantize -> freeze -> export, the
// saved model.pt loaded back, and the recipe errors at file:line:key.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/script.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "framework/data/fashion_mnist.h"
#include "framework/data/text_corpus.h"
#include "framework/format/safetensors.h"
#include "framework/io/calibration_dump.h"
#include "framework/jit/scripted_model.h"
#include "tests/paths.h"
#include "tests/qtrain_run.h"

namespace fs = std::filesystem;

namespace {

using qforge::testing::qtrain;
using qforge::testing::QtrainRun;

// A fresh directory under the temporary directory, removed at scope exit.
struct OutDir {
  fs::path path;
  explicit OutDir(const std::string& name)
      : path(fs::temp_directory_path() / ("qforge_ts_recipe_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
  }
  ~OutDir() { fs::remove_all(path); }
};

const char* kRecipe = "--recipe recipes/torchscript_cnn_int8.yaml";

}  // namespace

TEST(TorchScriptRecipe, CalibratesQuantizesFreezesAndExportsTorchScript) {
  OutDir dir("run");
  const QtrainRun run = qtrain(std::string(kRecipe) + " --out " + dir.path.string());
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  EXPECT_EQ(r["metric"], "accuracy");
  // The labels are the float model's own top-1 classes: the float model agrees with itself.
  EXPECT_EQ(r["metrics"]["float"]["accuracy"].get<double>(), 1.0);
  // W8A8 keeps top-1 agreement with float on at least 90 % of the 128 held-out examples.
  EXPECT_GE(r["metrics"]["frozen"]["accuracy"].get<double>(), 0.9) << r["metrics"].dump();
  EXPECT_EQ(r["layers"].size(), 4u);
  EXPECT_LT(r["size_bytes"]["frozen"].get<int64_t>(), r["size_bytes"]["float"].get<int64_t>());
  EXPECT_NE(r["notes"].dump().find("float weights from the TorchScript file"), std::string::npos) << r["notes"].dump();
  const fs::path pt = dir.path / "model.pt";
  ASSERT_TRUE(fs::exists(pt));
  EXPECT_EQ(r["exported"]["torchscript"], pt.string());
  EXPECT_TRUE(fs::exists(dir.path / "report.md"));

  // model.pt runs the frozen integer layers: loaded back, its outputs agree with the float file
  // on the held-out inputs as the report says.
  qforge::jit::ScriptedModel frozen = qforge::jit::load_torchscript(pt.string());
  for (const auto& l : frozen->layers()) EXPECT_TRUE(l->layer().frozen()) << l->path();
  const auto data = qforge::io::read_safetensors(std::string(QFORGE_SOURCE_DIR) +
                                                 "/tests/fixtures/torchscript/cnn_bn_data.safetensors");
  const at::Tensor x = data.tensors.at("inputs").slice(0, 256), y = data.tensors.at("labels").slice(0, 256);
  frozen->eval();
  torch::NoGradGuard no_grad;
  const double agree = frozen->forward(x).argmax(1).eq(y).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(agree, r["metrics"]["frozen"]["accuracy"].get<double>(), 1e-9);
}

TEST(TorchScriptRecipe, DryRunPrintsThePlanAndTheFoldedBatchNorms) {
  const QtrainRun run = qtrain(std::string(kRecipe) + " --dry-run");
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("model torchscript, dataset tensors"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("plan (4 quantized layers"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("folded  stem.1  aten::batch_norm into stem.0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("float  head_bn  aten::batch_norm"), std::string::npos) << run.output;
}

TEST(TorchScriptRecipe, MistakesAreReportedAtTheirKey) {
  const auto expect_error = [](const std::string& set, const std::string& message) {
    const QtrainRun run = qtrain(std::string(kRecipe) + " --dry-run " + set);
    EXPECT_NE(run.code, 0) << set;
    EXPECT_NE(run.output.find(message), std::string::npos) << set << "\n" << run.output;
  };
  expect_error("--set export.onnx=true", "export.onnx: a TorchScript model has no ONNX export");
  // Missing files are found when the dry run loads the model, or the data stage reads the data.
  expect_error("--set model.torchscript=nowhere.pt", "no TorchScript file at nowhere.pt");
  expect_error("--set model.arch=cnn", "model.torchscript: is the model of model.arch torchscript, not 'cnn'");
  // Written in the recipe file: the error names the file and line.
  expect_error("--set data.dataset=fashion_mnist", "torchscript_cnn_int8.yaml:13:");
  expect_error("--set data.dataset=fashion_mnist", "data.file: is read by data.dataset tensors only");
  const QtrainRun no_data = qtrain(std::string(kRecipe) + " --out " +
                                   (fs::temp_directory_path() / "qforge_ts_recipe_no_data").string() +
                                   " --set data.file=nowhere.safetensors");
  EXPECT_NE(no_data.code, 0);
  EXPECT_NE(no_data.output.find("nowhere.safetensors"), std::string::npos) << no_data.output;
  fs::remove_all(fs::temp_directory_path() / "qforge_ts_recipe_no_data");
  const QtrainRun shape = qtrain(std::string(kRecipe) + " --out " +
                           (fs::temp_directory_path() / "qforge_ts_recipe_shape").string() +
                           " --set model.input_shape=[3,14,14]");
  EXPECT_NE(shape.code, 0);
  EXPECT_NE(shape.output.find("one example has shape [1, 14, 14], model.input_shape is [3, 14, 14]"), std::string::npos)
      << shape.output;
  fs::remove_all(fs::temp_directory_path() / "qforge_ts_recipe_shape");
}

namespace {

// Fashion-MNIST's test images [N, 1, 28, 28] in [0, 1] and labels, as qtrain reads them.
std::pair<at::Tensor, at::Tensor> fashion_mnist_test(int64_t n) {
  const qforge::data::FashionMnist fm = qforge::data::load_fashion_mnist(5000, 0);
  return {fm.test.images.slice(0, 0, n), fm.test.labels.slice(0, 0, n)};
}

const char* kFmnistSmall =
    " --set data.max_train_examples=2048 --set data.max_eval_examples=512 --set calibrate.batches=4";

}  // namespace

// The built-in Fashion-MNIST and QAT from a recipe: the QAT loss goes down, and model.pt loads
// back with the accuracy the report gives for the frozen model.
TEST(TorchScriptRecipe, FashionMnistQatTrainsTheScriptAndModelPtKeepsTheReportsAccuracy) {
  OutDir dir("fmnist_qat");
  const QtrainRun run = qtrain("--recipe recipes/torchscript_fmnist_qat.yaml --out " + dir.path.string() +
                               kFmnistSmall + " --set qat.max_steps=48");
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  const auto& curve = r["loss_curves"]["qat"];
  ASSERT_GE(curve.size(), 4u) << r["loss_curves"].dump();
  const double first = curve.front()["loss"].get<double>(), last = curve.back()["loss"].get<double>();
  std::printf("QAT loss %.4f -> %.4f; accuracy float %.4f, qat %.4f, frozen %.4f\n", first, last,
              r["metrics"]["float"]["accuracy"].get<double>(), r["metrics"]["qat"]["accuracy"].get<double>(),
              r["metrics"]["frozen"]["accuracy"].get<double>());
  EXPECT_LT(last, first);
  EXPECT_GE(r["metrics"]["float"]["accuracy"].get<double>(), 0.7);  // trained briefly in PyTorch
  EXPECT_GE(r["metrics"]["frozen"]["accuracy"].get<double>(), r["metrics"]["float"]["accuracy"].get<double>() - 0.03);
  qforge::jit::ScriptedModel frozen = qforge::jit::load_torchscript((dir.path / "model.pt").string());
  for (const auto& l : frozen->layers()) EXPECT_TRUE(l->layer().frozen()) << l->path();
  const auto [x, y] = fashion_mnist_test(512);
  frozen->eval();
  torch::NoGradGuard no_grad;
  const double accuracy = frozen->forward(x).argmax(1).eq(y).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(accuracy, r["metrics"]["frozen"]["accuracy"].get<double>(), 1e-9);
}

// GPTQ on a TorchScript model through the recipe: each solved layer's output error is below
// round-to-nearest's on the same calibration inputs.
TEST(TorchScriptRecipe, GptqOnATorchScriptModelBeatsRoundToNearest) {
  OutDir dir("fmnist_gptq");
  const QtrainRun run =
      qtrain("--recipe recipes/torchscript_fmnist_w4_gptq.yaml --out " + dir.path.string() + kFmnistSmall);
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  int solved = 0;
  for (const auto& l : r["ptq"]["solve"]["layers"]) {
    if (!l.contains("error_after")) continue;
    ++solved;
    std::printf("%s: output error RTN %.5f, GPTQ %.5f\n", l["path"].get<std::string>().c_str(),
                l["error_before"].get<double>(), l["error_after"].get<double>());
    EXPECT_LT(l["error_after"].get<double>(), l["error_before"].get<double>()) << l.dump();
  }
  EXPECT_EQ(solved, 5) << r["ptq"].dump();  // FmnistCnn: three convolutions, fc1 and fc2
  EXPECT_TRUE(fs::exists(dir.path / "model.pt"));
}

// Token ids in the data file: a scripted text model (make_fixtures.py's TinyEncoder, an
// nn.Embedding first) calibrates, freezes and saves from integer `inputs`, and its model.pt
// answers them with the accuracy the report gives. Negative ids are refused by name.
TEST(TorchScriptRecipe, IntegerTokenIdsInTheDataFileReachTheEmbedding) {
  OutDir dir("token_ids");
  fs::create_directories(dir.path);
  const std::string model = std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/torchscript/encoder_scripted.pt";
  at::manual_seed(0);
  at::Tensor ids = at::randint(1, 64, {384, 16}, at::kInt);  // int32 on disk, int64 for the model
  ids.slice(1, 12).zero_();                                  // padded tails, as the fixture's own data
  at::Tensor labels;
  {
    qforge::jit::ScriptedModel m = qforge::jit::load_torchscript(model);
    m->eval();
    torch::NoGradGuard no_grad;
    labels = m->forward(ids.to(at::kLong)).argmax(1);  // the float model's top-1: accuracy is agreement
  }
  const std::string data = (dir.path / "ids.safetensors").string();
  qforge::io::write_safetensors(data, {{"inputs", ids}, {"labels", labels}});
  const std::string sets = " --set model.torchscript=" + model + " --set data.file=" + data +
                           " --set model.input_shape=[16] --set calibrate.batches=4";
  const QtrainRun run = qtrain(std::string(kRecipe) + " --out " + (dir.path / "run").string() + sets);
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "run" / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  EXPECT_EQ(r["metrics"]["float"]["accuracy"].get<double>(), 1.0);
  EXPECT_GE(r["metrics"]["frozen"]["accuracy"].get<double>(), 0.8) << r["metrics"].dump();
  qforge::jit::ScriptedModel frozen = qforge::jit::load_torchscript((dir.path / "run" / "model.pt").string());
  frozen->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor held_x = ids.slice(0, 256).to(at::kLong), held_y = labels.slice(0, 256);
  const double agree = frozen->forward(held_x).argmax(1).eq(held_y).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(agree, r["metrics"]["frozen"]["accuracy"].get<double>(), 1e-9);

  ids[5][3] = -2;
  qforge::io::write_safetensors(data, {{"inputs", ids}, {"labels", labels}});
  const QtrainRun negative = qtrain(std::string(kRecipe) + " --out " + (dir.path / "neg").string() + sets);
  EXPECT_NE(negative.code, 0);
  EXPECT_NE(negative.output.find("'inputs' holds negative token ids"), std::string::npos) << negative.output;
}

// qtrain --export-data writes the task's splits as it batches them: the language-ID phrases as
// bigram ids with their mask, the labels, and the class names, for a model trained elsewhere.
TEST(TorchScriptRecipe, ExportDataWritesTheTasksSplitsAsItBatchesThem) {
  OutDir dir("export");
  fs::create_directories(dir.path);
  const std::string file = (dir.path / "langid.safetensors").string();
  const QtrainRun run = qtrain("--recipe recipes/bert_int8.yaml --set data.examples_per_language=50 --export-data " + file);
  ASSERT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("train: 400 examples, inputs Long [400, "), std::string::npos) << run.output;
  const qforge::io::SafetensorsFile f = qforge::io::read_safetensors(file);
  EXPECT_EQ(f.metadata.at("class_names"), "English,French,German,Italian,Spanish,Portuguese,Dutch,Swedish");
  EXPECT_EQ(f.metadata.at("arch"), "bert");
  for (const char* split : {"train", "validation", "test"}) {
    const std::string s(split);
    const at::Tensor x = f.tensors.at(s + ".inputs"), y = f.tensors.at(s + ".labels"), m = f.tensors.at(s + ".mask");
    EXPECT_EQ(x.scalar_type(), at::kLong) << s;
    EXPECT_EQ(x.dim(), 2) << s;
    EXPECT_LE(x.size(1), 32) << s;  // data.seq_len of bert_tiny
    EXPECT_EQ(y.size(0), x.size(0)) << s;
    EXPECT_TRUE(at::equal(m, x.ne(0).to(at::kLong))) << s;  // padding is id 0, and only padding
    EXPECT_TRUE(x.select(1, 0).eq(2).all().item<bool>()) << s;  // every phrase starts with [CLS]
    EXPECT_EQ(at::bincount(y).size(0), 8) << s;
  }
  const QtrainRun bad = qtrain("--recipe recipes/bert_int8.yaml --export-data /nonexistent/dir/x.safetensors");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.output.find("--export-data /nonexistent/dir/x.safetensors"), std::string::npos) << bad.output;
}

namespace {

const char* kLmRecipe = "--recipe recipes/torchscript_lm_w8a8.yaml";

// The fortunes windows qtrain scores a causal LM on: `count` windows of 64 tokens from `split`
// ("train" or "test", as load_fortunes splits the bytes), each input with its next tokens.
std::pair<at::Tensor, at::Tensor> fortunes_windows(const std::string& split, int64_t count) {
  const qforge::data::TextCorpus c = qforge::data::load_fortunes();
  const at::Tensor text = split == "train" ? c.train : c.test;
  const at::Tensor starts = at::arange(count, at::kLong) * 64;
  const at::Tensor idx = starts.unsqueeze(1) + at::arange(64, at::kLong).unsqueeze(0);
  return {text.index_select(0, idx.flatten()).view({count, 64}),
          text.index_select(0, (idx + 1).flatten()).view({count, 64})};
}

// Mean cross-entropy of a causal LM's logits over every position of the windows, in batches of 256
// (as qtrain evaluates), then its exponent.
double perplexity(qforge::jit::ScriptedModel& m, const at::Tensor& x, const at::Tensor& y) {
  m->eval();
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t b = 0; b < x.size(0); b += 256) {
    const at::Tensor logits = m->forward(x.slice(0, b, b + 256));
    sum += at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y.slice(0, b, b + 256).reshape(-1),
                                  {}, at::Reduction::Sum)
               .item<double>();
  }
  return std::exp(sum / static_cast<double>(y.numel()));
}

}  // namespace

// A causal LM from PyTorch on the built-in fortunes text (make_fixtures.py's FortunesLm, a byte-level
// GPT-style model with a tied head): model.task causal_lm scores perplexity on the test windows and
// the sliding windows, W8A8 dynamic keeps it within 1 % of float, and model.pt gives the frozen
// perplexity the report states on the same windows.
TEST(TorchScriptRecipe, CausalLmOnFortunesScoresPerplexityAndModelPtAgrees) {
  OutDir dir("lm");
  const QtrainRun run = qtrain(std::string(kLmRecipe) + " --out " + dir.path.string());
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  EXPECT_EQ(r["metric"], "perplexity");
  const double fp = r["metrics"]["float"]["perplexity"].get<double>();
  const double frozen = r["metrics"]["frozen"]["perplexity"].get<double>();
  std::printf("perplexity: unigram %.3f, float %.4f, frozen W8A8 %.4f; sliding windows float %.4f, frozen %.4f\n",
              r["baselines"]["unigram_perplexity"].get<double>(), fp, frozen,
              r["metrics"]["float"]["sliding_window_perplexity"].get<double>(),
              r["metrics"]["frozen"]["sliding_window_perplexity"].get<double>());
  // Trained briefly on the training bytes: far below the unigram model on the test text.
  EXPECT_LT(fp, 0.5 * r["baselines"]["unigram_perplexity"].get<double>());
  EXPECT_LT(std::abs(frozen - fp), 0.01 * fp) << r["metrics"].dump();
  EXPECT_GT(r["metrics"]["frozen"]["sliding_window_perplexity"].get<double>(), 1.0);
  // The token table and the tied head are one layer: 2 tables, 8 Linears and each block's two
  // attention products (q @ k^T and att @ v, qforge MatMuls).
  EXPECT_EQ(r["layers"].size(), 14u);
  EXPECT_LT(r["size_bytes"]["frozen"].get<int64_t>(), r["size_bytes"]["float"].get<int64_t>() / 3);

  // model.pt answers the first 512 test windows (data.max_eval_examples) with the report's perplexity.
  qforge::jit::ScriptedModel m = qforge::jit::load_torchscript((dir.path / "model.pt").string());
  for (const auto& l : m->layers()) EXPECT_TRUE(l->layer().frozen()) << l->path();
  const auto [x, y] = fortunes_windows("test", 512);
  EXPECT_NEAR(perplexity(m, x, y), frozen, 1e-4 * frozen);

  const QtrainRun dry = qtrain(std::string(kLmRecipe) + " --dry-run");
  ASSERT_EQ(dry.code, 0) << dry.output;
  EXPECT_NE(dry.output.find("float: the weights of the TorchScript file tests/fixtures/torchscript/"
                            "fortunes_lm_scripted.pt (model.task causal_lm)"),
            std::string::npos)
      << dry.output;
  EXPECT_NE(dry.output.find("tied  lm_head  aten::linear runs the qforge layer tok"), std::string::npos) << dry.output;
}

// QAT of the scripted causal LM through the recipe: the steps train the TorchScript module's own
// parameters on the fortunes windows (the loss curve has every step), the QAT model stays within
// 2 % of float perplexity, and the frozen model computes the QAT model's perplexity.
TEST(TorchScriptRecipe, CausalLmQatTrainsTheScriptAndFreezes) {
  OutDir dir("lm_qat");
  const QtrainRun run = qtrain(std::string(kLmRecipe) + " --out " + dir.path.string() +
                               " --set qat.epochs=1 --set qat.max_steps=24 --set qat.lr=0.0003"
                               " --set data.max_train_examples=2048");
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  EXPECT_EQ(r["loss_curves"]["qat"].size(), 24u) << r["loss_curves"].dump();
  const double fp = r["metrics"]["float"]["perplexity"].get<double>();
  const double qat = r["metrics"]["qat"]["perplexity"].get<double>();
  const double frozen = r["metrics"]["frozen"]["perplexity"].get<double>();
  std::printf("causal LM QAT: float %.4f, qat %.4f, frozen %.4f\n", fp, qat, frozen);
  EXPECT_NE(qat, r["metrics"]["ptq"]["perplexity"].get<double>());  // the steps changed the model
  EXPECT_LT(std::abs(qat - fp), 0.02 * fp);
  EXPECT_NEAR(frozen, qat, 1e-3 * qat);
  qforge::jit::ScriptedModel m = qforge::jit::load_torchscript((dir.path / "model.pt").string());
  const auto [x, y] = fortunes_windows("test", 512);
  EXPECT_NEAR(perplexity(m, x, y), frozen, 1e-4 * frozen);
}

// A causal LM's data as a file: `inputs` [N, T] token ids and `labels` [N, T] next tokens, scored
// by perplexity; a classification model given model.task causal_lm, labels of the wrong shape and
// windows longer than the model's positions are refused with what was expected.
TEST(TorchScriptRecipe, CausalLmReadsTokenWindowsFromTheDataFileAndRefusesWhatDoesNotFit) {
  OutDir dir("lm_file");
  fs::create_directories(dir.path);
  const auto [x, y] = fortunes_windows("train", 320);
  const std::string data = (dir.path / "windows.safetensors").string();
  qforge::io::write_safetensors(data, {{"inputs", x.to(at::kInt)}, {"labels", y}});
  const std::string sets = " --set data.dataset=tensors --set data.file=" + data +
                           " --set data.validation_size=64 --set model.input_shape=[64]";
  const QtrainRun run = qtrain(std::string(kLmRecipe) + " --out " + (dir.path / "run").string() + sets);
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "run" / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  EXPECT_EQ(r["metric"], "perplexity");
  const double fp = r["metrics"]["float"]["perplexity"].get<double>();
  EXPECT_LT(fp, 0.5 * r["baselines"]["unigram_perplexity"].get<double>()) << r["baselines"].dump();
  EXPECT_LT(std::abs(r["metrics"]["frozen"]["perplexity"].get<double>() - fp), 0.01 * fp) << r["metrics"].dump();
  qforge::jit::ScriptedModel m = qforge::jit::load_torchscript((dir.path / "run" / "model.pt").string());
  EXPECT_NEAR(perplexity(m, x.slice(0, 256), y.slice(0, 256)), r["metrics"]["frozen"]["perplexity"].get<double>(),
              1e-4 * fp);

  // Token windows alone: a window of 65 ids runs its first 64 and scores ids 2..65, the same
  // windows and next tokens as above, so the same perplexities.
  const std::string ids_only = (dir.path / "ids.safetensors").string();
  qforge::io::write_safetensors(ids_only, {{"inputs", at::cat({x, y.slice(1, 63, 64)}, 1).to(at::kInt)}});
  const QtrainRun unlabeled = qtrain(std::string(kLmRecipe) + " --out " + (dir.path / "ids").string() +
                                     " --set data.dataset=tensors --set data.file=" + ids_only +
                                     " --set data.validation_size=64 --set model.input_shape=[64]");
  ASSERT_EQ(unlabeled.code, 0) << unlabeled.output;
  EXPECT_NE(unlabeled.output.find("has no 'labels': each window of 65 ids runs its first 64"), std::string::npos)
      << unlabeled.output;
  std::ifstream in_ids(dir.path / "ids" / "report.json");
  const nlohmann::json r_ids = nlohmann::json::parse(in_ids);
  for (const char* stage : {"float", "frozen"})
    EXPECT_EQ(r_ids["metrics"][stage]["perplexity"], r["metrics"][stage]["perplexity"]) << stage;

  const auto expect_error = [&](const std::string& name, const std::string& set, const std::string& message) {
    const QtrainRun bad = qtrain(std::string(kLmRecipe) + " --out " + (dir.path / name).string() + set);
    EXPECT_NE(bad.code, 0) << set;
    EXPECT_NE(bad.output.find(message), std::string::npos) << set << "\n" << bad.output;
  };
  // The language-ID encoder classifies [B, 16] ids: its logits are [B, 5].
  const std::string data16 = (dir.path / "windows16.safetensors").string();
  qforge::io::write_safetensors(data16, {{"inputs", x.slice(1, 0, 16).remainder(64)}, {"labels", y.slice(1, 0, 16).remainder(64)}});
  expect_error("encoder",
               " --set data.dataset=tensors --set data.validation_size=64 --set data.file=" + data16 +
                   " --set model.torchscript=" + std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/torchscript/encoder_scripted.pt",
               "gave Float [2, 5]; a causal LM's logits are float [B, T, V]");
  qforge::io::write_safetensors(data, {{"inputs", x}, {"labels", y.select(1, 0)}});
  expect_error("labels", sets, "a causal LM's 'labels' are int32 / int64 next tokens shaped as 'inputs' [320, 64]");
  qforge::io::write_safetensors(data, {{"inputs", x.select(1, 0)}});
  expect_error("no_labels", sets, "has no 'labels': a causal LM's 'inputs' must then be int32 / int64 token windows [N, T] with T >= 2");
  // FortunesLm has 64 positions.
  expect_error("long", " --set data.seq_len=96", "the model must take token ids [B, T] with T = 96 (data.seq_len)");
  expect_error("cls", " --set model.task=classification", "model.task: fortunes is text for a language model");
  expect_error("images", " --set data.dataset=fashion_mnist", "causal_lm reads token ids (data.dataset fortunes or tensors)");
}

// The solvers and the search run on TorchScript models as on the built-in ones: SmoothQuant on the
// causal LM (its LayerNorms are graph calls, so each Linear keeps its smoothing scales; the float
// output unchanged), bias correction on the BatchNorm CNN (each layer's output error on its
// calibration inputs no larger), and the Hessian search under a size budget on the LM, whose
// calibration dump holds the observers, the search's sensitivities and the numeric suite's errors.
TEST(TorchScriptRecipe, SmoothQuantBiasCorrectionTheSearchAndTheDumpRunOnTorchScriptModels) {
  OutDir dir("solvers");
  {
    const QtrainRun run = qtrain(std::string(kLmRecipe) + " --out " + (dir.path / "sq").string() +
                                 " --set ptq.smoothquant=true --set ptq.alpha=0.5 --set quantize.activations.mode=static");
    ASSERT_EQ(run.code, 0) << run.output;
    std::ifstream in(dir.path / "sq" / "report.json");
    const nlohmann::json r = nlohmann::json::parse(in);
    const auto& sq = r["ptq"]["smoothquant"];
    EXPECT_EQ(sq["layers"].size(), 8u) << sq.dump();  // every Linear; the tables take no activations
    EXPECT_LT(sq["float_output_change"].get<double>(), 1e-5) << sq.dump();
    for (const auto& l : sq["layers"])
      EXPECT_LT(l["act_range_after"].get<double>(), l["act_range_before"].get<double>()) << l.dump();
    const double fp = r["metrics"]["float"]["perplexity"].get<double>();
    EXPECT_LT(std::abs(r["metrics"]["frozen"]["perplexity"].get<double>() - fp), 0.01 * fp) << r["metrics"].dump();
  }
  {
    const QtrainRun run =
        qtrain(std::string(kRecipe) + " --out " + (dir.path / "bc").string() + " --set ptq.bias_correction=true");
    ASSERT_EQ(run.code, 0) << run.output;
    std::ifstream in(dir.path / "bc" / "report.json");
    const nlohmann::json r = nlohmann::json::parse(in);
    const auto& layers = r["ptq"]["solve"]["layers"];
    EXPECT_EQ(layers.size(), 4u) << r["ptq"].dump();
    for (const auto& l : layers) {
      EXPECT_EQ(l["method"], "rtn+bias_correction") << l.dump();
      // Removing the mean of an error never raises its mean square on the same inputs.
      EXPECT_LE(l["error_after"].get<double>(), l["error_before"].get<double>() * (1 + 1e-6)) << l.dump();
    }
  }
  const fs::path search = dir.path / "search";
  const QtrainRun run = qtrain(std::string(kLmRecipe) + " --out " + search.string() +
                               " --set quantize.activations.mode=none --set search.method=hessian"
                               " --set search.candidates=[qint8,qint4,float] --set search.budget.size_ratio=0.28"
                               " --set search.batches=2 --set search.probes=8 --set search.evaluate_front=0");
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(search / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  const auto& s = r["search"];
  EXPECT_EQ(s["layers"].size(), 10u) << s.dump();
  EXPECT_LE(s["bytes"].get<double>(), s["budget_bytes"].get<double>());
  EXPECT_EQ(r["size_bytes"]["frozen"].get<int64_t>(), s["bytes"].get<int64_t>()) << r["size_bytes"].dump();
  std::set<std::string> chosen;
  for (const auto& l : s["layers"]) chosen.insert(l["qtype"].get<std::string>());
  EXPECT_GE(chosen.size(), 2u) << s.dump();  // the budget sits between all-int8 and all-int4
  const double fp = r["metrics"]["float"]["perplexity"].get<double>();
  EXPECT_LT(r["metrics"]["frozen"]["perplexity"].get<double>(), 1.02 * fp) << r["metrics"].dump();
  const std::string dump = (search / "calibration.h5").string();
  EXPECT_EQ(qforge::io::load_calibration_dump(dump).size(), 10u);
  const auto sensitivities = qforge::io::load_search_sensitivities(dump);
  ASSERT_TRUE(sensitivities.has_value());
  EXPECT_EQ(sensitivities->traces.size(), 10u);
  const auto errors = qforge::io::load_layer_errors(dump);
  ASSERT_TRUE(errors.has_value());
  EXPECT_EQ(errors->layers.size(), 10u);
}

// The data file may be HDF5, as h5py writes it (make_fixtures.py: `inputs` and `labels` datasets
// at the root, libver v110): the same 192 examples as a safetensors file give the same report
// figures. h5py's default (earliest) format is refused naming the libver option; a file in
// neither format is refused naming both.
TEST(TorchScriptRecipe, DataFilesWrittenByH5pyReadAsTheirSafetensorsTwin) {
  OutDir dir("h5");
  fs::create_directories(dir.path);
  const std::string fixtures = std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/torchscript/";
  const auto st = qforge::io::read_safetensors(fixtures + "cnn_bn_data.safetensors");
  const std::string twin = (dir.path / "first192.safetensors").string();
  qforge::io::write_safetensors(twin, {{"inputs", st.tensors.at("inputs").slice(0, 0, 192).contiguous()},
                                       {"labels", st.tensors.at("labels").slice(0, 0, 192).contiguous()}});
  nlohmann::json metrics[2];
  const std::string files[2] = {fixtures + "cnn_bn_data.h5", twin};
  for (int i = 0; i < 2; ++i) {
    const fs::path out = dir.path / ("run" + std::to_string(i));
    const QtrainRun run = qtrain(std::string(kRecipe) + " --out " + out.string() + " --set data.file=" + files[i] +
                                 " --set data.validation_size=64 --set calibrate.batches=4");
    ASSERT_EQ(run.code, 0) << run.output;
    std::ifstream in(out / "report.json");
    metrics[i] = nlohmann::json::parse(in)["metrics"];
  }
  EXPECT_EQ(metrics[0]["float"]["accuracy"].get<double>(), 1.0);
  EXPECT_EQ(metrics[0].dump(), metrics[1].dump());

  const auto expect_error = [&](const std::string& name, const std::string& file, const std::string& message) {
    const QtrainRun bad = qtrain(std::string(kRecipe) + " --out " + (dir.path / name).string() + " --set data.file=" + file);
    EXPECT_NE(bad.code, 0) << file;
    EXPECT_NE(bad.output.find(message), std::string::npos) << file << "\n" << bad.output;
  };
  expect_error("earliest", fixtures + "cnn_bn_data_earliest.h5", "libver");
  // A crash of the HDF5 library on a crafted data file ends the forked reader only
  // (QFORGE_TEST_CRASH_READING: opening exactly that file raises SIGSEGV, docs/formats.md).
  ::setenv("QFORGE_TEST_CRASH_READING", files[0].c_str(), 1);
  expect_error("crash", files[0], "crashed the HDF5 library");
  ::unsetenv("QFORGE_TEST_CRASH_READING");
  const std::string text = (dir.path / "data.txt").string();
  std::ofstream(text) << "inputs,labels\n0.5,1\n";
  expect_error("text", text, "is neither an HDF5 file (no HDF5 signature) nor a safetensors file");
}

// A folder of images (torchvision's ImageFolder layout, make_fixtures.py's 160 Fashion-MNIST test
// images as grey PNGs, class folders "<label>_<name>"): the held-out images are the seeded pick
// the doc states, and the float model's accuracy on them equals its accuracy on the same
// Fashion-MNIST test images read from the IDX files (PNG is lossless: the same pixels, / 255).
// Mistakes in the data section are refused at their key.
TEST(TorchScriptRecipe, ImageFolderReadsThePixelsOfTheIdxImages) {
  OutDir dir("images");
  const char* recipe = "--recipe recipes/torchscript_image_folder_int8.yaml";
  const QtrainRun run = qtrain(std::string(recipe) + " --out " + dir.path.string());
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  // The ImageFolder order: by label, then by test index (the file names).
  const auto [x, y] = fashion_mnist_test(160);
  std::vector<int64_t> files;
  for (int64_t label = 0; label < 10; ++label)
    for (int64_t i = 0; i < 160; ++i)
      if (y[i].item<int64_t>() == label) files.push_back(i);
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(0);  // the recipe's seed
  const at::Tensor order = at::randperm(160, g, at::kLong);
  const at::Tensor held = at::tensor(files, at::kLong).index_select(0, order.slice(0, 96));
  qforge::jit::ScriptedModel m =
      qforge::jit::load_torchscript(std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/torchscript/fmnist_cnn_scripted.pt");
  m->eval();
  torch::NoGradGuard no_grad;
  const double accuracy =
      m->forward(x.index_select(0, held)).argmax(1).eq(y.index_select(0, held)).to(at::kDouble).mean().item<double>();
  EXPECT_EQ(r["metrics"]["float"]["accuracy"].get<double>(), accuracy);
  EXPECT_GE(r["metrics"]["frozen"]["accuracy"].get<double>(), accuracy - 0.05) << r["metrics"].dump();
  EXPECT_TRUE(fs::exists(dir.path / "model.pt"));

  const auto expect_error = [&](const std::string& set, const std::string& message) {
    const QtrainRun bad = qtrain(std::string(recipe) + " --out " + (dir.path / "bad").string() + " " + set);
    EXPECT_NE(bad.code, 0) << set;
    EXPECT_NE(bad.output.find(message), std::string::npos) << set << "\n" << bad.output;
  };
  expect_error("--set model.input_shape=[2,28,28]", "model.input_shape: data.dataset images needs it as [C, H, W]");
  expect_error("--set model.input_shape=[1,32,32]", "is 28 x 28 (height x width), the model takes 32 x 32");
  expect_error("--set data.mean=[0.5]", "data.mean: is given without data.std");
  expect_error("--set data.mean=[0.5,0.5] --set data.std=[0.2,0.2]", "data.mean: needs one value per channel (1");
  expect_error("--set data.folder=" + (dir.path / "nowhere").string(), "is not a folder");
  expect_error("--set data.dataset=tensors --set data.file=x.safetensors", "data.folder: is read by data.dataset images only");
  // An image format qforge does not decode is named, not skipped.
  const fs::path folder = dir.path / "folder";
  fs::create_directories(folder / "a");
  fs::copy_file(std::string(QFORGE_SOURCE_DIR) + "/tests/fixtures/torchscript/fmnist_images/0_T-shirt/0019.png",
                folder / "a" / "0019.png");
  std::ofstream(folder / "a" / "x.bmp") << "BM";
  expect_error("--set data.folder=" + folder.string(), "x.bmp is a bmp image; qforge reads PNG and JPEG images only");
  // A decoder crash (the test seam: opening exactly that file raises SIGSEGV) ends the forked
  // decoder only, and the error names the file it was decoding.
  fs::remove(folder / "a" / "x.bmp");
  const std::string png = (folder / "a" / "0019.png").string();
  ::setenv("QFORGE_TEST_CRASH_READING", png.c_str(), 1);
  expect_error("--set data.folder=" + folder.string(), "crashed libpng / libjpeg");
  expect_error("--set data.folder=" + folder.string(), "(while decoding " + png + ")");
  ::unsetenv("QFORGE_TEST_CRASH_READING");
  // As many class folders as the model has logits, checked before anything runs.
  fs::create_directories(folder / "b");
  fs::copy_file(folder / "a" / "0019.png", folder / "b" / "0019.png");
  expect_error("--set data.folder=" + folder.string() + " --set data.validation_size=1",
               "gives logits [1, 10] on 1 images of data.folder " + folder.string() + ", which has 2 class folders");
}

// The built-in language-ID data reaches a scripted classifier (make_fixtures.py's TinyEncoder
// trained in PyTorch on what qtrain --export-data writes for recipes/bert_int8.yaml): the report's
// frozen accuracy is model.pt's on the same test phrases (exported by the TorchScript recipe
// itself), and a vocabulary the model's table does not cover, a causal LM task and an input shape
// are refused with what was expected.
TEST(TorchScriptRecipe, LanguageIdDataReachesAScriptedClassifier) {
  OutDir dir("langid");
  const char* recipe = "--recipe recipes/torchscript_langid_int8.yaml";
  const QtrainRun run = qtrain(std::string(recipe) + " --out " + (dir.path / "run").string());
  ASSERT_EQ(run.code, 0) << run.output;
  std::ifstream in(dir.path / "run" / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  const double fp = r["metrics"]["float"]["accuracy"].get<double>();
  const double frozen = r["metrics"]["frozen"]["accuracy"].get<double>();
  std::printf("language ID: float %.4f, frozen W8A8 %.4f (majority class %.4f)\n", fp, frozen,
              r["baselines"]["majority_class_accuracy"].get<double>());
  EXPECT_GE(fp, 0.85);  // trained briefly in PyTorch (91 % on all 8000 test phrases)
  EXPECT_GE(frozen, fp - 0.01) << r["metrics"].dump();
  const std::string data = (dir.path / "langid.safetensors").string();
  const QtrainRun exported = qtrain(std::string(recipe) + " --export-data " + data);
  ASSERT_EQ(exported.code, 0) << exported.output;
  const auto f = qforge::io::read_safetensors(data);
  EXPECT_EQ(f.metadata.at("class_names"), "English,French,German,Italian,Spanish,Portuguese,Dutch,Swedish");
  const at::Tensor x = f.tensors.at("test.inputs").slice(0, 0, 2000), y = f.tensors.at("test.labels").slice(0, 0, 2000);
  qforge::jit::ScriptedModel m = qforge::jit::load_torchscript((dir.path / "run" / "model.pt").string());
  m->eval();
  {
    torch::NoGradGuard no_grad;
    EXPECT_NEAR(m->forward(x).argmax(1).eq(y).to(at::kDouble).mean().item<double>(), frozen, 1e-9);
  }
  const auto expect_error = [&](const std::string& set, const std::string& message) {
    const QtrainRun bad = qtrain(std::string(recipe) + " --out " + (dir.path / "bad").string() + " " + set);
    EXPECT_NE(bad.code, 0) << set;
    EXPECT_NE(bad.output.find(message), std::string::npos) << set << "\n" << bad.output;
  };
  expect_error("--set data.tokens=trigrams", "token ids with data.tokens trigrams; id 0 is padding");
  expect_error("--set data.seq_len=48", "a forward on 48 ids (data.seq_len) of 1391, the largest id");
  // Other data settings build other ids: the run completes, and says the model is no better than
  // the commonest class.
  const QtrainRun other = qtrain(std::string(recipe) + " --out " + (dir.path / "other").string() +
                                 " --set data.examples_per_language=4000 --stages float");
  ASSERT_EQ(other.code, 0) << other.output;
  EXPECT_NE(other.output.find("is no better than always answering the commonest class"), std::string::npos)
      << other.output;
  expect_error("--set model.task=causal_lm", "causal_lm reads token ids (data.dataset fortunes or tensors), not langid");
  expect_error("--set model.input_shape=[32]", "langid phrases are padded to each batch's longest");
}
