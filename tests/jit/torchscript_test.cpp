// The TorchScript front door: models scripted and traced in PyTorch (scripts/torchscript/
// make_fixtures.py) are rewritten, quantized, calibrated, trained one QAT step, frozen, saved as
// TorchScript and loaded again in C++ (the Python load is torchscript_python_test).
#include <gtest/gtest.h>

#include <torch/script.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>

#include "framework/api/quantize.h"
#include "framework/api/quantizer.h"
#include "framework/io/model_io.h"
#include "framework/jit/scripted_model.h"
#include "tests/error_of.h"
#include "tests/jit/jit_test_util.h"

namespace fs = std::filesystem;
using qforge::jit::ScriptedModel;
using qforge::jit_test::fixture;
using qforge::jit_test::layer_paths;
using qforge::jit_test::TempDir;
using qforge::jit_test::w8a8;

namespace {

at::Tensor input_for(const std::string& name, int64_t batch) {
  return name.rfind("cnn", 0) == 0 ? torch::randn({batch, 1, 14, 14}) : torch::randn({batch, 32});
}

// The tensor the TorchScript module holds at `owner`.`attr`.
at::Tensor script_attr(ScriptedModel& m, const qforge::jit::TensorHome& home) {
  torch::jit::Module owner = m->script();
  std::stringstream path(home.owner);
  for (std::string name; std::getline(path, name, '.');) owner = owner.attr(name).toModule();
  return owner.attr(home.weight).toTensor();
}

// The layer's weight is the script's tensor itself, or (x @ W) its transpose over the same storage.
void expect_bound(const at::Tensor& weight, const at::Tensor& script_tensor, bool transposed, const std::string& path) {
  if (!transposed) {
    EXPECT_EQ(weight.unsafeGetTensorImpl(), script_tensor.unsafeGetTensorImpl()) << path;
    return;
  }
  EXPECT_EQ(weight.data_ptr(), script_tensor.data_ptr()) << path;
  EXPECT_TRUE(at::equal(weight.t(), script_tensor)) << path;
}

}  // namespace

TEST(TorchScript, RewriteFindsEveryLinearAndConvAndListsFloatCalls) {
  for (const char* form : {"_scripted", "_traced"}) {
    SCOPED_TRACE(form);
    ScriptedModel cnn = qforge::jit::load_torchscript(fixture(std::string("cnn") + form));
    EXPECT_EQ(layer_paths(cnn), (std::vector<std::string>{"features.0", "features.2", "mix", "fc"}));
    EXPECT_EQ(cnn->layers()[2]->spec().kind, qforge::jit::LayerKind::kConv1d);
    EXPECT_EQ(cnn->layers()[1]->spec().stride, (std::vector<int64_t>{2, 2}));
    EXPECT_TRUE(cnn->kept_float().empty());

    ScriptedModel mlp = qforge::jit::load_torchscript(fixture(std::string("mlp") + form));
    // h @ mix (mix stored [in, out]) is a Linear holding mix's transpose.
    EXPECT_EQ(layer_paths(mlp), (std::vector<std::string>{"fc1", "fc2", "mix", "head_weight"}));
    EXPECT_FALSE(mlp->layers()[1]->spec().bias);
    EXPECT_TRUE(mlp->layers()[2]->spec().weight_transposed);
    EXPECT_TRUE(mlp->kept_float().empty()) << mlp->describe();
    // The qforge layers are registered under their module paths: the module walk sees them.
    EXPECT_EQ(qforge::quantizable_layers(*mlp).size(), 4u);
    // Each qforge layer's weight is the TorchScript module's own parameter, not a copy (for x @ W,
    // a transposed view of it).
    for (ScriptedModel* m : {&cnn, &mlp})
      for (const auto& l : (*m)->layers())
        expect_bound(l->weight(), script_attr(*m, l->home()), l->spec().weight_transposed, l->path());
  }
}

TEST(TorchScript, RewrittenFloatForwardEqualsTheOriginalBitForBit) {
  torch::manual_seed(1);
  for (const char* name : {"cnn_scripted", "cnn_traced", "mlp_scripted", "mlp_traced"}) {
    SCOPED_TRACE(name);
    torch::jit::Module original = torch::jit::load(fixture(name));
    ScriptedModel rewritten = qforge::jit::load_torchscript(fixture(name));
    original.eval();
    rewritten->eval();
    // Another batch size than the trace's example.
    const at::Tensor x = input_for(name, 5);
    EXPECT_TRUE(torch::equal(original.forward({x}).toTensor(), rewritten->forward(x)));
  }
}

