// The MXFP4 / NVFP4 Linear format of PackedWeight: kernels::PackedLinearFp4, weight-only; static
// or dynamic activations enter as their fake-quant values in float.
#include <ATen/ATen.h>

#include "framework/nn/packed_weight_cpu.h"
#include "kernels/cpu/fp4_linear.h"

namespace qforge::nn {
namespace {

// meta keeps the spec, the scale bytes and nvfp4's tensor scale (for weight()); codes live in the kernel.
class PackedFp4Linear final : public CpuPackedWeight {
 public:
  PackedFp4Linear(std::shared_ptr<const kernels::PackedLinearFp4> kernel, QuantizedTensor meta)
      : kernel_(std::move(kernel)), meta_(std::move(meta)) {
    meta_.data = at::Tensor();
  }
  LinearPath path() const override { return LinearPath::kFp4WeightOnly; }
  at::Tensor forward(const at::Tensor& x, const FrozenInput& in) const override {
    check_linear_call(in);
    return kernel_->run(fake_quantize_input(in, x).to(at::kFloat));
  }
  QuantizedTensor weight() const override {
    QuantizedTensor fw = meta_;
    fw.data = pack_quantized(kernel_->codes(), fw.qparams()).data;
    return fw;
  }
  at::Tensor bias() const override { return kernel_->bias(); }
  // The kernel's packed codes, float32 block scales and bias; the scale bytes kept for weight().
  int64_t bytes() const override { return kernel_->bytes() + meta_.bytes(); }

 private:
  std::shared_ptr<const kernels::PackedLinearFp4> kernel_;
  QuantizedTensor meta_;
};

}  // namespace

PackedWeightPtr pack_linear_fp4(QuantizedTensor fw, const at::Tensor& bias) {
  const int64_t N = fw.shape.at(0);
  const at::Tensor scales = fw.qparams().scale.to(at::kCPU, at::kFloat).reshape({N, -1});
  auto kernel = std::make_shared<const kernels::PackedLinearFp4>(fw.int_values(), scales, fw.spec.group_size, bias);
  return std::make_shared<PackedFp4Linear>(std::move(kernel), std::move(fw));
}

}  // namespace qforge::nn
