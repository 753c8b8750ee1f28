// The TorchScript front door on a torchvision-style net (scripts/torchscript/make_fixtures.py's
// BnCnn): eval-mode BatchNorms after convolutions are folded into them, and the script's other
// parameters and buffers (a BatchNorm after a Linear, a bare nn.Parameter) are the model's own:
// parameters(), to(), io::save_model / load_model.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <filesystem>
#include <set>

#include "framework/api/quantize.h"
#include "framework/io/model_io.h"
#include "framework/jit/scripted_model.h"
#include "tests/jit/jit_test_util.h"

using qforge::jit::ScriptedModel;
using qforge::jit_test::fixture;
using qforge::jit_test::w8a8;

namespace {

at::Tensor image_batch(int64_t batch) { return torch::randn({batch, 1, 14, 14}); }

// |a - b| <= tol * max|b|, element-wise.
bool close(const at::Tensor& a, const at::Tensor& b, float tol) {
  return (a - b).abs().max().item<float>() <= tol * b.abs().max().item<float>();
}

using Names = std::set<std::string>;

Names keys(const torch::OrderedDict<std::string, at::Tensor>& d) {
  Names out;
  for (const auto& item : d) out.insert(item.key());
  return out;
}

}  // namespace

TEST(TorchScriptBatchNorm, EvalBatchNormsAfterConvolutionsAreFoldedAndTheOthersListed) {
  torch::manual_seed(11);
  for (const char* name : {"cnn_bn_scripted", "cnn_bn_traced"}) {
    SCOPED_TRACE(name);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(name));
    std::vector<std::string> paths;
    for (const auto& l : m->layers()) paths.push_back(l->path());
    EXPECT_EQ(paths, (std::vector<std::string>{"stem.0", "block.0", "mix", "fc"}));
    using Fold = std::pair<std::string, std::string>;
    EXPECT_EQ(m->folded(), (std::vector<Fold>{{"stem.1", "stem.0"}, {"block.1", "block.0"}, {"mix_bn", "mix"}}));
    // A conv without bias gets one: the folded (b - mean) * gamma / sqrt(var + eps) + beta.
    EXPECT_TRUE(m->layers()[0]->spec().bias);
    ASSERT_EQ(m->kept_float().size(), 1u);
    EXPECT_EQ(m->kept_float()[0].name, "head_bn");
    EXPECT_EQ(m->kept_float()[0].op, "aten::batch_norm");
    EXPECT_NE(m->describe().find("folded  stem.1  aten::batch_norm into stem.0"), std::string::npos);

    // LibTorch's own BatchNorm on the same file is the reference (folding reorders the float sums).
    torch::jit::Module original = torch::jit::load(fixture(name));
    original.eval();
    m->eval();
    torch::NoGradGuard no_grad;
    const at::Tensor x = image_batch(6);
    const at::Tensor want = original.forward({x}).toTensor();
    EXPECT_TRUE(close(m->forward(x), want, 1e-5f));
    EXPECT_FALSE(torch::equal(want, original.forward({2 * x}).toTensor()));  // the check can fail

    // Quantized fully: every convolution has quantizers, no BatchNorm left between them.
    const qforge::QuantizeReport r = qforge::quantize(*m, w8a8());
    EXPECT_EQ(r.quantized.size(), 4u);
  }
}

TEST(TorchScriptBatchNorm, AModuleSavedInTrainingModeKeepsItsBatchNormsFloat) {
  torch::jit::Module script = torch::jit::load(fixture("cnn_bn_scripted"));
  script.train();
  qforge::jit_test::TempDir dir;
  const std::string file = (dir.path / "train_mode.pt").string();
  script.save(file);
  ScriptedModel m = qforge::jit::load_torchscript(file);
  EXPECT_TRUE(m->folded().empty());
  ASSERT_EQ(m->kept_float().size(), 4u);
  EXPECT_EQ(m->kept_float()[0].name, "stem.1");
  EXPECT_NE(m->kept_float()[0].reason.find("training mode uses batch statistics"), std::string::npos);
  // Training mode on both sides: batch statistics, bit for bit (nothing was folded).
  torch::manual_seed(12);
  const at::Tensor x = image_batch(4);
  torch::jit::Module reference = torch::jit::load(file);
  EXPECT_TRUE(reference.is_training());
  EXPECT_TRUE(torch::equal(m->forward(x), reference.forward({x}).toTensor()));
}

