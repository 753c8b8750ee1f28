// Integer convolution: the direct reference against at::conv2d on the integer values, the fast
// im2col paths (int8 and int4 weights, every usable ISA) equal to the reference bit for bit,
// geometry errors; static activation quantization (quantize_static_s8) against its reference.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "framework/core/error.h"
#include "kernels/cpu/conv_s8.h"
#include "kernels/cpu/gemm_s8s8s32_onednn.h"
#include "kernels/cpu/kernel_choice.h"
#include "kernels/cpu/packed_linear.h"
#include "kernels/cpu/quantize_rows_s8.h"
#include "kernels/cpu/workspace.h"
#include "kernel_test_util.h"

using namespace qforge::kernels;
using namespace qforge::kernels::testing;

namespace {

ConvGeometry geometry(int64_t B, int64_t C, int64_t H, int64_t W, int64_t N, int64_t kh, int64_t kw, int64_t s = 1,
                      int64_t p = 0, int64_t d = 1) {
  ConvGeometry g;
  g.batch = B;
  g.in_channels = C;
  g.in_h = H;
  g.in_w = W;
  g.out_channels = N;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = g.stride_w = s;
  g.pad_h = g.pad_w = p;
  g.dilation_h = g.dilation_w = d;
  return g;
}

at::Tensor from_s8(const std::vector<int8_t>& v, at::IntArrayRef shape) {
  return at::from_blob(const_cast<int8_t*>(v.data()), shape, at::kChar).clone();
}

// Inputs of one case: NCHW codes, [N, C, kh, kw] weight values, scales, bias.
struct ConvCase {
  ConvGeometry g;
  std::vector<int8_t> x, w;
  std::vector<float> w_scale, bias;
  float a_scale = 0.02f;
};

ConvCase make_case(const ConvGeometry& g, int wlo, int whi, uint32_t seed) {
  ConvCase c;
  c.g = g;
  c.x = random_s8(g.batch * g.in_channels * g.in_h * g.in_w, -127, 127, seed);
  c.w = random_s8(g.out_channels * g.gemm_k(), wlo, whi, seed + 1);
  c.w_scale = random_f16_exact(g.out_channels, 0.001f, 0.05f, seed + 2);  // fp16-exact for int4
  c.bias = random_f32(g.out_channels, -2.0f, 2.0f, seed + 3);
  return c;
}

std::vector<float> run_reference(const ConvCase& c, const int32_t* zero, bool relu) {
  const ConvGeometry& g = c.g;
  std::vector<float> y(g.batch * g.out_channels * g.out_h() * g.out_w());
  conv2d_s8_reference(c.x.data(), c.a_scale, c.w.data(), c.w_scale.data(), zero, c.bias.data(), g, y.data(), relu);
  return y;
}

// x NCHW -> NHWC codes; W [N, C, kh, kw] -> [N, kh, kw, C] (padded to Kp columns with zeros).
at::Tensor nhwc(const ConvCase& c) {
  return from_s8(c.x, {c.g.batch, c.g.in_channels, c.g.in_h, c.g.in_w}).permute({0, 2, 3, 1}).contiguous();
}
at::Tensor weight_rows(const ConvCase& c, int64_t Kp) {
  const ConvGeometry& g = c.g;
  at::Tensor w = from_s8(c.w, {g.out_channels, g.in_channels, g.kernel_h, g.kernel_w})
                     .permute({0, 2, 3, 1})
                     .reshape({g.out_channels, g.gemm_k()});
  if (Kp > g.gemm_k()) w = at::constant_pad_nd(w, {0, Kp - g.gemm_k()}, 0);
  return w.contiguous();
}
// The fast path's NHWC result as NCHW floats.
std::vector<float> to_nchw(const at::Tensor& y_nhwc) {
  const at::Tensor t = y_nhwc.permute({0, 3, 1, 2}).contiguous();
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}

const std::vector<ConvGeometry>& geometries() {
  static const std::vector<ConvGeometry> gs{
      geometry(2, 1, 28, 28, 32, 3, 3, 1, 1),      // the CNN's first layer (K = 9)
      geometry(3, 32, 14, 14, 64, 3, 3, 1, 1),     // its second (K = 288)
      geometry(1, 5, 9, 11, 7, 3, 2, 2, 1),        // odd sizes, stride 2, rectangular kernel
      geometry(2, 3, 10, 10, 17, 3, 3, 1, 2, 2),   // dilation with padding
      geometry(1, 16, 1, 40, 33, 1, 5, 1, 2),      // Conv1d as H = 1
      geometry(4, 8, 6, 6, 16, 1, 1),              // 1x1 (K = C, a plain GEMM)
      geometry(1, 4, 3, 3, 5, 3, 3, 1, 4),         // padding larger than the input
  };
  return gs;
}

}  // namespace

