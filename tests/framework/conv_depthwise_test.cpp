// A frozen depthwise Conv2d (groups == in == out channels, W8A8) runs the depthwise int8 kernel:
// describe() names the table's choice, the output matches the fake-quant forward, ReLU and
// checkpoints round trip, depthwise Conv1d too; int4 depthwise keeps the per-call fallback. Other
// grouped convolutions run the integer convolution per group.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "fake_quant/fake_quantize.h"
#include "framework/api/quantize.h"
#include "framework/io/model_io.h"
#include "framework/nn/conv.h"
#include "kernels/cpu/kernel_choice.h"
#include "tests/error_of.h"

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

TEST(ConvDepthwise, Int4DepthwiseKeepsTheFallbackAndSaysWhy) {
  const at::Tensor x = at::randn({1, 8, 9, 9});
  nn::Conv2d w4 = calibrated(depthwise(8), qint4, x);
  freeze(*w4);
  EXPECT_EQ(w4->report().kernel, "dequantize+at::conv");
  EXPECT_NE(w4->report().fallback_reason.find("no int4 depthwise"), std::string::npos) << w4->report().fallback_reason;
}

// Grouped convolutions (1 < groups < channels, ResNeXt / ShuffleNet style) run the integer
// convolution once per group: int8 and int4 weights, strides, padding, dilation, a bias, ReLU, a
// fused residual, int8 codes out; the frozen weight and a checkpoint round trip.
TEST(ConvGrouped, FrozenGroupedConvolutionRunsTheIntegerKernelPerGroupAndMatchesFakeQuant) {
  for (const QType& qt : {qint8, qint4}) {
    for (const int64_t groups : {2, 4}) {
      const std::string what = std::string(qt.name) + ", groups " + std::to_string(groups);
      const auto o = torch::nn::Conv2dOptions(16, 24, 3).stride(2).padding(2).dilation(2).groups(groups);
      const at::Tensor x = at::randn({3, 16, 14, 11});
      nn::Conv2d c = calibrated(o, qt, x);
      at::Tensor y_fq, w_fq;
      {
        at::NoGradGuard g;
        y_fq = c->forward(x);
        w_fq = c->weight_quantizer()->forward(c->weight).detach();
      }
      // int8 weights: oneDNN's grouped convolution where the ISA has its entry (AVX-512 VNNI), else
      // one im2col convolution per group; int4 weights: per group.
      const bool one_call = qt.bits == 8 && usable_isa() >= Isa::kAvx512Vnni;
      const std::string text = one_call ? "(" + std::to_string(groups) + " groups in one call)"
                                        : "per group (" + std::to_string(groups) + " groups)";
      EXPECT_NE(c->plan().kernel.find(text), std::string::npos) << what << ": " << c->plan().kernel;
      freeze(*c);
      EXPECT_NE(c->report().kernel.find(text), std::string::npos) << what << ": " << c->report().kernel;
      // An integer kernel (a slower one's reason is only said where the ISA is capped).
      EXPECT_NE(c->report().kernel.rfind("dequantize+at::conv", 0), 0u) << what << ": " << c->report().kernel;
      at::NoGradGuard g;
      const at::Tensor y = c->forward(x);
      ASSERT_EQ(y.sizes(), y_fq.sizes()) << what;
      EXPECT_LE(rel_error(y, y_fq), 1e-5) << what;
      EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      EXPECT_TRUE(at::equal(c->forward_relu(x), at::relu(y))) << what;
      EXPECT_TRUE(at::equal(c->forward(x[1]), y[1])) << what;  // unbatched
      const at::Tensor r = at::randn(y.sizes());
      EXPECT_LE(rel_error(c->forward_add(x, r, /*relu=*/true, /*in_place=*/false), at::relu(y + r)), 1e-6) << what;
      // The frozen weight in torch's [N, C / groups, kh, kw]: the fake-quant weight's values.
      const QuantizedTensor fw = c->frozen_weight();
      EXPECT_EQ(fw.shape, (std::vector<int64_t>{24, 16 / groups, 3, 3})) << what;
      EXPECT_LE(rel_error(fw.dequantize(), w_fq), 1e-6) << what;
      const std::string path = (std::filesystem::temp_directory_path() / "qforge_conv_grouped_test.h5").string();
      io::save_model(*c, path);
      nn::Conv2d again = calibrated(o, qt, at::randn({1, 16, 14, 11}));
      io::load_model(*again, path);
      std::filesystem::remove(path);
      EXPECT_EQ(again->report().kernel, c->report().kernel) << what;
      EXPECT_TRUE(at::equal(again->forward(x), y)) << what;
    }
  }
}

