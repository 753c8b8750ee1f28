// Linear: fake-quant forward for PTQ/QAT, integer kernels after freeze.
#include "framework/nn/linear.h"

#include <ATen/ATen.h>

#include "fake_quant/codebook.h"
#include "framework/core/error.h"
#include "framework/cuda/linear_cuda.h"
#include "kernels/cpu/gemv_s4.h"
#include "kernels/cpu/gemv_s8.h"
#include "kernels/cpu/lut_linear.h"
#include "kernels/cpu/packed_linear.h"

namespace qforge::nn {

// Largest M the weight-only GEMV kernels serve; above it unpack + float GEMM is faster.
constexpr int64_t kWeightOnlyMaxM = 16;

at::Tensor LinearImpl::forward(const at::Tensor& x_in) {
  const at::Tensor x = pre_quant_scale_.defined() ? x_in * pre_quant_scale_ : x_in;
  note_input(x);
  if (frozen_) return frozen_forward(x);
  if (!quantized()) return torch::nn::LinearImpl::forward(x);
  ScopedTensorSwap swap(weight, quantize_weight(weight));
  return torch::nn::LinearImpl::forward(quantize_input(x));
}

void LinearImpl::check_scheme(const LayerScheme& scheme) const {
  QuantizableLayer::check_scheme(scheme);
  if (scheme.weights) {
    const QSpec& s = scheme.weights->spec;
    QF_REQUIRE(s.granularity != Granularity::kPerChannel || s.axis == 0 || s.axis == -2, path_,
               " (Linear): per-channel weight quantization is along the output features (axis 0), got axis ", s.axis);
    QF_REQUIRE(s.granularity != Granularity::kPerGroup || options.in_features() % s.group_size == 0, path_,
               " (Linear): in_features ", options.in_features(), " is not a multiple of group_size ", s.group_size);
  }
}

namespace {

bool all_zero(const at::Tensor& t) { return at::eq(t, 0).all().item<bool>(); }

}  // namespace

std::shared_ptr<QuantizableLayer> LinearImpl::float_copy() const {
  require_not_frozen("float_copy");
  RngStateGuard rng;
  auto c = std::make_shared<LinearImpl>(options);
  copy_float_parameters(c->weight, weight, &c->bias, &bias);
  if (pre_quant_scale_.defined()) c->set_pre_quant_scale(pre_quant_scale_.clone());
  return c;
}

void LinearImpl::check_optional_buffer(const std::string& name, const at::Tensor& v) const {
  QF_REQUIRE(name == "pre_quant_scale", path_, " (Linear): has no optional buffer '", name, "'");
  QF_REQUIRE(v.defined() && v.dim() == 1 && v.size(0) == options.in_features() && at::isFloatingType(v.scalar_type()),
             path_, " (Linear): pre_quant_scale must be a float vector of in_features = ", options.in_features(),
             " values, got ", v.defined() ? v.sizes() : at::IntArrayRef{});
  QF_REQUIRE(at::isfinite(v).all().item<bool>() && (v > 0).all().item<bool>(), path_,
             " (Linear): pre_quant_scale must be finite and positive");
}

void LinearImpl::set_optional_buffer(const std::string& name, const at::Tensor& v) {
  check_optional_buffer(name, v);
  const at::Tensor value = v.detach().to(at::kFloat).contiguous().clone();
  if (pre_quant_scale_.defined()) {
    at::NoGradGuard g;
    pre_quant_scale_.set_data(value);
  } else {
    pre_quant_scale_ = register_buffer("pre_quant_scale", value);
  }
}

at::Device LinearImpl::compute_device() const {
  if (frozen_ || !weight.defined()) return device_;
  return weight.device();
}

KernelPlan LinearImpl::plan() const {
  const std::optional<QSpec> ws = scheme_.weights ? std::optional<QSpec>(scheme_.weights->spec) : std::nullopt;
  if (compute_device().is_cuda())
    return plan_linear_cuda(ws, scheme_.activations, scheme_.activation.spec, options.in_features(),
                            options.out_features());
  return plan_linear(ws, scheme_.activations, scheme_.activation.spec, options.in_features());
}

namespace {
// Per-group scales and zero points of a 4-bit weight as [N, K / g] (per-tensor qparams repeat one
// value for every row); zero points undefined when all are 0.
std::pair<at::Tensor, at::Tensor> s4_group_params(const QParams& qp, int64_t N, int64_t K, int64_t g) {
  const int64_t rows = qp.scale.numel() == 1 ? 1 : N;
  const at::Tensor scale_ng = qp.scale.to(at::kCPU, at::kFloat).reshape({rows, -1}).expand({N, K / g}).contiguous();
  at::Tensor zero_ng;
  if (!at::eq(qp.zero_point, 0).all().item<bool>())
    zero_ng = qp.zero_point.to(at::kCPU, at::kInt).reshape({rows, -1}).expand({N, K / g}).contiguous();
  return {scale_ng, zero_ng};
}

int64_t s4_group_size(const QSpec& ws, int64_t K) { return ws.granularity == Granularity::kPerGroup ? ws.group_size : K; }
}  // namespace

void LinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  check_frozen_device(device);
  torch::nn::Module::to(device, dtype, non_blocking);
  place_frozen(device);
}

