// Plain LibTorch layers that convert() cannot reach: quantize() refuses the model by default
// listing each with its way out; freeze() of a model with nothing quantized, torch::save of a
// quantized model and an unfolded BatchNorm after a quantized conv are errors or notes, never
// silently float.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include <sstream>
#include <string>

#include "framework/api/quantize.h"
#include "framework/nn/conv.h"
#include "framework/nn/convert.h"
#include "framework/nn/linear.h"
#include "tests/error_of.h"

using namespace qforge;
using qforge::testing::error_of;

namespace {

// A model written the usual LibTorch way: typed members, one Sequential, one qforge layer.
struct Mixed : torch::nn::Module {
  Mixed()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        body(register_module("body", torch::nn::Sequential(torch::nn::Linear(36, 16), torch::nn::ReLU()))),
        fc(register_module("fc", torch::nn::Linear(16, 8))),
        head(register_module("head", nn::Linear(8, 2))) {}
  at::Tensor forward(const at::Tensor& x) { return head(fc(body->forward(conv(x).flatten(1)))); }
  torch::nn::Conv2d conv;
  torch::nn::Sequential body;
  torch::nn::Linear fc;
  nn::Linear head;
};

struct Net : torch::nn::Module {
  Net() : fc1(register_module("fc1", nn::Linear(16, 32))), fc2(register_module("fc2", nn::Linear(32, 4))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(at::relu(fc1(x))); }
  nn::Linear fc1, fc2;
};

}  // namespace

