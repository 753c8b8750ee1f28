// Model checkpoints of qforge models: frozen models rebuilt in fresh float models bit for bit,
// fake-quant round trips with LSQ and calibrated qparams, dequantized loads, partial loads,
// background saves while training, failed loads that change nothing, calibration dumps of a model
// and the safetensors export.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "framework/core/error.h"
#include "framework/io/calibration_io.h"
#include "framework/io/checkpoint.h"
#include "framework/io/model_io.h"
#include "framework/nn/conv.h"
#include "framework/nn/embedding.h"
#include "framework/nn/linear.h"
#include "framework/api/quantize.h"
#include "io_test_util.h"
#include "tests/paths.h"

using namespace qforge;
using qforge::io::testing::read_bytes;
using qforge::io::testing::same_tensor;
using qforge::io::testing::TempDir;
using qforge::io::testing::write_bytes;

namespace {

// Embedding -> Linear -> ReLU -> Linear, plus a plain buffer of the root module.
struct Net : torch::nn::Module {
  explicit Net(int64_t hidden = 64)
      : emb(register_module("emb", nn::Embedding(16, 32))),
        fc1(register_module("fc1", nn::Linear(32, hidden))),
        fc2(register_module("fc2", nn::Linear(hidden, 8))) {
    counter = register_buffer("counter", at::zeros({2}, at::kLong));
  }
  at::Tensor forward(const at::Tensor& idx) { return fc2(at::relu(fc1(emb(idx)))); }
  nn::Embedding emb;
  nn::Linear fc1, fc2;
  at::Tensor counter;
};

struct ConvNet : torch::nn::Module {
  ConvNet()
      : conv(register_module("conv", nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        fc(register_module("fc", nn::Linear(4 * 6 * 6, 10))) {}
  at::Tensor forward(const at::Tensor& x) { return fc(at::relu(conv(x)).flatten(1)); }
  nn::Conv2d conv;
  nn::Linear fc;
};

at::Tensor indices() { return at::randint(0, 16, {6, 3}, at::kLong); }

// Every parameter and buffer (cloned) and describe(): the whole observable state.
struct State {
  std::map<std::string, at::Tensor> tensors;
  std::string description;
};
State state_of(const torch::nn::Module& m) {
  State s;
  for (const auto& p : m.named_parameters(true)) s.tensors["p:" + p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers(true)) s.tensors["b:" + b.key()] = b.value().detach().clone();
  s.description = describe(m);
  return s;
}
void expect_same_state(const State& a, const State& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [k, t] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(k)) << k;
    EXPECT_TRUE(same_tensor(t, b.tensors.at(k))) << k;
  }
  EXPECT_EQ(a.description, b.description);
}

std::vector<std::string> layer_kernels(const torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const LayerReport& r : layer_reports(m)) out.push_back(r.name + ": " + r.kernel + " / " + r.fallback_reason);
  return out;
}

struct Case {
  const char* name;
  Scheme scheme;
  bool calibrate;
};

std::vector<Case> frozen_cases() {
  std::vector<Case> cases;
  Scheme s8(qint8);
  s8.activations = ActivationMode::kStatic;
  s8.observer = "minmax";
  cases.push_back({"int8 static", s8, true});
  Scheme s4(qint4);
  s4.group_size = 16;
  s4.activations = ActivationMode::kDynamicPerToken;
  cases.push_back({"int4 groups dynamic", s4, false});
  Scheme s2(qint2);
  s2.group_size = 16;
  cases.push_back({"int2 weight-only", s2, false});
  Scheme b32(qint4);  // symmetric groups of 32: the n16b32 form where AVX2 is usable
  b32.group_size = 32;
  cases.push_back({"int4 g32 weight-only", b32, false});
  Scheme f8(qfloat8_e4m3fn);
  f8.weight_granularity = Granularity::kPerChannel;
  cases.push_back({"fp8 weight-only", f8, false});
  return cases;
}

void calibrate(Net& m) {
  Calibration c(m);
  for (int i = 0; i < 3; ++i) m.forward(indices());
}

}  // namespace

