// nn::convert: models written with plain LibTorch layers. Inside Sequentials (also nested in
// ModuleList / ModuleDict) the layers become qforge twins with the float forward unchanged bit for
// bit, then quantize / calibrate / freeze shrink them; layers it cannot reach are listed with why.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <string>

#include "framework/api/quantize.h"
#include "framework/nn/conv.h"
#include "framework/nn/conv_bn_fold.h"
#include "framework/nn/convert.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"
#include "framework/nn/linear.h"
#include "tests/error_of.h"

using namespace qforge;

namespace {

// Static int8 activations and int8 weights: every converted layer gets quantizers.
Scheme w8a8() {
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  return s;
}

// Quantizes, calibrates on `calib` and freezes; checks the model shrank and every qforge layer froze.
template <class Model>
void quantize_calibrate_freeze(Model& model, const std::function<at::Tensor(const at::Tensor&)>& forward,
                               const at::Tensor& calib) {
  const int64_t float_bytes = model_size(*model).total_bytes;
  const QuantizeReport rep = quantize(*model, w8a8());
  EXPECT_FALSE(rep.quantized.empty());
  {
    Calibration c(*model);
    forward(calib);
  }
  freeze(*model);
  for (const auto& [path, layer] : quantizable_layers(*model)) EXPECT_TRUE(layer->frozen()) << path;
  const int64_t frozen_bytes = model_size(*model).total_bytes;
  EXPECT_LT(frozen_bytes * 2, float_bytes) << frozen_bytes << " of " << float_bytes << "\n" << describe(*model);
  EXPECT_TRUE(plain_libtorch_layers(*model).empty());
}

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

// One block per item: what a PyTorch user writes as a ModuleList of nn.Sequential.
struct Blocks : torch::nn::Module {
  Blocks() : blocks(register_module("blocks", torch::nn::ModuleList())) {
    blocks->push_back(torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU()));
    blocks->push_back(torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({64})),
                                            torch::nn::Linear(64, 64), torch::nn::GELU()));
    blocks->push_back(torch::nn::Sequential(torch::nn::Linear(64, 10)));
  }
  at::Tensor forward(at::Tensor x) {
    for (const auto& b : *blocks) x = b->as<torch::nn::Sequential>()->forward(x);
    return x;
  }
  torch::nn::ModuleList blocks;
};

// Named heads over a shared trunk, as a ModuleDict of Sequentials.
struct Heads : torch::nn::Module {
  Heads() {
    const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> items{
        {"trunk", torch::nn::Sequential(torch::nn::Conv1d(torch::nn::Conv1dOptions(4, 16, 3).padding(1)),
                                        torch::nn::ReLU(), torch::nn::Flatten())
                      .ptr()},
        {"head", torch::nn::Sequential(torch::nn::Linear(16 * 24, 16)).ptr()}};
    parts = register_module("parts", torch::nn::ModuleDict(items));
  }
  at::Tensor forward(const at::Tensor& x) {
    return parts["head"]->as<torch::nn::Sequential>()->forward(parts["trunk"]->as<torch::nn::Sequential>()->forward(x));
  }
  torch::nn::ModuleDict parts{nullptr};
};

}  // namespace