void LinearImpl::to(torch::Device device, bool non_blocking) {
  check_frozen_device(device);
  torch::nn::Module::to(device, non_blocking);
  place_frozen(device);
}

void LinearImpl::check_frozen_device(const at::Device& device) const {
  if (!frozen_) return;
  QF_REQUIRE(device.is_cpu() || device.is_cuda(), path_, " (Linear): frozen kernels exist for CPU and CUDA, not ",
             device);
  QF_REQUIRE(device.is_cpu() || cuda_ops::built(), path_, " (Linear): cannot move the frozen layer to ", device, ": ",
             cuda_ops::unavailable_reason());
}

void LinearImpl::place_frozen(const at::Device& device) {
  if (!frozen_) {
    device_ = device;
    return;
  }
  check_frozen_device(device);
  for (at::Tensor* t : {&dev_codes_, &dev_w_scale_, &dev_bias_, &dev_packed_, &dev_group_scale_, &dev_group_zero_,
                        &dev_float_weight_})
    *t = at::Tensor();
  device_ = device;
  if (device.is_cuda()) {
    const int64_t N = options.out_features(), K = options.in_features();
    if (s8_) {
      dev_codes_ = s8_->weight().to(device);
      dev_w_scale_ = s8_->w_scale().to(at::kFloat).contiguous().to(device);
      if (s8_->bias().defined()) dev_bias_ = s8_->bias().to(device);
    } else if (s4_) {
      const QParams qp = fweight_.qparams();
      dev_packed_ = pack_quantized(s4_->weight(), qp).data.to(device);
      auto [scale_ng, zero_ng] = s4_group_params(qp, N, K, s4_group_size(qp.spec, K));
      dev_group_scale_ = scale_ng.to(device);
      if (zero_ng.defined()) dev_group_zero_ = zero_ng.to(device);
      if (s4_->bias().defined()) dev_bias_ = s4_->bias().to(device);
    } else {
      dev_float_weight_ = (lut_ ? frozen_weight() : fweight_).dequantize().to(device);
      if (lut_ && lut_->bias().defined()) dev_bias_ = lut_->bias().to(device);
    }
  }
  // The device the copies landed on (torch::kCUDA without an index means the current one).
  for (const at::Tensor* t : {&dev_codes_, &dev_packed_, &dev_float_weight_})
    if (t->defined()) device_ = t->device();
  const KernelPlan p = plan();
  kernel_ = p.kernel;
  fallback_ = p.fallback;
}