TEST(ModelIo, NonFiniteParametersAreRefusedNamingTheTensorUnlessAllowed) {
  TempDir dir;
  auto a = std::make_shared<Net>();
  {
    at::NoGradGuard g;
    a->fc1->bias[3] = NAN;
    a->fc2->weight[0][1] = INFINITY;
  }
  const std::string path = dir.file("nan.h5");
  io::save_model(a, path);
  auto b = std::make_shared<Net>();
  const State before = state_of(*b);
  try {
    io::load_model(b, path);
    FAIL() << "NaN parameters loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fc1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NaN/inf"), std::string::npos) << msg;
  }
  expect_same_state(before, state_of(*b));  // nothing changed
  io::LoadModelOptions o;
  o.allow_non_finite = true;
  io::load_model(b, path, o);
  EXPECT_TRUE(std::isnan(b->fc1->bias[3].item<float>()));
}

TEST(ModelIo, FrozenModelRebuildsInAFreshFloatModelBitForBit) {
  TempDir dir;
  for (const Case& c : frozen_cases()) {
    at::manual_seed(1);
    auto a_ptr = std::make_shared<Net>();
    Net& a = *a_ptr;
    quantize(a, c.scheme);
    if (c.calibrate) calibrate(a);
    freeze(a);
    a.eval();
    const at::Tensor x = indices();
    const at::Tensor y = a.forward(x);
    const std::string path = dir.file("frozen.h5");
    io::save_model(a, path);

    at::manual_seed(99);  // different float weights
    auto b_ptr = std::make_shared<Net>();
    Net& b = *b_ptr;
    b.eval();
    const io::LoadReport r = io::load_model(b, path);
    EXPECT_EQ(r.frozen_layers.size(), 3u) << c.name;
    EXPECT_TRUE(at::equal(b.forward(x), y)) << c.name;
    EXPECT_EQ(describe(b), describe(a)) << c.name;
    EXPECT_EQ(layer_kernels(b), layer_kernels(a)) << c.name;
    if (std::string(c.name) == "int4 g32 weight-only" && usable_isa() >= Isa::kAvx2) {
      EXPECT_NE(describe(b).find("n16b32"), std::string::npos) << describe(b);
    }
    // Saving the rebuilt model gives the same tensors again.
    const std::string again = dir.file("again.h5");
    io::save_model(b, again);
    const auto da = io::CheckpointReader(path).read(), db = io::CheckpointReader(again).read();
    ASSERT_EQ(da.quantized.size(), db.quantized.size()) << c.name;
    for (const auto& [k, q] : da.quantized) EXPECT_TRUE(same_tensor(q.data, db.quantized.at(k).data)) << k;
  }
}

TEST(ModelIo, FrozenConvModelRebuildsBitForBit) {
  TempDir dir;
  at::manual_seed(2);
  auto a_ptr = std::make_shared<ConvNet>();
  ConvNet& a = *a_ptr;
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "histogram";
  quantize(a, s);
  {
    Calibration c(a);
    for (int i = 0; i < 2; ++i) a.forward(at::randn({4, 1, 8, 8}));
  }
  freeze(a);
  const at::Tensor x = at::randn({3, 1, 8, 8});
  const std::string path = dir.file("conv.h5");
  io::save_model(a, path);
  auto b_ptr = std::make_shared<ConvNet>();
  ConvNet& b = *b_ptr;
  io::load_model(b, path);
  EXPECT_TRUE(at::equal(b.forward(x), a.forward(x)));
  EXPECT_EQ(describe(b), describe(a));
}