TEST(Convert, SequentialOfEveryLayerTypeKeepsItsForwardBitForBitThenFreezes) {
  at::manual_seed(1);
  torch::nn::Sequential text(torch::nn::Embedding(50, 32), torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})),
                             torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  torch::nn::Sequential image(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)), torch::nn::ReLU(),
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).stride(2).bias(false)),
                              torch::nn::Flatten(), torch::nn::Linear(16 * 7 * 7, 10));
  text->eval();
  image->eval();
  const at::Tensor tokens = at::randint(0, 50, {8, 6}, at::kLong), pixels = at::randn({8, 1, 16, 16});
  at::NoGradGuard no_grad;
  const at::Tensor text_before = text->forward(tokens), image_before = image->forward(pixels);
  const at::Tensor weight_before = image[2]->as<torch::nn::Conv2dImpl>()->weight.clone();

  const nn::ConvertReport tr = nn::convert(text), ir = nn::convert(image);
  ASSERT_EQ(tr.converted.size(), 4u) << tr.to_string();
  EXPECT_EQ(tr.converted[0].path, "0");
  EXPECT_EQ(tr.converted[0].type, "torch::nn::Embedding");
  EXPECT_EQ(tr.converted[0].note, "qforge::nn::Embedding");
  EXPECT_EQ(ir.converted.size(), 3u) << ir.to_string();
  EXPECT_TRUE(tr.kept.empty() && ir.kept.empty());
  EXPECT_NE(text[0]->as<nn::EmbeddingImpl>(), nullptr);
  EXPECT_NE(text[1]->as<nn::LayerNormImpl>(), nullptr);
  EXPECT_NE(text[2]->as<nn::LinearImpl>(), nullptr);
  ASSERT_NE(image[2]->as<nn::Conv2dImpl>(), nullptr);
  EXPECT_TRUE(same(image[2]->as<nn::Conv2dImpl>()->weight, weight_before));
  EXPECT_FALSE(image[2]->as<nn::Conv2dImpl>()->options.bias());
  EXPECT_EQ(image[2]->as<nn::Conv2dImpl>()->options.stride()->at(0), 2);
  // Same registry names, so a float state dict saved before loads after.
  EXPECT_TRUE(text->named_parameters().contains("2.weight"));
  EXPECT_TRUE(same(text->forward(tokens), text_before));
  EXPECT_TRUE(same(image->forward(pixels), image_before));

  quantize_calibrate_freeze(
      image, [&](const at::Tensor& x) { return image->forward(x); }, at::randn({32, 1, 16, 16}));
  const at::Tensor frozen = image->forward(pixels);
  EXPECT_LT((frozen - image_before).abs().max().item<double>(), 0.05 * image_before.abs().max().item<double>());
  // Embedding and LayerNorm take the scheme as their qforge twins do: the text model quantizes too.
  EXPECT_EQ(quantize(*text, w8a8()).quantized.size(), 4u);
}

TEST(Convert, SequentialsInsideModuleListAndModuleDictKeepTheirForwardThenFreeze) {
  at::manual_seed(2);
  auto blocks = std::make_shared<Blocks>();
  auto heads = std::make_shared<Heads>();
  blocks->eval();
  heads->eval();
  const at::Tensor x = at::randn({5, 32}), s = at::randn({5, 4, 24});
  at::NoGradGuard no_grad;
  const at::Tensor yb = blocks->forward(x), yh = heads->forward(s);
  const nn::ConvertReport rb = nn::convert(blocks), rh = nn::convert(heads);
  EXPECT_EQ(rb.converted.size(), 4u) << rb.to_string();
  EXPECT_EQ(rb.converted[1].path, "blocks.1.0");
  EXPECT_EQ(rh.converted.size(), 2u) << rh.to_string();
  EXPECT_TRUE(rb.kept.empty() && rh.kept.empty());
  EXPECT_TRUE(same(blocks->forward(x), yb));
  EXPECT_TRUE(same(heads->forward(s), yh));
  quantize_calibrate_freeze(blocks, [&](const at::Tensor& c) { return blocks->forward(c); }, at::randn({64, 32}));
  quantize_calibrate_freeze(heads, [&](const at::Tensor& c) { return heads->forward(c); }, at::randn({64, 4, 24}));
  EXPECT_LT((blocks->forward(x) - yb).abs().max().item<double>(), 0.05 * yb.abs().max().item<double>());
  EXPECT_LT((heads->forward(s) - yh).abs().max().item<double>(), 0.05 * yh.abs().max().item<double>());
}

TEST(Convert, ListsWhatItCannotReachAndLeavesIt) {
  struct Net : torch::nn::Module {
    Net()
        : fc(register_module("fc", torch::nn::Linear(8, 8))),
          list(register_module("list", torch::nn::ModuleList(torch::nn::Linear(8, 8)))),
          body(register_module("body", torch::nn::Sequential(torch::nn::Linear(8, 8)))) {}
    torch::nn::Linear fc;
    torch::nn::ModuleList list;
    torch::nn::Sequential body;
  };
  Net net;
  const nn::ConvertReport plan = nn::convert_plan(net);
  const nn::ConvertReport rep = nn::convert(net);
  EXPECT_EQ(plan.to_string(), rep.to_string());
  ASSERT_EQ(rep.converted.size(), 1u) << rep.to_string();
  EXPECT_EQ(rep.converted[0].path, "body.0");
  ASSERT_EQ(rep.kept.size(), 2u) << rep.to_string();
  EXPECT_EQ(rep.kept[0].path, "fc");
  EXPECT_EQ(rep.kept[0].type, "torch::nn::Linear");
  EXPECT_NE(rep.kept[0].note.find("LibTorch calls statically: declare it as qforge::nn::Linear"), std::string::npos)
      << rep.kept[0].note;
  EXPECT_EQ(rep.kept[1].path, "list.0");
  EXPECT_NE(rep.kept[1].note.find("hold it in a torch::nn::Sequential"), std::string::npos) << rep.kept[1].note;
  EXPECT_NE(rep.to_string().find("kept fc: torch::nn::Linear: a member of"), std::string::npos) << rep.to_string();
  // Left as they were: the member and the list item are still the LibTorch layers.
  EXPECT_EQ(net.named_children()["fc"].get(), net.fc.ptr().get());
  EXPECT_NE(net.list[0]->as<torch::nn::LinearImpl>(), nullptr);
  EXPECT_EQ(plain_libtorch_layers(net).size(), 2u);
  // A plain layer as the whole model.
  torch::nn::Linear alone(4, 4);
  const nn::ConvertReport ra = nn::convert(alone);
  ASSERT_EQ(ra.kept.size(), 1u);
  EXPECT_EQ(ra.kept[0].path, "");
  EXPECT_TRUE(ra.converted.empty());
}