TEST(ConvS8, ReferenceEqualsConv2dOnIntegerValues) {
  // With integer-valued float tensors at::conv2d is exact below 2^24, so acc must equal it.
  for (const ConvGeometry& g : geometries()) {
    const ConvCase c = make_case(g, -127, 127, 11);
    const at::Tensor acc = at::conv2d(from_s8(c.x, {g.batch, g.in_channels, g.in_h, g.in_w}).to(at::kDouble),
                                      from_s8(c.w, {g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}).to(at::kDouble),
                                      {}, {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w}, {g.dilation_h, g.dilation_w});
    std::vector<float> ones(g.out_channels, 1.0f);
    std::vector<float> y(acc.numel());
    conv2d_s8_reference(c.x.data(), 1.0f, c.w.data(), ones.data(), nullptr, nullptr, g, y.data());
    const at::Tensor got = at::from_blob(y.data(), acc.sizes(), at::kFloat).to(at::kDouble);
    EXPECT_TRUE(at::equal(got, acc)) << "geometry C=" << g.in_channels << " N=" << g.out_channels;
  }
}

TEST(ConvS8, ReferenceEpilogueIsFmaWithBiasThenRelu) {
  const ConvGeometry g = geometry(1, 1, 1, 1, 2, 1, 1);
  const std::vector<int8_t> x{3}, w{-5, 7};
  const std::vector<float> ws{0.25f, 0.5f}, bias{1.0f, -20.0f};
  std::vector<float> y(2);
  conv2d_s8_reference(x.data(), 0.5f, w.data(), ws.data(), nullptr, bias.data(), g, y.data(), false);
  EXPECT_EQ(y[0], std::fmaf(-15.0f * 0.25f, 0.5f, 1.0f));
  EXPECT_EQ(y[1], std::fmaf(21.0f * 0.5f, 0.5f, -20.0f));
  conv2d_s8_reference(x.data(), 0.5f, w.data(), ws.data(), nullptr, bias.data(), g, y.data(), true);
  EXPECT_EQ(y[0], 0.0f);  // -0.875 -> 0
  EXPECT_EQ(y[1], 0.0f);  // -14.75 -> 0
}

TEST(ConvS8, Int8FastPathEqualsReferenceBitForBit) {
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    uint32_t seed = 100;
    for (const ConvGeometry& g : geometries()) {
      const ConvCase c = make_case(g, -127, 127, seed += 10);
      PackOptions opts;
      opts.onednn = false;
      const PackedLinearS8 packed(weight_rows(c, g.gemm_k()),
                                  at::from_blob(const_cast<float*>(c.w_scale.data()), {g.out_channels}, at::kFloat).clone(),
                                  at::Tensor(), opts);
      const at::Tensor x = nhwc(c);
      for (bool relu : {false, true}) {
        at::Tensor y = at::full({g.batch, g.out_h(), g.out_w(), g.out_channels}, 12345.0f);
        RunInfo info;
        conv2d_s8s8f32(x.data_ptr<int8_t>(), c.a_scale, packed.view(), packed.w_scale().data_ptr<float>(),
                       c.bias.data(), g, y.data_ptr<float>(), relu, &info);
        const std::vector<float> want = run_reference(c, nullptr, relu), got = to_nchw(y);
        EXPECT_TRUE(bitwise_equal(got.data(), want.data(), want.size()))
            << isa_name(isa) << " " << info.kernel << " C=" << g.in_channels << " N=" << g.out_channels
            << " relu=" << relu;
        EXPECT_EQ(info.kernel.rfind("im2col_s8+", 0), 0u) << info.kernel;
      }
    }
  }
}

