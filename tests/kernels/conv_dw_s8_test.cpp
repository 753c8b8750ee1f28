// Depthwise int8 convolution: the reference's int32 sums against at::conv2d (groups == C) on the
// integer values, every depthwise entry of conv_s8_kernels() equal to the reference bit for bit
// (ReLU, bias, requantized output, channel tails), the dispatcher running what the plan names.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/conv_dw_s8.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/reference.h"
#include "kernel_test_util.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

ConvGeometry dw_geometry(int64_t B, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t s, int64_t p,
                         int64_t d = 1) {
  return ConvGeometry{B, C, H, W, /*out_channels=*/C, kh, kw, s, s, p, p, d, d};
}

// MobileNetV2's shapes (3x3, stride 1 and 2, pad 1) and tails: C not a multiple of 8 or 16,
// 5x5, 1x3, dilation, no padding, one channel, vertical and horizontal stride / padding /
// dilation apart (a swapped pair would show).
std::vector<ConvGeometry> dw_geometries() {
  return {dw_geometry(2, 32, 12, 12, 3, 3, 1, 1), dw_geometry(1, 96, 14, 14, 3, 3, 2, 1),
          dw_geometry(1, 144, 7, 7, 3, 3, 1, 1),  dw_geometry(3, 7, 9, 11, 3, 3, 1, 1),
          dw_geometry(1, 33, 10, 8, 5, 5, 2, 2),  dw_geometry(2, 24, 6, 9, 1, 3, 1, 0),
          dw_geometry(1, 40, 11, 11, 3, 3, 1, 2, 2), dw_geometry(1, 1, 5, 5, 3, 3, 1, 0),
          dw_geometry(0, 16, 4, 4, 3, 3, 1, 1),
          ConvGeometry{1, 24, 13, 10, /*out_channels=*/24, 3, 5, /*stride*/ 2, 1, /*pad*/ 0, 2, /*dilation*/ 1, 2},
          ConvGeometry{2, 17, 9, 16, /*out_channels=*/17, 3, 3, /*stride*/ 1, 3, /*pad*/ 2, 1, /*dilation*/ 2, 1}};
}

struct DwCase {
  ConvGeometry g;
  std::vector<int8_t> x, w;  // x: [B, H, W, C] codes; w: [C, kh, kw]
  std::vector<float> w_scale, bias;
  std::vector<int16_t> packed;
  float a_scale = 0.03f;
};

// Full int8 ranges (a requantized input may hold -128).
DwCase make_dw(const ConvGeometry& g, uint32_t seed) {
  DwCase c;
  c.g = g;
  const int64_t C = g.in_channels, taps = g.kernel_h * g.kernel_w;
  c.x = random_s8(g.batch * g.in_h * g.in_w * C, -128, 127, seed);
  c.w = random_s8(C * taps, -128, 127, seed + 1);
  c.w_scale = random_f32(C, 0.001f, 0.05f, seed + 2);
  c.bias = random_f32(C, -2.0f, 2.0f, seed + 3);
  c.packed.resize(c.w.size());
  pack_conv_dw_s8(c.w.data(), C, taps, c.packed.data());
  return c;
}

size_t out_size(const ConvGeometry& g) { return g.batch * g.out_h() * g.out_w() * g.out_channels; }

std::vector<float> reference(const DwCase& c, bool bias, bool relu) {
  std::vector<float> y(out_size(c.g));
  conv2d_dw_s8_reference(c.x.data(), c.a_scale, c.w.data(), c.w_scale.data(), bias ? c.bias.data() : nullptr, c.g,
                         y.data(), relu);
  return y;
}

ConvS8Problem dw_call(const DwCase& c, bool bias, bool relu, float* y, const RequantOut* rq, RunInfo* info) {
  ConvS8Problem p;
  p.x_nhwc = c.x.data();
  p.a_scale = c.a_scale;
  p.g = c.g;
  p.m = c.g.gemm_m();
  p.depthwise = true;
  p.w_dw = c.packed.data();
  p.w_scale = c.w_scale.data();
  p.bias = bias ? c.bias.data() : nullptr;
  p.y = y;
  p.rq = rq;
  p.relu = relu;
  p.info = info;
  return p;
}

}  // namespace

