// A frozen depthwise Conv2d (groups == in == out channels, W8A8) runs the depthwise int8 kernel:
// describe() names the table's choice, the output matches the fake-quant forward, ReLU and
// checkpoints round trip, depthwise Conv1d too; int4 depthwise and other grouped convolutions keep
// the per-call fallback.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantize.h"
#include "framework/io/model_io.h"
#include "framework/nn/conv.h"
#include "kernels/cpu/kernel_choice.h"

using namespace qforge;

namespace {

double rel_error(const at::Tensor& a, const at::Tensor& b) {
  const double denom = std::max(b.abs().max().item<double>(), 1e-12);
  return (a - b).abs().max().item<double>() / denom;
}

torch::nn::Conv2dOptions depthwise(int64_t c) { return torch::nn::Conv2dOptions(c, c, 3).stride(2).padding(1).groups(c); }

// Per-channel `qt` weights, static int8 activations calibrated by min / max.
Scheme static_scheme(const QType& qt) {
  Scheme s(qt);
  s.weight_granularity = Granularity::kPerChannel;
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  return s;
}

// Quantized W8A8 (or int4 weights), calibrated on `x`, not frozen yet.
nn::Conv2d calibrated(const torch::nn::Conv2dOptions& o, const QType& qt, const at::Tensor& x) {
  torch::manual_seed(3);
  nn::Conv2d c(o);
  c->eval();
  quantize(*c, static_scheme(qt));
  Calibration calib(*c);
  at::NoGradGuard g;
  c->forward(x);
  return c;
}

}  // namespace

TEST(ConvDepthwise, FrozenW8A8RunsTheDepthwiseKernelAndMatchesFakeQuant) {
  const at::Tensor x = at::randn({2, 20, 15, 13});
  nn::Conv2d c = calibrated(depthwise(20), qint8, x);
  at::Tensor y_fq, w_fq;
  {
    at::NoGradGuard g;
    y_fq = c->forward(x);
    w_fq = c->weight_quantizer()->forward(c->weight).detach();
  }
  const kernels::ConvChoice plan = kernels::choose_conv_kernel(false, usable_isa(), 9, /*depthwise=*/true);
  EXPECT_EQ(c->plan().kernel, plan.kernel.kernel);
  freeze(*c);
  const std::string what = c->report().kernel + " fallback '" + c->report().fallback_reason + "'";
  EXPECT_EQ(c->report().kernel, plan.kernel.kernel) << what;
  EXPECT_EQ(c->report().kernel.rfind("conv_dw_s8", 0), 0u) << what;
  EXPECT_TRUE(c->report().fallback_reason.empty()) << what;
  at::NoGradGuard g;
  const at::Tensor y = c->forward(x);
  ASSERT_EQ(y.sizes(), y_fq.sizes());
  EXPECT_LE(rel_error(y, y_fq), 1e-5);
  EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(at::equal(c->forward_relu(x), at::relu(y)));
  EXPECT_TRUE(at::equal(c->forward(x[1]), y[1]));  // unbatched
  // The frozen weight comes back in torch's [C, 1, kh, kw]: the fake-quant weight's codes and values.
  const QuantizedTensor fw = c->frozen_weight();
  EXPECT_EQ(fw.shape, (std::vector<int64_t>{20, 1, 3, 3}));
  const at::Tensor codes = (w_fq / fw.scale.reshape({20, 1, 1, 1})).round();
  EXPECT_TRUE(at::equal(fw.data.to(at::kFloat).reshape({20, 1, 3, 3}), codes));
  EXPECT_LE(rel_error(fw.dequantize(), w_fq), 1e-6);
  // A checkpoint of the frozen layer loads into a fresh one: the same kernel, the same values.
  const std::string path = (std::filesystem::temp_directory_path() / "qforge_conv_depthwise_test.h5").string();
  io::save_model(*c, path);
  nn::Conv2d again = calibrated(depthwise(20), qint8, at::randn({1, 20, 15, 13}));
  io::load_model(*again, path);
  std::filesystem::remove(path);
  EXPECT_EQ(again->report().kernel, c->report().kernel);
  EXPECT_TRUE(at::equal(again->forward(x), y));
}

TEST(ConvDepthwise, Int4DepthwiseAndOtherGroupsKeepTheFallbackAndSayWhy) {
  const at::Tensor x = at::randn({1, 8, 9, 9});
  nn::Conv2d w4 = calibrated(depthwise(8), qint4, x);
  freeze(*w4);
  EXPECT_EQ(w4->report().kernel, "dequantize+at::conv");
  EXPECT_NE(w4->report().fallback_reason.find("no int4 depthwise"), std::string::npos) << w4->report().fallback_reason;
  nn::Conv2d grouped = calibrated(torch::nn::Conv2dOptions(8, 8, 3).padding(1).groups(2), qint8, x);
  at::Tensor y_fq;
  {
    at::NoGradGuard g;
    y_fq = grouped->forward(x);
  }
  freeze(*grouped);
  EXPECT_NE(grouped->report().fallback_reason.find("grouped convolution (groups=2"), std::string::npos)
      << grouped->report().fallback_reason;
  at::NoGradGuard g;
  EXPECT_LE(rel_error(grouped->forward(x), y_fq), 1e-5);
}

TEST(ConvDepthwise, FrozenDepthwiseConv1dRunsTheDepthwiseKernelAndMatchesFakeQuant) {
  // Conv1d fills the width only (kernel 1 x k): the same kernel, its height one row.
  const at::Tensor x = at::randn({3, 12, 40});
  torch::manual_seed(4);
  nn::Conv1d c(torch::nn::Conv1dOptions(12, 12, 5).stride(2).padding(2).dilation(2).groups(12));
  c->eval();
  quantize(*c, static_scheme(qint8));
  at::Tensor y_fq;
  {
    Calibration calib(*c);
    at::NoGradGuard g;
    c->forward(x);
  }
  {
    at::NoGradGuard g;
    y_fq = c->forward(x);
  }
  freeze(*c);
  const std::string what = c->report().kernel + " fallback '" + c->report().fallback_reason + "'";
  EXPECT_EQ(c->report().kernel.rfind("conv_dw_s8", 0), 0u) << what;
  at::NoGradGuard g;
  const at::Tensor y = c->forward(x);
  ASSERT_EQ(y.sizes(), y_fq.sizes());
  EXPECT_LE(rel_error(y, y_fq), 1e-5) << what;
}