TEST(ConvertPlainLayers, QuantizeRefusesStructMembersListingEachAndTheWaysOut) {
  Mixed m;
  const std::string e = error_of([&] { quantize(m, qint8); });
  EXPECT_NE(e.find("quantize: 3 LibTorch layer(s) have no quantizers"), std::string::npos) << e;
  EXPECT_NE(e.find("\n  conv (torch::nn::Conv2d): a member of"), std::string::npos) << e;
  EXPECT_NE(e.find("declare it as qforge::nn::Conv2d"), std::string::npos) << e;
  EXPECT_NE(e.find("\n  body.0 (torch::nn::Linear): inside a Sequential: qforge::nn::convert(model) replaces it"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("\n  fc (torch::nn::Linear): a member of"), std::string::npos) << e;
  EXPECT_NE(e.find("(1) qforge layers"), std::string::npos) << e;
  EXPECT_NE(e.find("(2) TorchScript"), std::string::npos) << e;
  EXPECT_NE(e.find("Scheme::allow_float_layers"), std::string::npos) << e;
  EXPECT_FALSE(m.head->quantized());  // nothing attached

  // convert() takes the Sequential's layer; the members remain and are still refused.
  nn::convert(m);
  const std::string after = error_of([&] { quantize(m, qint8); });
  EXPECT_NE(after.find("quantize: 2 LibTorch layer(s)"), std::string::npos) << after;
  EXPECT_EQ(after.find("body.0"), std::string::npos) << after;

  // The opt-in: today's warnings, the qforge layers quantized, the plain ones float.
  Scheme allow(qint8);
  allow.allow_float_layers = true;
  const QuantizeReport rep = quantize(m, allow);
  EXPECT_EQ(rep.quantized.size(), 2u);
  ASSERT_EQ(rep.warnings.size(), 2u);
  EXPECT_EQ(rep.warnings[0], "conv: torch::nn::Conv2d is a LibTorch layer, not a qforge layer: it stays float "
                             "(use qforge::nn::Conv2d)");
}

TEST(ConvertPlainLayers, FreezeOfAModelWithNothingQuantizedIsAnError) {
  Net net;
  EXPECT_NE(error_of([&] { freeze(net); }).find("freeze: nothing to freeze: no layer of the model is quantized"),
            std::string::npos);
  Mixed m;
  EXPECT_NE(error_of([&] { freeze(m); }).find("its 3 LibTorch layer(s) have no quantizers, see qforge::nn::convert"),
            std::string::npos);
  quantize(net, qint8);
  freeze(net);
  EXPECT_TRUE(net.fc1->frozen());
  EXPECT_EQ(error_of([&] { freeze(net); }), "");  // freezing again does nothing
}

TEST(ConvertPlainLayers, TorchSaveAndLoadOfAQuantizedOrFrozenModelNameSaveModelAndLoadModel) {
  auto net = std::make_shared<Net>();
  std::stringstream float_archive;
  torch::save(net, float_archive);
  {  // a float model of qforge layers round-trips through LibTorch's archive as its twins do
    std::stringstream buffer;
    torch::save(net, buffer);
    auto copy = std::make_shared<Net>();
    torch::load(copy, buffer);
    EXPECT_TRUE(at::equal(copy->fc1->weight, net->fc1->weight));
  }
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  quantize(*net, s);
  {
    Calibration c(*net);
    net->forward(at::randn({8, 16}));
  }
  auto save = [&] {
    std::stringstream buffer;
    torch::save(net, buffer);
  };
  const std::string calibrated = error_of(save);
  EXPECT_NE(calibrated.find("torch::save: 'fc1.weight' is a qforge quantizer"), std::string::npos) << calibrated;
  EXPECT_NE(calibrated.find("qforge::io::save_model(model, path)"), std::string::npos) << calibrated;
  // torch::load into the quantized model: refused at its first qforge layer, naming io::load_model.
  const at::Tensor weight = net->fc1->weight.clone();
  auto load = [&] {
    std::stringstream in(float_archive.str());
    torch::load(net, in);
  };
  const std::string into_quantized = error_of(load);
  EXPECT_NE(into_quantized.find("torch::load: fc1 (Linear) is quantized"), std::string::npos) << into_quantized;
  EXPECT_NE(into_quantized.find("qforge::io::load_model"), std::string::npos) << into_quantized;
  EXPECT_TRUE(at::equal(net->fc1->weight, weight));
  freeze(*net);
  EXPECT_NE(error_of(save).find("qforge::io::save_model"), std::string::npos);
  EXPECT_NE(error_of(load).find("torch::load: fc1 (Linear) is frozen"), std::string::npos) << error_of(load);
  // Nothing was written: the stream stays empty.
  std::stringstream out;
  EXPECT_NE(error_of([&] { torch::save(net, out); }), "");
  EXPECT_EQ(out.str().size(), 0u);
}

TEST(ConvertPlainLayers, BatchNormAfterAQuantizedConvIsNotedInQuantizeAndDescribe) {
  torch::nn::Sequential net(nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)), torch::nn::BatchNorm2d(4), torch::nn::ReLU());
  const QuantizeReport rep = quantize(*net, qint8);
  ASSERT_EQ(rep.notes.size(), 1u);
  EXPECT_EQ(rep.notes[0].rfind("1: torch::nn::BatchNorm2d after the quantized Conv2d '0' stays a float op", 0), 0u)
      << rep.notes[0];
  EXPECT_NE(rep.notes[0].find("qforge::nn::fold_conv_bn"), std::string::npos);
  const std::vector<LayerReport> rows = layer_reports(*net);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].name, "1");
  EXPECT_EQ(rows[1].type, "torch::nn::BatchNorm2d");
  EXPECT_EQ(rows[1].bytes, (4 * 4) * 4 + 8);  // weight, bias, running mean and var; num_batches_tracked (int64)
  EXPECT_NE(describe(*net).find("after the quantized Conv2d '0'"), std::string::npos);
  // Members registered conv then bn say nothing of the call order: no note.
  struct Members : torch::nn::Module {
    Members()
        : conv(register_module("conv", nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
          bn(register_module("bn", torch::nn::BatchNorm2d(4))) {}
    nn::Conv2d conv;
    torch::nn::BatchNorm2d bn;
  } members;
  EXPECT_TRUE(quantize(members, qint8).notes.empty());
}