// A module whose forward already ran would keep running its compiled float graph after the
// rewrite, so only load_torchscript (a fresh load) can make a ScriptedModel.
static_assert(!std::is_constructible_v<qforge::jit::ScriptedModelImpl, torch::jit::Module>);
static_assert(!std::is_constructible_v<qforge::jit::ScriptedModelImpl::FreshlyLoaded>);

TEST(TorchScript, MovingAScriptedModelOffTheCpuOrFloat32IsRefused) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture("cnn_scripted"));
  EXPECT_NE(qforge::testing::error_of([&] { m->to(torch::kDouble); }).find("stays on the CPU in float32"),
            std::string::npos);
  EXPECT_NE(qforge::testing::error_of([&] { m->to(torch::Device("cuda:0")); }).find("stays on the CPU"),
            std::string::npos);
  m->to(torch::kCPU);  // where it is: allowed
  m->to(torch::kFloat);
  for (const at::Tensor& p : m->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
}

TEST(TorchScript, SchemeRulesByModulePathApply) {
  ScriptedModel cnn = qforge::jit::load_torchscript(fixture("cnn_scripted"));
  qforge::Scheme s = w8a8();
  s.rules.push_back({"features.*", /*keep_float=*/true});
  const qforge::QuantizeReport r = qforge::quantize(*cnn, s);
  std::vector<std::string> quantized;
  for (const auto& e : r.quantized) quantized.push_back(e.path);
  EXPECT_EQ(quantized, (std::vector<std::string>{"mix", "fc"}));
  EXPECT_FALSE(cnn->layers()[0]->layer().quantized());
}

namespace {

// quantize -> calibrate -> one QAT step -> freeze; returns the frozen model's output on x.
// *fake_quant: the output on x in eval mode just before freeze.
at::Tensor quantize_train_freeze(ScriptedModel& m, const std::string& name, const at::Tensor& x, at::Tensor* fake_quant) {
  qforge::quantize(*m, w8a8());
  {
    qforge::Calibration calib(*m);
    for (int i = 0; i < 4; ++i) m->forward(input_for(name, 8));
  }
  // One SGD step over the TorchScript module's own parameters lowers the loss on its batch.
  qforge::QatController qat(*m, {/*freeze_observers_after=*/0});
  qat.begin_epoch();
  const at::Tensor batch = input_for(name, 16);
  const at::Tensor labels = torch::randint(0, 10, {16});
  torch::optim::SGD opt(m->trainable_parameters(), torch::optim::SGDOptions(0.05));
  torch::jit::Module owner = name.rfind("cnn", 0) == 0 ? m->script() : m->script().attr("fc1").toModule();
  const at::Tensor script_w = name.rfind("cnn", 0) == 0 ? owner.attr("fc").toModule().attr("weight").toTensor()
                                                        : owner.attr("weight").toTensor();
  const at::Tensor before = script_w.detach().clone();
  const at::Tensor loss0 = torch::nn::functional::cross_entropy(m->forward(batch), labels);
  opt.zero_grad();
  loss0.backward();
  opt.step();
  qat.step();
  const at::Tensor loss1 = torch::nn::functional::cross_entropy(m->forward(batch), labels);
  EXPECT_LT(loss1.item<float>(), loss0.item<float>());
  EXPECT_FALSE(torch::equal(before, script_w));
  m->eval();
  {
    torch::NoGradGuard no_grad;
    *fake_quant = m->forward(x);
  }
  qforge::freeze(*m);
  for (const auto& l : m->layers()) {
    EXPECT_TRUE(l->layer().frozen()) << l->path();
    EXPECT_EQ(l->layer().plan().path, qforge::LinearPath::kS8Static) << l->path();
  }
  return m->forward(x);
}

}  // namespace