TEST(ModelIo, FakeQuantRoundTripKeepsLsqParametersAndCalibratedQparams) {
  for (bool activation_lsq : {false, true}) {
  SCOPED_TRACE(activation_lsq ? "LSQ activations too" : "LSQ weights");
  TempDir dir;
  at::manual_seed(3);
  Scheme s(qint4);
  s.group_size = 16;
  s.weight_lsq = true;
  s.activation_lsq = activation_lsq;
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  auto a_ptr = std::make_shared<Net>();
  Net& a = *a_ptr;
  quantize(a, s);
  calibrate(a);
  // A few QAT steps: LSQ scales are created by the first forward and then learn.
  a.train();
  torch::optim::Adam opt(a.parameters(), torch::optim::AdamOptions(1e-4));
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    a.forward(indices()).pow(2).mean().backward();
    opt.step();
  }
  a.eval();
  ASSERT_TRUE(a.named_parameters().contains("fc1.weight_quantizer.scale"));
  const at::Tensor x = indices();
  const at::Tensor y = a.forward(x);
  const std::string path = dir.file("qat.h5");
  io::save_model(a, path, io::SaveOptions{&opt, 3, "recipe: test"});

  // (a) same quantization state: quantized with the same scheme, never calibrated, LSQ not started.
  at::manual_seed(50);
  auto b_ptr = std::make_shared<Net>();
  Net& b = *b_ptr;
  quantize(b, s);
  b.eval();
  const io::LoadReport r = io::load_model(b, path);
  EXPECT_EQ(r.step, 3);
  EXPECT_EQ(r.recipe, "recipe: test");
  EXPECT_TRUE(r.quantized_layers.empty());
  EXPECT_TRUE(at::equal(b.forward(x), y));
  EXPECT_TRUE(at::equal(b.named_parameters()["fc2.weight_quantizer.scale"], a.named_parameters()["fc2.weight_quantizer.scale"]));
  EXPECT_EQ(b.fc1->input_quantizer()->calibrated(), a.fc1->input_quantizer()->calibrated());

  // (b) fresh float model: the saved schemes are attached.
  auto c_ptr = std::make_shared<Net>();
  Net& c = *c_ptr;
  c.eval();
  const io::LoadReport rc = io::load_model(c, path);
  EXPECT_EQ(rc.quantized_layers.size(), 3u);
  EXPECT_TRUE(at::equal(c.forward(x), y));
  EXPECT_EQ(describe(c), describe(a));
  // And it freezes like the original.
  freeze(a);
  freeze(c);
  EXPECT_TRUE(at::equal(c.forward(x), a.forward(x)));
  }
}

TEST(ModelIo, DequantizedLoadMatchesTheFakeQuantModel) {
  TempDir dir;
  at::manual_seed(4);
  Scheme s(qint4);
  s.group_size = 16;
  auto a_ptr = std::make_shared<Net>();
  Net& a = *a_ptr;
  quantize(a, s);
  a.eval();
  const at::Tensor x = indices();
  const at::Tensor y = a.forward(x);
  io::LoadModelOptions o;
  o.dequantize = true;
  // From the fake-quant model and from its frozen form.
  const std::string fq = dir.file("fq.h5"), fr = dir.file("frozen.h5");
  io::save_model(a, fq);
  freeze(a);
  io::save_model(a, fr);
  for (const std::string& path : {fq, fr}) {
    auto b_ptr = std::make_shared<Net>();
    Net& b = *b_ptr;
    b.eval();
    io::load_model(b, path, o);
    EXPECT_FALSE(b.fc1->quantized());
    EXPECT_TRUE(at::equal(b.forward(x), y)) << path;
  }
}

TEST(ModelIo, PrefixAndParametersOnlyLoadJustThatPart) {
  TempDir dir;
  at::manual_seed(5);
  auto a_ptr = std::make_shared<Net>();
  Net& a = *a_ptr;
  a.counter.fill_(7);
  quantize(a, Scheme(qint8));
  freeze(a);
  const std::string path = dir.file("m.h5");
  io::save_model(a, path);

  auto b_ptr = std::make_shared<Net>();

  Net& b = *b_ptr;
  const at::Tensor fc2_before = b.fc2->weight.clone();
  io::LoadModelOptions o;
  o.prefix = "fc1";
  const io::LoadReport r = io::load_model(b, path, o);
  EXPECT_EQ(r.frozen_layers, std::vector<std::string>{"fc1"});
  EXPECT_TRUE(b.fc1->frozen());
  EXPECT_FALSE(b.fc2->quantized());
  EXPECT_TRUE(at::equal(b.fc2->weight, fc2_before));
  const at::Tensor h = at::randn({2, 32});
  EXPECT_TRUE(at::equal(b.fc1(h), a.fc1(h)));

  auto c_ptr = std::make_shared<Net>();

  Net& c = *c_ptr;
  io::LoadModelOptions po;
  po.parameters_only = true;
  io::load_model(c, path, po);
  EXPECT_TRUE(c.fc2->frozen());
  EXPECT_TRUE(at::equal(c.counter, at::zeros({2}, at::kLong)));  // buffers untouched
  auto d_ptr = std::make_shared<Net>();
  Net& d = *d_ptr;
  io::load_model(d, path);
  EXPECT_TRUE(at::equal(d.counter, a.counter));
}