TEST(ConvS8, OneDnnPathEqualsReferenceBitForBit) {
  // oneDNN's int8 convolution (exact int32) + qforge's epilogue: the reference's values, for the
  // packed geometry and for other batch / input sizes (their own primitives, same weights).
  // Exact int32 needs hardware on which oneDNN does not saturate (VNNI), as frozen Conv2d requires.
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI here (frozen convolutions use im2col)";
  uint32_t seed = 300;
  for (const ConvGeometry& g : geometries()) {
    ConvCase c = make_case(g, -127, 127, seed += 10);
    std::string status;
    const auto w = qforge::kernels::detail::onednn_conv_s8(c.w.data(), g, &status);
    ASSERT_NE(w, nullptr) << status;
    for (int64_t batch : {g.batch, g.batch + 3}) {
      for (int64_t grow : {0, 5}) {
        ConvGeometry h = g;
        h.batch = batch;
        h.in_h = g.in_h == 1 ? 1 : g.in_h + grow;  // Conv1d keeps H = 1
        h.in_w = g.in_w + grow;
        ConvCase d = make_case(h, -127, 127, seed + 1);
        d.w = c.w;
        d.w_scale = c.w_scale;
        d.bias = c.bias;
        const at::Tensor x = nhwc(d);
        for (bool relu : {false, true}) {
          at::Tensor y = at::full({h.batch, h.out_h(), h.out_w(), h.out_channels}, 12345.0f);
          RunInfo info;
          ASSERT_TRUE(conv2d_s8s8f32_onednn(*w, x.data_ptr<int8_t>(), d.a_scale, d.w_scale.data(), d.bias.data(), h,
                                            y.data_ptr<float>(), relu, &info))
              << info.fallback;
          const std::vector<float> want = run_reference(d, nullptr, relu), got = to_nchw(y);
          EXPECT_TRUE(bitwise_equal(got.data(), want.data(), want.size()))
              << info.kernel << " (" << qforge::kernels::detail::onednn_impl(*w) << ") C=" << h.in_channels << " N=" << h.out_channels
              << " B=" << h.batch << " H=" << h.in_h << " relu=" << relu;
          EXPECT_EQ(info.kernel.rfind("conv_s8s8s32_onednn+", 0), 0u) << info.kernel;
        }
      }
    }
  }
  // A geometry other than the packed filter's is a clear error.
  const ConvGeometry g = geometries()[0];
  const ConvCase c = make_case(g, -127, 127, 1);
  const auto w = qforge::kernels::detail::onednn_conv_s8(c.w.data(), g, nullptr);
  ASSERT_NE(w, nullptr);
  ConvGeometry other = g;
  other.stride_h = 2;
  std::vector<int32_t> acc(other.gemm_m() * other.out_channels);
  EXPECT_THROW(qforge::kernels::detail::onednn_conv_s8s8s32(*w, other, c.x.data(), acc.data()), qforge::Error);
}

// Grouped convolutions (ResNeXt's 32 groups, 2 and 4): the reference equals at::conv2d with groups
// on the integer values, and oneDNN's grouped convolution + qforge's epilogue equals the reference
// bit for bit, for the packed input size and others. The im2col entry does not serve them.
TEST(ConvS8, GroupedOneDnnAndReferenceEqualConv2dBitForBit) {
  uint32_t seed = 700;
  for (const int64_t groups : {2, 4, 32}) {
    for (const int64_t stride : {1, 2}) {
      ConvGeometry g = geometry(2, 64, 9, 11, 128, 3, 3, stride, 1, stride == 1 ? 2 : 1);
      g.groups = groups;
      ConvCase c = make_case(g, -127, 127, seed += 10);
      const at::Tensor acc =
          at::conv2d(from_s8(c.x, {g.batch, g.in_channels, g.in_h, g.in_w}).to(at::kDouble),
                     from_s8(c.w, {g.out_channels, g.in_channels / groups, g.kernel_h, g.kernel_w}).to(at::kDouble), {},
                     {g.stride_h, g.stride_w}, {g.pad_h, g.pad_w}, {g.dilation_h, g.dilation_w}, groups);
      std::vector<float> ones(g.out_channels, 1.0f), y(acc.numel());
      conv2d_s8_reference(c.x.data(), 1.0f, c.w.data(), ones.data(), nullptr, nullptr, g, y.data());
      EXPECT_TRUE(at::equal(at::from_blob(y.data(), acc.sizes(), at::kFloat).to(at::kDouble), acc)) << groups;
      ConvS8Problem planned;
      planned.g = g;
      planned.m = g.gemm_m();
      EXPECT_FALSE(conv_s8_kernels().back().serves(planned)) << "im2col must not take groups " << groups;
      if (!isa_usable(Isa::kAvx512Vnni)) continue;
      std::string status;
      const auto w = qforge::kernels::detail::onednn_conv_s8(c.w.data(), g, &status);
      ASSERT_NE(w, nullptr) << status;
      for (int64_t grow : {0, 4}) {
        ConvGeometry h = g;
        h.in_h += grow;
        h.in_w += grow;
        ConvCase d = make_case(h, -127, 127, seed + 1);
        d.w = c.w, d.w_scale = c.w_scale, d.bias = c.bias;
        const at::Tensor x = nhwc(d);
        for (bool relu : {false, true}) {
          at::Tensor out = at::full({h.batch, h.out_h(), h.out_w(), h.out_channels}, 12345.0f);
          RunInfo info;
          ASSERT_TRUE(conv2d_s8s8f32_onednn(*w, x.data_ptr<int8_t>(), d.a_scale, d.w_scale.data(), d.bias.data(), h,
                                            out.data_ptr<float>(), relu, &info))
              << info.fallback;
          const std::vector<float> want = run_reference(d, nullptr, relu), got = to_nchw(out);
          EXPECT_TRUE(bitwise_equal(got.data(), want.data(), want.size()))
              << info.kernel << " (" << qforge::kernels::detail::onednn_impl(*w) << ") groups " << groups
              << " stride " << stride << " grow " << grow << " relu " << relu;
        }
      }
    }
  }
}