TEST(TorchScript, QuantizeCalibrateQatStepFreezeSaveAndLoadInCpp) {
  // Where torchscript_python_test finds the frozen files and their inputs and outputs.
  const char* out_dir = std::getenv("QFORGE_TORCHSCRIPT_OUT");
  TempDir tmp;
  for (const char* name : {"cnn_scripted", "cnn_traced", "mlp_scripted", "cnn_bn_scripted"}) {
    SCOPED_TRACE(name);
    torch::manual_seed(2);
    ScriptedModel m = qforge::jit::load_torchscript(fixture(name));
    const at::Tensor x = input_for(name, 3);
    at::Tensor fake_quant;
    const at::Tensor frozen = quantize_train_freeze(m, name, x, &fake_quant);
    // The integer kernels compute what fake-quant computed before freeze, up to float summation order.
    EXPECT_FALSE(torch::equal(frozen, qforge::jit::load_torchscript(fixture(name))->forward(x)));
    EXPECT_LE((frozen - fake_quant).abs().max().item<float>(), 1e-5f * fake_quant.abs().max().item<float>());
    const qforge::ModelSize size = qforge::model_size(*m);
    EXPECT_GT(size.quantized_bytes, 0);

    const std::string path = (tmp.path / (std::string(name) + "_frozen.pt")).string();
    m->save(path);
    // The float weights of frozen layers are gone from the TorchScript module.
    for (const auto& l : m->layers()) EXPECT_EQ(script_attr(m, l->home()).numel(), 0) << l->path();

    ScriptedModel loaded = qforge::jit::load_torchscript(path);
    EXPECT_EQ(layer_paths(loaded), layer_paths(m));
    for (const auto& l : loaded->layers()) EXPECT_TRUE(l->layer().frozen()) << l->path();
    EXPECT_EQ(qforge::model_size(*loaded).quantized_bytes, size.quantized_bytes);
    loaded->eval();
    EXPECT_TRUE(torch::equal(loaded->forward(x), frozen));
    // A plain torch::jit::load runs it too (the qforge library is linked into this binary).
    torch::jit::Module plain = torch::jit::load(path);
    plain.eval();
    EXPECT_TRUE(torch::equal(plain.forward({x}).toTensor(), frozen));

    if (out_dir != nullptr) {
      fs::create_directories(out_dir);
      fs::copy_file(path, fs::path(out_dir) / fs::path(path).filename(), fs::copy_options::overwrite_existing);
      const std::vector<char> io = torch::pickle_save(c10::ivalue::Tuple::create({x, frozen}));
      std::ofstream(fs::path(out_dir) / (std::string(name) + "_io.pt"), std::ios::binary).write(io.data(), io.size());
    }
  }
}

// LSQ through a TorchScript model: the learnable steps (weight and input) exist after the first
// training forward, trainable_parameters() hands them to the optimizer with the script's own
// weights, a few SGD steps move both and lower the loss, and the frozen model computes what the
// LSQ fake-quant model computed, saved and loaded bit for bit.
TEST(TorchScript, LsqQatLearnsTheStepsThroughTheScriptThenFreezes) {
  const std::string name = "cnn_scripted";
  torch::manual_seed(2);
  ScriptedModel m = qforge::jit::load_torchscript(fixture(name));
  qforge::Scheme s = w8a8();
  s.weight_lsq = true;
  s.activation_lsq = true;
  qforge::quantize(*m, s);
  {
    qforge::Calibration calib(*m);
    for (int i = 0; i < 4; ++i) m->forward(input_for(name, 8));
  }
  qforge::QatController qat(*m, {/*freeze_observers_after=*/0});
  qat.begin_epoch();
  m->train();
  const at::Tensor batch = input_for(name, 16), labels = torch::randint(0, 10, {16});
  m->forward(batch);  // the first training forward creates the LSQ steps
  std::vector<std::pair<std::string, at::Tensor>> steps;
  for (const auto& l : m->layers())
    for (const auto& p : l->module()->named_parameters())
      if (p.key().find("quantizer.scale") != std::string::npos) steps.emplace_back(l->path() + "." + p.key(), p.value());
  ASSERT_GE(steps.size(), 2 * m->layers().size()) << "a weight step and an input step per layer";
  std::vector<at::Tensor> before;
  for (const auto& [key, t] : steps) before.push_back(t.detach().clone());
  const std::vector<at::Tensor> params = m->trainable_parameters();
  for (const auto& [key, t] : steps)
    EXPECT_TRUE(std::any_of(params.begin(), params.end(), [&](const at::Tensor& p) { return p.is_same(t); })) << key;
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.002));
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    const at::Tensor loss = torch::nn::functional::cross_entropy(m->forward(batch), labels);
    opt.zero_grad();
    loss.backward();
    opt.step();
    qat.step();
    if (i == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_LT(last, first);
  int moved = 0;
  for (size_t i = 0; i < steps.size(); ++i) moved += torch::equal(before[i], steps[i].second.detach()) ? 0 : 1;
  EXPECT_EQ(moved, static_cast<int>(steps.size())) << "every LSQ step learns";
  m->eval();
  const at::Tensor x = input_for(name, 3);
  at::Tensor fake_quant;
  {
    torch::NoGradGuard no_grad;
    fake_quant = m->forward(x);
  }
  qforge::freeze(*m);
  torch::NoGradGuard no_grad;
  const at::Tensor frozen = m->forward(x);
  EXPECT_LE((frozen - fake_quant).abs().max().item<float>(), 1e-5f * fake_quant.abs().max().item<float>());
  TempDir tmp;
  const std::string path = (tmp.path / "lsq_frozen.pt").string();
  m->save(path);
  ScriptedModel loaded = qforge::jit::load_torchscript(path);
  loaded->eval();
  EXPECT_TRUE(torch::equal(loaded->forward(x), frozen));
}

