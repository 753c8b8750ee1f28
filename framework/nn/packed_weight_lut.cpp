// The codebook (k-means) Linear format of PackedWeight: kernels::PackedLinearLut, weight-only;
// static or dynamic activations enter as their fake-quant values in float.
#include <ATen/ATen.h>

#include <vector>

#include "fake_quant/codebook.h"
#include "framework/nn/packed_weight_cpu.h"
#include "kernels/cpu/lut_linear.h"

namespace qforge::nn {
namespace {

// meta keeps the spec and the float16 codebook (for weight()), its indices released.
class PackedLutLinear final : public CpuPackedWeight {
 public:
  PackedLutLinear(std::shared_ptr<const kernels::PackedLinearLut> kernel, QuantizedTensor meta)
      : kernel_(std::move(kernel)), meta_(std::move(meta)) {
    meta_.data = at::Tensor();
  }
  LinearPath path() const override { return LinearPath::kLutWeightOnly; }
  at::Tensor forward(const at::Tensor& x_in, const FrozenInput& in) const override {
    check_linear_call(in);
    const int64_t K = meta_.shape.at(1), N = meta_.shape.at(0);
    const at::Tensor x = x_in.to(at::kFloat).reshape({-1, K}).contiguous();
    std::vector<int64_t> out_shape(x_in.sizes().begin(), x_in.sizes().end());
    out_shape.back() = N;
    const at::Tensor xq = fake_quantize_input(in, x).to(at::kFloat).contiguous();
    return kernel_->run(xq).reshape(out_shape);
  }
  QuantizedTensor weight() const override {
    QuantizedTensor fw = meta_;
    fw.data = pack_quantized(kernel_->indices(), fw.qparams()).data;
    return fw;
  }
  at::Tensor bias() const override { return kernel_->bias(); }
  // The kernel's packed indices, its float32 16-entry tables and the bias; the float16 codebook
  // kept for weight() besides.
  int64_t bytes() const override { return kernel_->bytes() + meta_.codebook.nbytes(); }

 private:
  std::shared_ptr<const kernels::PackedLinearLut> kernel_;
  QuantizedTensor meta_;
};

}  // namespace

PackedWeightPtr pack_linear_lut(QuantizedTensor fw, const at::Tensor& bias) {
  const int64_t N = fw.shape.at(0), K = fw.shape.at(1);
  const QSpec& ws = fw.spec;
  // Codebooks as [N, G, L] float: per-tensor and per-channel ones are one group per row.
  const int64_t g = ws.granularity == Granularity::kPerGroup ? ws.group_size : K;
  const int64_t L = ws.qtype.levels();
  const at::Tensor levels =
      fw.qparams().codebook.to(at::kCPU, at::kFloat).reshape({-1, K / g, L}).expand({N, K / g, L}).contiguous();
  auto kernel = std::make_shared<const kernels::PackedLinearLut>(fw.int_values(), levels, g, ws.qtype.bits, bias);
  return std::make_shared<PackedLutLinear>(std::move(kernel), std::move(fw));
}

}  // namespace qforge::nn
