// qbench case for the depthwise int8 convolution (MobileNetV2's 3x3 groups == channels blocks),
// one frozen qforge::nn::Conv2d layer at MobileNetV2's shapes (batch 1, 224 x 224 image; the
// input channels last, as a frozen 1x1 convolution before it leaves it):
//   conv_dw_s8_mobilenet   impl "libtorch": the float layer (at::conv2d, groups = C, float);
//                          "qforge": the layer frozen W8A8 (int8 per-channel weights, static int8
//                          input calibrated by min/max), its forward from the float input (input
//                          quantization included) on conv_dw_s8 (kernels/cpu/conv_dw_s8.h);
//                          "qforge-fallback": what the same frozen layer ran before that kernel,
//                          the weight dequantized per call and at::conv2d on the fake-quantized input.
// and conv_grouped_s8_resnext, the same three for ResNeXt's grouped 3x3 convolutions (below).
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "apps/qbench_registry.h"
#include "framework/api/quantize.h"
#include "framework/core/error.h"
#include "framework/nn/conv.h"

namespace qforge::bench {
namespace {

// One 3x3 Conv2d of `o`'s options at batch 1 on a c x hw x hw image, channels last (as the frozen
// convolution before it leaves it): the three impls of both benches. `kernel` must occur in the
// frozen layer's plan (the bench times that kernel, or says what it planned instead).
Case conv_case(const char* bench, const std::string& name, const torch::nn::Conv2dOptions& o, int64_t hw,
               const std::string& kernel) {
  torch::manual_seed(0);
  auto layer = std::make_shared<nn::Conv2dImpl>(o);
  auto fp = std::make_shared<nn::Conv2dImpl>(o);
  fp->weight.data().copy_(layer->weight.detach());
  const int64_t c = o.in_channels(), groups = o.groups(), stride = (*o.stride())[0];
  const at::Tensor x = at::randn({1, c, hw, hw}).contiguous(at::MemoryFormat::ChannelsLast);
  Scheme s(qint8);
  s.activations = ActivationMode::kStatic;
  s.observer = "minmax";
  quantize(*layer, s);
  {
    Calibration calib(*layer);
    at::NoGradGuard g;
    layer->forward(x);
  }
  layer->eval();
  freeze(*layer);
  QF_REQUIRE(layer->plan().kernel.find(kernel) != std::string::npos, "qbench ", bench, ": the frozen layer plans ",
             layer->plan().kernel, " (", layer->plan().fallback, ")");
  Quantizer in_q = layer->input_quantizer();
  Case k{name, 0, {}};
  k.impls.push_back({"libtorch", [fp, x] {
    at::NoGradGuard g;
    fp->forward(x);
  }});
  k.impls.push_back({"qforge", [layer, x] {
    at::NoGradGuard g;
    layer->forward(x);
  }});
  // The packed weight is looked up once, as the frozen layer held it; only its dequantization is per call.
  QuantizedTensor qw = layer->frozen_weight();
  k.impls.push_back({"qforge-fallback", [qw, in_q, x, stride, groups]() mutable {
    at::NoGradGuard g;
    at::conv2d(in_q->forward(x), qw.dequantize(), {}, stride, 1, 1, groups);
  }});
  return k;
}

std::string shape_name(const char* prefix, int64_t stride, int64_t c, int64_t hw) {
  return std::string(prefix) + std::to_string(stride) + "_b1_" + std::to_string(c) + "x" + std::to_string(hw) + "x" +
         std::to_string(hw);
}

std::vector<Case> conv_dw_cases() {
  struct Shape {
    int64_t c, hw, stride;
  };
  std::vector<Case> out;
  for (const Shape& sh : {Shape{32, 112, 1}, Shape{144, 56, 2}, Shape{192, 28, 1}, Shape{576, 14, 1}})
    out.push_back(conv_case("conv_dw_s8_mobilenet", shape_name("dw3x3s", sh.stride, sh.c, sh.hw),
                            torch::nn::Conv2dOptions(sh.c, sh.c, 3).stride(sh.stride).padding(1).groups(sh.c).bias(false),
                            sh.hw, "conv_dw_s8"));
  return out;
}

// ResNeXt-50 (32x4d)'s grouped 3x3 convolutions (32 groups; the first of each stage strided), batch
// 1 on a 224 x 224 image: impl "libtorch" the float layer, "qforge" frozen W8A8 (oneDNN's grouped
// int8 convolution on AVX-512 VNNI, else one integer convolution per group), "qforge-fallback" what
// it ran before (the weight dequantized per call, at::conv2d on the fake-quantized input).
std::vector<Case> conv_grouped_cases() {
  struct Shape {
    int64_t c, hw, stride;
  };
  std::vector<Case> out;
  for (const Shape& sh : {Shape{128, 56, 1}, Shape{256, 56, 2}, Shape{512, 14, 1}, Shape{1024, 7, 1}})
    out.push_back(conv_case("conv_grouped_s8_resnext", shape_name("g32_3x3s", sh.stride, sh.c, sh.hw),
                            torch::nn::Conv2dOptions(sh.c, sh.c, 3).stride(sh.stride).padding(1).groups(32).bias(false),
                            sh.hw, " groups"));
  return out;
}

const Register kConvDw(69, "conv_dw_s8_mobilenet", conv_dw_cases);
const Register kConvGrouped(69, "conv_grouped_s8_resnext", conv_grouped_cases);

}  // namespace
}  // namespace qforge::bench
