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
#include "framework/models/cnn.h"
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

}

// A 1-D CNN (audio, sequences): Conv1d -> BatchNorm1d in eval mode folds as the 2-D pair does, the
// float forward kept within float rounding; then quantized and frozen, with no BatchNorm left. A
// BatchNorm1d after a Conv2d (or a BatchNorm2d after a Conv1d) is not a pair.
TEST(Convert, FoldsBatchNorm1dAfterConv1d) {
  at::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Conv1d(torch::nn::Conv1dOptions(4, 6, 5).padding(2).bias(false)),
                            torch::nn::BatchNorm1d(6), torch::nn::ReLU(), torch::nn::Flatten(),
                            torch::nn::Linear(6 * 20, 3));
  {
    at::NoGradGuard no_grad;
    for (int i = 0; i < 4; ++i) net->forward(at::randn({16, 4, 20}) * 2 + 0.5);
    net[1]->as<torch::nn::BatchNorm1dImpl>()->weight.uniform_(0.5, 2);
    net[1]->as<torch::nn::BatchNorm1dImpl>()->bias.uniform_(-1, 1);
  }
  net->eval();
  const at::Tensor x = at::randn({8, 4, 20});
  at::NoGradGuard no_grad;
  const at::Tensor before = net->forward(x);
  const nn::ConvertReport rep = nn::convert(net);
  ASSERT_EQ(rep.converted.size(), 3u) << rep.to_string();
  EXPECT_EQ(rep.converted[1].type, "torch::nn::BatchNorm1d");
  EXPECT_NE(rep.converted[1].note.find("folded into 0"), std::string::npos) << rep.to_string();
  ASSERT_NE(net[0]->as<nn::Conv1dImpl>(), nullptr);
  EXPECT_NE(net[1]->as<torch::nn::IdentityImpl>(), nullptr);
  const at::Tensor after = net->forward(x);
  EXPECT_TRUE(at::allclose(after, before, 1e-5, 1e-5)) << (after - before).abs().max().item<double>();

  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  const QuantizeReport q = quantize(*net, s);
  EXPECT_TRUE(q.notes.empty()) << q.notes.front();  // no BatchNorm left after the conv
  {
    Calibration calib(*net);
    net->forward(x);
  }
  freeze(*net);
  EXPECT_LE((net->forward(x) - before).abs().max().item<double>(), 0.05 * before.abs().max().item<double>());

  // Not pairs: the dimensions differ.
  torch::nn::Sequential mixed(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 1)), torch::nn::BatchNorm1d(3));
  mixed->eval();
  EXPECT_EQ(nn::batch_norm_after(*mixed, 0), nullptr);
  torch::nn::Sequential mixed2(torch::nn::Conv1d(torch::nn::Conv1dOptions(2, 3, 1)), torch::nn::BatchNorm2d(3));
  EXPECT_EQ(nn::batch_norm_after(*mixed2, 0), nullptr);
  // A BatchNorm1d after a quantized qforge Conv1d is noted, as the 2-D pair is.
  torch::nn::Sequential late(nn::Conv1d(torch::nn::Conv1dOptions(2, 3, 3)), torch::nn::BatchNorm1d(3));
  late->eval();
  const QuantizeReport lq = quantize(*late, s);
  ASSERT_EQ(lq.notes.size(), 1u);
  EXPECT_NE(lq.notes[0].find("torch::nn::BatchNorm1d after the quantized Conv1d"), std::string::npos) << lq.notes[0];
}

// The one folding formula, fold_conv_bn, against BatchNorm's own eval forward: statistics and affine
// parameters away from (0, 1, 1, 0), with and without the conv's bias and BatchNorm's affine.
TEST(Convert, FoldFormulaMatchesBatchNormWithRandomStatistics) {
  at::manual_seed(8);
  const at::Tensor x = at::randn({4, 3, 10, 10});
  for (const bool conv_bias : {false, true}) {
    for (const bool affine : {false, true}) {
      nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).bias(conv_bias));
      torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(8).affine(affine).eps(1e-3));
      at::NoGradGuard no_grad;
      bn->running_mean.uniform_(-2, 2);
      bn->running_var.uniform_(0.2, 4);
      if (affine) {
        bn->weight.uniform_(0.5, 2);
        bn->bias.uniform_(-1, 1);
      }
      if (conv_bias) conv->bias.uniform_(-1, 1);
      bn->eval();
      const at::Tensor want = bn->forward(conv->forward(x));
      const at::Tensor got = nn::fold_conv_bn(conv, bn)->forward(x);
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-4))
          << "bias " << conv_bias << " affine " << affine << ": " << (got - want).abs().max().item<double>();
    }
  }
}