TEST(ConvDwS8, ReferenceSumsEqualLibTorchGroupedConvolutionOnTheCodes) {
  uint32_t seed = 1200;
  for (const ConvGeometry& g : dw_geometries()) {
    if (g.batch == 0) continue;
    const DwCase c = make_dw(g, seed += 10);
    const int64_t C = g.in_channels;
    // Integer values below 2^24 sum exactly in float, whatever order LibTorch adds them in.
    const at::Tensor x = at::from_blob(const_cast<int8_t*>(c.x.data()), {g.batch, g.in_h, g.in_w, C}, at::kChar)
                             .permute({0, 3, 1, 2})
                             .to(at::kFloat);
    const at::Tensor w =
        at::from_blob(const_cast<int8_t*>(c.w.data()), {C, 1, g.kernel_h, g.kernel_w}, at::kChar).to(at::kFloat);
    const at::Tensor acc = at::conv2d(x, w, {}, {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w},
                                      {g.dilation_h, g.dilation_w}, C)
                               .permute({0, 2, 3, 1})
                               .contiguous();
    const std::vector<float> y = reference(c, true, false);
    const float* a = acc.data_ptr<float>();
    for (size_t i = 0; i < y.size(); ++i) {
      const int64_t ch = static_cast<int64_t>(i) % C;
      const float want = std::fmaf(static_cast<float>(static_cast<int32_t>(a[i])) * c.w_scale[ch], c.a_scale, c.bias[ch]);
      ASSERT_EQ(want, y[i]) << "C=" << C << " index " << i;
    }
  }
}

TEST(ConvDwS8, EveryDepthwiseEntryEqualsTheReferenceBitForBit) {
  uint32_t seed = 1300;
  for (const ConvGeometry& g : dw_geometries()) {
    const DwCase c = make_dw(g, seed += 10);
    int ran = 0;
    for (const KernelEntry<ConvS8Problem>& e : conv_s8_kernels()) {
      if (!machine_has(e.isa) || conv_entry_kind(e) != ConvEntryKind::kDepthwise) continue;
      ++ran;
      for (bool bias : {false, true}) {
        for (bool relu : {false, true}) {
          const std::vector<float> want = reference(c, bias, relu);
          std::vector<float> y(want.size(), 12345.0f);
          RunInfo info;
          e.run(dw_call(c, bias, relu, y.data(), nullptr, &info));
          EXPECT_EQ(info.kernel, e.name);
          EXPECT_TRUE(bitwise_equal(y.data(), want.data(), want.size()))
              << e.name << " C=" << g.in_channels << " bias=" << bias << " relu=" << relu;
          // Requantized: the next quantizer's codes of the float result.
          std::vector<int8_t> q(want.size(), 99), q_want(want.size());
          RequantOut rq;
          rq.q = q.data();
          rq.inv = 1.0f / 0.07f;
          rq.qmin = -128;
          quantize_static_s8_reference(want.data(), static_cast<int64_t>(want.size()), rq.inv, rq.qmin, rq.qmax,
                                       q_want.data());
          e.run(dw_call(c, bias, relu, nullptr, &rq, nullptr));
          EXPECT_EQ(q, q_want) << e.name << " requantized, C=" << g.in_channels;
        }
      }
    }
    EXPECT_GE(ran, 1);
  }
}

TEST(ConvDwS8, DispatcherRunsWhatThePlanNamesAtEveryIsaCap) {
  const DwCase c = make_dw(dw_geometry(1, 96, 14, 14, 3, 3, 1, 1), 1400);
  const std::vector<float> want = reference(c, true, true);
  for (Isa isa : usable_isas()) {
    qforge::ScopedMaxIsa cap(isa);
    const ConvChoice plan = choose_conv_kernel(false, qforge::usable_isa(), 9, /*depthwise=*/true);
    EXPECT_EQ(plan.large_rows, 0) << isa_name(isa);
    EXPECT_FALSE(plan.needs_onednn_copy);
    std::vector<float> y(want.size());
    RunInfo info;
    conv2d_s8(dw_call(c, true, true, y.data(), nullptr, &info));
    EXPECT_EQ(info.kernel, plan.kernel.kernel) << isa_name(isa);
    EXPECT_EQ(info.kernel.rfind("conv_dw_s8", 0), 0u) << info.kernel;
    EXPECT_TRUE(bitwise_equal(y.data(), want.data(), want.size())) << isa_name(isa);
  }
}

TEST(ConvDwS8, NonDepthwiseGeometryAndMissingWeightAreErrors) {
  DwCase c = make_dw(dw_geometry(1, 8, 5, 5, 3, 3, 1, 1), 1500);
  std::vector<float> y(out_size(c.g));
  ConvGeometry bad = c.g;
  bad.out_channels = 16;
  EXPECT_THROW(conv2d_dw_s8_reference(c.x.data(), c.a_scale, c.w.data(), c.w_scale.data(), nullptr, bad, y.data()),
               qforge::Error);
  ConvS8Problem p = dw_call(c, false, false, y.data(), nullptr, nullptr);
  p.g = bad;
  EXPECT_THROW(conv2d_dw_s8_run(p, qforge::kernels::detail::conv_dw_s8_rows_scalar, "conv_dw_s8"), qforge::Error);
  p = dw_call(c, false, false, y.data(), nullptr, nullptr);
  p.w_dw = nullptr;
  EXPECT_THROW(conv2d_dw_s8_run(p, qforge::kernels::detail::conv_dw_s8_rows_scalar, "conv_dw_s8"), qforge::Error);
}