TEST(TorchScriptBatchNorm, ScriptParametersAndBuffersTheForwardReadsAreTheModelsOwn) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture("cnn_bn_traced"));
  const Names params = keys(m->named_parameters());
  const Names buffers = keys(m->named_buffers());
  for (const char* p : {"gain", "head_bn.weight", "head_bn.bias", "stem.0.weight", "stem.0.bias", "fc.weight"})
    EXPECT_TRUE(params.count(p)) << p;
  for (const char* b : {"head_bn.running_mean", "head_bn.running_var"}) EXPECT_TRUE(buffers.count(b)) << b;
  // The folded BatchNorms' tensors are no longer read: not parameters of the model.
  for (const char* p : {"stem.1.weight", "block.1.bias", "mix_bn.weight"}) EXPECT_FALSE(params.count(p)) << p;
  for (const char* b : {"stem.1.running_mean", "mix_bn.running_var"}) EXPECT_FALSE(buffers.count(b)) << b;
  // The same tensors as the script's, not copies.
  EXPECT_EQ(m->named_parameters()["gain"].unsafeGetTensorImpl(),
            m->script().attr("gain").toTensor().unsafeGetTensorImpl());
  const at::Tensor head_mean = m->script().attr("head_bn").toModule().attr("running_mean").toTensor();
  EXPECT_EQ(m->named_buffers()["head_bn.running_mean"].unsafeGetTensorImpl(), head_mean.unsafeGetTensorImpl());
  // trainable_parameters reaches gain and head_bn; to(kFloat) keeps integer buffers integer.
  std::set<const c10::TensorImpl*> trainable;
  for (const at::Tensor& p : m->trainable_parameters()) trainable.insert(p.unsafeGetTensorImpl());
  EXPECT_TRUE(trainable.count(m->named_parameters()["gain"].unsafeGetTensorImpl()));
  EXPECT_TRUE(trainable.count(m->named_parameters()["head_bn.weight"].unsafeGetTensorImpl()));
  m->to(torch::kFloat);
  for (const auto& b : m->named_buffers()) {
    if (b.key().find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(b.value().scalar_type(), at::kLong) << b.key();
    }
  }
}

TEST(TorchScriptBatchNorm, CheckpointRoundTripKeepsTheScriptsOwnTensors) {
  torch::manual_seed(13);
  ScriptedModel m = qforge::jit::load_torchscript(fixture("cnn_bn_scripted"));
  qforge::quantize(*m, w8a8());
  {
    qforge::Calibration calib(*m);
    m->forward(image_batch(8));
  }
  {
    // What training would change outside the qforge layers.
    torch::NoGradGuard no_grad;
    m->named_parameters()["gain"].mul_(1.5);
    m->named_buffers()["head_bn.running_mean"].add_(0.25);
  }
  qforge::freeze(*m);
  m->eval();
  qforge::jit_test::TempDir dir;
  const std::string file = (dir.path / "cnn_bn.h5").string();
  qforge::io::save_model(*m, file);

  ScriptedModel fresh = qforge::jit::load_torchscript(fixture("cnn_bn_scripted"));
  fresh->eval();
  const at::Tensor x = image_batch(3);
  EXPECT_FALSE(torch::equal(fresh->forward(x), m->forward(x)));
  qforge::io::load_model(*fresh, file);
  EXPECT_TRUE(torch::equal(fresh->named_parameters()["gain"], m->named_parameters()["gain"]));
  EXPECT_TRUE(torch::equal(fresh->script().attr("head_bn").toModule().attr("running_mean").toTensor(),
                           m->named_buffers()["head_bn.running_mean"]));
  EXPECT_TRUE(torch::equal(fresh->forward(x), m->forward(x)));
}