void LinearImpl::install_frozen(QuantizedTensor fw) {
  QF_REQUIRE(!frozen_, path_, " (Linear): already frozen");
  QF_REQUIRE(fw.defined() && scheme_.weights, path_, " (Linear): install_frozen needs the saved scheme attached and a packed weight");
  const QParams qp = fw.qparams();
  QF_REQUIRE(fw.shape == std::vector<int64_t>({options.out_features(), options.in_features()}), path_,
             " (Linear): frozen weight has shape ", at::IntArrayRef(fw.shape), ", layer expects [",
             options.out_features(), ", ", options.in_features(), "]");
  const QSpec& ws = qp.spec;
  const KernelPlan plan = this->plan();
  const LinearPath kind = plan.path;
  const bool s8 = kind == LinearPath::kS8Dynamic || kind == LinearPath::kS8Static || kind == LinearPath::kS8WeightOnly;
  QF_REQUIRE(!s8 || all_zero(qp.zero_point), path_,
             " (Linear): symmetric int8 weights must have zero points 0 (the file or scheme disagrees)");

  const int64_t N = options.out_features(), K = options.in_features();
  // The CPU kernel objects hold host copies, wherever the layer lives (a layer frozen on a GPU).
  const at::Tensor b =
      options.bias() && bias.defined() ? bias.detach().to(at::kCPU, at::kFloat).contiguous() : at::Tensor();
  if (s8) {
    const at::Tensor scale_n = qp.scale.to(at::kFloat).expand({N}).contiguous();
    // One packed copy only (1 byte per weight); large M runs the GEMV kernels in row blocks.
    kernels::PackOptions opts;
    opts.onednn = false;
    s8_ = std::make_shared<kernels::PackedLinearS8>(fw.int_values(), scale_n, b, opts);
    fw.data = at::Tensor();
  } else if (kind == LinearPath::kS4Dynamic || kind == LinearPath::kS4Static || kind == LinearPath::kS4WeightOnly) {
    const int64_t g = s4_group_size(ws, K);
    auto [scale_ng, zero_ng] = s4_group_params(qp, N, K, g);
    s4_ = std::make_shared<kernels::PackedLinearS4>(fw.int_values(), scale_ng, zero_ng, g, b, ws.qtype);
    fw.data = at::Tensor();
  } else if (kind == LinearPath::kLutWeightOnly) {
    // Codebooks as [N, G, L] float: per-tensor and per-channel ones are one group per row.
    const int64_t g = ws.granularity == Granularity::kPerGroup ? ws.group_size : K;
    const int64_t L = ws.qtype.levels();
    const at::Tensor levels = qp.codebook.to(at::kCPU, at::kFloat).reshape({-1, K / g, L}).expand({N, K / g, L}).contiguous();
    lut_ = std::make_shared<kernels::PackedLinearLut>(fw.int_values(), levels, g, ws.qtype.bits, b);
    fw.data = at::Tensor();
  }
  if (kind == LinearPath::kS8Static || kind == LinearPath::kS4Static) static_act_scale_ = input_q_->qparams().scale.item<float>();

  fweight_ = std::move(fw);
  path_kind_ = kind;
  // Release the float weight: the packed storage is the only copy from here on.
  if (parameters_.contains("weight")) parameters_.erase("weight");
  weight = at::Tensor();
  if (weight_q_) weight_q_->clear_cache();
  if ((s8_ || s4_ || lut_) && options.bias()) {
    // The kernel object holds the bias too; keep one copy.
    parameters_.erase("bias");
    bias = at::Tensor();
  }
  mark_frozen();
  // A layer already on a GPU (a checkpoint loaded into a model moved there) gets its device copies.
  if (!device_.is_cpu()) place_frozen(device_);
}

QuantizedTensor LinearImpl::frozen_weight() const {
  if (!frozen_) return {};
  QuantizedTensor fw = fweight_;
  if (s8_) fw.data = pack_quantized(s8_->weight(), fw.qparams()).data;
  if (s4_) fw.data = pack_quantized(s4_->weight(), fw.qparams()).data;
  if (lut_) fw.data = pack_quantized(lut_->indices(), fw.qparams()).data;
  return fw;
}

at::Tensor LinearImpl::frozen_bias() const {
  if (s8_) return s8_->bias();
  if (s4_) return s4_->bias();
  if (lut_) return lut_->bias();
  return options.bias() ? bias : at::Tensor();
}

int64_t LinearImpl::frozen_storage_bytes() const {
  // Kernel objects hold the codes, scales and bias; otherwise the packed QuantizedTensor does.
  if (s8_) return s8_->bytes();
  if (s4_) return s4_->bytes();
  // The kernel's packed indices, its float32 16-entry tables and the bias; the float16 codebook
  // the frozen weight keeps for frozen_weight() besides.
  if (lut_) return lut_->bytes() + fweight_.codebook.nbytes();
  int64_t bytes = fweight_.defined() ? fweight_.bytes() : 0;
  return bytes;
}

at::Tensor LinearImpl::frozen_forward_cuda(const at::Tensor& x_in) {
  const int64_t K = options.in_features(), N = options.out_features();
  QF_REQUIRE(x_in.device() == device_, path_, " (Linear): input on ", x_in.device(), " but the frozen weight is on ",
             device_, " (move the model with ->to(device))");
  std::vector<int64_t> out_shape(x_in.sizes().begin(), x_in.sizes().end());
  out_shape.back() = N;
  kernels::RunInfo info;
  switch (path_kind_) {
    case LinearPath::kS8Dynamic:
      return cuda_ops::linear_s8(x_in.to(at::kFloat).reshape({-1, K}).contiguous(), at::Tensor(), 0.0f, dev_codes_,
                                 dev_w_scale_, dev_bias_, &info)
          .reshape(out_shape);
    case LinearPath::kS8Static: {
      // The fake-quant formula of the static input quantizer, as int8 codes (ATen on the device).
      const at::Tensor q = quantize_to_int8(x_in.to(at::kFloat).reshape({-1, K}), input_q_->qparams()).contiguous();
      return cuda_ops::linear_s8(at::Tensor(), q, static_act_scale_, dev_codes_, dev_w_scale_, dev_bias_, &info)
          .reshape(out_shape);
    }
    case LinearPath::kS4Dynamic:
    case LinearPath::kS4Static:
    case LinearPath::kS4WeightOnly: {
      const QSpec& ws = fweight_.spec;
      const at::Tensor w = cuda_ops::dequantize_s4(dev_packed_, N, K, ws.qtype.is_signed, dev_group_scale_,
                                                   dev_group_zero_, s4_group_size(ws, K));
      return at::linear(quantize_input(x_in).to(at::kFloat), w, dev_bias_);
    }
    case LinearPath::kS8WeightOnly:
      return at::linear(x_in.to(at::kFloat), dev_codes_.to(at::kFloat) * dev_w_scale_.unsqueeze(1), dev_bias_);
    case LinearPath::kLutWeightOnly:
      return at::linear(quantize_input(x_in).to(at::kFloat), dev_float_weight_, dev_bias_);
    case LinearPath::kDequant:
      break;
  }
  return at::linear(quantize_input(x_in), dev_float_weight_, options.bias() ? bias : at::Tensor());
}

