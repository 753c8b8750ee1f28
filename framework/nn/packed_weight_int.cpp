// The int8 and int4 Linear formats of PackedWeight: kernels::PackedLinearS8 / S4 run the dynamic,
// static and weight-only paths (kernels/cpu/gemv_s8.h, gemv_s4.h).
#include <ATen/ATen.h>

#include <string>
#include <type_traits>
#include <vector>

#include "framework/api/kernel_plan.h"
#include "framework/nn/packed_weight_cpu.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::nn {
namespace {

bool weight_only(LinearPath p) {
  return p == LinearPath::kS8WeightOnly || p == LinearPath::kS4WeightOnly || p == LinearPath::kS8GroupWeightOnly;
}
bool static_act(LinearPath p) { return p == LinearPath::kS8Static || p == LinearPath::kS4Static; }

// int8 (Kernel = kernels::PackedLinearS8 / S8G) or int4 (kernels::PackedLinearS4) weights in the
// kernels' packed layout; meta keeps the spec and qparams, its codes released.
template <class Kernel>
class PackedIntLinear final : public CpuPackedWeight {
 public:
  PackedIntLinear(std::shared_ptr<const Kernel> kernel, QuantizedTensor meta, LinearPath path, float static_scale,
                  S4Packing s4 = {})
      : kernel_(std::move(kernel)), meta_(std::move(meta)), s4_(std::move(s4)), path_(path), static_scale_(static_scale) {
    meta_.data = at::Tensor();
    if constexpr (std::is_same_v<Kernel, kernels::PackedLinearS4>) {
      // The kernel holds the scales and zero points (n16k8: fp16 scales and zero codes; n16b32:
      // fp16 scales, zero points 0 or -1 as their signs) and gives them back exactly: no second
      // copy kept beside them (a float scale and an int32 zero point, 8 bytes a group; weight()
      // unpacks the kernel's instead, which only checkpoints and exports call).
      if (meta_.scale.numel() == kernel_->out_features() * kernel_->groups()) {
        scale_shape_ = meta_.scale.sizes().vec();
        meta_.scale = meta_.zero_point = at::Tensor();
      }
    }
  }
  LinearPath path() const override { return path_; }
  at::Tensor forward(const at::Tensor& x_in, const FrozenInput& in) const override;
  QuantizedTensor weight() const override {
    QuantizedTensor fw = meta_;
    if constexpr (std::is_same_v<Kernel, kernels::PackedLinearS4>) {
      if (!fw.scale.defined()) {
        fw.scale = kernel_->w_scale().reshape(scale_shape_);
        fw.zero_point = kernel_->w_zero().reshape(scale_shape_);
      }
    }
    fw.data = pack_quantized(kernel_->weight(), fw.qparams()).data;
    return fw;
  }
  at::Tensor bias() const override { return kernel_->bias(); }
  int64_t bytes() const override { return kernel_->bytes(); }
  float static_input_scale() const override { return static_scale_; }
  const S4Packing* s4_packing() const override {
    return std::is_same_v<Kernel, kernels::PackedLinearS4> ? &s4_ : nullptr;
  }