TEST(ConvS8, OneDnnRunsLargeBatchesInSubBatchesBitForBit) {
  // 64 x 64 outputs x 64 channels: 1 MiB of int32 sums per image, so at most 4 images per oneDNN
  // call (the retained workspace's 4 MiB), balanced over the fewest calls. Batch 10 runs as 4 + 4 +
  // 2 (two primitives): the reference's values, float and requantized, every image in its place.
  const ConvGeometry nominal = geometry(2, 8, 64, 64, 64, 3, 3, 1, 1);
  ASSERT_EQ(qforge::kernels::detail::kWorkspaceRetainBytes, size_t{4} << 20);
  for (const auto& [batch, images] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {4, 4}, {5, 3}, {9, 3}, {10, 4}}) {
    ConvGeometry h = nominal;
    h.batch = batch;
    EXPECT_EQ(onednn_conv_images_per_call(h), images) << batch;
  }
  EXPECT_EQ(onednn_conv_images_per_call(geometry(3, 8, 256, 256, 32, 3, 3, 1, 1)), 3);  // 8 MiB an image: one call
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI here (frozen convolutions use im2col)";
  const ConvCase c = make_case(nominal, -127, 127, 41);
  const auto w = qforge::kernels::detail::onednn_conv_s8(c.w.data(), nominal, nullptr);
  ASSERT_NE(w, nullptr);
  ConvGeometry h = nominal;
  h.batch = 10;
  ConvCase d = make_case(h, -127, 127, 42);
  d.w = c.w;
  d.w_scale = c.w_scale;
  d.bias = c.bias;
  const at::Tensor x = nhwc(d);
  const std::vector<float> want = run_reference(d, nullptr, true);
  at::Tensor y = at::full({h.batch, h.out_h(), h.out_w(), h.out_channels}, 12345.0f);
  RunInfo info;
  ASSERT_TRUE(conv2d_s8s8f32_onednn(*w, x.data_ptr<int8_t>(), d.a_scale, d.w_scale.data(), d.bias.data(), h,
                                    y.data_ptr<float>(), true, &info))
      << info.fallback;
  const std::vector<float> got = to_nchw(y);
  EXPECT_TRUE(bitwise_equal(got.data(), want.data(), want.size())) << info.kernel;
  RequantOut out;
  out.inv = 1.0f / 0.05f;
  at::Tensor q = at::full({h.batch, h.out_h(), h.out_w(), h.out_channels}, 99, at::kChar);
  out.q = q.data_ptr<int8_t>();
  ASSERT_TRUE(conv2d_s8s8s8_onednn(*w, x.data_ptr<int8_t>(), d.a_scale, d.w_scale.data(), d.bias.data(), h, out,
                                   true, &info));
  std::vector<int8_t> want_q(want.size());
  quantize_static_s8_reference(want.data(), static_cast<int64_t>(want.size()), out.inv, out.qmin, out.qmax,
                               want_q.data());
  const at::Tensor got_q = q.permute({0, 3, 1, 2}).contiguous();
  EXPECT_EQ(std::memcmp(got_q.data_ptr<int8_t>(), want_q.data(), want_q.size()), 0);
}

TEST(ConvS8, ResidualIsAddedBeforeTheReluBitForBit) {
  // conv + bias, + residual (at::add's a + b), then the ReLU: im2col (int8 weights) and oneDNN,
  // one chunk and several, against the reference's float output with ATen's add and ReLU.
  uint32_t seed = 900;
  for (const ConvGeometry& g : {geometry(2, 8, 14, 14, 24, 3, 3, 1, 1), geometry(9, 8, 64, 64, 64, 3, 3, 1, 1)}) {
    const ConvCase c = make_case(g, -127, 127, seed += 10);
    const int64_t N = g.out_channels;
    PackOptions opts;
    opts.onednn = false;
    const at::Tensor w_scale = at::from_blob(const_cast<float*>(c.w_scale.data()), {N}, at::kFloat).clone();
    const PackedLinearS8 s8(weight_rows(c, g.gemm_k()), w_scale, at::Tensor(), opts);
    const auto dnn = isa_usable(Isa::kAvx512Vnni) ? qforge::kernels::detail::onednn_conv_s8(c.w.data(), g, nullptr)
                                                  : nullptr;
    const at::Tensor x = nhwc(c);
    const at::Tensor r = at::randn({g.batch, g.out_h(), g.out_w(), N});  // channels last, as y
    std::vector<float> conv_nchw = run_reference(c, nullptr, false);
    const at::Tensor conv =
        at::from_blob(conv_nchw.data(), {g.batch, N, g.out_h(), g.out_w()}).permute({0, 2, 3, 1}).contiguous();
    for (bool relu : {false, true}) {
      const at::Tensor want = relu ? at::relu(at::add(conv, r)) : at::add(conv, r);
      for (int path = 0; path < 2; ++path) {
        if (path == 1 && dnn == nullptr) continue;
        at::Tensor y = at::full({g.batch, g.out_h(), g.out_w(), N}, 12345.0f);
        RunInfo info;
        if (path == 0) {
          conv2d_s8s8f32(x.data_ptr<int8_t>(), c.a_scale, s8.view(), c.w_scale.data(), c.bias.data(), g,
                         y.data_ptr<float>(), relu, &info, r.data_ptr<float>());
        } else {
          ASSERT_TRUE(conv2d_s8s8f32_onednn(*dnn, x.data_ptr<int8_t>(), c.a_scale, c.w_scale.data(), c.bias.data(),
                                            g, y.data_ptr<float>(), relu, &info, r.data_ptr<float>()));
        }
        EXPECT_TRUE(at::equal(y, want)) << info.kernel << " B=" << g.batch << " relu=" << relu;
      }
    }
  }
}