at::Tensor LinearImpl::frozen_forward(const at::Tensor& x_in) {
  const int64_t K = options.in_features(), N = options.out_features();
  QF_REQUIRE(x_in.size(-1) == K, path_, " (Linear): input has ", x_in.size(-1), " features, expected ", K);
  if (!x_in.is_cpu() || !device_.is_cpu()) return frozen_forward_cuda(x_in);
  if (path_kind_ == LinearPath::kDequant) {
    return at::linear(quantize_input(x_in), fweight_.dequantize(), options.bias() ? bias : at::Tensor());
  }
  const at::Tensor x = x_in.to(at::kFloat).reshape({-1, K}).contiguous();
  const int64_t M = x.size(0);
  std::vector<int64_t> out_shape(x_in.sizes().begin(), x_in.sizes().end());
  out_shape.back() = N;
  if (path_kind_ == LinearPath::kLutWeightOnly) {
    // Static / dynamic activations: their fake-quant values, in float, as the kernel's input.
    const at::Tensor xq = quantize_input(x).to(at::kFloat).contiguous();
    if (M > kWeightOnlyMaxM) {
      // Large M: expand the codebook weight once per call and let the float GEMM amortise it.
      return at::linear(xq, codebook_lookup(lut_->indices(), fweight_.qparams()), lut_->bias()).reshape(out_shape);
    }
    return lut_->run(xq).reshape(out_shape);
  }
  if (path_kind_ == LinearPath::kS8WeightOnly || path_kind_ == LinearPath::kS4WeightOnly) {
    if (M > kWeightOnlyMaxM) {
      // Large M: unpack once per call and let the float GEMM amortise it over the rows.
      return at::linear(x, fweight_.defined() && fweight_.data.defined() ? fweight_.dequantize()
                                                                           : dequantize_int(s8_ ? s8_->weight() : s4_->weight(), fweight_.qparams()),
                        s8_ ? s8_->bias() : s4_->bias()).reshape(out_shape);
    }
    return (s8_ ? s8_->run_weight_only(x) : s4_->run_weight_only(x)).reshape(out_shape);
  }
  at::Tensor y = at::empty({M, N}, at::kFloat);
  kernels::RunInfo info;
  switch (path_kind_) {
    case LinearPath::kS8Dynamic: s8_->run(x.data_ptr<float>(), M, y.data_ptr<float>(), &info); break;
    case LinearPath::kS4Dynamic: s4_->run(x.data_ptr<float>(), M, y.data_ptr<float>(), &info); break;
    case LinearPath::kS8Static:
    case LinearPath::kS4Static: {
      // The fake-quant formula of the static input quantizer, as int8 codes.
      const at::Tensor q = quantize_to_int8(x, input_q_->qparams()).contiguous();
      const at::Tensor a_scale = at::full({M}, static_act_scale_, at::kFloat);
      if (path_kind_ == LinearPath::kS8Static) {
        kernels::gemv_s8s8f32(q.data_ptr<int8_t>(), M, a_scale.data_ptr<float>(), s8_->view(),
                              s8_->w_scale().data_ptr<float>(),
                              s8_->bias().defined() ? s8_->bias().data_ptr<float>() : nullptr, y.data_ptr<float>(),
                              &info);
      } else {
        kernels::gemv_s8s4f32(q.data_ptr<int8_t>(), M, a_scale.data_ptr<float>(), s4_->view(),
                              s4_->bias().defined() ? s4_->bias().data_ptr<float>() : nullptr, y.data_ptr<float>(),
                              &info);
      }
      break;
    }
    case LinearPath::kDequant:
    case LinearPath::kS8WeightOnly:
    case LinearPath::kS4WeightOnly:
    case LinearPath::kLutWeightOnly: break;
  }
  std::vector<int64_t> shape(x_in.sizes().begin(), x_in.sizes().end());
  shape.back() = N;
  return y.reshape(shape);
}

}  // namespace qforge::nn