TEST(ModelIo, NonStrictLoadReportsMissingAndUnexpectedKeys) {
  TempDir dir;
  at::manual_seed(6);
  auto a_ptr = std::make_shared<Net>();
  Net& a = *a_ptr;
  const std::string path = dir.file("m.h5");
  io::save_model(a, path);
  struct Other : torch::nn::Module {
    Other() : fc1(register_module("fc1", nn::Linear(32, 64))) { extra = register_parameter("extra", at::zeros({3})); }
    nn::Linear fc1;
    at::Tensor extra;
  };
  auto b_ptr = std::make_shared<Other>();
  Other& b = *b_ptr;
  io::LoadModelOptions o;
  o.strict = false;
  const io::LoadReport r = io::load_model(b, path, o);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"extra"});
  EXPECT_NE(std::find(r.unexpected_keys.begin(), r.unexpected_keys.end(), "fc2.weight"), r.unexpected_keys.end());
  EXPECT_TRUE(at::equal(b.fc1->weight, a.fc1->weight));
  EXPECT_THROW(io::load_model(b, path), Error);
}

TEST(ModelIo, BackgroundSaveDuringTrainingWritesTheSnapshotAndOptimizerState) {
  TempDir dir;
  at::manual_seed(7);
  auto a_ptr = std::make_shared<Net>();
  Net& a = *a_ptr;
  Scheme s(qint8);
  s.weight_lsq = true;
  quantize(a, s);
  a.train();
  a.forward(indices());  // LSQ parameters exist from here on
  torch::optim::Adam opt(a.parameters(), torch::optim::AdamOptions(1e-2));
  auto step = [&](Net& m, torch::optim::Adam& o, const at::Tensor& x) {
    o.zero_grad();
    m.forward(x).pow(2).mean().backward();
    o.step();
  };
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 6; ++i) xs.push_back(indices());
  for (int i = 0; i < 3; ++i) step(a, opt, xs[i]);
  const State at_save = state_of(a);
  const std::string path = dir.file("async.h5");
  io::ModelSaveHandle h = io::save_model_async(a, path, io::SaveOptions{&opt, 3, ""});
  for (int i = 3; i < 6; ++i) step(a, opt, xs[i]);  // keeps mutating while the file is written
  h.wait();

  auto b_ptr = std::make_shared<Net>();

  Net& b = *b_ptr;
  quantize(b, s);
  b.train();
  b.forward(indices());
  torch::optim::Adam opt_b(b.parameters(), torch::optim::AdamOptions(1e-3));
  io::LoadModelOptions o;
  o.optimizer = &opt_b;
  io::load_model(b, path, o);
  expect_same_state(state_of(b), at_save);
  EXPECT_DOUBLE_EQ(opt_b.param_groups()[0].options().get_lr(), 1e-2);
  // Resumed training follows the original exactly.
  auto ref_ptr = std::make_shared<Net>();
  Net& ref = *ref_ptr;
  quantize(ref, s);
  ref.train();
  ref.forward(indices());
  torch::optim::Adam opt_ref(ref.parameters(), torch::optim::AdamOptions(1e-2));
  io::LoadModelOptions o2;
  o2.optimizer = &opt_ref;
  io::load_model(ref, path, o2);
  for (int i = 3; i < 6; ++i) {
    step(b, opt_b, xs[i]);
    step(ref, opt_ref, xs[i]);
  }
  expect_same_state(state_of(b), state_of(ref));
  // ... and the one that never stopped.
  expect_same_state(state_of(b), state_of(a));
}