TEST(TorchScript, MissingOrForeignFilesAreNamed) {
  EXPECT_NE(qforge::testing::error_of([] { qforge::jit::load_torchscript("/nonexistent/m.pt"); })
                .find("no TorchScript file at /nonexistent/m.pt"),
            std::string::npos);
  TempDir tmp;
  const std::string path = (tmp.path / "foreign.pt").string();
  std::ofstream(path) << "not a zip archive";
  EXPECT_NE(qforge::testing::error_of([&] { qforge::jit::load_torchscript(path); })
                .find("foreign.pt is not a TorchScript file"),
            std::string::npos);
}

TEST(TorchScript, DamagedPickledLayersAreRefused) {
  qforge::jit::LayerSpec spec;
  spec.in = 4;
  spec.out = 2;
  const std::string damaged = qforge::testing::error_of([&] {
    qforge::jit::ScriptedLayer::from_state({{"fc", "", "weight", ""}, spec.to_ints(), at::zeros({64}, at::kByte)});
  });
  EXPECT_NE(damaged.find("qforge-jit-"), std::string::npos) << damaged;  // the checkpoint's error, naming its file
  EXPECT_NE(qforge::testing::error_of([] { qforge::jit::LayerSpec::from_ints({1, 2, 4, 8, 1, 1}); })
                .find("Conv2d options have 6 values, expected 14"),
            std::string::npos);
}

TEST(TorchScript, CraftedLayerStatesAreRefusedBeforeTheLayerIsBuilt) {
  using qforge::jit::LayerSpec;
  using qforge::testing::error_of;
  const auto refused = [](std::vector<int64_t> ints, const std::string& why) {
    const std::string e = error_of([&] { LayerSpec::from_ints(ints); });
    EXPECT_NE(e.find(why), std::string::npos) << e;
  };
  refused({1, 2, 4, 8, 0, 1, 3, 3, 1, 1, 0, 0, 1, 1}, "Conv2d has groups 0");
  refused({1, 2, 4, 8, 3, 1, 3, 3, 1, 1, 0, 0, 1, 1}, "not divisible by groups 3");
  refused({1, 1, 4, 8, 1, 1, 0, 1, 0, 1}, "Conv1d has kernel [0]");
  refused({1, 1, 4, 8, 1, 1, 3, 1, -1, 1}, "padding [-1]");
  refused({1, 0, int64_t{1} << 40, 8, 1, 1}, "must lie in [1, ");
  refused({1, 0, int64_t{1} << 24, int64_t{1} << 24, 1, 1}, "elements");
  refused({1, 0, 4, 2, 2, 1}, "Linear has groups 2");
  refused({qforge::jit::kLayerStateVersion + 1, 0, 4, 2, 1, 1}, "written by a newer qforge (format 4");
  // A MatMul (format 3): no options, no weight.
  EXPECT_EQ(LayerSpec::from_ints({3, 4, 0, 0, 1, 0, 0}).kind, qforge::jit::LayerKind::kMatMul);
  EXPECT_TRUE(LayerSpec::from_ints({3, 4, 0, 0, 1, 0, 0}).weight_shape().empty());
  refused({2, 4, 0, 0, 1, 0, 0}, "MatMul layers exist from format 3");
  refused({3, 4, 4, 2, 1, 0, 0}, "pickled MatMul has layer options");
  refused({3, 4, 0, 0, 1, 1, 0}, "pickled MatMul has layer options");
  refused({2, 0, 4, 2, 1, 1, 2}, "Linear has weight_transposed 2");
  refused({2, 3, 4, 2, 1, 0, 1, 1}, "Embedding has a transposed weight");
  EXPECT_TRUE(LayerSpec::from_ints({2, 0, 4, 2, 1, 1, 1}).weight_transposed);
  EXPECT_FALSE(LayerSpec::from_ints({1, 0, 4, 2, 1, 1}).weight_transposed);  // format 1 files load
  refused({0, 0, 4, 2, 1, 1}, "no format version");
  refused({1, 7, 4, 2, 1, 1}, "unknown kind");
  refused({3, 5, 0, 0, 1, 0, 0}, "unknown kind");
  refused({1, 3, 4, 2, 1, 0, 4}, "Embedding has padding_idx 4 for 4 rows");
  refused({1, 3, 4, 2, 1, 0, -2}, "Embedding has padding_idx -2 for 4 rows");
  refused({1, 3, 4, 2, 1, 0}, "Embedding options have 6 values, expected 7");
  refused({1, 3, 4, 2, 1, 1, -1}, "Embedding has a bias");
  EXPECT_EQ(LayerSpec::from_ints({1, 3, 4, 2, 1, 0, 3}).padding_idx, 3);

  // A spec that disagrees with its checkpoint's weight (here 2^30 floats) is refused before the
  // layer is built; the checkpoint's own spec loads.
  LayerSpec spec;
  spec.in = 4;
  spec.out = 2;
  const auto layer = c10::make_intrusive<qforge::jit::ScriptedLayer>(
      "fc", spec, qforge::jit::TensorHome{"", "weight", ""}, at::Tensor(), at::Tensor());
  auto [names, ints, data] = layer->state();
  EXPECT_EQ(ints.front(), 2);  // format 3 only for a MatMul: older qforge builds read the rest
  EXPECT_NO_THROW(qforge::jit::ScriptedLayer::from_state({names, ints, data}));
  ints[2] = int64_t{1} << 15;
  ints[3] = int64_t{1} << 15;
  const std::string e = error_of([&] { qforge::jit::ScriptedLayer::from_state({names, ints, data}); });
  EXPECT_NE(e.find("declares a weight of shape [32768, 32768] but its checkpoint holds [2, 4]"), std::string::npos)
      << e;
}