// oneDNN's reference convolution never runs: where the packed weight format leaves oneDNN only
// its reference implementation for an input size (on this oneDNN, MobileNetV2's 1x1 32 -> 192
// layer on 4x4 inputs at batch 256, packed for batch 32 at 16x16 as frozen layers pack: about a
// second per call), the call is refused with the reason, again when the size comes back.
TEST(ConvS8, OneDnnReferenceImplementationIsRefused) {
  if (!isa_usable(Isa::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI here (frozen convolutions use im2col)";
  const ConvGeometry nominal = geometry(32, 32, 16, 16, 192, 1, 1);
  const ConvCase c = make_case(nominal, -127, 127, 7);
  const auto w = qforge::kernels::detail::onednn_conv_s8(c.w.data(), nominal, nullptr);
  ASSERT_NE(w, nullptr);
  const ConvGeometry big = geometry(256, 32, 4, 4, 192, 1, 1);
  const std::string impl = qforge::kernels::detail::onednn_impl_for(*w, big);
  if (impl.rfind("ref", 0) != 0) GTEST_SKIP() << "this oneDNN serves the size with " << impl;
  const ConvCase d = make_case(big, -127, 127, 8);
  const at::Tensor x = nhwc(d);
  std::vector<int32_t> acc(static_cast<size_t>(big.gemm_m() * big.out_channels));
  for (int call = 0; call < 2; ++call) {  // the second answer comes from the cache
    std::string why;
    EXPECT_FALSE(qforge::kernels::detail::onednn_conv_s8s8s32(*w, big, x.data_ptr<int8_t>(), acc.data(), &why));
    EXPECT_NE(why.find("only its reference implementation (" + impl), std::string::npos) << why;
  }
  // The packed size itself is served.
  const ConvCase e = make_case(nominal, -127, 127, 9);
  std::vector<int32_t> acc32(static_cast<size_t>(nominal.gemm_m() * nominal.out_channels));
  EXPECT_TRUE(qforge::kernels::detail::onednn_conv_s8s8s32(*w, nominal, nhwc(e).data_ptr<int8_t>(), acc32.data()));
}

TEST(ConvS8, RequantizedOutputEqualsQuantizedReferenceBitForBit) {
  // Static-activation chains: codes for the next layer straight from the epilogue equal
  // quantize_static_s8_reference over the float reference, for im2col (int8 and int4 weights) and
  // oneDNN, with and without ReLU, on a narrow and a full-range grid.
  uint32_t seed = 700;
  for (const ConvGeometry& g : geometries()) {
    const ConvCase c = make_case(g, -8, 7, seed += 10);  // int4-range values serve both weights
    const int64_t N = g.out_channels, Kp = round_up(g.gemm_k(), kS4BlockK);
    PackOptions opts;
    opts.onednn = false;
    const at::Tensor w_scale = at::from_blob(const_cast<float*>(c.w_scale.data()), {N}, at::kFloat).clone();
    const PackedLinearS8 s8(weight_rows(c, g.gemm_k()), w_scale, at::Tensor(), opts);
    const PackedLinearS4 s4(weight_rows(c, Kp), w_scale, at::Tensor(), Kp, at::Tensor(), qforge::qint4);
    const auto dnn = isa_usable(Isa::kAvx512Vnni) ? qforge::kernels::detail::onednn_conv_s8(c.w.data(), g, nullptr)
                                                  : nullptr;
    const at::Tensor x = nhwc(c);
    for (bool relu : {false, true}) {
      for (int qmin : {-127, -128}) {
        const std::vector<float> y = run_reference(c, nullptr, relu);
        const float inv = 1.0f / 0.05f;
        std::vector<int8_t> want(y.size());
        quantize_static_s8_reference(y.data(), static_cast<int64_t>(y.size()), inv, qmin, 127, want.data());
        RequantOut out;
        out.inv = inv;
        out.qmin = qmin;
        for (int path = 0; path < 3; ++path) {
          if (path == 2 && dnn == nullptr) continue;
          at::Tensor q = at::full({g.batch, g.out_h(), g.out_w(), N}, 99, at::kChar);
          out.q = q.data_ptr<int8_t>();
          RunInfo info;
          if (path == 0) {
            conv2d_s8s8s8(x.data_ptr<int8_t>(), c.a_scale, s8.view(), s8.w_scale().data_ptr<float>(), c.bias.data(), g,
                          out, relu, &info);
          } else if (path == 1) {
            conv2d_s8s4s8(x.data_ptr<int8_t>(), c.a_scale, s4.view(), c.bias.data(), g, out, relu, &info);
          } else {
            ASSERT_TRUE(conv2d_s8s8s8_onednn(*dnn, x.data_ptr<int8_t>(), c.a_scale, c.w_scale.data(), c.bias.data(),
                                             g, out, relu, &info));
          }
          const at::Tensor got = q.permute({0, 3, 1, 2}).contiguous();
          EXPECT_TRUE(std::equal(want.begin(), want.end(), got.data_ptr<int8_t>()))
              << info.kernel << " path " << path << " C=" << g.in_channels << " N=" << N << " relu=" << relu
              << " qmin=" << qmin;
        }
      }
    }
  }
  RequantOut bad;  // no output buffer
  const ConvGeometry g = geometries()[0];
  const ConvCase c = make_case(g, -127, 127, 1);
  const PackedLinearS8 s8(weight_rows(c, g.gemm_k()), at::ones({g.out_channels}), at::Tensor(), PackOptions{false});
  EXPECT_THROW(conv2d_s8s8s8(nhwc(c).data_ptr<int8_t>(), 1.0f, s8.view(), s8.w_scale().data_ptr<float>(), nullptr, g,
                             bad),
               qforge::Error);
}

TEST(ConvS8, Int4FastPathEqualsReferenceBitForBitWithZeroPointsAndPaddedK) {
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    uint32_t seed = 500;
    for (const ConvGeometry& g : geometries()) {
      for (bool unsigned_grid : {false, true}) {
        const ConvCase c = make_case(g, unsigned_grid ? 0 : -8, unsigned_grid ? 15 : 7, seed += 10);
        const int64_t N = g.out_channels, Kp = round_up(g.gemm_k(), kS4BlockK);
        std::vector<int32_t> zero(N);
        at::Tensor zero_t;
        if (unsigned_grid) {
          const auto z = random_s8(N, 0, 15, seed + 7);
          for (int64_t n = 0; n < N; ++n) zero[n] = z[n];
          zero_t = at::from_blob(zero.data(), {N, 1}, at::kInt).clone();
        }
        const PackedLinearS4 packed(weight_rows(c, Kp),
                                    at::from_blob(const_cast<float*>(c.w_scale.data()), {N, 1}, at::kFloat).clone(),
                                    zero_t, Kp, at::Tensor(), unsigned_grid ? qforge::quint4 : qforge::qint4);
        const at::Tensor x = nhwc(c);
        for (bool relu : {false, true}) {
          at::Tensor y = at::full({g.batch, g.out_h(), g.out_w(), N}, 12345.0f);
          RunInfo info;
          conv2d_s8s4f32(x.data_ptr<int8_t>(), c.a_scale, packed.view(), c.bias.data(), g, y.data_ptr<float>(), relu,
                         &info);
          const std::vector<float> want = run_reference(c, unsigned_grid ? zero.data() : nullptr, relu),
                                   got = to_nchw(y);
          EXPECT_TRUE(bitwise_equal(got.data(), want.data(), want.size()))
              << isa_name(isa) << " " << info.kernel << " C=" << g.in_channels << " N=" << N
              << " unsigned=" << unsigned_grid << " relu=" << relu;
        }
      }
    }
  }
}

TEST(ConvS8, EmptyBatchRunsNothing) {
  const ConvGeometry g = geometry(0, 3, 8, 8, 4, 3, 3);
  const ConvCase c = make_case(geometry(1, 3, 8, 8, 4, 3, 3), -127, 127, 7);
  const PackedLinearS8 packed(weight_rows(c, g.gemm_k()), at::ones({4}), at::Tensor());
  RunInfo info;
  conv2d_s8s8f32(nullptr, 1.0f, packed.view(), packed.w_scale().data_ptr<float>(), nullptr, g, nullptr, false, &info);
  EXPECT_NE(info.kernel.find("empty batch"), std::string::npos) << info.kernel;
}

TEST(ConvS8, BadGeometryOrWeightIsRefused) {
  const ConvCase c = make_case(geometry(1, 3, 8, 8, 4, 3, 3), -127, 127, 7);
  const PackedLinearS8 packed(weight_rows(c, 27), at::ones({4}), at::Tensor());
  std::vector<float> y(4 * 64);
  const at::Tensor x = nhwc(c);
  // Kernel larger than the input.
  EXPECT_THROW(conv2d_s8s8f32(x.data_ptr<int8_t>(), 1.0f, packed.view(), packed.w_scale().data_ptr<float>(), nullptr,
                              geometry(1, 3, 2, 2, 4, 3, 3), y.data()),
               qforge::Error);
  // Weight packed for another channel count.
  EXPECT_THROW(conv2d_s8s8f32(x.data_ptr<int8_t>(), 1.0f, packed.view(), packed.w_scale().data_ptr<float>(), nullptr,
                              geometry(1, 2, 8, 8, 4, 3, 3), y.data()),
               qforge::Error);
  // Zero stride, negative padding.
  EXPECT_THROW(check_conv_geometry(geometry(1, 3, 8, 8, 4, 3, 3, 0)), qforge::Error);
  EXPECT_THROW(check_conv_geometry(geometry(1, 3, 8, 8, 4, 3, 3, 1, -1)), qforge::Error);
}

TEST(QuantizeStaticS8, ReferenceRoundsHalfToEvenAndClampsToTheGrid) {
  const std::vector<float> x{0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 1000.0f, -1000.0f, 3e9f, -3e9f};
  std::vector<int8_t> q(x.size());
  quantize_static_s8_reference(x.data(), static_cast<int64_t>(x.size()), 1.0f, -127, 127, q.data());
  EXPECT_EQ(q, (std::vector<int8_t>{0, 2, 2, 0, -2, 127, -127, 127, -127}));
  quantize_static_s8_reference(x.data(), static_cast<int64_t>(x.size()), 1.0f, -5, 3, q.data());
  EXPECT_EQ(q, (std::vector<int8_t>{0, 2, 2, 0, -2, 3, -5, 3, -5}));
}

TEST(QuantizeStaticS8, EveryKernelMatchesReferenceAndRefusesNonFinite) {
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17}, int64_t{1000}, int64_t{100003}}) {
      std::vector<float> x = random_f32(n, -40.0f, 40.0f, static_cast<uint32_t>(n + 3));
      if (n > 20) x[7] = 1e12f, x[9] = -1e12f;  // beyond int32 after scaling
      std::vector<int8_t> want(n, 1), got(n, 2);
      quantize_static_s8_reference(x.data(), n, 1.0f / 0.3f, -127, 127, want.data());
      RunInfo info;
      quantize_static_s8(x.data(), n, 1.0f / 0.3f, -127, 127, got.data(), &info);
      EXPECT_TRUE(exact_equal(got, want)) << isa_name(isa) << " n=" << n << " " << info.kernel;
    }
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(50000, 1.0f);
      x[40000] = bad;
      std::vector<int8_t> q(x.size());
      try {
        quantize_static_s8(x.data(), static_cast<int64_t>(x.size()), 1.0f, -127, 127, q.data());
        ADD_FAILURE() << "no error for " << bad << " on " << isa_name(isa);
      } catch (const qforge::Error& e) {
        EXPECT_NE(std::string(e.what()).find("element 40000"), std::string::npos) << e.what();
      }
    }
  }
}