TEST(ModelIo, FailedLoadsLeaveTheModelExactlyAsItWas) {
  TempDir dir;
  at::manual_seed(8);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  auto a_ptr = std::make_shared<Net>();
  Net& a = *a_ptr;
  quantize(a, s);
  calibrate(a);
  freeze(a);
  const std::string good = dir.file("good.h5");
  io::save_model(a, good);

  auto expect_untouched = [&](torch::nn::Module& m, const std::string& path, const io::LoadModelOptions& o,
                              const std::string& needle) {
    const State before = state_of(m);
    try {
      io::load_model(m, path, o);
      ADD_FAILURE() << "load of " << path << " did not throw (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << needle << " not in: " << e.what();
    }
    expect_same_state(state_of(m), before);
  };

  // Truncated file.
  std::vector<char> bytes = read_bytes(good);
  bytes.resize(bytes.size() / 2);
  const std::string truncated = dir.file("truncated.h5");
  write_bytes(truncated, bytes);
  auto b_ptr = std::make_shared<Net>();
  Net& b = *b_ptr;
  expect_untouched(b, truncated, {}, "truncated.h5");

  // Shape mismatch (hidden 48 instead of 64): the message names the dataset.
  auto narrow_ptr = std::make_shared<Net>(48);
  Net& narrow = *narrow_ptr;
  expect_untouched(narrow, good, {}, "dataset '/parameters/fc1/weight' has shape [64, 32], model expects [48, 32]");

  // Wrong qtype: a model quantized as int4 (fake-quant) meets the int8 checkpoint.
  auto q4_ptr = std::make_shared<Net>();
  Net& q4 = *q4_ptr;
  Scheme s4(qint4);
  s4.group_size = 16;
  quantize(q4, s4);
  expect_untouched(q4, good, {}, "qint8");

  // Missing key, found only after every layer was planned: nothing may be attached already.
  struct Bigger : Net {
    Bigger() { extra = register_parameter("zz_extra", at::zeros({3})); }
    at::Tensor extra;
  };
  auto big_ptr = std::make_shared<Bigger>();
  Bigger& big = *big_ptr;
  expect_untouched(big, good, {}, "zz_extra");
  EXPECT_FALSE(big.fc1->quantized());

  // A frozen weight with the wrong qtype in an otherwise valid file.
  {
    io::CheckpointData d = io::CheckpointReader(good).read();
    // Rewrite via the model path with fc2 int4 instead: build that file from another model.
    auto other_ptr = std::make_shared<Net>();
    Net& other = *other_ptr;
    Scheme mixed = s;
    mixed.rules.push_back({"fc2", false, qint4, Granularity::kPerGroup, 16, {}});
    quantize(other, mixed);
    calibrate(other);
    freeze(other);
    const std::string path = dir.file("mixed.h5");
    io::save_model(other, path);
    auto q8_ptr = std::make_shared<Net>();
    Net& q8 = *q8_ptr;
    quantize(q8, s);
    expect_untouched(q8, path, {}, "fc2");
  }

  // Frozen models cannot be loaded into.
  expect_untouched(a, good, {}, "frozen");
}

// A weight that never reached the file (a save that lost it on a full disk) reads as zeros in
// HDF5: the load is refused naming the dataset, and the model keeps its values.
TEST(ModelIo, LoadRefusesAWeightThatNeverReachedTheFile) {
  TempDir dir;
  at::manual_seed(9);
  auto a_ptr = std::make_shared<Net>();
  const std::string path = dir.file("unwritten.h5");
  io::save_model(*a_ptr, path);
  const std::string unwrite = std::string(QFORGE_IO_TEST_TOOL) + " unwrite-dataset " + path + " /parameters/fc2/weight";
  ASSERT_EQ(std::system(unwrite.c_str()), 0);
  auto b_ptr = std::make_shared<Net>();
  const State before = state_of(*b_ptr);
  try {
    io::load_model(*b_ptr, path);
    ADD_FAILURE() << "a weight without stored data was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset '/parameters/fc2/weight': stores 0 of its 1 chunks: never completely written"),
              std::string::npos)
        << e.what();
  }
  expect_same_state(state_of(*b_ptr), before);
}