 private:
  std::shared_ptr<const Kernel> kernel_;
  QuantizedTensor meta_;
  S4Packing s4_;  // int4: the layout packed and why not n16b32
  std::vector<int64_t> scale_shape_;  // meta_'s scale shape where the kernel holds the scales
  LinearPath path_;
  float static_scale_;
};

template <class Kernel>
at::Tensor PackedIntLinear<Kernel>::forward(const at::Tensor& x_in, const FrozenInput& in) const {
  check_linear_call(in);
  if (weight_only(path_)) {
    // The kernels take [..., K] and return [..., N] (one call per decoded token: no reshapes).
    const at::Tensor xf = x_in.scalar_type() == at::kFloat ? x_in : x_in.to(at::kFloat);
    return in.decode == DecodeActivations::kQ8Block32 ? kernel_->run_decode(xf) : kernel_->run_weight_only(xf);
  }
  const int64_t K = kernel_->in_features(), N = kernel_->out_features();
  const at::Tensor x = x_in.to(at::kFloat).reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  std::vector<int64_t> out_shape(x_in.sizes().begin(), x_in.sizes().end());
  out_shape.back() = N;
  at::Tensor y = at::empty({M, N}, at::kFloat);
  if constexpr (std::is_same_v<Kernel, kernels::PackedLinearS8G>) {
    QF_CHECK(false, "an int8 group-scale weight was packed for ", to_string(path_), " (it serves weight-only calls)");
  } else {
    kernels::RunInfo info;
    if (static_act(path_)) {
      // The fake-quant formula of the static input quantizer, as int8 codes.
      const at::Tensor q = quantize_to_int8(x, in.quantizer->qparams()).contiguous();
      kernel_->run_static(q.data_ptr<int8_t>(), M, static_scale_, y.data_ptr<float>(), &info);
    } else {
      // Dynamic rows on the input quantizer's grid: qint8's [-127, 127], or W4A4's qint4 [-7, 7]
      // (qint3, qint2 likewise) as int8 codes, clipped as it clips them: the fake-quant formula.
      const int qmax =
          in.quantizer ? QuantizerImpl::dynamic_qmax(in.quantizer->config().spec.qtype) : kernels::kActQMax;
      const float clip = in.quantizer ? in.quantizer->config().clip_ratio : 1.0f;
      kernel_->run(x.data_ptr<float>(), M, y.data_ptr<float>(), &info, kernels::ActScale::kPerRow, qmax, clip);
    }
  }
  return y.reshape(out_shape);
}

}  // namespace

PackedWeightPtr pack_linear_s8(QuantizedTensor fw, LinearPath path, const at::Tensor& bias, float static_scale) {
  const int64_t N = fw.shape.at(0);
  const at::Tensor scale_n = fw.scale.to(at::kFloat).expand({N}).contiguous();
  auto kernel = pack_s8_kernel(fw.int_values(), scale_n, bias);
  return std::make_shared<PackedIntLinear<kernels::PackedLinearS8>>(std::move(kernel), std::move(fw), path,
                                                                    static_scale);
}

PackedWeightPtr pack_linear_s4(QuantizedTensor fw, LinearPath path, const at::Tensor& bias, float static_scale) {
  const int64_t N = fw.shape.at(0), K = fw.shape.at(1);
  const QParams qp = fw.qparams();
  const int64_t g = int4_group_size(qp.spec, K);
  auto [scale_ng, zero_ng] = int4_group_params(qp, N, K, g);
  std::string why;
  const bool stream = path == LinearPath::kS4WeightOnly && s4_one_stream_packing(qp.spec, K, usable_isa(), &why);
  auto kernel = std::make_shared<const kernels::PackedLinearS4>(
      fw.int_values(), scale_ng, zero_ng, g, bias, qp.spec.qtype,
      stream ? kernels::S4Layout::kN16B32 : kernels::S4Layout::kN16K8);
  S4Packing s4{kernel->layout() == kernels::S4Layout::kN16B32, why};
  if (stream && !s4.n16b32) s4.why = "n16b32 (Q4_0's one-stream form) not used: " + kernel->layout_status() + " (n16k8)";
  return std::make_shared<PackedIntLinear<kernels::PackedLinearS4>>(std::move(kernel), std::move(fw), path,
                                                                    static_scale, std::move(s4));
}

PackedWeightPtr pack_linear_s8g(QuantizedTensor fw, const at::Tensor& bias) {
  const int64_t N = fw.shape.at(0), K = fw.shape.at(1);
  const QParams qp = fw.qparams();
  const int64_t g = int4_group_size(qp.spec, K);
  auto [scale_ng, zero_ng] = int4_group_params(qp, N, K, g);
  auto kernel = std::make_shared<const kernels::PackedLinearS8G>(fw.int_values(), scale_ng, zero_ng, g, bias);
  return std::make_shared<PackedIntLinear<kernels::PackedLinearS8G>>(std::move(kernel), std::move(fw),
                                                                     LinearPath::kS8GroupWeightOnly, 0.0f);
}

}  // namespace qforge::nn