namespace {

// A dispatcher call of the convolution table for case c (int8 weights s8 with oneDNN's copy dnn,
// or int4 weights s4), writing NHWC floats into y.
ConvS8Problem table_call(const ConvCase& c, const at::Tensor& x, const PackedLinearS8* s8, const PackedLinearS4* s4,
                         const qforge::kernels::detail::OneDnnConvS8* dnn, float* y, RunInfo* info) {
  ConvS8Problem p;
  p.x_nhwc = x.data_ptr<int8_t>();
  p.a_scale = c.a_scale;
  p.g = c.g;
  p.m = c.g.gemm_m();
  p.bias = c.bias.data();
  p.y = y;
  p.info = info;
  p.onednn = dnn;
  if (s4 != nullptr) {
    p.int4 = true;
    p.w4 = s4->view();
  } else {
    p.w8 = s8->view();
    p.w_scale = s8->w_scale().data_ptr<float>();
  }
  return p;
}

// Two geometries on either side of kOneDnnConvMinRows output pixels (392 and 4704).
std::vector<ConvGeometry> table_geometries() {
  return {geometry(2, 32, 14, 14, 64, 3, 3, 1, 1), geometry(24, 16, 14, 14, 32, 3, 3, 1, 1)};
}

}  // namespace

TEST(ConvS8Table, EveryEntryThisMachineRunsEqualsTheReferenceBitForBit) {
  // Each entry whose ISA the machine has, run directly whatever rows it is chosen for, on the
  // int8 and int4 weights it takes: conv2d_s8_reference's values.
  uint32_t seed = 900;
  for (const ConvGeometry& g : table_geometries()) {
    const ConvCase c = make_case(g, -8, 7, seed += 10);  // int4-range values serve both weights
    const int64_t N = g.out_channels, Kp = round_up(g.gemm_k(), kS4BlockK);
    const at::Tensor w_scale = at::from_blob(const_cast<float*>(c.w_scale.data()), {N}, at::kFloat).clone();
    const PackedLinearS8 s8(weight_rows(c, g.gemm_k()), w_scale, at::Tensor(), PackOptions{false});
    const PackedLinearS4 s4(weight_rows(c, Kp), w_scale.reshape({N, 1}), at::Tensor(), Kp, at::Tensor(), qforge::qint4);
    const auto dnn = isa_usable(Isa::kAvx512Vnni) ? qforge::kernels::detail::onednn_conv_s8(c.w.data(), g, nullptr)
                                                  : nullptr;
    const at::Tensor x = nhwc(c);
    const std::vector<float> want = run_reference(c, nullptr, false);
    int ran = 0;
    for (const KernelEntry<ConvS8Problem>& e : conv_s8_kernels()) {
      if (!machine_has(e.isa)) continue;
      for (bool int4 : {false, true}) {
        at::Tensor y = at::full({g.batch, g.out_h(), g.out_w(), N}, 12345.0f);
        RunInfo info;
        const ConvS8Problem p = table_call(c, x, int4 ? nullptr : &s8, int4 ? &s4 : nullptr, dnn.get(),
                                           y.data_ptr<float>(), &info);
        // Whether the entry takes these weights at all: its row rules are "from M on", so ask at
        // a row count above every threshold.
        ConvS8Problem any_rows = p;
        any_rows.m = int64_t{1} << 40;
        std::string why;
        if ((e.serves != nullptr && !e.serves(any_rows)) || (e.applies != nullptr && !e.applies(p, &why))) continue;
        e.run(p);
        ++ran;
        EXPECT_TRUE(bitwise_equal(to_nchw(y).data(), want.data(), want.size()))
            << e.name << " -> " << info.kernel << " int4=" << int4 << " M=" << g.gemm_m();
      }
    }
    // im2col for both weights, and oneDNN's for int8 where VNNI is.
    EXPECT_EQ(ran, dnn != nullptr ? 3 : 2) << "M=" << g.gemm_m();
  }
}