TEST(ModelIo, CalibrationDumpSkipsCalibrationOfAFreshModel) {
  TempDir dir;
  at::manual_seed(9);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "histogram";
  auto a_ptr = std::make_shared<Net>();
  Net& a = *a_ptr;
  quantize(a, s);
  calibrate(a);
  const std::string path = dir.file("calib.h5");
  io::save_calibration(a, path);
  const io::CalibrationDump dump = io::load_calibration_dump(path);
  ASSERT_TRUE(dump.count("fc1"));
  EXPECT_TRUE(dump.at("fc1").count("input"));
  EXPECT_TRUE(dump.at("fc1").count("weight"));
  EXPECT_EQ(dump.at("fc1").at("input").observer_kind, "histogram");

  // The same float weights, never calibrated.
  auto b_ptr = std::make_shared<Net>();
  Net& b = *b_ptr;
  {
    at::NoGradGuard g;
    for (const auto& p : a.named_parameters()) b.named_parameters()[p.key()].copy_(p.value());
  }
  quantize(b, s);
  io::load_calibration(b, path);
  EXPECT_TRUE(b.fc2->input_quantizer()->calibrated());
  freeze(a);
  freeze(b);
  const at::Tensor x = indices();
  EXPECT_TRUE(at::equal(b.forward(x), a.forward(x)));

  // Errors change nothing: an unknown module path, a spec mismatch.
  auto c_ptr = std::make_shared<Net>();
  Net& c = *c_ptr;
  quantize(c, s);
  io::CalibrationDump bad = dump;
  bad["nope"] = dump.at("fc1");
  const State before = state_of(c);
  EXPECT_THROW(io::apply_calibration(c, bad), Error);
  expect_same_state(state_of(c), before);
  io::CalibrationDump mismatch = dump;
  mismatch["fc2"]["input"].spec.qtype = quint8;
  try {
    io::apply_calibration(c, mismatch);
    ADD_FAILURE() << "spec mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc2"), std::string::npos) << e.what();
  }
  expect_same_state(state_of(c), before);
  EXPECT_FALSE(c.fc1->input_quantizer()->calibrated());
}

TEST(ModelIo, SafetensorsExportOfAFrozenModelParsesBack) {
  TempDir dir;
  at::manual_seed(10);
  Scheme s(qint4);
  s.group_size = 16;
  auto a_ptr = std::make_shared<Net>();
  Net& a = *a_ptr;
  quantize(a, s);
  freeze(a);
  const std::string path = dir.file("m.safetensors");
  io::export_safetensors(a, path);
  const std::vector<char> bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u);
  const nlohmann::json h = nlohmann::json::parse(std::string(bytes.data() + 8, n));
  uint64_t end = 0;
  for (const auto& [k, v] : h.items()) {
    if (k == "__metadata__") continue;
    end = std::max<uint64_t>(end, v["data_offsets"][1].get<uint64_t>());
  }
  EXPECT_EQ(8 + n + end, bytes.size());
  ASSERT_TRUE(h.contains("fc1.weight"));
  EXPECT_EQ(h["fc1.weight"]["dtype"], "U8");
  EXPECT_EQ(h["fc1.weight"]["shape"], nlohmann::json::array({64 * 32 / 2}));
  EXPECT_EQ(h["fc1.weight.scale"]["dtype"], "F32");
  EXPECT_EQ(h["fc1.weight.scale"]["shape"], nlohmann::json::array({64, 2}));
  EXPECT_EQ(h["fc1.weight.zero_point"]["dtype"], "I32");
  EXPECT_EQ(h["fc1.bias"]["dtype"], "F32");
  const auto meta = h["__metadata__"];
  EXPECT_EQ(meta["format"], "qforge.quantized");
  const nlohmann::json q = nlohmann::json::parse(meta["qforge.quantized"].get<std::string>());
  EXPECT_EQ(q["fc1.weight"]["qtype"], "qint4");
  EXPECT_EQ(q["fc1.weight"]["group_size"], 16);
  EXPECT_EQ(q["fc1.weight"]["packing"], "row_major_low_bits_first");
  EXPECT_EQ(q["fc1.weight"]["shape"], nlohmann::json::array({64, 32}));
  EXPECT_TRUE(q.contains("emb.weight"));
  // The codes are the checkpoint's.
  const auto& off = h["fc2.weight"]["data_offsets"];
  const uint64_t b0 = off[0].get<uint64_t>(), b1 = off[1].get<uint64_t>();
  const std::string ck = dir.file("m.h5");
  io::save_model(a, ck);
  const at::Tensor data = io::CheckpointReader(ck).read_quantized("fc2.weight").data;
  ASSERT_EQ(static_cast<int64_t>(b1 - b0), data.numel());
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + b0, data.data_ptr(), b1 - b0), 0);
}

