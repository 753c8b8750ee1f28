// Linear: fake-quant forward for PTQ/QAT, integer kernels after freeze.
#include "framework/nn/linear.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"
#include "framework/cuda/linear_cuda.h"
#include "kernels/cpu/linear_weight_only.h"

namespace qforge::nn {

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
  if (packed_) return packed_->device();
  return weight.defined() ? weight.device() : device_;
}

KernelPlan LinearImpl::plan() const {
  const std::optional<QSpec> ws = scheme_.weights ? std::optional<QSpec>(scheme_.weights->spec) : std::nullopt;
  if (compute_device().is_cuda()) {
    KernelPlan p = plan_linear_cuda(ws, scheme_.activations, scheme_.activation.spec, options.in_features(),
                                    options.out_features());
    if (p.path == LinearPath::kS8Dynamic && (scheme_.clips_rows() || scheme_.activation.spec.qtype != qint8)) {
      // The CUDA row quantizer is int8's, over each row's whole amax: narrower or clipped rows (the
      // CPU kernels take them) fall back in the CUDA form (framework/cuda/packed_weight_cuda.cpp);
      // the path stays the host packing's. kS4Dynamic's CUDA form fake-quantizes its rows: any grid.
      p.kernel = "dequantize+at::linear";
      p.fallback = detail::str_cat("dynamic ", scheme_.activation.spec.qtype.name,
                                   scheme_.clips_rows() ? " rows clipped below their amax" : " rows",
                                   " have no CUDA integer kernel: the weight is dequantized per call and the rows "
                                   "fake-quantized");
    }
    return p;
  }
  return plan_linear(ws, scheme_.activations, scheme_.activation.spec, options.in_features(), usable_isa(), decode_,
                     packed_ ? packed_->s4_packing() : nullptr);
}

void LinearImpl::set_decode_activations(DecodeActivations mode) {
  decode_ = mode;
  if (frozen_) refresh_plan();
}

LayerReport LinearImpl::report(bool planned) const {
  LayerReport r = QuantizableLayer::report(planned);
  const KernelPlan p = plan();
  // Frozen: the kernel a call runs now (the packed layout at the ISA usable now, not at freeze).
  if (frozen_) {
    r.kernel = plan_kernel_text(p);
    r.fallback_reason = with_scheme_note(p.fallback);
  }
  if (decode_ != DecodeActivations::kQ8Block32 || !p.decode_q8) return r;
  // Larger calls quantize too where the table has a block-32 GEMM for them (named); else they run exact.
  if (p.large_m > 0 && p.large_m_kernel != kernels::kDequantGemmKernel)
    r.activations += detail::str_cat("; every call: int8 blocks of 32 (q8_block32; from ", p.large_m, " rows ",
                                     p.large_m_kernel, ")");
  else
    r.activations += detail::str_cat("; calls of <= ", kernels::kWeightOnlyMaxM, " rows: int8 blocks of 32 (q8_block32)");
  return r;
}

int set_decode_activations(torch::nn::Module& model, DecodeActivations mode) {
  int changed = 0;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    auto* lin = dynamic_cast<LinearImpl*>(m.get());
    if (lin == nullptr) continue;
    lin->set_decode_activations(mode);
    changed += lin->quantized() && lin->plan().decode_q8;
  }
  return changed;
}

void LinearImpl::refresh_plan() {
  const KernelPlan p = plan();
  kernel_ = plan_kernel_text(p);
  fallback_ = p.fallback;
}

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
  device_ = device;
  if (!frozen_) return;
  check_frozen_device(device);
  packed_ = packed_->to(device);
  refresh_plan();
}

void LinearImpl::install_frozen(QuantizedTensor fw) {
  QF_REQUIRE(!frozen_, path_, " (Linear): already frozen");
  QF_REQUIRE(fw.defined() && scheme_.weights, path_, " (Linear): install_frozen needs the saved scheme attached and a packed weight");
  QF_REQUIRE(fw.shape == std::vector<int64_t>({options.out_features(), options.in_features()}), path_,
             " (Linear): frozen weight has shape ", at::IntArrayRef(fw.shape), ", layer expects [",
             options.out_features(), ", ", options.in_features(), "]");
  const LinearPath kind = plan().path;
  // The integer formats hold the bias (a host copy, wherever the layer lives); kDequant leaves it to the layer.
  const bool packed_bias = kind != LinearPath::kDequant && options.bias();
  const at::Tensor b = packed_bias && bias.defined() ? bias.detach().to(at::kCPU, at::kFloat).contiguous() : at::Tensor();
  const bool is_static = kind == LinearPath::kS8Static || kind == LinearPath::kS4Static;
  const float act_scale = is_static ? input_q_->qparams().scale.item<float>() : 0.0f;
  packed_ = pack_linear(std::move(fw), kind, b, act_scale, path_ + " (Linear)");
  // Release the float weight: the packed storage is the only copy from here on.
  if (parameters_.contains("weight")) parameters_.erase("weight");
  weight = at::Tensor();
  if (weight_q_) weight_q_->clear_cache();
  if (packed_bias) {
    // The packed weight holds the bias too; keep one copy.
    parameters_.erase("bias");
    bias = at::Tensor();
  }
  mark_frozen();
  // A layer already on a GPU (a checkpoint loaded into a model moved there) gets its device copies.
  if (!device_.is_cpu()) place_frozen(device_);
}

QuantizedTensor LinearImpl::frozen_weight() const { return frozen_ ? packed_->weight() : QuantizedTensor{}; }

at::Tensor LinearImpl::frozen_bias() const {
  if (packed_ && packed_->bias().defined()) return packed_->bias();
  return options.bias() ? bias : at::Tensor();
}

int64_t LinearImpl::frozen_storage_bytes() const { return packed_ ? packed_->bytes() : 0; }

at::Tensor LinearImpl::frozen_forward(const at::Tensor& x) {
  const int64_t K = options.in_features();
  QF_REQUIRE(x.size(-1) == K, path_, " (Linear): input has ", x.size(-1), " features, expected ", K);
  const PackedWeightPtr packed = packed_;  // one read: to() may replace packed_ meanwhile
  const at::Device device = packed->device();
  QF_REQUIRE((x.is_cpu() && device.is_cpu()) || x.device() == device, path_, " (Linear): input on ", x.device(),
             " but the frozen weight is on ", device, " (move the model with ->to(device))");
  FrozenInput in;
  in.quantizer = input_q_;
  in.layer_bias = options.bias() ? bias : at::Tensor();
  in.decode = decode_;
  return packed->forward(x, in);
}

}  // namespace qforge::nn