// A grouped layer frozen where oneDNN runs it keeps working when the ISA cap is lowered after
// freeze (one convolution per group, the same values); a broadcast residual takes add_residual's
// path on both; an empty or too small input is refused; grouped Conv1d runs too.
TEST(ConvGrouped, LoweredIsaBroadcastResidualsAndConv1d) {
  const at::Tensor x = at::randn({2, 16, 9, 9});
  nn::Conv2d c = calibrated(torch::nn::Conv2dOptions(16, 32, 3).padding(1).groups(4), qint8, x);
  freeze(*c);
  at::NoGradGuard g;
  const at::Tensor y = c->forward(x);
  const at::Tensor r = at::randn({32, 1, 1});  // broadcast over batch and pixels
  const at::Tensor yr = c->forward_add(x, r, /*relu=*/true, /*in_place=*/false);
  EXPECT_LE(rel_error(yr, at::relu(y + r)), 1e-6);
  {
    ScopedMaxIsa cap(Isa::kAvx2);
    const at::Tensor y2 = c->forward(x);
    EXPECT_LE(rel_error(y2, y), 1e-6);
    EXPECT_LE(rel_error(c->forward_add(x, r, true, false), yr), 1e-6);
  }
  EXPECT_NE(qforge::testing::error_of([&] { c->forward(at::randn({1, 16, 0, 9})); }).find("smaller than"),
            std::string::npos);
  EXPECT_EQ(c->forward(at::randn({1, 16, 1, 1})).sizes(), (at::IntArrayRef{1, 32, 1, 1}));  // padding 1: valid
  // Grouped Conv1d: its height one row.
  const at::Tensor x1 = at::randn({3, 12, 30});
  torch::manual_seed(4);
  nn::Conv1d c1(torch::nn::Conv1dOptions(12, 18, 5).padding(2).groups(3));
  c1->eval();
  quantize(*c1, static_scheme(qint8));
  at::Tensor y_fq;
  {
    Calibration calib(*c1);
    c1->forward(x1);
  }
  y_fq = c1->forward(x1);
  freeze(*c1);
  EXPECT_NE(c1->report().kernel.find(" groups"), std::string::npos) << c1->report().kernel;
  EXPECT_LE(rel_error(c1->forward(x1), y_fq), 1e-5);
}

// A grouped convolution feeding another as int8 codes (Conv2d -> ReLU -> Conv2d chains pass
// codes once frozen): the consumer's output equals the one from the float path.
TEST(ConvGrouped, GroupedConvolutionsPassInt8CodesToTheNextConvolution) {
  const at::Tensor x = at::randn({2, 8, 10, 10});
  const auto o1 = torch::nn::Conv2dOptions(8, 16, 3).padding(1).groups(2);
  const auto o2 = torch::nn::Conv2dOptions(16, 16, 3).padding(1).groups(4);
  nn::Conv2d a = calibrated(o1, qint8, x);
  at::Tensor mid;
  {
    at::NoGradGuard g;
    mid = at::relu(a->forward(x));
  }
  nn::Conv2d b = calibrated(o2, qint8, mid);
  freeze(*a);
  freeze(*b);
  ASSERT_TRUE(b->takes_codes());
  at::NoGradGuard g;
  const at::Tensor via_float = b->forward(a->forward_relu(x));
  const at::Tensor codes = a->forward_relu_codes(x, *b);
  EXPECT_EQ(codes.scalar_type(), at::kChar);
  EXPECT_LE(rel_error(b->forward(codes), via_float), 1e-6);
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