TEST(Convert, FoldsBatchNormAfterConvInEvalModeOnly) {
  at::manual_seed(3);
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).bias(false)),
                                 torch::nn::BatchNorm2d(8), torch::nn::ReLU());
  };
  torch::nn::Sequential net = make();
  {  // running statistics away from (0, 1), affine parameters away from (1, 0)
    at::NoGradGuard no_grad;
    for (int i = 0; i < 4; ++i) net->forward(at::randn({16, 3, 10, 10}) * 3 + 1);
    net[1]->as<torch::nn::BatchNorm2dImpl>()->weight.uniform_(0.5, 2);
    net[1]->as<torch::nn::BatchNorm2dImpl>()->bias.uniform_(-1, 1);
  }
  // Training mode: the BatchNorm normalises with batch statistics, so it stays, and says why.
  const nn::ConvertReport training = nn::convert_plan(net);
  ASSERT_EQ(training.kept.size(), 1u) << training.to_string();
  EXPECT_EQ(training.kept[0].path, "1");
  EXPECT_NE(training.kept[0].note.find("call model->eval() before convert() to fold it"), std::string::npos);

  net->eval();
  const at::Tensor x = at::randn({4, 3, 10, 10});
  at::NoGradGuard no_grad;
  const at::Tensor before = net->forward(x);
  at::manual_seed(7);  // the generator is left as it was: the same draw after convert
  const at::Tensor draw = at::randn({4});
  at::manual_seed(7);
  const nn::ConvertReport rep = nn::convert(net);
  EXPECT_TRUE(same(at::randn({4}), draw));
  ASSERT_EQ(rep.converted.size(), 2u) << rep.to_string();
  EXPECT_EQ(rep.converted[1].path, "1");
  EXPECT_NE(rep.converted[1].note.find("folded into 0"), std::string::npos);
  ASSERT_NE(net[0]->as<nn::Conv2dImpl>(), nullptr);
  EXPECT_TRUE(net[0]->as<nn::Conv2dImpl>()->options.bias());
  EXPECT_NE(net[1]->as<torch::nn::IdentityImpl>(), nullptr);
  EXPECT_FALSE(net->named_parameters().contains("1.weight"));
  const at::Tensor after = net->forward(x);
  EXPECT_TRUE(at::allclose(after, before, 1e-5, 1e-5)) << (after - before).abs().max().item<double>();

  // The one folding formula, checked against BatchNorm's own eval forward: fold_conv_bn.
  torch::nn::Sequential ref = make();
  ref->eval();
  nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3));
  const at::Tensor want = ref[1]->as<torch::nn::BatchNorm2dImpl>()->forward(conv->forward(x));
  const torch::nn::BatchNorm2d bn(std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(ref->ptr(1)));
  EXPECT_TRUE(at::allclose(nn::fold_conv_bn(conv, bn)->forward(x), want, 1e-5, 1e-5));
}

TEST(Convert, KeepsDtypeDeviceAndRequiresGradOfEachTensor) {
  torch::nn::Sequential net(torch::nn::Linear(6, 3));
  net->to(at::kDouble);
  net[0]->as<torch::nn::LinearImpl>()->weight.set_requires_grad(false);
  const at::Tensor x = at::randn({2, 6}, at::kDouble);
  const at::Tensor before = net->forward(x);
  nn::convert(net);
  const auto* twin = net[0]->as<nn::LinearImpl>();
  ASSERT_NE(twin, nullptr);
  EXPECT_EQ(twin->weight.scalar_type(), at::kDouble);
  EXPECT_FALSE(twin->weight.requires_grad());
  EXPECT_TRUE(twin->bias.requires_grad());
  EXPECT_TRUE(same(net->forward(x), before));
  // Training goes on through the twin: its bias gets the gradient.
  net->forward(x).sum().backward();
  EXPECT_TRUE(twin->bias.grad().defined());
}
