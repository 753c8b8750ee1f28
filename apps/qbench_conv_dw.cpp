// qbench case for the depthwise int8 convolution (MobileNetV2's 3x3 groups == channels blocks),
// one frozen qforge::nn::Conv2d layer at MobileNetV2's shapes (batch 1, 224 x 224 image; the
// input channels last, as a frozen 1x1 convolution before it leaves it):
//   conv_dw_s8_mobilenet   impl "libtorch": the float layer (at::conv2d, groups = C, float);
//                          "qforge": the layer frozen W8A8 (int8 per-channel weights, static int8
//                          input calibrated by min/max), its forward from the float input (input
//                          quantization included) on conv_dw_s8 (kernels/cpu/conv_dw_s8.h);
//                          "qforge-fallback": what the same frozen layer ran before that kernel,
//                          the weight dequantized per call and at::conv2d on the fake-quantized input.
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

std::vector<Case> conv_dw_cases() {
  struct Shape {
    int64_t c, hw, stride;
  };
  std::vector<Case> out;
  for (const Shape& sh : {Shape{32, 112, 1}, Shape{144, 56, 2}, Shape{192, 28, 1}, Shape{576, 14, 1}}) {
    torch::manual_seed(0);
    auto layer = std::make_shared<nn::Conv2dImpl>(
        torch::nn::Conv2dOptions(sh.c, sh.c, 3).stride(sh.stride).padding(1).groups(sh.c).bias(false));
    auto fp = std::make_shared<nn::Conv2dImpl>(
        torch::nn::Conv2dOptions(sh.c, sh.c, 3).stride(sh.stride).padding(1).groups(sh.c).bias(false));
    fp->weight.data().copy_(layer->weight.detach());
    // Channels last, as the previous frozen (1x1) convolution of a MobileNetV2 block leaves it.
    const at::Tensor x = at::randn({1, sh.c, sh.hw, sh.hw}).contiguous(at::MemoryFormat::ChannelsLast);
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
    QF_REQUIRE(layer->plan().kernel.rfind("conv_dw_s8", 0) == 0, "qbench conv_dw_s8_mobilenet: the frozen layer plans ",
               layer->plan().kernel, " (", layer->plan().fallback, ")");
    Quantizer in_q = layer->input_quantizer();
    const int64_t stride = sh.stride, c = sh.c;
    Case k{"dw3x3s" + std::to_string(sh.stride) + "_b1_" + std::to_string(sh.c) + "x" + std::to_string(sh.hw) + "x" +
               std::to_string(sh.hw),
           0, {}};
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
    k.impls.push_back({"qforge-fallback", [qw, in_q, x, stride, c]() mutable {
      at::NoGradGuard g;
      at::conv2d(in_q->forward(x), qw.dequantize(), {}, stride, 1, 1, c);
    }});
    out.push_back(k);
  }
  return out;
}

const Register kConvDw(69, "conv_dw_s8_mobilenet", conv_dw_cases);

}  // namespace
}  // namespace qforge::bench