TEST(Convert, FoldKeepsTheConvsRequiresGrad) {
  nn::Conv2d conv(torch::nn::Conv2dOptions(2, 3, 1));
  torch::nn::BatchNorm2d bn(3);
  bn->eval();
  EXPECT_TRUE(nn::fold_conv_bn(conv, bn)->weight.requires_grad());
  for (auto& p : conv->parameters()) p.set_requires_grad(false);
  const nn::Conv2d folded = nn::fold_conv_bn(conv, bn);
  EXPECT_FALSE(folded->weight.requires_grad());
  EXPECT_FALSE(folded->bias.requires_grad());
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

TEST(Convert, ASequentialReachedByTwoPathsIsConvertedAndFoldedOnce) {
  at::manual_seed(4);
  torch::nn::Sequential block(torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)),
                              torch::nn::BatchNorm2d(4), torch::nn::ReLU());
  {  // statistics away from (0, 1): a second fold would change the output
    at::NoGradGuard no_grad;
    for (int i = 0; i < 3; ++i) block->forward(at::randn({8, 4, 6, 6}) * 2 + 1);
  }
  torch::nn::ModuleList list;
  list->push_back(block);
  list->push_back(block);  // the same block twice, as `[block] * 2` in PyTorch
  struct Twice : torch::nn::Module {
    explicit Twice(torch::nn::ModuleList l) : blocks(register_module("blocks", std::move(l))) {}
    torch::nn::ModuleList blocks;
  } net(list);
  net.eval();
  const at::Tensor x = at::randn({2, 4, 6, 6});
  at::NoGradGuard no_grad;
  const at::Tensor before = block->forward(block->forward(x));
  const nn::ConvertReport rep = nn::convert(net);
  EXPECT_EQ(rep.converted.size(), 2u) << rep.to_string();  // the conv and its BatchNorm, once
  ASSERT_EQ(rep.aliases.size(), 1u) << rep.to_string();
  EXPECT_EQ(rep.aliases[0].path, "blocks.1");
  EXPECT_EQ(rep.aliases[0].note, "the same module as blocks.0");
  EXPECT_NE(rep.to_string().find("alias blocks.1: torch::nn::SequentialImpl: the same module as blocks.0"),
            std::string::npos)
      << rep.to_string();
  ASSERT_NE(block[0]->as<nn::Conv2dImpl>(), nullptr);
  const at::Tensor after = block->forward(block->forward(x));
  EXPECT_TRUE(at::allclose(after, before, 1e-5, 1e-5)) << (after - before).abs().max().item<double>();
}

TEST(Convert, ALayerHeldTwiceGetsOneTwin) {
  at::manual_seed(5);
  torch::nn::Linear shared(8, 8);
  torch::nn::Sequential net(shared, torch::nn::Tanh(), shared);
  const at::Tensor x = at::randn({3, 8});
  const at::Tensor before = net->forward(x);
  const nn::ConvertReport rep = nn::convert(net);
  ASSERT_EQ(rep.converted.size(), 2u) << rep.to_string();
  EXPECT_EQ(rep.converted[0].note, "qforge::nn::Linear");
  EXPECT_EQ(rep.converted[1].note, "qforge::nn::Linear (one twin, shared with 0)");
  ASSERT_NE(net[0]->as<nn::LinearImpl>(), nullptr);
  EXPECT_EQ(net->ptr(0).get(), net->ptr(2).get());
  EXPECT_TRUE(same(net->forward(x), before));
  // One weight and one bias, registered under both names: training updates both uses together.
  EXPECT_TRUE(net[0]->as<nn::LinearImpl>()->weight.is_same(net->named_parameters()["2.weight"]));
  quantize(*net, w8a8());
  EXPECT_TRUE(net[2]->as<nn::LinearImpl>()->quantized());
}

TEST(Convert, EmbeddingsWithMaxNormOrSparseGradientsStayFloatWithTheReason) {
  torch::nn::Sequential net(torch::nn::Embedding(torch::nn::EmbeddingOptions(20, 4).max_norm(1.0)),
                            torch::nn::Embedding(torch::nn::EmbeddingOptions(20, 4).sparse(true)),
                            torch::nn::Embedding(20, 4));
  const nn::ConvertReport rep = nn::convert(net);
  ASSERT_EQ(rep.converted.size(), 1u) << rep.to_string();
  EXPECT_EQ(rep.converted[0].path, "2");
  ASSERT_EQ(rep.kept.size(), 2u) << rep.to_string();
  EXPECT_EQ(rep.kept[0].path, "0");
  EXPECT_NE(rep.kept[0].note.find("max_norm renormalises looked-up rows"), std::string::npos) << rep.kept[0].note;
  EXPECT_EQ(rep.kept[1].path, "1");
  EXPECT_NE(rep.kept[1].note.find("sparse gradients"), std::string::npos) << rep.kept[1].note;
  EXPECT_NE(net[0]->as<torch::nn::EmbeddingImpl>(), nullptr);
  EXPECT_EQ(net[0]->as<nn::EmbeddingImpl>(), nullptr);
  // quantize() names the reason, not "convert replaces it".
  const std::string e = qforge::testing::error_of([&] { quantize(*net, qint8); });
  EXPECT_NE(e.find("\n  0 (torch::nn::Embedding): max_norm renormalises"), std::string::npos) << e;
}

// Code written for earlier releases still compiles: Scheme::strict (ignored) and models::fold_conv_bn.
TEST(Convert, EarlierPublicNamesStillCompile) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  Scheme s(qint8);
  s.strict = false;  // ignored: refusing plain layers is the default
#pragma GCC diagnostic pop
  torch::nn::Sequential plain(torch::nn::Linear(4, 4));
  EXPECT_NE(qforge::testing::error_of([&] { quantize(*plain, s); }).find("have no quantizers"), std::string::npos);
  nn::Conv2d conv(torch::nn::Conv2dOptions(2, 3, 1));
  torch::nn::BatchNorm2d bn(3);
  bn->eval();
  nn::Conv2d (*old_name)(const nn::Conv2d&, const torch::nn::BatchNorm2d&) = &models::fold_conv_bn;
  nn::Conv2d (*new_name)(const nn::Conv2d&, const torch::nn::BatchNorm2d&) = &nn::fold_conv_bn;
  EXPECT_EQ(old_name, new_name);
}