// tests/fixtures/model_v1.h5: a frozen Net (emb qint4 groups of 16, fc1 qint8 with static
// activations, fc2 qint2 groups of 16 weight-only) written by this qforge. Every later qforge must
// load it. QFORGE_WRITE_MODEL_FIXTURE=<path> writes it (once: never regenerate a committed fixture).
namespace {
std::shared_ptr<Net> fixture_model() {
  at::manual_seed(2024);
  auto m = std::make_shared<Net>();
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  s.rules.push_back({"emb", false, qint4, Granularity::kPerGroup, 16, {}});
  s.rules.push_back({"fc2", false, qint2, Granularity::kPerGroup, 16, ActivationMode::kNone});
  quantize(*m, s);
  calibrate(*m);
  freeze(*m);
  m->counter.fill_(3);
  return m;
}
}  // namespace

TEST(ModelIoFixture, V1LoadsIntoAFreshModelAndSavesBackBitForBit) {
  const char* out = std::getenv("QFORGE_WRITE_MODEL_FIXTURE");
  if (out && *out) {
    io::save_model(*fixture_model(), out, io::SaveOptions{nullptr, 7, "fixture: model_v1"});
    GTEST_SKIP() << "wrote " << out;
  }
  const std::string fixture = std::string(QFORGE_FIXTURES_DIR) + "/model_v1.h5";
  auto m = std::make_shared<Net>();
  const io::LoadReport r = io::load_model(*m, fixture);
  EXPECT_EQ(r.step, 7);
  EXPECT_EQ(r.frozen_layers.size(), 3u);
  EXPECT_EQ(m->fc2->scheme().weights->spec.qtype, qint2);
  EXPECT_TRUE(m->fc1->input_quantizer()->calibrated());
  EXPECT_TRUE(at::equal(m->counter, at::full({2}, 3, at::kLong)));
  // Saved again, every dataset is the fixture's.
  TempDir dir;
  const std::string again = dir.file("again.h5");
  io::save_model(*m, again, io::SaveOptions{nullptr, 7, "fixture: model_v1"});
  const io::CheckpointReader fa(fixture), fb(again);
  const auto ea = fa.entries(), eb = fb.entries();
  // Version 1 files also hold the unused scale / zero_point buffers of weight quantizers whose grid
  // follows the weight; they are read past and no longer written.
  size_t unused = 0;
  for (const io::EntryInfo& e : ea) {
    if (fb.contains(e.key, e.section)) continue;
    ++unused;
    EXPECT_NE(e.key.find(".weight_quantizer."), std::string::npos) << e.key;
  }
  EXPECT_EQ(unused, 6u);  // emb, fc1, fc2
  ASSERT_EQ(ea.size(), eb.size() + unused);
  for (const io::EntryInfo& e : ea) {
    if (!fb.contains(e.key, e.section)) continue;
    if (e.quantized) {
      const QuantizedTensor qa = fa.read_quantized(e.key, e.section), qb = fb.read_quantized(e.key, e.section);
      EXPECT_TRUE(same_tensor(qa.data, qb.data) && same_tensor(qa.scale, qb.scale) &&
                  same_tensor(qa.zero_point, qb.zero_point))
          << e.key;
    } else {
      EXPECT_TRUE(same_tensor(fa.read_tensor(e.key, e.section), fb.read_tensor(e.key, e.section))) << e.key;
    }
  }
  // The rebuilt model computes what the dequantized weights say (fc2 is weight-only).
  auto d = std::make_shared<Net>();
  io::LoadModelOptions o;
  o.dequantize = true;
  io::load_model(*d, fixture, o);
  EXPECT_TRUE(at::equal(d->fc2->weight, fa.read_tensor("fc2.weight", io::Section::kParameters, true)));
  const at::Tensor h = at::randn({3, 64});
  EXPECT_TRUE(at::equal(d->fc2(h), m->fc2(h)));
  // The frozen Embedding looks up what its dequantized table says.
  const at::Tensor idx = at::randint(0, 16, {2, 5});
  EXPECT_TRUE(at::equal(d->emb(idx), m->emb(idx)));
  // Today's save of the same model is the same file content (tensors) as the fixture, less the
  // unused weight-quantizer buffers.
  const std::string fresh = dir.file("fresh.h5");
  io::save_model(*fixture_model(), fresh, io::SaveOptions{nullptr, 7, "fixture: model_v1"});
  EXPECT_EQ(io::CheckpointReader(fresh).entries().size(), ea.size() - unused);
}