TEST(TorchScript, QforgeCheckpointOfAFrozenScriptedModelLoadsIntoAFreshlyLoadedOne) {
  torch::manual_seed(3);
  ScriptedModel m = qforge::jit::load_torchscript(fixture("cnn_traced"));
  qforge::quantize(*m, w8a8());
  {
    qforge::Calibration calib(*m);
    m->forward(input_for("cnn", 8));
  }
  qforge::freeze(*m);
  TempDir tmp;
  const std::string path = (tmp.path / "cnn.h5").string();
  qforge::io::save_model(*m, path);
  ScriptedModel fresh = qforge::jit::load_torchscript(fixture("cnn_traced"));
  const qforge::io::LoadReport r = qforge::io::load_model(*fresh, path);
  EXPECT_EQ(r.frozen_layers, layer_paths(m));
  const at::Tensor x = input_for("cnn", 2);
  EXPECT_TRUE(torch::equal(fresh->forward(x), m->forward(x)));
}

namespace {

// The MLP quantized w8a8, calibrated on one batch (not frozen), in eval mode, saved at `path`.
ScriptedModel save_calibrated_mlp(const std::string& path) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture("mlp_traced"));
  qforge::quantize(*m, w8a8());
  {
    qforge::Calibration calib(*m);
    m->forward(input_for("mlp", 8));
  }
  m->eval();
  m->save(path);
  return m;
}

}  // namespace

TEST(TorchScript, CalibratedModelSavedBeforeFreezeLoadsBackTrainable) {
  torch::manual_seed(4);
  TempDir tmp;
  const std::string path = (tmp.path / "calibrated.pt").string();
  ScriptedModel m = save_calibrated_mlp(path);
  ScriptedModel loaded = qforge::jit::load_torchscript(path);
  loaded->eval();
  const at::Tensor x = input_for("mlp", 3);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(loaded->forward(x), m->forward(x)));
  for (const auto& l : loaded->layers()) {
    EXPECT_TRUE(l->layer().quantized() && !l->layer().frozen()) << l->path();
    // Bound to the loaded TorchScript module's parameters again: training those trains the layer.
    expect_bound(l->weight(), script_attr(loaded, l->home()), l->spec().weight_transposed, l->path());
  }
}

