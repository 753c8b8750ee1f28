// nn::convert keeps every option of the layers it replaces: for each (padding modes, dilation,
// depthwise groups, padding "same", padding_idx, from_pretrained, LayerNorm without affine and with
// its own eps) the converted Sequential's float forward and gradients equal the LibTorch ones bit for bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include <functional>
#include <string>
#include <vector>

#include "framework/nn/convert.h"
#include "framework/nn/embedding.h"
#include "framework/nn/layer_norm.h"

using namespace qforge;

// One layer configuration (outside the anonymous namespace: the test fixture derives from it).
struct OptionCase {
  std::string name;
  std::function<torch::nn::Sequential()> make;
  std::function<at::Tensor()> input;
};

std::ostream& operator<<(std::ostream& os, const OptionCase& c) { return os << c.name; }

namespace {

torch::nn::Conv2dOptions conv2d_options() { return torch::nn::Conv2dOptions(4, 6, 3); }
at::Tensor option_image() { return at::randn({2, 4, 9, 9}); }

std::vector<OptionCase> option_cases() {
  using torch::nn::Conv1dOptions;
  return {
      {"conv2d_reflect", [] { return torch::nn::Sequential(torch::nn::Conv2d(conv2d_options().padding(1).padding_mode(torch::kReflect))); }, option_image},
      {"conv2d_circular", [] { return torch::nn::Sequential(torch::nn::Conv2d(conv2d_options().padding(2).padding_mode(torch::kCircular))); }, option_image},
      {"conv2d_replicate", [] { return torch::nn::Sequential(torch::nn::Conv2d(conv2d_options().padding(1).padding_mode(torch::kReplicate))); }, option_image},
      {"conv2d_dilation", [] { return torch::nn::Sequential(torch::nn::Conv2d(conv2d_options().dilation({2, 3}).stride(2))); }, option_image},
      {"conv2d_depthwise", [] { return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 8, 3).groups(4).padding(1))); }, option_image},
      {"conv2d_same", [] { return torch::nn::Sequential(torch::nn::Conv2d(conv2d_options().padding(torch::kSame).dilation(2))); }, option_image},
      {"conv1d_reflect_same", [] {
         return torch::nn::Sequential(torch::nn::Conv1d(Conv1dOptions(3, 5, 4).padding(torch::kSame)),
                                      torch::nn::Conv1d(Conv1dOptions(5, 5, 3).padding(1).padding_mode(torch::kReflect).groups(5)));
       }, [] { return at::randn({2, 3, 12}); }},
      {"embedding_padding_idx", [] { return torch::nn::Sequential(torch::nn::Embedding(torch::nn::EmbeddingOptions(12, 5).padding_idx(3))); },
       [] { return at::tensor({0, 3, 5, 3, 11}, at::kLong).reshape({1, 5}); }},
      {"embedding_from_pretrained", [] {
         return torch::nn::Sequential(torch::nn::Embedding::from_pretrained(at::randn({7, 4}), torch::nn::EmbeddingFromPretrainedOptions().freeze(false).padding_idx(1)));
       }, [] { return at::tensor({1, 2, 6}, at::kLong); }},
      {"layer_norm_no_affine_eps", [] {
         return torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({3, 5}).elementwise_affine(false).eps(1e-2)));
       }, [] { return at::randn({4, 3, 5}) * 0.1; }},
      {"layer_norm_eps", [] { return torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({5}).eps(0.5))); },
       [] { return at::randn({4, 5}); }},
  };
}

// Forward output and every parameter's gradient (by registry name) after one backward.
std::pair<at::Tensor, std::vector<at::Tensor>> forward_and_grads(torch::nn::Sequential& net, const at::Tensor& x) {
  for (auto& p : net->parameters()) p.mutable_grad() = at::Tensor();
  const at::Tensor y = net->forward(x);
  std::vector<at::Tensor> grads;
  if (y.requires_grad()) {
    (y * at::linspace(-1, 1, y.numel()).reshape(y.sizes())).sum().backward();
    for (const auto& p : net->named_parameters()) grads.push_back(p.value().grad().defined() ? p.value().grad().clone() : at::Tensor());
  }
  return {y.detach(), grads};
}

}  // namespace

class ConvertOptionsTest : public ::testing::TestWithParam<OptionCase> {};

TEST_P(ConvertOptionsTest, FloatForwardAndGradientsAreUnchanged) {
  at::manual_seed(11);
  torch::nn::Sequential net = GetParam().make();
  const at::Tensor x = GetParam().input();
  const auto names_before = net->named_parameters().keys();
  const auto [y, grads] = forward_and_grads(net, x);
  const nn::ConvertReport rep = nn::convert(net);
  ASSERT_EQ(rep.converted.size(), net->size()) << rep.to_string();
  EXPECT_TRUE(rep.kept.empty()) << rep.to_string();
  EXPECT_EQ(net->named_parameters().keys(), names_before);
  const auto [y2, grads2] = forward_and_grads(net, x);
  EXPECT_TRUE(y.sizes() == y2.sizes() && at::equal(y, y2)) << (y - y2).abs().max().item<double>();
  ASSERT_EQ(grads.size(), grads2.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_EQ(grads[i].defined(), grads2[i].defined()) << names_before[i];
    if (grads[i].defined()) {
      EXPECT_TRUE(at::equal(grads[i], grads2[i])) << names_before[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Convert, ConvertOptionsTest, ::testing::ValuesIn(option_cases()),
                         [](const ::testing::TestParamInfo<OptionCase>& info) { return info.param.name; });

TEST(ConvertOptions, EmbeddingPaddingRowGetsNoGradientAndFrozenTableStaysFrozen) {
  torch::nn::Sequential net(torch::nn::Embedding(torch::nn::EmbeddingOptions(6, 3).padding_idx(2)),
                            torch::nn::Embedding::from_pretrained(at::randn({6, 3})));
  nn::convert(net);
  const auto* padded = net[0]->as<nn::EmbeddingImpl>();
  const auto* pretrained = net[1]->as<nn::EmbeddingImpl>();
  ASSERT_TRUE(padded && pretrained);
  EXPECT_EQ(padded->options.padding_idx().value(), 2);
  EXPECT_FALSE(pretrained->weight.requires_grad());  // from_pretrained freezes by default
  net[0]->as<nn::EmbeddingImpl>()->forward(at::tensor({2, 2, 4}, at::kLong)).sum().backward();
  EXPECT_TRUE(at::equal(padded->weight.grad()[2], at::zeros({3})));
  EXPECT_FALSE(at::equal(padded->weight.grad()[4], at::zeros({3})));
}