TEST(ConvS8Table, DispatcherRunsWhatThePlanReadsFromTheTable) {
  // At every usable ISA cap and on both sides of the row threshold, the chain conv2d_s8 reports
  // equals the plan's (choose_conv_kernel), and the plan's threshold is where the table switches.
  uint32_t seed = 950;
  for (Isa isa : usable_isas()) {
    ScopedMaxIsa cap(isa);
    for (const ConvGeometry& g : table_geometries()) {
      const ConvCase c = make_case(g, -8, 7, seed += 10);
      const int64_t N = g.out_channels, Kp = round_up(g.gemm_k(), kS4BlockK);
      const at::Tensor w_scale = at::from_blob(const_cast<float*>(c.w_scale.data()), {N}, at::kFloat).clone();
      const PackedLinearS8 s8(weight_rows(c, g.gemm_k()), w_scale, at::Tensor(), PackOptions{false});
      const PackedLinearS4 s4(weight_rows(c, Kp), w_scale.reshape({N, 1}), at::Tensor(), Kp, at::Tensor(),
                              qforge::qint4);
      for (bool int4 : {false, true}) {
        const ConvChoice plan = choose_conv_kernel(int4, qforge::usable_isa(), int4 ? Kp : g.gemm_k());
        // freeze() builds oneDNN's copy exactly where the plan switches to it.
        const auto dnn = plan.large_rows > 0 ? qforge::kernels::detail::onednn_conv_s8(c.w.data(), g, nullptr) : nullptr;
        at::Tensor y = at::empty({g.batch, g.out_h(), g.out_w(), N});
        RunInfo info;
        conv2d_s8(table_call(c, nhwc(c), int4 ? nullptr : &s8, int4 ? &s4 : nullptr, dnn.get(), y.data_ptr<float>(),
                             &info));
        const bool large = plan.large_rows > 0 && g.gemm_m() >= plan.large_rows;
        const std::string what = std::string(isa_name(isa)) + " int4=" + std::to_string(int4) +
                                 " M=" + std::to_string(g.gemm_m()) + " ran " + info.kernel;
        // The plan names oneDNN's epilogue without the ISA suffix the run adds (dequantize_s32_f32_avx512).
        EXPECT_EQ(info.kernel.rfind(large ? plan.large_kernel.kernel : plan.kernel.kernel, 0), 0u) << what;
        if (!large) {
          EXPECT_EQ(info.kernel, plan.kernel.kernel) << what;
        }
        EXPECT_EQ(plan.large_rows, !int4 && isa_usable(Isa::kAvx512Vnni) ? kOneDnnConvMinRows : 0) << what;
      }
    }
  }
}