TEST(TorchScript, TrainAndEvalOfAPlainlyLoadedFileReachTheQforgeLayers) {
  torch::manual_seed(5);
  TempDir tmp;
  const std::string path = (tmp.path / "calibrated.pt").string();
  ScriptedModel m = save_calibrated_mlp(path);
  // Inputs far outside the calibrated range: a layer left in training mode would observe them.
  const at::Tensor x = 10 * input_for("mlp", 3);
  torch::NoGradGuard no_grad;
  const at::Tensor expected = m->forward(x);
  torch::jit::Module plain = torch::jit::load(path);
  plain.eval();
  EXPECT_TRUE(torch::equal(plain.forward({x}).toTensor(), expected));
  const auto layers = qforge::jit::rewritten_layers(plain);
  ASSERT_FALSE(layers.empty());
  for (const auto& l : layers) EXPECT_FALSE(l->module()->is_training()) << l->path();
  plain.train();
  plain.forward({x});
  for (const auto& l : layers) EXPECT_TRUE(l->module()->is_training()) << l->path();
}

namespace {

using ActCodesFn = at::Tensor(const at::Tensor&, c10::intrusive_ptr<qforge::jit::ScriptedLayer>, c10::intrusive_ptr<qforge::jit::ScriptedLayer>,
                              double, bool);

at::Tensor act_codes(const at::Tensor& x, const c10::intrusive_ptr<qforge::jit::ScriptedLayer>& a,
                     const c10::intrusive_ptr<qforge::jit::ScriptedLayer>& b, double clamp_max) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("qforge::conv2d_act_codes", "").typed<ActCodesFn>();
  return op.call(x, a, b, clamp_max, /*training=*/false);
}

}  // namespace

// Conv2d -> ReLU -> Conv2d in a graph becomes qforge::conv2d_act_codes (graph_notes lists it):
// floats until both layers are frozen, then the second layer's int8 input codes, code for code
// what its quantizer makes of relu(first(x)). ReLU6 takes the codes only where the second
// layer's grid ends at or below 6; the frozen model's output equals the layers called one by one.
TEST(TorchScript, ConvReluConvChainsHandInt8CodesOnOnceFrozen) {
  ScriptedModel m = qforge::jit::load_torchscript(fixture("cnn_scripted"));
  ASSERT_EQ(m->chained().size(), 1u);
  EXPECT_EQ(m->chained()[0].from, "features.0");
  EXPECT_EQ(m->chained()[0].to, "features.2");
  EXPECT_NE(m->graph_notes().find("chained  features.0 -> aten::relu -> features.2"), std::string::npos)
      << m->graph_notes();
  const auto& L = m->layers();  // features.0, features.2, mix, fc
  ASSERT_EQ(layer_paths(m), (std::vector<std::string>{"features.0", "features.2", "mix", "fc"}));
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({4, 1, 14, 14});
  m->eval();
  torch::NoGradGuard no_grad;
  // Float: the op is relu / hardtanh of the first layer's output.
  EXPECT_TRUE(at::equal(act_codes(x, L[0], L[1], -1.0), at::relu(L[0]->forward(x))));
  EXPECT_TRUE(at::equal(act_codes(x, L[0], L[1], 6.0), at::hardtanh(L[0]->forward(x), 0.0, 6.0)));

  qforge::quantize(*m, w8a8());
  {
    qforge::Calibration calib(*m);
    for (int i = 0; i < 4; ++i) m->forward(torch::randn({8, 1, 14, 14}));
  }
  qforge::freeze(*m);
  const at::Tensor codes = act_codes(x, L[0], L[1], -1.0);
  ASSERT_EQ(codes.scalar_type(), at::kChar);
  const at::Tensor floats = at::relu(L[0]->forward(x));
  const qforge::QParams next = L[1]->layer().input_quantizer()->qparams();
  EXPECT_TRUE(at::equal(codes.contiguous(), qforge::quantize_to_int8(floats, next).contiguous()));
  // ReLU6: the calibrated grid of features.2 ends far below 6, so the codes are the same.
  EXPECT_TRUE(at::equal(act_codes(x, L[0], L[1], 6.0), codes));
  // A clamp inside the grid changes codes: floats, hardtanh as the graph wrote it.
  const double low = 0.25 * next.scale.item<double>() * next.spec.quant_max();
  const at::Tensor clamped = act_codes(x, L[0], L[1], low);
  ASSERT_EQ(clamped.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(clamped, at::hardtanh(floats, 0.0, low)));

  // The whole frozen forward equals SmallCnn's forward with the layers called one by one.
  const at::Tensor h = at::relu(L[1]->forward(at::relu(L[0]->forward(x))));
  const at::Tensor mixed = at::relu(L[2]->forward(h.flatten(2)));
  EXPECT_TRUE(at::equal(m->forward(x), L[3]->forward(mixed.flatten(1))));
}
