// PackedWeight: the pack_linear() factory, the dequantize-per-call format and what the CPU formats
// share (packed_weight_int.cpp, packed_weight_lut.cpp, packed_weight_conv.cpp hold the others).
#include "framework/nn/packed_weight.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/cuda/packed_weight_cuda.h"
#include "framework/nn/packed_weight_cpu.h"

namespace qforge::nn {

PackedWeightPtr CpuPackedWeight::to(const at::Device& device) const {
  if (device.is_cpu()) return shared_from_this();
  QF_REQUIRE(device.is_cuda(), "frozen kernels exist for CPU and CUDA, not ", device);
  return cuda_packed_weight(shared_from_this(), device);
}

namespace {

class PackedDequantize final : public CpuPackedWeight {
 public:
  PackedDequantize(QuantizedTensor fw, bool linear) : fw_(std::move(fw)), linear_(linear) {}
  LinearPath path() const override { return LinearPath::kDequant; }
  at::Tensor forward(const at::Tensor& x, const FrozenInput& in) const override {
    QF_CHECK(linear_, "a convolution's dequantize-per-call weight has no packed forward (the layer runs LibTorch's)");
    check_linear_call(in);
    return at::linear(fake_quantize_input(in, x), fw_.dequantize(), in.layer_bias);
  }
  // A convolution's weight stays on the CPU: the CUDA forms are Linear products.
  PackedWeightPtr to(const at::Device& device) const override {
    QF_REQUIRE(linear_ || device.is_cpu(), "frozen convolutions run on the CPU, not ", device);
    return CpuPackedWeight::to(device);
  }
  QuantizedTensor weight() const override { return fw_; }
  at::Tensor bias() const override { return {}; }
  int64_t bytes() const override { return fw_.defined() ? fw_.bytes() : 0; }

 private:
  QuantizedTensor fw_;
  bool linear_;
};

}  // namespace

PackedWeightPtr pack_dequantize(QuantizedTensor fw, bool linear) {
  return std::make_shared<PackedDequantize>(std::move(fw), linear);
}

PackedWeightPtr pack_linear(QuantizedTensor fw, LinearPath path, const at::Tensor& bias, float static_scale,
                            const std::string& who) {
  switch (path) {
    case LinearPath::kS8Dynamic:
    case LinearPath::kS8Static:
    case LinearPath::kS8WeightOnly:
      require_symmetric_s8(fw.zero_point, who);
      return pack_linear_s8(std::move(fw), path, bias, static_scale);
    case LinearPath::kS4Dynamic:
    case LinearPath::kS4Static:
    case LinearPath::kS4WeightOnly: return pack_linear_s4(std::move(fw), path, bias, static_scale);
    case LinearPath::kLutWeightOnly: return pack_linear_lut(std::move(fw), bias);
    case LinearPath::kFp4WeightOnly: return pack_linear_fp4(std::move(fw), bias);
    case LinearPath::kS8GroupWeightOnly: return pack_linear_s8g(std::move(fw), bias);
    case LinearPath::kDequant: break;
  }
  return pack_dequantize(std::move(fw), /*linear=*/true);
}

void require_symmetric_s8(const at::Tensor& zero_point, const std::string& who) {
  QF_REQUIRE(at::eq(zero_point, 0).all().item<bool>(), who,
             ": symmetric int8 weights must have zero points 0 (the file or scheme disagrees)");
}

std::shared_ptr<const kernels::PackedLinearS8> pack_s8_kernel(const at::Tensor& codes, const at::Tensor& scale_n,
                                                              const at::Tensor& bias) {
  kernels::PackOptions opts;
  opts.onednn = false;
  return std::make_shared<const kernels::PackedLinearS8>(codes, scale_n, bias, opts);
}

std::pair<at::Tensor, at::Tensor> int4_group_params(const QParams& qp, int64_t N, int64_t K, int64_t g) {
  const int64_t rows = qp.scale.numel() == 1 ? 1 : N;
  const at::Tensor scale_ng = qp.scale.to(at::kCPU, at::kFloat).reshape({rows, -1}).expand({N, K / g}).contiguous();
  at::Tensor zero_ng;
  if (!at::eq(qp.zero_point, 0).all().item<bool>())
    zero_ng = qp.zero_point.to(at::kCPU, at::kInt).reshape({rows, -1}).expand({N, K / g}).contiguous();
  return {scale_ng, zero_ng};
}

int64_t int4_group_size(const QSpec& ws, int64_t K) {
  return ws.granularity == Granularity::kPerGroup ? ws.group_size : K;
}

}  // namespace qforge::nn
